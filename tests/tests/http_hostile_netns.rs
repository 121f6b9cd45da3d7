//! What an attacker sends, through the proxy to a scripted backend that records every
//! request: framing tricks, bodies refused before anything goes upstream, targets with an
//! authority of their own, trailers, clients that never read or trickle, a backend at its
//! connection limit. The rule under test: a backend never sees a request the client was
//! told was refused, and nothing a client does costs more than a bounded time.

use std::{
    io::{BufReader, Read, Write},
    net::TcpStream,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use dispatcher_testbed::{
    scripted::{Bed, VIP},
    websphere::read_response,
};

/// One scripted backend behind one HTTP VIP; `http` adds lines to `[http]`.
fn bed(http: &str) -> Bed {
    Bed::new(1, http, "interval = \"200ms\"\n")
}

/// Sends `byte` every 700 ms, 20 times at most, on a thread of its own.
fn trickle(mut w: TcpStream, byte: u8) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..20 {
            if w.write_all(&[byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(700));
        }
    })
}

fn status_line(r: &str) -> &str {
    r.lines().next().unwrap_or("")
}

/// `Connection` naming a framing field or Host: refused before the backend sees a byte;
/// a response doing it is a 502 and its connection is not reused.
#[test]
fn connection_cannot_remove_framing_or_host() {
    let b = bed("");
    let smuggled = "GET /admin HTTP/1.1\r\nHost: internal\r\nX: y\r\n\r\n";
    for listed in ["Content-Length", "content-length, keep-alive", "Host", "Transfer-Encoding"] {
        let req = format!(
            "POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: {}\r\nConnection: {listed}\r\n\r\n{smuggled}",
            smuggled.len()
        );
        let out = b.all(req.as_bytes());
        assert!(status_line(&out).starts_with("HTTP/1.1 400 "), "{listed}: {out}");
    }
    let chunked = "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: transfer-encoding\r\n\r\n0\r\n\r\n";
    assert!(status_line(&b.all(chunked.as_bytes())).starts_with("HTTP/1.1 400 "));
    std::thread::sleep(Duration::from_millis(200));
    assert!(b.seen().is_empty(), "the backend saw: {:?}", b.seen());

    // The backend's turn: a 502, and the next request goes over a new connection.
    let before = b.record.connections.load(Ordering::SeqCst);
    let (mut r, mut w) = b.connect();
    w.write_all(b"GET /conn-cl HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
    let res = read_response(&mut r).unwrap();
    assert_eq!(res.status, 502, "{res:?}");
    assert_eq!(b.one(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n").status, 200);
    assert_eq!(b.record.connections.load(Ordering::SeqCst), before + 2, "the 502's connection was not pooled");
}

/// A chunked body whose bytes at hand are already bad is refused before anything goes
/// upstream; one that turns bad later is aborted, never completed, upstream.
#[test]
fn a_bad_chunked_body_never_reaches_the_backend_as_a_request() {
    let b = bed("");
    let head = "POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    for body in [
        "-5\r\nhello\r\n0\r\n\r\n",
        " 5\r\nhello\r\n0\r\n\r\n",
        "fffffffffffffffffff\r\nx\r\n0\r\n\r\n",
        "5;a\nb\r\nhello\r\n0\r\n\r\n",
        "5\nhello\r\n0\r\n\r\n",
        "5\r\nhelloXX\r\n0\r\n\r\n",
        "5\r\nhello\r\n0\r\nX-T: a\0b\r\n\r\n",
        "5\r\nhello\r\n0\r\nX-T: a\x01b\r\n\r\n",
    ] {
        let out = b.all(format!("{head}{body}").as_bytes());
        assert!(status_line(&out).starts_with("HTTP/1.1 400 "), "{body:?}: {out}");
    }
    // The head alone first, then a bad first line: still nothing upstream.
    let (mut r, mut w) = b.connect();
    w.write_all(head.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    w.write_all(b"-5\r\n").unwrap();
    let mut out = String::new();
    let _ = r.read_to_string(&mut out);
    assert!(status_line(&out).starts_with("HTTP/1.1 400 "), "{out}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(b.seen().is_empty(), "the backend saw: {:?}", b.seen());

    // Good first chunk, then a bad trailer after a pause: the client gets 400, the
    // backend an aborted request (nothing complete is recorded).
    let (mut r, mut w) = b.connect();
    w.write_all(format!("{head}5\r\nhello\r\n").as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    w.write_all(b"0\r\nX-T: \x7f\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = r.read_to_string(&mut out);
    assert!(status_line(&out).starts_with("HTTP/1.1 400 "), "{out}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(b.seen().is_empty(), "the backend took it for a whole request: {:?}", b.seen());
    // And a good one still works.
    let res = b.one(format!("{head}5\r\nhello\r\n0\r\nX-T: fine\r\n\r\n").as_bytes());
    assert_eq!(res.status, 200);
    assert!(b.seen().last().unwrap().ends_with("5\r\nhello\r\n0\r\nX-T: fine\r\n\r\n"), "{:?}", b.seen());
}

/// RFC 9112 3.2.2: the absolute-form target's authority wins; the backend sees one Host
/// and an origin-form target. HTTP/1.0 without Host gets the VIP's authority.
#[test]
fn absolute_form_targets_and_missing_hosts() {
    let b = bed("");
    let r = b.one(b"GET http://a.example/echo?x=1 HTTP/1.1\r\nHost: b.example\r\n\r\n");
    assert_eq!(r.status, 200);
    let fwd = b.record.last();
    assert!(fwd.starts_with("GET /echo?x=1 HTTP/1.1\r\n"), "{fwd}");
    assert!(fwd.contains("\r\nHost: a.example\r\n") && !fwd.contains("b.example"), "{fwd}");
    assert_eq!(fwd.matches("Host:").count(), 1, "{fwd}");
    let r = b.one(b"GET /echo HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 200);
    assert!(b.record.last().contains(&format!("\r\nHost: {VIP}\r\n")), "{}", b.record.last());
}

/// A client that never reads its responses cannot keep a request in flight (and its
/// upstream connection) past the client timeout (2 s in the bed).
#[test]
fn a_client_that_never_reads_is_cut_off() {
    let b = bed("");
    let (_r, mut w) = b.connect();
    // 16 MB of small responses (each written with its head in one write), more than any
    // socket buffers hold; the client reads none.
    let reqs = "GET /medium HTTP/1.1\r\nHost: a\r\n\r\n".repeat(2000);
    w.write_all(reqs.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let active = |b: &Bed| b.status()["agent"]["backends"][0]["active"].as_u64().unwrap();
    assert_eq!(active(&b), 1, "a request is stuck writing to the client");
    let deadline = Instant::now() + Duration::from_secs(10);
    while active(&b) != 0 {
        assert!(Instant::now() < deadline, "still in flight 10 s later (client_timeout 2 s)");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A body trickling one byte a second meets the total body deadline, not just the per-read
/// timeout; nothing of it counts as a request upstream.
#[test]
fn a_trickling_body_meets_the_body_deadline() {
    let b = bed("body_timeout = \"3s\"\n");
    let (mut r, mut w) = b.connect();
    let started = Instant::now();
    w.write_all(b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n").unwrap();
    let trickle = trickle(w, b'x');
    let mut out = String::new();
    let _ = r.read_to_string(&mut out);
    let took = started.elapsed();
    assert!(status_line(&out).starts_with("HTTP/1.1 408 "), "{out}");
    assert!(took < Duration::from_secs(6), "answered after {took:?} (body_timeout 3 s)");
    let _ = trickle.join();
    assert!(b.seen().is_empty(), "{:?}", b.seen());
}

/// At the backend's connection limit a request waits in a bounded queue, then gets 503
/// "busy" with Retry-After; the backend is not made suspect for it.
#[test]
fn a_full_backend_is_busy_not_failed() {
    let b = bed("max_connections_per_backend = 1\nqueue_timeout = \"400ms\"\n");
    let addr = b.addr;
    let slow = b.tb.client.spawn(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        read_response(&mut BufReader::new(s)).map(|r| r.status)
    });
    std::thread::sleep(Duration::from_millis(300));
    let r = b.one(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.header("retry-after").is_some() && r.body.contains("busy"), "{r:?}");
    assert_eq!(slow.join().unwrap().unwrap(), 200, "the slow request finishes");
    let st = b.status();
    assert_eq!(st["agent"]["backends"][0]["health"], "up", "a full backend is not a failed one: {st}");
    assert!(st["agent"]["counters"]["queue_timeouts"].as_u64().unwrap() >= 1, "{st}");
    // Once the slow one is done, the queue lets the next one through within its wait.
    let addr2 = b.addr;
    let slow = b.tb.client.spawn(move || {
        let mut s = TcpStream::connect_timeout(&addr2, Duration::from_secs(3)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
        read_response(&mut BufReader::new(s)).map(|r| r.status)
    });
    assert_eq!(slow.join().unwrap().unwrap(), 200);
    assert_eq!(b.one(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n").status, 200);
}

/// `/metrics` is valid Prometheus exposition, as a real parser reads it (promtool, from
/// Debian's prometheus package, which `cargo xtask setup` installs).
#[test]
fn metrics_pass_promtool() {
    let b = bed("");
    assert_eq!(b.one(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n").status, 200);
    let cfg = b.tb.workdir.join("dispatcher.toml");
    let text = b.tb.dispatcher_cmd(&["metrics", "--config", cfg.to_str().unwrap()]);
    assert!(text.contains("dispatcher_xdp_vip_packets_total{vip=\"app\"}"), "{text}");
    if let Err(said) = dispatcher_testbed::promtool_check(&text) {
        panic!("promtool check metrics: {said}");
    }
}

/// Opens `n` idle client connections to the VIP from the client namespace (the test
/// process's own descriptor limit raised to its hard limit first).
fn idle_clients(b: &Bed, n: usize) -> Vec<TcpStream> {
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let addr = b.addr;
    b.tb.client
        .run(move || (0..n).filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()).collect())
}

/// With a descriptor limit of 400, 500 idle clients: the default cap (derived from the
/// limit) keeps descriptors for health checks, upstream connections and the admin socket.
/// The backend stays up, the admin socket answers, connections over the cap are closed
/// and counted, and a request goes through once the idle clients leave.
#[test]
fn idle_clients_cannot_exhaust_the_descriptors() {
    let b = Bed::limited(1, "", "interval = \"200ms\"\n", Some(400));
    let idle = idle_clients(&b, 500);
    std::thread::sleep(Duration::from_secs(2));
    let st = b.status();
    assert_eq!(st["agent"]["backends"][0]["health"], "up", "{st}");
    assert_eq!(b.through_l4().unwrap(), 200, "the L4 VIP forwards as before");
    assert!(st["agent"]["vips"][0]["connections"].as_u64().unwrap() <= 62, "{st}");
    assert!(st["agent"]["counters"]["connections_refused"].as_u64().unwrap() >= 400, "{st}");
    drop(idle);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(b.one(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n").status, 200);
}

/// A cap set above what the descriptors allow (the operator's mistake): accept and the
/// health checks meet EMFILE, and that is never taken for the backend's failure.
#[test]
fn running_out_of_descriptors_is_not_a_backend_failure() {
    let b = Bed::limited(1, "max_client_connections = 100000\n", "interval = \"200ms\"\n", Some(400));
    let idle = idle_clients(&b, 500);
    std::thread::sleep(Duration::from_secs(2));
    // The agent may not be able to answer on its socket now: read the state it wrote to
    // the pinned maps.
    let cfg = b.tb.workdir.join("dispatcher.toml");
    let table = b.tb.dispatcher_cmd(&["status", "--config", cfg.to_str().unwrap()]);
    let row = table.lines().find(|l| l.starts_with("b0 ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.split_whitespace().nth(2) == Some("up"), "the backend stayed up: {table}");
    assert_eq!(b.through_l4().unwrap(), 200, "the L4 VIP forwards as before");
    assert!(b.tb.log("dispatcher").contains("failed"), "the shortage was logged: {}", b.tb.log("dispatcher"));
    drop(idle);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(b.one(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n").status, 200);
    assert_eq!(b.status()["agent"]["backends"][0]["health"], "up");
}

/// A backend that answers `Expect: 100-continue` with 103 Early Hints and then 100: the
/// 103 reaches the client, the body is sent on the 100, and the final answer comes.
#[test]
fn early_hints_before_100_continue() {
    let b = bed("");
    let (mut r, mut w) = b.connect();
    w.write_all(b"POST /hints-continue HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        .unwrap();
    let hints = read_response(&mut r).unwrap();
    assert_eq!(hints.status, 103, "{hints:?}");
    let go = read_response(&mut r).unwrap();
    assert_eq!(go.status, 100, "{go:?}");
    w.write_all(b"body").unwrap();
    let fin = read_response(&mut r).unwrap();
    assert_eq!(fin.status, 200, "{fin:?}");
    assert!(fin.body.ends_with("body"), "{fin:?}");
}

/// A chunked body whose first size line trickles in (an extension byte at a time) meets
/// the body deadline too, before anything goes upstream.
#[test]
fn a_trickling_first_chunk_line_meets_the_body_deadline() {
    let b = bed("body_timeout = \"3s\"\n");
    let (mut r, mut w) = b.connect();
    let started = Instant::now();
    w.write_all(b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;").unwrap();
    let trickle = trickle(w, b'a');
    let mut out = String::new();
    let _ = r.read_to_string(&mut out);
    assert!(status_line(&out).starts_with("HTTP/1.1 408 "), "{out}");
    assert!(started.elapsed() < Duration::from_secs(8), "answered after {:?} (body_timeout 3 s)", started.elapsed());
    let _ = trickle.join();
    assert!(b.seen().is_empty(), "{:?}", b.seen());
}

/// A tunnel (after 101) where nobody says anything for the idle timeout is closed: it
/// holds a backend connection.
#[test]
fn a_silent_tunnel_is_closed() {
    let b = bed("tunnel_timeout = \"1s\"\n");
    let (mut r, mut w) = b.connect();
    w.write_all(b"GET /upgrade HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        r.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "));
    // Talking keeps it open...
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(600));
        w.write_all(b"ping").unwrap();
        let mut echo = [0u8; 4];
        r.read_exact(&mut echo).unwrap();
        assert_eq!(&echo, b"PING");
    }
    // ...silence closes it.
    let started = Instant::now();
    let mut rest = Vec::new();
    let _ = r.read_to_end(&mut rest);
    // (The scripted backend itself gives up after 5 s of silence.)
    assert!(
        started.elapsed() < Duration::from_millis(3500),
        "closed after {:?} of silence (idle 1 s)",
        started.elapsed()
    );
}

/// A client that does not read its (small, fully received) responses holds no backend
/// connection: with one connection allowed to the backend, another client is served
/// while the first one's response waits in the socket.
#[test]
fn a_client_that_does_not_read_holds_no_backend_connection() {
    let b = bed("max_connections_per_backend = 1\nqueue_timeout = \"1s\"\n");
    let (_r, mut w) = b.connect();
    // 16 MB of small responses the client never reads: its request is stuck writing.
    w.write_all("GET /medium HTTP/1.1\r\nHost: a\r\n\r\n".repeat(2000).as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..3 {
        let r = b.one(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
        assert_eq!(r.status, 200, "{r:?}");
    }
}

/// An upload that takes longer than `body_timeout` but keeps up `body_min_rate` goes on:
/// the deadline is a minimum rate, not a cap on the body's size.
#[test]
fn a_slow_but_steady_upload_is_not_cut_off() {
    let b = bed("body_timeout = \"1s\"\nbody_min_rate = 1024\n");
    let (mut r, mut w) = b.connect();
    const SIZE: usize = 160 * 1024;
    w.write_all(format!("POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: {SIZE}\r\n\r\n").as_bytes()).unwrap();
    let started = Instant::now();
    // 8 KiB every 200 ms: about 40 KiB/s, for about 4 s.
    for _ in 0..SIZE / 8192 {
        w.write_all(&[b'u'; 8192]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let res = read_response(&mut r).unwrap();
    assert!(started.elapsed() > Duration::from_secs(3), "the upload outlasted body_timeout");
    assert_eq!(res.status, 200, "{}", res.status);
    assert!(b.record.last().ends_with(&"u".repeat(SIZE)), "the whole body reached the backend");
}

/// The client connection cap counts the connections still draining on the listeners a
/// reload replaced: a reload does not double it.
#[test]
fn a_reload_does_not_reset_the_connection_cap() {
    let b = bed("max_client_connections = 20\n");
    let addr = b.addr;
    // 15 connections with a request in flight (1.5 s each) on the current listeners.
    let busy: Vec<TcpStream> = b.tb.client.run(move || {
        (0..15)
            .map(|_| {
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).unwrap();
                s.write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").unwrap();
                s
            })
            .collect()
    });
    std::thread::sleep(Duration::from_millis(200));
    let cfg = b.tb.workdir.join("dispatcher.toml");
    let out = b.tb.dispatcher_cmd(&["reload", "--config", cfg.to_str().unwrap()]);
    assert!(out.contains("reloaded"), "{out}");
    let before = b.status()["agent"]["counters"]["connections_refused"].as_u64().unwrap();
    // 10 more while those 15 drain: at most 5 fit under the cap of 20.
    let more = idle_clients(&b, 10);
    std::thread::sleep(Duration::from_millis(300));
    let refused = b.status()["agent"]["counters"]["connections_refused"].as_u64().unwrap() - before;
    assert!(refused >= 5, "{refused} refused after the reload (15 draining + 10 new, cap 20)");
    drop(more);
    drop(busy);
}

/// A second client host on the switch (10.99.0.3), routed to the VIPs through the
/// dispatcher as the first one is.
fn second_client(b: &mut Bed) -> dispatcher_testbed::netns::Ns {
    let ns = b.tb.add_host("c2", "10.99.0.3", "02:99:00:00:00:03");
    ns.ip(&["route", "add", &format!("{VIP}/32"), "via", dispatcher_testbed::netns::LB_IP]);
    ns
}

/// `n` connections opened from `ns` one after the other, then a request on each: what
/// each one answered (a status, or the error), and the connections (kept open).
fn open_and_ask(
    ns: &dispatcher_testbed::netns::Ns,
    addr: std::net::SocketAddr,
    n: usize,
) -> (Vec<Result<dispatcher_testbed::websphere::Response, String>>, Vec<TcpStream>) {
    ns.run(move || {
        let conns: Vec<TcpStream> = (0..n)
            .map(|_| {
                let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).expect("connect");
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s
            })
            .collect();
        let answers = conns
            .iter()
            .map(|s| {
                // A refused connection has its answer already; the request may meet a
                // closed socket.
                let _ = (&*s).write_all(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
                read_response(&mut BufReader::new(s)).map_err(|e| e.to_string())
            })
            .collect();
        (answers, conns)
    })
}

/// A refusal as the brief wants it: 503, Connection: close, Retry-After, Content-Length
/// matching a short body, then the end of the connection.
fn assert_refusal(r: &dispatcher_testbed::websphere::Response, says: &str) {
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("connection"), Some("close"), "{r:?}");
    assert!(r.header("retry-after").is_some_and(|v| v.parse::<u32>().is_ok()), "{r:?}");
    assert_eq!(r.header("content-length").and_then(|v| v.parse::<usize>().ok()), Some(r.body.len()), "{r:?}");
    assert!(r.body.contains(says), "{r:?}");
}

fn metrics(b: &Bed) -> String {
    let cfg = b.tb.workdir.join("dispatcher.toml");
    b.tb.dispatcher_cmd(&["metrics", "--config", cfg.to_str().unwrap()])
}

fn refused(b: &Bed, reason: &str) -> u64 {
    let m = metrics(b);
    let key = format!("dispatcher_client_connections_refused_total{{reason=\"{reason}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{key}: {m}"))
}

/// One source holds its `max_connections_per_source` (5 here): the connections beyond
/// get a 503 with Connection: close, written without reading their request; another
/// source is served all the while; once the first one lets go, it is served again.
#[test]
fn one_source_cannot_take_every_connection_slot() {
    let mut b = bed("max_connections_per_source = 5\nmax_connection_rate_per_source = 0\n");
    let other = second_client(&mut b);
    let (answers, held) = open_and_ask(&b.tb.client, b.addr, 8);
    let served = answers.iter().filter(|a| a.as_ref().is_ok_and(|r| r.status == 200)).count();
    let refusals: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).filter(|r| r.status == 503).collect();
    assert_eq!((served, refusals.len()), (5, 3), "{answers:?}");
    for r in refusals {
        assert_refusal(r, "too many connections from your address");
    }
    // The other source, while the first holds its 5: served on connections of its own.
    let (answers, held2) = open_and_ask(&other, b.addr, 5);
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|r| r.status == 200)), "{answers:?}");
    assert_eq!(refused(&b, "source_connections"), 3);
    // A refused connection was never counted: the first source's 5 are still open and
    // served (keep-alive), and once they go, new ones are served.
    for s in &held[..5] {
        let _ = (&*s).write_all(b"GET /echo HTTP/1.1\r\nHost: a\r\n\r\n");
    }
    drop(held);
    drop(held2);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (answers, _) = open_and_ask(&b.tb.client, b.addr, 5);
        if answers.iter().all(|a| a.as_ref().is_ok_and(|r| r.status == 200)) {
            break;
        }
        assert!(Instant::now() < deadline, "the first source is still refused 5 s after closing: {answers:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    if let Err(said) = dispatcher_testbed::promtool_check(&metrics(&b)) {
        panic!("promtool check metrics: {said}");
    }
}

/// New connections per second from one source (5 here, a burst of 5): beyond, a 503;
/// another source is served meanwhile; a fifth of a second later one more gets through.
#[test]
fn a_source_over_its_connection_rate_gets_503() {
    let mut b = bed("max_connections_per_source = 0\nmax_connection_rate_per_source = 5\n");
    let other = second_client(&mut b);
    let started = Instant::now();
    let (answers, _held) = open_and_ask(&b.tb.client, b.addr, 12);
    let took = started.elapsed();
    let served = answers.iter().filter(|a| a.as_ref().is_ok_and(|r| r.status == 200)).count();
    let refusals: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).filter(|r| r.status == 503).collect();
    // 5 at once, then one per 200 ms while they were being opened.
    let refills = (took.as_millis() / 200) as usize + 1;
    assert_eq!(served + refusals.len(), 12, "{answers:?}");
    assert!(served >= 5 && served <= 5 + refills, "{served} served in {took:?}: {answers:?}");
    assert!(!refusals.is_empty(), "{answers:?}");
    for r in &refusals {
        assert_refusal(r, "too many new connections from your address");
    }
    let (answers, _held2) = open_and_ask(&other, b.addr, 3);
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|r| r.status == 200)), "the other source: {answers:?}");
    assert_eq!(refused(&b, "source_rate"), refusals.len() as u64);
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (answers, _) = open_and_ask(&b.tb.client, b.addr, 1);
        if answers[0].as_ref().is_ok_and(|r| r.status == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "still refused 3 s later: {answers:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// At the global cap a new connection gets a 503 (not a silent close), counted by cap.
#[test]
fn at_the_global_cap_a_connection_gets_503() {
    let b = bed("max_client_connections = 3\nmax_connections_per_source = 0\nmax_connection_rate_per_source = 0\n");
    let (answers, _held) = open_and_ask(&b.tb.client, b.addr, 5);
    let served = answers.iter().filter(|a| a.as_ref().is_ok_and(|r| r.status == 200)).count();
    assert_eq!(served, 3, "{answers:?}");
    let refusals: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).filter(|r| r.status == 503).collect();
    assert_eq!(refusals.len(), 2, "the two over the cap get an answer: {answers:?}");
    for r in refusals {
        assert_refusal(r, "too many connections");
    }
    assert_eq!(refused(&b, "global"), 2);
}

/// A TCP relay in the client's namespace (10.99.0.2:8081) to the HTTP VIP: a backend
/// that leads back to the dispatcher, which `dispatcher check` cannot see. Counts the
/// connections it relayed; takes at most 2,000; stops with `stop`.
fn relay_to_vip(
    ns: &dispatcher_testbed::netns::Ns,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicUsize>, std::thread::JoinHandle<()>) {
    let count = Arc::new(AtomicUsize::new(0));
    let (c, (ready, listening)) = (count.clone(), std::sync::mpsc::channel());
    let handle = ns.spawn(move || {
        let l = std::net::TcpListener::bind((dispatcher_testbed::netns::CLIENT_IP, 8081)).expect("bind the relay");
        l.set_nonblocking(true).unwrap();
        let _ = ready.send(());
        let vip: std::net::SocketAddr = format!("{VIP}:80").parse().unwrap();
        while !stop.load(Ordering::SeqCst) && c.load(Ordering::SeqCst) < 2000 {
            match l.accept() {
                Ok((down, _)) => {
                    c.fetch_add(1, Ordering::SeqCst);
                    let _ = down.set_nonblocking(false);
                    let Ok(up) = TcpStream::connect_timeout(&vip, Duration::from_secs(2)) else { continue };
                    let (Ok(down2), Ok(up2)) = (down.try_clone(), up.try_clone()) else { continue };
                    for (mut from, mut to) in [(down, up2), (up, down2)] {
                        let _ = from.set_read_timeout(Some(Duration::from_secs(10)));
                        // (Threads made here are in the relay's namespace too.)
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(std::net::Shutdown::Write);
                        });
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    listening.recv_timeout(Duration::from_secs(5)).expect("the relay listens");
    (count, handle)
}

/// An HTTP VIP whose backend leads back to it through something `dispatcher check`
/// cannot see (a relay on another host to the VIP): the request comes back with this
/// dispatcher's own Via marker and is answered 508 at once. One request, one upstream
/// request — not hundreds until the head outgrows `max_header_bytes`.
#[test]
fn a_forwarding_loop_check_cannot_see_is_cut_at_the_first_return() {
    let mut tb = dispatcher_testbed::netns::Testbed::new(0, &[VIP]);
    tb.add_local_vip(VIP);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nserver_timeout = \"2s\"\nclient_timeout = \"2s\"\n\n[health]\nenabled = false\n\n[[backend]]\nname = \"relay\"\naddress = \"{}\"\n\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = 8081\n",
        tb.instance(),
        dispatcher_testbed::netns::CLIENT_IP
    );
    let path = tb.write_config(&text);
    let stop = Arc::new(AtomicBool::new(false));
    let (relayed, relay) = relay_to_vip(&tb.client, stop.clone());
    tb.start_dispatcher(&path);
    let addr: std::net::SocketAddr = format!("{VIP}:80").parse().unwrap();
    let answer = tb.client.run(move || -> std::io::Result<dispatcher_testbed::websphere::Response> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        (&s).write_all(b"GET /loop HTTP/1.1\r\nHost: a\r\n\r\n")?;
        read_response(&mut BufReader::new(s))
    });
    // What more could come would come within this (a hop takes well under a millisecond).
    std::thread::sleep(Duration::from_millis(500));
    let n = relayed.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let _ = relay.join();
    assert!(n <= 2, "one request went through the loop {n} times: {answer:?}");
    let r = answer.expect("an answer");
    assert_eq!(r.status, 508, "{r:?}");
    let cfg = tb.workdir.join("dispatcher.toml");
    let m = tb.dispatcher_cmd(&["metrics", "--config", cfg.to_str().unwrap()]);
    assert!(m.contains("\ndispatcher_http_loops_total 1\n"), "{m}");
    assert!(tb.log("dispatcher").contains("forwarding loop"), "{}", tb.log("dispatcher"));
}

/// The per-source count is shared with a reload's successor: the connections a source
/// holds on the previous listeners still count against it.
#[test]
fn the_per_source_count_survives_a_reload() {
    let b = bed("max_connections_per_source = 4\nmax_connection_rate_per_source = 0\n");
    let (answers, _held) = open_and_ask(&b.tb.client, b.addr, 4);
    assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|r| r.status == 200)), "{answers:?}");
    let cfg = b.tb.workdir.join("dispatcher.toml");
    let out = b.tb.dispatcher_cmd(&["reload", "--config", cfg.to_str().unwrap()]);
    assert!(out.contains("reloaded"), "{out}");
    let (answers, _more) = open_and_ask(&b.tb.client, b.addr, 2);
    for a in &answers {
        assert_refusal(a.as_ref().expect("an answer"), "too many connections from your address");
    }
}
