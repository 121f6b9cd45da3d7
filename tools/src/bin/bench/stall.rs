//! Where an open-loop round's worst delay came from: while the round runs, the proxy's
//! threads' scheduler statistics (time on a CPU, time runnable but waiting for one) and
//! the machine's CPU time (busy, idle, stolen by the hypervisor) are sampled every 10 ms;
//! afterwards the slowest request's interval is read off the samples. A proxy thread that
//! waited for a CPU points at contention, one that neither ran nor waited was blocked or
//! had nothing to do, and stolen time at the hypervisor.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::load::Latencies;

/// A request this late counts as delayed.
const LATE_US: u64 = 10_000;

struct Sample {
    at: Instant,
    /// Per thread of the proxy: name, nanoseconds on a CPU, nanoseconds runnable waiting.
    threads: Vec<(String, u64, u64)>,
    /// The machine's ticks (all CPUs): busy, idle, stolen.
    cpu: [u64; 3],
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut samples = Vec::new();
            // Bounded: a round is seconds long; at most 10 minutes of samples.
            for _ in 0..60_000 {
                samples.push(sample(pid));
                if flag.load(Ordering::SeqCst) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            samples
        });
        Sampler { stop, handle }
    }

    /// Stops sampling; the round's worst delay explained, or "" when no request was late.
    pub fn explain(self, lat: &Latencies) -> String {
        self.stop.store(true, Ordering::SeqCst);
        let samples = self.handle.join().unwrap_or_default();
        let Some(&(due, late)) = lat.timeline.iter().max_by_key(|(_, l)| *l) else { return String::new() };
        if late < LATE_US {
            return String::new();
        }
        let delayed = lat.timeline.iter().filter(|(_, l)| *l >= LATE_US).count();
        let (from, to) = (lat.start + Duration::from_micros(due), lat.start + Duration::from_micros(due + late));
        let (Some(a), Some(b)) = (samples.iter().rev().find(|s| s.at <= from), samples.iter().find(|s| s.at >= to))
        else {
            return String::new();
        };
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut threads = String::new();
        for (name, run1, wait1) in &b.threads {
            let (run0, wait0) =
                a.threads.iter().find(|(n, _, _)| n == name).map(|(_, r, w)| (*r, *w)).unwrap_or((0, 0));
            let (run, wait) = (run1.saturating_sub(run0), wait1.saturating_sub(wait0));
            if run + wait >= 100_000 {
                threads += &format!(" {name} ran {:.1} waited {:.1};", ms(run), ms(wait));
            }
        }
        let tick = |i: usize| (b.cpu[i].saturating_sub(a.cpu[i])) * 10;
        format!(
            "\n      worst: due at {:.2} s, {:.1} ms late ({delayed} requests {} ms late or more); over the {:.0} ms sampled around it:{threads} machine busy {} idle {} stolen {} ms",
            due as f64 / 1e6,
            late as f64 / 1e3,
            LATE_US / 1000,
            (b.at - a.at).as_secs_f64() * 1e3,
            tick(0),
            tick(1),
            tick(2)
        )
    }
}

fn sample(pid: u32) -> Sample {
    let at = Instant::now();
    let mut threads = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let dir = t.path();
            let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default().trim().to_string();
            let sched = std::fs::read_to_string(dir.join("schedstat")).unwrap_or_default();
            let mut f = sched.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
            let (run, wait) = (f.next().unwrap_or(0), f.next().unwrap_or(0));
            // Threads of one name (tokio's blocking pool) are summed.
            match threads.iter_mut().find(|(n, _, _): &&mut (String, u64, u64)| *n == name) {
                Some(e) => {
                    e.1 += run;
                    e.2 += wait;
                }
                None => threads.push((name, run, wait)),
            }
        }
    }
    let cpu = machine_ticks();
    Sample { at, threads, cpu }
}

/// The machine's CPU time so far (/proc/stat, all CPUs), in ticks of 10 ms: busy, idle,
/// and stolen (time the hypervisor gave this VM's vCPUs to someone else).
pub fn machine_ticks() -> [u64; 3] {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = stat
        .lines()
        .find(|l| l.starts_with("cpu "))
        .map(|l| l.split_whitespace().skip(1).map(|v| v.parse().unwrap_or(0)).collect())
        .unwrap_or_default();
    let n = |i: usize| f.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    [n(0) + n(1) + n(2) + n(5) + n(6), n(3) + n(4), n(7)]
}
