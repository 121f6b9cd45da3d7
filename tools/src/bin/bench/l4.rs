//! L4 forwarding in the namespace testbed, same backends and traffic for each system:
//! the XDP data plane (MAC forwarding, direct server return), nftables DNAT with `jhash`
//! over the backends (as kube-proxy's nftables mode does; this kernel has no IPVS), and
//! HAProxy in `mode tcp`. Measures TCP connections/s (short HTTP/1.0 exchanges) and UDP
//! packets/s (counted where they arrive, on the backends).

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::{
    peers,
    report::{self, Row},
};
use dispatcher_testbed::netns::{backend_ip, Testbed, CLIENT_IP, LB_IP};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const VIP: &str = "10.99.100.60";
const TCP_PORT: u16 = 80;
const UDP_PORT: u16 = 9000;
const CONCURRENCY: usize = 32;

/// Short TCP exchanges as fast as `CONCURRENCY` clients can: connections per second.
fn connections_per_second(tb: &Testbed, secs: u64) -> (f64, u64) {
    let addr: SocketAddr = format!("{VIP}:{TCP_PORT}").parse().unwrap();
    tb.client.run(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async move {
            let done = Arc::new(AtomicU64::new(0));
            let errors = Arc::new(AtomicU64::new(0));
            let end = Instant::now() + Duration::from_secs(secs);
            let mut tasks = Vec::new();
            for _ in 0..CONCURRENCY {
                let (done, errors) = (done.clone(), errors.clone());
                tasks.push(tokio::spawn(async move {
                    let mut buf = [0u8; 512];
                    while Instant::now() < end {
                        let r = tokio::time::timeout(Duration::from_secs(2), async {
                            let mut s = tokio::net::TcpStream::connect(addr).await?;
                            s.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
                            let mut got = 0;
                            loop {
                                let n = s.read(&mut buf).await?;
                                if n == 0 {
                                    break;
                                }
                                got += n;
                            }
                            std::io::Result::Ok(got)
                        })
                        .await;
                        match r {
                            Ok(Ok(n)) if n > 0 => done.fetch_add(1, Ordering::Relaxed),
                            _ => errors.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
            (done.load(Ordering::Relaxed) as f64 / secs as f64, errors.load(Ordering::Relaxed))
        })
    })
}

/// UDP sinks on every backend, counting datagrams.
struct Sinks {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

fn start_sinks(tb: &Testbed, bind_vip: bool) -> Sinks {
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for (i, ns) in tb.backends.iter().enumerate() {
        let (stop, count) = (stop.clone(), count.clone());
        // DSR delivers to the VIP, DNAT to the backend's own address.
        let bind = if bind_vip { VIP.to_string() } else { backend_ip(i).to_string() };
        threads.push(ns.spawn(move || {
            let s = UdpSocket::bind((bind.as_str(), UDP_PORT)).expect("bind sink");
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if s.recv(&mut buf).is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(100));
    Sinks { stop, count, threads }
}

/// One frame, sent as fast as the kernel can: the `tx` program under BPF_PROG_TEST_RUN in
/// live-frames mode on the client's interface (no userspace sender in the way). Returns
/// frames sent per second.
fn generate(tb: &Testbed, secs: u64) -> f64 {
    tb.client.run(move || {
        use aya::programs::{TestRun, TestRunAttrs, TestRunOptions};
        let frame = dispatcher_testbed::packet::Packet::udp(CLIENT_IP, 40000, VIP, UDP_PORT)
            .with(|p| {
                p.eth_dst = [0x02, 0x99, 0, 0, 0, 0x01];
                p.eth_src = [0x02, 0x99, 0, 0, 0, 0x02];
                p.payload = vec![0u8; 22];
            })
            .build();
        let ifindex = nix::net::if_::if_nametoindex("eth0").expect("client eth0");
        let mut ctx = Vec::new();
        for v in [0u32, frame.len() as u32, 0, ifindex, 0, 0] {
            ctx.extend_from_slice(&v.to_ne_bytes());
        }
        let mut ebpf = dispatcher::dataplane::load_tx().expect("load tx");
        let xdp = dispatcher::dataplane::program(&mut ebpf, "tx").unwrap();
        let end = Instant::now() + Duration::from_secs(secs);
        let start = Instant::now();
        let mut sent = 0u64;
        const BURST: u32 = 200_000;
        while Instant::now() < end {
            let r = xdp.test_run(TestRunOptions {
                data_in: Some(&frame),
                ctx_in: Some(&ctx),
                repeat: BURST,
                attrs: TestRunAttrs::new().xdp_live_frames(64),
                ..Default::default()
            });
            if let Err(e) = r {
                panic!("live-frames generator: {e}");
            }
            sent += BURST as u64;
        }
        sent as f64 / start.elapsed().as_secs_f64()
    })
}

/// Frames received by all backends' interfaces so far.
fn backends_rx(tb: &Testbed) -> u64 {
    tb.backends
        .iter()
        .map(|b| {
            let out = b.ip(&["-s", "link", "show", "eth0"]);
            let mut lines = out.lines();
            while let Some(l) = lines.next() {
                if l.trim_start().starts_with("RX:") {
                    return lines
                        .next()
                        .and_then(|n| n.split_whitespace().nth(1))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                }
            }
            0
        })
        .sum()
}

/// Packets per second through the forwarding path at saturation: offered by the in-kernel
/// generator, delivered as counted on the backends' interfaces.
fn saturated_pps(tb: &Testbed, secs: u64) -> (f64, f64) {
    let before = backends_rx(tb);
    let start = Instant::now();
    let offered = generate(tb, secs);
    std::thread::sleep(Duration::from_millis(200));
    let delivered = (backends_rx(tb) - before) as f64 / start.elapsed().as_secs_f64();
    (offered, delivered)
}

/// Busy CPU time of the whole machine so far (user, nice, system, irq, softirq), in
/// clock ticks.
fn busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu = stat.lines().next().unwrap_or("");
    let v: Vec<u64> = cpu.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq
    [0, 1, 2, 5, 6].iter().filter_map(|&i| v.get(i)).sum()
}

/// 64-byte datagrams from 16 source ports as fast as one sender can: packets per second
/// received by the backends, sent per second, and the machine's CPU time per delivered
/// packet (sender included: the same sender for every system, so differences are the
/// forwarding path's).
fn packets_per_second(tb: &Testbed, sinks: &Sinks, secs: u64) -> (f64, f64, f64) {
    let addr: SocketAddr = format!("{VIP}:{UDP_PORT}").parse().unwrap();
    let before = sinks.count.load(Ordering::Relaxed);
    let ticks_before = busy_ticks();
    let sent = tb.client.run(move || {
        let socks: Vec<UdpSocket> = (0..16)
            .map(|_| {
                let s = UdpSocket::bind((CLIENT_IP, 0)).unwrap();
                s.connect(addr).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect();
        let payload = [0u8; 22]; // 14 + 20 + 8 + 22 = 64-byte frames
        let end = Instant::now() + Duration::from_secs(secs);
        let mut sent = 0u64;
        while Instant::now() < end {
            for s in &socks {
                for _ in 0..32 {
                    if s.send(&payload).is_ok() {
                        sent += 1;
                    }
                }
            }
        }
        sent
    });
    std::thread::sleep(Duration::from_millis(300));
    let got = sinks.count.load(Ordering::Relaxed) - before;
    let tick_ns = 1e9 / 100.0; // USER_HZ
    let cpu_ns_per_packet = (busy_ticks() - ticks_before) as f64 * tick_ns / got.max(1) as f64;
    (got as f64 / secs as f64, sent as f64 / secs as f64, cpu_ns_per_packet)
}

fn stop_sinks(s: Sinks) {
    s.stop.store(true, Ordering::SeqCst);
    for t in s.threads {
        let _ = t.join();
    }
}

struct Measured {
    system: &'static str,
    cps: f64,
    cps_errors: u64,
    pps: Option<(f64, f64, f64)>,
    /// (offered, delivered) by the in-kernel generator.
    saturated: Option<(f64, f64)>,
}

pub fn run(quick: bool) -> (String, String) {
    let secs = if quick { 3 } else { 8 };
    eprintln!(
        "==> L4 benchmark: {CONCURRENCY} concurrent short TCP connections and a UDP flood, {secs}s each, per system"
    );
    let mut tb = Testbed::new(4, &[VIP]);
    tb.enable_xdp_tx_from_client();
    let dir = tb.workdir.clone();
    for i in 0..4 {
        let conf = peers::write(
            &dir,
            &format!("l4backend{i}.conf"),
            peers::NGINX_L4_BACKEND,
            &[("DIR", &dir.display()), ("I", &i), ("PORT", &TCP_PORT)],
        );
        let mut cmd = tb.backends[i].command("nginx");
        cmd.arg("-p").arg(&dir).arg("-c").arg(&conf);
        tb.start(&format!("nginx-l4-b{i}"), cmd);
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut results = Vec::new();

    // 1. The XDP data plane.
    let cfg = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\nenabled = false\n\n{}\n[[vip]]\nname = \"tcp\"\naddress = \"{VIP}\"\nport = {TCP_PORT}\n\n[[vip]]\nname = \"udp\"\naddress = \"{VIP}\"\nport = {UDP_PORT}\nprotocol = \"udp\"\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    let path = tb.write_config(&cfg);
    tb.start_dispatcher(&path);
    let (cps, cps_errors) = connections_per_second(&tb, secs);
    let sinks = start_sinks(&tb, true);
    let pps = packets_per_second(&tb, &sinks, secs);
    stop_sinks(sinks);
    let saturated = saturated_pps(&tb, secs);
    tb.stop("dispatcher");
    results.push(Measured { system: "dispatcher (XDP)", cps, cps_errors, pps: Some(pps), saturated: Some(saturated) });

    // 2. HAProxy, mode tcp (a full proxy: TCP only).
    tb.add_local_vip(VIP);
    let servers: String = (0..4).map(|i| format!(" server b{i} {}:{TCP_PORT}\n", backend_ip(i))).collect();
    let hconf = peers::write(
        &dir,
        "haproxy-l4.cfg",
        peers::HAPROXY_L4,
        &[("BIND", &format!("{VIP}:{TCP_PORT}")), ("SERVERS", &servers)],
    );
    let mut cmd = tb.lb.command("haproxy");
    cmd.arg("-db").arg("-f").arg(&hconf);
    tb.start("haproxy-l4", cmd);
    std::thread::sleep(Duration::from_millis(500));
    let (cps, cps_errors) = connections_per_second(&tb, secs);
    if cps_errors > 0 {
        eprintln!("haproxy log:\n{}", tb.log("haproxy-l4"));
    }
    results.push(Measured { system: "HAProxy mode tcp", cps, cps_errors, pps: None, saturated: None });
    tb.stop("haproxy-l4");

    // 3. nftables DNAT, jhash over the backends; replies come back through the box.
    let map: Vec<String> = (0..4).map(|i| format!("{i} : {}", backend_ip(i))).collect();
    let rules = format!(
        "table ip l4bench {{\n chain pre {{\n  type nat hook prerouting priority dstnat;\n  ip daddr {VIP} tcp dport {TCP_PORT} dnat to jhash ip saddr . tcp sport mod 4 map {{ {m} }}\n  ip daddr {VIP} udp dport {UDP_PORT} dnat to jhash ip saddr . udp sport mod 4 map {{ {m} }}\n }}\n}}\n",
        m = map.join(", ")
    );
    let rules_path = dir.join("l4bench.nft");
    std::fs::write(&rules_path, rules).unwrap();
    tb.lb.exec(&["nft", "-f", rules_path.to_str().unwrap()]);
    tb.lb.sysctl("net.ipv4.ip_forward=1");
    for b in &tb.backends {
        b.ip(&["route", "add", &format!("{CLIENT_IP}/32"), "via", LB_IP]);
    }
    let (cps, cps_errors) = connections_per_second(&tb, secs);
    let sinks = start_sinks(&tb, false);
    let pps = packets_per_second(&tb, &sinks, secs);
    stop_sinks(sinks);
    let saturated = saturated_pps(&tb, secs);
    tb.lb.exec(&["nft", "delete", "table", "ip", "l4bench"]);
    tb.lb.sysctl("net.ipv4.ip_forward=0");
    for b in &tb.backends {
        b.ip(&["route", "del", &format!("{CLIENT_IP}/32")]);
    }
    results.push(Measured { system: "nftables DNAT", cps, cps_errors, pps: Some(pps), saturated: Some(saturated) });

    let nft_pps = results[2].pps.map(|p| p.0).unwrap_or(f64::NAN);
    let nft_cpu = results[2].pps.map(|p| p.2).unwrap_or(f64::NAN);
    let nft_cps = results[2].cps;
    let nft_sat = results[2].saturated.map(|p| p.1).unwrap_or(f64::NAN);
    let mut rows = Vec::new();
    for m in &results {
        let pps = |i: usize| m.pps.map(|p| [p.0, p.1, p.2][i]);
        let vs = |v: Option<f64>, base: f64| v.map(|v| format!("{:.2}", v / base)).unwrap_or("-".into());
        let cells = [pps(0), pps(1), pps(2)].map(|v| v.map(|v| format!("{v:.0}")).unwrap_or("-".into()));
        eprintln!(
            "    {:<18} {:>8.0} conn/s ({} errors)  {} pps delivered of {} offered, {} CPU ns/packet",
            m.system, m.cps, m.cps_errors, cells[0], cells[1], cells[2]
        );
        let sat = |f: fn((f64, f64)) -> f64| m.saturated.map(f);
        let sat_text = match m.saturated {
            Some((o, d)) => format!("{d:.0} | {o:.0} | {:.2}", d / nft_sat),
            None => "- | - | -".into(),
        };
        eprintln!("    {:<18} at saturation: delivered | offered | vs nftables = {sat_text}", m.system);
        rows.push(
            Row::new()
                .text("system", "system", m.system)
                .num("connections/s", "connections_per_s", m.cps, 0, 1)
                .int("connection errors", "connection_errors", m.cps_errors)
                .opt("UDP pps delivered (userspace sender)", "udp_pps_delivered", pps(0), 0, 1)
                .opt("offered", "udp_pps_offered", pps(1), 0, 1)
                .opt("CPU ns per delivered packet", "cpu_ns_per_packet", pps(2), 0, 1)
                .md("pps vs nftables", vs(pps(0), nft_pps))
                .md("CPU/packet vs nftables", vs(pps(2), nft_cpu))
                .md("conn/s vs nftables", format!("{:.2}", m.cps / nft_cps))
                .opt("pps delivered at saturation (in-kernel generator)", "", sat(|p| p.1), 0, 0)
                .opt("offered", "", sat(|p| p.0), 0, 0)
                .md("saturated pps vs nftables", vs(sat(|p| p.1), nft_sat)),
        );
    }
    let mut table = report::markdown(&rows);
    table += &format!(
        "\n{CONCURRENCY} concurrent HTTP/1.0 exchanges with nginx backends for connections/s; one sender, 64-byte frames from 16 source ports, for packets/s; {secs} s each. The sender shares the 2 vCPUs with the data path: \"offered\" is what it managed to send; while everything offered is delivered, packets/s measures the sender, and the CPU time per delivered packet (whole machine, the same sender for every system) compares the forwarding paths.\n"
    );
    println!("\n{table}");
    (report::json(&rows), table)
}
