//! SIPp (Debian `sip-tester`) as the caller of the SIP tests, the demo and the SIP
//! benchmark: its built-in UAC scenario (INVITE, 200, ACK, pause, BYE, 200) run as a
//! testbed process, its own cumulative statistics as the verdict.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::{Duration, Instant},
};

use crate::netns::{Ns, Testbed};

/// A SIPp run: `calls` calls at `rate` calls/s, each holding `pause_ms` between ACK and
/// BYE, from `local_ip`:5061 in `ns` to `target` (`addr:port`).
pub struct Run<'a> {
    pub ns: &'a Ns,
    pub target: &'a str,
    pub local_ip: &'a str,
    pub calls: u32,
    pub rate: u32,
    pub pause_ms: u32,
}

/// The statistics file of the run started as testbed process `tag`.
pub fn stats_file(tb: &Testbed, tag: &str) -> PathBuf {
    tb.workdir.join(format!("{tag}.csv"))
}

/// Starts the run as testbed process `tag` (stopped with the testbed if its user fails).
pub fn start(tb: &mut Testbed, run: &Run, tag: &str) {
    let stf = stats_file(tb, tag);
    let mut cmd = run.ns.command("sipp");
    cmd.args(["-sn", "uac", run.target, "-i", run.local_ip, "-p", "5061"])
        .args(["-m", &run.calls.to_string(), "-r", &run.rate.to_string(), "-d", &run.pause_ms.to_string()])
        .args(["-nostdin", "-timeout", "90s", "-timeout_error", "-trace_stat", "-trace_err", "-fd", "1"])
        .arg("-stf")
        .arg(&stf)
        .current_dir(&tb.workdir);
    tb.start(tag, cmd);
}

/// Waits (at most `limit`) for the run to finish: SIPp's exit status and counters.
pub fn finish(tb: &mut Testbed, tag: &str, limit: Duration) -> (ExitStatus, HashMap<String, u64>) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = tb.child_exited(tag) {
            break st;
        }
        assert!(Instant::now() < deadline, "SIPp did not finish: {}", tb.log(tag));
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, counters(&stats_file(tb, tag)))
}

/// SIPp's cumulative counters (`SuccessfulCall`, `FailedCall`, `Retransmissions`, ...)
/// from the last line of its statistics file.
pub fn counters(stf: &Path) -> HashMap<String, u64> {
    let text = std::fs::read_to_string(stf).unwrap_or_else(|e| panic!("SIPp statistics {}: {e}", stf.display()));
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let head: Vec<&str> = lines.next().expect("header").split(';').collect();
    let last: Vec<&str> = lines.next_back().expect("a statistics line").split(';').collect();
    head.iter()
        .zip(last)
        .filter(|(h, _)| h.ends_with("(C)"))
        .filter_map(|(h, v)| Some((h.trim_end_matches("(C)").to_string(), v.trim().parse().ok()?)))
        .collect()
}
