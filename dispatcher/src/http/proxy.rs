//! One client connection: read a request head, route it, send it upstream over a pooled
//! connection, stream the body both ways, learn clone IDs from the response, repeat while
//! both sides keep the connection.

use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use bytes::{Bytes, BytesMut};
use tokio::{io::AsyncRead, net::TcpStream, sync::watch};
use tracing::Instrument as _;

use super::{
    answer::Answer,
    attempt::{read_ahead, send, Attempt, Downstream, Reply},
    client::{Client, ClientRead, Sink},
    hold::{await_shared, hold, HoldEnd},
    pool::{Pool, Upstream},
    respond::{closes, deliver, forward_interim, inline_small_body, upgrade, Undelivered},
    retry::{is_idempotent, Retries},
    route::{Decision, RouteCtx, VipRoutes},
    session, Counted, Protocol,
};
use crate::capacity::queue::{Refused, Slot};
use crate::http1::{
    body::{Inbound, RelayError, Timeouts},
    head::{parse_request, Framing, HeadLimits, Header, Reject, RequestHead, ResponseHead},
    io::{ReadSide, WriteSide},
    rewrite::{build_request, build_response, is},
    write_client, ERROR_WRITE_DEADLINE,
};
use crate::{
    access_log::{term, AccessLog, Conns, Decision as LogDecision, Entry, MAX_REQUEST_LINE},
    config::{HttpSettings, Redirect, SessionFormat},
    state::{Backend, Servers},
    tls::server::ServerTls,
};
use dispatcher_common::BackendState;

/// Everything a connection on one HTTP VIP needs.
pub struct VipCtx {
    /// The VIP's name (in its connections' log span).
    pub name: Arc<str>,
    /// The VIP's authority (`address[:port]`), the Host of a request that has none.
    pub host: String,
    /// Index in `Config::vips` (for the per-VIP counters).
    pub vip_index: usize,
    /// The VIP's port: a request's when its Host names none (route matching).
    pub port: u16,
    /// The routes that apply to the VIP, and through them the farms it serves.
    pub routes: Arc<VipRoutes>,
    /// Indexed by backend id; `Some` for the backends its routes reach.
    pub pools: Vec<Option<Pool>>,
    pub servers: Arc<Servers>,
    /// The server generation's capacity and per-VIP counts.
    pub capacity: Arc<crate::capacity::Capacity>,
    pub settings: HttpSettings,
    pub limits: HeadLimits,
    /// Statuses that make the answering backend suspect (`health.suspect_on_status`).
    pub suspect_on_status: Vec<u16>,
    /// TLS termination (an HTTPS VIP).
    pub tls: Option<Arc<ServerTls>>,
    /// The `X-Forwarded-Proto` and `X-Forwarded-Port` lines every forwarded head gets.
    pub forwarded: Vec<u8>,
    /// A VIP that answers `308` to its HTTPS VIP instead of forwarding.
    pub redirect: Option<Redirect>,
    /// `[access_log]`: where its requests are logged.
    pub log: Option<LogTo>,
    /// `insert_cookie`: clients without a session kept on one backend.
    pub persist: Option<super::persist::Persist>,
    /// Whether this dispatcher keeps a connection after its response (steering, leave).
    pub ownership: Arc<crate::steering::Ownership>,
    /// Connection takeover: plain HTTP/1.x connections are registered (`takeover::outbox`).
    pub takeover: Option<crate::takeover::Http>,
    /// The VIP's address (with `port`: where rebuilt connections are adopted).
    pub address: std::net::IpAddr,
    /// A plain VIP that serves HTTP/2 by prior knowledge (`h2c`).
    pub h2c: bool,
}

/// After the listener stops: how long an idle keep-alive client has to send its next
/// request (answered, with `Connection: close`) before its connection is closed.
const STOP_GRACE: Duration = Duration::from_secs(1);

enum Next {
    KeepAlive,
    Close,
}

enum HeadRead {
    /// A head, and when its first byte was at hand.
    Head(RequestHead, Instant),
    /// The client closed (or idled out, or the agent is stopping) between requests.
    Closed,
    /// A bad or late head, and when its first byte was at hand.
    Reject(Reject, Instant),
}

/// The dispatcher's own answer to a request, as the access log records it.
async fn refuse(client: &mut Client, t: &mut Trace, answer: Answer) {
    t.status = answer.status;
    client.answer(answer).await;
}

/// An HTTP VIP's access log: the writer, and the names its entries carry.
#[derive(Clone)]
pub struct LogTo {
    pub sink: Arc<AccessLog>,
    pub vip: Arc<str>,
    /// Indexed like `Config::backends`.
    pub backends: Arc<[Arc<str>]>,
}

/// What happened to one request, for the access log (kept whether or not it is logged:
/// a few instants and numbers).
struct Trace {
    started: Instant,
    head_done: Instant,
    backend: Option<usize>,
    decision: LogDecision,
    /// The clone ID (route, logical name) it was routed by; filled only when logging.
    session: Option<Box<[u8]>>,
    held: bool,
    wait: Duration,
    retries: u32,
    connected: Option<Instant>,
    response: Option<Instant>,
    status: u16,
    /// The farm and the route it was routed by (filled only when logging).
    farm: Option<Arc<super::route::FarmCtx>>,
    route: Option<Arc<str>>,
    /// When its last attempt asked for a server connection (the connect time runs from
    /// here).
    connecting: Option<Instant>,
    /// Its retries went to another server than the first.
    redispatched: bool,
    /// HAProxy's termination state: who or what ended it, in which phase (`--`: normal).
    term: [u8; 2],
}

impl Trace {
    fn new(started: Instant) -> Trace {
        Trace {
            started,
            head_done: Instant::now(),
            backend: None,
            decision: LogDecision::None,
            session: None,
            held: false,
            wait: Duration::ZERO,
            retries: 0,
            connected: None,
            response: None,
            status: 0,
            farm: None,
            route: None,
            connecting: None,
            redispatched: false,
            term: term::NORMAL,
        }
    }

    /// Records how it ended, unless an earlier step said so already.
    fn ended(&mut self, how: [u8; 2]) {
        if self.term == term::NORMAL {
            self.term = how;
        }
    }

    /// The backend chosen (on a retry, the last one) and how (`kind`): an owner of the
    /// session (affinity), a replica (failed over), or balanced.
    fn routed(&mut self, ctx: &VipCtx, req: &Request<'_>, backend: usize, kind: LogDecision) {
        if ctx.log.is_none() {
            return;
        }
        self.redispatched |= self.backend.is_some_and(|b| b != backend);
        self.backend = Some(backend);
        self.decision = kind;
        self.farm = Some(req.route.farm.clone());
        self.route = req.route.label.clone();
        let sess = req.sess.as_ref();
        let c = &ctx.servers;
        let by = sess.and_then(|s| {
            owned_by(c, s, backend)
                .or_else(|| s.clones.iter().find(|id| c.owner(id).is_some_and(|(_, r)| r == Some(backend))).copied())
                .or(s.clones.first().copied())
        });
        self.session = by.map(Box::from);
    }
}

/// Method, space, target; at most `MAX_REQUEST_LINE` bytes, then `...`.
fn request_line(head: &RequestHead, buf: &[u8]) -> Box<[u8]> {
    let method = &buf[head.method.clone()];
    let target = &buf[head.target.clone()];
    let mut request = Vec::with_capacity((method.len() + 1 + target.len()).min(MAX_REQUEST_LINE + 3));
    request.extend_from_slice(method);
    request.push(b' ');
    request.extend_from_slice(target);
    if request.len() > MAX_REQUEST_LINE {
        request.truncate(MAX_REQUEST_LINE);
        request.extend_from_slice(b"...");
    }
    request.into()
}

/// How a routing decision sent a request to `backend`: to an owner of its session (or
/// the backend its persistence cookie names), to the replica (failed over), or balanced.
fn decision_kind(
    c: &Servers,
    d: &Decision,
    sess: Option<&session::SessionId>,
    pinned: Option<usize>,
    backend: usize,
) -> LogDecision {
    match (d, sess) {
        (Decision::Affinity(_), Some(s)) if owned_by(c, s, backend).is_none() => LogDecision::FailedOver,
        (Decision::Affinity(_), None) if pinned.is_some_and(|p| p != backend) => LogDecision::FailedOver,
        (Decision::Affinity(_), _) => LogDecision::Affinity,
        _ => LogDecision::Balanced,
    }
}

/// Counts a routing decision on the route and its farm.
fn count_decision(route: &RouteCtx, kind: LogDecision) {
    for stats in [&*route.stats, &*route.farm.stats] {
        let counter = match kind {
            LogDecision::Affinity => &stats.affinity_hits,
            LogDecision::FailedOver => &stats.failovers,
            _ => &stats.balanced,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The session's clone ID that `backend` owns.
fn owned_by<'a>(c: &Servers, s: &session::SessionId<'a>, backend: usize) -> Option<&'a [u8]> {
    s.clones.iter().find(|id| c.owner(id).is_some_and(|(o, _)| o == backend)).copied()
}

impl LogTo {
    /// `request`: the request line as logged (`request_line`, or `<BADREQ>` for a head
    /// that was refused).
    fn entry(
        &self,
        ctx: &VipCtx,
        t: &Trace,
        (request, protocol): (Box<[u8]>, &'static str),
        client: SocketAddr,
        io: (u64, u64),
    ) {
        let (bytes_in, bytes_out) = io;
        let us = |i: Instant| i.saturating_duration_since(t.started).as_micros() as u64;
        self.sink.log(Entry {
            at: std::time::SystemTime::now() - t.started.elapsed(),
            vip: self.vip.clone(),
            tls: ctx.tls.is_some(),
            client,
            request,
            protocol,
            backend: t.backend.and_then(|b| self.backends.get(b).cloned()),
            session: t.session.clone(),
            decision: t.decision,
            farm: t.farm.as_ref().map(|f| f.name.clone()),
            route: t.route.clone(),
            held: t.held,
            retries: t.retries,
            redispatched: t.redispatched,
            term: t.term,
            conns: conns(ctx, t),
            status: t.status,
            bytes_in,
            bytes_out,
            head_us: us(t.head_done),
            wait_us: t.held.then_some(t.wait.as_micros() as u64),
            connecting_us: t.connecting.map(us),
            connect_us: t.connected.map(us),
            response_us: t.response.map(us),
            total_us: t.started.elapsed().as_micros() as u64,
        });
    }
}

/// The connection and queue counts a logged request is shown with, as they are when it
/// is logged: the agent's and the VIP's client connections, the requests in flight on
/// its farm and its server, and the requests queued for them (`maxconn`).
fn conns(ctx: &VipCtx, t: &Trace) -> Conns {
    let c = &ctx.servers;
    let vip = ctx.capacity.vips.get(ctx.vip_index);
    let mut n = Conns {
        active: ctx.capacity.client_connections.load(Ordering::Relaxed) as u64,
        frontend: vip.map_or(0, |v| v.connections.load(Ordering::Relaxed)),
        ..Conns::default()
    };
    if let Some(be) = t.backend.and_then(|b| c.backends.get(b)) {
        n.server = be.outstanding.load(Ordering::Relaxed);
        n.server_queue = be.slots.queued();
    }
    for be in t.farm.iter().flat_map(|f| f.route.members.iter()).filter_map(|&b| c.backends.get(b)) {
        n.backend += be.outstanding.load(Ordering::Relaxed);
        n.backend_queue += be.slots.queued();
    }
    n
}

/// One client connection (or HTTP/2 stream): the VIP it came to, its client side, and
/// the buffers its requests reuse.
struct ClientConn<'a> {
    ctx: Arc<VipCtx>,
    peer: SocketAddr,
    /// Its slot in the dispatchers' ownership table (`steering::keeps`).
    steer_slot: usize,
    client: &'a mut Client,
    /// The head being forwarded or answered.
    out: Vec<u8>,
    /// The header index of the head being parsed.
    scratch: Vec<Header>,
    /// HTTP/1.x, or an HTTP/2 stream (the access log's protocol).
    protocol: Protocol,
}

/// One accepted client connection: TLS, then HTTP/2 (ALPN `h2`, or the HTTP/2 preface on
/// an `h2c` VIP) or HTTP/1.x.
pub async fn serve(ctx: Arc<VipCtx>, stream: TcpStream, peer: SocketAddr, stop: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    if let Some(served) = protocol(ctx, stream, peer, stop).await {
        served.await
    }
}

/// What serves a connection once its protocol is known.
type Served = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The TLS handshake and the protocol, then what serves the connection, boxed: an async
/// fn keeps room for every local that lives across an await, even once moved away, so
/// awaiting each protocol here would make every idle connection's task hold the TLS
/// stream twice and the other protocol's state besides (2.2 KiB per idle HTTP/2
/// connection, measured).
async fn protocol(
    ctx: Arc<VipCtx>,
    stream: TcpStream,
    peer: SocketAddr,
    stop: watch::Receiver<bool>,
) -> Option<Served> {
    let steer_slot = crate::steering::slot_of(peer, stream.local_addr().unwrap_or(peer));
    let at = super::h2::At { peer, steer_slot };
    let counted =
        |p: Protocol| ctx.servers.counters.connections_by_protocol[p as usize].fetch_add(1, Ordering::Relaxed);
    let (r, w, _) = match &ctx.tls {
        None if ctx.h2c && super::h2::prior_knowledge(&stream, ctx.settings.header_timeout).await => {
            counted(Protocol::H2);
            return Some(Box::pin(super::h2::serve(ctx, stream, at, stop)));
        }
        None => {
            // Plain HTTP/1.x: the connection a dead dispatcher's successor can continue.
            let tracked = ctx.takeover.as_ref().and_then(|t| {
                let local = stream.local_addr().ok()?;
                t.outbox.register(std::os::fd::AsRawFd::as_raw_fd(&stream), peer, local)
            });
            counted(Protocol::H1);
            let (r, w, _) = crate::http1::io::split_plain(stream);
            return Some(Box::pin(serve_http1(ctx, (r, w), peer, steer_slot, stop, tracked)));
        }
        // Boxed: the handshake's state exists only during the handshake.
        Some(tls) => match Box::pin(tls.accept(stream)).await {
            Some(conn) if conn.get_ref().1.alpn_protocol() == Some(b"h2") => {
                counted(Protocol::H2);
                return Some(Box::pin(super::h2::serve(ctx, conn, at, stop)));
            }
            Some(conn) => crate::http1::io::split_tls(conn),
            None => return None,
        },
    };
    counted(Protocol::H1);
    Some(Box::pin(serve_http1(ctx, (r, w), peer, steer_slot, stop, None)))
}

/// HTTP/1.x requests on one connection, until either side ends it.
async fn serve_http1(
    ctx: Arc<VipCtx>,
    (r, w): (ReadSide, WriteSide),
    peer: SocketAddr,
    steer_slot: usize,
    mut stop: watch::Receiver<bool>,
    tracked: Option<crate::takeover::outbox::Tracked>,
) {
    let mark = |busy: bool| {
        if let Some(t) = &tracked {
            t.set_busy(busy);
        }
    };
    let mut client = Client::conn(r, w);
    let mut conn = ClientConn {
        ctx,
        peer,
        steer_slot,
        client: &mut client,
        out: Vec::new(),
        scratch: Vec::new(),
        protocol: Protocol::H1,
    };
    let mut requests = 0u64;
    loop {
        let first_byte = || mark(true);
        let (head, head_started) =
            match read_head(&conn.ctx, &mut conn.client.r, &mut conn.scratch, &mut stop, &first_byte).await {
                HeadRead::Head(h, t) => (h, t),
                HeadRead::Closed => return,
                HeadRead::Reject(r, started) => {
                    // What arrived; the connection closes after the answer.
                    let received = conn.client.r.buf.split();
                    conn.reject(r, started, &received).await;
                    return;
                }
            };
        let head_bytes = conn.client.r.buf.split_to(head.len);
        requests += 1;
        let closing = *stop.borrow();
        let next = conn.request(&head, &head_bytes, closing, head_started, requests).await;
        // Keep the header index's allocation for the next request.
        conn.scratch = head.headers;
        match next {
            // Quiet again, unless the next request's bytes are here already.
            Next::KeepAlive => mark(!conn.client.r.buf.is_empty()),
            _ => {
                conn.client.shutdown().await;
                return;
            }
        }
    }
}

/// One HTTP/2 stream's request (`h2::stream`), its head written and checked
/// (`http1::head::check_request`, or why it is refused) from `buf`: served by the same
/// phases as an HTTP/1.x request, its answer sent on `client`.
pub async fn serve_stream(
    ctx: Arc<VipCtx>,
    client: &mut Client,
    (head, buf): (Result<RequestHead, Reject>, BytesMut),
    peer: SocketAddr,
    steer_slot: usize,
    stop: &watch::Receiver<bool>,
) {
    let started = Instant::now();
    let mut conn =
        ClientConn { ctx, peer, steer_slot, client, out: Vec::new(), scratch: Vec::new(), protocol: Protocol::H2 };
    match head {
        // Not boxed as a connection's requests are: the stream's task is its request's
        // (a redirecting VIP speaks HTTP/1.1 only, `config`).
        Ok(head) => {
            let closing = *stop.borrow();
            conn.count_request();
            conn.exchange(&head, &buf, closing, started).await;
        }
        Err(r) => conn.reject(r, started, &buf).await,
    }
}

/// `308 Permanent Redirect` to the same host and target on the HTTPS VIP's port (the
/// method and body are kept by a client that follows it, RFC 9110 15.4.9). The host is
/// `redirect_host` when configured (its port, else the HTTPS VIP's), else the request's
/// (absolute-form authority, else Host, without its port), else the HTTPS VIP's address;
/// bytes outside ASCII in the target are percent-encoded. The connection is closed after
/// it: the request's body, if any, is never forwarded.
fn redirect_answer(head: &RequestHead, buf: &[u8], to: &Redirect) -> String {
    let port = if to.port == 443 { String::new() } else { format!(":{}", to.port) };
    let mut target = String::new();
    for &b in &buf[head.path.clone()] {
        if b.is_ascii() {
            target.push(b as char);
        } else {
            target.push_str(&format!("%{b:02X}"));
        }
    }
    if !target.starts_with('/') {
        target.insert(0, '/');
    }
    let location = match &to.host {
        // Has a port of its own (`name:port`, `[v6]:port`): as it is.
        Some(h) if h.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) => format!("https://{h}{target}"),
        Some(h) => format!("https://{h}{port}{target}"),
        None => format!("https://{}{port}{target}", request_host(head, buf, to)),
    };
    let body = format!("308 Permanent Redirect: {location}\n");
    format!(
        "HTTP/1.1 308 Permanent Redirect\r\nLocation: {location}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The host a redirect without `redirect_host` names: the request's, without its port,
/// else the HTTPS VIP's address.
fn request_host(head: &RequestHead, buf: &[u8], to: &Redirect) -> String {
    let host_field = head.headers.iter().find(|h| is(&buf[h.name.clone()], "host")).map(|h| &buf[h.value.clone()]);
    let authority = head.authority.as_ref().map(|a| &buf[a.clone()]).or(host_field).unwrap_or_default();
    // The head parser admits only `host[:port]` here: ASCII, no spaces or controls.
    let authority = String::from_utf8_lossy(authority);
    // The host without its port: `[v6]:port`, `name:port`, `v4:port`.
    let host = match authority.rfind(':') {
        Some(i) if !authority[i..].contains(']') => &authority[..i],
        _ => &authority[..],
    };
    let host = match (host.is_empty(), to.address) {
        (false, _) => host.to_string(),
        (true, std::net::IpAddr::V4(a)) => a.to_string(),
        (true, std::net::IpAddr::V6(a)) => format!("[{a}]"),
    };
    host
}

/// Reads one request head. The header deadline runs from the head's first byte (a
/// trickling client gets 408 however often it sends), the idle timeout before it.
async fn read_head(
    ctx: &VipCtx,
    client: &mut Inbound<impl AsyncRead + Unpin>,
    scratch: &mut Vec<Header>,
    stop: &mut watch::Receiver<bool>,
    first_byte: &(dyn Fn() + Sync),
) -> HeadRead {
    let mut deadline: Option<Instant> = None;
    // Between requests: the idle timeout, or a short grace once the listener stops (a
    // request that comes in it is answered, with `Connection: close`).
    let mut idle_until = Instant::now() + ctx.settings.client_idle_timeout;
    let mut stopping = *stop.borrow();
    if stopping {
        idle_until = idle_until.min(Instant::now() + STOP_GRACE);
    }
    loop {
        if !client.buf.is_empty() {
            deadline.get_or_insert_with(|| {
                // A request has begun (connection takeover's busy mark).
                first_byte();
                Instant::now() + ctx.settings.header_timeout
            });
            match parse_request(&client.buf, &ctx.limits, scratch) {
                Ok(Some(h)) => return HeadRead::Head(h, head_started(deadline, ctx)),
                Ok(None) => {}
                Err(r) => return HeadRead::Reject(r, head_started(deadline, ctx)),
            }
        }
        let wait = deadline.unwrap_or(idle_until).saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return match deadline {
                Some(_) => HeadRead::Reject(
                    Reject { status: 408, reason: "request head not received in time" },
                    head_started(deadline, ctx),
                ),
                None => HeadRead::Closed,
            };
        }
        let filled = tokio::select! {
            r = client.fill(wait) => r,
            _ = stop.changed(), if !stopping => {
                stopping = true;
                idle_until = idle_until.min(Instant::now() + STOP_GRACE);
                continue;
            }
        };
        match filled {
            Err(RelayError::Timeout) if deadline.is_none() => return HeadRead::Closed,
            Ok(0) if client.buf.is_empty() => return HeadRead::Closed,
            Ok(0) => {
                let r = Reject { status: 400, reason: CLOSED_INSIDE_HEAD };
                return HeadRead::Reject(r, head_started(deadline, ctx));
            }
            Ok(_) => {}
            Err(RelayError::Timeout) if deadline.is_some() => {
                let r = Reject { status: 408, reason: "request head not received in time" };
                return HeadRead::Reject(r, head_started(deadline, ctx));
            }
            Err(_) => return HeadRead::Closed,
        }
    }
}

/// Why a head was refused when the client closed its connection inside it.
const CLOSED_INSIDE_HEAD: &str = "connection closed inside the request head";

/// When the head being read began: its deadline less the header timeout.
fn head_started(deadline: Option<Instant>, ctx: &VipCtx) -> Instant {
    deadline.map_or_else(Instant::now, |d| d - ctx.settings.header_timeout)
}

/// Whether the backend a request waited for still serves it as `decision` chose it: an
/// owner or replica that still keeps its sessions (not suspect), or, balanced, one still
/// taking new work.
fn still_fits(be: &Backend, decision: &Decision) -> bool {
    match decision {
        Decision::Affinity(_) => matches!(be.state(), BackendState::Up | BackendState::Drain),
        _ => be.is_up(),
    }
}

/// Resolves once `be` no longer serves a request routed by `decision` (`still_fits`).
async fn until_unfit(be: &Backend, decision: &Decision) {
    loop {
        let changed = be.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        if !still_fits(be, decision) {
            return;
        }
        changed.await;
    }
}

/// How many times a request that waited in a queue is routed again because its server
/// changed meanwhile.
const MAX_REQUEUES: u32 = 2;

/// Counts a request in flight on a backend for as long as it lives.
struct InFlight<'a>(&'a Backend);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ClientConn<'_> {
    /// A refused head (`bytes`: what arrived of it) answered, kept for `GET /errors` and
    /// logged as HAProxy's `<BADREQ>`: what arrived is not a request line to show.
    async fn reject(&mut self, r: Reject, started: Instant, bytes: &[u8]) {
        self.refused(r.status, r.reason, bytes);
        let written0 = self.client.written();
        self.client.answer(Answer::new(r.status, r.reason)).await;
        let how = match r.status {
            408 => term::CLIENT_REQUEST_TIMEOUT,
            _ if r.reason == CLOSED_INSIDE_HEAD => term::CLIENT_REQUEST,
            _ => term::PROXY_REQUEST,
        };
        self.log_answer(started, (r.status, how), (b"<BADREQ>"[..].into(), None), bytes.len() as u64, written0);
    }

    /// One request whose head is read: counted, then redirected (a redirecting VIP) or
    /// routed and forwarded (`exchange`). `n`: its number on the connection.
    async fn request(
        &mut self,
        head: &RequestHead,
        head_bytes: &BytesMut,
        closing: bool,
        started: Instant,
        n: u64,
    ) -> Next {
        self.count_request();
        if self.ctx.redirect.is_some() {
            self.redirect(head, head_bytes, started).await;
            return Next::Close;
        }
        // Boxed: the exchange's (large) state exists only while a request is in flight,
        // so an idle keep-alive connection's task stays small. Each request's log lines
        // say which of the connection's requests they are about (inside the connection's
        // span, which says the VIP and the client). At debug level only: an enabled span
        // costs about 0.4 µs per request (measured: tracing 0.1 with the fmt layer,
        // 1,000,000 spans), 1.5% of a request's CPU; a disabled one 5 ns.
        let span = tracing::debug_span!("request", n);
        Box::pin(self.exchange(head, head_bytes, closing, started).instrument(span)).await
    }

    /// Counts a request whose head is read, on its VIP and by protocol.
    fn count_request(&self) {
        self.ctx.capacity.vips[self.ctx.vip_index].requests.fetch_add(1, Ordering::Relaxed);
        self.ctx.servers.counters.requests_by_protocol[self.protocol as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Keeps a request refused as malformed for `GET /errors` (what arrived of it).
    fn refused(&self, status: u16, reason: &'static str, bytes: &[u8]) {
        keep_refusal(&self.ctx, self.peer, self.protocol, (status, reason), bytes);
    }

    /// Counts a request the dispatcher answered itself (a refused head, a redirect), and
    /// logs it when the VIP has an access log.
    /// `request`: the request line logged, and the head it is from (`None`: refused).
    fn log_answer(
        &self,
        started: Instant,
        (status, how): (u16, [u8; 2]),
        request: (Box<[u8]>, Option<&RequestHead>),
        bytes_in: u64,
        written0: u64,
    ) {
        count_status(&self.ctx, status);
        if let Some(log) = &self.ctx.log {
            let mut t = Trace::new(started);
            t.status = status;
            t.term = how;
            let protocol = self.protocol_of(request.1);
            log.entry(&self.ctx, &t, (request.0, protocol), self.peer, (bytes_in, self.client.written() - written0));
        }
    }

    /// The protocol of a request as the access log names it (`-` for a refused head).
    fn protocol_of(&self, head: Option<&RequestHead>) -> &'static str {
        match (self.protocol, head) {
            (Protocol::H2, _) => "HTTP/2.0",
            (_, Some(h)) if h.minor == 0 => "HTTP/1.0",
            (_, Some(_)) => "HTTP/1.1",
            (_, None) => "-",
        }
    }

    /// A redirecting VIP's answer (`redirect_answer`), logged; then the connection closes.
    async fn redirect(&mut self, head: &RequestHead, head_bytes: &[u8], started: Instant) {
        // A redirecting VIP speaks HTTP/1.1 only (`config`).
        let (Some(to), Some(w)) = (&self.ctx.redirect, self.client.conn_w()) else { return };
        let answer = redirect_answer(head, head_bytes, to);
        let written0 = w.written;
        let sent = write_client(w, answer.as_bytes(), ERROR_WRITE_DEADLINE).await;
        let line = request_line(head, head_bytes);
        self.log_answer(started, (308, term::LOCAL), (line, Some(head)), head.len as u64, written0);
        if sent {
            self.client.shutdown().await;
            // What the client still sends (a body) is read and dropped for a moment,
            // so that the close does not turn into a reset that loses the answer.
            let drain = async {
                let mut left = 64 * 1024usize;
                self.client.r.buf.clear();
                while left > 0 {
                    match self.client.r.fill(Duration::from_secs(1)).await {
                        Ok(n) if n > 0 => {
                            left = left.saturating_sub(n);
                            self.client.r.buf.clear();
                        }
                        _ => break,
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
        }
    }

    /// One request and its response, logged when the VIP has an access log.
    async fn exchange(&mut self, head: &RequestHead, buf: &BytesMut, closing: bool, started: Instant) -> Next {
        let mut t = Trace::new(started);
        let Some(log) = self.ctx.log.clone() else {
            let next = self.routed(head, buf, closing, &mut t).await;
            count_status(&self.ctx, t.status);
            return next;
        };
        let (read0, buffered0, written0) = (self.client.r.total_read, self.client.r.buf.len(), self.client.written());
        let next = self.routed(head, buf, closing, &mut t).await;
        // What this request took from the client's stream: its head, and whatever of the
        // buffer and of later reads it consumed (a pipelined next request stays).
        let consumed =
            (buffered0 as u64 + (self.client.r.total_read - read0)).saturating_sub(self.client.r.buf.len() as u64);
        let line = (request_line(head, buf), self.protocol_of(Some(head)));
        log.entry(&self.ctx, &t, line, self.peer, (head.len as u64 + consumed, self.client.written() - written0));
        count_status(&self.ctx, t.status);
        next
    }

    /// Routes and forwards one request (`buf` holds the head `head` was parsed from):
    /// the body read ahead, the routing rounds (`Rounds::forward`), then the response.
    async fn routed(&mut self, head: &RequestHead, buf: &BytesMut, closing: bool, trace: &mut Trace) -> Next {
        let ClientConn { ctx, peer, steer_slot, client, out, scratch, protocol } = self;
        let ctx: &VipCtx = ctx;
        let s = &ctx.settings;
        if crate::http1::rewrite::looped(head, buf) {
            // Forwarded by this very process before: it came back through a backend that
            // leads here. Answered, never forwarded again (each round would take two more
            // descriptors until they run out).
            ctx.servers.counters.loops.fetch_add(1, Ordering::Relaxed);
            crate::ratelimit::warn(
                "forwarding loop: a request came back with this dispatcher's own Via marker (answered 508); forwarding",
                &format_args!("VIP {}, from {peer}", ctx.host),
            );
            return answered(client, trace, Some(Answer::LOOP)).await;
        }
        let Some(route) = route_of(ctx, head, buf) else {
            // No route: answered, never a guess.
            ctx.servers.counters.no_route.fetch_add(1, Ordering::Relaxed);
            if let Some(v) = ctx.capacity.vips.get(ctx.vip_index) {
                v.no_route.fetch_add(1, Ordering::Relaxed);
            }
            return answered(client, trace, Some(Answer::NO_ROUTE)).await;
        };
        route.stats.requests.fetch_add(1, Ordering::Relaxed);
        route.farm.stats.requests.fetch_add(1, Ordering::Relaxed);
        let (sess, pinned) = session_of(ctx, route, head, buf);
        let started = Instant::now();
        let c = &ctx.servers;
        c.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let _request = Counted(&c.counters.in_flight);
        let idempotent = is_idempotent(&buf[head.method.clone()]);
        let buffered_body = match read_ahead(&mut client.r, head, idempotent, s).await {
            Ok(body) => body,
            Err(answer) => {
                keep_body_refusal(ctx, *peer, *protocol, answer.as_ref(), &buf[..head.len]);
                trace.ended(match &answer {
                    Some(a) if a.status == Answer::BODY_TIMEOUT.status => term::CLIENT_DATA_TIMEOUT,
                    Some(_) => term::PROXY_REQUEST,
                    None => term::CLIENT_DATA,
                });
                return answered(client, trace, answer).await;
            }
        };
        let (peer, steer_slot) = (*peer, *steer_slot);
        let req =
            Request { head, route, buf, sess, pinned, idempotent, buffered_body, peer, steer_slot, closing, started };
        let mut down = Downstream { client, scratch, out };
        // Its retries in flight are counted until the response is relayed.
        let mut rounds = Rounds::new(s);
        match rounds.forward(ctx, &req, down.reborrow(), trace).await {
            Ok(sent) => respond(ctx, &req, sent, down, trace).await,
            Err(answer) => {
                keep_body_refusal(ctx, peer, *protocol, answer.as_ref(), &buf[..head.len]);
                answered(down.client, trace, answer).await
            }
        }
    }
}

/// Keeps a refused request for `GET /errors` (`refusals`): `bytes`, what arrived of it.
fn keep_refusal(ctx: &VipCtx, client: SocketAddr, p: Protocol, (status, reason): (u16, &'static str), bytes: &[u8]) {
    let protocol = crate::metrics::PROTOCOLS[p as usize];
    ctx.capacity.refusals.record(crate::refusals::Refused { vip: &ctx.name, client, protocol, status, reason, bytes });
}

/// A request's body refused as malformed or too slow (its framing, its deadline): kept
/// with its head for `GET /errors`. Other answers of our own (no server, no route) are
/// not about what the client sent.
fn keep_body_refusal(ctx: &VipCtx, client: SocketAddr, p: Protocol, answer: Option<&Answer>, head: &[u8]) {
    if let Some(a) = answer.filter(|a| matches!(a.status, 400 | 408 | 413)) {
        keep_refusal(ctx, client, p, (a.status, a.why), head);
    }
}

/// Counts the status a client got on its VIP (the backend's, or the dispatcher's own
/// answer); none (0) when the client got no response.
pub fn count_status(ctx: &VipCtx, status: u16) {
    if status != 0 {
        if let Some(v) = ctx.capacity.vips.get(ctx.vip_index) {
            v.responses.record(status);
        }
    }
}

/// Ends a request early: with the proxy's own answer (recorded for the access log), or
/// without one (the client is gone, or was answered already). The connection closes.
/// Unless the step that ended it said how: the dispatcher refused it (an answer), or the
/// client left.
async fn answered(client: &mut Client, trace: &mut Trace, answer: Option<Answer>) -> Next {
    trace.ended(if answer.is_some() { term::PROXY_REQUEST } else { term::CLIENT_REQUEST });
    if let Some(a) = answer {
        refuse(client, trace, a).await;
    }
    Next::Close
}

/// The request's session (the route's session cookie or URL parameter, in its farm's
/// format, else an application session); without one, the member the VIP's persistence
/// cookie names, if any.
fn session_of<'a>(
    ctx: &'a VipCtx,
    route: &'a RouteCtx,
    head: &RequestHead,
    buf: &'a [u8],
) -> (Option<session::SessionId<'a>>, Option<usize>) {
    let cookies = || head.headers.iter().filter(|h| is(&buf[h.name.clone()], "cookie")).map(|h| &buf[h.value.clone()]);
    let target = &buf[head.target.clone()];
    let format = route.farm.session_format;
    // Several sessions of the route's cookie name (a domain and a host cookie): the one
    // a server of the route's farm owns, else one no other farm's server owns.
    let rank = |s: &session::SessionId| route.farm.route.rank(&ctx.servers, s);
    let sess = session::find_ranked(cookies(), target, &route.cookie, &route.url_parameter, format, rank)
        .or_else(|| session::app_session(target));
    let pinned = match (&sess, &ctx.persist) {
        (None, Some(p)) => p.pinned(cookies()),
        _ => None,
    };
    (sess, pinned)
}

/// The route of a request: by its host (the absolute-form authority, else Host) and path.
fn route_of<'c>(ctx: &'c VipCtx, head: &RequestHead, buf: &[u8]) -> Option<&'c RouteCtx> {
    let text = |r: std::ops::Range<usize>| String::from_utf8_lossy(&buf[r]);
    let host_field = || head.headers.iter().find(|h| is(&buf[h.name.clone()], "host")).map(|h| text(h.value.clone()));
    let host = head.authority.clone().map(text).or_else(host_field);
    ctx.routes.find(host.as_deref(), ctx.port, &text(head.path.clone()))
}

/// One request as its phases see it.
struct Request<'a> {
    head: &'a RequestHead,
    /// The route it matched (and through it, its farm).
    route: &'a RouteCtx,
    /// The bytes `head` was parsed from.
    buf: &'a [u8],
    sess: Option<session::SessionId<'a>>,
    /// The backend the persistence cookie names (a request without a session).
    pinned: Option<usize>,
    idempotent: bool,
    /// The body, when it was read ahead (`read_ahead`): replayable.
    buffered_body: Option<Vec<u8>>,
    peer: SocketAddr,
    /// The connection's slot in the dispatchers' ownership table (`steering::keeps`).
    steer_slot: usize,
    /// The listener is stopping.
    closing: bool,
    /// When routing began: the response latency runs from here.
    started: Instant,
}

/// What the routing rounds hand to the response phase: the backend that answered, its
/// connection and response head, and, until the response is relayed, the request
/// counted in flight on that backend and its `maxconn` slot.
struct Sent<'c> {
    backend: usize,
    reply: Reply,
    held: (InFlight<'c>, Slot<'c>),
}

/// The routing rounds of one request (route, hold or await, queue, send; routed again
/// after a failure that may be retried, or when its server left while it queued), and
/// what they keep from one round to the next.
struct Rounds<'c> {
    hold_deadline: Option<Instant>,
    hold_expired: bool,
    learn_deadline: Option<Instant>,
    learn_waited: bool,
    requeues: u32,
    /// The queueing deadline a request routed again after its server left keeps: its
    /// waits together stay within one queue timeout.
    requeued_deadline: Option<Instant>,
    retries: Retries<'c>,
}

impl<'c> Rounds<'c> {
    fn new(s: &HttpSettings) -> Self {
        Rounds {
            hold_deadline: None,
            hold_expired: false,
            learn_deadline: None,
            learn_waited: s.learn_wait.is_zero(),
            requeues: 0,
            requeued_deadline: None,
            retries: Retries::default(),
        }
    }

    /// Choose a backend, hold while the session's owner is suspect, queue, send; a failure
    /// before any response byte is retried after re-routing (bounded, budgeted, idempotent
    /// requests whose body, if any, was read ahead). A server that timed out is never
    /// retried: no replays. `Err`: the request ends, with the answer it is owed, if any.
    async fn forward(
        &mut self,
        ctx: &'c VipCtx,
        req: &Request<'_>,
        mut down: Downstream<'_>,
        trace: &mut Trace,
    ) -> Result<Sent<'c>, Option<Answer>> {
        let c = &ctx.servers;
        loop {
            let Some((backend, decision)) = self.choose(ctx, req, &mut down.client.r, trace).await? else {
                continue;
            };
            let farm = &req.route.farm;
            if let Some(sess) = &req.sess {
                if !farm.route.may_serve(c, sess, backend) {
                    c.counters.misroutes.fetch_add(1, Ordering::Relaxed);
                    for stats in [&req.route.stats, &farm.stats] {
                        stats.misroutes.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::error!(backend = %c.backends[backend].name, farm = %farm.name, "misroute: a session request to a server that neither owns it nor replicates it");
                }
            }
            let be = &c.backends[backend];
            let kind = decision_kind(c, &decision, req.sess.as_ref(), req.pinned, backend);
            count_decision(req.route, kind);
            trace.routed(ctx, req, backend, kind);
            let Some((slot, queue_deadline)) = self.slot(ctx, be, decision, trace).await? else {
                continue;
            };
            be.outstanding.fetch_add(1, Ordering::Relaxed);
            let held = (InFlight(be), slot);
            be.requests.fetch_add(1, Ordering::Relaxed);
            build_request(down.out, req.head, req.buf, req.peer.ip(), &ctx.host, &ctx.forwarded);
            let mut attempt = Attempt { queue_deadline, connected: None };
            if ctx.log.is_some() {
                trace.connecting = Some(Instant::now());
            }
            let s = &farm.settings;
            let sent =
                send(ctx, s, req.head, backend, down.reborrow(), req.buffered_body.as_deref(), &mut attempt).await;
            trace.connected = attempt.connected;
            let failure = match sent {
                Ok(reply) => return Ok(Sent { backend, reply, held }),
                Err(f) => f,
            };
            drop(held);
            be.errors.fetch_add(1, Ordering::Relaxed);
            failure.blame(ctx, backend);
            // Nothing of the client's stream is consumed by an attempt: no body, or one
            // read ahead.
            let replayable = req.idempotent && (req.head.framing == Framing::None || req.buffered_body.is_some());
            let budgeted = failure.reached_a_server();
            if failure.retryable() && replayable && self.retries.again(c, &ctx.settings, budgeted) {
                trace.retries = self.retries.extra;
                continue;
            }
            trace.ended(failure.term());
            return Err(failure.answer());
        }
    }

    /// Routes the request. While its session's owner is suspect (hold), or its clone IDs
    /// may be on their way from another dispatcher (await), waits, then `None`: route
    /// again.
    async fn choose(
        &mut self,
        ctx: &VipCtx,
        req: &Request<'_>,
        client: &mut Inbound<ClientRead>,
        trace: &mut Trace,
    ) -> Result<Option<(usize, Decision)>, Option<Answer>> {
        let (c, s) = (&ctx.servers, &ctx.settings);
        let farm = &req.route.farm.route;
        let decision = match req.pinned {
            Some(b) => farm.route_pinned(c, b, self.hold_expired),
            None => farm.route(c, req.sess.as_ref(), self.hold_expired, self.learn_waited),
        };
        let waiting = Instant::now();
        let end = match decision {
            Decision::Affinity(b) | Decision::Balanced(b) => return Ok(Some((b, decision))),
            Decision::SessionUnavailable => {
                trace.ended(term::SERVER_CONNECT);
                return Err(Some(Answer::SESSION_UNAVAILABLE));
            }
            Decision::NoBackend => {
                trace.ended(term::SERVER_CONNECT);
                return Err(Some(Answer::NO_BACKEND));
            }
            Decision::AwaitShared => {
                trace.held = true;
                let deadline = *self.learn_deadline.get_or_insert_with(|| {
                    c.counters.learn_waits.fetch_add(1, Ordering::Relaxed);
                    Instant::now() + s.learn_wait
                });
                await_shared(ctx, client, deadline).await
            }
            Decision::Hold(b) => {
                trace.held = true;
                let deadline = *self.hold_deadline.get_or_insert_with(|| {
                    c.counters.holds.fetch_add(1, Ordering::Relaxed);
                    Instant::now() + s.hold_time
                });
                hold(ctx, b, client, deadline).await
            }
        };
        trace.wait += waiting.elapsed();
        match (end, decision) {
            (HoldEnd::Changed, _) => {}
            (HoldEnd::ClientGone, _) => {
                trace.ended(term::CLIENT_QUEUE);
                return Err(None);
            }
            // Not shared in time (an ID no dispatcher knows), or too many waiting:
            // balanced, as an unknown clone ID is.
            (HoldEnd::Expired | HoldEnd::Full, Decision::AwaitShared) => self.learn_waited = true,
            (HoldEnd::Expired, _) => {
                c.counters.hold_timeouts.fetch_add(1, Ordering::Relaxed);
                self.hold_expired = true;
            }
            (HoldEnd::Full, _) => {
                trace.ended(term::PROXY_QUEUE);
                return Err(Some(Answer::HOLD_FULL));
            }
        }
        Ok(None)
    }

    /// `maxconn`: a slot now, or a bounded wait in this backend's queue (a session's
    /// request never goes elsewhere for want of room). One deadline covers this queue and
    /// the connection limit's; it comes back with the slot. `None`: its server left while
    /// it waited, route again.
    async fn slot<'b>(
        &mut self,
        ctx: &VipCtx,
        be: &'b Backend,
        decision: Decision,
        trace: &mut Trace,
    ) -> Result<Option<(Slot<'b>, Instant)>, Option<Answer>> {
        let waiting = Instant::now();
        let queue_deadline = self.requeued_deadline.take().unwrap_or(waiting + ctx.settings.queue_timeout);
        // A waiter whose server leaves (down, suspect, disabled; drained for a balanced
        // request) stops waiting for it.
        let slot = tokio::select! {
            biased;
            slot = be.slots.take(queue_deadline) => Some(slot),
            _ = until_unfit(be, &decision) => None,
        };
        if slot.as_ref().is_none_or(|s| s.as_ref().map_or(true, |s| s.waited)) {
            trace.held = true;
            trace.wait += waiting.elapsed();
        }
        let slot = match slot {
            // Its server changed while it waited: routed again (a bounded number of
            // times), or refused, never sent to a server that left.
            None => Err(Refused::Left),
            Some(Ok(slot)) if slot.waited && !still_fits(be, &decision) => {
                drop(slot);
                Err(Refused::Left)
            }
            Some(slot) => slot,
        };
        match slot {
            Err(Refused::Left) if self.requeues < MAX_REQUEUES => {
                self.requeues += 1;
                self.requeued_deadline = Some(queue_deadline);
                Ok(None)
            }
            Ok(slot) => Ok(Some((slot, queue_deadline))),
            Err(why) => {
                trace.ended(match why {
                    Refused::Timeout => term::QUEUE_TIMEOUT,
                    Refused::QueueFull => term::PROXY_QUEUE,
                    Refused::Left => term::SERVER_QUEUE,
                });
                if why == Refused::Left {
                    be.slots.refused_left.fetch_add(1, Ordering::Relaxed);
                } else {
                    ctx.servers.counters.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                }
                Err(Some(Answer::queue_refused(why)))
            }
        }
    }
}

/// The response phase: interim responses, the backend's latency and health, the clone
/// IDs it sets, then the upgrade, or the response delivered to the client (`deliver_final`).
async fn respond(ctx: &VipCtx, req: &Request<'_>, sent: Sent<'_>, down: Downstream<'_>, trace: &mut Trace) -> Next {
    let Downstream { client, scratch, out } = down;
    // The farm's settings: its servers' timeouts.
    let (c, s, head) = (&ctx.servers, &*req.route.farm.settings, req.head);
    let Sent { backend, reply: (mut up, res, body_skipped), held: _held } = sent;
    let be = &c.backends[backend];
    let Some(res) = forward_interim(&mut up.r, client, res, head, &ctx.limits, scratch, s).await else {
        trace.ended(term::SERVER_HEADERS);
        return Next::Close;
    };
    let took = req.started.elapsed();
    trace.response = Some(Instant::now());
    trace.status = res.status;
    be.responses.record(res.status);
    be.latency.record(took);
    if let Some(v) = ctx.capacity.vips.get(ctx.vip_index) {
        v.latency.record(took);
    }
    if ctx.suspect_on_status.contains(&res.status) {
        // The configured passive 5xx policy: the answer is relayed, the backend is suspect.
        c.passive_failure(backend, crate::health::Cause::Status(res.status));
    }
    // An HTTP/2 stream's header map shares these bytes until the `h2` crate has written
    // its HEADERS frame: a copy of the head leaves the backend connection's read buffer
    // unshared, reused by its next response rather than reallocated (16 KiB).
    let res_buf = match client.w {
        Sink::H2(_) => super::h2::copied(&mut up.r.buf, res.len),
        Sink::Conn(_) => up.r.buf.split_to(res.len).freeze(),
    };
    learn(ctx, req.route, &res, &res_buf, backend);
    if res.status == 101 {
        // Only an HTTP/1.1 request asks for an upgrade (HTTP/2 refuses `Upgrade`).
        let (Client { r, w: Sink::Conn(w) }, true) = (&mut *client, head.upgrade) else {
            // Switching protocols nobody asked for: the stream can no longer be trusted.
            be.errors.fetch_add(1, Ordering::Relaxed);
            trace.ended(term::PROXY_HEADERS);
            return answered(client, trace, Some(Answer::UNSOLICITED_101)).await;
        };
        upgrade(r, w, out, up, (&res, &res_buf), s).await;
        return Next::Close;
    }
    deliver_final(ctx, req, backend, up, (&res, &res_buf, body_skipped), client, out).await.unwrap_or_else(|how| {
        trace.ended(how);
        Next::Close
    })
}

/// The final response to the client: its head (the persistence cookie added), then its
/// body: to an HTTP/1.x client as bytes (a small body at hand inlined with the head), on
/// an HTTP/2 stream as a header map and DATA frames (a body at hand sent at once). The
/// backend connection (and its share of the backend's connection limit) goes back to
/// the pool as soon as the whole response is in hand, so a client that reads slowly
/// holds no backend connection. `Err`: the response did not reach the client whole (how
/// it ended, for the log).
async fn deliver_final(
    ctx: &VipCtx,
    req: &Request<'_>,
    backend: usize,
    mut up: Upstream,
    (res, res_buf, body_skipped): (&ResponseHead, &Bytes, bool),
    client: &mut Client,
    out: &mut Vec<u8>,
) -> Result<Next, [u8; 2]> {
    let head = req.head;
    let be = &ctx.servers.backends[backend];
    let pool = ctx.pools[backend].as_ref().expect("a pool for the chosen backend");
    let s = &req.route.farm.settings;
    let (close, dechunk) = closes(head, res, body_skipped, req.closing, ctx.ownership.keeps(req.steer_slot));
    // A client without the cookie, or whose cookie names another backend (it failed
    // over), is told where it is now.
    let persist = match (&ctx.persist, &req.sess) {
        (Some(p), None) if req.pinned != Some(backend) => Some(p),
        _ => None,
    };
    let keep_upstream = !res.close && !body_skipped;
    let (delivered, up) = if let Some((body, o)) = client.h2() {
        let mut fields = super::h2::response_fields(res, res_buf);
        if let Some(p) = persist {
            p.insert_field(&mut fields, backend);
        }
        let at_hand = super::h2::body_at_hand(&mut up.r.buf, res.framing);
        let mut up = match at_hand {
            Some(_) => {
                if keep_upstream {
                    pool.put(up);
                }
                None
            }
            None => Some(up),
        };
        let rest = up.as_mut().map(|up| (&mut up.r, res.framing));
        let t = Timeouts { read: s.server_timeout, write: s.client_timeout };
        (super::h2::respond(body, o, (res.status, fields), at_hand, rest, t).await, up)
    } else {
        let Some(w) = client.conn_w() else { return Err(term::CLIENT_DATA) };
        build_response(out, res, res_buf, close, dechunk, head.minor == 0);
        if let Some(p) = persist {
            p.insert(out, backend, super::persist::has_cache_control(res, res_buf));
        }
        let framing = inline_small_body(out, &mut up.r.buf, if dechunk { Framing::Chunked } else { res.framing });
        let mut up = match framing {
            Framing::None => {
                if keep_upstream {
                    pool.put(up);
                }
                None
            }
            _ => Some(up),
        };
        (deliver(w, out, up.as_mut().map(|up| &mut up.r), (framing, dechunk), s).await, up)
    };
    match delivered {
        Ok(()) => {}
        Err(Undelivered::Head) => return Err(term::CLIENT_DATA),
        Err(Undelivered::Body(e)) => {
            be.errors.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(backend = %be.name, error = %e, "response body relay failed");
            return Err(match e {
                RelayError::Write(_) => term::CLIENT_DATA,
                RelayError::Timeout => term::SERVER_DATA_TIMEOUT,
                RelayError::Chunk(_) => term::PROXY_DATA,
                RelayError::Read(_) | RelayError::Eof => term::SERVER_DATA,
            });
        }
    }
    if let Some(up) = up.filter(|_| keep_upstream) {
        pool.put(up);
    }
    Ok(if close { Next::Close } else { Next::KeepAlive })
}

/// Clone IDs from `Set-Cookie` of the route's session cookie: the last ID is the
/// responding server's own (WebSphere appends its clone ID when it takes a session over;
/// Tomcat's JvmRouteBinderValve rewrites the route to its own).
fn learn(ctx: &VipCtx, route: &RouteCtx, res: &ResponseHead, buf: &[u8], backend: usize) {
    let name = &route.cookie[..];
    let format = route.farm.session_format;
    for h in &res.headers {
        if !is(&buf[h.name.clone()], "set-cookie") {
            continue;
        }
        if let Some(id) = session::set_cookie(&buf[h.value.clone()], name).and_then(|v| session::parse_as(v, format)) {
            if let Some(own) = id.clones.last() {
                // Partition IDs are WebSphere's; a numeric jvmRoute is a route.
                if format == SessionFormat::JvmRoute || !session::is_partition(own) {
                    ctx.servers.learn(own, backend);
                }
            }
        }
    }
}
