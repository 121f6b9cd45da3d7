//! How cost grows with work: XDP ns/packet as the flow table fills and with more
//! backends; the agent's memory with more idle client connections.

use crate::report::{self, Row};
use dispatcher_common::{FlowKey, FlowValue};
use dispatcher_testbed::{
    fixture::{test_run, Fixture, XDP_TX},
    packet::{Packet, TCP_ACK},
};

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// A configuration with `n` backends and one MAC-forwarding VIP over all of them.
fn config(n: usize) -> String {
    let mut s = String::from("[dispatcher]\ninterface = \"lo\"\n\n");
    for i in 0..n {
        s += &format!(
            "[[backend]]\nname = \"b{i}\"\naddress = \"10.{}.{}.{}\"\nmac = \"02:00:00:{:02x}:{:02x}:{:02x}\"\n\n",
            1 + i / 65536,
            (i / 256) % 256,
            i % 256,
            (i >> 16) & 0xff,
            (i >> 8) & 0xff,
            i & 0xff
        );
    }
    s += "[[vip]]\nname = \"v\"\naddress = \"10.0.100.1\"\nport = 80\nring_size = 65537\n";
    s
}

/// Median single-shot ns of a new flow and of an established one, and of the floor.
fn measure(fx: &mut Fixture, pass: &mut aya::Ebpf, runs: u32) -> (u64, u64, u64) {
    let floor_pkt = Packet::tcp("10.0.0.2", 4000, "10.0.100.1", 80).build();
    let mut new = Vec::new();
    let mut est = Vec::new();
    let mut floor = Vec::new();
    // An established connection's packets carry ACK.
    let established = Packet::tcp("192.168.0.2", 4001, "10.0.100.1", 80).with(|p| p.tcp_flags = TCP_ACK).build();
    fx.run_bytes(&established);
    for i in 0..runs {
        let p = Packet::tcp(
            &format!("172.{}.{}.{}", 16 + (i >> 16) % 16, (i >> 8) % 256, i % 256),
            1024 + (i % 50000) as u16,
            "10.0.100.1",
            80,
        )
        .build();
        let o = fx.run_bytes(&p);
        assert_eq!(o.verdict, XDP_TX);
        new.push(o.duration.as_nanos() as u64);
        est.push(fx.run_bytes(&established).duration.as_nanos() as u64);
        floor.push(test_run(pass, "pass", &floor_pkt, 1).duration.as_nanos() as u64);
    }
    (median(new), median(est), median(floor))
}

pub fn run(quick: bool) -> (String, String) {
    let runs = if quick { 2_000 } else { 10_000 };
    eprintln!("==> scaling: XDP cost vs flow-table fill and backend count ({runs} single-shot runs each)");
    let mut pass = dispatcher::dataplane::load_pass().expect("load pass");
    let mut rows = Vec::new();
    let row = |case: String, flows: u32, backends: usize, (n, e, f): (u64, u64, u64)| {
        Row::new()
            .text("XDP, single-shot ns/packet", "", case)
            .json("flows", flows)
            .json("backends", backends)
            .int("new flow", "new_ns", n)
            .int("established", "established_ns", e)
            .int("floor", "floor_ns", f)
    };
    // Flow-table fill, 4 backends.
    for fill in [1_000u32, 100_000, 1_000_000] {
        let mut fx = Fixture::with_flow_table(&config(4), dispatcher_common::DEFAULT_MAX_FLOWS);
        for i in 0..fill {
            let key = FlowKey {
                src: [0x0a_00_00_00u32.to_be() + i, 0, 0, 0],
                dst: [u32::from_ne_bytes([10, 0, 100, 1]), 0, 0, 0],
                sport: 1,
                dport: 80u16.to_be(),
                proto: 6,
                family: 2,
                _pad: 0,
            };
            let _ = fx.tables.flows.insert(key, FlowValue { backend: i % 4, vip: 0, cookie_hash: 0, pinned_ns: 0 }, 0);
        }
        let (n, e, f) = measure(&mut fx, &mut pass, runs);
        eprintln!("    {fill:>9} flows in the table: new {n} ns, established {e} ns (floor {f})");
        rows.push(row(format!("{fill} flows in FLOWS, 4 backends"), fill, 4, (n, e, f)));
    }
    for backends in [16usize, 256, 4096] {
        let mut fx = Fixture::with_flow_table(&config(backends), dispatcher_common::DEFAULT_MAX_FLOWS);
        let (n, e, f) = measure(&mut fx, &mut pass, runs);
        eprintln!("    {backends:>9} backends: new {n} ns, established {e} ns (floor {f})");
        rows.push(row(format!("{backends} backends"), 0, backends, (n, e, f)));
    }
    let table = report::markdown(&rows);
    println!("\n{table}");
    (report::json(&rows), table)
}
