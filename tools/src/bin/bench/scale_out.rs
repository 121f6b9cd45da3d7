//! Behind a router (`--scale-out`): dispatchers announcing with BIRD, a router spreading
//! flows by ECMP. In one run: connections broken per membership change (a join, a
//! graceful leave, a host's death) with connection steering and with plain ECMP; the cost
//! of steering per packet in XDP (BPF_PROG_TEST_RUN, beside the XDP_PASS floor, as
//! `--xdp`); requests/s through 1, 2 and 3 dispatchers.

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
    let json = format!(
        r#"{{"changes":{},"steer_ns":{},"throughput":{}}}"#,
        report::json(&changes),
        report::json(&cost),
        report::json(&rps)
    );
    (json, md)
}
