//! HTTP/2 from clients end to end, with real clients in the client namespace: curl
//! (`--http2`, `--http2-prior-knowledge`), nghttp and h2load (Debian's nghttp2-client),
//! and Python's h2 library (python3-h2) for one long-lived session and for the attacks,
//! whose frames it writes itself (tests/fixtures/h2_clients.py). The agent serves an
//! HTTPS VIP (ALPN h2), plain VIPs with and without h2c, and WebSphere-like clones whose
//! logs say which clone served each stream; a VIP of scripted backends echoes bodies
//! and sends large ones.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use dispatcher_testbed::{
    netns::{rss_kib, Testbed},
    scripted,
    tls::{https_testbed_with, run, shop_only, HttpsBed, HTTPS_BACKEND_PORT, HTTPS_VIP},
    websphere::Clones,
};
use serde_json::{json, Value};

const VIP: &str = HTTPS_VIP;
/// A plain VIP that takes HTTP/2 by prior knowledge (`h2c = true`).
const H2C_PORT: u16 = 80;
/// A plain VIP without h2c: HTTP/1.x only.
const H1_PORT: u16 = 81;
/// A plain h2c VIP in front of the scripted backends (echo, large bodies).
const FILES_PORT: u16 = 82;
const FILES_BACKEND_PORT: u16 = 8081;
/// Debian's Python, which has python3-h2 (a Python of one's own may lack it).
const PYTHON: &str = "/usr/bin/python3";
const CLIENTS: &str = include_str!("../fixtures/h2_clients.py");

/// RFC 9113 7 error codes.
const NO_ERROR: u64 = 0;
const PROTOCOL_ERROR: u64 = 1;
const REFUSED_STREAM: u64 = 7;
const CANCEL: u64 = 8;
const ENHANCE_YOUR_CALM: u64 = 11;

struct H2Bed {
    bed: HttpsBed,
    /// What the scripted backends (behind the files VIP) received.
    record: Arc<scripted::Record>,
}

impl H2Bed {
    fn tb(&self) -> &Testbed {
        &self.bed.tb
    }

    fn cluster(&self) -> &Arc<Clones> {
        &self.bed.cluster
    }

    fn ca(&self) -> String {
        self.bed.pki.path("ca.pem").display().to_string()
    }

    fn access_log(&self) -> PathBuf {
        self.tb().workdir.join("access.log")
    }

    /// Where the Python clients connect: the HTTPS VIP.
    fn tls(&self) -> Value {
        json!({"host": VIP, "port": 443, "ca": self.ca(), "authority": "shop.example"})
    }
}

/// A plain VIP's port, as the Python clients take it.
fn h2c(port: u16) -> Value {
    json!({"host": VIP, "port": port, "authority": "shop.example"})
}

/// `target` with `more`'s fields.
fn with(mut target: Value, more: Value) -> Value {
    for (k, v) in more.as_object().unwrap() {
        target[k] = v.clone();
    }
    target
}

/// `n` clones behind the HTTPS VIP `shop` (443, h2 by ALPN) and the plain VIPs `plain`
/// (h2c), `h1` (no h2c) and `files` (h2c, scripted backends); an access log in the
/// haproxy format; `http`: lines for `[http]`.
fn h2_testbed(n: usize, http: &str) -> H2Bed {
    let record = Arc::new(scripted::Record::default());
    let scripted = record.clone();
    let bed = https_testbed_with(
        n,
        |pki| {
            let (tls, _) = shop_only(pki);
            let workdir = pki.dir.parent().unwrap();
            let vip = |name: &str, port: u16, backend_port: u16, more: &str| {
                format!("[[vip]]\nname = \"{name}\"\naddress = \"{VIP}\"\nport = {port}\nmode = \"http\"\nbackend_port = {backend_port}\n{more}")
            };
            let more = format!(
                "{}{}{}[access_log]\npath = \"{}\"\nformat = \"haproxy\"\n",
                vip("plain", H2C_PORT, HTTPS_BACKEND_PORT, "h2c = true\n"),
                vip("h1", H1_PORT, HTTPS_BACKEND_PORT, ""),
                vip("files", FILES_PORT, FILES_BACKEND_PORT, "h2c = true\n"),
                workdir.join("access.log").display()
            );
            (tls, more)
        },
        http,
        move |tb| {
            tb.start_scripted(&scripted, FILES_BACKEND_PORT);
            std::fs::write(tb.workdir.join("h2_clients.py"), CLIENTS).unwrap();
        },
    );
    H2Bed { bed, record }
}

/// Starts a mode of the Python clients (`opts`: its options) in the client namespace,
/// ended after `deadline` seconds (default 90) whatever happens.
fn py_spawn(b: &H2Bed, mode: &str, opts: Value) -> (std::process::Child, String) {
    let mut opts = opts;
    let deadline = opts["deadline"].as_u64().unwrap_or(90);
    opts["deadline"] = deadline.into();
    let script = b.tb().workdir.join("h2_clients.py").display().to_string();
    let limit = (deadline + 10).to_string();
    let child = b
        .tb()
        .client
        .command("timeout")
        .args(["-k", "5", &limit, PYTHON, &script, mode, &opts.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (child, format!("python {mode} {opts}"))
}

/// What a started mode printed: its JSON objects (it must succeed).
fn py_wait((child, what): (std::process::Child, String)) -> Vec<Value> {
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what}: {}\n{stdout}\n{stderr}", out.status);
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// Runs a mode of the Python clients to its end: the JSON objects it printed.
fn py(b: &H2Bed, mode: &str, opts: Value) -> Vec<Value> {
    py_wait(py_spawn(b, mode, opts))
}

/// The one report of a raw-frame mode.
fn py1(b: &H2Bed, mode: &str, opts: Value) -> Value {
    let mut lines = py(b, mode, opts);
    assert_eq!(lines.len(), 1, "{lines:?}");
    lines.remove(0)
}

/// A command in the client namespace, at most `secs` seconds: (success, stdout, stderr).
fn client_cmd(tb: &Testbed, secs: u64, program: &str, args: &[&str]) -> (bool, String, String) {
    let limit = secs.to_string();
    let mut all = vec!["-k", "5", limit.as_str(), program];
    all.extend_from_slice(args);
    let r = run(&tb.client, "timeout", &all, None);
    (r.ok, r.stdout, r.stderr)
}

fn metrics(tb: &Testbed) -> String {
    let (code, text) = tb.admin("GET", "/metrics").expect("the admin endpoint answers");
    assert_eq!(code, 200, "{text}");
    text
}

/// One sample of the exposition: `name` or `name{label="value"}`.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}")) as u64
}

fn metric(tb: &Testbed, name: &str) -> u64 {
    sample(&metrics(tb), name)
}

/// GOAWAYs sent for `reason`, once they reach `at_least` (at most 5 s: a GOAWAY is
/// counted when its connection ends, up to a second after it was sent).
fn goaways(tb: &Testbed, reason: &str, at_least: u64) -> u64 {
    let name = format!("dispatcher_h2_goaways_total{{reason=\"{reason}\"}}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let n = metric(tb, &name);
        if n >= at_least || Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn resets_sent(tb: &Testbed, reason: &str) -> u64 {
    metric(tb, &format!("dispatcher_h2_resets_sent_total{{reason=\"{reason}\"}}"))
}

fn by_protocol(tb: &Testbed, what: &str, protocol: &str) -> u64 {
    metric(tb, &format!("dispatcher_http_{what}_by_protocol_total{{protocol=\"{protocol}\"}}"))
}

/// Once the clients are gone, no HTTP/2 connection is left open (the agent sees the
/// ends a moment later).
fn assert_h2_closed(tb: &Testbed) {
    wait_for_gauge(tb, "dispatcher_h2_connections_open", Duration::from_secs(10));
}

/// Waits until a gauge is 0: `Err` with its value if it is not within `limit`.
fn wait_for_gauge(tb: &Testbed, name: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let n = metric(tb, name);
        if n == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is still {n} after {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The stream a clone's request came from, by the `s=<id>` its path carries.
fn stream_of(path: &str) -> Option<u64> {
    path.split(['?', '&']).find_map(|p| p.strip_prefix("s=")?.parse().ok())
}

/// A raw-frame report's per-stream map, by stream id.
fn per_stream(report: &Value, key: &str) -> BTreeMap<u64, u64> {
    report[key].as_object().unwrap().iter().map(|(k, v)| (k.parse().unwrap(), v.as_u64().unwrap())).collect()
}

fn per_stream_f(report: &Value, key: &str) -> BTreeMap<u64, f64> {
    report[key].as_object().unwrap().iter().map(|(k, v)| (k.parse().unwrap(), v.as_f64().unwrap())).collect()
}

/// The GOAWAY a raw-frame client received: (error code, last stream id).
fn goaway_of(report: &Value) -> Option<(u64, u64)> {
    let g = report["goaway"].as_array()?;
    Some((g[0].as_u64().unwrap(), g[1].as_u64().unwrap()))
}

/// Waits (at most 10 s) until the access log has `n` lines with `needle`: those lines.
fn log_lines(b: &H2Bed, needle: &str, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(b.access_log()).unwrap_or_default();
        let lines: Vec<String> = text.lines().filter(|l| l.contains(needle)).map(String::from).collect();
        if lines.len() >= n || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Python failover client on the HTTPS VIP (`before`, `after`, `burst_first`: its
/// options), the session's clone killed when it says so: the clone killed, what the
/// client printed (its answers, then its end), once it has ended.
fn failover_client(b: &mut H2Bed, before: u64, after: u64, burst_first: bool) -> (usize, Vec<Value>) {
    let script = b.tb().workdir.join("h2_clients.py").display().to_string();
    let opts = json!({"path": "/app/counter", "before": before, "after": after, "burst_first": burst_first});
    let opts = with(b.tls(), with(opts, json!({"deadline": 60})));
    let err = std::fs::File::create(b.tb().workdir.join("failover.err")).unwrap();
    let mut child = b
        .tb()
        .client
        .command("timeout")
        .args(["-k", "5", "75", PYTHON, &script, "failover", &opts.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen: Vec<Value> = Vec::new();
    let mut killed = None;
    while let Some(Ok(line)) = lines.next() {
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["event"] == "kill" {
            // The session's clone dies, its memory with it.
            let owner = b.cluster().hits()[0].backend;
            b.bed.tb.kill_servers_of(owner);
            b.cluster().kill(owner);
            killed = Some(owner);
            writeln!(stdin, "go").unwrap();
            continue;
        }
        seen.push(v);
    }
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(b.tb().workdir.join("failover.err")).unwrap_or_default();
    assert!(status.success(), "{status}: {seen:?}\n{stderr}");
    (killed.expect("the client got half-way"), seen)
}

/// Every answer a 200 from the clone it should come from (the owner before its death,
/// its replica after), the session intact; else what the agent says of the failures.
fn assert_failed_over(b: &H2Bed, owner: usize, seen: &[Value]) {
    let failed: Vec<&Value> = seen.iter().filter(|a| a["status"] != 200 || !a["reset"].is_null()).collect();
    if !failed.is_empty() {
        let text = metrics(b.tb());
        let said: Vec<String> = ["retries", "retry_budget_refusals", "holds", "hold_timeouts", "hold_refused"]
            .iter()
            .map(|m| format!("{m} {}", sample(&text, &format!("dispatcher_{m}_total"))))
            .collect();
        let log = std::fs::read_to_string(b.access_log()).unwrap_or_default();
        let answered: Vec<&str> = log.lines().filter(|l| !l.contains(" 200 ")).collect();
        panic!("{} of {} streams failed: {failed:?}\n{said:?}\n{answered:#?}", failed.len(), seen.len());
    }
    for a in seen {
        assert_eq!(a["lost"], "0", "{a}");
        let want = if a["phase"] == "before" { owner } else { owner ^ 1 };
        assert_eq!(a["clone"], format!("clone{want}x"), "{a}");
    }
    let mut counts: Vec<u64> = seen.iter().map(|a| a["count"].as_u64().unwrap()).collect();
    counts.sort();
    assert_eq!(
        counts,
        (1..=seen.len() as u64).collect::<Vec<u64>>(),
        "the session's counter went on across the failure"
    );
}

/// One session on one TLS connection (h2 by ALPN): 20 streams, half of them open at
/// once, then its clone dies and 20 more go to the replica on the same connection (the
/// first ones one after another), the session's counter going on without a gap. The
/// clones' own logs show no misroute and no lost session; the access log names
/// HTTP/2.0; the metrics count one h2 connection.
#[test]
fn one_connection_keeps_its_session_across_a_clones_death() {
    let mut b = h2_testbed(4, "");
    let (owner, mut seen) = failover_client(&mut b, 10, 10, false);
    let replica = owner ^ 1;
    let end = seen.pop().unwrap();
    assert_eq!(end["event"], "end");
    assert_eq!((&end["goaway"], &end["closed"]), (&Value::Null, &json!(false)), "the connection lasted: {end}");
    assert_eq!(seen.len(), 40, "{seen:?}");
    assert_failed_over(&b, owner, &seen);
    // The clones' logs: 20 requests at the owner, then 20 at its replica, one session.
    let hits = b.cluster().hits();
    assert_eq!(hits.len(), 40);
    assert!(hits[..20].iter().all(|h| h.backend == owner), "{hits:?}");
    assert!(hits[20..].iter().all(|h| h.backend == replica), "{hits:?}");
    assert_eq!(hits.iter().map(|h| h.session.as_str()).collect::<BTreeSet<_>>().len(), 1, "{hits:?}");
    assert!(hits.iter().all(|h| !h.lost), "no session lost: {hits:?}");
    assert_eq!(b.cluster().misroutes(), Vec::<String>::new());
    // The access log: 40 HTTP/2.0 requests, 20 by each clone, failed over after the death.
    let logged = log_lines(&b, "\"GET /app/counter HTTP/2.0\"", 40);
    assert_eq!(logged.len(), 40, "{logged:?}");
    let at = |i: usize| logged.iter().filter(|l| l.contains(&format!(" shop~ shop/b{i} "))).count();
    assert_eq!((at(owner), at(replica)), (20, 20), "{logged:?}");
    assert!(logged[20..].iter().any(|l| l.contains("failed_over")), "{logged:?}");
    // Metrics: one h2 connection, 40 h2 requests, nothing left open, no misroute.
    let text = metrics(b.tb());
    assert_eq!(sample(&text, "dispatcher_http_client_connections_by_protocol_total{protocol=\"h2\"}"), 1);
    assert_eq!(sample(&text, "dispatcher_http_requests_by_protocol_total{protocol=\"h2\"}"), 40);
    assert_eq!(sample(&text, "dispatcher_http_requests_by_protocol_total{protocol=\"h1\"}"), 0);
    assert_eq!(sample(&text, "dispatcher_misroutes_total"), 0);
    dispatcher_testbed::promtool_check(&text).unwrap();
    assert_h2_closed(b.tb());
}

/// A session's 16 streams in flight together just as its clone has died (sent at once
/// right after the death, on one connection) all go to the replica: each answered 200
/// from there, the counter going on. A failed connection to the dead clone sent
/// nothing to anyone, so each of them may be sent to the replica.
#[test]
fn a_sessions_streams_sent_at_once_after_its_clones_death_all_reach_the_replica() {
    let mut b = h2_testbed(4, "");
    let (owner, mut seen) = failover_client(&mut b, 10, 16, true);
    let end = seen.pop().unwrap();
    assert_eq!((&end["goaway"], &end["closed"]), (&Value::Null, &json!(false)), "the connection lasted: {end}");
    assert_eq!(seen.len(), 52, "{seen:?}");
    assert_failed_over(&b, owner, &seen);
    assert_eq!(b.cluster().misroutes(), Vec::<String>::new());
}

/// Two sessions owned by two clones, multiplexed on one h2c connection (their requests
/// open at once, interleaved, their cookies in crumbs): each stream reaches its own
/// session's clone, and each session's counter goes on.
#[test]
fn two_sessions_multiplexed_on_one_connection_reach_their_two_clones() {
    let b = h2_testbed(4, "");
    let lines = py(&b, "two_sessions", with(h2c(H2C_PORT), json!({"path": "/app/counter", "each": 10})));
    let (answers, end) = lines.split_at(lines.len() - 1);
    assert_eq!((&end[0]["goaway"], &end[0]["closed"]), (&Value::Null, &json!(false)), "{end:?}");
    assert_eq!(answers.len(), 20);
    let mut counts: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for a in answers {
        assert_eq!(a["status"], 200, "{a}");
        assert_eq!(a["clone"], a["owner"], "a stream of session {} reached another clone: {a}", a["session"]);
        counts.entry(a["session"].as_str().unwrap()).or_default().push(a["count"].as_u64().unwrap());
    }
    for (session, c) in counts.iter_mut() {
        c.sort();
        assert_eq!(*c, (2..=11).collect::<Vec<u64>>(), "session {session}");
    }
    let owners: BTreeSet<&str> = answers.iter().map(|a| a["owner"].as_str().unwrap()).collect();
    assert_eq!(owners.len(), 2, "two clones: {owners:?}");
    // The clones' logs: each session at one clone only; every request of the connection
    // is in them (the sessions made first included).
    let hits = b.cluster().hits();
    let mut at: BTreeMap<&str, BTreeSet<usize>> = BTreeMap::new();
    for h in &hits {
        at.entry(h.session.as_str()).or_default().insert(h.backend);
    }
    assert!(at.values().all(|backends| backends.len() == 1), "{at:?}");
    assert_eq!(b.cluster().misroutes(), Vec::<String>::new());
    let text = metrics(b.tb());
    assert_eq!(sample(&text, "dispatcher_http_client_connections_by_protocol_total{protocol=\"h2\"}"), 1);
    assert_eq!(sample(&text, "dispatcher_http_requests_by_protocol_total{protocol=\"h2\"}"), hits.len() as u64);
    assert_h2_closed(b.tb());
}

/// A plain VIP with h2c serves HTTP/2 by prior knowledge (curl, nghttp, h2load); one
/// without serves HTTP/1.1 only: the preface gets the HTTP/1.1 parser's refusal and
/// reaches no clone.
#[test]
fn h2c_by_prior_knowledge_when_on_and_refused_when_off() {
    let b = h2_testbed(2, "");
    let tb = b.tb();
    let url = |port: u16, path: &str| format!("http://{VIP}:{port}{path}");
    let curl = |extra: &[&str], u: &str| {
        let mut args = vec!["-sS", "--max-time", "10", "-w", "\n%{http_code} %{http_version}"];
        args.extend_from_slice(extra);
        args.push(u);
        client_cmd(tb, 20, "curl", &args)
    };
    let (ok, out, err) = curl(&["--http2-prior-knowledge"], &url(H2C_PORT, "/app/counter"));
    assert!(ok && out.contains("count=1") && out.ends_with("\n200 2"), "{out}{err}");
    let (ok, out, err) = client_cmd(tb, 20, "nghttp", &["-t", "10", &url(H2C_PORT, "/app/counter")]);
    assert!(ok && out.contains("count=1"), "nghttp: {out}{err}");
    let (ok, out, err) =
        client_cmd(tb, 30, "h2load", &["-n", "20", "-c", "2", "-m", "5", &url(H2C_PORT, "/app/counter")]);
    assert!(ok && out.contains("20 succeeded, 0 failed, 0 errored"), "h2load: {out}{err}");
    assert!(out.contains("Application protocol: h2c"), "{out}");
    assert_eq!(b.cluster().hits().len(), 22);
    let text = metrics(tb);
    assert_eq!(sample(&text, "dispatcher_http_client_connections_by_protocol_total{protocol=\"h2\"}"), 4);
    assert_eq!(sample(&text, "dispatcher_http_requests_by_protocol_total{protocol=\"h2\"}"), 22);

    // Without h2c: prior knowledge fails, and nothing reaches a clone.
    let (ok, out, err) = curl(&["--http2-prior-knowledge"], &url(H1_PORT, "/app/counter"));
    assert!(!ok && !out.contains("count="), "{out}{err}");
    // (nghttp exits 0 all the same, saying so.)
    let (_, out, err) = client_cmd(tb, 20, "nghttp", &["-t", "5", &url(H1_PORT, "/app/counter")]);
    assert!(!out.contains("count=") && err.contains("Some requests were not processed"), "nghttp: {out}{err}");
    let addr: SocketAddr = format!("{VIP}:{H1_PORT}").parse().unwrap();
    let answer = tb.client.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // The preface and an empty SETTINGS frame.
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00").unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        String::from_utf8_lossy(&got).into_owned()
    });
    assert!(answer.starts_with("HTTP/1.1 400 ") && answer.contains("bad HTTP version"), "{answer}");
    assert_eq!(b.cluster().hits().len(), 22, "nothing of the refused prefaces reached a clone");
    let text = metrics(tb);
    assert_eq!(sample(&text, "dispatcher_http_client_connections_by_protocol_total{protocol=\"h2\"}"), 4);
    // HTTP/1.1 is served on both, and an Upgrade to h2c is not taken (HTTP/1.1 answers).
    let (ok, out, err) = curl(&[], &url(H1_PORT, "/app/counter"));
    assert!(ok && out.ends_with("\n200 1.1"), "{out}{err}");
    let (ok, out, err) = curl(&["--http2"], &url(H2C_PORT, "/app/counter"));
    assert!(ok && out.ends_with("\n200 1.1"), "{out}{err}");
    assert_eq!(b.cluster().hits().len(), 24);
    assert_eq!(by_protocol(tb, "requests", "h1"), 2);
}

/// The position of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A chunked body's data.
fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = find(body, b"\r\n").expect("a chunk size line");
        let size = usize::from_str_radix(std::str::from_utf8(&body[..eol]).unwrap().trim(), 16).unwrap();
        body = &body[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

/// Request bodies larger than every window (the agent's smallest, 65,535 bytes) arrive
/// whole, with and without a content-length (chunked upstream); a 16 MiB response
/// crosses a client's small windows whole (nghttp, h2load), and no bound is broken by
/// clients that merely read slowly.
#[test]
fn large_bodies_cross_both_ways_under_small_windows() {
    let b = h2_testbed(2, "h2_initial_window_size = 65535\n");
    let tb = b.tb();
    // 4 MiB of text (the scripted backend echoes requests as text).
    // (Shifted every 4 KiB: a piece out of place would show.)
    let body: Vec<u8> = (0..4u32 << 20).map(|i| b'a' + ((i + i / 4096) % 26) as u8).collect();
    let file = tb.workdir.join("upload.txt");
    std::fs::write(&file, &body).unwrap();
    let echoed = tb.workdir.join("echoed.txt");
    let (f, e) = (format!("@{}", file.display()), echoed.display().to_string());
    // With a content-length: the echo is the request as the backend got it, body last.
    let url = format!("http://{VIP}:{FILES_PORT}/echo");
    let (ok, _, err) = client_cmd(
        tb,
        60,
        "curl",
        &["-sS", "--max-time", "50", "--http2-prior-knowledge", "--data-binary", &f, "-o", &e, &url],
    );
    assert!(ok, "{err}");
    let got = std::fs::read(&echoed).unwrap();
    assert!(got.starts_with(b"POST /echo HTTP/1.1\r\n"), "{}", String::from_utf8_lossy(&got[..200]));
    assert!(find(&got, format!("Content-Length: {}\r\n", body.len()).as_bytes()).is_some());
    assert!(got.ends_with(&body), "the whole body, in order ({} bytes echoed)", got.len());
    // Without one (nghttp's --no-content-length): chunked upstream, the same bytes.
    let file = file.display().to_string();
    let out = tb
        .client
        .command("timeout")
        .args(["-k", "5", "60", "nghttp", "-t", "50", "--no-content-length", "-d", &file, &url])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::write(&echoed, &out.stdout).unwrap();
    let got = std::fs::read(&echoed).unwrap();
    let head_end = find(&got, b"\r\n\r\n").unwrap() + 4;
    let head = String::from_utf8_lossy(&got[..head_end]).into_owned();
    assert!(head.contains("Transfer-Encoding: chunked\r\n") && !head.contains("Content-Length"), "{head}");
    assert!(dechunk(&got[head_end..]) == body, "the chunked body is the body");
    // Downloads through small windows: nghttp with a 16 KiB stream and 32 KiB connection
    // window, h2load with 4 KiB and 16 KiB.
    let big = format!("http://{VIP}:{FILES_PORT}/big");
    let out = tb
        .client
        .command("timeout")
        .args(["-k", "5", "60", "nghttp", "-t", "50", "-w", "14", "-W", "15", &big])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), 16 << 20);
    assert!(out.stdout.iter().all(|&c| c == b'x'));
    // Nothing was cut off for breaking a bound.
    let quiet = |text: &str| {
        let broken: Vec<String> = ["rapid_reset", "control_flood", "protocol_error", "enhance_your_calm"]
            .iter()
            .map(|r| (r, sample(text, &format!("dispatcher_h2_goaways_total{{reason=\"{r}\"}}"))))
            .filter(|(_, n)| *n > 0)
            .map(|(r, n)| format!("{n} GOAWAY {r}"))
            .collect();
        let cancelled = sample(text, "dispatcher_h2_resets_sent_total{reason=\"cancel\"}");
        (broken, cancelled)
    };
    assert_eq!(quiet(&metrics(tb)), (vec![], 0));
    // Smaller still: h2load with a 4 KiB stream window and a 16 KiB connection window,
    // three downloads at once. It reads as fast as it can, opening its windows as it
    // reads (a WINDOW_UPDATE for every 2 KiB of a stream, every 8 KiB of the connection).
    let (ok, out, err) = client_cmd(tb, 90, "h2load", &["-n", "3", "-c", "1", "-m", "3", "-w", "12", "-W", "14", &big]);
    // (A GOAWAY is counted when its connection ends, a second after it is sent.)
    std::thread::sleep(Duration::from_millis(1500));
    let text = metrics(tb);
    assert!(
        ok && out.contains("3 succeeded, 0 failed, 0 errored"),
        "h2load with small windows, a client that reads everything at once: {:?}\n{out}{err}",
        quiet(&text)
    );
    assert_eq!(quiet(&text), (vec![], 0));
    // The backends got every request once: two uploads, four downloads.
    assert_eq!(b.record.count(), 6);
    assert_h2_closed(tb);
}

/// `h2_max_concurrent_streams`: a client that opens more streams at once than the
/// agent's SETTINGS allow (sent before it read them) has the excess refused
/// (REFUSED_STREAM): only as many reach the clones, and never more at once.
#[test]
fn streams_beyond_the_concurrency_bound_are_refused() {
    let b = h2_testbed(2, "h2_max_concurrent_streams = 4\n");
    let r = py1(&b, "concurrent", with(h2c(H2C_PORT), json!({"path": "/slow/1000", "streams": 10})));
    let status = per_stream(&r, "status");
    let resets = per_stream(&r, "resets");
    let served: Vec<u64> = status.iter().filter(|(_, &s)| s == 200).map(|(&id, _)| id).collect();
    assert_eq!(served, [1, 3, 5, 7], "the first four streams are served: {r}");
    let refused: Vec<u64> = resets.iter().filter(|(_, &c)| c == REFUSED_STREAM).map(|(&id, _)| id).collect();
    assert_eq!(refused, [9, 11, 13, 15, 17, 19], "the six others refused: {r}");
    assert_eq!(goaway_of(&r), None, "the connection goes on: {r}");
    let hits = b.cluster().hits();
    let streams: BTreeSet<u64> = hits.iter().filter_map(|h| stream_of(&h.path)).collect();
    assert_eq!(streams, [1, 3, 5, 7].into(), "{hits:?}");
    let at_once: u64 = b.cluster().busy_max.iter().map(|m| m.load(std::sync::atomic::Ordering::SeqCst)).sum();
    assert!(at_once <= 4, "{at_once} at once");
    assert_eq!(resets_sent(b.tb(), "refused_stream"), 6);
}

/// Streams the client resets while their requests wait at the backends still count
/// toward the concurrency bound until they end: the codec forgets a reset stream, the
/// dispatcher does not, so a client resetting and reopening cannot have more requests at
/// the clones than `h2_max_concurrent_streams` (the new streams are refused meanwhile).
#[test]
fn streams_reset_while_at_work_still_count_toward_the_bound() {
    let b = h2_testbed(2, "h2_max_concurrent_streams = 4\n");
    let opts = json!({"path": "/slow/3000", "streams": 4, "wait": 0.8});
    let r = py1(&b, "reset_waiting", with(h2c(H2C_PORT), opts));
    let resets = per_stream(&r, "resets");
    let second: Vec<u64> = r["second"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    for sid in &second {
        assert_eq!(resets.get(sid), Some(&REFUSED_STREAM), "stream {sid} refused while four are at work: {r}");
    }
    // The clones log a request once answered (3 s).
    std::thread::sleep(Duration::from_secs(4));
    let at_once: u64 = b.cluster().busy_max.iter().map(|m| m.load(std::sync::atomic::Ordering::SeqCst)).sum();
    assert!(at_once <= 4, "{at_once} requests at the clones at once (bound 4)");
    let hits = b.cluster().hits();
    let streams: BTreeSet<u64> = hits.iter().filter_map(|h| stream_of(&h.path)).collect();
    assert_eq!(streams, [1, 3, 5, 7].into(), "only the first four reached the clones: {hits:?}");
    assert_eq!(goaway_of(&r), None, "the connection goes on: {r}");
}

/// Rapid reset (CVE-2023-44487): streams opened and reset at once. Paced (one pair a
/// millisecond, ten times the budget), the connection gets GOAWAY ENHANCE_YOUR_CALM once
/// its resets outrun `h2_max_resets_per_second` (100, a burst of 200), counted as
/// rapid_reset; in one burst, it gets the same. The clones see at most what the budget
/// let through, nothing past the GOAWAY's last stream, and far fewer requests than the
/// streams opened.
#[test]
fn rapid_reset_is_cut_off_at_its_budget() {
    let b = h2_testbed(2, "");
    let r = py1(&b, "rapid_reset", with(b.tls(), json!({"path": "/app/rr", "pairs": 3000, "pace_ms": 1})));
    let (code, last) = goaway_of(&r).unwrap_or_else(|| panic!("no GOAWAY: {r}"));
    assert_eq!(code, ENHANCE_YOUR_CALM, "{r}");
    let at = r["sent_at_goaway"].as_u64().expect("GOAWAY while sending");
    let t = r["goaway_at"].as_f64().unwrap();
    // The budget: a burst of 200, then 100 a second; the client sees GOAWAY a little
    // after the reset that broke it (pairs sent meanwhile: one a millisecond).
    assert!(at > 200, "GOAWAY after {at} resets: before the burst was spent");
    let allowed = 200.0 + 100.0 * t + 200.0;
    assert!((at as f64) < allowed, "GOAWAY after {at} resets in {t:.2}s (budget ~{allowed:.0})");
    assert_eq!(goaways(b.tb(), "rapid_reset", 1), 1);
    assert!(metric(b.tb(), "dispatcher_h2_resets_received_total{reason=\"cancel\"}") > 200);
    let hits = b.cluster().hits();
    let streams: Vec<u64> = hits.iter().filter_map(|h| stream_of(&h.path)).collect();
    assert!(streams.iter().all(|&s| s <= last), "a stream past the GOAWAY's last ({last}) reached a clone");
    // Each pair arrives whole: a stream is reset before its request is forwarded.
    assert!(hits.len() as u64 * 20 <= at, "{} requests reached the clones for {at} streams", hits.len());
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(b.cluster().hits().len(), hits.len(), "nothing after the GOAWAY");

    // One burst of 5000 pairs: cut off as well (by the budget, or by the h2 crate's own
    // bound on streams reset before they were taken up).
    let before = b.cluster().hits().len();
    let r = py1(&b, "rapid_reset", with(b.tls(), json!({"path": "/app/burst", "pairs": 5000})));
    let (code, last) = goaway_of(&r).unwrap_or_else(|| panic!("no GOAWAY: {r}"));
    assert_eq!(code, ENHANCE_YOUR_CALM, "{r}");
    assert!(r["closed"].as_bool().unwrap(), "{r}");
    let hits = b.cluster().hits();
    let burst: Vec<u64> = hits[before..].iter().filter_map(|h| stream_of(&h.path)).collect();
    assert!(burst.len() < 250, "{} of 5000 reset streams reached the clones", burst.len());
    assert!(last < 1000, "the GOAWAY came after stream {last}");
    assert!(burst.iter().all(|&s| s <= last), "a stream past the GOAWAY's last ({last}) reached a clone");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(goaways(b.tb(), "rapid_reset", 0) + goaways(b.tb(), "enhance_your_calm", 0), 2);
    // A good client is served meanwhile.
    let (ok, out, err) = client_cmd(
        b.tb(),
        20,
        "curl",
        &[
            "-sS",
            "--max-time",
            "10",
            "--http2",
            "--cacert",
            &b.ca(),
            "--resolve",
            &format!("shop.example:443:{VIP}"),
            "https://shop.example/app/counter",
        ],
    );
    assert!(ok && out.contains("count=1"), "{out}{err}");
}

/// CONTINUATION floods (CVE-2024-27316): a header block that never ends, in frames
/// with fields, large ones, or empty: GOAWAY ENHANCE_YOUR_CALM after a few frames, and
/// nothing reaches a clone.
#[test]
fn continuation_floods_end_in_goaway_and_reach_no_clone() {
    let b = h2_testbed(2, "");
    for (fill, frames) in [(100, 1000), (8000, 200), (0, 5000)] {
        let r =
            py1(&b, "continuation", with(h2c(H2C_PORT), json!({"path": "/app/cont", "fill": fill, "frames": frames})));
        assert_eq!(goaway_of(&r).map(|g| g.0), Some(ENHANCE_YOUR_CALM), "fill {fill}: {r}");
        assert!(r["closed"].as_bool().unwrap(), "fill {fill}: closed after the GOAWAY: {r}");
        assert!(r["status"].as_object().unwrap().is_empty(), "fill {fill}: {r}");
    }
    assert!(b.cluster().hits().is_empty(), "{:?}", b.cluster().hits());
    assert_eq!(goaways(b.tb(), "enhance_your_calm", 3), 3);
}

/// Header lists over `max_header_bytes` (16 KiB) once decoded: plain large fields, and
/// HPACK bombs (one 4 KB field in the table, referenced by one byte each). Under the
/// bound (15 KB): forwarded. Over it: 431, the stream ends there and the connection
/// goes on (a good request on it is served). Far over it (a bomb of 48 MB decoded from
/// 16 KB): GOAWAY ENHANCE_YOUR_CALM. No clone sees any of those; the agent's memory does
/// not grow with the bombs.
#[test]
fn oversized_header_lists_and_hpack_bombs_reach_no_clone() {
    let b = h2_testbed(2, "");
    let tb = b.tb();
    let pid = tb.pid_of("dispatcher").unwrap();
    for (what, opts, want) in [
        ("15 fields of 1000 bytes", json!({"kind": "plain", "fields": 15, "size": 1000}), 200),
        ("20 fields of 1000 bytes", json!({"kind": "plain", "fields": 20, "size": 1000}), 431),
        ("a bomb of 8 x 4 KB", json!({"kind": "bomb", "size": 4000, "refs": 8}), 431),
    ] {
        let r = py1(&b, "header_list", with(h2c(H2C_PORT), with(opts, json!({"path": "/app/hl"}))));
        assert_eq!(per_stream(&r, "status").get(&1), Some(&want), "{what}: {r}");
        assert!(r["ended"].as_array().unwrap().contains(&json!(1)), "{what}: the stream ended: {r}");
        assert_eq!(goaway_of(&r), None, "{what}: the connection goes on: {r}");
        let good = r["good"].as_u64().unwrap();
        assert_eq!(per_stream(&r, "status").get(&good), Some(&200), "{what}: a good request after it: {r}");
    }
    let rss_before = rss_kib(pid);
    for i in 0..20 {
        let opts = json!({"kind": "bomb", "size": 4000, "refs": 12000, "path": "/app/bomb"});
        let r = py1(&b, "header_list", with(if i % 2 == 0 { h2c(H2C_PORT) } else { b.tls() }, opts));
        assert_eq!(goaway_of(&r).map(|g| g.0), Some(ENHANCE_YOUR_CALM), "bomb {i}: {r}");
        assert!(r["wire"].as_u64().unwrap() < 20_000, "{r}");
        assert!(r["status"].as_object().unwrap().is_empty(), "bomb {i}: {r}");
    }
    let rss_after = rss_kib(pid);
    assert!(rss_after < rss_before + 16 * 1024, "memory after 20 bombs: {rss_after} KiB, before {rss_before} KiB");
    let mut paths: Vec<String> = b.cluster().hits().iter().map(|h| h.path.clone()).collect();
    paths.sort();
    assert_eq!(paths, ["/app/hl?good", "/app/hl?good", "/app/hl?good", "/app/hl?s=1"], "only these reached a clone");
    assert_eq!(goaways(tb, "enhance_your_calm", 20), 20);
}

/// SETTINGS, PING, WINDOW_UPDATE and PRIORITY floods, 10,000 frames each: GOAWAY
/// ENHANCE_YOUR_CALM once `h2_max_control_frames_per_second` (200, a burst of 400) is
/// spent, counted as control_flood, and the agent reads no more (it acknowledged the
/// budget's SETTINGS and PINGs and what the read that broke it held, not the 10,000).
/// Empty DATA frames meet the h2 crate's own bound first (100 a connection: GOAWAY
/// ENHANCE_YOUR_CALM, counted as enhance_your_calm).
#[test]
fn control_frame_floods_end_in_goaway() {
    let b = h2_testbed(2, "");
    for (kind, reason) in [
        ("settings", "control_flood"),
        ("ping", "control_flood"),
        ("ping_ack", "control_flood"),
        ("window_update", "control_flood"),
        ("priority", "control_flood"),
        ("empty_data", "enhance_your_calm"),
    ] {
        let before = goaways(b.tb(), reason, 0);
        let r = py1(&b, "flood", with(h2c(H2C_PORT), json!({"kind": kind, "frames": 10_000, "path": "/app/flood"})));
        assert_eq!(goaway_of(&r).map(|g| g.0), Some(ENHANCE_YOUR_CALM), "{kind}: {r}");
        assert!(r["closed"].as_bool().unwrap(), "{kind}: {r}");
        assert_eq!(goaways(b.tb(), reason, before + 1), before + 1, "{kind}: counted as {reason}");
        if let Some(ack) = ["settings", "ping"].into_iter().find(|a| *a == kind) {
            let n = r["acks"][ack].as_f64().unwrap();
            let t = r["goaway_at"].as_f64().unwrap();
            // The budget, and the frames of the 16 KiB read that broke it at the most.
            let most = 400.0 + 200.0 * t + 16384.0 / 15.0;
            assert!((400.0..most).contains(&n), "{kind}: {n} acknowledged of 10000 in {t:.3}s (at most ~{most:.0})");
        }
    }
    assert!(b.cluster().hits().len() <= 1, "only the empty-DATA flood's one request: {:?}", b.cluster().hits());
    // The codec's line per unexpected PING ACK is not logged at the default level: a
    // client cannot fill the journal with them.
    let log = b.tb().log("dispatcher");
    let acks_logged = log.lines().filter(|l| l.contains("PING ack")).count();
    assert_eq!(acks_logged, 0, "{acks_logged} lines about PING ACKs");
}

/// A client that keeps its window shut (SETTINGS_INITIAL_WINDOW_SIZE 0, no
/// WINDOW_UPDATE): the response's head is sent, its body cannot be; the stream is reset
/// CANCEL once `client_timeout` (2 s) has passed, and a 16 MiB response is not buffered
/// meanwhile. Another stream of the same connection, whose window the client opens, is
/// answered at once all the same.
#[test]
fn a_window_held_shut_is_reset_after_the_client_timeout() {
    let b = h2_testbed(2, "client_timeout = \"2s\"\n");
    let tb = b.tb();
    let pid = tb.pid_of("dispatcher").unwrap();
    let rss_before = rss_kib(pid);
    for (port, path) in [(H2C_PORT, "/app/counter"), (FILES_PORT, "/big")] {
        let other = if port == FILES_PORT { "/medium" } else { "" };
        let opts = json!({"path": path, "other": other, "wait": 15});
        let r = py1(&b, "zero_window", with(h2c(port), opts));
        assert_eq!(per_stream(&r, "status").get(&1), Some(&200), "{path}: {r}");
        assert_eq!(per_stream(&r, "resets").get(&1), Some(&CANCEL), "{path}: {r}");
        assert!(!per_stream(&r, "data").contains_key(&1), "{path}: no DATA through a shut window: {r}");
        let held = per_stream_f(&r, "reset_at")[&1] - per_stream_f(&r, "headers_at")[&1];
        assert!((1.5..6.0).contains(&held), "{path}: reset after {held:.2}s");
        if path == "/big" {
            let rss = rss_kib(pid);
            assert!(rss < rss_before + 12 * 1024, "held 16 MiB: {rss} KiB, before {rss_before} KiB");
            // The other stream (8000 bytes from the scripted backend) was not held up.
            let other = r["other"].as_u64().unwrap();
            assert_eq!(per_stream(&r, "status").get(&other), Some(&200), "{r}");
            assert_eq!(per_stream(&r, "data").get(&other), Some(&8000), "{r}");
            assert!(r["ended"].as_array().unwrap().contains(&json!(other)), "{r}");
            assert!(per_stream_f(&r, "headers_at")[&other] < 1.0, "{r}");
        }
    }
    assert_eq!(resets_sent(tb, "cancel"), 2);
    assert_h2_closed(tb);
}

/// A stream whose request body never comes is answered 408 at `client_timeout` (2 s),
/// and the application sees no request.
#[test]
fn a_stream_whose_body_never_comes_ends_at_the_client_timeout() {
    let b = h2_testbed(2, "client_timeout = \"2s\"\n");
    let r = py1(&b, "idle_stream", with(h2c(H2C_PORT), json!({"path": "/app/idle", "wait": 15})));
    assert_eq!(per_stream(&r, "status").get(&1), Some(&408), "{r}");
    assert!(r["ended"].as_array().unwrap().contains(&json!(1)), "{r}");
    let ended = per_stream_f(&r, "headers_at")[&1];
    assert!((1.5..4.0).contains(&ended), "408 after {ended:.2}s: {r}");
    assert!(b.cluster().hits().is_empty(), "the application saw no request: {:?}", b.cluster().hits());
    assert_h2_closed(b.tb());
}

/// A connection left idle after its one request gets a graceful GOAWAY (NO_ERROR, last
/// stream 1) at `client_idle_timeout` (3 s) after the answer, counted as idle, and is
/// closed; a stream in flight longer than that (3.5 s) is no idleness: it is answered,
/// and the GOAWAY comes 3 s after it.
#[test]
fn an_idle_connection_gets_goaway_at_the_idle_timeout() {
    let b = h2_testbed(2, "client_idle_timeout = \"3s\"\n");
    for (n, path) in [(1, "/app/counter"), (2, "/slow/3500")] {
        let r = py1(&b, "idle_conn", with(b.tls(), json!({"path": path, "wait": 15})));
        assert_eq!(per_stream(&r, "status").get(&1), Some(&200), "{path}: {r}");
        let (code, last) = goaway_of(&r).unwrap_or_else(|| panic!("{path}: no GOAWAY: {r}"));
        assert_eq!((code, last), (NO_ERROR, 1), "{path}: {r}");
        assert!(r["goaways"].as_array().unwrap().iter().all(|g| g[0] == NO_ERROR), "{path}: {r}");
        let idle = r["goaway_at"].as_f64().unwrap() - r["answered_at"].as_f64().unwrap();
        assert!((2.5..4.5).contains(&idle), "{path}: GOAWAY after {idle:.2}s idle (client_idle_timeout 3s)");
        assert!(r["closed"].as_bool().unwrap(), "{path}: {r}");
        assert_eq!(goaways(b.tb(), "idle", n), n, "{path}");
    }
    assert_h2_closed(b.tb());
}

/// A stream ends with its response: once 200 streams are answered (h2load, two
/// connections), none is left in flight, long before `client_idle_timeout` (60 s).
#[test]
fn streams_end_when_their_responses_are_sent() {
    let b = h2_testbed(2, "");
    let url = format!("http://{VIP}:{H2C_PORT}/app/counter");
    let (ok, out, err) = client_cmd(b.tb(), 60, "h2load", &["-n", "200", "-c", "2", "-m", "10", &url]);
    assert!(ok && out.contains("200 succeeded, 0 failed, 0 errored"), "h2load: {out}{err}");
    assert_h2_closed(b.tb());
    wait_for_gauge(b.tb(), "dispatcher_h2_streams_in_flight", Duration::from_secs(5));
}

/// What cannot be translated into HTTP/1.1 is answered by the agent (CONNECT 501, no
/// :authority nor Host 400) or reset by the h2 crate (connection-specific fields, `te`
/// other than trailers, a content-length the stream's DATA cannot match:
/// PROTOCOL_ERROR); none of it reaches a clone. Host alone names the origin.
#[test]
fn requests_that_cannot_be_translated_reach_no_clone() {
    let b = h2_testbed(2, "");
    let r = py1(&b, "refused", with(h2c(H2C_PORT), json!({"path": "/app/t"})));
    assert_eq!(goaway_of(&r), None, "{r}");
    let cases = r["cases"].as_object().unwrap();
    let id = |name: &str| cases[name].as_u64().unwrap();
    let status = per_stream(&r, "status");
    let resets = per_stream(&r, "resets");
    assert_eq!(status.get(&id("connect")), Some(&501), "{r}");
    assert_eq!(status.get(&id("no_authority")), Some(&400), "{r}");
    assert_eq!(status.get(&id("host_only")), Some(&200), "{r}");
    assert_eq!(status.get(&id("good")), Some(&200), "{r}");
    for name in ["connection_field", "te_gzip", "length_without_data"] {
        assert_eq!(resets.get(&id(name)), Some(&PROTOCOL_ERROR), "{name}: {r}");
        assert!(!status.contains_key(&id(name)), "{name}: {r}");
    }

    let paths: BTreeSet<String> = b.cluster().hits().iter().map(|h| h.path.clone()).collect();
    assert_eq!(paths, ["/app/t?good".to_string(), "/app/t?host-only".to_string()].into());
    let answered = status.values().filter(|&&s| s == 400 || s == 501).count() as u64;
    assert_eq!(metric(b.tb(), "dispatcher_h2_requests_refused_total"), answered);
    // The translator's refusals are among the last refused requests, their heads as text.
    let (_, body) = b.tb().admin("GET", "/errors").expect("agent answers");
    let errors: dispatcher::api::ErrorsReply = serde_json::from_str(&body).unwrap();
    let e = errors.errors.iter().find(|e| e.reason == "the request has neither :authority nor Host");
    let e = e.unwrap_or_else(|| panic!("the refusal without :authority is kept: {body}"));
    assert_eq!((e.protocol.as_str(), e.status), ("h2", 400), "{body}");
    assert!(e.bytes.contains(" HTTP/2\\x0d\\x0a"), "{body}");
}

/// What could smuggle a second request or field into the HTTP/1.1 translation (CR, LF
/// or NUL in a field, a space in :path, an uppercase name, transfer-encoding, a
/// content-length the DATA does not match), each on its own connection to the scripted
/// backends, which record every byte they get: each is refused by the h2 crate (GOAWAY
/// or RST_STREAM PROTOCOL_ERROR) and none reaches a backend; a request with trailers is
/// forwarded chunked with its trailer.
#[test]
fn what_could_smuggle_a_request_through_the_translation_reaches_no_backend() {
    let b = h2_testbed(2, "");
    let r = py1(&b, "smuggle", with(h2c(FILES_PORT), json!({"path": "/echo"})));
    let outcome = |case: &str| {
        let c = &r[case];
        (c["status"].as_u64(), c["reset"].as_u64(), c["goaway"].as_u64())
    };
    for case in ["crlf_in_value", "lf_in_value", "nul_in_value", "crlf_in_name", "uppercase_name"] {
        assert_eq!(outcome(case), (None, None, Some(PROTOCOL_ERROR)), "{case}: {r}");
    }
    for case in ["space_in_path", "transfer_encoding", "length_mismatch"] {
        assert_eq!(outcome(case), (None, Some(PROTOCOL_ERROR), None), "{case}: {r}");
    }
    assert_eq!(outcome("trailers"), (Some(200), None, None), "{r}");
    let seen = b.record.requests.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "only the request with trailers reached a backend: {seen:#?}");
    assert!(seen[0].starts_with("POST /echo?case=trailers HTTP/1.1\r\nHost: shop.example\r\n"), "{seen:?}");
    assert!(seen[0].contains("\r\nTransfer-Encoding: chunked\r\n"), "{seen:?}");
    assert!(seen[0].ends_with("\r\n\r\n5\r\nhello\r\n0\r\nx-sum: 5\r\n\r\n"), "{seen:?}");
    assert!(!seen[0].contains("te:") && !seen[0].contains("TE:"), "te: trailers is hop-by-hop: {seen:?}");
    assert_eq!(goaways(b.tb(), "protocol_error", 5), 5);
}

/// Clients keeping four TLS connections busy (four streams each, requests taking
/// 100 ms) while the agent reloads twice: each reload ends the connections with a
/// graceful GOAWAY (NO_ERROR), the streams in flight finish, the clients reconnect for
/// the rest, and not one request fails; the clones saw each request the clients were
/// answered, once, and nothing else (no stream past a GOAWAY's last was forwarded).
#[test]
fn reload_sends_goaway_and_no_request_fails() {
    let b = h2_testbed(2, "drain_timeout = \"5s\"\n");
    let tb = b.tb();
    let load =
        py_spawn(&b, "load", with(b.tls(), json!({"path": "/slow/100", "conns": 4, "streams": 4, "seconds": 7})));
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(2000));
        let said = tb.dispatcher_cmd(&["reload", "--config", &b.bed.cfg]);
        assert!(said.contains("reloaded"), "{said}");
    }
    let r = py_wait(load).remove(0);
    assert_eq!(r["failed"], 0, "{r}");
    let ok = r["ok"].as_u64().unwrap();
    assert!(ok >= 400, "{r}");
    assert!(r["connections"].as_u64().unwrap() >= 12, "the clients reconnected after each reload: {r}");
    let codes = r["goaways"].as_array().unwrap();
    assert!(!codes.is_empty() && codes.iter().all(|c| c == NO_ERROR), "graceful GOAWAYs only: {r}");
    assert_eq!(b.cluster().hits().len() as u64, ok, "each answered request reached a clone once, nothing else did");
    let text = metrics(tb);
    assert!(sample(&text, "dispatcher_h2_goaways_total{reason=\"stop\"}") >= 8, "four connections, two reloads");
    assert_eq!(sample(&text, "dispatcher_h2_resets_sent_total{reason=\"cancel\"}"), 0);
    assert_h2_closed(tb);
}
