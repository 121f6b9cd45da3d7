//! `cargo xtask demo --dispatchers N`: the tour behind a router. A BIRD router spreads
//! flows by ECMP over N dispatchers, each announcing the VIPs with BIRD and sharing state
//! through a 3-member etcd cluster; keep-alive HTTP clients with sessions and long-lived
//! L4 TCP flows run throughout. A dispatcher joins, one leaves gracefully, one's host
//! dies. The summary counts broken connections, failed requests, sessions kept and
//! requests that reached a server that does not own their session.

use std::time::{Duration, Instant};

use dispatcher_testbed::{
    cluster::dispatcher_ip,
    ecmp::{Ecmp, Load, Snapshot},
};

const HTTP_CLIENTS: usize = 16;
const L4_FLOWS: usize = 4;
const PACE: Duration = Duration::from_millis(25);

fn line(e: &Ecmp, load: &Load, live: &[usize], what: &str, t0: Instant) {
    let hops: Vec<String> = e
        .next_hops()
        .iter()
        .map(|h| (0..8).find(|&i| dispatcher_ip(i) == *h).map(|i| format!("d{i}")).unwrap_or(h.clone()))
        .collect();
    let tables: Vec<String> = live
        .iter()
        .filter_map(|&i| {
            let s = e.m.status(i).steering?;
            Some(format!("d{i}:gen{} {}st/{}2nd", s.generation, s.steered, s.second_chances))
        })
        .collect();
    let s = load.snapshot();
    println!(
        "  {:>5.1}s  {what:<34} router -> [{}]  requests {:>6}  broken {:>2}  moved {:>3}  L4 broken {}  | {}",
        t0.elapsed().as_secs_f64(),
        hops.join(" "),
        s.requests,
        s.broken,
        s.moved,
        s.l4_broken,
        tables.join("  ")
    );
}

fn phase(e: &Ecmp, load: &Load, live: &[usize], what: &str, t0: Instant, secs: u64) -> Snapshot {
    let before = load.snapshot();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        line(e, load, live, what, t0);
        std::thread::sleep(Duration::from_millis(1000));
    }
    load.snapshot() - before
}

pub fn run(n: usize, seconds: u64) {
    let n = n.clamp(2, 4);
    let per = (seconds / 4).max(3);
    println!("dispatcher demo behind a router: {n} dispatchers (+1 joining), BIRD + ECMP, 3 etcd members, 4 clones in replica pairs");
    println!("[1/3] namespaces: router with BIRD (multipath, L4 hash), etcd x3, clones, {} dispatcher hosts", n + 1);
    let mut e = Ecmp::new(n + 1, 4, true);
    println!("[2/3] dispatchers d0..d{} start; each announces the VIPs with BIRD once it serves", n - 1);
    e.up(n);
    println!(
        "[3/3] traffic: {HTTP_CLIENTS} keep-alive HTTP clients with sessions, {L4_FLOWS} long-lived L4 TCP flows\n"
    );
    let load = Load::start(&e.clients, HTTP_CLIENTS, L4_FLOWS, PACE);
    let t0 = Instant::now();
    let mut live: Vec<usize> = (0..n).collect();
    let mut rows = Vec::new();

    rows.push(("steady", phase(&e, &load, &live, "steady", t0, per)));

    let j = n;
    println!("  -> d{j} joins (dispatcher run; BIRD announces; every table gains d{j})");
    e.start(j);
    live.push(j);
    let join = phase(&e, &load, &live, &format!("d{j} joined"), t0, per);
    rows.push(("a dispatcher joins", join));

    let l = 1;
    println!("  -> d{l} leaves: dispatcher leave --wait 10, then dispatcher stop");
    let before = load.snapshot();
    let out = e.m.cmd(l, &["leave", "--wait", "10"]);
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        println!("     {l}");
    }
    e.m.stop_dispatcher(l);
    live.retain(|&i| i != l);
    let rest = phase(&e, &load, &live, &format!("d{l} left"), t0, per);
    rows.push(("a dispatcher leaves", (load.snapshot() - before).max_with(rest)));

    let d = j;
    let held: u64 = e.held(d);
    println!("  -> d{d}'s host dies: its link goes down ({held} client connections terminate there)");
    let before = load.snapshot();
    e.cut_host(d);
    live.retain(|&i| i != d);
    let _ = phase(&e, &load, &live, &format!("d{d} host dead"), t0, 3);
    load.wait_recovered(before, Duration::from_secs(15));
    rows.push(("a dispatcher's host dies", load.snapshot() - before));
    let errors = load.take_errors();
    let total = load.stop();

    let misroutes = e.m.clones.misroutes();
    let lost = e.m.clones.hits().iter().filter(|h| h.lost).count();
    println!("\nsummary");
    println!("  {:<28} {:>8} {:>8} {:>10} {:>10}", "", "requests", "failed", "broken", "L4 broken");
    for (name, s) in &rows {
        println!("  {name:<28} {:>8} {:>8} {:>10} {:>10}", s.requests, s.failed, s.broken, s.l4_broken);
    }
    println!(
        "  {:<28} {:>8} {:>8} {:>10} {:>10}",
        "total", total.requests, total.failed, total.broken, total.l4_broken
    );
    for e in errors.iter().take(8) {
        println!("  client error: {e}");
    }
    println!("  connections moved between requests (Connection: close, not broken): {}", total.moved);
    println!("  broken when the host died: {} of the {held} it terminated (only those may break)", rows[3].1.broken);
    println!("  requests that found no copy of their session (lost): {lost} (expected 0)");
    println!("  requests to a server that does not own their session: {} (expected 0)", misroutes.len());
    let prefix = e.m.tb.prefix.clone();
    drop(e);
    println!("\ntorn down {prefix}: dispatchers, BIRD, etcd, namespaces");
}

trait MaxWith {
    fn max_with(self, o: Snapshot) -> Snapshot;
}

impl MaxWith for Snapshot {
    /// The larger of two overlapping measurements (the second ran inside the first).
    fn max_with(self, o: Snapshot) -> Snapshot {
        if o.requests > self.requests {
            o
        } else {
            self
        }
    }
}
