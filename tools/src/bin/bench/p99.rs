//! HTTP tail latency against HAProxy, repeated: p99 at full load (wrk, closed loop) and at
//! fixed offered loads of 50, 75 and 90% of HAProxy's maximum (open loop, latency from
//! each request's scheduled time), each measured in rounds in which the two systems
//! strictly alternate (dispatcher, HAProxy, dispatcher, HAProxy...: a burst of noise on
//! the shared vCPUs falls on both, never on two rounds of one system in a row); per level
//! the median p99 of the rounds, their range, in how many rounds the dispatcher's p99
//! was at or below HAProxy's in the same round, and the CPU each used per request. Each
//! round's line (stderr) adds the open-loop percentiles and, per 1,000 requests, the
//! proxy's minor page faults, voluntary/involuntary context switches and CPU time.

use std::{net::SocketAddr, time::Duration};

use crate::{
    http::{
        agent_config, bench_bed, cookies_script, haproxy_maxconn, raise_nofile, start_haproxy, wait_ready, wrk, VIP,
    },
    load,
    report::{self, Row},
    stall,
};

const CONNECTIONS: usize = 50;
const LEVELS: [f64; 3] = [50.0, 75.0, 90.0];
const SYSTEMS: [(&str, u16, &str); 2] = [("dispatcher", 80, "dispatcher"), ("haproxy", 81, "haproxy")];

/// One system's round: its p99, its requests/s, its errors, and what the line says.
struct Measured {
    p99: f64,
    rps: f64,
    errors: u64,
    detail: String,
    /// Where the round's worst delay came from (`stall`), or "".
    worst: String,
}

/// The rounds of one level (full load or a fixed rate): per system the p99 and requests/s
/// of each kept round and the CPU over them, the errors of every round measured (set
/// aside or not: an error is never hidden), how many pairs were measured, and whether the
/// kept ones are clean (no pair was: all are kept, and the table says so).
#[derive(Default)]
struct Rounds {
    p99: [Vec<f64>; 2],
    rps: [Vec<f64>; 2],
    errors: [u64; 2],
    cpu: [Cpu; 2],
    attempted: usize,
    clean: bool,
}

impl Rounds {
    fn kept(&self) -> usize {
        self.p99[0].len()
    }
}

/// One measured pair: per system what it measured and its counters around the round.
type Pair = Vec<(Measured, Counters, Counters)>;

/// Measures pairs (dispatcher, then HAProxy) until `rounds` of them are clean, at most
/// `3 * rounds` pairs. A pair is clean when the hypervisor took at most `steal_limit_ms`
/// of the vCPUs' time during each of its two rounds: steal stalls fall on whichever
/// system runs then and decide a p99 alone. The rule looks at the machine only, never at
/// the results. Only clean pairs count; with none at all, every pair counts (flagged).
fn pairs(
    label: &str,
    rounds: usize,
    secs: f64,
    steal_limit_ms: u64,
    pids: [u32; 2],
    mut measure: impl FnMut(usize) -> Measured,
) -> Rounds {
    let (mut clean, mut stolen_pairs): (Vec<Pair>, Vec<Pair>) = (Vec::new(), Vec::new());
    let (mut attempted, mut errors) = (0, [0; 2]);
    while clean.len() < rounds && attempted < 3 * rounds {
        attempted += 1;
        let mut pair = Vec::new();
        let mut stolen = 0;
        for (i, (name, _, _)) in SYSTEMS.iter().enumerate() {
            let (c0, st0) = (counters(pids[i]), stall::machine_ticks()[2]);
            let m = measure(i);
            let (c1, steal_ms) = (counters(pids[i]), (stall::machine_ticks()[2] - st0) * 10);
            eprintln!(
                "    {label} {name:<10} pair {attempted}: {:>6.0} req/s  p99 {:.3} ms{}  errors {}  per 1k: {}  steal {steal_ms} ms{}",
                m.rps,
                m.p99,
                m.detail,
                m.errors,
                per_thousand(c0, c1, m.rps * secs),
                m.worst
            );
            stolen = stolen.max(steal_ms);
            errors[i] += m.errors;
            pair.push((m, c0, c1));
        }
        if stolen > steal_limit_ms {
            eprintln!("    {label} pair {attempted} set aside: {stolen} ms stolen by the hypervisor");
            stolen_pairs.push(pair);
        } else {
            clean.push(pair);
        }
    }
    let mut r = Rounds { attempted, errors, clean: !clean.is_empty(), ..Rounds::default() };
    for pair in if r.clean { clean } else { stolen_pairs } {
        for (i, (m, c0, c1)) in pair.into_iter().enumerate() {
            r.p99[i].push(m.p99);
            r.rps[i].push(m.rps);
            r.cpu[i].add(c0, c1, m.rps * secs);
        }
    }
    r
}

/// CPU time a system used over the rounds of a level, and the requests it answered.
#[derive(Clone, Copy, Default)]
struct Cpu {
    ticks: u64,
    requests: f64,
}

impl Cpu {
    fn add(&mut self, a: Counters, b: Counters, requests: f64) {
        self.ticks += b.ticks - a.ticks;
        self.requests += requests;
    }

    /// Microseconds of CPU (user + system, all threads) per request.
    fn us_per_request(&self) -> f64 {
        self.ticks as f64 * 10_000.0 / self.requests.max(1.0)
    }
}

/// A process's counters, summed over its threads: minor faults, voluntary and involuntary
/// context switches, CPU ticks (user + system).
#[derive(Clone, Copy, Default)]
pub struct Counters {
    minflt: u64,
    vcsw: u64,
    nvcsw: u64,
    pub ticks: u64,
}

pub fn counters(pid: u32) -> Counters {
    let mut c = Counters::default();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return c };
    for t in tasks.flatten() {
        let dir = t.path();
        if let Ok(stat) = std::fs::read_to_string(dir.join("stat")) {
            // Fields after the command's closing parenthesis: state is field 3.
            let f: Vec<&str> = stat.rsplit_once(')').map(|x| x.1).unwrap_or("").split_whitespace().collect();
            let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            c.minflt += n(10);
            c.ticks += n(14) + n(15);
        }
        if let Ok(status) = std::fs::read_to_string(dir.join("status")) {
            for l in status.lines() {
                let v = |l: &str| l.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                if l.starts_with("voluntary_ctxt_switches") {
                    c.vcsw += v(l);
                } else if l.starts_with("nonvoluntary_ctxt_switches") {
                    c.nvcsw += v(l);
                }
            }
        }
    }
    c
}

/// Per 1,000 requests between two readings: "faults F, switches V/N, CPU T ms".
fn per_thousand(a: Counters, b: Counters, requests: f64) -> String {
    let k = (requests / 1000.0).max(1e-9);
    format!(
        "faults {:.1}  switches {:.0}/{:.0}  cpu {:.1} ms",
        (b.minflt - a.minflt) as f64 / k,
        (b.vcsw - a.vcsw) as f64 / k,
        (b.nvcsw - a.nvcsw) as f64 / k,
        (b.ticks - a.ticks) as f64 * 10.0 / k
    )
}

/// In how many rounds the dispatcher's p99 was at or below HAProxy's of the same round.
fn rounds_at_or_below(d: &[f64], h: &[f64]) -> usize {
    d.iter().zip(h).filter(|(d, h)| d <= h).count()
}

/// Median (of an even count, the mean of the middle two) and range.
fn summary(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n.is_multiple_of(2) { (s[n / 2 - 1] + s[n / 2]) / 2.0 } else { s[n / 2] };
    (median, s[0], s[n - 1])
}

pub fn run(quick: bool) -> (String, String) {
    let (rounds, secs) = if quick { (3, 3) } else { (7, 10) };
    let maxconn = haproxy_maxconn(raise_nofile());
    eprintln!("==> HTTP p99: the dispatcher and HAProxy, {rounds} rounds of {secs}s per level, taking turns");
    let mut tb = bench_bed();
    let cfg = agent_config(&tb, "");
    let path = tb.write_config(&cfg);
    tb.start_dispatcher(&path);
    start_haproxy(&mut tb, maxconn, "", &format!("{VIP}:81"));
    let pids = [tb.pid_of("dispatcher").expect("agent pid"), tb.pid_of("haproxy").expect("haproxy pid")];
    let script = cookies_script(&tb);
    for (_, port, log) in SYSTEMS {
        wait_ready(&tb, port, log);
        let _ = wrk(&tb, port, 2, &script, CONNECTIONS); // warm-up
    }
    // Stolen time allowed in a round: 0.1% of two vCPUs' time (at least one 10 ms tick).
    let steal_limit_ms = (secs * 2).max(10);
    // Full load, closed loop: requests/s and p99 per round.
    let full = pairs("full load ", rounds, secs as f64, steal_limit_ms, pids, |i| {
        let r = wrk(&tb, SYSTEMS[i].1, secs, &script, CONNECTIONS);
        Measured { p99: r.p99_ms, rps: r.rps, errors: r.errors, detail: String::new(), worst: String::new() }
    });
    let haproxy_max = summary(&full.rps[1]).0;
    // Open loop at shares of HAProxy's maximum.
    let mut levels: Vec<(f64, Rounds)> = Vec::new();
    for pct in LEVELS {
        let rate = haproxy_max * pct / 100.0;
        let label = format!("{pct:>3}% ({rate:>6.0} req/s)");
        let r = pairs(&label, rounds, secs as f64, steal_limit_ms, pids, |i| {
            let addr: SocketAddr = format!("{VIP}:{}", SYSTEMS[i].1).parse().unwrap();
            let sampler = stall::Sampler::start(pids[i]);
            let lat = tb.client.run(move || load::open_loop(addr, rate, Duration::from_secs(secs), CONNECTIONS));
            let worst = sampler.explain(&lat);
            let detail =
                format!(" (p50 {:.3}  p90 {:.3}  p99.9 {:.3})", lat.pct_ms(50.0), lat.pct_ms(90.0), lat.pct_ms(99.9));
            Measured { p99: lat.pct_ms(99.0), rps: lat.achieved_rps, errors: lat.errors, detail, worst }
        });
        levels.push((pct, r));
    }

    let mut table = format!("Each level measured in {rounds} clean pairs of rounds of {secs} s, the two systems strictly alternating: the median p99 of the rounds, their range, the rounds in which the dispatcher's p99 was at or below HAProxy's, and the CPU each proxy used per request (all its threads, user and system, over the kept rounds). Only clean pairs of rounds count: a pair in which the hypervisor took more than {steal_limit_ms} ms of the vCPUs' time during either round (steal, /proc/stat) is set aside and another measured, at most {} pairs per level; the last column says how many were kept. Errors count every round measured.\n\n", 3 * rounds);
    let mut rows = Vec::new();
    let d_rps = summary(&full.rps[0]).0;
    let all = std::iter::once((
        format!("full load (wrk, {CONNECTIONS} connections; {d_rps:.0} vs {haproxy_max:.0} req/s)"),
        "full".to_string(),
        &full,
    ))
    .chain(levels.iter().map(|(pct, r)| {
        (format!("{pct:.0}% of HAProxy's max ({:.0} req/s)", haproxy_max * pct / 100.0), format!("{pct:.0}%"), r)
    }));
    for (name, key, r) in all {
        let ((dm, dl, dh), (hm, hl, hh)) = (summary(&r.p99[0]), summary(&r.p99[1]));
        let won = rounds_at_or_below(&r.p99[0], &r.p99[1]);
        let (dc, hc) = (r.cpu[0].us_per_request(), r.cpu[1].us_per_request());
        let [de, he] = r.errors;
        let (kept, attempted) = (r.kept(), r.attempted);
        let pairs_note =
            if r.clean { format!("{kept} of {attempted}") } else { format!("none of {attempted}: all kept") };
        rows.push(
            Row::new()
                .md("load", name)
                .text("", "load", key)
                .num("dispatcher p99 ms", "dispatcher_p99_ms", dm, 3, 3)
                .md("range", format!("{dl:.3}–{dh:.3}"))
                .json("dispatcher_range", format!("[{dl:.3},{dh:.3}]"))
                .num("HAProxy p99 ms", "haproxy_p99_ms", hm, 3, 3)
                .md("range", format!("{hl:.3}–{hh:.3}"))
                .json("haproxy_range", format!("[{hl:.3},{hh:.3}]"))
                .md("p99 vs HAProxy (medians)", format!("{:.2}", dm / hm))
                .md("rounds at or below HAProxy", format!("{won} of {kept}"))
                .md("errors (dispatcher / HAProxy)", format!("{de} / {he}"))
                .md("CPU µs per request (dispatcher / HAProxy)", format!("{dc:.1} / {hc:.1}"))
                .json("dispatcher_cpu_us_per_request", format!("{dc:.1}"))
                .json("haproxy_cpu_us_per_request", format!("{hc:.1}"))
                .md("clean pairs kept of measured", pairs_note)
                .json("pairs_kept", kept)
                .json("pairs_measured", attempted)
                .json("clean", r.clean),
        );
    }
    table += &report::markdown(&rows);
    println!("\n{table}");
    (report::json(&rows), table)
}
