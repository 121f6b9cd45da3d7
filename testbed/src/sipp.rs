//! SIPp (Debian `sip-tester`) as the caller of the SIP tests, the demo and the SIP
//! benchmark: its built-in UAC scenario (INVITE, 200, ACK, pause, BYE, 200) run as a
//! testbed process, its own cumulative statistics as the verdict.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::ExitStatus,
    time::{Duration, Instant},
};

use crate::netns::{Ns, Testbed};

/// A SIPp run: `calls` calls at `rate` calls/s, each holding `pause_ms` between ACK and
/// BYE, from `local_ip`:5061 in `ns` to `target` (`addr:port`).
pub struct Run<'a> {
    pub ns: &'a Ns,
    pub target: &'a str,
    pub local_ip: &'a str,
    pub calls: u32,
    pub rate: u32,
    pub pause_ms: u32,
    /// A scenario file (`-sf`); `None`: SIPp's built-in UAC.
    pub scenario: Option<&'a Path>,
}

/// The statistics file of the run started as testbed process `tag`.
pub fn stats_file(tb: &Testbed, tag: &str) -> PathBuf {
    tb.workdir.join(format!("{tag}.csv"))
}

/// Starts the run as testbed process `tag` (stopped with the testbed if its user fails).
pub fn start(tb: &mut Testbed, run: &Run, tag: &str) {
    start_with(tb, run, tag, &[]);
}

/// As `start`, with more of SIPp's options (`-t t1`: SIP over one TCP connection).
pub fn start_with(tb: &mut Testbed, run: &Run, tag: &str, extra: &[&str]) {
    let stf = stats_file(tb, tag);
    let mut cmd = run.ns.command("sipp");
    match run.scenario {
        Some(f) => cmd.arg("-sf").arg(f),
        None => cmd.args(["-sn", "uac"]),
    };
    cmd.args([run.target, "-i", run.local_ip, "-p", "5061"])
        .args(extra)
        .args(["-m", &run.calls.to_string(), "-r", &run.rate.to_string(), "-d", &run.pause_ms.to_string()])
        .args(["-nostdin", "-timeout", "90s", "-timeout_error", "-trace_stat", "-trace_err", "-fd", "1"])
        .arg("-stf")
        .arg(&stf)
        .current_dir(&tb.workdir);
    tb.start(tag, cmd);
}

/// A UAC scenario like SIPp's built-in one (INVITE, optional provisional answers, 200,
/// ACK, pause, BYE, 200) whose INVITE carries an SDP offer of at least `sdp_bytes` bytes
/// (codecs and ICE candidates: an INVITE larger than a 1,500-byte MTU goes out in IP
/// fragments). Written by the tests into their working directory.
pub fn large_invite_scenario(sdp_bytes: usize) -> String {
    let mut sdp = String::from(
        "v=0\no=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]\ns=-\nc=IN IP[media_ip_type] [media_ip]\nt=0 0\nm=audio [media_port] RTP/AVP 0 8 18 101\na=rtpmap:0 PCMU/8000\na=rtpmap:8 PCMA/8000\na=rtpmap:18 G729/8000\na=rtpmap:101 telephone-event/8000\n",
    );
    let mut i = 0;
    while sdp.len() < sdp_bytes {
        sdp += &format!("a=candidate:{i} 1 UDP {} [local_ip] {} typ host generation 0\n", 2130706431 - i, 7000 + 2 * i);
        i += 1;
    }
    let head = |method: &str, cseq: &str, to_tag: &str| {
        format!(
            "{method} sip:[service]@[remote_ip]:[remote_port] SIP/2.0\nVia: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]\nFrom: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]\nTo: [service] <sip:[service]@[remote_ip]:[remote_port]>{to_tag}\nCall-ID: [call_id]\nCSeq: {cseq}\nContact: sip:sipp@[local_ip]:[local_port]\nMax-Forwards: 70\n"
        )
    };
    format!(
        "<?xml version=\"1.0\" encoding=\"ISO-8859-1\" ?>\n<scenario name=\"UAC with a large INVITE\">\n<send retrans=\"500\"><![CDATA[\n\n{}Content-Type: application/sdp\nContent-Length: [len]\n\n{sdp}\n]]></send>\n<recv response=\"100\" optional=\"true\"/>\n<recv response=\"180\" optional=\"true\"/>\n<recv response=\"200\" rtd=\"true\"/>\n<send><![CDATA[\n\n{}Content-Length: 0\n\n]]></send>\n<pause/>\n<send retrans=\"500\"><![CDATA[\n\n{}Content-Length: 0\n\n]]></send>\n<recv response=\"200\" crlf=\"true\"/>\n</scenario>\n",
        head("INVITE", "1 INVITE", ""),
        head("ACK", "1 ACK", "[peer_tag_param]"),
        head("BYE", "2 BYE", "[peer_tag_param]")
    )
}

/// Waits (at most `limit`) for the run to finish: SIPp's exit status and counters.
pub fn finish(tb: &mut Testbed, tag: &str, limit: Duration) -> (ExitStatus, HashMap<String, u64>) {
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = tb.child_exited(tag) {
            break st;
        }
        assert!(Instant::now() < deadline, "SIPp did not finish: {}", tb.log(tag));
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, counters(&stats_file(tb, tag)))
}

/// SIPp's cumulative counters (`SuccessfulCall`, `FailedCall`, `Retransmissions`, ...)
/// from the last line of its statistics file.
pub fn counters(stf: &Path) -> HashMap<String, u64> {
    let text = std::fs::read_to_string(stf).unwrap_or_else(|e| panic!("SIPp statistics {}: {e}", stf.display()));
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let head: Vec<&str> = lines.next().expect("header").split(';').collect();
    let last: Vec<&str> = lines.next_back().expect("a statistics line").split(';').collect();
    head.iter()
        .zip(last)
        .filter(|(h, _)| h.ends_with("(C)"))
        .filter_map(|(h, v)| Some((h.trim_end_matches("(C)").to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// A TLS client relay for SIPp (Debian's SIPp is built without TLS): it listens on
/// `listen` in `ns`, and each connection SIPp opens is carried over TLS (rustls, the
/// server's certificate checked against `ca`) to `target`. Stops with the testbed.
pub fn start_tls_relay(
    tb: &mut Testbed,
    ns: &Ns,
    listen: std::net::SocketAddr,
    target: std::net::SocketAddr,
    ca: &Path,
) {
    let config = crate::websphere::tls_client_config(ca);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let listener = ns.run(move || std::net::TcpListener::bind(listen).expect("bind the TLS relay"));
    listener.set_nonblocking(true).unwrap();
    let ns2 = ns.clone();
    let s2 = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut conns = Vec::new();
        while !s2.load(std::sync::atomic::Ordering::SeqCst) {
            let Ok((plain, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            };
            let (config, stop) = (config.clone(), s2.clone());
            let upstream = ns2.run(move || std::net::TcpStream::connect(target));
            let Ok(upstream) = upstream else { continue };
            conns.push(std::thread::spawn(move || relay(plain, upstream, config, stop)));
        }
        for c in conns {
            let _ = c.join();
        }
    });
    tb.on_drop(stop, thread);
}

/// Copies both ways between SIPp's plain connection and the TLS one until either ends.
fn relay(
    mut plain: std::net::TcpStream,
    tcp: std::net::TcpStream,
    config: std::sync::Arc<rustls::ClientConfig>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    use std::io::{Read, Write};
    let name = rustls::pki_types::ServerName::try_from("sip.example.test").unwrap();
    let conn = rustls::ClientConnection::new(config, name).expect("TLS client");
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let tick = Some(Duration::from_millis(5));
    plain.set_nonblocking(false).unwrap();
    plain.set_read_timeout(tick).unwrap();
    tls.sock.set_read_timeout(tick).unwrap();
    let mut buf = vec![0u8; 65536];
    let idle = |e: &std::io::Error| matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut);
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        match plain.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if tls.write_all(&buf[..n]).and_then(|_| tls.flush()).is_err() {
                    break;
                }
            }
            Err(e) if idle(&e) => {}
            Err(_) => break,
        }
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if plain.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if idle(&e) => {}
            Err(_) => break,
        }
    }
}
