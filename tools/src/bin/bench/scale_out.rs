//! Behind a router (`--scale-out`): dispatchers announcing with BIRD, a router spreading
//! flows by ECMP. In one run: connections broken per membership change (a join, a
//! graceful leave, a host's death) with connection steering and with plain ECMP; the cost
//! of steering per packet in XDP (BPF_PROG_TEST_RUN, beside the XDP_PASS floor, as
//! `--xdp`); requests/s through 1, 2 and 3 dispatchers; connection takeover (a host's death
//! under 300 idle keep-alive clients with takeover on and off, what it costs on the peer
//! channel, requests/s with it on and off).

use std::time::Duration;

use crate::{
    report::{self, Row},
    wrk,
};
use dispatcher_common::{steer_sel, STEER_HAS_PREV, STEER_ON};
use dispatcher_testbed::{
    cluster::VIP,
    ecmp::{Ecmp, Load, Snapshot},
    fixture::{test_run, Fixture, CONFIG, XDP_PASS, XDP_TX},
    packet::{Packet, LB_MAC, TCP_ACK},
};

const HTTP_CONNS: usize = 24;
const L4_FLOWS: usize = 6;
const PACE: Duration = Duration::from_millis(25);

#[derive(Default, Clone, Copy)]
struct Change {
    broken: u64,
    failed: u64,
    moved: u64,
    l4_broken: u64,
}

impl From<Snapshot> for Change {
    fn from(s: Snapshot) -> Change {
        Change { broken: s.broken, failed: s.failed, moved: s.moved, l4_broken: s.l4_broken }
    }
}

/// Join of d3, graceful leave of d1, death of d3's host, under the same load.
fn changes(steering: bool) -> [(Change, u64); 3] {
    eprintln!("==> scale-out: membership changes, steering {}", if steering { "on" } else { "off" });
    let mut e = Ecmp::new(4, 4, steering);
    e.up(3);
    let load = Load::start(&e.clients, HTTP_CONNS, L4_FLOWS, PACE);
    std::thread::sleep(Duration::from_secs(2));

    let before = load.snapshot();
    e.start(3);
    e.wait_next_hops(&[0, 1, 2, 3], Duration::from_secs(20));
    if steering {
        for i in 0..4 {
            e.wait_table(i, &["d0", "d1", "d2", "d3"], Duration::from_secs(10));
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    let join = (load.snapshot() - before).into();

    let before = load.snapshot();
    let held_leaver = e.held(1);
    let args: &[&str] = if steering { &["leave", "--wait", "10"] } else { &["leave"] };
    let _ = e.m.cmd(1, args);
    e.wait_next_hops(&[0, 2, 3], Duration::from_secs(5));
    e.m.stop_dispatcher(1);
    std::thread::sleep(Duration::from_secs(2));
    let leave = (load.snapshot() - before).into();

    let held = e.held(3);
    let before = load.snapshot();
    e.cut_host(3);
    e.wait_next_hops(&[0, 2], Duration::from_secs(5));
    let recovered = load.wait_recovered(before, Duration::from_secs(20));
    let death: Change = (load.snapshot() - before).into();
    if !recovered {
        eprintln!("    (not every client was served again within 20 s after the death)");
    }
    load.stop();
    [(join, HTTP_CONNS as u64), (leave, held_leaver), (death, held)]
}

/// One death under 300 keep-alive clients asking every 700 ms (most idle at any moment).
#[derive(Default, Clone, Copy)]
struct Takeover {
    held: u64,
    broken: u64,
    rebuilt: u64,
    reset: u64,
    /// ms from the death until every client was served again.
    recovered_ms: u64,
    /// The dead host's sending side before the death, per registered connection: bytes
    /// on the peer channel, and CPU (ns) per connection per second.
    bytes_per_conn: f64,
    cpu_ns_per_conn_s: f64,
}

const TAKEOVER_CLIENTS: usize = 300;

/// Three dispatchers up behind the router, takeover on or off.
fn three_dispatchers(takeover: bool) -> Ecmp {
    let mut e = Ecmp::new(3, 4, true);
    if !takeover {
        e.m.cluster_extra += "takeover = false\n";
        for i in 0..3 {
            let text = e.m.config_text(i, &e.m.dispatchers[i].instance);
            std::fs::write(&e.m.dispatchers[i].config, text).expect("config");
        }
    }
    e.up(3);
    e
}

fn takeover_death(on: bool, quick: bool) -> Takeover {
    eprintln!(
        "==> scale-out: a host's death under {TAKEOVER_CLIENTS} idle keep-alive clients, takeover {}",
        if on { "on" } else { "off" }
    );
    let e = three_dispatchers(on);
    let load = Load::start(&e.clients, TAKEOVER_CLIENTS, 0, Duration::from_millis(700));
    let takeover = |i: usize| e.m.status(i).steering.and_then(|s| s.takeover).unwrap_or_default();
    std::thread::sleep(Duration::from_secs(2));
    let (t_a, at_a) = (takeover(2), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(if quick { 3 } else { 10 }));
    let (t_b, secs) = (takeover(2), at_a.elapsed().as_secs_f64());
    let held = e.held(2);
    let conns = t_b.tracked.max(1) as f64;
    let mut out = Takeover {
        held,
        bytes_per_conn: t_b.bytes_sent as f64 / t_b.registered.max(1) as f64,
        cpu_ns_per_conn_s: (t_b.busy_ns - t_a.busy_ns) as f64 / conns / secs,
        ..Default::default()
    };
    let before = load.snapshot();
    let died = std::time::Instant::now();
    e.cut_host(2);
    let served = loop {
        std::thread::sleep(Duration::from_millis(100));
        if died.elapsed() > Duration::from_secs(2) && load.idle_clients(died.elapsed()) == 0 {
            break true;
        }
        if died.elapsed() > Duration::from_secs(20) {
            break false;
        }
    };
    out.recovered_ms = died.elapsed().as_millis() as u64;
    if !served {
        eprintln!("    (not every client was served again within 20 s after the death)");
    }
    let d = load.snapshot() - before;
    out.broken = d.broken;
    let (t0, t1) = (takeover(0), takeover(1));
    out.rebuilt = t0.rebuilt + t1.rebuilt;
    out.reset = t0.reset + t1.reset;
    load.stop();
    eprintln!(
        "    held {held}, broken {}, rebuilt {}, reset {}, all served again after {} ms; before: {:.0} bytes and {:.0} ns/s per connection",
        out.broken, out.rebuilt, out.reset, out.recovered_ms, out.bytes_per_conn, out.cpu_ns_per_conn_s
    );
    out
}

/// wrk through the router to 3 dispatchers, takeover on or off: keep-alive connections
/// (a request flips a flag) and a new connection per request (each one registered).
fn takeover_rps(on: bool, quick: bool) -> (f64, f64) {
    eprintln!("==> scale-out: requests/s with takeover {}", if on { "on" } else { "off" });
    let secs = if quick { 3 } else { 8 };
    let e = three_dispatchers(on);
    let url = format!("http://{VIP}/app");
    let mut keep = Vec::new();
    let mut close = Vec::new();
    for _ in 0..3 {
        keep.push(wrk::run(e.clients.command("wrk"), &url, 64, secs, None).rps as u64);
        let mut cmd = e.clients.command("wrk");
        cmd.args(["-H", "Connection: close"]);
        close.push(wrk::run(cmd, &url, 16, secs, None).rps as u64);
    }
    let (k, c) = (median(keep) as f64, median(close) as f64);
    eprintln!("    keep-alive {k:.0} requests/s, a connection per request {c:.0} requests/s (medians of 3)");
    (k, c)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// `STEER_CONF` as a running agent keeps it: with a fresh beacon.
fn conf(fx: &mut Fixture, sel: u32) {
    fx.set_steer(sel, dispatcher::steering::monotonic_ns());
}

/// ns/packet above the floor for an HTTP VIP packet: steering off, owned here, owned by
/// another dispatcher (sent on), a second chance (socket lookup, then sent on).
fn steer_cost(quick: bool) -> Vec<(&'static str, u64, u64)> {
    let runs = if quick { 2_000 } else { 20_000 };
    let mut fx = Fixture::new(CONFIG);
    let mut pass = dispatcher::dataplane::load_pass().expect("load pass");
    let other = [0x02, 0x99, 0, 0, 1, 0x0a];
    fx.steer_all(0, LB_MAC);
    fx.steer_all(1, other);
    let syn = Packet::tcp("10.0.0.2", 4000, "10.0.100.3", 80).build();
    let ack = Packet::tcp("10.0.0.2", 4000, "10.0.100.3", 80).with(|p| p.tcp_flags = TCP_ACK).build();
    let floor_pkt = Packet::tcp("10.0.0.2", 4000, "10.0.100.1", 80).build();
    let cases: [(&str, u32, &Vec<u8>, u32); 5] = [
        ("HTTP VIP, steering off", 0, &ack, XDP_PASS),
        ("HTTP VIP, owned here", steer_sel(0, 0, STEER_ON), &ack, XDP_PASS),
        ("HTTP VIP, owned here, SYN (beacon read)", steer_sel(0, 0, STEER_ON), &syn, XDP_PASS),
        ("HTTP VIP, steered to its owner", steer_sel(1, 0, STEER_ON), &syn, XDP_TX),
        ("HTTP VIP, second chance (socket lookup)", steer_sel(0, 1, STEER_ON | STEER_HAS_PREV), &ack, XDP_TX),
    ];
    let mut rows = Vec::new();
    for (name, sel, input, verdict) in cases {
        conf(&mut fx, sel);
        let (mut s, mut f) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let o = fx.run_bytes(input);
            assert_eq!(o.verdict, verdict, "{name}");
            s.push(o.duration.as_nanos() as u64);
            f.push(test_run(&mut pass, "pass", &floor_pkt, 1).duration.as_nanos() as u64);
        }
        let (ns, floor) = (median(s), median(f));
        eprintln!("    {name}: {ns} ns (floor {floor})");
        rows.push((name, ns, floor));
    }
    rows
}

/// wrk through the router with 1, 2, 3 dispatchers joined (steering on).
fn throughput(quick: bool) -> Vec<(usize, f64, u64)> {
    eprintln!("==> scale-out: requests/s through 1, 2, 3 dispatchers");
    let secs = if quick { 3 } else { 8 };
    let mut e = Ecmp::new(3, 4, true);
    let mut out = Vec::new();
    for n in 1..=3 {
        e.start(n - 1);
        e.wait_next_hops(&(0..n).collect::<Vec<_>>(), Duration::from_secs(30));
        let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        for i in 0..n {
            e.wait_table(i, &names, Duration::from_secs(10));
        }
        let wrk::Wrk { rps, errors, .. } =
            wrk::run(e.clients.command("wrk"), &format!("http://{VIP}/app"), 64, secs, None);
        eprintln!("    {n} dispatcher(s): {rps:.0} requests/s, {errors} errors");
        out.push((n, rps, errors));
    }
    out
}

pub fn run(quick: bool) -> (String, String) {
    let on = changes(true);
    let off = changes(false);
    let cost = steer_cost(quick);
    let rps = throughput(quick);
    let taken = [takeover_death(true, quick), takeover_death(false, quick)];
    let with = [takeover_rps(true, quick), takeover_rps(false, quick)];
    let names = ["a 4th dispatcher joins", "a dispatcher leaves gracefully", "a dispatcher's host dies"];
    let mut md = format!(
        "{HTTP_CONNS} keep-alive HTTP clients with sessions ({} requests/s each) and {L4_FLOWS} long-lived L4 TCP flows through a BIRD router (ECMP, L4 hash) to 3-4 dispatchers; BIRD on each dispatcher.\n\n",
        1000 / PACE.as_millis()
    );
    let changes: Vec<Row> = (0..3)
        .map(|i| {
            let ((a, held_a), (b, held_b)) = (on[i], off[i]);
            let of = |held: u64| if i == 0 { String::new() } else { format!(" (of {held} it held)") };
            Row::new()
                .text("change", "change", names[i])
                .md("HTTP connections broken, steering on", format!("{}{}", a.broken, of(held_a)))
                .md("plain ECMP", format!("{}{}", b.broken, of(held_b)))
                .json("broken_on", a.broken)
                .json("broken_off", b.broken)
                .md("failed requests, on / off", format!("{} / {}", a.failed, b.failed))
                .json("failed_on", a.failed)
                .json("failed_off", b.failed)
                .json("held_on", held_a)
                .json("held_off", held_b)
                .md("closed for moving (on)", a.moved)
                .md("L4 flows broken (on / off)", format!("{} / {}", a.l4_broken, b.l4_broken))
                .json("l4_broken_on", a.l4_broken)
                .json("l4_broken_off", b.l4_broken)
        })
        .collect();
    md += &report::markdown(&changes);
    let cost: Vec<Row> = cost
        .iter()
        .map(|(name, ns, floor)| {
            Row::new()
                .text("XDP, HTTP VIP packet", "case", name)
                .int("ns/packet", "ns", ns)
                .md("above floor", ns.saturating_sub(*floor))
                .json("floor", floor)
        })
        .collect();
    md += "\n";
    md += &report::markdown(&cost);
    let rps: Vec<Row> = rps
        .iter()
        .map(|(n, r, err)| {
            Row::new()
                .int("dispatchers", "dispatchers", n)
                .num("requests/s (wrk, 64 connections, through the router)", "rps", *r, 0, 0)
                .int("errors", "errors", err)
        })
        .collect();
    md += "\n";
    md += &report::markdown(&rps);
    md += "\nAll dispatchers, the router, the clients and the clones share this machine's CPUs: more dispatchers add no CPU, so requests/s cannot grow with them here; what the last table shows is the cost of the extra hop (steering) and of more processes on the same cores.\n";
    let deaths: Vec<Row> = ["on", "off"]
        .iter()
        .zip(taken)
        .map(|(mode, t)| {
            Row::new()
                .text("takeover", "takeover", mode)
                .int("connections on the dead host", "held", t.held)
                .int("broken", "broken", t.broken)
                .int("rebuilt elsewhere", "rebuilt", t.rebuilt)
                .int("reset (busy at the death)", "reset", t.reset)
                .int("every client served again after (ms)", "recovered_ms", t.recovered_ms)
                .num("peer channel bytes per connection", "bytes_per_conn", t.bytes_per_conn, 0, 0)
                .num("sending side CPU per connection (ns/s)", "cpu_ns_per_conn_s", t.cpu_ns_per_conn_s, 0, 0)
        })
        .collect();
    md += &format!(
        "\nA host's death under {TAKEOVER_CLIENTS} keep-alive HTTP clients asking every 700 ms (most idle at any moment), 3 dispatchers, with connection takeover on and off:\n\n"
    );
    md += &report::markdown(&deaths);
    let rps_takeover: Vec<Row> = ["on", "off"]
        .iter()
        .zip(with)
        .map(|(mode, (k, c))| {
            Row::new()
                .text("takeover", "takeover", mode)
                .num("requests/s, keep-alive (wrk, 64 connections)", "rps_keepalive", k, 0, 0)
                .num("requests/s, a connection per request (16)", "rps_close", c, 0, 0)
        })
        .collect();
    md += "\n";
    md += &report::markdown(&rps_takeover);
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    md += &format!(
        "\nRequests/s with takeover on over off: {:.3} keep-alive, {:.3} a connection per request (target: within 3%).\n",
        ratio(with[0].0, with[1].0),
        ratio(with[0].1, with[1].1)
    );
    let json = format!(
        r#"{{"changes":{},"steer_ns":{},"throughput":{},"takeover_death":{},"takeover_rps":{}}}"#,
        report::json(&changes),
        report::json(&cost),
        report::json(&rps),
        report::json(&deaths),
        report::json(&rps_takeover)
    );
    (json, md)
}
