//! `cargo xtask bench --xdp`: ns/packet of the XDP program through BPF_PROG_TEST_RUN, per
//! packet class and forwarding mode, beside a trivial XDP_PASS program measured in the
//! same run. Single-shot runs (the kernel reuses the rewritten buffer under `repeat`);
//! the median of many.

use std::time::Duration;

use aya::programs::{TestRun, TestRunOptions};
use dispatcher_tests::{
    fixture::{Fixture, XDP_DROP, XDP_PASS, XDP_TX},
    packet::Packet,
};

const CONFIG: &str = r#"
[dispatcher]
interface = "lo"

[[backend]]
name = "b0"
address = "10.0.0.10"
address6 = "fd00::10"
mac = "02:00:00:00:01:00"
replica = "b1"

[[backend]]
name = "b1"
address = "10.0.0.11"
address6 = "fd00::11"
mac = "02:00:00:00:01:01"
replica = "b0"

[[vip]]
name = "mac4"
address = "10.0.100.1"
port = 80

[[vip]]
name = "ipip4"
address = "10.0.100.2"
port = 80
forwarding = "ipip"
encap_source = "10.0.0.1"

[[vip]]
name = "mac6"
address = "fd00::100"
port = 80

[[vip]]
name = "ipip6"
address = "fd00::200"
port = 80
forwarding = "ipip"
encap_source = "fd00::1"

[[vip]]
name = "http"
address = "10.0.100.3"
port = 80
mode = "http"
"#;

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

struct Case {
    name: &'static str,
    /// Packet for run `i` (new flows vary the source port).
    packet: Box<dyn Fn(u32) -> Vec<u8>>,
    verdict: u32,
    /// Target above the floor, ns.
    target: Option<u64>,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let runs: u32 = if quick { 2_000 } else { 20_000 };
    let mut fx = Fixture::new(CONFIG);
    let mut pass = dispatcher::dataplane::load_pass().expect("load pass");

    let tcp = |dst: &'static str, v6: bool| {
        move |i: u32| {
            let src = if v6 { "fd00::2" } else { "10.0.0.2" };
            Packet::tcp(src, 1024 + (i % 60000) as u16, dst, 80)
                .with(|p| {
                    if v6 {
                        p.src = format!("fd00::{:x}", 2 + i / 60000).parse().unwrap();
                    } else {
                        p.src = format!("10.0.{}.{}", 1 + (i / 60000) / 250, 2 + (i / 60000) % 250).parse().unwrap();
                    }
                })
                .build()
        }
    };
    let fixed = |p: Packet| move |_: u32| p.build();
    let cases = vec![
        Case {
            name: "non-VIP pass",
            packet: Box::new(fixed(Packet::tcp("10.0.0.2", 4000, "10.0.0.99", 80))),
            verdict: XDP_PASS,
            target: None,
        },
        Case {
            name: "HTTP VIP pass",
            packet: Box::new(fixed(Packet::tcp("10.0.0.2", 4000, "10.0.100.3", 80))),
            verdict: XDP_PASS,
            target: None,
        },
        Case {
            name: "malformed drop (IHL 4)",
            packet: Box::new(fixed(Packet::tcp("10.0.0.2", 4000, "10.0.100.1", 80).with(|p| p.ihl = 4))),
            verdict: XDP_DROP,
            target: None,
        },
        Case {
            name: "L4 new flow, MAC, IPv4",
            packet: Box::new(tcp("10.0.100.1", false)),
            verdict: XDP_TX,
            target: Some(150),
        },
        Case {
            name: "L4 new flow, IPIP, IPv4",
            packet: Box::new(tcp("10.0.100.2", false)),
            verdict: XDP_TX,
            target: Some(150),
        },
        Case {
            name: "L4 new flow, MAC, IPv6",
            packet: Box::new(tcp("fd00::100", true)),
            verdict: XDP_TX,
            target: Some(150),
        },
        Case {
            name: "L4 new flow, IPIP, IPv6",
            packet: Box::new(tcp("fd00::200", true)),
            verdict: XDP_TX,
            target: Some(150),
        },
        Case {
            name: "L4 established, MAC, IPv4",
            packet: Box::new(fixed(Packet::tcp("10.0.0.2", 4001, "10.0.100.1", 80))),
            verdict: XDP_TX,
            target: Some(60),
        },
        Case {
            name: "L4 established, IPIP, IPv4",
            packet: Box::new(fixed(Packet::tcp("10.0.0.2", 4001, "10.0.100.2", 80))),
            verdict: XDP_TX,
            target: Some(60),
        },
        Case {
            name: "L4 established, MAC, IPv6",
            packet: Box::new(fixed(Packet::tcp("fd00::2", 4001, "fd00::100", 80))),
            verdict: XDP_TX,
            target: Some(60),
        },
        Case {
            name: "L4 established, IPIP, IPv6",
            packet: Box::new(fixed(Packet::tcp("fd00::2", 4001, "fd00::200", 80))),
            verdict: XDP_TX,
            target: Some(60),
        },
    ];

    let floor_pkt = Packet::tcp("10.0.0.2", 4000, "10.0.100.1", 80).build();
    let mut out = vec![0u8; 512];
    let mut run_pass = |out: &mut [u8]| -> u64 {
        let xdp = dispatcher::dataplane::program(&mut pass, "pass").unwrap();
        let r = xdp
            .test_run(TestRunOptions {
                data_in: Some(&floor_pkt),
                data_out: Some(out),
                repeat: 1,
                ..Default::default()
            })
            .unwrap();
        r.duration.as_nanos() as u64
    };
    eprintln!("==> XDP micro-benchmark: {runs} single-shot runs per case, median");
    // Warm up caches and the JIT'd code paths.
    for _ in 0..1000 {
        run_pass(&mut out);
    }
    let mut rows = Vec::new();
    let mut floors = Vec::new();
    for (ci, c) in cases.iter().enumerate() {
        // Established flows: pin the flow once before timing.
        if c.name.contains("established") {
            fx.run_bytes(&(c.packet)(0));
        }
        let mut samples = Vec::with_capacity(runs as usize);
        let mut floor = Vec::with_capacity(runs as usize);
        for i in 0..runs {
            let input = (c.packet)(i + ci as u32 * 1_000_000);
            let o = fx.run_bytes(&input);
            assert_eq!(o.verdict, c.verdict, "{}: unexpected verdict", c.name);
            samples.push(nanos(o.duration));
            // The floor interleaved with the case, so both see the same machine state.
            floor.push(run_pass(&mut out));
        }
        let m = median(samples);
        let f = median(floor);
        floors.push(f);
        eprintln!("    {:<28} {m:>5} ns  (floor {f} ns)", c.name);
        rows.push((c.name, m, f, c.target));
    }
    println!();
    println!("| case | ns/packet | XDP_PASS floor | above floor | target | met |");
    println!("|---|---:|---:|---:|---:|---|");
    let mut json = Vec::new();
    for (name, m, f, target) in &rows {
        let above = m.saturating_sub(*f);
        let (t, met) = match target {
            Some(t) => (format!("<= {t}"), if above <= *t { "yes" } else { "no" }),
            None => ("-".into(), "-"),
        };
        println!("| {name} | {m} | {f} | {above} | {t} | {met} |");
        json.push(format!(
            r#"{{"case":"{name}","ns":{m},"floor_ns":{f},"above_floor_ns":{above},"target_above_floor_ns":{}}}"#,
            target.map(|t| t.to_string()).unwrap_or("null".into())
        ));
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let report = format!(r#"{{"kernel":"{}","runs_per_case":{runs},"xdp":[{}]}}"#, kernel.trim(), json.join(","));
    std::fs::write(dir.join("report.json"), report).unwrap();
    println!("\nreport: {}", dir.join("report.json").display());
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}
