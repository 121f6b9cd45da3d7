//! TLS: the dispatcher (rustls), HAProxy and nginx (both OpenSSL) terminating HTTPS in
//! the dispatcher namespace, with the same ECDSA P-256 certificate, the same TLS 1.3
//! suite, the same worker count, in front of the same four nginx backends (plain HTTP),
//! affinity by JSESSIONID as in the HTTP benchmark. From the client namespace:
//!
//! - keep-alive requests/s and p99: wrk over 50 TLS connections;
//! - full and resumed handshakes/s by `openssl s_time -new` / `-reuse` (4 processes, a
//!   request each connection), checked against the dispatcher's own count of full and
//!   resumed handshakes;
//! - new connections/s under wrk sending `Connection: close` (wrk keeps each connection's
//!   TLS session, so these are mostly resumed handshakes, as the counts show);
//! - memory per idle TLS connection: the server's RSS before and after 2,000 TLS
//!   connections that each made one request and stay open (Python's ssl as the client).

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    http::{self, System, WORKERS},
    peers,
    report::{self, Row},
    wrk::{self, Wrk},
};
use dispatcher_testbed::{netns::Testbed, tls::Pki};

pub const VIP: &str = "10.99.100.21";
const CONNECTIONS: usize = 50;
/// The one TLS 1.3 suite every system and client uses.
pub const SUITE: &str = "TLS_AES_128_GCM_SHA256";
const IDLE: usize = 2_000;

pub const SYSTEMS: [System; 3] = [
    System { name: "dispatcher", port: 443, log: "dispatcher" },
    System { name: "haproxy", port: 444, log: "haproxy" },
    System { name: "nginx", port: 445, log: "nginx-proxy" },
];

/// The idle clients' start (`hold_idle`): the arguments (host, port, `n`), descriptors
/// for `n` connections, a TLS 1.3 context `ctx` that verifies nothing, the list `held`.
const IDLE_HEAD: &str = r#"
import resource, socket, ssl, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 100, n + 100))
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
ctx.minimum_version = ssl.TLSVersion.TLSv1_3
held = []
"#;

/// And their end: says the connections are open, holds them until standard input closes.
const IDLE_TAIL: &str = r#"
print("ready", flush=True)
sys.stdin.read()
"#;

/// Opens `n` TLS connections into `held`, each after one request.
const IDLE_CLIENT: &str = r#"
for i in range(n):
    s = ctx.wrap_socket(socket.create_connection((host, port), timeout=10))
    s.sendall(b"GET / HTTP/1.1\r\nHost: b\r\nCookie: JSESSIONID=0000idle%d:clone%dx\r\n\r\n" % (i, i % 4))
    data = b""
    while not data.endswith(b"x\n"):
        chunk = s.recv(4096)
        if not chunk:
            raise SystemExit("closed after %d connections" % i)
        data += chunk
    held.append(s)
"#;

/// A client program in the client namespace, offering only `SUITE` (through an OpenSSL
/// configuration file that wrk, s_time, h2load and Python's ssl all read).
pub fn client(tb: &Testbed, program: &str) -> Command {
    let mut cmd = tb.client.command(program);
    cmd.env("OPENSSL_CONF", tb.workdir.join("openssl-client.cnf"));
    cmd
}

fn wrk(tb: &Testbed, port: u16, secs: u64, script: &Path) -> Wrk {
    wrk::run(client(tb, "wrk"), &format!("https://{VIP}:{port}/"), CONNECTIONS, secs, Some(script))
}

/// Waits until the port completes a TLS handshake and answers a request.
pub fn wait_ready(tb: &Testbed, port: u16, log: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let url = format!("https://{VIP}:{port}/");
    loop {
        let out = tb.client.command("curl").args(["-sk", "--max-time", "2", &url]).output().unwrap();
        if out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("clone") {
            return;
        }
        assert!(Instant::now() < deadline, "port {port} not serving TLS:\n{}", tb.log(log));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The suite and group a connection to `port` negotiates, as `openssl s_client` reports.
fn negotiated(tb: &Testbed, port: u16) -> String {
    let out = client(tb, "openssl")
        .args(["s_client", "-connect", &format!("{VIP}:{port}"), "-brief"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string())).unwrap_or_else(|| "?".into())
    };
    format!("{} {} {}", field("Protocol version:"), field("Ciphersuite:"), field("Server Temp Key:"))
}

/// `openssl s_time` from 4 processes at once for `secs`: connections per second.
fn s_time(tb: &Testbed, port: u16, secs: u64, mode: &str) -> f64 {
    let addr = format!("{VIP}:{port}");
    let children: Vec<Child> = (0..4)
        .map(|_| {
            client(tb, "openssl")
                .args(["s_time", "-connect", &addr, mode, "-time", &secs.to_string(), "-www", "/"])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("openssl s_time")
        })
        .collect();
    let mut total = 0.0;
    for c in children {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        // "N connections in T real seconds, ..."
        for line in text.lines().filter(|l| l.contains("real seconds")) {
            let mut words = line.split_whitespace();
            let n: f64 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0.0);
            let t: f64 = line
                .split("connections in ")
                .nth(1)
                .and_then(|r| r.split_whitespace().next())
                .and_then(|w| w.parse().ok())
                .unwrap_or(f64::NAN);
            total += n / t;
        }
    }
    total
}

/// The RSS of `pid` (KiB) before and with `IDLE` idle TLS connections to `port`.
fn idle_memory(tb: &Testbed, port: u16, pid: u32) -> (u64, u64) {
    let idle = hold_idle(tb, "python3", IDLE_CLIENT, port, IDLE, pid).unwrap_or_else(|e| panic!("{e}"));
    (idle.before, idle.with)
}

/// What a server's memory was with idle client connections held open.
pub struct Idle {
    /// Its RSS (KiB) before the connections, and with them.
    pub before: u64,
    pub with: u64,
    /// The connections to its port established in the client's namespace as `with` was
    /// read.
    pub established: usize,
}

/// Runs `opens`, Python that opens `n` connections to `host`:`port` with `ctx` into `held`
/// (between `IDLE_HEAD` and `IDLE_TAIL`; as `python`, in the client's namespace, with the
/// VIP, `port` and `n` as arguments); reads the RSS of `pid` before and while the
/// connections are held.
pub fn hold_idle(tb: &Testbed, python: &str, opens: &str, port: u16, n: usize, pid: u32) -> Result<Idle, String> {
    let before = http::rss_kib(pid);
    let program = format!("{IDLE_HEAD}{opens}{IDLE_TAIL}");
    let mut child = client(tb, python)
        .args(["-c", &program, VIP, &port.to_string(), &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("{python}: {e}"))?;
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let _ = std::io::BufRead::read_line(&mut out, &mut line);
    let held = if line.trim() == "ready" {
        std::thread::sleep(Duration::from_millis(500));
        let with = http::rss_kib(pid);
        Ok(Idle { before, with, established: established(tb, port) })
    } else {
        Err(format!("the idle client did not open its {n} connections to port {port} ({line:?})"))
    };
    drop(child.stdin.take());
    let _ = child.wait();
    held
}

/// The TCP connections to the VIP's `port` established in the client's namespace.
fn established(tb: &Testbed, port: u16) -> usize {
    let out = tb
        .client
        .command("ss")
        .args(["-Htn", "state", "established", "dst", &format!("{VIP}:{port}")])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.lines().filter(|l| !l.trim().is_empty()).count()
}

/// The dispatcher's count of (full, resumed) handshakes.
fn handshakes(tb: &Testbed) -> (u64, u64) {
    let status = tb.admin("GET", "/status").map(|(_, b)| b).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
    let t = &v["vips"][0]["tls"];
    (t["handshakes_full"].as_u64().unwrap_or(0), t["handshakes_resumed"].as_u64().unwrap_or(0))
}

/// The process of `s` that holds the connections and does the work: nginx's worker (the
/// master's child), the others' one process.
pub fn server_pid(tb: &Testbed, s: &System) -> u32 {
    let pid = tb.pid_of(s.log).unwrap_or_else(|| panic!("{} is not running", s.name));
    match s.name {
        "nginx" => nginx_worker(pid),
        _ => pid,
    }
}

/// nginx's worker (the master's child).
pub fn nginx_worker(master: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{master}/task/{master}/children")).unwrap_or_default();
    children.split_whitespace().next().and_then(|p| p.parse().ok()).expect("an nginx worker")
}

struct Measured {
    /// The median keep-alive run (by requests/s) and the range of requests/s over runs.
    keepalive: Wrk,
    spread: (f64, f64),
    full_wrk: Wrk,
    full_stime: f64,
    resumed_stime: f64,
    kib_per_conn: f64,
    negotiated: String,
}

/// The HTTPS benches' testbed (TLS and HTTP/2): the four nginx backends and the three
/// systems terminating HTTPS on the VIP (`SYSTEMS`' ports) with the same certificate and
/// suite; `h2`: HAProxy and nginx offer HTTP/2 by ALPN besides HTTP/1.1 (the dispatcher
/// offers what its HTTPS VIP offers by default). Writes the clients' OpenSSL
/// configuration (`client`).
pub fn https_bed(h2: bool) -> Testbed {
    let maxconn = http::haproxy_maxconn(http::raise_nofile());
    let mut tb = Testbed::new(4, &[VIP]);
    tb.add_local_vip(VIP);
    tb.client.sysctl("net.ipv4.tcp_tw_reuse=1");
    let dir = tb.workdir.clone();
    http::start_backends(&mut tb);
    let pki = Pki::new(&dir);
    let (cert, key) = pki.leaf("ca", "server", "bench.example", &["bench.example"], 30);
    let combined = dir.join("server-combined.pem");
    std::fs::write(&combined, std::fs::read_to_string(&cert).unwrap() + &std::fs::read_to_string(&key).unwrap())
        .unwrap();
    let clone_ids: Vec<String> = (0..4).map(|i| format!("clone{i}x")).collect();
    // Per-source limits off: one client namespace plays every client.
    let cfg = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nworkers = {WORKERS}\nmax_client_connections = 10100\nmax_tls_handshakes = 4096\nmax_connections_per_source = 0\nmax_connection_rate_per_source = 0\n\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 443\nmode = \"http\"\nbackend_port = 8080\nring_size = 1009\n[vip.tls]\n[[vip.tls.certificate]]\ncert = \"{}\"\nkey = \"{}\"\n",
        tb.instance(),
        tb.backend_config_with_clones(&[], &clone_ids),
        cert.display(),
        key.display()
    );
    let path = tb.write_config(&cfg);
    tb.start_dispatcher(&path);
    let global = format!(" ssl-default-bind-ciphersuites {SUITE}\n ssl-default-bind-options ssl-min-ver TLSv1.2\n");
    let bind = format!("{VIP}:444 ssl crt {} alpn {}", combined.display(), if h2 { "h2,http/1.1" } else { "http/1.1" });
    http::start_haproxy(&mut tb, maxconn, &global, &bind);
    let listen = format!(
        "{VIP}:445 ssl{};\n  ssl_certificate {};\n  ssl_certificate_key {};\n  ssl_protocols TLSv1.2 TLSv1.3;\n  ssl_conf_command Ciphersuites {SUITE};\n  ssl_session_cache shared:SSL:10m;\n  ssl_session_tickets on;",
        if h2 { " http2" } else { "" },
        cert.display(),
        key.display()
    );
    // With h2, 100 streams on each of 10 connections put 1,000 requests in flight: nginx
    // keeps as many upstream connections as the dispatcher's pool may (pool_max_idle),
    // rather than opening and closing all but 64 for each request (which stalled it on
    // its TIME_WAIT ports and measured that instead of its HTTP/2).
    let keepalive = if h2 { 1024 } else { http::NGINX_KEEPALIVE };
    http::start_nginx_proxy(&mut tb, &listen, keepalive);
    // The clients offer the one suite too (wrk, s_time, h2load and Python's ssl read
    // OpenSSL's configuration).
    peers::write(&dir, "openssl-client.cnf", peers::OPENSSL_CLIENT, &[("SUITE", &SUITE)]);
    tb
}

pub fn run(quick: bool) -> (String, String) {
    let secs = if quick { 4 } else { 10 };
    eprintln!("==> TLS benchmark: {WORKERS} worker(s) each, ECDSA P-256, {SUITE}, {secs}s per measurement");
    let tb = https_bed(false);
    let dir = tb.workdir.clone();
    let keepalive_script = http::cookies_script(&tb);
    let close_script = dir.join("close.lua");
    std::fs::write(&close_script, peers::CLOSE_LUA).unwrap();

    for s in &SYSTEMS {
        wait_ready(&tb, s.port, s.log);
        // Warm-up, not recorded: the first seconds of load on a fresh process (page faults,
        // allocator growth) ran 10-15% slower than the rest.
        wrk(&tb, s.port, 2, &keepalive_script);
    }
    // Keep-alive throughput: rounds, each system once per round in a rotating order, the
    // median per system (single runs on two shared cores vary by 10% and more).
    let rounds = if quick { 2 } else { 3 };
    let mut keepalive_runs: Vec<Vec<Wrk>> = vec![Vec::new(); SYSTEMS.len()];
    for round in 0..rounds {
        for k in 0..SYSTEMS.len() {
            let i = (k + round) % SYSTEMS.len();
            let r = wrk(&tb, SYSTEMS[i].port, secs, &keepalive_script);
            eprintln!(
                "    round {} {:<11} keep-alive {:>7.0} req/s p99 {:.3} ms",
                round + 1,
                SYSTEMS[i].name,
                r.rps,
                r.p99_ms
            );
            keepalive_runs[i].push(r);
        }
    }
    let mut rows = Vec::new();
    let mut phases = Vec::new();
    for (i, s) in SYSTEMS.iter().enumerate() {
        let negotiated = negotiated(&tb, s.port);
        let keepalive = wrk::median(&keepalive_runs[i]);
        let spread = wrk::spread(&keepalive_runs[i]);
        let before = handshakes(&tb);
        let full_wrk = wrk(&tb, s.port, secs, &close_script);
        let after_wrk = handshakes(&tb);
        let full_stime = s_time(&tb, s.port, secs, "-new");
        let after_new = handshakes(&tb);
        let resumed_stime = s_time(&tb, s.port, secs, "-reuse");
        let after_reuse = handshakes(&tb);
        if s.name == "dispatcher" {
            // What kind of handshakes each client made, as the dispatcher counted them.
            for (what, a, b) in [
                ("wrk close", before, after_wrk),
                ("s_time -new", after_wrk, after_new),
                ("s_time -reuse", after_new, after_reuse),
            ] {
                phases.push(format!("{what}: {} full, {} resumed", b.0 - a.0, b.1 - a.1));
            }
        }
        let pid = server_pid(&tb, s);
        std::thread::sleep(Duration::from_secs(2));
        let (before, with) = idle_memory(&tb, s.port, pid);
        let kib_per_conn = with.saturating_sub(before) as f64 / IDLE as f64;
        eprintln!(
            "    {:<11} [{negotiated}] keep-alive {:>7.0} req/s p99 {:.3} ms errors {} | new connections {:>6.0}/s (wrk) | s_time full {:>6.0}/s resumed {:>6.0}/s | {:.1} KiB per idle TLS connection ({before} -> {with} KiB)",
            s.name, keepalive.rps, keepalive.p99_ms, keepalive.errors, full_wrk.rps, full_stime, resumed_stime, kib_per_conn
        );
        rows.push(Measured { keepalive, spread, full_wrk, full_stime, resumed_stime, kib_per_conn, negotiated });
    }
    let (full, resumed) = handshakes(&tb);
    eprintln!("    the dispatcher counted: {}", phases.join("; "));

    let base = &rows[1];
    let ratio = |v: f64, base: f64| format!("{:.2}", v / base);
    let table_rows: Vec<Row> = SYSTEMS
        .iter()
        .zip(&rows)
        .map(|(s, r)| {
            Row::new()
                .text("system", "system", s.name)
                .text("negotiated", "negotiated", &r.negotiated)
                .num("keep-alive req/s (median)", "keepalive_rps", r.keepalive.rps, 0, 1)
                .json("keepalive_rps_min", format!("{:.1}", r.spread.0))
                .json("keepalive_rps_max", format!("{:.1}", r.spread.1))
                .md("range", format!("{:.0}-{:.0}", r.spread.0, r.spread.1))
                .num("p99 ms", "keepalive_p99_ms", r.keepalive.p99_ms, 3, 3)
                .int("errors", "errors", r.keepalive.errors + r.full_wrk.errors)
                .md("vs HAProxy", ratio(r.keepalive.rps, base.keepalive.rps))
                .num("full handshakes/s (s_time -new)", "stime_full_per_s", r.full_stime, 0, 1)
                .md("vs HAProxy", ratio(r.full_stime, base.full_stime))
                .num("resumed/s (s_time -reuse)", "stime_resumed_per_s", r.resumed_stime, 0, 1)
                .md("vs HAProxy", ratio(r.resumed_stime, base.resumed_stime))
                .num("new conns/s (wrk, close)", "new_conns_per_s", r.full_wrk.rps, 0, 1)
                .json("new_conns_p99_ms", format!("{:.3}", r.full_wrk.p99_ms))
                .md("vs HAProxy", ratio(r.full_wrk.rps, base.full_wrk.rps))
                .num("KiB per idle TLS conn", "kib_per_idle_conn", r.kib_per_conn, 1, 2)
                .md("vs HAProxy", ratio(r.kib_per_conn, base.kib_per_conn))
        })
        .collect();
    let mut table = report::markdown(&table_rows);
    table += &format!(
        "\nworkers: {WORKERS} each; ECDSA P-256 certificate, {SUITE} offered by the clients and configured in HAProxy and nginx; wrk: 1 thread, {CONNECTIONS} connections, {secs} s, keep-alive: after a 2 s warm-up each, the median of {rounds} rounds (each system once per round, in a rotating order) with the range over the rounds (new connections: `Connection: close` on every request; wrk keeps each connection's TLS session, so these resume); s_time: 4 processes, a GET per connection; idle memory: {IDLE} TLS 1.3 connections after one request each. Handshakes as the dispatcher counted them: {}.\n",
        phases.join("; ")
    );
    println!("\n{table}");
    let json = format!(
        r#"{{"workers":{WORKERS},"connections":{CONNECTIONS},"seconds":{secs},"suite":"{SUITE}","idle_connections":{IDLE},"dispatcher_full_handshakes":{full},"dispatcher_resumed_handshakes":{resumed},"systems":{}}}"#,
        report::json(&table_rows)
    );
    (json, table)
}
