//! One client connection: read a request head, route it, send it upstream over a pooled
//! connection, stream the body both ways, learn clone IDs from the response, repeat while
//! both sides keep the connection.

use std::{
    net::SocketAddr,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use bytes::BytesMut;
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
    sync::watch,
};

use super::{
    hold::{await_shared, hold, HoldEnd},
    pool::{Pool, Upstream},
    retry::{is_idempotent, retry_allowed},
    route::{Decision, VipRoute},
    session,
    tunnel::{tunnel, TunnelTimeouts},
    Counted,
};
use crate::capacity::queue::Refused;
use crate::http1::{
    body::{precheck_chunked, read_body, relay_body, within_rate, Inbound, RelayError, Timeouts},
    head::{parse_request, parse_response, Framing, HeadLimits, Header, Reject, RequestHead, ResponseHead},
    io::{ReadSide, WriteSide},
    rewrite::{build_request, build_response, is},
    send_error, write_client, ERROR_WRITE_DEADLINE,
};
use crate::{
    access_log::{AccessLog, Decision as LogDecision, Entry, MAX_REQUEST_LINE},
    config::{HttpSettings, Redirect, SessionFormat},
    state::Cluster,
    tls::server::ServerTls,
};
use dispatcher_common::BackendState;

/// Everything a connection on one HTTP VIP needs.
pub struct VipCtx {
    /// The VIP's authority (`address[:port]`), the Host of a request that has none.
    pub host: String,
    /// Index in `Config::vips` (for the per-VIP counters).
    pub vip_index: usize,
    pub route: Arc<VipRoute>,
    /// Indexed by backend id; `Some` for the VIP's members.
    pub pools: Vec<Option<Pool>>,
    pub cluster: Arc<Cluster>,
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
    /// How JSESSIONID names its server on this VIP.
    pub session_format: SessionFormat,
    /// `[access_log]`: where its requests are logged.
    pub log: Option<LogTo>,
    /// `insert_cookie`: clients without a session kept on one backend.
    pub persist: Option<super::persist::Persist>,
    /// Whether this dispatcher keeps a connection after its response (steering, leave).
    pub ownership: Arc<crate::steering::Ownership>,
}

/// After the listener stops: how long an idle keep-alive client has to send its next
/// request (answered, with `Connection: close`) before its connection is closed.
const STOP_GRACE: Duration = Duration::from_secs(1);
/// How long to wait for a backend's `100 Continue` before sending the body anyway.
const CONTINUE_WAIT: Duration = Duration::from_secs(1);

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
async fn refuse<W: AsyncWrite + Unpin>(w: &mut W, t: &mut Trace, status: u16, why: &str, retry_after: Option<u32>) {
    t.status = status;
    send_error(w, status, why, retry_after).await;
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
        }
    }

    /// The backend chosen (on a retry, the last one): an owner of the session (affinity),
    /// a replica (failed over), or balanced.
    fn routed(
        &mut self,
        ctx: &VipCtx,
        backend: usize,
        d: &Decision,
        sess: Option<&session::SessionId>,
        pinned: Option<usize>,
    ) {
        if ctx.log.is_none() {
            return;
        }
        self.backend = Some(backend);
        let owned = |s: &session::SessionId| owned_by(&ctx.cluster, s, backend).is_some();
        self.decision = match (d, sess) {
            (Decision::Affinity(_), Some(s)) if !owned(s) => LogDecision::FailedOver,
            (Decision::Affinity(_), None) if pinned.is_some_and(|p| p != backend) => LogDecision::FailedOver,
            (Decision::Affinity(_), _) => LogDecision::Affinity,
            _ => LogDecision::Balanced,
        };
        let c = &ctx.cluster;
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

/// The session's clone ID that `backend` owns.
fn owned_by<'a>(c: &Cluster, s: &session::SessionId<'a>, backend: usize) -> Option<&'a [u8]> {
    s.clones.iter().find(|id| c.owner(id).is_some_and(|(o, _)| o == backend)).copied()
}

impl LogTo {
    /// `request`: the request line as logged (`request_line`, or `<BADREQ>` for a head
    /// that was refused).
    fn entry(&self, t: &Trace, request: Box<[u8]>, client: SocketAddr, bytes_in: u64, bytes_out: u64) {
        let us = |i: Instant| i.saturating_duration_since(t.started).as_micros() as u64;
        self.sink.log(Entry {
            at: std::time::SystemTime::now() - t.started.elapsed(),
            vip: self.vip.clone(),
            client,
            request,
            backend: t.backend.and_then(|b| self.backends.get(b).cloned()),
            session: t.session.clone(),
            decision: t.decision,
            held: t.held,
            retries: t.retries,
            status: t.status,
            bytes_in,
            bytes_out,
            head_us: us(t.head_done),
            wait_us: t.held.then_some(t.wait.as_micros() as u64),
            connect_us: t.connected.map(us),
            response_us: t.response.map(us),
            total_us: t.started.elapsed().as_micros() as u64,
        });
    }
}

/// One client connection: the VIP it came to, the client's two halves, and the buffers
/// its requests reuse.
struct ClientConn {
    ctx: Arc<VipCtx>,
    peer: SocketAddr,
    /// Its slot in the dispatchers' ownership table (`steering::keeps`).
    steer_slot: usize,
    client: Inbound<ReadSide>,
    w: WriteSide,
    /// The head being forwarded or answered.
    out: Vec<u8>,
    /// The header index of the head being parsed.
    scratch: Vec<Header>,
}

/// The client side as one attempt on a backend uses it.
struct Downstream<'a, R> {
    client: &'a mut Inbound<R>,
    w: &'a mut WriteSide,
    scratch: &'a mut Vec<Header>,
}

pub async fn serve(ctx: Arc<VipCtx>, stream: TcpStream, peer: SocketAddr, mut stop: watch::Receiver<bool>) {
    let _ = stream.set_nodelay(true);
    let steer_slot = crate::steering::slot_of(peer, stream.local_addr().unwrap_or(peer));
    let (r, w, _) = match &ctx.tls {
        None => crate::http1::io::split_plain(stream),
        // Boxed: the handshake's state exists only during the handshake, not in every
        // idle connection's task.
        Some(tls) => match Box::pin(tls.accept(stream)).await {
            Some(conn) => crate::http1::io::split_tls(conn),
            None => return,
        },
    };
    // Request heads are small: 4 KiB reads (more for bodies), allocated at the first
    // read, keep many idle keep-alive clients cheap.
    let client = Inbound::with_chunk(r, 4096);
    let mut conn = ClientConn { ctx, peer, steer_slot, client, w, out: Vec::new(), scratch: Vec::new() };
    loop {
        let (head, head_started) = match read_head(&conn.ctx, &mut conn.client, &mut conn.scratch, &mut stop).await {
            HeadRead::Head(h, t) => (h, t),
            HeadRead::Closed => return,
            HeadRead::Reject(r, started) => {
                let written0 = conn.w.written;
                send_error(&mut conn.w, r.status, r.reason, None).await;
                // HAProxy's `<BADREQ>`: what arrived is not a request line to show.
                let received = conn.client.buf.len() as u64;
                conn.log_answer(started, r.status, b"<BADREQ>"[..].into(), received, written0);
                return;
            }
        };
        let head_bytes = conn.client.buf.split_to(head.len);
        conn.ctx.capacity.vips[conn.ctx.vip_index].requests.fetch_add(1, Ordering::Relaxed);
        if let Some(to) = &conn.ctx.redirect {
            let answer = redirect_answer(&head, &head_bytes, to);
            let written0 = conn.w.written;
            let sent = write_client(&mut conn.w, answer.as_bytes(), ERROR_WRITE_DEADLINE).await;
            let line = request_line(&head, &head_bytes);
            conn.log_answer(head_started, 308, line, head.len as u64, written0);
            if sent {
                let _ = conn.w.shutdown().await;
                // What the client still sends (a body) is read and dropped for a moment,
                // so that the close does not turn into a reset that loses the answer.
                let drain = async {
                    let mut left = 64 * 1024usize;
                    conn.client.buf.clear();
                    while left > 0 {
                        match conn.client.fill(Duration::from_secs(1)).await {
                            Ok(n) if n > 0 => {
                                left = left.saturating_sub(n);
                                conn.client.buf.clear();
                            }
                            _ => break,
                        }
                    }
                };
                let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
            }
            return;
        }
        let closing = *stop.borrow();
        // Boxed: the exchange's (large) state exists only while a request is in flight,
        // so an idle keep-alive connection's task stays small.
        let next = Box::pin(conn.exchange(&head, &head_bytes, closing, head_started)).await;
        // Keep the header index's allocation for the next request.
        conn.scratch = head.headers;
        match next {
            Next::KeepAlive => {}
            _ => {
                let _ = conn.w.shutdown().await;
                return;
            }
        }
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
            deadline.get_or_insert_with(|| Instant::now() + ctx.settings.header_timeout);
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
                let r = Reject { status: 400, reason: "connection closed inside the request head" };
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

/// When the head being read began: its deadline less the header timeout.
fn head_started(deadline: Option<Instant>, ctx: &VipCtx) -> Instant {
    deadline.map_or_else(Instant::now, |d| d - ctx.settings.header_timeout)
}

/// Why no response head came from a backend.
enum UpstreamFail {
    /// Closed or reset before any byte of a response: on a reused connection, the
    /// server had closed it while idle.
    Stale,
    Timeout,
    Bad(Reject),
}

async fn read_response(
    up: &mut Upstream,
    req: &RequestHead,
    limits: &HeadLimits,
    scratch: &mut Vec<Header>,
    timeout: Duration,
) -> Result<ResponseHead, UpstreamFail> {
    let deadline = Instant::now() + timeout;
    loop {
        if !up.r.buf.is_empty() {
            match parse_response(&up.r.buf, req, limits, scratch) {
                Ok(Some(h)) => return Ok(h),
                Ok(None) => {}
                Err(r) => return Err(UpstreamFail::Bad(r)),
            }
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match up.r.fill(wait).await {
            Ok(0) | Err(RelayError::Read(_)) if up.r.buf.is_empty() => return Err(UpstreamFail::Stale),
            Ok(0) | Err(RelayError::Read(_)) => {
                return Err(UpstreamFail::Bad(Reject {
                    status: 502,
                    reason: "backend closed inside the response head",
                }))
            }
            Ok(_) => {}
            Err(RelayError::Timeout) => return Err(UpstreamFail::Timeout),
            Err(_) => return Err(UpstreamFail::Stale),
        }
    }
}

/// How an attempt on one backend failed, before any response byte reached the client.
enum SendFail {
    /// Could not connect (refused, timed out, connection limit).
    Unreachable(super::pool::PoolError),
    /// Reset or closed before any response byte (on a fresh connection).
    Closed,
    /// No response within the server timeout.
    Timeout,
    /// A malformed response head.
    Bad(Reject),
    /// The client has been answered already (400, 408...) or is gone.
    Answered,
}

/// One attempt's clock: the end of its queueing (the backend's `maxconn` queue and its
/// connection limit's together), and when it got its connection.
struct Attempt {
    queue_deadline: Instant,
    connected: Option<Instant>,
}

/// Whether the backend a request waited for still serves it as `decision` chose it: an
/// owner or replica that still keeps its sessions (not suspect), or, balanced, one still
/// taking new work.
fn still_fits(be: &crate::state::Backend, decision: &Decision) -> bool {
    match decision {
        Decision::Affinity(_) => matches!(be.state(), BackendState::Up | BackendState::Drain),
        _ => be.is_up(),
    }
}

/// Resolves once `be` no longer serves a request routed by `decision` (`still_fits`).
async fn until_unfit(be: &crate::state::Backend, decision: &Decision) {
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

/// Sends the request (head in `out`, body from the client) to `backend` and reads the
/// response head. A pooled connection found closed is replaced once by a fresh one, only
/// when nothing of the request could have been consumed (no body).
async fn send<R: AsyncRead + Unpin>(
    ctx: &VipCtx,
    head: &RequestHead,
    backend: usize,
    down: Downstream<'_, R>,
    out: &[u8],
    buffered_body: Option<&[u8]>,
    attempt: &mut Attempt,
) -> Result<(Upstream, ResponseHead, bool), SendFail> {
    let Downstream { client, w, scratch } = down;
    let s = &ctx.settings;
    let be = &ctx.cluster.backends[backend];
    let pool = ctx.pools[backend].as_ref().ok_or(SendFail::Answered)?;
    // A body read ahead into the retry buffer is sent like part of the head: nothing of
    // the client's stream is consumed by an attempt, so it can be replayed.
    let has_body = head.framing != Framing::None && buffered_body.is_none();
    let trusted = matches!(be.state(), BackendState::Up | BackendState::Drain);
    let mut up = pool.get(trusted, attempt.queue_deadline).await.map_err(SendFail::Unreachable)?;
    attempt.connected = Some(Instant::now());
    let mut fresh_tried = false;
    loop {
        let replaceable = up.reused && !has_body && !fresh_tried;
        let written = write_client(&mut up.w, out, s.server_timeout).await
            && match buffered_body {
                Some(b) => write_client(&mut up.w, b, s.server_timeout).await,
                None => true,
            };
        if !written {
            if replaceable {
                fresh_tried = true;
                // Its share of the connection limit goes to the new one.
                drop(up);
                up = pool.connect(attempt.queue_deadline).await.map_err(SendFail::Unreachable)?;
                continue;
            }
            return Err(SendFail::Closed);
        }
        let mut early = None;
        if has_body {
            if head.expect_continue {
                // Wait briefly for the server's verdict on the body: 100 (send it), a final
                // answer (the body stays unread), or nothing (send it anyway). Other interim
                // responses (103 Early Hints) go to the client while the wait goes on.
                let until = tokio::time::Instant::now() + CONTINUE_WAIT;
                loop {
                    let verdict = read_response(&mut up, head, &ctx.limits, scratch, s.server_timeout);
                    match tokio::time::timeout_at(until, verdict).await {
                        Ok(Ok(r)) if r.status == 100 => {
                            bytes::Buf::advance(&mut up.r.buf, r.len);
                            if !write_client(w, b"HTTP/1.1 100 Continue\r\n\r\n", s.client_timeout).await {
                                up.abort();
                                return Err(SendFail::Answered);
                            }
                        }
                        Ok(Ok(r)) if (102..200).contains(&r.status) => {
                            let interim = up.r.buf.split_to(r.len);
                            if !write_client(w, &interim, s.client_timeout).await {
                                up.abort();
                                return Err(SendFail::Answered);
                            }
                            continue;
                        }
                        Ok(Ok(r)) => early = Some(r),
                        Ok(Err(UpstreamFail::Timeout)) => return Err(SendFail::Timeout),
                        Ok(Err(UpstreamFail::Bad(r))) => return Err(SendFail::Bad(r)),
                        Ok(Err(UpstreamFail::Stale)) => return Err(SendFail::Closed),
                        Err(_) => {}
                    }
                    break;
                }
            }
            if early.is_none() {
                // Per read the client timeout; after body_timeout, a minimum average rate
                // (a body trickling one byte at a time cannot keep a request and its server
                // connection, a large upload goes on).
                let t = Timeouts { read: s.client_timeout, write: s.server_timeout };
                let meter = client.meter();
                let relay = relay_body(head.framing, client, &mut up.w, t, false);
                let relayed = within_rate(relay, &meter, s.body_timeout, s.body_min_rate).await;
                match relayed {
                    Ok(()) => {}
                    Err(RelayError::Write(_)) => return Err(SendFail::Closed),
                    Err(e) => {
                        // The request is refused or gone: the server must not take what it
                        // received for a whole request. The connection is reset.
                        up.abort();
                        drop(up);
                        match e {
                            RelayError::Chunk(why) => send_error(w, 400, why, None).await,
                            RelayError::Timeout => send_error(w, 408, "request body not received in time", None).await,
                            _ => {}
                        }
                        return Err(SendFail::Answered);
                    }
                }
            }
        }
        let skipped = early.is_some();
        let res = match early {
            Some(r) => Ok(r),
            None => read_response(&mut up, head, &ctx.limits, scratch, s.server_timeout).await,
        };
        return match res {
            Ok(r) => Ok((up, r, skipped)),
            Err(UpstreamFail::Stale) if replaceable => {
                fresh_tried = true;
                drop(up);
                up = pool.connect(attempt.queue_deadline).await.map_err(SendFail::Unreachable)?;
                continue;
            }
            Err(UpstreamFail::Stale) => Err(SendFail::Closed),
            Err(UpstreamFail::Timeout) => Err(SendFail::Timeout),
            Err(UpstreamFail::Bad(r)) => Err(SendFail::Bad(r)),
        };
    }
}

/// Counts a request in flight on a backend for as long as it lives.
struct InFlight<'a>(&'a crate::state::Backend);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ClientConn {
    /// Logs a request the dispatcher answered itself (a refused head, a redirect), when
    /// the VIP has an access log.
    fn log_answer(&self, started: Instant, status: u16, request: Box<[u8]>, bytes_in: u64, written0: u64) {
        if let Some(log) = &self.ctx.log {
            let mut t = Trace::new(started);
            t.status = status;
            log.entry(&t, request, self.peer, bytes_in, self.w.written - written0);
        }
    }

    /// One request and its response, logged when the VIP has an access log.
    async fn exchange(&mut self, head: &RequestHead, buf: &BytesMut, closing: bool, started: Instant) -> Next {
        let mut t = Trace::new(started);
        let Some(log) = self.ctx.log.clone() else {
            return self.routed(head, buf, closing, &mut t).await;
        };
        let (read0, buffered0, written0) = (self.client.total_read, self.client.buf.len(), self.w.written);
        let next = self.routed(head, buf, closing, &mut t).await;
        // What this request took from the client's stream: its head, and whatever of the
        // buffer and of later reads it consumed (a pipelined next request stays).
        let consumed =
            (buffered0 as u64 + (self.client.total_read - read0)).saturating_sub(self.client.buf.len() as u64);
        log.entry(&t, request_line(head, buf), self.peer, head.len as u64 + consumed, self.w.written - written0);
        next
    }

    /// Routes and forwards one request (`buf` holds the head `head` was parsed from).
    async fn routed(&mut self, head: &RequestHead, buf: &BytesMut, closing: bool, trace: &mut Trace) -> Next {
        let ClientConn { ctx, peer, steer_slot, client, w, out, scratch } = self;
        let ctx: &VipCtx = ctx;
        let s = &ctx.settings;
        if crate::http1::rewrite::looped(head, buf) {
            // Forwarded by this very process before: it came back through a backend that
            // leads here. Answered, never forwarded again (each round would take two more
            // descriptors until they run out).
            ctx.cluster.counters.loops.fetch_add(1, Ordering::Relaxed);
            crate::ratelimit::warn(
                "forwarding loop: a request came back with this dispatcher's own Via marker (answered 508); forwarding",
                &format_args!("VIP {}, from {peer}", ctx.host),
            );
            refuse(w, trace, 508, "this request has already passed through this dispatcher (a forwarding loop)", None)
                .await;
            return Next::Close;
        }
        let cookies =
            || head.headers.iter().filter(|h| is(&buf[h.name.clone()], "cookie")).map(|h| &buf[h.value.clone()]);
        let target = &buf[head.target.clone()];
        let sess =
            session::find(cookies(), target, s.cookie_name.as_bytes(), s.url_parameter.as_bytes(), ctx.session_format)
                .or_else(|| session::app_session(target));
        // Without a session: the VIP's persistence cookie, if it names a member.
        let pinned = match (&sess, &ctx.persist) {
            (None, Some(p)) => p.pinned(cookies()),
            _ => None,
        };
        let started = Instant::now();
        let c = &ctx.cluster;
        c.counters.in_flight.fetch_add(1, Ordering::Relaxed);
        let _request = Counted(&c.counters.in_flight);
        let mut retry_guard = None;
        let has_body = head.framing != Framing::None;
        let idempotent = is_idempotent(&buf[head.method.clone()]);
        // An idempotent request with a small body (Content-Length within the retry buffer) is
        // read ahead, so that a retry can replay it; larger or chunked bodies are streamed
        // and such requests are not retried.
        let buffered_body = match head.framing {
            Framing::Length(n) if idempotent && !head.expect_continue && n <= s.retry_buffer as u64 => {
                let meter = client.meter();
                let read = read_body(client, n as usize, s.client_timeout);
                match within_rate(read, &meter, s.body_timeout, s.body_min_rate).await {
                    Ok(b) => Some(b),
                    Err(RelayError::Timeout) => {
                        refuse(w, trace, 408, "request body not received in time", None).await;
                        return Next::Close;
                    }
                    Err(_) => return Next::Close,
                }
            }
            Framing::Chunked => {
                // Refused before anything goes upstream when the part already at hand shows it.
                let checked = tokio::time::timeout(
                    s.body_timeout,
                    precheck_chunked(client, head.expect_continue, s.client_timeout),
                );
                if let Err(e) = checked.await.unwrap_or(Err(RelayError::Timeout)) {
                    match e {
                        RelayError::Chunk(why) => refuse(w, trace, 400, why, None).await,
                        RelayError::Timeout => refuse(w, trace, 408, "request body not received in time", None).await,
                        _ => {}
                    }
                    return Next::Close;
                }
                None
            }
            _ => None,
        };
        let mut hold_deadline: Option<Instant> = None;
        let mut hold_expired = false;
        let mut learn_deadline: Option<Instant> = None;
        let mut learn_waited = s.learn_wait.is_zero();
        let mut extra_attempts = 0u32;
        let mut requeues = 0u32;
        // The queueing deadline a request routed again after its server left keeps: its
        // waits together stay within one queue timeout.
        let mut requeued_deadline: Option<Instant> = None;
        // Choose a backend, hold while the session's owner is suspect, send; a failure before
        // any response byte is retried after re-routing (bounded, budgeted, idempotent and
        // bodiless requests only). A server that timed out is never retried: no replays.
        let (backend, mut up, mut res, body_skipped, _in_flight) = loop {
            let decision = match pinned {
                Some(b) => ctx.route.route_pinned(c, b, hold_expired),
                None => ctx.route.route(c, sess.as_ref(), hold_expired, learn_waited),
            };
            let backend = match decision {
                Decision::Affinity(b) | Decision::Balanced(b) => b,
                Decision::AwaitShared => {
                    trace.held = true;
                    let waiting = Instant::now();
                    let deadline = *learn_deadline.get_or_insert_with(|| {
                        c.counters.learn_waits.fetch_add(1, Ordering::Relaxed);
                        Instant::now() + s.learn_wait
                    });
                    let end = await_shared(ctx, client, deadline).await;
                    trace.wait += waiting.elapsed();
                    match end {
                        HoldEnd::Changed => {}
                        // Not shared in time (an ID no dispatcher knows), or too many
                        // waiting: balanced, as an unknown clone ID is.
                        HoldEnd::Expired | HoldEnd::Full => learn_waited = true,
                        HoldEnd::ClientGone => return Next::Close,
                    }
                    continue;
                }
                Decision::Hold(b) => {
                    trace.held = true;
                    let waiting = Instant::now();
                    let deadline = *hold_deadline.get_or_insert_with(|| {
                        c.counters.holds.fetch_add(1, Ordering::Relaxed);
                        Instant::now() + s.hold_time
                    });
                    let end = hold(ctx, b, client, deadline).await;
                    trace.wait += waiting.elapsed();
                    match end {
                        HoldEnd::Changed => {}
                        HoldEnd::Expired => {
                            c.counters.hold_timeouts.fetch_add(1, Ordering::Relaxed);
                            hold_expired = true;
                        }
                        HoldEnd::Full => {
                            refuse(w, trace, 503, "too many requests waiting for their server", Some(2)).await;
                            return Next::Close;
                        }
                        HoldEnd::ClientGone => return Next::Close,
                    }
                    continue;
                }
                Decision::SessionUnavailable => {
                    refuse(w, trace, 503, "the session's server and its replica are unavailable", Some(5)).await;
                    return Next::Close;
                }
                Decision::NoBackend => {
                    refuse(w, trace, 503, "no server available", Some(5)).await;
                    return Next::Close;
                }
            };
            if let Some(sess) = &sess {
                if !VipRoute::may_serve(c, sess, backend) {
                    c.counters.misroutes.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(backend = %c.backends[backend].name, "misroute: a session request to a server that neither owns it nor replicates it");
                }
            }
            let be = &c.backends[backend];
            trace.routed(ctx, backend, &decision, sess.as_ref(), pinned);
            // `maxconn`: a slot now, or a bounded wait in this backend's queue (a session's
            // request never goes elsewhere for want of room). One deadline covers this queue
            // and the connection limit's.
            let waiting = Instant::now();
            let queue_deadline = requeued_deadline.take().unwrap_or(waiting + s.queue_timeout);
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
            let slot = match slot {
                Err(Refused::Left) if requeues < MAX_REQUEUES => {
                    requeues += 1;
                    requeued_deadline = Some(queue_deadline);
                    continue;
                }
                Ok(slot) => slot,
                Err(why) => {
                    if why == Refused::Left {
                        be.slots.refused_left.fetch_add(1, Ordering::Relaxed);
                    } else {
                        c.counters.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                    }
                    let msg = match why {
                        Refused::QueueFull => "the server's queue is full",
                        Refused::Timeout => "the server is busy",
                        Refused::Left => "the server left while the request waited",
                    };
                    refuse(w, trace, 503, msg, Some(1)).await;
                    return Next::Close;
                }
            };
            be.outstanding.fetch_add(1, Ordering::Relaxed);
            let in_flight = (InFlight(be), slot);
            be.requests.fetch_add(1, Ordering::Relaxed);
            build_request(out, head, buf, peer.ip(), &ctx.host, &ctx.forwarded);
            let down = Downstream { client: &mut *client, w: &mut *w, scratch: &mut *scratch };
            let mut attempt = Attempt { queue_deadline, connected: None };
            let sent = send(ctx, head, backend, down, out, buffered_body.as_deref(), &mut attempt).await;
            trace.connected = attempt.connected;
            let failure = match sent {
                Ok((up, res, skipped)) => {
                    break (backend, up, res, skipped, in_flight);
                }
                Err(f) => f,
            };
            drop(in_flight);
            be.errors.fetch_add(1, Ordering::Relaxed);
            let retry = match &failure {
                SendFail::Unreachable(e) => !e.is_busy() && !e.is_local(),
                SendFail::Closed => true,
                _ => false,
            };
            let (status, why, retry_after) = match failure {
                SendFail::Answered => return Next::Close,
                SendFail::Unreachable(e) if e.is_busy() => {
                    // A full queue is not a failed server: its health is left alone.
                    c.counters.queue_timeouts.fetch_add(1, Ordering::Relaxed);
                    refuse(w, trace, 503, "the server is busy", Some(1)).await;
                    return Next::Close;
                }
                SendFail::Unreachable(e) if e.is_local() => {
                    // Out of descriptors, ports or buffers here: the dispatcher's trouble, never
                    // the backend's.
                    c.counters.local_errors.fetch_add(1, Ordering::Relaxed);
                    crate::ratelimit::warn("upstream connect", &e);
                    refuse(w, trace, 503, "the dispatcher is out of resources", Some(1)).await;
                    return Next::Close;
                }
                SendFail::Unreachable(e) if e.is_tls() => {
                    // It answered, but not as the server it must be (certificate, name,
                    // protocol): a bad gateway, and a failing backend.
                    c.passive_failure(backend);
                    crate::ratelimit::warn("TLS to a backend failed", &e);
                    (502, "the server's TLS handshake failed", None)
                }
                SendFail::Unreachable(e) => {
                    c.passive_failure(backend);
                    tracing::debug!(backend = %be.name, error = %e, "upstream connect failed");
                    (503, "the server could not be reached", Some(2))
                }
                SendFail::Closed => {
                    c.passive_failure(backend);
                    (502, "the server closed the connection", None)
                }
                SendFail::Timeout => {
                    // Half-dead: suspect (no more requests for it until a check passes), its idle
                    // connections closed, and this request not replayed anywhere.
                    c.passive_failure(backend);
                    if let Some(pool) = ctx.pools[backend].as_ref() {
                        pool.clear();
                    }
                    refuse(w, trace, 504, "the server did not answer in time", None).await;
                    return Next::Close;
                }
                SendFail::Bad(r) => (502, r.reason, None),
            };
            if retry && idempotent && (!has_body || buffered_body.is_some()) && extra_attempts < s.retries {
                if retry_allowed(c, s) {
                    extra_attempts += 1;
                    trace.retries = extra_attempts;
                    c.counters.retries.fetch_add(1, Ordering::Relaxed);
                    if retry_guard.is_none() {
                        c.counters.retries_in_flight.fetch_add(1, Ordering::Relaxed);
                        retry_guard = Some(Counted(&c.counters.retries_in_flight));
                    }
                    continue;
                }
                c.counters.retry_budget_refusals.fetch_add(1, Ordering::Relaxed);
            }
            refuse(w, trace, status, why, retry_after).await;
            return Next::Close;
        };
        let be = &c.backends[backend];
        let pool = ctx.pools[backend].as_ref().expect("a pool for the chosen backend");
        // Interim responses (other than 101) go to the client as they are; then the final one.
        while (100..200).contains(&res.status) && res.status != 101 {
            let interim = up.r.buf.split_to(res.len);
            if !write_client(w, &interim, s.client_timeout).await {
                return Next::Close;
            }
            res = match read_response(&mut up, head, &ctx.limits, scratch, s.server_timeout).await {
                Ok(r) => r,
                Err(_) => return Next::Close,
            };
        }
        let took = started.elapsed();
        trace.response = Some(Instant::now());
        trace.status = res.status;
        be.latency.record(took);
        if let Some(v) = ctx.capacity.vips.get(ctx.vip_index) {
            v.latency.record(took);
        }
        if ctx.suspect_on_status.contains(&res.status) {
            // The configured passive 5xx policy: the answer is relayed, the backend is suspect.
            c.passive_failure(backend);
        }
        let res_buf = up.r.buf.split_to(res.len);
        learn(ctx, &res, &res_buf, backend);

        if res.status == 101 && !head.upgrade {
            // Switching protocols nobody asked for: the stream can no longer be trusted.
            be.errors.fetch_add(1, Ordering::Relaxed);
            refuse(w, trace, 502, "unsolicited 101 from the server", None).await;
            return Next::Close;
        }
        if res.status == 101 {
            build_response(out, &res, &res_buf, false, false, false);
            if !write_client(w, out, s.client_timeout).await {
                return Next::Close;
            }
            let t = TunnelTimeouts {
                idle: s.tunnel_timeout,
                client_write: s.client_timeout,
                server_write: s.server_timeout,
            };
            // The client's bytes through the tunnel count as the request's.
            client.total_read += tunnel(client, w, up, t).await;
            return Next::Close;
        }
        // An HTTP/1.0 client cannot read chunked: it gets the bare body, delimited by close.
        let dechunk = head.minor == 0 && res.framing == Framing::Chunked;
        // A server that answered before `100 Continue` leaves the request body unread: the
        // connection cannot carry another request.
        // `closing`: this listener is stopping (shutdown or reload): the client is told to
        // reconnect, which reaches the new listeners.
        // `keeps`: after a membership change, a connection another dispatcher owns now
        // (or any, once this one leaves) moves there between two requests.
        let close = !head.keep_alive
            || res.framing == Framing::UntilClose
            || dechunk
            || body_skipped
            || closing
            || !ctx.ownership.keeps(*steer_slot);
        build_response(out, &res, &res_buf, close, dechunk, head.minor == 0);
        if let (Some(p), None) = (&ctx.persist, &sess) {
            // A client without the cookie, or whose cookie names another backend (it
            // failed over), is told where it is now.
            if pinned != Some(backend) {
                p.insert(out, backend, super::persist::has_cache_control(&res, &res_buf));
            }
        }
        // A small body already read goes out with the head: one write per response.
        let mut framing = if dechunk { Framing::Chunked } else { res.framing };
        if let Framing::Length(n) = framing {
            if up.r.buf.len() as u64 >= n && n <= 64 * 1024 {
                out.extend_from_slice(&up.r.buf.split_to(n as usize));
                framing = Framing::None;
            }
        }
        let keep_upstream = !res.close && !body_skipped;
        // The whole response is in hand: the backend connection (and its share of the
        // backend's connection limit) goes back before the client reads it, so a client that
        // reads slowly holds no backend connection.
        let mut up = if framing == Framing::None {
            if keep_upstream {
                pool.put(up);
            }
            None
        } else {
            Some(up)
        };
        if !write_client(w, out, s.client_timeout).await {
            return Next::Close;
        }
        if let Some(mut up) = up.take() {
            let t = Timeouts { read: s.server_timeout, write: s.client_timeout };
            if let Err(e) = relay_body(framing, &mut up.r, w, t, dechunk).await {
                // Part of the response is out: the client must see the connection abort, never
                // a response that looks complete.
                be.errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(backend = %be.name, error = %e, "response body relay failed");
                return Next::Close;
            }
            if keep_upstream {
                pool.put(up);
            }
        }
        if close {
            Next::Close
        } else {
            Next::KeepAlive
        }
    }
}

/// Clone IDs from `Set-Cookie: JSESSIONID=...`: the last ID is the responding server's
/// own (WebSphere appends its clone ID when it takes a session over; Tomcat's
/// JvmRouteBinderValve rewrites the route to its own).
fn learn(ctx: &VipCtx, res: &ResponseHead, buf: &[u8], backend: usize) {
    let name = ctx.settings.cookie_name.as_bytes();
    let format = ctx.session_format;
    for h in &res.headers {
        if !is(&buf[h.name.clone()], "set-cookie") {
            continue;
        }
        if let Some(id) = session::set_cookie(&buf[h.value.clone()], name).and_then(|v| session::parse_as(v, format)) {
            if let Some(own) = id.clones.last() {
                // Partition IDs are WebSphere's; a numeric jvmRoute is a route.
                if format == SessionFormat::JvmRoute || !session::is_partition(own) {
                    ctx.cluster.learn(own, backend);
                }
            }
        }
    }
}
