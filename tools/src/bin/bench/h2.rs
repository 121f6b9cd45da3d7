//! HTTP/2: the dispatcher, HAProxy and nginx terminating HTTPS with h2 negotiated by ALPN,
//! on the TLS bench's testbed (`tls::https_bed`: the same certificate and TLS 1.3 suite,
//! the same worker count, the same four nginx backends spoken to in HTTP/1.1). From the
//! client namespace:
//!
//! - requests/s and p99 by h2load, with 1 and with 100 concurrent streams per
//!   connection, each request carrying the TLS bench's affinity cookie; p99 from
//!   h2load's per-request log;
//! - CPU per request: user + system of the server's process (nginx's worker) over the
//!   runs, from its own accounting, over the requests that succeeded;
//! - memory per idle h2 connection: the server's RSS before and with `IDLE` h2
//!   connections that each made one request and stay open (Python's h2 as the client),
//!   measured on the freshly started servers.
//!
//! A system that does not negotiate h2 or a run with a failed request gives no figure:
//! its cells are empty and the bench fails (`report::fail`).

use std::{
    fmt::Write as _,
    process::Stdio,
    time::{Duration, Instant},
};

use dispatcher_testbed::netns::Testbed;

use crate::{
    http::{System, WORKERS},
    p99::counters,
    report::{self, Row},
    tls::{self, SUITE, SYSTEMS, VIP},
};

/// The affinity cookie of every request (the TLS bench's first session: clone0x).
const COOKIE: &str = "JSESSIONID=0000benchsession0:clone0x";
const IDLE: usize = 2_000;
/// The Debian interpreter, which python3-h2 is installed for (not whatever `python3` a
/// PATH finds first).
const PYTHON: &str = "/usr/bin/python3";
/// A single h2load run's limit: it ends a stalled run (h2load's own inactivity timeout
/// ends a stalled connection first).
const RUN_LIMIT: Duration = Duration::from_secs(180);

/// A load: concurrent streams per connection and connections.
#[derive(Clone, Copy)]
struct Load {
    streams: usize,
    connections: usize,
}

/// 1 stream per connection over as many connections as the TLS bench's wrk; 100 streams
/// (HAProxy's default maximum of concurrent streams; nginx's is 128) over 10 connections.
const LOADS: [Load; 2] = [Load { streams: 1, connections: 50 }, Load { streams: 100, connections: 10 }];

/// Opens `n` h2 connections into `held` (`tls::hold_idle`), each after one request (GET /
/// with the cookie of a session on clone i % 4) answered 200. Exits with a message when h2
/// is not negotiated or a request fails.
const IDLE_CLIENT: &str = r#"
import time
import h2.config, h2.connection, h2.events
ctx.set_alpn_protocols(["h2"])
config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
deadline = time.monotonic() + 300
for i in range(n):
    s = ctx.wrap_socket(socket.create_connection((host, port), timeout=10))
    if s.selected_alpn_protocol() != "h2":
        raise SystemExit("port %d: no h2 by ALPN (negotiated %r)" % (port, s.selected_alpn_protocol()))
    c = h2.connection.H2Connection(config=config)
    c.initiate_connection()
    headers = [(":method", "GET"), (":scheme", "https"), (":authority", "%s:%d" % (host, port)), (":path", "/"),
               ("cookie", "JSESSIONID=0000idle%d:clone%dx" % (i, i % 4))]
    c.send_headers(1, headers, end_stream=True)
    s.sendall(c.data_to_send())
    status, ended = None, False
    while not ended:
        if time.monotonic() > deadline:
            raise SystemExit("port %d: %d connections after 300 s" % (port, i))
        data = s.recv(65536)
        if not data:
            raise SystemExit("port %d: connection %d closed before its response" % (port, i))
        for e in c.receive_data(data):
            if isinstance(e, h2.events.ResponseReceived):
                status = dict(e.headers).get(":status")
            elif isinstance(e, h2.events.DataReceived):
                c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
            elif isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)) and e.stream_id == 1:
                ended = True
            elif isinstance(e, h2.events.ConnectionTerminated):
                raise SystemExit("port %d: connection %d: GOAWAY %s" % (port, i, e.error_code))
        s.sendall(c.data_to_send())
    if status != "200":
        raise SystemExit("port %d: connection %d: status %s" % (port, i, status))
    held.append((s, c))
"#;

/// What one h2load run measured.
#[derive(Clone, Debug, PartialEq)]
struct Run {
    rps: f64,
    p99_ms: f64,
    /// Requests that succeeded (all of them, or the run is an error).
    requests: u64,
    /// TLS version, suite, key exchange and application protocol, as h2load reports them.
    negotiated: String,
}

/// h2load's summary: the figures of a run, or why it gives none (h2 not negotiated,
/// requests that failed or were not 2xx).
fn parse(out: &str, n: u64) -> Result<(f64, u64, String), String> {
    let field = |name: &str| out.lines().find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()));
    let protocol = field("Application protocol:");
    if protocol.as_deref() != Some("h2") {
        return Err(match (protocol, field("TLS Protocol:")) {
            (Some(p), _) => format!("h2 not negotiated: offered h2 alone by ALPN, the server chose {p}"),
            (None, Some(_)) => "h2 not negotiated: offered h2 alone by ALPN, the server chose no protocol".into(),
            // A TLS server without h2 refuses a client that offers only h2 (RFC 7301's
            // no_application_protocol alert): no session, every request failed.
            (None, None) => format!(
                "h2 not negotiated: offered h2 alone by ALPN, no TLS session came up (h2load: requests: {})",
                field("requests:").unwrap_or_default()
            ),
        });
    }
    // "requests: 100 total, 100 started, 100 done, 100 succeeded, 0 failed, 0 errored, 0 timeout"
    let counts = |name: &str| -> Vec<(String, u64)> {
        field(name)
            .unwrap_or_default()
            .split(',')
            .filter_map(|p| {
                let (v, what) = p.trim().split_once(' ')?;
                Some((what.trim().to_string(), v.parse().ok()?))
            })
            .collect()
    };
    let requests = counts("requests:");
    let statuses = counts("status codes:");
    let get = |v: &[(String, u64)], what: &str| v.iter().find(|(w, _)| w == what).map(|x| x.1);
    let succeeded = get(&requests, "succeeded").unwrap_or(0);
    let ok_2xx = get(&statuses, "2xx").unwrap_or(0);
    let bad: u64 = ["failed", "errored", "timeout"].iter().filter_map(|w| get(&requests, w)).sum();
    if succeeded != n || ok_2xx != n || bad > 0 {
        return Err(format!(
            "{succeeded} of {n} requests succeeded, {ok_2xx} answered 2xx (h2load: requests: {}; status codes: {})",
            field("requests:").unwrap_or_default(),
            field("status codes:").unwrap_or_default()
        ));
    }
    // "finished in 5.01s, 19960.12 req/s, 1.23MB/s"
    let rps = field("finished in")
        .and_then(|f| f.split(',').nth(1).and_then(|r| r.trim().strip_suffix(" req/s")?.parse().ok()))
        .ok_or_else(|| "no requests/s in h2load's output".to_string())?;
    let negotiated = ["TLS Protocol:", "Cipher:", "Server Temp Key:", "Application protocol:"]
        .iter()
        .filter_map(|f| field(f))
        .collect::<Vec<_>>()
        .join(" ");
    Ok((rps, succeeded, negotiated))
}

/// The 99th percentile (ms) of the response times in h2load's `--log-file` (start time,
/// status, microseconds until the end of the response, tab-separated), which must hold
/// `n` requests answered 2xx.
fn log_p99(log: &str, n: u64) -> Result<f64, String> {
    let mut times = Vec::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split('\t').collect();
        let status: i64 = f.get(1).and_then(|s| s.parse().ok()).unwrap_or(-1);
        if !(200..300).contains(&status) {
            return Err(format!("a request answered {status} in h2load's log: {line:?}"));
        }
        times.push(f.get(2).and_then(|t| t.parse::<u64>().ok()).ok_or_else(|| format!("h2load's log: {line:?}"))?);
    }
    if times.len() as u64 != n {
        return Err(format!("h2load's log holds {} requests of {n}", times.len()));
    }
    times.sort_unstable();
    let k = (times.len() * 99).div_ceil(100).max(1) - 1;
    Ok(times[k] as f64 / 1000.0)
}

/// h2load from the client namespace against `port` (offering only h2): `n` requests over
/// `load`, each with the affinity cookie.
fn h2load(tb: &Testbed, port: u16, load: Load, n: u64) -> Result<Run, String> {
    let dir = &tb.workdir;
    let (out_path, log_path) = (dir.join("h2load.out"), dir.join("h2load.log"));
    let _ = std::fs::remove_file(&log_path);
    let out = std::fs::File::create(&out_path).map_err(|e| e.to_string())?;
    let mut child = tls::client(tb, "h2load")
        .args(["-t", "1", "-c", &load.connections.to_string(), "-m", &load.streams.to_string()])
        .args(["-n", &n.to_string(), "-N", "10s", "--npn-list", "h2", "-H", &format!("cookie: {COOKIE}")])
        .arg("--log-file")
        .arg(&log_path)
        .arg(format!("https://{VIP}:{port}/"))
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("h2load: {e}"))?;
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("h2load did not finish {n} requests in {} s", RUN_LIMIT.as_secs()));
            }
        }
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let (rps, requests, negotiated) =
        parse(&text, n).map_err(|e| if status.success() { e } else { format!("{e} (h2load exited with {status})") })?;
    let p99_ms = log_p99(&std::fs::read_to_string(&log_path).unwrap_or_default(), n)?;
    Ok(Run { rps, p99_ms, requests, negotiated })
}

/// What `port` negotiates by ALPN when offered h2 and http/1.1 (`none` when nothing):
/// what a system that refused h2 alone speaks.
fn fallback_protocol(tb: &Testbed, port: u16) -> String {
    let out = tls::client(tb, "h2load")
        .args(["-n", "1", "-c", "1", "-N", "5s", "--npn-list", "h2,http/1.1", &format!("https://{VIP}:{port}/")])
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let protocol = out.lines().find_map(|l| l.strip_prefix("Application protocol:")).map(str::trim);
    protocol.unwrap_or("none").to_string()
}

/// A system under one load, over the rounds: the runs, the CPU ticks its process used
/// and the requests it answered while measured; or why it has no figures.
#[derive(Default)]
struct Measured {
    runs: Vec<Run>,
    ticks: u64,
    requests: u64,
    failed: Option<String>,
}

impl Measured {
    /// The run with the median requests/s.
    fn median(&self) -> Option<&Run> {
        let mut runs: Vec<&Run> = self.runs.iter().collect();
        runs.sort_by(|a, b| a.rps.total_cmp(&b.rps));
        self.failed.is_none().then(|| runs.get(runs.len() / 2).copied()).flatten()
    }

    /// Microseconds of CPU (user + system, all threads) per request.
    fn cpu_us(&self) -> Option<f64> {
        self.median().map(|_| self.ticks as f64 * 10_000.0 / self.requests.max(1) as f64)
    }

    fn fail(&mut self, what: String) {
        self.failed.get_or_insert(what);
    }
}

/// The requests of one run under `load`: a few seconds' worth on two shared vCPUs.
fn requests(load: Load, quick: bool) -> u64 {
    match (load.streams, quick) {
        (1, true) => 80_000,
        (1, false) => 200_000,
        (_, true) => 120_000,
        (_, false) => 300_000,
    }
}

/// `a / b` with two decimals; `-` when either is missing.
fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

/// Memory per idle h2 connection of one system: KiB per connection, RSS before and with.
struct Idle {
    kib: f64,
    before: u64,
    with: u64,
}

fn idle_memory(tb: &Testbed, s: &System) -> Result<Idle, String> {
    let idle = tls::hold_idle(tb, PYTHON, IDLE_CLIENT, s.port, IDLE, tls::server_pid(tb, s))?;
    // A connection the server closed meanwhile would count as memory it holds.
    if idle.established < IDLE {
        return Err(format!("{} of the {IDLE} idle h2 connections still open", idle.established));
    }
    Ok(Idle { kib: idle.with.saturating_sub(idle.before) as f64 / IDLE as f64, before: idle.before, with: idle.with })
}

pub fn run(quick: bool) -> (String, String) {
    let rounds = if quick { 1 } else { 3 };
    eprintln!(
        "==> HTTP/2 benchmark: {WORKERS} worker(s) each, h2 by ALPN over TLS 1.3 ({SUITE}), h2load, {rounds} round(s)"
    );
    let tb = tls::https_bed(true);
    let probe = Load { streams: 1, connections: 1 };
    // Whether each speaks h2 (and how it negotiated), then its memory per idle h2
    // connection, measured on the fresh process.
    let mut negotiated: Vec<Result<String, String>> = Vec::new();
    let mut idle: Vec<Result<Idle, String>> = Vec::new();
    for s in &SYSTEMS {
        tls::wait_ready(&tb, s.port, s.log);
        let r = h2load(&tb, s.port, probe, 10).map(|r| r.negotiated).map_err(|e| {
            let fallback = fallback_protocol(&tb, s.port);
            let e = format!("{e}; offered h2 and http/1.1, it chose {fallback}: no HTTP/2 on its HTTPS port");
            report::fail(format!("h2 {}: {e}", s.name));
            e
        });
        let m = match &r {
            Ok(_) => {
                std::thread::sleep(Duration::from_secs(1));
                idle_memory(&tb, s).inspect_err(|e| report::fail(format!("h2 {} idle memory: {e}", s.name)))
            }
            Err(_) => Err("h2 not negotiated".into()),
        };
        if let Ok(m) = &m {
            eprintln!(
                "    {:<11} [{}] {:.1} KiB per idle h2 connection ({} -> {} KiB)",
                s.name,
                r.as_deref().unwrap_or("?"),
                m.kib,
                m.before,
                m.with
            );
        }
        negotiated.push(r);
        idle.push(m);
    }
    // Warm-up, not recorded (a fresh process's first seconds of load run slower).
    for (s, n) in SYSTEMS.iter().zip(&negotiated) {
        if n.is_ok() {
            let _ = h2load(&tb, s.port, LOADS[1], requests(LOADS[1], true) / 2);
        }
    }
    // Rounds: each system once per load and round, in a rotating order; the median run
    // per system and load.
    let mut measured: Vec<Vec<Measured>> =
        LOADS.iter().map(|_| SYSTEMS.iter().map(|_| Measured::default()).collect()).collect();
    for round in 0..rounds {
        for (l, &load) in LOADS.iter().enumerate() {
            let n = requests(load, quick);
            for k in 0..SYSTEMS.len() {
                let i = (k + round) % SYSTEMS.len();
                let s = &SYSTEMS[i];
                let m = &mut measured[l][i];
                if negotiated[i].is_err() || m.failed.is_some() {
                    continue;
                }
                let pid = tls::server_pid(&tb, s);
                let before = counters(pid).ticks;
                match h2load(&tb, s.port, load, n) {
                    Ok(r) => {
                        let ticks = counters(pid).ticks - before;
                        eprintln!(
                            "    round {} {:>3} stream(s) x {:>2} {:<11} {:>8.0} req/s  p99 {:.3} ms  CPU {:.1} µs/request",
                            round + 1,
                            load.streams,
                            load.connections,
                            s.name,
                            r.rps,
                            r.p99_ms,
                            ticks as f64 * 10_000.0 / r.requests.max(1) as f64
                        );
                        m.ticks += ticks;
                        m.requests += r.requests;
                        m.runs.push(r);
                    }
                    Err(e) => {
                        report::fail(format!("h2 {} {} stream(s) per connection: {e}", s.name, load.streams));
                        m.fail(e);
                    }
                }
            }
        }
    }
    for (i, n) in negotiated.iter().enumerate() {
        if let Err(e) = n {
            for m in measured.iter_mut() {
                m[i].fail(e.clone());
            }
        }
    }

    let (haproxy, nginx) = (1, 2);
    let mut rows = Vec::new();
    for (l, load) in LOADS.iter().enumerate() {
        let at = |i: usize| &measured[l][i];
        let rps = |i: usize| at(i).median().map(|r| r.rps);
        let cpu = |i: usize| at(i).cpu_us();
        for (i, s) in SYSTEMS.iter().enumerate() {
            let m = at(i);
            let range = if m.failed.is_none() {
                let (lo, hi) =
                    m.runs.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), r| (lo.min(r.rps), hi.max(r.rps)));
                format!("{lo:.0}-{hi:.0}")
            } else {
                "-".into()
            };
            rows.push(
                Row::new()
                    .int("streams per conn", "streams", load.streams)
                    .int("conns", "connections", load.connections)
                    .text("system", "system", s.name)
                    .opt("requests/s (median)", "rps", rps(i), 0, 1)
                    .md("range", range)
                    .opt("p99 ms", "p99_ms", m.median().map(|r| r.p99_ms), 3, 3)
                    .opt("CPU µs per request", "cpu_us_per_request", cpu(i), 1, 2)
                    .md("req/s vs HAProxy", ratio(rps(i), rps(haproxy)))
                    .md("req/s vs nginx", ratio(rps(i), rps(nginx)))
                    .md("CPU vs HAProxy", ratio(cpu(i), cpu(haproxy)))
                    .md("CPU vs nginx", ratio(cpu(i), cpu(nginx)))
                    .int("requests", "requests", m.requests)
                    .json(
                        "failed",
                        m.failed.as_ref().map_or("null".into(), |f| serde_json::Value::from(f.as_str()).to_string()),
                    ),
            );
        }
    }
    let kib = |i: usize| idle[i].as_ref().ok().map(|m| m.kib);
    let idle_rows: Vec<Row> = SYSTEMS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let rss = idle[i].as_ref().map_or("-".into(), |m| format!("{} -> {}", m.before, m.with));
            Row::new()
                .text("system", "system", s.name)
                .text("negotiated", "negotiated", negotiated[i].as_ref().map_or("-", |n| n.as_str()))
                .opt("KiB per idle h2 conn", "kib_per_idle_conn", kib(i), 1, 2)
                .md("RSS KiB before -> with", rss)
                .md("vs HAProxy", ratio(kib(i), kib(haproxy)))
                .md("vs nginx", ratio(kib(i), kib(nginx)))
        })
        .collect();

    let mut table = report::markdown(&rows);
    table += "\n";
    table += &report::markdown(&idle_rows);
    let mut failures = Vec::new();
    for (i, s) in SYSTEMS.iter().enumerate() {
        if let Err(e) = &negotiated[i] {
            failures.push(format!("{}: {e}", s.name));
            continue;
        }
        for (l, load) in LOADS.iter().enumerate() {
            if let Some(f) = &measured[l][i].failed {
                failures.push(format!("{} with {} stream(s) per connection: {f}", s.name, load.streams));
            }
        }
        if let Err(e) = &idle[i] {
            failures.push(format!("{} idle memory: {e}", s.name));
        }
    }
    if !failures.is_empty() {
        let _ = write!(
            table,
            "\nNot measured (no figure rather than one from failing requests): {}.\n",
            failures.join("; ")
        );
    }
    let loads: Vec<String> = LOADS
        .iter()
        .map(|l| {
            format!(
                "{} stream(s) per connection over {} connections, {} requests a run",
                l.streams,
                l.connections,
                requests(*l, quick)
            )
        })
        .collect();
    let _ = write!(
        table,
        "\nworkers: {WORKERS} each; ECDSA P-256 certificate, TLS 1.3 {SUITE}; h2 offered alone by the clients, HAProxy and nginx offering h2 and http/1.1, the dispatcher its HTTPS VIP's default; HTTP/1.1 to the four nginx backends. h2load (1 thread): {}; every request with `cookie: {COOKIE}` (one session, so one backend); requests/s: the median of {rounds} round(s) (each system once per round, in a rotating order, after a warm-up), p99 from h2load's per-request log of the median run; CPU: user + system of the server's process (nginx's worker) over all the rounds' runs, per request. Idle memory: {IDLE} h2 connections (Python's h2) after one request each, on the freshly started servers. A run with a failed or non-2xx request gives no figure.\n",
        loads.join("; ")
    );
    println!("\n{table}");
    let json = format!(
        r#"{{"workers":{WORKERS},"rounds":{rounds},"suite":"{SUITE}","cookie":"{COOKIE}","idle_connections":{IDLE},"loads":{},"idle":{}}}"#,
        report::json(&rows),
        report::json(&idle_rows)
    );
    (json, table)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUT: &str = "starting benchmark...
spawning thread #0: 10 total client(s). 1000 total requests
TLS Protocol: TLSv1.3
Cipher: TLS_AES_128_GCM_SHA256
Server Temp Key: X25519 253 bits
Application protocol: h2
progress: 10% done

finished in 52.12ms, 19186.49 req/s, 745.40KB/s
requests: 1000 total, 1000 started, 1000 done, 1000 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 1000 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 37.94KB (38852) total, 8.80KB (9010) headers (space savings 78.09%), 7.81KB (8000) data
";

    #[test]
    fn reads_rate_and_negotiation() {
        let (rps, n, negotiated) = parse(OUT, 1000).unwrap();
        assert_eq!((rps, n), (19186.49, 1000));
        assert_eq!(negotiated, "TLSv1.3 TLS_AES_128_GCM_SHA256 X25519 253 bits h2");
    }

    #[test]
    fn refuses_failed_requests_and_other_protocols() {
        let failed = OUT.replace("1000 succeeded, 0 failed", "990 succeeded, 10 failed").replace("1000 2xx", "990 2xx");
        assert!(parse(&failed, 1000).unwrap_err().contains("990 of 1000 requests succeeded"));
        let errors = OUT.replace("1000 2xx, 0 3xx, 0 4xx, 0 5xx", "900 2xx, 0 3xx, 0 4xx, 100 5xx");
        assert!(parse(&errors, 1000).unwrap_err().contains("900 answered 2xx"));
        let h1 = OUT.replace("Application protocol: h2", "Application protocol: http/1.1");
        assert!(parse(&h1, 1000).unwrap_err().ends_with("offered h2 alone by ALPN, the server chose http/1.1"));
        let none = OUT.replace("Application protocol: h2", "No protocol negotiated.");
        assert!(parse(&none, 1000).unwrap_err().ends_with("the server chose no protocol"));
        // What h2load prints when the server refused the handshake (no h2 among its protocols).
        let refused = "starting benchmark...\nspawning thread #0: 1 total client(s). 10 total requests\n\nfinished in 1.74ms, 0.00 req/s, 0B/s\nrequests: 10 total, 0 started, 0 done, 0 succeeded, 10 failed, 10 errored, 0 timeout\nstatus codes: 0 2xx, 0 3xx, 0 4xx, 0 5xx\n";
        assert!(parse(refused, 10)
            .unwrap_err()
            .contains("no TLS session came up (h2load: requests: 10 total, 0 started"));
    }

    #[test]
    fn p99_of_the_log() {
        let log: String = (1..=200).map(|t| format!("1700000000000000\t200\t{}\n", t * 1000)).collect();
        assert_eq!(log_p99(&log, 200), Ok(198.0));
        assert!(log_p99(&log, 201).unwrap_err().contains("holds 200 requests of 201"));
        let bad = log.replace("\t200\t5000", "\t-1\t5000");
        assert!(log_p99(&bad, 200).unwrap_err().contains("answered -1"));
    }
}
