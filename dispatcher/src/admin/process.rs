//! The process's own figures, named as Prometheus' process collector names them
//! (`process_cpu_seconds_total`, ...), read from `/proc/self` and `getrlimit`.

use crate::metrics::{Exposition, Family};

const CPU: Family = Family::counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.");
const RESIDENT: Family = Family::gauge("process_resident_memory_bytes", "Resident memory size in bytes.");
const VIRTUAL: Family = Family::gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.");
const OPEN_FDS: Family = Family::gauge("process_open_fds", "Number of open file descriptors.");
const MAX_FDS: Family = Family::gauge("process_max_fds", "Maximum number of open file descriptors.");
const START_TIME: Family =
    Family::gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.");

/// What `/proc/self/stat` says: CPU seconds, virtual and resident bytes, the start in
/// clock ticks after boot.
#[derive(Debug, PartialEq)]
pub struct Stat {
    pub cpu_seconds: f64,
    pub virtual_bytes: u64,
    pub resident_bytes: u64,
    pub start_ticks: u64,
}

/// Parses `/proc/self/stat` (the fields after the command's closing parenthesis: the
/// command may hold spaces and parentheses).
pub fn parse_stat(text: &str, ticks_per_s: u64, page: u64) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Field 3 (state) is f[0]: utime 14, stime 15, starttime 22, vsize 23, rss 24.
    let n = |i: usize| f.get(i)?.parse::<u64>().ok();
    let ticks = ticks_per_s.max(1) as f64;
    Some(Stat {
        cpu_seconds: (n(11)? + n(12)?) as f64 / ticks,
        start_ticks: n(19)?,
        virtual_bytes: n(20)?,
        resident_bytes: n(21)? * page,
    })
}

/// The boot time (seconds since the epoch) from `/proc/stat`.
pub fn parse_btime(text: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())
}

/// Writes the process families (those it cannot read are left out).
pub fn expose(o: &mut Exposition) {
    // SAFETY: sysconf and getrlimit only read; the rlimit is ours to fill.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    let stat = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t, ticks.max(1) as u64, page.max(1) as u64));
    if let Some(s) = &stat {
        o.single(&CPU, s.cpu_seconds);
        o.single(&RESIDENT, s.resident_bytes);
        o.single(&VIRTUAL, s.virtual_bytes);
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        // The directory's own descriptor is among them.
        o.single(&OPEN_FDS, fds.count().saturating_sub(1));
    }
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: as above.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        o.single(&MAX_FDS, lim.rlim_cur);
    }
    let btime = std::fs::read_to_string("/proc/stat").ok().and_then(|t| parse_btime(&t));
    if let (Some(s), Some(btime)) = (&stat, btime) {
        o.single(&START_TIME, btime as f64 + s.start_ticks as f64 / ticks.max(1) as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_btime_are_read_as_the_kernel_writes_them() {
        let line = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 123456 1048576 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(line, 100, 4096).unwrap();
        assert_eq!(
            s,
            Stat { cpu_seconds: 3.0, virtual_bytes: 1048576, resident_bytes: 300 * 4096, start_ticks: 123456 }
        );
        assert_eq!(parse_btime("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"), Some(1_700_000_000));
        assert_eq!(parse_stat("garbage", 100, 4096), None);
    }

    /// Our own figures read back as plausible, in valid exposition.
    #[test]
    fn the_process_families_are_exposed() {
        let mut o = Exposition::default();
        expose(&mut o);
        let text = o.finish();
        let s = crate::metrics::tests::check_format(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        for f in [&CPU, &RESIDENT, &VIRTUAL, &OPEN_FDS, &MAX_FDS, &START_TIME] {
            assert!(s.contains_key(&(f.name.to_string(), String::new())), "{} in {text}", f.name);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let start = s[&("process_start_time_seconds".into(), String::new())];
        assert!(start <= now + 1.0 && start > now - 86400.0 * 365.0, "{start} vs {now}");
        assert!(s[&("process_open_fds".into(), String::new())] >= 3.0);
    }
}
