//! `cargo xtask bench`: the benchmarks, each against its peers measured in the same run.
//! Writes `target/bench/report.json` and `target/bench/report.md`.

mod access_log;
mod charts;
mod cluster;
mod failover;
mod h2;
mod http;
mod l4;
mod load;
mod p99;
mod peers;
mod report;
mod routes;
mod scale_out;
mod scaling;
mod sip;
mod stall;
mod tls;
mod wrk;
mod xdp;

/// A benchmark: its flag, what it measures (`--list`), its key in report.json, its section
/// title in report.md, the Debian packages it needs beyond `cargo xtask setup`'s, and what
/// runs it (`quick`: fewer runs) into (JSON, Markdown).
struct Bench {
    flag: &'static str,
    about: &'static str,
    key: &'static str,
    title: &'static str,
    packages: &'static [&'static str],
    run: fn(bool) -> (String, String),
}

/// The peers measured beside the dispatcher, and the load generator (haproxy and
/// nftables, for the L4 row's DNAT, are among `cargo xtask setup`'s packages: the
/// access-log test runs haproxy's halog, the takeover test nft).
const HTTP_PEERS: &[&str] = &["nginx", "wrk"];

/// Every benchmark, in the order a run without flags runs them.
const BENCHES: &[Bench] = &[
    Bench {
        flag: "--xdp",
        about: "ns/packet through BPF_PROG_TEST_RUN, beside a trivial XDP program measured in the same run.",
        key: "xdp",
        title: "XDP (ns/packet, BPF_PROG_TEST_RUN)",
        packages: &[],
        run: xdp::run,
    },
    Bench {
        flag: "--scaling",
        about: "XDP cost vs flow-table fill and backend count.",
        key: "scaling",
        title: "Scaling (XDP cost vs flow-table fill and backend count)",
        packages: &[],
        run: scaling::run,
    },
    Bench {
        flag: "--l4",
        about: "L4 forwarding: XDP vs nftables DNAT vs HAProxy mode tcp.",
        key: "l4",
        title: "L4 forwarding (connections/s, packets/s)",
        packages: HTTP_PEERS,
        run: l4::run,
    },
    Bench {
        flag: "--http",
        about: "Requests/s and latency against HAProxy and nginx.",
        key: "http",
        title: "HTTP (wrk, same backends, same worker count)",
        packages: HTTP_PEERS,
        run: http::run,
    },
    Bench {
        flag: "--failover",
        about: "A clone killed or stopped under load, against HAProxy.",
        key: "failover",
        title: "Failover (a clone killed or stopped under load)",
        packages: HTTP_PEERS,
        run: failover::run,
    },
    Bench {
        flag: "--cluster",
        about: "Three dispatchers sharing etcd: convergence, etcd writes under load, req/s with and without `[cluster]`.",
        key: "cluster",
        title: "Several dispatchers (etcd, 3 dispatchers)",
        packages: HTTP_PEERS,
        run: cluster::run,
    },
    Bench {
        flag: "--scale-out",
        about: "Behind a BIRD router with ECMP: connections broken per membership change with steering on and off, the XDP cost of steering, requests/s through 1-3 dispatchers.",
        key: "scale_out",
        title: "Behind a router (BGP, ECMP, connection steering)",
        packages: HTTP_PEERS,
        run: scale_out::run,
    },
    Bench {
        flag: "--sip",
        about: "SIPp calls through the SIP VIPs (UDP in XDP, TCP and TLS in the agent) and through Kamailio (Call-ID hashing, the same transports): calls/s, CPU per message, a container's death.",
        key: "sip",
        title: "SIP (SIPp through the XDP SIP VIP and through Kamailio)",
        // SIPp itself comes with setup.
        packages: &["kamailio", "kamailio-tls-modules"],
        run: sip::run,
    },
    Bench {
        flag: "--tls",
        about: "HTTPS termination against HAProxy and nginx: keep-alive requests/s, new connections/s (full and resumed handshakes), memory per idle TLS connection.",
        key: "tls",
        title: "TLS (HTTPS termination: wrk, openssl s_time, idle connections)",
        packages: HTTP_PEERS,
        run: tls::run,
    },
    Bench {
        flag: "--h2",
        about: "HTTP/2 termination (h2 by ALPN) against HAProxy and nginx: h2load requests/s with 1 and 100 streams per connection, p99, CPU per request, memory per idle h2 connection.",
        key: "h2",
        title: "HTTP/2 (HTTPS with h2 by ALPN: h2load, idle h2 connections)",
        // h2load (nghttp2-client) and Python's h2 (python3-h2) come with setup.
        packages: HTTP_PEERS,
        run: h2::run,
    },
    Bench {
        flag: "--p99",
        about: "HTTP p99 against HAProxy at full load and at 50/75/90% of its maximum, in repeated rounds.",
        key: "p99",
        title: "HTTP p99 against HAProxy (repeated rounds)",
        packages: HTTP_PEERS,
        run: p99::run,
    },
    Bench {
        flag: "--access-log",
        about: "The access log's cost: requests/s with `[access_log]` off and on.",
        key: "access_log",
        title: "Access log (the same agent and load, logging off and on)",
        packages: HTTP_PEERS,
        run: access_log::run,
    },
    Bench {
        flag: "--routes",
        about: "Requests/s and CPU per request with 1 route and with 500 routes over 50 farms, against HAProxy with the same rules as ACLs.",
        key: "routes",
        title: "Routes (1 route and 500 routes over 50 farms, against HAProxy's ACLs)",
        packages: HTTP_PEERS,
        run: routes::run,
    },
];

/// Charts: SVG drawn by the bench, turned into PNG by rsvg-convert.
const CHART_PACKAGES: &[&str] = &["librsvg2-bin"];

fn usage() -> String {
    let mut s = String::from(
        "usage: bench [--quick] [BENCHMARK...]   (none: all of them)\n       bench --packages [BENCHMARK...]   (the Debian packages they need, one a line)\n\nbenchmarks:\n",
    );
    for b in BENCHES {
        s += &format!("  {:<14} {}\n", b.flag, b.about);
    }
    s + "  --quick        fewer runs per case\n"
}

fn main() {
    let mut quick = false;
    let mut packages = false;
    let mut help = false;
    let mut chosen: Vec<&Bench> = Vec::new();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "--packages" => packages = true,
            "--help" | "-h" | "--list" => help = true,
            flag => match BENCHES.iter().find(|b| b.flag == flag) {
                Some(b) => chosen.push(b),
                None => {
                    eprint!("bench: unknown argument `{flag}`\n\n{}", usage());
                    std::process::exit(2);
                }
            },
        }
    }
    if help {
        // With --packages (xtask asking): none to install for a listing.
        if !packages {
            print!("{}", usage());
        }
        return;
    }
    if chosen.is_empty() {
        chosen = BENCHES.iter().collect();
    }
    if packages {
        let mut all: Vec<&str> = chosen.iter().flat_map(|b| b.packages.iter().copied()).collect();
        all.extend(CHART_PACKAGES);
        all.sort_unstable();
        all.dedup();
        for p in all {
            println!("{p}");
        }
        return;
    }
    let mut parts = Vec::new();
    let mut md = String::new();
    for b in BENCHES.iter().filter(|b| chosen.iter().any(|c| c.flag == b.flag)) {
        let (json, table) = (b.run)(quick);
        parts.push(format!(r#""{}":{json}"#, b.key));
        md += &format!("### {}\n\n{table}\n", b.title);
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let report = format!(r#"{{"kernel":"{}","cpus":{cpus},"quick":{quick},{}}}"#, kernel.trim(), parts.join(","));
    std::fs::write(dir.join("report.json"), &report).unwrap();
    // Charts (PNG via rsvg-convert) of what this run measured.
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&report) {
        let files = charts::draw(&v, &dir);
        if !files.is_empty() {
            eprintln!("==> charts: {}", files.join(", "));
        }
    }
    std::fs::write(dir.join("report.md"), &md).unwrap();
    println!("\nreport: {} and report.md", dir.join("report.json").display());
    let failures = report::failures();
    if !failures.is_empty() {
        eprintln!("\nbench: {} measurement(s) failed (left out of the report):", failures.len());
        for f in &failures {
            eprintln!("  - {f}");
        }
        std::process::exit(1);
    }
}
