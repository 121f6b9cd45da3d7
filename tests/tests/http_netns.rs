//! The HTTP path end to end: clients with cookie jars -> XDP (pass) -> the agent on the
//! dispatcher -> WebSphere-like clones; and hostile input over a real socket.

use std::{
    collections::{HashMap, HashSet},
    io::{BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use dispatcher::api::{AgentStatus, BackendStatus, ChangeStatus, ClusterStatus, MemberStatus, SteeringStatus};
use dispatcher_testbed::{
    browser::Browser,
    netns::Testbed,
    websphere::{self, read_response, Client},
};

const VIP: &str = "10.99.100.8";
const PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;

fn http_testbed(
    n: usize,
    configured_clones: bool,
    http: &str,
) -> (Testbed, std::sync::Arc<websphere::Clones>, SocketAddr) {
    http_testbed_with(n, configured_clones, "", http)
}

/// `dispatcher`: extra lines for the `[dispatcher]` section; `http`: for `[http]`.
fn http_testbed_with(
    n: usize,
    configured_clones: bool,
    dispatcher: &str,
    http: &str,
) -> (Testbed, std::sync::Arc<websphere::Clones>, SocketAddr) {
    let mut tb = Testbed::new(n, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(n);
    let clones = if configured_clones { cluster.clone_ids.clone() } else { Vec::new() };
    tb.start_websphere(&cluster, BACKEND_PORT);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n{dispatcher}\n[http]\nheader_timeout = \"1s\"\n{http}\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = {PORT}\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config_with_clones(&[], &clones)
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    let addr: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    (tb, cluster, addr)
}

#[test]
fn sessions_stay_with_their_clone_across_connections() {
    let (tb, cluster, addr) = http_testbed(4, false, "");
    const CLIENTS: usize = 8;
    const REQUESTS: u64 = 120;
    let mut clients: Vec<Client> = (0..CLIENTS).map(|_| Client::new(&tb.client, addr)).collect();
    for i in 1..=REQUESTS {
        for c in clients.iter_mut() {
            if i % 25 == 0 {
                c.reconnect(); // several connections per session
            }
            let r = c.get("/app/counter").expect("response");
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(r.field("count"), Some(i.to_string().as_str()), "the session's counter continues: {r:?}");
            assert_eq!(r.field("lost"), Some("0"));
        }
    }
    // Every request of a session reached the clone its cookie names, and the new sessions
    // were spread over the clones.
    let hits = cluster.hits();
    assert_eq!(hits.len(), CLIENTS * REQUESTS as usize);
    let mut owner: HashMap<&str, usize> = HashMap::new();
    for h in &hits {
        let o = *owner.entry(h.session.as_str()).or_insert(h.backend);
        assert_eq!(o, h.backend, "session {} moved from clone {o} to {}", h.session, h.backend);
        if let Some(first) = h.cookie_clones.first() {
            assert_eq!(first, &cluster.clone_ids[h.backend], "served by the clone the cookie names");
        }
    }
    let used: HashSet<usize> = owner.values().copied().collect();
    assert_eq!(used.len(), 4, "{CLIENTS} sessions spread over the 4 clones: {owner:?}");
}

/// The cookie of a new session that `clone` created (its Set-Cookie teaches the
/// dispatcher which backend the clone ID is): new sessions are balanced round robin.
fn a_session_on(tb: &Testbed, addr: SocketAddr, clone: &str) -> String {
    for _ in 0..8 {
        let mut fresh = Client::new(&tb.client, addr);
        let r = fresh.get("/").unwrap();
        if r.field("clone") == Some(clone) {
            return fresh.jar.expect("a session cookie");
        }
    }
    panic!("round robin reaches {clone} within 8 new sessions");
}

#[test]
fn a_learned_clone_id_routes_every_later_request() {
    let (tb, _cluster, addr) = http_testbed(4, false, "");
    let mut c = Client::new(&tb.client, addr);
    c.jar = Some(a_session_on(&tb, addr, "clone2x"));
    for _ in 0..20 {
        c.reconnect();
        assert_eq!(c.get("/").unwrap().field("clone"), Some("clone2x"));
    }
    // The learned entry is in the shared CLONES map (owner b2, replica b3).
    let data = aya::maps::MapData::from_pin(tb.pin_dir().join("CLONES")).expect("pinned CLONES");
    let clones: aya::maps::HashMap<_, u64, dispatcher_common::CloneValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(data).unwrap()).unwrap();
    let v = clones.get(&dispatcher_common::hash::cookie_hash(b"clone2x"), 0).expect("clone2x in CLONES");
    assert_eq!((v.owner, v.replica), (2, 3));
}

#[test]
fn configured_clone_ids_route_without_learning() {
    let (tb, cluster, addr) = http_testbed(4, true, "");
    // A session the dispatcher has never seen a cookie for: the configured table routes it.
    for (i, id) in cluster.clone_ids.iter().enumerate() {
        let mut c = Client::new(&tb.client, addr);
        c.jar = Some(format!("0000UNSEEN{i}SESSION:{id}"));
        let r = c.get("/").unwrap();
        assert_eq!(r.field("clone"), Some(id.as_str()), "cookie naming {id}");
    }
    // Several clone IDs: the first one whose backend is up.
    let mut c = Client::new(&tb.client, addr);
    c.jar = Some(format!("0000UNSEENMULTI:nosuchclone:{}:{}", cluster.clone_ids[3], cluster.clone_ids[1]));
    assert_eq!(c.get("/").unwrap().field("clone"), Some(cluster.clone_ids[3].as_str()));
}

#[test]
fn url_rewritten_session_id_is_honoured() {
    let (tb, _cluster, addr) = http_testbed(2, false, "");
    let mut c = Client::new(&tb.client, addr);
    let first = c.get("/app").unwrap();
    let clone = first.field("clone").unwrap().to_string();
    let id = c.jar.take().unwrap();
    // No cookie now: the ID travels in the URL, as with cookies disabled.
    for i in 2..=10 {
        let r = c.get(&format!("/app/page;jsessionid={id}?q=1")).unwrap();
        assert_eq!(r.field("clone"), Some(clone.as_str()));
        assert_eq!(r.field("count"), Some(i.to_string().as_str()));
    }
}

/// Sends raw bytes on a new connection and returns the status the proxy answered with
/// (0 when it closed without answering).
fn raw_status(tb: &Testbed, addr: SocketAddr, bytes: &[u8]) -> u16 {
    let s = tb.client.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut w = s.try_clone().unwrap();
    let _ = w.write_all(bytes);
    let mut r = BufReader::new(s);
    read_response(&mut r).map(|r| r.status).unwrap_or(0)
}

#[test]
fn hostile_requests_get_their_status_over_a_socket() {
    let (tb, cluster, addr) = http_testbed(2, false, "");
    let cases: &[(&str, &[u8], u16)] = &[
        (
            "CL and TE",
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        ("two CL", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", 400),
        ("CL +1", b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +1\r\n\r\nx", 400),
        (
            "TE chunked, chunked",
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
            400,
        ),
        ("TE gzip", b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 400),
        ("space before colon", b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
        ("obs-fold", b"GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 400),
        ("bare LF", b"GET / HTTP/1.1\nHost: x\n\n", 400),
        ("no Host", b"GET / HTTP/1.1\r\n\r\n", 400),
        ("two Host", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        ("HTTP/1.32", b"GET / HTTP/1.32\r\nHost: x\r\n\r\n", 400),
        ("GET *", b"GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("CONNECT", b"CONNECT / HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        ("NUL in a value", b"GET / HTTP/1.1\r\nHost: x\r\nX: a\0b\r\n\r\n", 400),
    ];
    for (what, bytes, want) in cases {
        assert_eq!(raw_status(&tb, addr, bytes), *want, "{what}");
        assert!(cluster.hits().is_empty(), "{what}: reached a backend: {:?}", cluster.hits());
    }
    // Every variant TESTING.md lists, generated.
    let post = |hs: &str| format!("POST / HTTP/1.1\r\nHost: x\r\n{hs}\r\n");
    let mut variants: Vec<(String, String)> = Vec::new();
    for cl in ["+1", "-1", "0x10", "1.5", "abc", "1Z", "", "0,"] {
        variants.push((format!("Content-Length: {cl:?}"), post(&format!("Content-Length: {cl}\r\n"))));
    }
    for (a, b) in [("0", "0"), ("0", "31"), ("", "5")] {
        variants.push((
            format!("Content-Length {a:?} and {b:?}"),
            post(&format!("Content-Length: {a}\r\nContent-Length: {b}\r\n")),
        ));
    }
    for te in [
        "chunked, chunked",
        "chunked, gzip",
        "gzip",
        ",chunked",
        "identity",
        "chunked\x0b",
        "chunked\x0c",
        "chunked\u{a0}",
        "chunked\u{ff}",
    ] {
        variants.push((format!("Transfer-Encoding: {te:?}"), post(&format!("Transfer-Encoding: {te}\r\n"))));
    }
    variants.push(("two TE headers".into(), post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n")));
    for (what, line) in [
        ("line without a colon", "NoColon\r\n"),
        ("empty header name", ": v\r\n"),
        ("bare CR in a value", "X: a\rb\r\n"),
        ("byte 0x80 in a name", "X\u{80}Y: v\r\n"),
    ] {
        variants.push((what.into(), format!("GET / HTTP/1.1\r\nHost: x\r\n{line}\r\n")));
    }
    variants.push(("leading whitespace on the first header".into(), "GET / HTTP/1.1\r\n Host: x\r\n\r\n".into()));
    variants.push(("huge version".into(), "GET / HTTP/1.10000000000000\r\nHost: x\r\n\r\n".into()));
    variants.push(("missing target".into(), "GET HTTP/1.1\r\nHost: x\r\n\r\n".into()));
    for (what, req) in &variants {
        assert_eq!(raw_status(&tb, addr, req.as_bytes()), 400, "{what}");
    }
    assert!(cluster.hits().is_empty(), "no malformed request reached a backend");
    let many: String = (0..150).map(|i| format!("X-{i}: v\r\n")).collect();
    assert_eq!(raw_status(&tb, addr, format!("GET / HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes()), 431);
    let big = format!("GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n", "a".repeat(20_000));
    assert_eq!(raw_status(&tb, addr, big.as_bytes()), 431);
    assert!(cluster.hits().is_empty(), "no hostile request reached a backend");
    // Body errors show only once the head is on its way upstream (bodies are streamed):
    // the client still gets 400 and the connection closes.
    let bad_chunks: &[&[u8]] = &[
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x1\r\na\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\na\r\n0\r\n\r\n",
    ];
    for bytes in bad_chunks {
        assert_eq!(raw_status(&tb, addr, bytes), 400, "{}", String::from_utf8_lossy(bytes));
    }
    for size in ["0x1", "+1", " 0", "-0", "0_2", "Z", ""] {
        let req = format!("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{size}\r\n\r\n");
        assert_eq!(raw_status(&tb, addr, req.as_bytes()), 400, "chunk size {size:?}");
    }
    // A good request on the same proxy still works.
    assert_eq!(raw_status(&tb, addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 200);
}

#[test]
fn header_trickle_gets_408_at_the_total_deadline() {
    let (tb, _cluster, addr) = http_testbed(2, false, "");
    let s = tb.client.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3))).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = s;
    let start = Instant::now();
    let head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut got = Vec::new();
    // One byte every 100 ms: each read is quick, the head never completes.
    for b in head.iter() {
        if w.write_all(&[*b]).is_err() {
            break;
        }
        let mut buf = [0u8; 256];
        if let Ok(n) = r.read(&mut buf) {
            got.extend_from_slice(&buf[..n]);
            if n == 0 || !got.is_empty() {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "got {text:?}");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "408 at the 1s header deadline, after {took:?}"
    );
}

#[test]
fn operator_drain_and_disable_reach_the_request_path() {
    let (tb, cluster, addr) = http_testbed(4, false, "");
    let cfg = tb.workdir.join("dispatcher.toml");
    let cfg = cfg.to_str().unwrap();
    let mut clients: Vec<Client> = (0..8).map(|_| Client::new(&tb.client, addr)).collect();
    for i in 1..=10u64 {
        for c in clients.iter_mut() {
            assert_eq!(c.get("/").unwrap().field("count"), Some(i.to_string().as_str()));
        }
    }
    // The clone that owns a session now: the last ID in its cookie.
    let owner_of = |c: &Client| {
        c.jar
            .as_ref()
            .and_then(|j| j.split(':').next_back())
            .map(|id| id.trim_start_matches("clone").trim_end_matches('x').parse::<usize>().unwrap())
            .unwrap()
    };
    let before: Vec<usize> = clients.iter().map(owner_of).collect();
    assert!(before.contains(&0) && before.contains(&1), "{before:?}");

    tb.dispatcher_cmd(&["drain", "--config", cfg, "b1"]);
    tb.dispatcher_cmd(&["disable", "--config", cfg, "b0"]);
    std::thread::sleep(Duration::from_millis(600)); // the agent follows the maps every 200 ms
    let mark = cluster.hits().len();
    for i in 11..=30u64 {
        for c in clients.iter_mut() {
            let r = c.get("/").unwrap();
            assert_eq!(r.field("count"), Some(i.to_string().as_str()), "session data kept: {r:?}");
            assert_eq!(r.field("lost"), Some("0"));
        }
    }
    for h in &cluster.hits()[mark..] {
        assert_ne!(h.backend, 0, "nothing reaches the disabled clone");
    }
    for (k, &b) in before.iter().enumerate() {
        let now = owner_of(&clients[k]);
        match b {
            0 => assert_eq!(now, 1, "b0 sessions moved to its replica b1: {:?}", clients[k].jar),
            _ => assert_eq!(now, b, "other sessions stay (b1 drains: it keeps its own)"),
        }
    }
    // New sessions: neither the disabled nor the draining clone.
    for _ in 0..8 {
        let mut fresh = Client::new(&tb.client, addr);
        let clone = fresh.get("/").unwrap().field("clone").unwrap().to_string();
        assert!(clone != "clone0x" && clone != "clone1x", "new session on {clone}");
    }
}

/// Two backends that served five requests, and the configuration file's path.
fn two_backends_after_five_requests() -> (Testbed, String) {
    let (tb, _cluster, addr) = http_testbed(2, false, "");
    let cfg = tb.workdir.join("dispatcher.toml").to_str().unwrap().to_string();
    let mut c = Client::new(&tb.client, addr);
    for _ in 0..5 {
        assert_eq!(c.get("/").unwrap().status, 200);
    }
    (tb, cfg)
}

#[test]
fn admin_endpoint_serves_metrics_status_and_commands() {
    let (tb, cfg) = two_backends_after_five_requests();
    let cfg = cfg.as_str();
    // Owner-only Unix socket: nothing listens on the network for the admin side.
    let sock = format!("/run/dispatcher/{}.sock", tb.instance());
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let meta = std::fs::metadata(&sock).expect("admin socket");
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);

    let metrics = tb.dispatcher_cmd(&["metrics", "--config", cfg]);
    for needle in [
        "dispatcher_misroutes_total 0",
        "dispatcher_backend_state{backend=\"b0\"} 1",
        "dispatcher_vip_response_seconds_count{vip=\"app\"} 5",
        "# TYPE dispatcher_backend_response_seconds histogram",
        "dispatcher_xdp_events_total{reason=\"pass_http\"}",
        "dispatcher_learned_clones_total 1",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from:\n{metrics}");
    }
    let requests: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("dispatcher_backend_requests_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(requests, 5);

    let out = tb.dispatcher_cmd(&["drain", "--config", cfg, "b1"]);
    assert_eq!(out.trim(), "b1: up -> drain", "through the agent, which answers with the result");
    let status = tb.dispatcher_cmd(&["status", "--config", cfg, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(st["agent"]["backends"][1]["admin"], "drain", "{status}");
    assert_eq!(st["backends"][1]["state"], "drain", "written to BACKENDS too: {status}");
    let out = tb.dispatcher_cmd(&["enable", "--config", cfg, "b1"]);
    assert_eq!(out.trim(), "b1: drain -> up");

    // Per-VIP requests and per-backend upstream connections, in JSON and in the table.
    assert_eq!(st["agent"]["vips"][0]["requests"], 5, "{status}");
    let conns: u64 = (0..2).map(|i| st["agent"]["backends"][i]["connections"].as_u64().unwrap()).sum();
    assert!(conns >= 1, "pooled upstream connections are counted: {status}");
    let table = tb.dispatcher_cmd(&["status", "--config", cfg]);
    let vip_row = table.lines().find(|l| l.starts_with("app ")).expect("a VIP row");
    let cols: Vec<&str> = vip_row.split_whitespace().collect();
    assert_eq!(cols[2], "http", "{table}");
    assert_eq!(cols[cols.len() - 2], "5", "REQUESTS column: {table}");
    assert!(table.contains("CONNS") && table.contains("agent running"), "{table}");
    assert!(table.contains("flow table 0 of 1048576 entries (0.0%)"), "occupancy of the flow table: {table}");
}

/// The admin endpoint on TCP serves the metrics to anyone who can reach it (that is
/// what Prometheus needs) and the status to loopback clients; commands only on the Unix
/// socket, and there only to root and the agent's user.
#[test]
fn admin_endpoint_refuses_clients_that_are_not_local() {
    let (tb, _cluster, addr) = http_testbed_with(2, false, "admin_address = \"0.0.0.0:9901\"\n", "");
    let cfg = tb.workdir.join("dispatcher.toml");
    let cfg = cfg.to_str().unwrap();
    assert_eq!(Client::new(&tb.client, addr).get("/").unwrap().status, 200);
    let admin: SocketAddr = format!("{VIP}:9901").parse().unwrap();
    let ask_as = |ns: &dispatcher_testbed::netns::Ns, to: SocketAddr, host: String, method: &str, path: &str| {
        let request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n");
        ns.run(move || {
            let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2)).expect("admin port");
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            // (A refused connection may be closed before the request is written.)
            let _ = s.write_all(request.as_bytes());
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
    };
    let ask = |ns: &dispatcher_testbed::netns::Ns, to: SocketAddr, method: &str, path: &str| {
        ask_as(ns, to, to.to_string(), method, path)
    };
    let status_line = |r: &str| r.lines().next().unwrap_or("").to_string();
    // From the client's namespace (not local): metrics yes, nothing else.
    let r = ask(&tb.client, admin, "GET", "/metrics");
    assert!(status_line(&r).contains(" 200 ") && r.contains("dispatcher_misroutes_total 0"), "{r}");
    for (m, p) in [
        ("GET", "/status"),
        ("GET", "/"),
        ("GET", "/status.html"),
        ("POST", "/backends/b0/drain"),
        ("POST", "/reload"),
        ("POST", "/stop?detach=true"),
    ] {
        let r = ask(&tb.client, admin, m, p);
        assert!(status_line(&r).contains(" 403 "), "{m} {p} from a remote client: {r}");
    }
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", cfg, "--json"])).unwrap();
    assert_eq!(st["agent"]["backends"][0]["state"], "up", "the refused drain changed nothing: {st}");
    assert!(tb.log("dispatcher").contains("admin request refused"), "refusals are logged");
    // From loopback on the dispatcher's host (any local user can connect there): status
    // yes, commands no.
    let local: SocketAddr = "127.0.0.1:9901".parse().unwrap();
    let r = ask(&tb.lb, local, "GET", "/status");
    assert!(status_line(&r).contains(" 200 ") && r.contains("\"backends\""), "{r}");
    // ... when asked for by an address or localhost: a browser that sends a name may be
    // reading for a page of another site that rebound that name to 127.0.0.1.
    let r = ask_as(&tb.lb, local, "localhost:9901".into(), "GET", "/status");
    assert!(status_line(&r).contains(" 200 "), "{r}");
    for path in ["/status", "/"] {
        let r = ask_as(&tb.lb, local, "status.example.com:9901".into(), "GET", path);
        assert!(status_line(&r).contains(" 403 ") && r.contains("DNS rebinding"), "{path} for a name: {r}");
    }
    let r = ask_as(&tb.lb, local, "status.example.com".into(), "GET", "/metrics");
    assert!(status_line(&r).contains(" 200 "), "metrics for any Host (Prometheus targets may be names): {r}");
    for (m, p) in [("POST", "/backends/b0/drain"), ("POST", "/reload"), ("POST", "/stop?detach=true")] {
        let r = ask(&tb.lb, local, m, p);
        assert!(status_line(&r).contains(" 403 ") && r.contains("Unix socket"), "{m} {p} over loopback TCP: {r}");
    }
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", cfg, "--json"])).unwrap();
    assert_eq!(st["agent"]["backends"][0]["state"], "up", "the refused drain changed nothing: {st}");

    // At most 64 admin connections at once, and a flood of idle ones does not lock out
    // the metrics: a newcomer takes the slot of the oldest connection that has sent no
    // request head (idle ones are closed after 2 s anyway).
    let idle: Vec<TcpStream> = tb.client.run(move || {
        (0..64).map(|_| TcpStream::connect_timeout(&admin, Duration::from_secs(2)).expect("connect")).collect()
    });
    std::thread::sleep(Duration::from_millis(200));
    let r = ask(&tb.lb, local, "GET", "/metrics");
    assert!(status_line(&r).contains(" 200 "), "the 65th connection is served in an idle one's slot: {r}");
    // The evicted idle connection was closed by the agent (one of them reads EOF).
    let closed = idle
        .iter()
        .filter(|s| {
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut r: &TcpStream = s;
            matches!(std::io::Read::read(&mut r, &mut [0u8; 1]), Ok(0))
        })
        .count();
    assert!(closed >= 1, "an idle connection made room");
    // The operator's socket has its own budget: the TCP flood does not lock it out.
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", cfg, "--json"])).unwrap();
    assert_eq!(st["agent"]["backends"][0]["state"], "up", "the socket still answers: {st}");
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    let r = ask(&tb.lb, local, "GET", "/metrics");
    assert!(status_line(&r).contains(" 200 "), "served again once they are gone: {r}");

    // The Unix socket: another user cannot connect (mode 0600)...
    let sock = format!("/run/dispatcher/{}.sock", tb.instance());
    let as_nobody = |args: &[&str]| {
        use std::os::unix::process::CommandExt;
        let out = std::process::Command::new(dispatcher_testbed::netns::dispatcher_bin())
            .args(args)
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
    };
    let (code, out) = as_nobody(&["metrics", "--config", cfg]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("ermission denied"), "{out}");
    // ...and if an operator widens the mode, the agent still serves it only the metrics.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (code, out) = as_nobody(&["metrics", "--config", cfg]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("dispatcher_misroutes_total"), "{out}");
    let (code, out) = as_nobody(&["drain", "--config", cfg, "b1"]);
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(code, Some(1), "{out}");
    // Said in words (never the agent's JSON): what it serves to such a client.
    assert!(out.contains("only GET /metrics is served to clients that are not on this host"), "{out}");
    assert!(!out.contains('{'), "{out}");
}

/// The status page in a real browser: headless Chromium on the agent's host, over
/// loopback, keeps one page open while a backend fails. The page's own script (run under
/// the page's Content-Security-Policy) fills in the VIP and the backends from /status,
/// then shows the failed backend down with the agent's reason, then shows the agent
/// unreachable when it stops. The screenshot is kept in target/.
#[test]
fn the_status_page_shows_a_backend_going_down_in_a_browser() {
    let (mut tb, _cluster, addr) = http_testbed_with(2, false, "admin_address = \"127.0.0.1:9901\"\n", "");
    let mut client = Client::new(&tb.client, addr);
    for _ in 0..20 {
        assert_eq!(client.get("/").expect("response").status, 200);
    }
    // Served with its headers to loopback readers (other hosts: admin_endpoint_refuses_...).
    let get_page = |to: &'static str| {
        tb.lb.run(move || {
            let mut s = TcpStream::connect_timeout(&to.parse().unwrap(), Duration::from_secs(2)).expect("admin port");
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            write!(s, "GET / HTTP/1.1\r\nHost: {to}\r\n\r\n").unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
    };
    let answer = get_page("127.0.0.1:9901");
    let head = answer.split("\r\n\r\n").next().unwrap_or("");
    for field in [
        "HTTP/1.1 200 OK",
        "Content-Type: text/html; charset=utf-8",
        "Cache-Control: no-store",
        "X-Content-Type-Options: nosniff",
        "Content-Security-Policy: default-src 'none'; script-src 'sha256-",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(head.contains(field), "{field} in {head}");
    }
    assert!(answer.contains("<canvas id=\"chart\""), "the page: {answer}");
    let log = tb.workdir.join("chromium.log");
    let mut page = Browser::open(&tb.lb, "http://127.0.0.1:9901/", (1200, 1000), &log);
    const ROWS: &str =
        "[...document.querySelectorAll('#backends tbody tr')].map(r => [...r.cells].map(c => c.textContent))";
    let rows = |v: &serde_json::Value| -> Vec<Vec<String>> { serde_json::from_value(v.clone()).unwrap_or_default() };
    // name, state, health, operator, ..., last change, reason, at
    let state_of = |v: &serde_json::Value, name: &str| rows(v).into_iter().find(|r| r[0] == name).map(|r| r[1].clone());
    let shown = page.wait_for("both backends shown up", Duration::from_secs(15), ROWS, |v| {
        state_of(v, "b0").as_deref() == Some("up") && state_of(v, "b1").as_deref() == Some("up")
    });
    assert_eq!(rows(&shown).len(), 2, "{shown}");
    let vip: Vec<String> =
        serde_json::from_value(page.eval("[...document.querySelectorAll('#vips tbody td')].map(c => c.textContent)"))
            .unwrap();
    assert_eq!(vip[..4], ["app", VIP, &PORT.to_string(), "http"], "the VIP row: {vip:?}");
    assert!(vip[4].parse::<u64>().is_ok_and(|n| n >= 20), "the VIP's requests: {vip:?}");
    let farm = page.eval("document.querySelector('#paths tbody td').textContent");
    assert_eq!(farm, "farm app", "the VIP's farm and its sessions' figures");
    // Traffic while the page polls: the chart draws the rate of the backend that serves
    // it above its zero line (pixels of b0's or b1's colour, the legend's first two, in
    // the requests panel: rows 12 to 108 of the canvas, its bottom line left out).
    for _ in 0..25 {
        assert_eq!(client.get("/").expect("response").status, 200);
        std::thread::sleep(Duration::from_millis(200));
    }
    const LINE_PIXELS: &str = "(() => { const c = document.getElementById('chart'); \
        const d = c.getContext('2d').getImageData(0, 12, c.width, 96).data; let n = 0; \
        const near = (i, r, g, b) => Math.abs(d[i] - r) + Math.abs(d[i + 1] - g) + Math.abs(d[i + 2] - b) < 40; \
        for (let i = 0; i < d.length; i += 4) if (near(i, 0x1f, 0x77, 0xb4) || near(i, 0xd6, 0x27, 0x28)) n++; \
        return n; })()";
    page.wait_for("a request rate on the chart", Duration::from_secs(10), LINE_PIXELS, |v| v.as_u64() > Some(30));

    // L4 and SIP VIPs (forwarded in XDP) have a table of their own: one added by a reload
    // appears in it.
    let cfg = tb.workdir.join("dispatcher.toml");
    assert_eq!(page.eval("document.getElementById('xdp-vips').hidden"), true, "no L4 VIP yet: no table");
    let l4 = "\n[[vip]]\nname = \"fwd\"\naddress = \"10.99.100.30\"\nport = 9000\nring_size = 1009\n";
    std::fs::write(&cfg, std::fs::read_to_string(&cfg).unwrap() + l4).unwrap();
    let out = tb.dispatcher_cmd(&["reload", "--config", cfg.to_str().unwrap()]);
    assert!(out.contains("reloaded"), "{out}");
    const XDP_ROWS: &str =
        "[...document.querySelectorAll('#xdp-vips tbody tr')].map(r => [...r.cells].map(c => c.textContent))";
    let xdp = page.wait_for("the L4 VIP shown", Duration::from_secs(10), XDP_ROWS, |v| rows(v).len() == 1);
    assert_eq!(rows(&xdp)[0][..6], ["fwd", "10.99.100.30", "9000", "tcp", "l4", "0"], "{xdp}");
    assert_eq!(page.eval("document.getElementById('xdp-vips').hidden"), false);

    // b1 fails while the page stays open.
    tb.kill_servers_of(1);
    let shown =
        page.wait_for("b1 shown down", Duration::from_secs(20), ROWS, |v| state_of(v, "b1").as_deref() == Some("down"));
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", cfg.to_str().unwrap(), "--json"])).unwrap();
    let agent_b1 = &st["agent"]["backends"][1];
    assert_eq!(agent_b1["name"], "b1");
    let b1 = rows(&shown).into_iter().find(|r| r[0] == "b1").unwrap();
    let reason = agent_b1["last_change"]["reason"].as_str().expect("the agent's reason");
    assert!(!reason.is_empty());
    assert_eq!(b1[9], reason, "the page shows the agent's reason: {b1:?}");
    assert!(b1[8].ends_with("down"), "the change shown: {b1:?}");
    assert_eq!(state_of(&shown, "b0").as_deref(), Some("up"), "{shown}");
    let conn = page.eval("document.getElementById('conn').textContent");
    assert!(conn.as_str().unwrap_or("").starts_with("live"), "{conn}");
    let cell_class = page.eval("document.querySelector('#backends tr[data-backend=b1] td:nth-child(2)').className");
    assert_eq!(cell_class, "st-down");
    let legend = page.eval("document.getElementById('legend').textContent");
    assert_eq!(legend, "b0b1", "one chart line per backend");

    let png = page.screenshot();
    assert_eq!(dispatcher_testbed::browser::png_size(&png), Some((1200, 1000)), "a PNG of the window");
    // A blank 1200x1000 page compresses to a few KiB; tables, colours and a chart do not.
    assert!(png.len() > 20_000, "a screenshot with something on it: {} bytes", png.len());
    let kept = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/status-page.png");
    std::fs::write(&kept, &png).unwrap();

    // The agent goes away: the page says so instead of showing old numbers as current.
    tb.stop("dispatcher");
    page.wait_for(
        "the agent shown unreachable",
        Duration::from_secs(15),
        "document.getElementById('conn').textContent",
        |v| v.as_str().is_some_and(|t| t.starts_with("STALE: agent unreachable")),
    );

    // A hostile status (the configuration allows no such name, other sources of text may
    // be less careful): the browser answers the page's next poll with it, and the page
    // shows it as text — no element made of it, no script run.
    page.intercept("*/status");
    let hostile = r#"<img src=x onerror="document.title='pwned'"><b>b9</b>"#;
    // In the agent's own types, so that the fake has the real shape; with a cluster (its
    // section appears) whose member names are hostile too.
    let status = AgentStatus {
        pid: 1,
        backends: vec![BackendStatus {
            name: hostile.into(),
            state: "<i>up</i>".into(),
            last_change: Some(ChangeStatus {
                from: "up".into(),
                to: "down".into(),
                reason: "</td><script>document.title='pwned'</script>".into(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        cluster: Some(ClusterStatus {
            name: "d1".into(),
            store: "ok".into(),
            members: vec![
                MemberStatus { name: "d1".into(), version: "0.1.0".into(), joined: true, ..Default::default() },
                MemberStatus { name: hostile.into(), down: vec!["b0".into()], ..Default::default() },
            ],
            ..Default::default()
        }),
        steering: Some(SteeringStatus {
            active: true,
            generation: 3,
            dispatchers: vec!["d1".into(), hostile.into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let status = dispatcher::api::to_json(&status);
    let url = page.answer_next("application/json", &status, Duration::from_secs(10));
    assert!(url.ends_with("/status"), "{url}");
    let shown = page.wait_for("the hostile status shown", Duration::from_secs(5), ROWS, |v| rows(v).len() == 1);
    let row = &rows(&shown)[0];
    assert_eq!((row[0].as_str(), row[1].as_str()), (hostile, "<i>up</i>"), "as text: {row:?}");
    assert_eq!(row[9], "</td><script>document.title='pwned'</script>");
    assert_eq!(page.eval("document.querySelectorAll('#backends tbody :not(tr):not(td)').length"), 0, "only cells");
    assert_eq!(page.eval("document.getElementById('legend').textContent"), hostile, "the chart's legend, as text");
    assert_eq!(page.eval("document.getElementById('cluster').hidden"), false, "the cluster's section is shown");
    let members: Vec<Vec<String>> = serde_json::from_value(
        page.eval("[...document.querySelectorAll('#members tbody tr')].map(r => [...r.cells].map(c => c.textContent))"),
    )
    .unwrap();
    assert_eq!(members[0], ["d1", "0.1.0", "0", "yes", ""]);
    assert_eq!(members[1], [hostile, "", "0", "no", "b0"]);
    let steering = page.eval("document.getElementById('steering').textContent");
    assert!(steering.as_str().unwrap_or("").contains(&format!("generation 3, owners: d1, {hostile}")), "{steering}");
    const MADE_OF_TEXT: &str = "document.querySelectorAll('#cluster :not(h2):not(p):not(table):not(thead):not(tbody)\
        :not(tr):not(th):not(td)').length";
    assert_eq!(page.eval(MADE_OF_TEXT), 0, "nothing in the cluster's section but its own elements");
    assert_eq!(page.eval("document.querySelectorAll('#legend img, #legend b, main script').length"), 0);
    assert_eq!(page.eval("document.title"), "dispatcher status");
}

/// `dispatcher reload` applies a new `log_level` without a restart.
#[test]
fn reload_changes_the_log_level() {
    let (tb, _cluster, _addr) = http_testbed(2, false, "");
    let cfg_path = tb.workdir.join("dispatcher.toml");
    let cfg = cfg_path.to_str().unwrap();
    tb.dispatcher_cmd(&["metrics", "--config", cfg]);
    assert!(!tb.log("dispatcher").contains("admin request"), "no debug lines at info");
    let text = std::fs::read_to_string(&cfg_path).unwrap();
    tb.write_config(&text.replace("[dispatcher]\n", "[dispatcher]\nlog_level = \"info,dispatcher::admin=debug\"\n"));
    let out = tb.dispatcher_cmd(&["reload", "--config", cfg]);
    assert!(out.contains("log level info,dispatcher::admin=debug"), "{out}");
    tb.dispatcher_cmd(&["metrics", "--config", cfg]);
    let log = tb.log("dispatcher");
    assert!(log.contains("admin request") && log.contains("/metrics"), "debug lines after the reload:\n{log}");
}

#[test]
fn an_agent_killed_hard_is_replaced_without_losing_learned_clones() {
    let (mut tb, _cluster, addr) = http_testbed(4, false, "");
    let cfg = tb.workdir.join("dispatcher.toml");
    let mut b2_cookie = None;
    for _ in 0..8 {
        let mut fresh = Client::new(&tb.client, addr);
        if fresh.get("/").unwrap().field("clone") == Some("clone2x") {
            b2_cookie = fresh.jar.clone();
        }
    }
    let b2_cookie = b2_cookie.expect("a session on b2");
    let before: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", cfg.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(before["agent"]["clones"], 4, "{before}");

    tb.kill_hard("dispatcher");
    tb.start_dispatcher(&cfg);
    let after: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", cfg.to_str().unwrap(), "--json"])).unwrap();
    assert_eq!(after["agent"]["clones"], 4, "learned entries adopted from the pinned map: {after}");
    // No new Set-Cookie needed: the session goes to b2 at once, every time.
    for _ in 0..10 {
        let mut c = Client::new(&tb.client, addr);
        c.jar = Some(b2_cookie.clone());
        assert_eq!(c.get("/").unwrap().field("clone"), Some("clone2x"));
    }
}

/// `maxconn`/`maxqueue` on a backend: at most `maxconn` requests in flight on it, the
/// next `maxqueue` of its sessions' requests wait (and are served in turn), more get 503
/// with Retry-After at once; none of them goes to another server. Requests without a
/// session go to a server with room meanwhile.
#[test]
fn maxconn_queues_a_sessions_requests_at_its_owner_and_balances_the_rest_elsewhere() {
    let (mut tb, cluster) = clone_bed(2);
    let backends = tb.backend_config_with(&[], |i| {
        let limits = if i == 0 { "maxconn = 2\nmaxqueue = 2\n" } else { "" };
        format!("clone_ids = [\"{}\"]\n{limits}", cluster.clone_ids[i])
    });
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nqueue_timeout = \"5s\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n{backends}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = {PORT}\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nring_size = 1009\n",
        tb.instance(),
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    let cfg = path.to_str().unwrap().to_string();
    let addr: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();

    // 8 requests of clone0x's sessions at once, each taking 600 ms at the server.
    let run = |n: usize, cookie: Option<&str>, path: &'static str| {
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(n));
        let threads: Vec<_> = (0..n)
            .map(|k| {
                let (ns, barrier) = (tb.client.clone(), barrier.clone());
                let jar = cookie.map(|c| format!("0000QUEUE{k}SESSION:{c}"));
                std::thread::spawn(move || {
                    let mut c = Client::new(&ns, addr);
                    c.jar = jar;
                    barrier.wait();
                    let t = Instant::now();
                    let r = c.get(path).expect("an answer");
                    (
                        r.status,
                        r.header("retry-after").is_some(),
                        r.field("clone").unwrap_or("").to_string(),
                        t.elapsed(),
                    )
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
    };
    let answers = run(8, Some("clone0x"), "/slow/600");
    let served: Vec<_> = answers.iter().filter(|a| a.0 == 200).collect();
    let refused: Vec<_> = answers.iter().filter(|a| a.0 == 503).collect();
    assert_eq!((served.len(), refused.len()), (4, 4), "2 in flight + 2 queued served, 4 refused: {answers:?}");
    assert!(served.iter().all(|a| a.2 == "clone0x"), "a session's request waits for its owner: {answers:?}");
    assert!(
        refused.iter().all(|a| a.1 && a.3 < Duration::from_millis(500)),
        "refused at once, with Retry-After: {refused:?}"
    );
    let waited = served.iter().filter(|a| a.3 >= Duration::from_millis(1100)).count();
    assert_eq!(waited, 2, "two waited for a slot (a whole request's time): {served:?}");
    assert!(cluster.busy_max[0].load(std::sync::atomic::Ordering::SeqCst) <= 2, "never more than maxconn at b0");
    assert_eq!(cluster.hits().iter().filter(|h| h.backend == 1).count(), 0, "nothing went to b1");

    // b0 busy with two of its sessions' requests: new sessions all go to b1, which has room.
    let busy = {
        let ns = tb.client.clone();
        std::thread::spawn(move || {
            let threads: Vec<_> = (0..2)
                .map(|k| {
                    let ns = ns.clone();
                    std::thread::spawn(move || {
                        let mut c = Client::new(&ns, addr);
                        c.jar = Some(format!("0000BUSY{k}SESSION:clone0x"));
                        c.get("/slow/1500").map(|r| r.status)
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect::<Vec<_>>()
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let fresh = run(6, None, "/slow/200");
    assert!(fresh.iter().all(|a| a.0 == 200 && a.2 == "clone1x"), "new sessions go where there is room: {fresh:?}");
    assert_eq!(busy.join().unwrap(), [200, 200]);

    // Status and metrics show the queue.
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
    let q = &st["agent"]["backends"][0]["queue"];
    assert_eq!((q["maxconn"].as_u64(), q["maxqueue"].as_u64()), (Some(2), Some(2)), "{q}");
    assert_eq!(
        (q["queued_total"].as_u64(), q["refused_full"].as_u64(), q["queued"].as_u64()),
        (Some(2), Some(4), Some(0))
    );
    assert!(q["wait_mean_ms"].as_f64().unwrap() >= 300.0, "{q}");
    assert!(st["agent"]["backends"][1].get("queue").is_none(), "no limit, no queue");
    let metrics = tb.dispatcher_cmd(&["metrics", "--config", &cfg]);
    for line in [
        "dispatcher_backend_maxconn{backend=\"b0\"} 2",
        "dispatcher_backend_queue_length{backend=\"b0\"} 0",
        "dispatcher_backend_queued_total{backend=\"b0\"} 2",
        "dispatcher_backend_queue_refused_total{backend=\"b0\",reason=\"full\"} 4",
        "dispatcher_backend_queue_refused_total{backend=\"b0\",reason=\"left\"} 0",
        "dispatcher_backend_queue_seconds_count{backend=\"b0\"} 2",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    let text = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(text.contains("queue b0: 0 of maxconn 2 in flight, 0 of 2 queued; queued 2"), "{text}");

    // A request queued at b0 whose server is disabled while it waits leaves the queue at
    // once and goes to b0's replica, without waiting for a slot of the server that left.
    let session_request = |path: &'static str, k: usize| {
        let ns = tb.client.clone();
        std::thread::spawn(move || {
            let mut c = Client::new(&ns, addr);
            c.jar = Some(format!("0000LEFT{k}SESSION:clone0x"));
            let t = Instant::now();
            c.get(path).map(|r| (r.status, r.field("clone").unwrap_or("").to_string(), t.elapsed()))
        })
    };
    let busy: Vec<_> = (0..2).map(|k| session_request("/slow/3000", k)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let queued = session_request("/slow/10", 2);
    std::thread::sleep(Duration::from_millis(300));
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
    assert_eq!(st["agent"]["backends"][0]["queue"]["queued"].as_u64(), Some(1), "it waits in b0's queue");
    tb.dispatcher_cmd(&["disable", "--config", &cfg, "b0"]);
    let (status, clone, took) = queued.join().unwrap().unwrap();
    assert_eq!((status, clone.as_str()), (200, "clone1x"), "routed again: to the replica");
    assert!(took < Duration::from_millis(2000), "without waiting for b0's requests to end: {took:?}");
    for b in busy {
        let (status, clone, _) = b.join().unwrap().unwrap();
        assert_eq!((status, clone.as_str()), (200, "clone0x"), "in flight: finished where it was");
    }
}

/// `n` WebSphere-like clones answering at `BACKEND_PORT` behind the local `VIP`.
fn clone_bed(n: usize) -> (Testbed, std::sync::Arc<websphere::Clones>) {
    let mut tb = Testbed::new(n, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(n);
    tb.start_websphere(&cluster, BACKEND_PORT);
    (tb, cluster)
}

/// `[access_log]`: one line per request with what happened to it, the file reopened on
/// reload (rotation loses no line), JSON or HAProxy's layout.
#[test]
fn the_access_log_records_every_request_and_follows_rotation() {
    let (mut tb, cluster) = clone_bed(2);
    let log = tb.workdir.join("access.log");
    let (instance, backends) = (tb.instance().to_string(), tb.backend_config_with_clones(&[], &cluster.clone_ids));
    let config = |format: &str| {
        format!(
            "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{instance}\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n[access_log]\npath = \"{}\"\nformat = \"{format}\"\n\n{backends}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = {PORT}\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nring_size = 1009\n",
            log.display(),
        )
    };
    let path = tb.write_config(&config("json"));
    tb.start_dispatcher(&path);
    let cfg = path.to_str().unwrap().to_string();
    let addr: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    let request_bytes = |c: &Client, path: &str| {
        let cookie = c.jar.as_ref().map(|j| format!("Cookie: JSESSIONID={j}\r\n")).unwrap_or_default();
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{cookie}\r\n").len() as u64
    };
    // A new session (balanced), then 3 requests in it (affinity).
    let mut c = Client::new(&tb.client, addr);
    let mut sent = Vec::new();
    for i in 0..4 {
        let p = format!("/app/{i}?x=\"q\"");
        sent.push(request_bytes(&c, &p));
        assert_eq!(c.get(&p).unwrap().status, 200);
    }
    let owner = cluster.hits()[0].backend;
    let wait_lines = |file: &std::path::Path, n: usize| {
        let t = Instant::now();
        loop {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            if text.lines().count() >= n || t.elapsed() > Duration::from_secs(5) {
                return text;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let text = wait_lines(&log, 4);
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).expect(l)).collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["vip"], "app");
        assert!(
            l["client"].as_str().unwrap().starts_with(&format!("{}:", dispatcher_testbed::netns::CLIENT_IP)),
            "{l}"
        );
        assert_eq!(l["request"], format!("GET /app/{i}?x=\"q\""));
        assert_eq!(l["status"], 200);
        assert_eq!(l["backend"], format!("b{owner}"));
        assert_eq!(l["bytes_in"].as_u64(), Some(sent[i]), "the request's bytes: {l}");
        assert!(l["bytes_out"].as_u64().unwrap() > 100, "{l}");
        let (total, resp) = (l["total_us"].as_u64().unwrap(), l["response_us"].as_u64().unwrap());
        assert!(l["connect_us"].as_u64().unwrap() <= resp && resp <= total, "{l}");
        assert_eq!(l["held"], false);
        assert_eq!(l["wait_us"], serde_json::Value::Null);
    }
    assert_eq!((lines[0]["decision"].as_str(), lines[0]["session"].as_str()), (Some("balanced"), None));
    let own_id = cluster.clone_ids[owner].as_str();
    assert_eq!((lines[3]["decision"].as_str(), lines[3]["session"].as_str()), (Some("affinity"), Some(own_id)));

    // The owner dies: its session's next request is held while it is suspect, then goes
    // to the replica.
    tb.kill_servers_of(owner);
    cluster.kill(owner);
    let r = c.get("/after").unwrap();
    assert_eq!(r.status, 200);
    let text = wait_lines(&log, 5);
    let l: serde_json::Value = serde_json::from_str(text.lines().nth(4).unwrap()).unwrap();
    assert_eq!(
        (l["decision"].as_str(), l["backend"].as_str()),
        (Some("failed_over"), Some(format!("b{}", owner ^ 1).as_str())),
        "{l}"
    );
    assert_eq!(l["session"].as_str(), Some(own_id), "routed by the dead owner's clone ID: {l}");
    assert!(
        l["held"] == true && l["wait_us"].as_u64().unwrap() > 0 || l["retries"].as_u64().unwrap() > 0,
        "held or retried: {l}"
    );

    // Rotation: the file is moved away and the agent reloaded; the next lines go to a new
    // file at the configured path, in the reloaded format, and none is lost.
    let rotated = tb.workdir.join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    std::fs::write(&path, config("haproxy")).unwrap();
    let out = tb.dispatcher_cmd(&["reload", "--config", &cfg]);
    assert!(out.contains("reloaded"), "{out}");
    let mut fresh = Client::new(&tb.client, addr);
    assert_eq!(fresh.get("/new").unwrap().status, 200);
    let text = wait_lines(&log, 1);
    assert_eq!(std::fs::read_to_string(&rotated).unwrap().lines().count(), 5);
    // After syslog's header (`Mon DD HH:MM:SS host tag[pid]:`), HAProxy's httplog.
    let line = text.lines().next().unwrap().split_once("]: ").unwrap().1;
    let client = format!("{}:", dispatcher_testbed::netns::CLIENT_IP);
    assert!(
        line.starts_with(&client)
            && line.contains("] app app/b")
            && line.ends_with(" {balanced|-} \"GET /new HTTP/1.1\""),
        "{line}"
    );
    let timers = line.split(' ').nth(4).unwrap();
    assert_eq!(timers.split('/').count(), 5, "TR/Tw/Tc/Tr/Ta: {line}");

    // A path that cannot be opened refuses the reload, and logging goes on in the old file.
    std::fs::write(&path, config("json").replace(&log.display().to_string(), "/nonexistent/dir/access.log")).unwrap();
    let out =
        tb.lb.command(dispatcher_testbed::netns::dispatcher_bin()).args(["reload", "--config", &cfg]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("opening the access log /nonexistent/dir/access.log"), "{err}");
    assert_eq!(fresh.get("/still").unwrap().status, 200);
    assert!(wait_lines(&log, 2).lines().nth(1).is_some_and(|l| l.ends_with("\"GET /still HTTP/1.1\"")));
    // A head the dispatcher refuses is logged too, as HAProxy logs `<BADREQ>`.
    let bad = format!("GET /x HTTP/1.1\r\nHost: {addr}\r\nHost: other\r\n\r\n");
    assert_eq!(raw_status(&tb, addr, bad.as_bytes()), 400);
    let text = wait_lines(&log, 3);
    let line = text.lines().nth(2).unwrap();
    assert!(line.contains(" app app/<NOSRV> ") && line.contains(" 400 ") && line.contains(" PR-- "), "{line}");
    assert!(line.ends_with("{none|-} \"<BADREQ>\""), "{line}");
    let metrics = tb.dispatcher_cmd(&["metrics", "--config", &cfg]);
    assert!(metrics.lines().any(|l| l == "dispatcher_access_log_lines_total 8"), "{metrics}");
    assert!(metrics.lines().any(|l| l == "dispatcher_access_log_dropped_total 0"));
}

/// HAProxy's `halog` reads the `haproxy` format: a known mix of requests (200s through
/// a farm of live servers, a 404 without a route, a 503 from a farm whose server is
/// dead, a client that closes inside its head) and halog's counts per server, status
/// and termination state are what was sent.
#[test]
fn halog_reads_the_haproxy_access_log() {
    let mut tb = Testbed::new(3, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(3);
    // b2 is never started: its farm's requests find nobody listening.
    for i in 0..2 {
        tb.start_websphere_on(&cluster, i, BACKEND_PORT);
    }
    let log = tb.workdir.join("access.log");
    let config = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\nenabled = false\n\n[access_log]\npath = \"{}\"\nformat = \"haproxy\"\n\n{}\n[[farm]]\nname = \"shop\"\nservers = [\"b0\", \"b1\"]\nport = {BACKEND_PORT}\n\n[[farm]]\nname = \"gone\"\nservers = [\"b2\"]\nport = {BACKEND_PORT}\n\n[[route]]\nname = \"app\"\nhosts = [\"*:80\"]\nuris = [\"/app/*\"]\nfarm = \"shop\"\n\n[[route]]\nname = \"dead\"\nhosts = [\"*:80\"]\nuris = [\"/dead/*\"]\nfarm = \"gone\"\n\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = {PORT}\nmode = \"http\"\n",
        tb.instance(),
        log.display(),
        tb.backend_config(&[]),
    );
    let path = tb.write_config(&config);
    tb.start_dispatcher(&path);
    let addr: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    const OK: usize = 6;
    for i in 0..OK {
        // A new client each time: balanced over both servers.
        let mut c = Client::new(&tb.client, addr);
        assert_eq!(c.get(&format!("/app/{i}")).unwrap().status, 200);
    }
    let mut c = Client::new(&tb.client, addr);
    assert_eq!(c.get("/nowhere").unwrap().status, 404);
    assert_eq!(c.get("/dead/x").unwrap().status, 503);
    // A client that closes inside its request head.
    let aborted = tb.client.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"GET /app/x HTTP/1.1\r\nHo").unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        got
    });
    assert!(aborted.starts_with(b"HTTP/1.1 400"), "{}", String::from_utf8_lossy(&aborted));
    let total = OK + 3;
    let t = Instant::now();
    while std::fs::read_to_string(&log).unwrap_or_default().lines().count() < total
        && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.lines().count(), total, "{text}");
    let halog = |flag: &str| {
        let out = std::process::Command::new("halog")
            .arg(flag)
            .stdin(std::fs::File::open(&log).unwrap())
            .output()
            .expect("halog (package haproxy, installed by `cargo xtask setup`)");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "halog {flag}: {err}");
        assert!(
            err.contains(&format!("{total} lines in")) && err.contains(" 0 parsing errors"),
            "halog {flag}: {err}\n{text}"
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // Per status and per termination state.
    let counts = |out: &str| -> HashMap<String, usize> {
        out.lines().map(|l| l.split_once(' ').unwrap()).map(|(k, n)| (k.to_string(), n.parse().unwrap())).collect()
    };
    let want = |pairs: &[(&str, usize)]| pairs.iter().map(|(k, n)| (k.to_string(), *n)).collect::<HashMap<_, _>>();
    assert_eq!(counts(&halog("-st")), want(&[("200", OK), ("404", 1), ("503", 1), ("400", 1)]), "{text}");
    assert_eq!(counts(&halog("-tc")), want(&[("--", OK), ("PR", 1), ("SC", 1), ("CR", 1)]), "{text}");
    // The session's part of the state: no session, balanced (N), or not routed (-).
    assert_eq!(counts(&halog("-cc")), want(&[("N-", OK + 1), ("--", 2)]), "{text}");
    // Per server: every request through the live servers is OK (no timer at -1) and a
    // 2xx; the dead one's is a 5xx and not OK.
    let srv = halog("-srv");
    let mut served = 0;
    for l in srv.lines().skip(1) {
        // name 1xx 2xx 3xx 4xx 5xx other tot_req req_ok pct_ok avg_ct avg_rt
        let f: Vec<&str> = l.split(' ').collect();
        match f[0] {
            "shop/b0" | "shop/b1" => {
                assert_eq!((f[2], f[8], f[9]), (f[7], f[7], "100.0"), "{srv}\n{text}");
                served += f[7].parse::<usize>().unwrap();
            }
            "gone/b2" => assert_eq!((f[5], f[7], f[8]), ("1", "1", "0"), "{srv}"),
            _ => {}
        }
    }
    assert_eq!(served, OK, "{srv}\n{text}");
    assert!(srv.lines().any(|l| l.starts_with("app/<NOSRV> ")), "the dispatcher's own answers: {srv}");
}

/// An RFC 5424 message's header fields, checked: `<PRI>1 TIMESTAMP HOST APP PROCID
/// MSGID - MSG`; returns (PRI, APP-NAME, MSG).
fn rfc5424(datagram: &[u8]) -> (u32, String, String) {
    let text = String::from_utf8(datagram.to_vec()).expect("UTF-8");
    let rest = text.strip_prefix('<').unwrap_or_else(|| panic!("no PRI: {text}"));
    let (pri, rest) = rest.split_once('>').unwrap();
    let pri: u32 = pri.parse().unwrap_or_else(|_| panic!("PRI: {text}"));
    let f: Vec<&str> = rest.splitn(8, ' ').collect();
    assert_eq!(f.len(), 8, "{text}");
    assert_eq!((f[0], f[5], f[6]), ("1", "access", "-"), "version, MSGID, no structured data: {text}");
    // TIMESTAMP: 2026-12-03T12:02:33.400Z, within a minute of now.
    let t = f[1].as_bytes();
    let shape = t.len() == 24 && t[4] == b'-' && t[7] == b'-' && t[10] == b'T' && t[19] == b'.' && t[23] == b'Z';
    assert!(shape, "timestamp: {text}");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let (h, m, sec): (u64, u64, u64) =
        (f[1][11..13].parse().unwrap(), f[1][14..16].parse().unwrap(), f[1][17..19].parse().unwrap());
    let diff = ((h * 3600 + m * 60 + sec) as i64 - (now % 86_400) as i64).rem_euclid(86_400);
    assert!(!(60..=86_340).contains(&diff), "timestamp not now: {text}");
    assert!(!f[2].is_empty() && f[4].parse::<u32>().is_ok(), "hostname, PROCID: {text}");
    (pri, f[3].to_string(), f[7].to_string())
}

/// `[access_log] syslog`: RFC 5424 datagrams to a Unix datagram socket and to a UDP
/// address (the test's own sockets, in the agent's namespace), with the request in them;
/// a socket that vanishes costs lines (counted), never requests.
#[test]
fn the_access_log_goes_to_syslog_over_a_unix_socket_and_udp() {
    let (mut tb, _cluster) = clone_bed(2);
    let sock_path = tb.workdir.join("log.sock");
    let unix = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    unix.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    // Bound inside the agent's namespace: its loopback.
    let udp = tb.lb.run(|| std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
    udp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let udp_addr = udp.local_addr().unwrap();
    let file = tb.workdir.join("access.log");
    let (instance, backends) = (tb.instance().to_string(), tb.backend_config(&[]));
    let config = |log: &str| {
        format!(
            "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{instance}\"\n\n[access_log]\n{log}\n{backends}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = {PORT}\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\n"
        )
    };
    let path = tb.write_config(&config(&format!(
        "syslog = \"{}\"\nformat = \"haproxy\"\nfacility = \"local3\"\ntag = \"disp-test\"\n",
        sock_path.display()
    )));
    tb.start_dispatcher(&path);
    let cfg = path.to_str().unwrap().to_string();
    let addr: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    let mut buf = vec![0u8; 70_000];
    for i in 0..2 {
        let mut c = Client::new(&tb.client, addr);
        assert_eq!(c.get(&format!("/unix/{i}")).unwrap().status, 200);
        let n = unix.recv(&mut buf).expect("a syslog message on the Unix socket");
        let (pri, app, msg) = rfc5424(&buf[..n]);
        assert_eq!((pri, app.as_str()), (19 * 8 + 6, "disp-test"), "local3.info: {msg}");
        assert!(msg.starts_with(dispatcher_testbed::netns::CLIENT_IP), "the httplog line, no file header: {msg}");
        assert!(msg.ends_with(&format!("\"GET /unix/{i} HTTP/1.1\"")) && msg.contains(" 200 "), "{msg}");
    }
    // The socket vanishes: requests go on, the lines are counted as dropped, and the
    // agent says so once.
    drop(unix);
    std::fs::remove_file(&sock_path).unwrap();
    for i in 0..3 {
        let mut c = Client::new(&tb.client, addr);
        assert_eq!(c.get(&format!("/gone/{i}")).unwrap().status, 200);
    }
    let dropped = || {
        let metrics = tb.dispatcher_cmd(&["metrics", "--config", &cfg]);
        let line = metrics.lines().find(|l| l.starts_with("dispatcher_access_log_dropped_total ")).unwrap().to_string();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    let t = Instant::now();
    while dropped() < 3 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(dropped(), 3);
    let said = tb.log("dispatcher").matches("syslog receiver does not take its lines").count();
    assert_eq!(said, 1, "{}", tb.log("dispatcher"));

    // Reloaded to UDP beside a file, JSON, messages cut at 480 bytes: both get each line.
    let long = "/udp/".to_string() + &"x".repeat(600);
    std::fs::write(
        &path,
        config(&format!(
            "path = \"{}\"\nsyslog = \"{udp_addr}\"\nformat = \"json\"\nmax_message = 480\n",
            file.display()
        )),
    )
    .unwrap();
    let out = tb.dispatcher_cmd(&["reload", "--config", &cfg]);
    assert!(out.contains("reloaded"), "{out}");
    let mut c = Client::new(&tb.client, addr);
    assert_eq!(c.get("/udp/short").unwrap().status, 200);
    let (n, _) = udp.recv_from(&mut buf).expect("a syslog message over UDP");
    let (pri, app, msg) = rfc5424(&buf[..n]);
    assert_eq!((pri, app.as_str()), (16 * 8 + 6, "dispatcher"), "the defaults: local0.info");
    let v: serde_json::Value = serde_json::from_str(&msg).expect(&msg);
    assert_eq!((v["request"].as_str(), v["status"].as_u64()), (Some("GET /udp/short"), Some(200)));
    assert_eq!(c.get(&long).unwrap().status, 200);
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    assert_eq!(n, 480, "cut at max_message");
    assert!(rfc5424(&buf[..n]).2.contains("GET /udp/xxx"));
    let t = Instant::now();
    while std::fs::read_to_string(&file).unwrap_or_default().lines().count() < 2 && t.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.lines().count() == 2 && text.lines().last().unwrap().contains(&long), "{text}");

    // The local RFC 3164 form, for journald's /dev/log: `<PRI>Mmm dd hh:mm:ss TAG[PID]: `.
    std::fs::write(&path, config(&format!("syslog = \"{udp_addr}\"\nsyslog_format = \"rfc3164\"\n"))).unwrap();
    assert!(tb.dispatcher_cmd(&["reload", "--config", &cfg]).contains("reloaded"));
    assert_eq!(Client::new(&tb.client, addr).get("/udp/bsd").unwrap().status, 200);
    let (n, _) = udp.recv_from(&mut buf).expect("an RFC 3164 message");
    let m = String::from_utf8_lossy(&buf[..n]).into_owned();
    let pid = tb.pid_of("dispatcher").unwrap();
    let (head, rest) =
        m.split_at(m.find(&format!(" dispatcher[{pid}]: ")).unwrap_or_else(|| panic!("TAG[PID]: in {m:?}")));
    let stamp = head.strip_prefix("<134>").unwrap_or_else(|| panic!("local0.info first: {m:?}"));
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    assert!(
        stamp.len() == 15 && months.contains(&&stamp[..3]) && stamp.as_bytes()[9] == b':',
        "Mmm dd hh:mm:ss: {m:?}"
    );
    assert!(rest.contains("GET /udp/bsd"), "{m:?}");
}

/// A testbed of `n` clones behind a VIP with `insert_cookie = "SRV"`; `backends` edits
/// the `[[backend]]` sections (e.g. drops the replicas).
fn cookie_bed(
    n: usize,
    backends: impl Fn(String) -> String,
) -> (Testbed, std::sync::Arc<websphere::Clones>, SocketAddr) {
    let mut tb = Testbed::new(n, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(n);
    tb.start_websphere(&cluster, BACKEND_PORT);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = {PORT}\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nring_size = 1009\ninsert_cookie = \"SRV\"\n",
        tb.instance(),
        backends(tb.backend_config(&[]))
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    (tb, cluster, format!("{VIP}:{PORT}").parse().unwrap())
}

/// One request with the `SRV` cookie `cookie` (if any) on a new connection; it must be
/// answered 200: (clone index, the SRV value set).
fn cookie_get(
    client: &dispatcher_testbed::netns::Ns,
    addr: SocketAddr,
    cookie: Option<&str>,
) -> (usize, Option<String>) {
    let mut s = client.run(move || TcpStream::connect(addr)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let c = cookie.map(|c| format!("Cookie: SRV={c}\r\n")).unwrap_or_default();
    s.write_all(format!("GET /plain HTTP/1.1\r\nHost: a\r\n{c}Connection: close\r\n\r\n").as_bytes()).unwrap();
    let r = read_response(&mut BufReader::new(s)).unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    let clone: usize = r.field("clone").unwrap().trim_start_matches("clone").trim_end_matches('x').parse().unwrap();
    let set = r.header("set-cookie").map(|v| {
        assert!(v.ends_with("; Path=/; HttpOnly"), "{v}");
        assert_eq!(r.header("cache-control"), Some("private"));
        v.strip_prefix("SRV=").unwrap().split(';').next().unwrap().to_string()
    });
    (clone, set)
}

/// `insert_cookie` for an application without sessions: the first answer sets the
/// dispatcher's cookie naming the backend, later requests stay there, and when it dies
/// they go to its replica only (which the cookie then names); an unknown value is
/// balanced and corrected.
#[test]
fn an_inserted_cookie_keeps_a_client_on_its_backend_and_fails_over_to_the_replica() {
    let (mut tb, cluster, addr) = cookie_bed(4, |b| b);
    let ns = tb.client.clone();
    let get = |cookie: Option<&str>| cookie_get(&ns, addr, cookie);
    // New clients are balanced and told where they are.
    let mut pins = Vec::new();
    for _ in 0..4 {
        let (clone, set) = get(None);
        assert_eq!(set, Some(format!("b{clone}")));
        pins.push(clone);
    }
    pins.sort();
    assert_eq!(pins, [0, 1, 2, 3], "round robin over the four");
    // With the cookie: always that backend, and no new cookie.
    for _ in 0..20 {
        assert_eq!(get(Some("b2")), (2, None));
    }
    // An unknown value: balanced, and corrected.
    let (clone, set) = get(Some("b9"));
    assert_eq!(set, Some(format!("b{clone}")));
    // b2 dies: its clients go to b3 (its replica) only, and the cookie follows.
    tb.kill_servers_of(2);
    cluster.kill(2);
    cluster.plain.lock().unwrap().clear();
    for _ in 0..10 {
        let (clone, set) = get(Some("b2"));
        assert_eq!((clone, set.as_deref()), (3, Some("b3")));
    }
    assert!(cluster.plain.lock().unwrap().iter().all(|&b| b == 3), "never a third server");
    assert_eq!(get(Some("b3")), (3, None));
}

/// `insert_cookie` with backends that have no replica: while a client's backend is out,
/// the client is balanced to another and the cookie names it (HAProxy's redispatch),
/// instead of 503 until its backend returns.
#[test]
fn an_inserted_cookie_without_a_replica_is_redispatched_while_its_backend_is_out() {
    let (mut tb, cluster, addr) =
        cookie_bed(2, |b| b.lines().filter(|l| !l.starts_with("replica")).map(|l| format!("{l}\n")).collect());
    let ns = tb.client.clone();
    assert_eq!(cookie_get(&ns, addr, Some("b0")), (0, None));
    tb.kill_servers_of(0);
    cluster.kill(0);
    for _ in 0..5 {
        let (clone, set) = cookie_get(&ns, addr, Some("b0"));
        assert_eq!((clone, set.as_deref()), (1, Some("b1")), "balanced to the other, and told so");
    }
    assert_eq!(cookie_get(&ns, addr, Some("b1")), (1, None));
}

/// CSV as Python's csv module reads it: a list of rows, each a field-name -> value map.
fn parse_csv(text: &str) -> Vec<HashMap<String, String>> {
    let mut py = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import csv, json, sys; print(json.dumps(list(csv.DictReader(sys.stdin))))"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    py.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = py.wait_with_output().unwrap();
    assert!(out.status.success(), "python's csv module refused:\n{text}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn status_as_csv_has_a_row_per_vip_and_backend() {
    let (tb, cfg) = two_backends_after_five_requests();
    let cfg = cfg.as_str();
    tb.dispatcher_cmd(&["drain", "--config", cfg, "b1"]);
    let text = tb.dispatcher_cmd(&["status", "--config", cfg, "--csv"]);
    assert!(text.starts_with("type,name,address,mode,state,health,operator,weight,replica,"), "{text}");
    let rows = parse_csv(&text);
    assert_eq!(rows.len(), 3, "one VIP and two backends: {text}");
    let vip = &rows[0];
    assert_eq!((vip["type"].as_str(), vip["name"].as_str(), vip["mode"].as_str()), ("vip", "app", "http"), "{text}");
    assert_eq!(vip["address"], format!("{VIP}:{PORT}/tcp"));
    assert_eq!(vip["requests"], "5", "{text}");
    let names: Vec<(&str, &str)> = rows[1..].iter().map(|r| (r["type"].as_str(), r["name"].as_str())).collect();
    assert_eq!(names, [("backend", "b0"), ("backend", "b1")]);
    assert_eq!((rows[1]["state"].as_str(), rows[1]["operator"].as_str()), ("up", "none"), "{text}");
    assert_eq!((rows[2]["state"].as_str(), rows[2]["operator"].as_str()), ("drain", "drain"), "{text}");
    assert_eq!(rows[2]["last_change"], "up -> drain: operator drain", "{text}");
    let requests: u64 = rows[1..].iter().map(|r| r["requests"].parse::<u64>().unwrap()).sum();
    assert_eq!(requests, 5, "{text}");
    // The admin endpoint gives the same table.
    let (code, body) = tb.admin("GET", "/status?format=csv").expect("agent answers");
    assert_eq!(code, 200, "{body}");
    let admin_rows = parse_csv(&body);
    assert_eq!(admin_rows.len(), 3, "{body}");
    assert_eq!(admin_rows[2]["state"], "drain", "{body}");
}

#[test]
fn refused_requests_are_shown_with_their_reason_and_escaped_bytes() {
    let (tb, cluster, addr) = http_testbed(2, false, "");
    let cfg = tb.workdir.join("dispatcher.toml");
    let cfg = cfg.to_str().unwrap();
    assert_eq!(raw_status(&tb, addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), 200, "a good request is not kept");
    let cases: &[(&[u8], &str, Option<usize>, &str)] = &[
        (b"GET / HTTP/1.1\nHost: x\n\n", "bare LF", Some(14), "GET / HTTP/1.1\\x0aHost: x\\x0a\\x0a"),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",
            "more than one Content-Length",
            None,
            "POST / HTTP/1.1\\x0d\\x0aHost: x\\x0d\\x0aContent-Length: 0\\x0d\\x0aContent-Length: 0\\x0d\\x0a\\x0d\\x0a",
        ),
        (
            b"GET / HTTP/1.1\r\nHost: x\r\nX: a\0b\r\n\r\n",
            "malformed request head",
            Some(29),
            "GET / HTTP/1.1\\x0d\\x0aHost: x\\x0d\\x0aX: a\\x00b\\x0d\\x0a\\x0d\\x0a",
        ),
    ];
    for (bytes, _, _, _) in cases {
        assert_eq!(raw_status(&tb, addr, bytes), 400);
    }
    let (code, body) = tb.admin("GET", "/errors").expect("agent answers");
    assert_eq!(code, 200, "{body}");
    let r: dispatcher::api::ErrorsReply = serde_json::from_str(&body).unwrap();
    assert_eq!((r.total, r.errors.len()), (3, 3), "{body}");
    for (e, (bytes, reason, position, escaped)) in r.errors.iter().zip(cases) {
        assert_eq!((e.status, e.reason.as_str(), e.position), (400, *reason, *position), "{body}");
        assert_eq!(e.bytes, *escaped);
        assert_eq!((e.vip.as_str(), e.protocol.as_str(), e.received), ("app", "h1", bytes.len()));
        assert!(e.client.starts_with(&format!("{}:", dispatcher_testbed::netns::CLIENT_IP)), "{}", e.client);
    }
    // The CLI shows them readably: one line per refusal, the head line by line.
    let text = tb.dispatcher_cmd(&["errors", "--config", cfg]);
    assert!(text.starts_with("3 requests refused as malformed since the agent started"), "{text}");
    assert!(text.contains("VIP app client 10.99.0.2:"), "{text}");
    assert!(
        text.contains("h1: answered 400: bare LF at byte 14 (24 bytes received)\n    GET / HTTP/1.1\\x0a\n"),
        "{text}"
    );
    // A body whose chunked framing is bad: kept with its head (the body is not kept).
    let head = "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(raw_status(&tb, addr, format!("{head}Z\r\n\r\n").as_bytes()), 400);
    let (_, body) = tb.admin("GET", "/errors").unwrap();
    let r: dispatcher::api::ErrorsReply = serde_json::from_str(&body).unwrap();
    let e = r.errors.last().unwrap();
    assert_eq!((r.total, e.status, e.reason.as_str(), e.received), (4, 400, "chunk size is not hex", head.len()));
    assert_eq!(e.bytes, head.replace("\r\n", "\\x0d\\x0a"));
    // Many more: the ring stays bounded, each head cut to 1 KiB.
    let long = format!("GET /{} HTTP/1.1\nHost: x\n\n", "a".repeat(3000));
    for _ in 0..40 {
        assert_eq!(raw_status(&tb, addr, long.as_bytes()), 400);
    }
    let (_, body) = tb.admin("GET", "/errors").unwrap();
    let r: dispatcher::api::ErrorsReply = serde_json::from_str(&body).unwrap();
    assert_eq!((r.total, r.kept, r.errors.len()), (44, 32, 32));
    let last = r.errors.last().unwrap();
    assert_eq!((last.received, last.captured, last.bytes.len()), (long.len(), 1024, 1024));
    assert!(cluster.hits().len() == 1, "only the good request reached a backend");
    // Client data: not for loopback readers over TCP, only for operators on the socket.
    assert!(!dispatcher::admin::allowed(dispatcher::admin::Peer::LocalReader, "GET", "/errors"));
}

/// `dispatcher clones ARGS` as the operator runs it: (exit code, stdout and stderr).
fn clones_cmd(tb: &Testbed, args: &[&str]) -> (Option<i32>, String) {
    let cfg = tb.workdir.join("dispatcher.toml");
    let out = tb
        .lb
        .command(dispatcher_testbed::netns::dispatcher_bin())
        .args(["clones", "--config", cfg.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// The agent's `balanced` and `affinity_hits` counters.
fn routing_counts(tb: &Testbed) -> (u64, u64) {
    let (_, body) = tb.admin("GET", "/status").expect("agent answers");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    let c = &st["counters"];
    (c["balanced"].as_u64().unwrap(), c["affinity_hits"].as_u64().unwrap())
}

#[test]
fn a_learned_clone_id_is_listed_deleted_then_routed_as_unknown_and_learned_again() {
    let (tb, _cluster, addr) = http_testbed(4, false, "");
    let cookie = a_session_on(&tb, addr, "clone2x");
    let (code, list) = clones_cmd(&tb, &[]);
    assert_eq!(code, Some(0), "{list}");
    let row = list.lines().find(|l| l.starts_with("clone2x ")).unwrap_or_else(|| panic!("clone2x listed: {list}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[..6], ["clone2x", "b2", "b3", "learned", "local", "(Set-Cookie)"], "{list}");
    assert!(list.starts_with("clone table: "), "{list}");
    let (_, body) = tb.admin("GET", "/clones?limit=1").unwrap();
    let page: dispatcher::api::ClonesReply = serde_json::from_str(&body).unwrap();
    assert!(page.total >= 1 && page.entries.len() == 1, "a page of one, and the total: {body}");

    // Never to a non-owner: while b2 (or its replica b3) can serve the session, a deletion
    // would send its requests to servers that do not hold it.
    let (code, out) = clones_cmd(&tb, &["delete", "clone2x"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("\"clone2x\" belongs to b2, which can serve its sessions (b2 and b3 now)"), "{out}");
    assert!(clones_cmd(&tb, &[]).1.contains("clone2x "), "still there");
    let (code, out) = clones_cmd(&tb, &["delete", "clone2x", "--force"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("deleted clone2x (learned from local (Set-Cookie), backend b2)"), "{out}");
    assert!(!clones_cmd(&tb, &[]).1.contains("clone2x "), "no longer listed");
    let data = aya::maps::MapData::from_pin(tb.pin_dir().join("CLONES")).expect("pinned CLONES");
    let map: aya::maps::HashMap<_, u64, dispatcher_common::CloneValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(data).unwrap()).unwrap();
    assert!(map.get(&dispatcher_common::hash::cookie_hash(b"clone2x"), 0).is_err(), "gone from CLONES too");
    // The next request carrying it is routed as an unknown clone ID: balanced.
    let before = routing_counts(&tb);
    let mut c = Client::new(&tb.client, addr);
    c.jar = Some(cookie);
    assert_eq!(c.get("/").unwrap().status, 200);
    let after = routing_counts(&tb);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 0), "balanced, not by affinity");
    // Its owner's next Set-Cookie teaches it again.
    a_session_on(&tb, addr, "clone2x");
    let list = clones_cmd(&tb, &[]).1;
    assert!(list.lines().any(|l| l.starts_with("clone2x ") && l.contains(" learned ")), "learned again: {list}");
    let (code, out) = clones_cmd(&tb, &["delete", "nosuch"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("no clone ID or logical name \"nosuch\" in the table"), "{out}");
}

#[test]
fn a_configured_clone_id_is_listed_and_cannot_be_deleted() {
    let (tb, _cluster, addr) = http_testbed(2, true, "");
    assert_eq!(Client::new(&tb.client, addr).get("/").unwrap().status, 200);
    let (code, list) = clones_cmd(&tb, &[]);
    assert_eq!(code, Some(0), "{list}");
    assert!(list.starts_with("clone table: 2 entries (1 to 2 shown, sorted by ID)"), "{list}");
    let row = list.lines().find(|l| l.starts_with("clone0x ")).unwrap_or_else(|| panic!("{list}"));
    assert_eq!(row.split_whitespace().take(5).collect::<Vec<_>>(), ["clone0x", "b0", "b1", "configured", "clone_ids"]);
    let (code, out) = clones_cmd(&tb, &["delete", "clone0x"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("\"clone0x\" is configured (in b0's clone_ids): it cannot be deleted"), "{out}");
    assert!(clones_cmd(&tb, &[]).1.contains("clone0x "), "still there");
    let (code, out) = clones_cmd(&tb, &["--limit", "1", "--offset", "1"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("clone table: 2 entries (2 to 2 shown") && out.contains("clone1x "), "{out}");
}
