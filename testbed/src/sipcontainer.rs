//! A WebSphere-like SIP container for the tests: a UAS that serves one logical name
//! (`ln<i>`), puts its session ID (`ln<i>.<n>_1_1`) in the To tag of its answers,
//! replicates every dialog to its peer replica at once, answers `481 Call/Transaction
//! Does Not Exist` to an in-dialog request for a dialog it holds neither as owner nor as
//! replica (so a misroute shows in SIPp's counts), and logs every message it receives.
//! `OPTIONS` (the dispatcher's health check) is answered `200 OK` with the container's
//! session-ID-shaped To tag (or, as some containers do, without one; or not at all while
//! calls are served, as under an overload).
//!
//! Over UDP (`serve`) and over TCP (`serve_tcp`: messages framed by Content-Length, each
//! answered on the connection it came on). Over TCP a container can also end a dialog
//! itself (`uas_bye`: a BYE routed by the INVITE's Record-Route, as a UAS does).

use std::{
    collections::HashMap,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

/// One message as a container saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub container: usize,
    pub method: String,
    pub call_id: String,
    /// The container that created the dialog (`None`: an initial request, or unknown).
    pub dialog_owner: Option<usize>,
    /// An in-dialog request for a dialog this container does not hold: a misroute.
    pub unknown_dialog: bool,
    /// The message's size as the container's socket read it (a datagram the kernel
    /// reassembled from IP fragments arrives whole, or not at all).
    pub bytes: usize,
}

/// A dialog's creating container, its INVITE, and the connection it came on.
type Invite = (usize, String, Arc<Mutex<TcpStream>>);

pub struct SipCluster {
    peers: Vec<Option<usize>>,
    /// Per container: Call-ID -> (creating container, To tag), own and replicated.
    dialogs: Vec<Mutex<HashMap<String, (usize, String)>>>,
    alive: Vec<AtomicBool>,
    /// A frozen container (as under SIGSTOP) reads and answers nothing.
    frozen: Vec<AtomicBool>,
    pub log: Mutex<Vec<Seen>>,
    next: AtomicU64,
    /// 481 answers sent.
    pub not_found: AtomicU64,
    /// `OPTIONS` answered without a To tag (containers that do not name their logical
    /// name there: the dispatcher must learn it from the dialogs).
    pub untagged_options: AtomicBool,
    /// Per container: `OPTIONS` left unanswered while calls are served (an overload
    /// that delays the checks' answers past their timeout).
    options_muted: Vec<AtomicBool>,
    /// Over TCP: each dialog's INVITE and the connection it came on (for `uas_bye`).
    invites: Mutex<HashMap<String, Invite>>,
    /// Responses received (to a container's own BYE), by status line.
    pub responses: Mutex<Vec<(usize, String)>>,
}

const POLL: Duration = Duration::from_millis(50);

impl SipCluster {
    /// `n` containers, paired 0-1, 2-3, ... as peer replicas.
    pub fn new(n: usize) -> Arc<SipCluster> {
        Arc::new(SipCluster {
            peers: (0..n).map(|i| if i ^ 1 < n { Some(i ^ 1) } else { None }).collect(),
            dialogs: (0..n).map(|_| Mutex::new(HashMap::new())).collect(),
            alive: (0..n).map(|_| AtomicBool::new(true)).collect(),
            frozen: (0..n).map(|_| AtomicBool::new(false)).collect(),
            log: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            not_found: AtomicU64::new(0),
            untagged_options: AtomicBool::new(false),
            options_muted: (0..n).map(|_| AtomicBool::new(false)).collect(),
            invites: Mutex::new(HashMap::new()),
            responses: Mutex::new(Vec::new()),
        })
    }

    pub fn logical_name(i: usize) -> String {
        format!("ln{i}")
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }

    /// In-dialog messages that reached a container that is neither the dialog's creator
    /// nor its peer replica, or one that held no copy. Must stay empty.
    pub fn misroutes(&self) -> Vec<String> {
        self.seen()
            .iter()
            .filter(|s| {
                s.unknown_dialog
                    || s.dialog_owner.is_some_and(|o| o != s.container && self.peers[o] != Some(s.container))
            })
            .map(|s| format!("{} {} at container {} (owner {:?})", s.method, s.call_id, s.container, s.dialog_owner))
            .collect()
    }

    /// SIPp's verdict (`sipp::finish`) and the containers' logs: every one of `calls`
    /// completed, no 481, no message to a container that neither created its dialog nor
    /// holds its replica.
    pub fn assert_calls_kept(
        &self,
        calls: u64,
        status: std::process::ExitStatus,
        c: &std::collections::HashMap<String, u64>,
    ) {
        assert_eq!(c.get("SuccessfulCall"), Some(&calls), "every call completed: {c:?}");
        assert_eq!(c.get("FailedCall"), Some(&0), "{c:?}");
        assert!(status.success(), "SIPp's exit status: {status}");
        assert_eq!(self.not_found.load(Ordering::SeqCst), 0, "no 481");
        let misroutes = self.misroutes();
        assert!(misroutes.is_empty(), "from the containers' logs: {misroutes:?}");
    }

    /// Messages container `i` served for dialogs its peer created (after a failover).
    pub fn served_for_peer(&self, i: usize) -> usize {
        self.seen().iter().filter(|s| s.container == i && s.dialog_owner.is_some_and(|o| o != i)).count()
    }

    pub fn set_alive(&self, i: usize, alive: bool) {
        self.alive[i].store(alive, Ordering::SeqCst);
    }

    /// The container's process dies (its servers are stopped by the caller): its
    /// dialogs are gone from its memory.
    pub fn kill(&self, i: usize) {
        self.alive[i].store(false, Ordering::SeqCst);
        self.dialogs[i].lock().unwrap().clear();
    }

    /// It starts again and gets its copies back from its peer replica (its own
    /// dialogs the peer kept, and the peer's it replicates).
    pub fn revive(&self, i: usize) {
        if let Some(p) = self.peers[i] {
            let copies = self.dialogs[p].lock().unwrap().clone();
            *self.dialogs[i].lock().unwrap() = copies;
        }
    }

    pub fn freeze(&self, i: usize, frozen: bool) {
        self.frozen[i].store(frozen, Ordering::SeqCst);
    }

    /// Container `i` leaves `OPTIONS` unanswered (`true`) while it serves calls.
    pub fn mute_options(&self, i: usize, muted: bool) {
        self.options_muted[i].store(muted, Ordering::SeqCst);
    }

    fn answer(&self, i: usize, msg: &str) -> Option<String> {
        let bytes = msg.len();
        let first = msg.lines().next()?;
        if first.starts_with("SIP/2.0") {
            return None;
        }
        let method = first.split(' ').next()?.to_string();
        let call_id = header(msg, &["call-id", "i"])?.to_string();
        let to_has_tag = header(msg, &["to", "t"]).is_some_and(|t| t.to_ascii_lowercase().contains(";tag="));
        if method == "OPTIONS" {
            self.record(i, &method, &call_id, None, false, bytes);
            if self.options_muted[i].load(Ordering::SeqCst) {
                return None;
            }
            let tag = format!("{}.0_0_0", Self::logical_name(i));
            let tag = Some(tag.as_str()).filter(|_| !self.untagged_options.load(Ordering::SeqCst));
            return Some(response(msg, "200 OK", tag));
        }
        let held = self.dialogs[i].lock().unwrap().get(&call_id).cloned();
        if method == "INVITE" && !to_has_tag {
            // Initial, or a retransmission of it: one dialog per Call-ID.
            let (owner, tag) = match held {
                Some(d) => d,
                None => {
                    let n = self.next.fetch_add(1, Ordering::SeqCst);
                    let tag = format!("{}.{}{:06}_1_1", Self::logical_name(i), 1_700_000_000u64, n);
                    self.dialogs[i].lock().unwrap().insert(call_id.clone(), (i, tag.clone()));
                    if let Some(p) = self.peers[i].filter(|&p| self.alive[p].load(Ordering::SeqCst)) {
                        self.dialogs[p].lock().unwrap().insert(call_id.clone(), (i, tag.clone()));
                    }
                    (i, tag)
                }
            };
            self.record(i, &method, &call_id, Some(owner).filter(|&o| o != i), false, bytes);
            return Some(response(msg, "200 OK", Some(&tag)));
        }
        let Some((owner, tag)) = held else {
            self.record(i, &method, &call_id, None, true, bytes);
            if method == "ACK" {
                return None;
            }
            self.not_found.fetch_add(1, Ordering::SeqCst);
            return Some(response(msg, "481 Call/Transaction Does Not Exist", None));
        };
        self.record(i, &method, &call_id, Some(owner), false, bytes);
        match method.as_str() {
            "ACK" => None,
            "BYE" => {
                // The dialog ends on both copies (replicated).
                for c in std::iter::once(i).chain(self.peers[i]) {
                    self.dialogs[c].lock().unwrap().remove(&call_id);
                }
                Some(response(msg, "200 OK", Some(&tag)))
            }
            _ => Some(response(msg, "200 OK", Some(&tag))),
        }
    }

    fn record(&self, i: usize, method: &str, call_id: &str, owner: Option<usize>, unknown: bool, bytes: usize) {
        self.log.lock().unwrap().push(Seen {
            container: i,
            method: method.to_string(),
            call_id: call_id.to_string(),
            dialog_owner: owner,
            unknown_dialog: unknown,
            bytes,
        });
    }
}

/// The value of the first header with one of these names (case-insensitive).
fn header<'a>(msg: &'a str, names: &[&str]) -> Option<&'a str> {
    for line in msg.split("\r\n").skip(1) {
        if line.is_empty() {
            break;
        }
        let (n, v) = line.split_once(':')?;
        if names.iter().any(|x| n.trim().eq_ignore_ascii_case(x)) {
            return Some(v.trim());
        }
    }
    None
}

/// A response to `req`: its Via, From, Call-ID and CSeq copied, To with `tag` added if
/// it has none.
fn response(req: &str, status: &str, tag: Option<&str>) -> String {
    let mut out = format!("SIP/2.0 {status}\r\n");
    for line in req.split("\r\n").skip(1) {
        if line.is_empty() {
            break;
        }
        let name = line.split(':').next().unwrap_or("").trim().to_ascii_lowercase();
        match name.as_str() {
            "via" | "v" | "from" | "f" | "call-id" | "i" | "cseq" | "record-route" => {
                out += line;
                out += "\r\n";
            }
            "to" | "t" => {
                out += line;
                if let Some(tag) = tag.filter(|_| !line.to_ascii_lowercase().contains(";tag=")) {
                    out += &format!(";tag={tag}");
                }
                out += "\r\n";
            }
            _ => {}
        }
    }
    out += "Contact: <sip:container@127.0.0.1:5060>\r\nContent-Length: 0\r\n\r\n";
    out
}

/// Container `i` on `addr`:5060 (the VIP its frames arrive for, or its own address for
/// health checks) until `stop`. Answers leave from `addr`.
pub fn serve(cluster: Arc<SipCluster>, i: usize, addr: IpAddr, port: u16, stop: Arc<AtomicBool>) {
    let sock = UdpSocket::bind(SocketAddr::from((addr, port))).expect("bind the SIP container's socket");
    sock.set_read_timeout(Some(POLL)).unwrap();
    let mut buf = vec![0u8; 65535];
    cluster.set_alive(i, true);
    while !stop.load(Ordering::SeqCst) {
        let Ok((n, from)) = sock.recv_from(&mut buf) else { continue };
        if cluster.frozen[i].load(Ordering::SeqCst) {
            continue;
        }
        let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
        if let Some(resp) = cluster.answer(i, &msg) {
            let _ = sock.send_to(resp.as_bytes(), from);
        }
    }
    cluster.set_alive(i, false);
}

/// The length of the first whole message in `buf` (header section and Content-Length
/// body), if it is all there.
fn framed_len(buf: &[u8]) -> Option<usize> {
    let head = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let text = String::from_utf8_lossy(&buf[..head]);
    let len = text
        .split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.trim().eq_ignore_ascii_case("content-length") || n.trim().eq_ignore_ascii_case("l"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    (buf.len() >= head + len).then_some(head + len)
}

impl SipCluster {
    /// Container `i` ends dialog `call_id` itself: a BYE to the caller, its Route the
    /// INVITE's Record-Route, on the connection the INVITE came on. False when it holds
    /// no such dialog.
    pub fn uas_bye(&self, i: usize, call_id: &str) -> bool {
        let Some((owner, invite, conn)) = self.invites.lock().unwrap().get(call_id).cloned() else { return false };
        let Some((_, tag)) = self.dialogs[i].lock().unwrap().get(call_id).cloned() else { return false };
        if owner != i {
            return false;
        }
        let get = |names: &[&str]| header(&invite, names).unwrap_or("").to_string();
        let from = get(&["from", "f"]);
        let to = get(&["to", "t"]);
        let route = get(&["record-route"]);
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let bye = format!(
            "BYE sip:caller@10.0.0.2 SIP/2.0\r\nVia: SIP/2.0/TCP {}:5060;branch=z9hG4bK-uas-{n}\r\nRoute: {route}\r\nFrom: {to};tag={tag}\r\nTo: {from}\r\nCall-ID: {call_id}\r\nCSeq: 2 BYE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n",
            crate::netns::backend_ip(i)
        );
        for c in std::iter::once(i).chain(self.peers[i]) {
            self.dialogs[c].lock().unwrap().remove(call_id);
        }
        let ok = conn.lock().unwrap().write_all(bye.as_bytes()).is_ok();
        ok
    }

    /// One message that came over TCP on `conn`.
    fn answer_tcp(&self, i: usize, msg: &str, conn: &Arc<Mutex<TcpStream>>) -> Option<String> {
        if msg.starts_with("SIP/2.0") {
            self.responses.lock().unwrap().push((i, msg.lines().next().unwrap_or("").to_string()));
            return None;
        }
        let is_invite = msg.starts_with("INVITE ");
        let resp = self.answer(i, msg)?;
        if is_invite && resp.starts_with("SIP/2.0 200") {
            if let Some(call_id) = header(msg, &["call-id", "i"]) {
                let owner = self.dialogs[i].lock().unwrap().get(call_id).map(|d| d.0).unwrap_or(i);
                self.invites.lock().unwrap().insert(call_id.to_string(), (owner, msg.to_string(), conn.clone()));
            }
        }
        Some(resp)
    }
}

/// Container `i` over TCP on `addr`:`port` until `stop`: every connection read by a
/// thread of its own, each message answered on it. Stopping closes them all.
pub fn serve_tcp(cluster: Arc<SipCluster>, i: usize, addr: Ipv4Addr, port: u16, stop: Arc<AtomicBool>) {
    let listener = TcpListener::bind(SocketAddr::from((addr, port))).expect("bind the SIP container's TCP socket");
    listener.set_nonblocking(true).unwrap();
    let mut conns: Vec<(TcpStream, std::thread::JoinHandle<()>)> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let Ok((stream, _)) = listener.accept() else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        stream.set_nonblocking(false).unwrap();
        stream.set_read_timeout(Some(POLL)).unwrap();
        let keep = stream.try_clone().unwrap();
        let (c, stop) = (cluster.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let conn = Arc::new(Mutex::new(stream.try_clone().unwrap()));
            let mut rd = stream;
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 65536];
            while !stop.load(Ordering::SeqCst) {
                match rd.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        continue
                    }
                    Err(_) => break,
                }
                while let Some(len) = framed_len(&buf) {
                    let msg = String::from_utf8_lossy(&buf[..len]).into_owned();
                    buf.drain(..len);
                    if c.frozen[i].load(Ordering::SeqCst) {
                        continue;
                    }
                    if let Some(resp) = c.answer_tcp(i, &msg, &conn) {
                        let _ = conn.lock().unwrap().write_all(resp.as_bytes());
                    }
                }
                // Keepalive pings and stray line ends.
                while buf.starts_with(b"\r\n") {
                    buf.drain(..2);
                }
            }
        });
        conns.push((keep, thread));
    }
    for (s, t) in conns {
        let _ = s.shutdown(std::net::Shutdown::Both);
        let _ = t.join();
    }
}
