//! One attempt of a request on one backend: the body read ahead so that the attempt can
//! be replayed, the request sent over a pooled connection (the `100 Continue` exchange
//! and the streamed body included), and the response head read back. How an attempt
//! fails says itself whether it may be made again and what the client is told
//! (`SendFail::retryable`, `SendFail::answer`).

use std::time::{Duration, Instant};

use tokio::io::AsyncRead;

use super::{
    answer::Answer,
    client::Client,
    pool::{PoolError, Upstream},
    proxy::VipCtx,
};
use crate::config::HttpSettings;
use crate::http1::{
    body::{precheck_chunked, read_body, relay_body, within_rate, Inbound, RelayError, Timeouts},
    head::{parse_response, Framing, HeadLimits, Header, Reject, RequestHead, ResponseHead},
    write_client,
};
use dispatcher_common::BackendState;

/// How long to wait for a backend's `100 Continue` before sending the body anyway.
const CONTINUE_WAIT: Duration = Duration::from_secs(1);

/// Why no response head came from a backend.
#[derive(Debug)]
pub enum UpstreamFail {
    /// Closed or reset before any byte of a response: on a reused connection, the
    /// server had closed it while idle (the request may go again on a fresh one).
    Stale,
    Timeout,
    Bad(Reject),
}

/// How an attempt on one backend failed, before any response byte reached the client.
#[derive(Debug)]
pub enum SendFail {
    /// Could not connect (refused, timed out, connection limit).
    Unreachable(PoolError),
    /// Reset or closed before any response byte (on a fresh connection).
    Closed,
    /// No response within the server timeout.
    Timeout,
    /// A malformed response head.
    Bad(Reject),
    /// The client has been answered already (400, 408...) or is gone.
    Answered,
}

impl From<UpstreamFail> for SendFail {
    fn from(f: UpstreamFail) -> SendFail {
        match f {
            UpstreamFail::Stale => SendFail::Closed,
            UpstreamFail::Timeout => SendFail::Timeout,
            UpstreamFail::Bad(r) => SendFail::Bad(r),
        }
    }
}

impl SendFail {
    /// Whether the request may be routed and sent again (when it is idempotent and its
    /// body replayable, and the retry budget allows): the server never got it or never
    /// acted on it. A server that timed out may have; a full queue or a shortage here is
    /// no reason to try elsewhere; a client already answered is done.
    pub fn retryable(&self) -> bool {
        match self {
            SendFail::Unreachable(e) => !e.is_busy() && !e.is_local(),
            SendFail::Closed => true,
            _ => false,
        }
    }

    /// Whether the request reached a server: a retry after an attempt that never
    /// connected is no replay, and is not charged to the retry budget.
    pub fn reached_a_server(&self) -> bool {
        !matches!(self, SendFail::Unreachable(_))
    }

    /// What the client is told when the attempt is not made again (none once answered).
    pub fn answer(&self) -> Option<Answer> {
        Some(match self {
            SendFail::Answered => return None,
            SendFail::Unreachable(e) if e.is_busy() => Answer::new(503, "the server is busy").retry_after(1),
            SendFail::Unreachable(e) if e.is_local() => {
                Answer::new(503, "the dispatcher is out of resources").retry_after(1)
            }
            SendFail::Unreachable(e) if e.is_tls() => Answer::new(502, "the server's TLS handshake failed"),
            SendFail::Unreachable(_) => Answer::new(503, "the server could not be reached").retry_after(2),
            SendFail::Closed => Answer::new(502, "the server closed the connection"),
            SendFail::Timeout => Answer::new(504, "the server did not answer in time"),
            SendFail::Bad(r) => Answer::new(502, r.reason),
        })
    }

    /// How the request ended, as HAProxy's termination state says it (who, which phase).
    pub fn term(&self) -> [u8; 2] {
        use crate::access_log::term;
        match self {
            SendFail::Unreachable(e) if e.is_busy() => term::QUEUE_TIMEOUT,
            SendFail::Unreachable(e) if e.is_local() => term::RESOURCE_CONNECT,
            SendFail::Unreachable(_) => term::SERVER_CONNECT,
            SendFail::Closed => term::SERVER_HEADERS,
            SendFail::Timeout => term::SERVER_HEADERS_TIMEOUT,
            SendFail::Bad(_) => term::PROXY_HEADERS,
            SendFail::Answered => term::CLIENT_DATA,
        }
    }

    /// What the failure says of `backend` (its health, its idle connections) and of this
    /// host (the counters, the log).
    pub fn blame(&self, ctx: &VipCtx, backend: usize) {
        let c = &ctx.servers;
        match self {
            SendFail::Answered | SendFail::Bad(_) => {}
            SendFail::Unreachable(e) if e.is_busy() => {
                // A full queue is not a failed server: its health is left alone.
                c.counters.queue_timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            SendFail::Unreachable(e) if e.is_local() => {
                // Out of descriptors, ports or buffers here: the dispatcher's trouble, never
                // the backend's.
                c.counters.local_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                crate::ratelimit::warn("upstream connect", e);
            }
            SendFail::Unreachable(e) if e.is_tls() => {
                // It answered, but not as the server it must be (certificate, name,
                // protocol): a bad gateway, and a failing backend.
                c.passive_failure(backend, crate::health::Cause::Tls);
                crate::ratelimit::warn("TLS to a backend failed", e);
            }
            SendFail::Unreachable(e) => {
                c.passive_failure(backend, e.cause());
                tracing::debug!(backend = %c.backends[backend].name, error = %e, "upstream connect failed");
            }
            SendFail::Closed => c.passive_failure(backend, crate::health::Cause::Closed),
            SendFail::Timeout => {
                // Half-dead: suspect (no more requests for it until a check passes), its idle
                // connections closed, and this request not replayed anywhere.
                c.passive_failure(backend, crate::health::Cause::Timeout(0));
                if let Some(pool) = ctx.pools[backend].as_ref() {
                    pool.clear();
                }
            }
        }
    }
}

/// The client side as one attempt on a backend uses it.
pub struct Downstream<'a> {
    pub client: &'a mut Client,
    pub scratch: &'a mut Vec<Header>,
    /// The head being forwarded or answered.
    pub out: &'a mut Vec<u8>,
}

impl Downstream<'_> {
    pub fn reborrow(&mut self) -> Downstream<'_> {
        Downstream { client: self.client, scratch: self.scratch, out: self.out }
    }
}

/// One attempt's clock: the end of its queueing (the backend's `maxconn` queue and its
/// connection limit's together), and when it got its connection.
pub struct Attempt {
    pub queue_deadline: Instant,
    pub connected: Option<Instant>,
}

/// What an attempt that got a response head hands on: the connection, the head (still
/// in the connection's buffer), and whether the request body was left unsent (the
/// server answered before `100 Continue`).
pub type Reply = (Upstream, ResponseHead, bool);

/// The read-ahead phase: an idempotent request with a small body (Content-Length within
/// the retry buffer) is read into memory, so that a retry can replay it; larger or
/// chunked bodies are streamed and such requests are not retried. A chunked body is
/// refused before anything goes upstream when the part already at hand shows it bad.
/// `Err`: the request ends here, with the answer, if any, the client is owed.
pub async fn read_ahead<R: AsyncRead + Unpin>(
    client: &mut Inbound<R>,
    head: &RequestHead,
    idempotent: bool,
    s: &HttpSettings,
) -> Result<Option<Vec<u8>>, Option<Answer>> {
    match head.framing {
        Framing::Length(n) if idempotent && !head.expect_continue && n <= s.retry_buffer as u64 => {
            let meter = client.meter();
            let read = read_body(client, n as usize, s.client_timeout);
            match within_rate(read, &meter, s.body_timeout, s.body_min_rate).await {
                Ok(b) => Ok(Some(b)),
                Err(e) => Err(Answer::body_failed(&e)),
            }
        }
        Framing::Chunked => {
            let checked =
                tokio::time::timeout(s.body_timeout, precheck_chunked(client, head.expect_continue, s.client_timeout));
            match checked.await.unwrap_or(Err(RelayError::Timeout)) {
                Ok(()) => Ok(None),
                Err(e) => Err(Answer::body_failed(&e)),
            }
        }
        _ => Ok(None),
    }
}

/// Reads a response head from a backend within `timeout` (it stays in `up.buf`).
pub async fn read_response<R: AsyncRead + Unpin>(
    up: &mut Inbound<R>,
    req: &RequestHead,
    limits: &HeadLimits,
    scratch: &mut Vec<Header>,
    timeout: Duration,
) -> Result<ResponseHead, UpstreamFail> {
    let deadline = Instant::now() + timeout;
    loop {
        if !up.buf.is_empty() {
            match parse_response(&up.buf, req, limits, scratch) {
                Ok(Some(h)) => return Ok(h),
                Ok(None) => {}
                Err(r) => return Err(UpstreamFail::Bad(r)),
            }
        }
        let wait = deadline.saturating_duration_since(Instant::now());
        match up.fill(wait).await {
            Ok(0) | Err(RelayError::Read(_)) if up.buf.is_empty() => return Err(UpstreamFail::Stale),
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

/// Sends the request (head in `down.out`, body from the client) to `backend` and reads
/// the response head. A pooled connection found closed is replaced once by a fresh one,
/// only when nothing of the request could have been consumed (no body).
pub async fn send(
    ctx: &VipCtx,
    s: &HttpSettings,
    head: &RequestHead,
    backend: usize,
    down: Downstream<'_>,
    buffered_body: Option<&[u8]>,
    attempt: &mut Attempt,
) -> Result<Reply, SendFail> {
    let Downstream { client, scratch, out } = down;
    let be = &ctx.servers.backends[backend];
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
            (up, early) = send_body(ctx, s, head, up, client, scratch).await?;
        }
        let skipped = early.is_some();
        let res = match early {
            Some(r) => Ok(r),
            None => read_response(&mut up.r, head, &ctx.limits, scratch, s.server_timeout).await,
        };
        return match res {
            Ok(r) => Ok((up, r, skipped)),
            Err(UpstreamFail::Stale) if replaceable => {
                fresh_tried = true;
                drop(up);
                up = pool.connect(attempt.queue_deadline).await.map_err(SendFail::Unreachable)?;
                continue;
            }
            Err(f) => Err(f.into()),
        };
    }
}

/// The streamed request body, after the `100 Continue` exchange when the client asked
/// for one. A final answer that came before it (the body left unread) is handed back.
async fn send_body(
    ctx: &VipCtx,
    s: &HttpSettings,
    head: &RequestHead,
    mut up: Upstream,
    client: &mut Client,
    scratch: &mut Vec<Header>,
) -> Result<(Upstream, Option<ResponseHead>), SendFail> {
    if head.expect_continue {
        match await_continue(&mut up.r, client, head, &ctx.limits, scratch, s).await {
            Ok(Some(early)) => return Ok((up, Some(early))),
            Ok(None) => {}
            Err(SendFail::Answered) => {
                up.abort();
                return Err(SendFail::Answered);
            }
            Err(f) => return Err(f),
        }
    }
    // Per read the client timeout; after body_timeout, a minimum average rate (a body
    // trickling one byte at a time cannot keep a request and its server connection, a
    // large upload goes on).
    let t = Timeouts { read: s.client_timeout, write: s.server_timeout };
    let meter = client.r.meter();
    let relay = relay_body(head.framing, &mut client.r, &mut up.w, t, false);
    match within_rate(relay, &meter, s.body_timeout, s.body_min_rate).await {
        Ok(()) => Ok((up, None)),
        Err(RelayError::Write(_)) => Err(SendFail::Closed),
        Err(e) => {
            // The request is refused or gone: the server must not take what it received
            // for a whole request. The connection is reset.
            up.abort();
            drop(up);
            if let Some(a) = Answer::body_failed(&e) {
                client.answer(a).await;
            }
            Err(SendFail::Answered)
        }
    }
}

/// Waits briefly for the server's verdict on a body the client holds back
/// (`Expect: 100-continue`): `100` (passed on; send it), a final answer (returned: the
/// body stays unread), or nothing within `CONTINUE_WAIT` (send it anyway). Other interim
/// responses (103 Early Hints) go to the client while the wait goes on. `Answered`: the
/// client could not be written to.
async fn await_continue<R: AsyncRead + Unpin>(
    up: &mut Inbound<R>,
    client: &mut Client,
    head: &RequestHead,
    limits: &HeadLimits,
    scratch: &mut Vec<Header>,
    s: &HttpSettings,
) -> Result<Option<ResponseHead>, SendFail> {
    let until = tokio::time::Instant::now() + CONTINUE_WAIT;
    loop {
        let verdict = read_response(up, head, limits, scratch, s.server_timeout);
        let interim = match tokio::time::timeout_at(until, verdict).await {
            Ok(Ok(r)) if r.status == 100 => {
                bytes::Buf::advance(&mut up.buf, r.len);
                return match client.go_on(s.client_timeout).await {
                    true => Ok(None),
                    false => Err(SendFail::Answered),
                };
            }
            Ok(Ok(r)) if (102..200).contains(&r.status) => (up.buf.split_to(r.len).freeze(), r),
            Ok(Ok(r)) => return Ok(Some(r)),
            Ok(Err(f)) => return Err(f.into()),
            Err(_) => return Ok(None),
        };
        if !client.interim(&interim.1, &interim.0, s.client_timeout).await {
            return Err(SendFail::Answered);
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::http1::head::parse_request;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A request head parsed from `text`.
    pub fn request(text: &str) -> RequestHead {
        parse_request(text.as_bytes(), &HeadLimits::default(), &mut Vec::new()).unwrap().expect("a whole head")
    }

    /// Everything the peer of `r` writes until it closes.
    pub async fn drain(mut r: tokio::io::DuplexStream) -> String {
        let mut got = Vec::new();
        r.read_to_end(&mut got).await.unwrap();
        String::from_utf8(got).unwrap()
    }

    fn quick() -> HttpSettings {
        HttpSettings { client_timeout: Duration::from_millis(100), ..HttpSettings::default() }
    }

    /// Runs the read-ahead phase over a client that sends `sent` (then stays open, or
    /// closes when `close`); returns the result and what is left in the client's buffer.
    async fn ahead(head: &str, sent: &[u8], close: bool) -> (Result<Option<Vec<u8>>, Option<Answer>>, Vec<u8>) {
        let (mut peer, io) = tokio::io::duplex(1 << 16);
        peer.write_all(sent).await.unwrap();
        let _open = (!close).then_some(peer);
        let mut client = Inbound::new(io);
        let r = read_ahead(&mut client, &request(head), idempotent_method(head), &quick()).await;
        (r, client.buf.to_vec())
    }

    fn idempotent_method(head: &str) -> bool {
        super::super::retry::is_idempotent(head.split(' ').next().unwrap().as_bytes())
    }

    #[tokio::test]
    async fn read_ahead_buffers_a_small_idempotent_body_only() {
        let put = "PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n";
        let (r, rest) = ahead(put, b"helloGET /next", false).await;
        assert_eq!(r, Ok(Some(b"hello".to_vec())));
        assert_eq!(rest, b"GET /next", "the next request stays");
        // Not idempotent: streamed later, nothing read now.
        let post = "POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n";
        let (r, rest) = ahead(post, b"hello", false).await;
        assert_eq!((r, rest.len()), (Ok(None), 0));
        // Larger than the retry buffer: streamed.
        let big = format!("PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: {}\r\n\r\n", 1 << 20);
        assert_eq!(ahead(&big, b"", false).await.0, Ok(None));
    }

    #[tokio::test]
    async fn read_ahead_refuses_late_short_and_bad_bodies() {
        let put = "PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n";
        assert_eq!(ahead(put, b"he", false).await.0, Err(Some(Answer::BODY_TIMEOUT)));
        // The client closed: nobody to answer.
        assert_eq!(ahead(put, b"he", true).await.0, Err(None));
        let chunked = "POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
        let (r, _) = ahead(chunked, b"zz\r\n", false).await;
        assert!(matches!(r, Err(Some(Answer { status: 400, .. }))), "{r:?}");
        let (r, rest) = ahead(chunked, b"5\r\nhel", false).await;
        assert_eq!(r, Ok(None));
        assert_eq!(rest, b"5\r\nhel", "checked, not consumed");
    }

    #[test]
    fn each_failure_says_whether_it_is_retried_and_what_the_client_is_told() {
        let addr: std::net::SocketAddr = "192.0.2.1:80".parse().unwrap();
        let io = |errno| std::io::Error::from_raw_os_error(errno);
        let refused = SendFail::Unreachable(PoolError::Connect { addr, source: io(111) });
        let local = SendFail::Unreachable(PoolError::Connect { addr, source: io(24) });
        let tls = SendFail::Unreachable(PoolError::Tls { addr, source: io(104) });
        let busy = SendFail::Unreachable(PoolError::Full { addr });
        let bad = SendFail::Bad(Reject { status: 400, reason: "bad status line" });
        let cases = [
            (refused, true, Some((503, "the server could not be reached", Some(2)))),
            (tls, true, Some((502, "the server's TLS handshake failed", None))),
            (SendFail::Closed, true, Some((502, "the server closed the connection", None))),
            (local, false, Some((503, "the dispatcher is out of resources", Some(1)))),
            (busy, false, Some((503, "the server is busy", Some(1)))),
            (SendFail::Timeout, false, Some((504, "the server did not answer in time", None))),
            (bad, false, Some((502, "bad status line", None))),
            (SendFail::Answered, false, None),
        ];
        for (fail, retry, answer) in cases {
            assert_eq!(fail.retryable(), retry, "{fail:?}");
            assert_eq!(fail.answer().map(|a| (a.status, a.why, a.retry_after)), answer, "{fail:?}");
        }
        assert!(matches!(SendFail::from(UpstreamFail::Stale), SendFail::Closed));
        assert!(matches!(SendFail::from(UpstreamFail::Timeout), SendFail::Timeout));
    }

    /// Runs the `100 Continue` wait against a backend that sends `from_backend` (and
    /// closes when `close`); returns the verdict and what the client received.
    async fn continue_with(from_backend: &[u8], close: bool) -> (Result<Option<u16>, String>, String) {
        let head = request("PUT /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n");
        let (mut backend, io) = tokio::io::duplex(1 << 16);
        backend.write_all(from_backend).await.unwrap();
        let _open = (!close).then_some(backend);
        let (mut w, client) = crate::http::client::tests::over_tcp().await;
        let mut up = Inbound::new(io);
        let r = await_continue(&mut up, &mut w, &head, &HeadLimits::default(), &mut Vec::new(), &quick()).await;
        drop(w);
        (
            r.map(|h| h.map(|h| h.status)).map_err(|f| format!("{f:?}")),
            crate::http::client::tests::read_all(client).await,
        )
    }

    #[tokio::test]
    async fn continue_passes_interim_responses_and_stops_at_a_verdict() {
        let hints = "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n";
        let (r, got) = continue_with(format!("{hints}HTTP/1.1 100 Continue\r\n\r\n").as_bytes(), false).await;
        assert_eq!(r, Ok(None), "send the body");
        assert_eq!(got, format!("{hints}HTTP/1.1 100 Continue\r\n\r\n"));
        let (r, got) = continue_with(b"HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n", false).await;
        assert_eq!((r, got.as_str()), (Ok(Some(417)), ""), "a final answer, the body unsent");
        let (r, got) = continue_with(b"", true).await;
        assert_eq!((r, got.as_str()), (Err("Closed".into()), ""));
        // Silence: after the wait, the body goes anyway.
        let waited = Instant::now();
        assert_eq!(continue_with(b"", false).await.0, Ok(None));
        assert!(waited.elapsed() >= CONTINUE_WAIT);
    }

    #[tokio::test]
    async fn a_response_head_is_read_across_reads_and_a_silent_close_is_stale() {
        let head = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let (mut backend, io) = tokio::io::duplex(64);
        let mut up = Inbound::new(io);
        let feed = tokio::spawn(async move {
            for piece in [&b"HTTP/1.1 200 OK\r\nContent-"[..], b"Length: 2\r\n\r\nok"] {
                backend.write_all(piece).await.unwrap();
                tokio::task::yield_now().await;
            }
        });
        let limits = HeadLimits::default();
        let res = read_response(&mut up, &head, &limits, &mut Vec::new(), Duration::from_secs(2)).await.unwrap();
        assert_eq!((res.status, res.framing), (200, Framing::Length(2)));
        feed.await.unwrap();
        let (backend, io) = tokio::io::duplex(64);
        drop(backend);
        let got = read_response(&mut Inbound::new(io), &head, &limits, &mut Vec::new(), Duration::from_secs(2)).await;
        assert!(matches!(got, Err(UpstreamFail::Stale)), "{got:?}");
    }
}
