//! The one wrk runner: every closed-loop HTTP load of the benchmarks (plain or HTTPS, with
//! a Lua script or without) goes through `run`, and its output through `parse`.

use std::{path::Path, process::Command};

/// What one wrk run measured.
#[derive(Clone, Copy, Debug)]
pub struct Wrk {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// Non-2xx/3xx responses and socket errors.
    pub errors: u64,
    /// Requests completed (wrk's `N requests in`).
    pub requests: u64,
}

/// Runs wrk as `cmd` (a command for `wrk`, in the client's namespace, with whatever
/// environment it needs): one thread, `connections` connections for `secs` seconds against
/// `url`, with the Lua `script` if any. Says so on stderr when nothing was served.
pub fn run(mut cmd: Command, url: &str, connections: usize, secs: u64, script: Option<&Path>) -> Wrk {
    cmd.args(["-t1", &format!("-c{connections}"), "--timeout", "10s", &format!("-d{secs}s"), "--latency"]);
    if let Some(script) = script {
        cmd.arg("-s").arg(script);
    }
    cmd.arg(url);
    let out = cmd.output().unwrap_or_else(|e| panic!("wrk: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        panic!("wrk -c{connections} {url} failed ({}): {text}{}", out.status, String::from_utf8_lossy(&out.stderr));
    }
    let r = parse(&text);
    if r.rps.is_nan() || r.rps <= 0.0 {
        eprintln!("    wrk -c{connections} against {url} served nothing:\n{text}");
    }
    r
}

/// The run with the median requests/s.
pub fn median(runs: &[Wrk]) -> Wrk {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    sorted[sorted.len() / 2]
}

/// The lowest and highest requests/s over the runs.
pub fn spread(runs: &[Wrk]) -> (f64, f64) {
    runs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| (lo.min(r.rps), hi.max(r.rps)))
}

/// wrk's output (with `--latency`).
pub fn parse(out: &str) -> Wrk {
    let mut r = Wrk { rps: f64::NAN, p50_ms: f64::NAN, p99_ms: f64::NAN, errors: 0, requests: 0 };
    for line in out.lines() {
        let t = line.trim();
        if let Some(v) = t.strip_prefix("Requests/sec:") {
            r.rps = v.trim().parse().unwrap_or(f64::NAN);
        } else if let Some(v) = t.strip_prefix("50%") {
            r.p50_ms = ms(v.trim());
        } else if let Some(v) = t.strip_prefix("99%") {
            r.p99_ms = ms(v.trim());
        } else if let Some((n, _)) = t.split_once(" requests in ") {
            r.requests = n.trim().parse().unwrap_or(0);
        } else if let Some(v) = t.strip_prefix("Non-2xx or 3xx responses:") {
            r.errors += v.trim().parse::<u64>().unwrap_or(0);
        } else if t.starts_with("Socket errors:") {
            r.errors += t.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u64>().ok()).sum::<u64>();
        }
    }
    r
}

/// `1.23ms`, `456.00us`, `1.2s` -> milliseconds.
fn ms(v: &str) -> f64 {
    let (num, unit) = v.split_at(v.find(|c: char| c.is_alphabetic()).unwrap_or(v.len()));
    let n: f64 = num.parse().unwrap_or(f64::NAN);
    match unit {
        "us" => n / 1000.0,
        "ms" => n,
        "s" => n * 1000.0,
        "m" => n * 60_000.0,
        _ => f64::NAN,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rate_percentiles_and_errors() {
        let out = "Running 4s test @ http://10.99.100.20:80/\n  Latency Distribution\n     50%  456.00us\n     75%    1.00ms\n     99%    2.50ms\n  1000 requests in 4.00s, 1.00MB read\n  Socket errors: connect 0, read 2, write 1, timeout 3\n  Non-2xx or 3xx responses: 4\nRequests/sec:    250.50\n";
        let r = parse(out);
        assert_eq!(r.rps, 250.5);
        assert_eq!(r.p50_ms, 0.456);
        assert_eq!(r.p99_ms, 2.5);
        assert_eq!(r.errors, 10);
        assert_eq!(r.requests, 1000);
        assert!(parse("").rps.is_nan());
    }
}
