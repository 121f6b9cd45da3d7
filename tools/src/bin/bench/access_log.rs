//! The access log's cost at full load: the same agent, configuration and wrk load with
//! `[access_log]` off and on (JSON lines to a file), switched by `dispatcher reload`
//! between rotating rounds; the median round of each.

use std::time::Duration;

use crate::{
    http::{agent_config, bench_bed, cookies_script, wait_ready, wrk},
    wrk,
};

const CONNECTIONS: usize = 50;

pub fn run(quick: bool) -> (String, String) {
    let (secs, rounds) = if quick { (3, 1) } else { (10, 3) };
    eprintln!("==> access log: wrk {CONNECTIONS} connections, {rounds} rounds of {secs}s off and on");
    let mut tb = bench_bed();
    let dir = tb.workdir.clone();
    let log = dir.join("access.log");
    let base = agent_config(&tb, "");
    let with_log = format!("{base}\n[access_log]\npath = \"{}\"\nformat = \"json\"\n", log.display());
    let path = tb.write_config(&base);
    tb.start_dispatcher(&path);
    let cfg = path.to_str().unwrap().to_string();
    let script = cookies_script(&tb);
    wait_ready(&tb, 80, "dispatcher");
    let _ = wrk(&tb, 80, 2, &script, CONNECTIONS); // warm-up
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut logged_requests = 0.0;
    for _ in 0..rounds {
        for (logging, text, runs) in [(false, &base, &mut off), (true, &with_log, &mut on)] {
            std::fs::write(&path, text).unwrap();
            tb.dispatcher_cmd(&["reload", "--config", &cfg]);
            std::thread::sleep(Duration::from_secs(1));
            let r = wrk(&tb, 80, secs, &script, CONNECTIONS);
            if logging {
                logged_requests += r.rps * secs as f64;
            }
            eprintln!(
                "    access log {:<3} {:>8.0} req/s  p99 {:.3} ms",
                if logging { "on" } else { "off" },
                r.rps,
                r.p99_ms
            );
            runs.push(r);
        }
    }
    let metric = |name: &str| -> u64 {
        let m = tb.dispatcher_cmd(&["metrics", "--config", &cfg]);
        m.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
    };
    std::thread::sleep(Duration::from_secs(1));
    let (lines, dropped) =
        (metric("dispatcher_access_log_lines_total "), metric("dispatcher_access_log_dropped_total "));
    let bytes = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let (o, n) = (wrk::median(&off), wrk::median(&on));
    let ((olo, ohi), (nlo, nhi)) = (wrk::spread(&off), wrk::spread(&on));
    let cost = (1.0 - n.rps / o.rps) * 100.0;
    eprintln!(
        "    off {:.0} req/s, on {:.0} req/s: {cost:.1}% fewer; {lines} lines ({dropped} dropped), {bytes} bytes",
        o.rps, n.rps
    );
    let table = format!(
        "| access log | requests/s (median of {rounds}) | range | p99 ms |\n|---|---:|---:|---:|\n| off | {:.0} | {olo:.0}–{ohi:.0} | {:.3} |\n| on (JSON lines to a file) | {:.0} | {nlo:.0}–{nhi:.0} | {:.3} |\n\nCost: {cost:.1}% of requests/s (target: under 5%). Lines written: {lines} (about {logged_requests:.0} requests were logged), dropped: {dropped}, {:.0} bytes per line.\n",
        o.rps,
        o.p99_ms,
        n.rps,
        n.p99_ms,
        bytes as f64 / lines.max(1) as f64
    );
    let json = format!(
        r#"{{"rounds":{rounds},"off_rps":{:.1},"on_rps":{:.1},"off_p99_ms":{:.3},"on_p99_ms":{:.3},"cost_percent":{cost:.2},"lines":{lines},"dropped":{dropped}}}"#,
        o.rps, n.rps, o.p99_ms, n.p99_ms
    );
    (json, table)
}
