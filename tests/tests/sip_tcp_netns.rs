//! SIP VIPs over TCP and TLS (needs root): the agent terminates the callers'
//! connections and routes each message through the clone table to WebSphere-like SIP
//! containers in replica pairs, on pooled connections. SIPp calls over TCP (`-t t1`) and,
//! through a TLS relay of the harness, over TLS; a container killed or frozen mid-call;
//! a container's own BYE routed back by our Record-Route; hostile streams. The verdict
//! is SIPp's statistics, the containers' logs and the agent's counters.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::Arc,
    time::{Duration, Instant},
};

use dispatcher_testbed::{
    netns::{rss_kib, Testbed, CLIENT_IP},
    sipcontainer::SipCluster,
    sipp,
    tls::{certificate_entry, Pki},
};

const VIP: &str = "10.0.151.1";
const PORT: u16 = 5060;
const TLS_PORT: u16 = 5061;

/// `n` containers over TCP behind a SIP VIP with `transport = "tcp"` (and, first, one
/// with `"tls"` on 5061 when `tls`: its containers are checked on its `backend_port`,
/// 5060, not on its own port); `fall` failed checks take one down;
/// `http`: `[http]` lines. The dispatcher has learned the logical names.
struct Bed {
    tb: Testbed,
    sip: Arc<SipCluster>,
    pki: Pki,
    cfg: std::path::PathBuf,
}

fn bed(n: usize, fall: u32, http: &str, tls: bool, extra_vip: &str) -> Bed {
    let mut tb = Testbed::new(n, &[VIP]);
    tb.add_local_vip(VIP);
    let sip = SipCluster::new(n);
    tb.start_sip_tcp(&sip, PORT);
    let pki = Pki::new(&tb.workdir);
    let tls_vip = if tls {
        let (cert, key) = pki.leaf("ca", "sip", "sip.example.test", &["sip.example.test"], 20);
        format!(
            "\n[[vip]]\nname = \"siptls\"\naddress = \"{VIP}\"\nport = {TLS_PORT}\nmode = \"sip\"\ntransport = \"tls\"\nbackend_port = {PORT}\n[vip.tls]\n{}",
            certificate_entry(&cert, &key, &[])
        )
    } else {
        String::new()
    };
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\n{http}\n[health]\ninterval = \"200ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = {fall}\n\n{}\n{tls_vip}\n[[vip]]\nname = \"siptcp\"\naddress = \"{VIP}\"\nport = {PORT}\nmode = \"sip\"\ntransport = \"tcp\"\n{extra_vip}",
        tb.instance(),
        tb.backend_config(&[])
    );
    let cfg = tb.write_config(&text);
    tb.start_dispatcher(&cfg);
    tb.wait_for_clone_table(n as u64, Duration::from_secs(10));
    Bed { tb, sip, pki, cfg }
}

/// The agent's SIP-over-stream outcomes (`dispatcher_sip_stream_messages_total`).
fn outcomes(tb: &Testbed) -> BTreeMap<String, u64> {
    let (_, body) = tb.admin("GET", "/status").expect("status");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    serde_json::from_value(st["counters"]["by_label"]["sip_stream_messages"].clone()).unwrap_or_default()
}

fn counter(tb: &Testbed, key: &str) -> u64 {
    let (_, body) = tb.admin("GET", "/status").expect("status");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    st["counters"][key].as_u64().unwrap_or(0)
}

fn sipp_run(tb: &mut Testbed, target: &str, local_ip: &str, calls: u32, rate: u32, pause_ms: u32, tag: &str) {
    let client = tb.client.clone();
    let run = sipp::Run { ns: &client, target, local_ip, calls, rate, pause_ms, scenario: None };
    sipp::start_with(tb, &run, tag, &["-t", "t1"]);
}

/// SIPp's calls over TCP (`-t t1`, straight to the VIP) or over TLS (through the
/// harness's relay in front of SIPp, to the TLS VIP, the certificate checked).
fn start_calls(b: &mut Bed, tls: bool, calls: u32, rate: u32, pause_ms: u32, tag: &str) {
    if tls {
        let relay: SocketAddr = "127.0.0.1:15061".parse().unwrap();
        let target: SocketAddr = format!("{VIP}:{TLS_PORT}").parse().unwrap();
        let client = b.tb.client.clone();
        sipp::start_tls_relay(&mut b.tb, &client, relay, target, &b.pki.dir.join("ca.pem"));
        sipp_run(&mut b.tb, &relay.to_string(), "127.0.0.1", calls, rate, pause_ms, tag);
    } else {
        sipp_run(&mut b.tb, &format!("{VIP}:{PORT}"), CLIENT_IP, calls, rate, pause_ms, tag);
    }
}

/// `calls` calls of 3 s at 25/s over four containers; container 0 dies while about half
/// are up. Every call completes, its dialogs end on its replica, none reaches a third
/// one. The outcomes counted.
fn calls_through_a_death(tls: bool, calls: u32) -> (Bed, BTreeMap<String, u64>) {
    let mut b = bed(4, 2, "", tls, "");
    start_calls(&mut b, tls, calls, 25, 3000, "sipp-kill");
    std::thread::sleep(Duration::from_millis(3500));
    let on_b0 = b.sip.seen().iter().filter(|s| s.container == 0 && s.method == "INVITE").count();
    b.tb.kill_servers_of(0);
    let (status, c) = sipp::finish(&mut b.tb, "sipp-kill", Duration::from_secs(100));
    let o = outcomes(&b.tb);
    eprintln!("SIPp: {c:?}; container 0 had taken {on_b0} INVITEs; outcomes {o:?}");
    assert!(on_b0 > 5, "container 0 owned dialogs when it died: {on_b0}");
    b.sip.assert_calls_kept(calls as u64, status, &c);
    assert!(b.sip.served_for_peer(1) > 0, "the replica took over container 0's dialogs");
    // Initial INVITEs by Call-ID, ACK and BYE by the To tag's logical name.
    assert!(o.get("call_id").copied().unwrap_or(0) >= calls as u64, "{o:?}");
    assert!(o.get("to_tag").copied().unwrap_or(0) >= 2 * calls as u64, "{o:?}");
    assert!(o.get("replica").copied().unwrap_or(0) > 0, "{o:?}");
    assert_eq!(o.get("invalid"), Some(&0), "{o:?}");
    assert_eq!(o.get("unknown_ln"), Some(&0), "{o:?}");
    (b, o)
}

/// Container 0 stops answering for 3 s mid-call (SIGSTOP-like: its connections stay
/// open) while the calls' BYEs come: what it swallowed is routed again when it goes
/// down, what came while it was suspect is held, then its replica serves them. 0 failed
/// calls; no message left held.
fn calls_through_a_freeze(tls: bool) {
    let mut b = bed(2, 4, "hold_time = \"5s\"\n", tls, "");
    // Calls start over 3 s and end 4 s later: the freeze at 4.5 s meets their BYEs.
    start_calls(&mut b, tls, 60, 20, 4000, "sipp-freeze");
    std::thread::sleep(Duration::from_millis(4500));
    b.sip.freeze(0, true);
    std::thread::sleep(Duration::from_millis(3000));
    b.sip.freeze(0, false);
    let (status, c) = sipp::finish(&mut b.tb, "sipp-freeze", Duration::from_secs(100));
    let o = outcomes(&b.tb);
    eprintln!("SIPp: {c:?}; outcomes {o:?}");
    b.sip.assert_calls_kept(60, status, &c);
    assert!(b.sip.served_for_peer(1) > 0, "the replica took over container 0's dialogs");
    // Which of the two the freeze met depends on timing; one of them it met.
    let (held, rerouted) = (o.get("held").copied().unwrap_or(0), o.get("rerouted").copied().unwrap_or(0));
    assert!(held + rerouted > 0, "held while suspect, or swallowed and routed again: {o:?}");
    assert_eq!(counter(&b.tb, "held_now"), 0, "nothing is still held");
}

#[test]
fn calls_over_tcp_survive_a_containers_death() {
    let (b, o) = calls_through_a_death(false, 120);
    let status = b.tb.dispatcher_cmd(&["status", "--config", b.cfg.to_str().unwrap()]);
    let line = status.lines().find(|l| l.starts_with("sip over tcp/tls: connections=")).unwrap_or_default();
    assert!(line.contains(&format!(" refused=0 messages call_id:{},", o["call_id"])), "{status}");
    let (_, metrics) = b.tb.admin("GET", "/metrics").expect("metrics");
    assert!(metrics.contains("dispatcher_sip_stream_messages_total{outcome=\"to_tag\"}"), "{metrics}");
    dispatcher_testbed::promtool_check(&metrics).expect("the metrics pass promtool");
}

#[test]
fn calls_over_tcp_survive_a_frozen_container() {
    calls_through_a_freeze(false);
}

/// Reads one SIP message (header section and Content-Length body) from `s`.
fn read_msg(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..h + 4]).into_owned();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("Content-Length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= h + 4 + len {
                let m = String::from_utf8_lossy(&buf[..h + 4 + len]).into_owned();
                buf.drain(..h + 4 + len);
                return Some(m);
            }
        }
        if Instant::now() > deadline {
            return None;
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => {}
        }
    }
}

fn connect(tb: &Testbed, port: u16) -> TcpStream {
    let addr: SocketAddr = format!("{VIP}:{port}").parse().unwrap();
    let s = tb.client.run(move || TcpStream::connect(addr)).expect("connect to the VIP");
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    s
}

fn invite(call_id: &str) -> String {
    format!(
        "INVITE sip:svc@{VIP}:{PORT} SIP/2.0\r\nVia: SIP/2.0/TCP {CLIENT_IP}:5099;branch=z9hG4bK-{call_id}\r\nFrom: <sip:raw@client>;tag=abc\r\nTo: <sip:svc@{VIP}>\r\nCall-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:raw@{CLIENT_IP}:5099;transport=tcp>\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    )
}

/// A container ends a dialog itself: its BYE carries our Record-Route as its Route,
/// and reaches the caller on the caller's own connection (RFC 5923 style), with our Via
/// on top and our Route taken off; the caller's 200 goes back to that container. A
/// CRLF ping on the connection is answered with one CRLF.
#[test]
fn a_containers_bye_reaches_the_caller_by_our_record_route() {
    let Bed { tb, sip, .. } = bed(2, 2, "", false, "");
    let mut s = connect(&tb, PORT);
    let mut buf = Vec::new();
    s.write_all(b"\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut pong = [0u8; 8];
    let n = s.read(&mut pong).unwrap_or(0);
    assert_eq!(&pong[..n], b"\r\n", "a CRLF ping gets a CRLF pong");

    s.write_all(invite("rr-1").as_bytes()).unwrap();
    let ok = read_msg(&mut s, &mut buf).expect("the INVITE's answer");
    assert!(ok.starts_with("SIP/2.0 200"), "{ok}");
    let vias: Vec<&str> = ok.lines().filter(|l| l.starts_with("Via:")).collect();
    assert_eq!(vias, [format!("Via: SIP/2.0/TCP {CLIENT_IP}:5099;branch=z9hG4bK-rr-1")], "our Via came off: {ok}");
    assert!(ok.contains(&format!("Record-Route: <sip:{VIP}:{PORT};transport=tcp;lr;dsp=")), "{ok}");
    let owner = sip.seen().iter().find(|x| x.call_id == "rr-1").map(|x| x.container).expect("a container took it");

    assert!(sip.uas_bye(owner, "rr-1"), "the container sends its BYE");
    let bye = read_msg(&mut s, &mut buf).expect("the container's BYE on the caller's connection");
    assert!(bye.starts_with("BYE "), "{bye}");
    assert!(bye.contains(&format!("Via: SIP/2.0/TCP {VIP}:{PORT};branch=z9hG4bK-dsp-u")), "our Via on top: {bye}");
    assert!(!bye.contains("dsp=c"), "our Route came off: {bye}");
    // The caller's 200 (its Vias copied) goes back to the container.
    let mut resp = String::from("SIP/2.0 200 OK\r\n");
    for l in bye.lines().filter(|l| {
        l.starts_with("Via:")
            || l.starts_with("Call-ID:")
            || l.starts_with("CSeq:")
            || l.starts_with("From:")
            || l.starts_with("To:")
    }) {
        resp += l;
        resp += "\r\n";
    }
    resp += "Content-Length: 0\r\n\r\n";
    s.write_all(resp.as_bytes()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    while sip.responses.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(*sip.responses.lock().unwrap(), [(owner, "SIP/2.0 200 OK".to_string())], "the container got its answer");
    let o = outcomes(&tb);
    assert_eq!((o["container_request"], o["keepalive"]), (1, 1), "{o:?}");
}

/// Hostile streams, each with its outcome: no Content-Length (400, closed), a header
/// section without end (513, closed), a Content-Length larger than what follows and a
/// slowloris header (closed at the timeouts); none of them reaches a container. Idle
/// connections cost bounded memory, and past `max_connections` a connection is closed
/// at once.
#[test]
fn hostile_streams_end_as_they_should_and_reach_no_container() {
    let http = "header_timeout = \"1s\"\nbody_timeout = \"1s\"\nmax_header_bytes = 8192\n";
    let Bed { tb, sip, .. } = bed(2, 2, http, false, "max_connections = 10000\n");
    let closed = |s: &mut TcpStream, within: Duration| {
        let deadline = Instant::now() + within;
        let mut got = Vec::new();
        loop {
            let mut b = [0u8; 4096];
            match s.read(&mut b) {
                Ok(0) => return (true, String::from_utf8_lossy(&got).into_owned()),
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    return (true, String::from_utf8_lossy(&got).into_owned())
                }
                Err(_) => {}
            }
            if Instant::now() > deadline {
                return (false, String::from_utf8_lossy(&got).into_owned());
            }
        }
    };
    // No Content-Length.
    let mut s = connect(&tb, PORT);
    s.write_all(invite("h-nolen").replace("Content-Length: 0\r\n", "").as_bytes()).unwrap();
    let (gone, said) = closed(&mut s, Duration::from_secs(3));
    assert!(gone && said.starts_with("SIP/2.0 400 Missing Content-Length\r\n"), "{gone} {said}");
    assert!(said.contains("Call-ID: h-nolen"), "{said}");
    // Max-Forwards 0: 483, not forwarded, and the connection goes on (a CRLF ping after
    // it is answered).
    let mut s = connect(&tb, PORT);
    let mut buf = Vec::new();
    s.write_all(invite("h-hops").replace("Max-Forwards: 70", "Max-Forwards: 0").as_bytes()).unwrap();
    let hops = read_msg(&mut s, &mut buf).expect("an answer");
    assert!(hops.starts_with("SIP/2.0 483 Too Many Hops\r\n"), "{hops}");
    s.write_all(b"\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut pong = [0u8; 8];
    assert_eq!(s.read(&mut pong).ok(), Some(2), "the connection goes on");
    drop(s);
    // A request just within the caller's bound (8,192 bytes of header) with a long Via:
    // the container's answer copies it, adds ours and the Record-Route, and is larger
    // than the caller's bound. It comes back all the same (a container's connection has
    // a bound of its own), and the container shared by every caller is not made suspect.
    let mut s = connect(&tb, PORT);
    let mut buf = Vec::new();
    let plain = invite("big-via");
    let pad = 8192 - 10 - plain.len() - "Via: SIP/2.0/TCP 10.9.9.9:5060;branch=z9hG4bK-bigvia;x=\r\n".len();
    let long_via = format!("Via: SIP/2.0/TCP 10.9.9.9:5060;branch=z9hG4bK-bigvia;x={}\r\n", "a".repeat(pad));
    let big = plain.replacen("Via: ", &format!("{long_via}Via: "), 1);
    assert!(big.len() < 8192 && big.len() > 8150, "{}", big.len());
    s.write_all(big.as_bytes()).unwrap();
    let answer = read_msg(&mut s, &mut buf).expect("the container's answer");
    assert!(answer.starts_with("SIP/2.0 200"), "{}", &answer[..answer.len().min(200)]);
    assert!(answer.len() > 8192, "the answer is past the caller's bound: {} bytes", answer.len());
    drop(s);
    // Bare LF line ends: 400 and the connection closed, nothing forwarded (a container
    // reading CRLF only would take the next message for part of this one).
    let mut s = connect(&tb, PORT);
    s.write_all(invite("h-lf").replace("\r\n", "\n").as_bytes()).unwrap();
    let (gone, said) = closed(&mut s, Duration::from_secs(3));
    assert!(gone && said.starts_with("SIP/2.0 400 Bad Request\r\n"), "{gone} {said}");
    // A header section without end.
    let mut s = connect(&tb, PORT);
    let mut endless = format!("INVITE sip:svc@{VIP} SIP/2.0\r\nCall-ID: h-endless\r\n");
    while endless.len() < 10_000 {
        endless += "X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    }
    let _ = s.write_all(endless.as_bytes());
    let (gone, said) = closed(&mut s, Duration::from_secs(3));
    assert!(gone && said.starts_with("SIP/2.0 513 Message Too Large\r\n"), "{gone} {said}");
    // A Content-Length larger than what follows: closed after header + body timeouts.
    let mut s = connect(&tb, PORT);
    let t0 = Instant::now();
    s.write_all(invite("h-short").replace("Content-Length: 0", "Content-Length: 500").as_bytes()).unwrap();
    s.write_all(b"v=0\r\n").unwrap();
    let (gone, said) = closed(&mut s, Duration::from_secs(5));
    assert!(gone && said.is_empty(), "{gone} {said:?}");
    assert!(t0.elapsed() >= Duration::from_millis(900), "waited for the body: {:?}", t0.elapsed());
    // Slowloris: a byte every 200 ms; closed at the 1 s header deadline.
    let mut s = connect(&tb, PORT);
    let t0 = Instant::now();
    let slow = invite("h-slow");
    let mut open = true;
    for b in slow.as_bytes().iter().take(30) {
        if s.write_all(&[*b]).is_err() {
            open = false;
            break;
        }
        let mut x = [0u8; 16];
        if let Ok(0) = s.read(&mut x) {
            open = false;
            break;
        }
    }
    assert!(!open, "the trickled header was cut off");
    assert!(t0.elapsed() < Duration::from_secs(3), "at the header deadline: {:?}", t0.elapsed());

    let o = outcomes(&tb);
    assert_eq!((o["no_length"], o["too_large"], o["invalid"]), (1, 1, 2), "{o:?}");
    assert_eq!(o.get("container_framing"), Some(&0), "{o:?}");
    assert_eq!(o["incomplete"], 2, "{o:?}");
    let reached: Vec<_> = sip.seen().into_iter().filter(|x| x.call_id.starts_with("h-")).collect();
    assert!(reached.is_empty(), "nothing of these reached a container: {reached:?}");

    // Idle connections: 10,000 of them cost the agent a few KiB each; the cap (10,000)
    // closes the next ones at once.
    let pid = tb.pid_of("dispatcher").unwrap();
    let before = rss_kib(pid);
    let n = 10_000;
    let addr: SocketAddr = format!("{VIP}:{PORT}").parse().unwrap();
    let idle: Vec<TcpStream> = tb.client.run(move || (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect());
    let deadline = Instant::now() + Duration::from_secs(30);
    while counter(&tb, "sip_stream_connections") < n as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(counter(&tb, "sip_stream_connections"), n as u64);
    let after = rss_kib(pid);
    let per = (after.saturating_sub(before) * 1024) / n as u64;
    eprintln!("RSS {before} KiB -> {after} KiB with {n} idle SIP connections: {per} bytes each");
    assert!(per < 8 * 1024, "{per} bytes per idle connection");
    let more: Vec<TcpStream> = tb.client.run(move || (0..100).filter_map(|_| TcpStream::connect(addr).ok()).collect());
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter(&tb, "sip_stream_refused") < 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(counter(&tb, "sip_stream_refused"), 100, "past max_connections: closed at once");
    assert_eq!(counter(&tb, "sip_stream_connections"), n as u64);
    drop((idle, more));
}

/// SIP over TLS, through the harness's relay: container 0 dies mid-call.
#[test]
fn calls_over_tls_survive_a_containers_death() {
    calls_through_a_death(true, 100);
}

/// SIP over TLS: container 0 frozen mid-call.
#[test]
fn calls_over_tls_survive_a_frozen_container() {
    calls_through_a_freeze(true);
}
