//! HTTP: the dispatcher, HAProxy (routing by the clone ID in JSESSIONID) and nginx
//! (`hash $cookie_JSESSIONID consistent`) in the dispatcher namespace, with the same
//! worker count, in front of the same four nginx backends; wrk from the client namespace.

use std::{
    io::{BufReader, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::{
    load, peers,
    report::{self, Row},
    wrk::{self, Wrk},
};
use dispatcher_testbed::{
    netns::{backend_ip, Testbed},
    websphere::read_response,
};

pub const VIP: &str = "10.99.100.20";
pub const BACKEND_PORT: u16 = 8080;
pub const WORKERS: usize = 1;
const CONNECTIONS: usize = 50;
/// The idle upstream connections nginx keeps: more than the benches' 50 client connections.
pub const NGINX_KEEPALIVE: usize = 64;

/// A system under test: its port on the VIP and its process log (shown when it does not
/// come up).
pub struct System {
    pub name: &'static str,
    pub port: u16,
    pub log: &'static str,
}

const SYSTEMS: [System; 3] = [
    System { name: "dispatcher", port: 80, log: "dispatcher" },
    System { name: "haproxy", port: 81, log: "haproxy" },
    System { name: "nginx", port: 82, log: "nginx-proxy" },
];

struct Measured {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// Of the sampled requests, the share that reached the clone their cookie names.
    affinity: f64,
    /// Microseconds of CPU (user + system, all its threads; nginx: its worker) per
    /// request over the wrk run.
    cpu_us: f64,
}

/// nginx on each of the testbed's four backends, configured by `backend_conf`.
/// The HTTP benches' testbed: four nginx backends, the VIP on the dispatcher's host.
pub fn bench_bed() -> Testbed {
    let mut tb = Testbed::new(4, &[VIP]);
    tb.add_local_vip(VIP);
    start_backends(&mut tb);
    tb
}

/// The agent's configuration for the HTTP benches: the VIP on port 80 over the four
/// backends (clone IDs `clone0x`...); `http_extra`: more `[http]` lines. The per-source
/// limits are off: one client namespace plays every client (as HAProxy and nginx run here,
/// without such limits).
pub fn agent_config(tb: &Testbed, http_extra: &str) -> String {
    let clone_ids: Vec<String> = (0..4).map(|i| format!("clone{i}x")).collect();
    agent_config_with(tb.instance(), http_extra, &tb.backend_config_with_clones(&[], &clone_ids))
}

/// As `agent_config`, for the testbed `instance`, with `sections` (`[[backend]]`,
/// `[[farm]]`, `[[route]]`...) in place of the testbed's four backends.
pub fn agent_config_with(instance: &str, http_extra: &str, sections: &str) -> String {
    format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{instance}\"\n\n[http]\nworkers = {WORKERS}\nmax_connections_per_source = 0\nmax_connection_rate_per_source = 0\n{http_extra}\n{sections}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nring_size = 1009\n",
    )
}

pub fn start_backends(tb: &mut Testbed) {
    let dir = tb.workdir.clone();
    for i in 0..4 {
        let conf = peers::write(
            &dir,
            &format!("backend{i}.conf"),
            peers::NGINX_BACKEND,
            &[("DIR", &dir.display()), ("I", &i), ("PORT", &BACKEND_PORT)],
        );
        let mut cmd = tb.backends[i].command("nginx");
        cmd.arg("-p").arg(&dir).arg("-c").arg(&conf);
        tb.start(&format!("nginx-b{i}"), cmd);
    }
}

/// Starts HAProxy (`haproxy.cfg`) routing by the clone ID in JSESSIONID to the four
/// backends; `global` and `bind`: the global section's extra lines and the frontend's bind
/// line.
pub fn start_haproxy(tb: &mut Testbed, maxconn: u64, global: &str, bind: &str) {
    let dir = tb.workdir.clone();
    let (use_servers, servers) = peers::haproxy_clone_servers(BACKEND_PORT, "");
    let conf = peers::write(
        &dir,
        "haproxy.cfg",
        peers::HAPROXY_HTTP,
        &[
            ("WORKERS", &WORKERS),
            ("MAXCONN", &maxconn),
            ("DIR", &dir.display()),
            ("GLOBAL", &global),
            ("BIND", &bind),
            ("USE_SERVERS", &use_servers),
            ("SERVERS", &servers),
        ],
    );
    let mut cmd = tb.lb.command("haproxy");
    cmd.arg("-db").arg("-f").arg(&conf);
    tb.start("haproxy", cmd);
}

/// Starts nginx (`nginx-proxy.conf`, process `nginx-proxy`) hashing JSESSIONID over the
/// four backends; `listen`: the server's listen line and any lines after it (TLS);
/// `keepalive`: the idle upstream connections it keeps (`NGINX_KEEPALIVE` but where more
/// requests are in flight).
pub fn start_nginx_proxy(tb: &mut Testbed, listen: &str, keepalive: usize) {
    let dir = tb.workdir.clone();
    let servers: String = (0..4).map(|i| format!("  server {}:{BACKEND_PORT};\n", backend_ip(i))).collect();
    let conf = peers::write(
        &dir,
        "nginx-proxy.conf",
        peers::NGINX_PROXY,
        &[
            ("WORKERS", &WORKERS),
            ("DIR", &dir.display()),
            ("SERVERS", &servers),
            ("LISTEN", &listen),
            ("KEEPALIVE", &keepalive),
        ],
    );
    let mut cmd = tb.lb.command("nginx");
    cmd.arg("-p").arg(&dir).arg("-c").arg(&conf);
    tb.start("nginx-proxy", cmd);
}

/// Writes the wrk script `cookies.lua` into the testbed's directory: its path.
pub fn cookies_script(tb: &Testbed) -> PathBuf {
    let path = tb.workdir.join("cookies.lua");
    std::fs::write(&path, peers::COOKIES_LUA).unwrap();
    path
}

/// wrk from the client namespace against the HTTP VIP's `port`.
pub fn wrk(tb: &Testbed, port: u16, secs: u64, script: &Path, connections: usize) -> Wrk {
    wrk::run(tb.client.command("wrk"), &format!("http://{VIP}:{port}/"), connections, secs, Some(script))
}

/// The process whose CPU a system's requests cost: the agent, HAProxy, nginx's worker.
fn cpu_pid(tb: &Testbed, s: &System) -> u32 {
    let pid = tb.pid_of(s.log).unwrap_or_else(|| panic!("{} is not running", s.name));
    if s.name == "nginx" {
        crate::tls::nginx_worker(pid)
    } else {
        pid
    }
}

/// Sends requests naming each clone and counts those that reached it.
fn affinity(tb: &Testbed, port: u16) -> f64 {
    let addr: SocketAddr = format!("{VIP}:{port}").parse().unwrap();
    let s = tb.client.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let (mut ok, total) = (0, 40);
    for k in 0..total {
        let clone = format!("clone{}x", k % 4);
        let req = format!("GET / HTTP/1.1\r\nHost: b\r\nCookie: JSESSIONID=0000affinity{k}:{clone}\r\n\r\n");
        w.write_all(req.as_bytes()).unwrap();
        let resp = read_response(&mut r).expect("response");
        if resp.body.trim() == clone {
            ok += 1;
        }
    }
    ok as f64 / total as f64
}

pub fn wait_ready(tb: &Testbed, port: u16, log: &str) {
    wait_serving(tb, port, log, "b", "/");
}

/// Waits until `GET path` with `Host: host` to the VIP's `port` is answered 200; after
/// 20 s, panics with the process log `log`.
pub fn wait_serving(tb: &Testbed, port: u16, log: &str, host: &str, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let addr: SocketAddr = format!("{VIP}:{port}").parse().unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
    loop {
        let request = request.clone();
        let ok = tb.client.run(move || {
            let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else { return false };
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut w = s.try_clone().unwrap();
            let _ = w.write_all(request.as_bytes());
            read_response(&mut BufReader::new(s)).map(|r| r.status == 200).unwrap_or(false)
        });
        if ok {
            return;
        }
        assert!(Instant::now() < deadline, "port {port} not serving {host}{path}:\n{}", tb.log(log));
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The agent's memory with 10, 1,000 and 10,000 idle keep-alive client connections open
/// (each has had one request). Returns (idle RSS, [(connections, RSS)]).
fn idle_memory(tb: &Testbed, pid: u32) -> (u64, Vec<(usize, u64)>) {
    let before = rss_kib(pid);
    let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let mut held: Vec<TcpStream> = Vec::new();
    let mut points = Vec::new();
    for target in [10usize, 1_000, 10_000] {
        let from = held.len();
        let more: Vec<TcpStream> = tb.client.run(move || {
            (from..target)
                .map(|k| {
                    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).expect("connect");
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut w = s.try_clone().unwrap();
                    let req =
                        format!("GET / HTTP/1.1\r\nHost: b\r\nCookie: JSESSIONID=0000idle{k}:clone{}x\r\n\r\n", k % 4);
                    w.write_all(req.as_bytes()).unwrap();
                    read_response(&mut BufReader::new(s.try_clone().unwrap())).expect("response");
                    s
                })
                .collect()
        });
        held.extend(more);
        std::thread::sleep(Duration::from_millis(300));
        points.push((target, rss_kib(pid)));
    }
    drop(held);
    (before, points)
}

const SHARES: [f64; 4] = [25.0, 50.0, 75.0, 90.0];

/// Whose maximum a fixed offered load is a share of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Basis {
    Own,
    Haproxy,
}

struct Level {
    pct: f64,
    basis: Basis,
    system: &'static str,
    lat: load::Latencies,
}

fn open_loop_level(tb: &Testbed, s: &System, pct: f64, basis: Basis, max_rps: f64, secs: u64) -> Level {
    let rate = (max_rps * pct / 100.0).max(100.0);
    let addr: SocketAddr = format!("{VIP}:{}", s.port).parse().unwrap();
    let lat = tb.client.run(move || load::open_loop(addr, rate, Duration::from_secs(secs), CONNECTIONS));
    eprintln!(
        "    {pct:>3}% of {:<8} max ({rate:>6.0} req/s) {:<11} achieved {:>6.0}  p50 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  errors {}",
        if basis == Basis::Own { "its" } else { "HAProxy's" },
        s.name,
        lat.achieved_rps,
        lat.pct_ms(50.0),
        lat.pct_ms(99.0),
        lat.pct_ms(99.9),
        lat.errors
    );
    Level { pct, basis, system: s.name, lat }
}

/// Samples a process's RSS every 100 ms until stopped; the peak.
struct PeakRss {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl PeakRss {
    fn start(pid: u32) -> PeakRss {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = rss_kib(pid);
            while !s2.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(100));
                peak = peak.max(rss_kib(pid));
            }
            peak
        });
        PeakRss { stop, thread }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.join().unwrap_or(0)
    }
}

/// Soft limit up to the hard one; returns the hard limit (20,000 on this machine class,
/// which a process without CAP_SYS_RESOURCE cannot raise).
pub fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap_or((1024, 1024));
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    hard
}

/// HAProxy sizes its descriptors as 2 per connection plus a few and refuses to start
/// beyond the limit: the largest maxconn the limit allows.
pub fn haproxy_maxconn(nofile: u64) -> u64 {
    (nofile.saturating_sub(100) / 2).min(30_000)
}

pub fn run(quick: bool) -> (String, String) {
    let nofile = raise_nofile();
    let maxconn = haproxy_maxconn(nofile);
    let secs = if quick { 4 } else { 15 };
    eprintln!("==> HTTP benchmark: {WORKERS} worker(s) each, wrk {CONNECTIONS} connections, {secs}s per system");
    let mut tb = bench_bed();
    // The idle-memory curve closes 10,000 client connections; without reuse of their
    // TIME_WAIT ports, wrk's next 10,000 connects crawl (the kernel scans past them).
    tb.client.sysctl("net.ipv4.tcp_tw_reuse=1");
    // 10,000 client connections are measured: above the default cap the agent derives from
    // this machine's 20,000 descriptors (which reserves one upstream connection per client);
    // here upstream connections are bounded by max_connections_per_backend instead.
    let cfg = agent_config(&tb, "max_client_connections = 10100\n");
    let path = tb.write_config(&cfg);
    tb.start_dispatcher(&path);
    let agent_pid = tb.pid_of("dispatcher").expect("agent pid");
    start_haproxy(&mut tb, maxconn, "", &format!("{VIP}:81"));
    start_nginx_proxy(&mut tb, &format!("{VIP}:82;"), NGINX_KEEPALIVE);
    let script = cookies_script(&tb);

    let mut results = Vec::new();
    for s in &SYSTEMS {
        wait_ready(&tb, s.port, s.log);
        let aff = affinity(&tb, s.port);
        let pid = cpu_pid(&tb, s);
        let before = crate::p99::counters(pid).ticks;
        let Wrk { rps, p50_ms: p50, p99_ms: p99, errors, requests } = wrk(&tb, s.port, secs, &script, CONNECTIONS);
        let cpu_us = (crate::p99::counters(pid).ticks - before) as f64 * 10_000.0 / requests.max(1) as f64;
        eprintln!(
            "    {:<11} {rps:>10.0} req/s  p50 {p50:.3} ms  p99 {p99:.3} ms  errors {errors}  affinity {:.0}%  CPU {cpu_us:.1} µs/request",
            s.name,
            aff * 100.0
        );
        results.push(Measured { rps, p50_ms: p50, p99_ms: p99, errors, affinity: aff, cpu_us });
    }
    // Fixed offered loads: 25/50/75/90% of each system's own maximum; and the
    // dispatcher also at HAProxy's levels, for p99 at the same offered load.
    let level_secs = if quick { 3 } else { 10 };
    let mut fixed: Vec<Level> = Vec::new();
    for pct in SHARES {
        for (i, s) in SYSTEMS.iter().enumerate() {
            fixed.push(open_loop_level(&tb, s, pct, Basis::Own, results[i].rps, level_secs));
        }
        fixed.push(open_loop_level(&tb, &SYSTEMS[0], pct, Basis::Haproxy, results[1].rps, level_secs));
    }
    let (rss_before, points) = idle_memory(&tb, agent_pid);
    let rss_after = points.iter().find(|(n, _)| *n == 1_000).map(|p| p.1).unwrap_or(0);
    let curve: Vec<String> = points.iter().map(|(n, r)| format!("{r} KiB with {n}")).collect();
    eprintln!("    dispatcher RSS: {rss_before} KiB idle; {}", curve.join(", "));
    // After the idle-memory curve (memory the allocator keeps from 10,000 busy
    // connections would inflate it), with a restarted agent, so that its peak RSS is
    // this load's. The 10,000 closed connections settle first.
    tb.stop("dispatcher");
    tb.start_dispatcher(&path);
    wait_ready(&tb, SYSTEMS[0].port, SYSTEMS[0].log);
    let agent_pid = tb.pid_of("dispatcher").expect("agent pid");
    std::thread::sleep(Duration::from_secs(2));
    // Concurrency: requests/s, p99 and peak memory with 10, 1,000 and 10,000 clients.
    let conc_secs = if quick { 3 } else { 8 };
    let haproxy_pid = tb.pid_of("haproxy").expect("haproxy pid");
    let mut concurrency = Vec::new();
    for n in [10usize, 1_000, 10_000] {
        for (s, pid) in [(&SYSTEMS[0], agent_pid), (&SYSTEMS[1], haproxy_pid)] {
            let peak = PeakRss::start(pid);
            let Wrk { rps, p99_ms: p99, errors, .. } = wrk(&tb, s.port, conc_secs, &script, n);
            let rss = peak.stop();
            eprintln!(
                "    {n:>6} connections {:<11} {rps:>8.0} req/s  p99 {p99:.3} ms  errors {errors}  peak RSS {rss} KiB",
                s.name
            );
            concurrency.push((n, s.name, rps, p99, errors, rss));
        }
    }

    let (base, nginx) = (&results[1], &results[2]);
    let systems: Vec<Row> = SYSTEMS
        .iter()
        .zip(&results)
        .map(|(s, m)| {
            Row::new()
                .text("system", "system", s.name)
                .num("requests/s", "rps", m.rps, 0, 1)
                .num("p50 ms", "p50_ms", m.p50_ms, 3, 3)
                .num("p99 ms", "p99_ms", m.p99_ms, 3, 3)
                .int("errors", "errors", m.errors)
                .md("routed to the cookie's clone", format!("{:.0}%", m.affinity * 100.0))
                .json("affinity", format!("{:.3}", m.affinity))
                .num("CPU µs per request", "cpu_us_per_request", m.cpu_us, 1, 2)
                .md("req/s vs HAProxy", format!("{:.2}", m.rps / base.rps))
                .md("req/s vs nginx", format!("{:.2}", m.rps / nginx.rps))
                .md("CPU vs HAProxy", format!("{:.2}", m.cpu_us / base.cpu_us))
                .md("p99 vs HAProxy", format!("{:.2}", m.p99_ms / base.p99_ms))
        })
        .collect();
    let fixed_row = |l: &Level| {
        let m = &l.lat;
        Row::new()
            .md("share", format!("{:.0}%", l.pct))
            .json("share", l.pct)
            .json("basis", if l.basis == Basis::Own { r#""own_max""# } else { r#""haproxy_max""# })
            .text("system", "system", l.system)
            .num("offered req/s", "offered_rps", m.offered_rps, 0, 1)
            .num("achieved req/s", "achieved_rps", m.achieved_rps, 0, 1)
            .num("p50 ms", "p50_ms", m.pct_ms(50.0), 3, 3)
            .num("p99 ms", "p99_ms", m.pct_ms(99.0), 3, 3)
            .num("p99.9 ms", "p999_ms", m.pct_ms(99.9), 3, 3)
            .int("errors", "errors", m.errors)
    };
    let own: Vec<Row> = fixed.iter().filter(|l| l.basis == Basis::Own).map(fixed_row).collect();
    let mut table = report::markdown(&systems);
    table += "\nAt fixed offered loads (open loop, latency from each request's scheduled time), 25/50/75/90% of each system's own maximum:\n\n";
    table += &report::markdown(&own);
    table += "\nThe same offered load for the dispatcher and HAProxy (HAProxy's levels above):\n\n| offered req/s | dispatcher p99 ms | HAProxy p99 ms | p99 vs HAProxy | dispatcher p99.9 ms | HAProxy p99.9 ms |\n|---:|---:|---:|---:|---:|---:|\n";
    for pct in SHARES {
        let find =
            |system: &str, basis: Basis| fixed.iter().find(|l| l.pct == pct && l.system == system && l.basis == basis);
        if let (Some(d), Some(h)) = (find("dispatcher", Basis::Haproxy), find("haproxy", Basis::Own)) {
            table += &format!(
                "| {:.0} ({pct:.0}% of HAProxy's max) | {:.3} | {:.3} | {:.2} | {:.3} | {:.3} |\n",
                h.lat.offered_rps,
                d.lat.pct_ms(99.0),
                h.lat.pct_ms(99.0),
                d.lat.pct_ms(99.0) / h.lat.pct_ms(99.0),
                d.lat.pct_ms(99.9),
                h.lat.pct_ms(99.9)
            );
        }
    }
    table += &format!("\nConcurrent client connections (wrk, 1 thread; peak RSS sampled every 100 ms during the run; descriptor limit {nofile}, so HAProxy runs with maxconn {maxconn}):");
    table += "\n\n";
    let mut conc_rows = Vec::new();
    for pair in concurrency.chunks(2) {
        let base = pair[1].2;
        for &(n, name, rps, p99, errors, rss) in pair {
            conc_rows.push(
                Row::new()
                    .int("connections", "connections", n)
                    .text("system", "system", name)
                    .num("requests/s", "rps", rps, 0, 1)
                    .num("p99 ms", "p99_ms", p99, 3, 3)
                    .int("errors", "errors", errors)
                    .int("peak RSS KiB", "peak_rss_kib", rss)
                    .md("req/s vs HAProxy", format!("{:.2}", rps / base)),
            );
        }
    }
    table += &report::markdown(&conc_rows);
    table += &format!(
        "\nworkers: {WORKERS} each; wrk: 1 thread, {CONNECTIONS} connections, {secs} s, cookies naming the 4 clones in turn; CPU per request: user + system time of the process (all its threads; nginx: its worker) over the wrk run, divided by the requests wrk completed.\nDispatcher RSS: {rss_before} KiB idle, {rss_after} KiB with 1,000 idle keep-alive client connections (target < 65,536 KiB); {}.\n",
        curve.join(", ")
    );
    println!("\n{table}");
    let json = format!(
        r#"{{"workers":{WORKERS},"connections":{CONNECTIONS},"seconds":{secs},"systems":{},"fixed_rate":{},"concurrency":{},"rss_idle_kib":{rss_before},"rss_1000_idle_conns_kib":{rss_after}}}"#,
        report::json(&systems),
        report::json(&fixed.iter().map(fixed_row).collect::<Vec<_>>()),
        report::json(&conc_rows)
    );
    (json, table)
}
