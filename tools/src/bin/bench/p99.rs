//! HTTP tail latency against HAProxy, repeated: p99 at full load (wrk, closed loop) and at
//! fixed offered loads of 50, 75 and 90% of HAProxy's maximum (open loop, latency from
//! each request's scheduled time), each measured in rounds in which the two systems
//! strictly alternate (dispatcher, HAProxy, dispatcher, HAProxy...: a burst of noise on
//! the shared vCPUs falls on both, never on two rounds of one system in a row); per level
//! the median p99 of the rounds, their range, and in how many rounds the dispatcher's p99
//! was at or below HAProxy's in the same round.

use std::{net::SocketAddr, time::Duration};

use crate::{
    http::{agent_config, bench_bed, haproxy_conf, haproxy_maxconn, raise_nofile, wait_ready, wrk, LUA, VIP},
    load,
};

const CONNECTIONS: usize = 50;
const LEVELS: [f64; 3] = [50.0, 75.0, 90.0];
const SYSTEMS: [(&str, u16, &str); 2] = [("dispatcher", 80, "dispatcher"), ("haproxy", 81, "haproxy")];

/// A load level: its share of HAProxy's maximum, then per system the p99 and the errors
/// of each round.
type Level = (f64, [Vec<f64>; 2], [Vec<u64>; 2]);

/// In how many rounds the dispatcher's p99 was at or below HAProxy's of the same round.
fn rounds_at_or_below(d: &[f64], h: &[f64]) -> usize {
    d.iter().zip(h).filter(|(d, h)| d <= h).count()
}

/// Median and range.
fn summary(v: &[f64]) -> (f64, f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (s[s.len() / 2], s[0], s[s.len() - 1])
}

pub fn run(quick: bool) -> (String, String) {
    let (rounds, secs) = if quick { (3, 3) } else { (5, 10) };
    let maxconn = haproxy_maxconn(raise_nofile());
    eprintln!("==> HTTP p99: the dispatcher and HAProxy, {rounds} rounds of {secs}s per level, taking turns");
    let mut tb = bench_bed();
    let dir = tb.workdir.clone();
    let cfg = agent_config(&tb, "");
    let path = tb.write_config(&cfg);
    tb.start_dispatcher(&path);
    let hconf = dir.join("haproxy.cfg");
    std::fs::write(&hconf, haproxy_conf(&dir, maxconn, "", &format!("{VIP}:81"))).unwrap();
    let mut cmd = tb.lb.command("haproxy");
    cmd.arg("-db").arg("-f").arg(&hconf);
    tb.start("haproxy", cmd);
    let script = dir.join("cookies.lua");
    std::fs::write(&script, LUA).unwrap();
    for (_, port, log) in SYSTEMS {
        wait_ready(&tb, port, log);
        let _ = wrk(&tb, port, 2, &script, CONNECTIONS); // warm-up
    }
    // Full load, closed loop: requests/s and p99 per round.
    let mut full: Vec<Vec<(f64, f64)>> = vec![Vec::new(); 2];
    for round in 0..rounds {
        for (i, (name, port, _)) in SYSTEMS.iter().enumerate() {
            let (rps, _, p99, _) = wrk(&tb, *port, secs, &script, CONNECTIONS);
            eprintln!("    full load  {name:<10} round {round}: {rps:>8.0} req/s  p99 {p99:.3} ms");
            full[i].push((rps, p99));
        }
    }
    let haproxy_max = summary(&full[1].iter().map(|r| r.0).collect::<Vec<_>>()).0;
    // Open loop at shares of HAProxy's maximum.
    let mut levels: Vec<Level> = Vec::new();
    for pct in LEVELS {
        let rate = haproxy_max * pct / 100.0;
        let (mut p99s, mut errors): ([Vec<f64>; 2], [Vec<u64>; 2]) = Default::default();
        for round in 0..rounds {
            for (i, (name, port, _)) in SYSTEMS.iter().enumerate() {
                let addr: SocketAddr = format!("{VIP}:{port}").parse().unwrap();
                let lat = tb.client.run(move || load::open_loop(addr, rate, Duration::from_secs(secs), CONNECTIONS));
                eprintln!(
                    "    {pct:>3}% ({rate:>6.0} req/s) {name:<10} round {round}: achieved {:>6.0}  p99 {:.3} ms  errors {}",
                    lat.achieved_rps,
                    lat.pct_ms(99.0),
                    lat.errors
                );
                p99s[i].push(lat.pct_ms(99.0));
                errors[i].push(lat.errors);
            }
        }
        levels.push((pct, p99s, errors));
    }

    let mut table = format!("Each level measured in {rounds} rounds of {secs} s, the two systems strictly alternating: the median p99 of the rounds, their range, and the rounds in which the dispatcher's p99 was at or below HAProxy's.\n\n| load | dispatcher p99 ms | range | HAProxy p99 ms | range | p99 vs HAProxy (medians) | rounds at or below HAProxy | errors (dispatcher / HAProxy) |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let mut json = Vec::new();
    let full_p99: Vec<Vec<f64>> = full.iter().map(|f| f.iter().map(|r| r.1).collect()).collect();
    let (d, h) = (summary(&full_p99[0]), summary(&full_p99[1]));
    let won = rounds_at_or_below(&full_p99[0], &full_p99[1]);
    let d_rps = summary(&full[0].iter().map(|r| r.0).collect::<Vec<_>>()).0;
    table += &format!(
        "| full load (wrk, {CONNECTIONS} connections; {d_rps:.0} vs {haproxy_max:.0} req/s) | {:.3} | {:.3}–{:.3} | {:.3} | {:.3}–{:.3} | {:.2} | {won} of {rounds} | - |\n",
        d.0, d.1, d.2, h.0, h.1, h.2, d.0 / h.0
    );
    json.push(format!(
        r#"{{"load":"full","dispatcher_p99_ms":{:.3},"haproxy_p99_ms":{:.3},"dispatcher_rps":{d_rps:.0},"haproxy_rps":{haproxy_max:.0}}}"#,
        d.0, h.0
    ));
    for (pct, p99s, errors) in &levels {
        let (d, h) = (summary(&p99s[0]), summary(&p99s[1]));
        let (de, he): (u64, u64) = (errors[0].iter().sum(), errors[1].iter().sum());
        let won = rounds_at_or_below(&p99s[0], &p99s[1]);
        table += &format!(
            "| {pct:.0}% of HAProxy's max ({:.0} req/s) | {:.3} | {:.3}–{:.3} | {:.3} | {:.3}–{:.3} | {:.2} | {won} of {rounds} | {de} / {he} |\n",
            haproxy_max * pct / 100.0,
            d.0,
            d.1,
            d.2,
            h.0,
            h.1,
            h.2,
            d.0 / h.0
        );
        json.push(format!(
            r#"{{"load":"{pct:.0}%","dispatcher_p99_ms":{:.3},"dispatcher_range":[{:.3},{:.3}],"haproxy_p99_ms":{:.3},"haproxy_range":[{:.3},{:.3}]}}"#,
            d.0, d.1, d.2, h.0, h.1, h.2
        ));
    }
    println!("\n{table}");
    (format!("[{}]", json.join(",")), table)
}
