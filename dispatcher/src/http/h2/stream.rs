//! One HTTP/2 stream served straight by the proxy's phases (`proxy::serve_stream`): its
//! request head written once as the HTTP/1.1 head that goes upstream and checked by the
//! validation every request passes (`translate::request`), its body read by the proxy
//! from the stream's DATA (`Body`), and its answer sent on the stream: interim
//! responses and the final head as header maps made from the backend's parsed head,
//! the body as DATA frames (`respond`), never serialized into HTTP/1.1 and parsed again.
//! Flow control holds both ways: the client's window reopens only as the proxy takes the
//! body, and a response goes out as the client's window allows, never buffered whole (a
//! window that stays shut for `client_timeout` resets the stream). A body cut short
//! either way resets the stream: a truncated message never looks complete.

use std::{
    future::poll_fn,
    io,
    pin::Pin,
    sync::Arc,
    task::{ready, Context, Poll},
    time::Duration,
};

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use h2::{server::SendResponse, Reason, RecvStream, SendStream};
use http::{header, HeaderMap, HeaderValue, StatusCode};
use tokio::{io::ReadBuf, sync::watch};

use super::{
    translate::{last_chunk, request, response_fields, trailer_fields},
    At,
};
use crate::http::{
    answer::Answer,
    client::{Client, ClientRead, Sink},
    proxy::{serve_stream, VipCtx},
    respond::Undelivered,
    Counted,
};
use crate::http1::{
    body::{ChunkedDecoder, Inbound, RelayError, Timeouts},
    head::{Framing, ResponseHead},
    io::ReadSide,
};

/// Serves one stream (its task: the connection goes on meanwhile).
pub async fn serve(
    ctx: Arc<VipCtx>,
    at: At,
    stop: watch::Receiver<bool>,
    req: http::Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
) {
    let counters = ctx.servers.counters.clone();
    counters.h2_streams_in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let _in_flight = Counted(&counters.h2_streams_in_flight);
    // Reset before it was taken up: nothing is done for it.
    if poll_fn(|cx| Poll::Ready(respond.poll_reset(cx).is_ready())).await {
        return;
    }
    let (parts, recv) = req.into_parts();
    let (buf, head, framing) = match request(&parts, recv.is_end_stream(), &ctx.limits) {
        Ok(t) => t,
        Err(r) => {
            counters.h2_refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            crate::http::proxy::count_status(&ctx, r.status);
            let refused = crate::refusals::Refused {
                vip: &ctx.name,
                client: at.peer,
                protocol: "h2",
                status: r.status,
                reason: r.reason,
                bytes: &as_text(&parts),
            };
            ctx.capacity.refusals.record(refused);
            refuse(&mut respond, r.status, r.reason, parts.method == http::Method::HEAD);
            return;
        }
    };
    let body = Body {
        recv,
        respond: Some(respond),
        chunked: framing == Framing::Chunked,
        state: Part::Data,
        pending: Bytes::new(),
    };
    // DATA frames are at most 16 KiB (SETTINGS_MAX_FRAME_SIZE's default).
    let r = Inbound::with_chunk(ClientRead::H2(Box::new(body)), 16 * 1024);
    let out = Out { written: 0, is_head: parts.method == http::Method::HEAD };
    let mut client = Client { r, w: Sink::H2(out) };
    serve_stream(ctx, &mut client, (head, buf), at.peer, at.steer_slot, &stop).await;
    if let Some((body, _)) = client.h2() {
        // The proxy ended without an answer (the client is gone, or it gave up).
        if let Some(mut r) = body.respond.take() {
            r.send_reset(Reason::INTERNAL_ERROR);
        }
    }
}

/// The dispatcher's own answer on a stream (a request it will not translate; without
/// its body to a HEAD).
fn refuse(respond: &mut SendResponse<Bytes>, status: u16, reason: &str, head: bool) {
    let body = Bytes::from(format!("{status} {reason}\n"));
    let res = http::Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain")
        .header(header::CONTENT_LENGTH, body.len())
        .body(())
        .expect("a valid status and fields");
    if let Ok(mut s) = respond.send_response(res, head) {
        if !head {
            let _ = s.send_data(body, true);
        }
    }
}

/// Where a request body is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Data,
    Trailers,
    Done,
}

/// A stream's request body as the proxy reads a client's: its DATA as they come, as
/// they are when the request has a `content-length`, else chunked with the client's
/// trailers as the trailer section (the proxy checks and forwards what a client sends,
/// whatever its protocol). The client's window reopens as the proxy takes the bytes.
/// Once the body is whole, a read waits until the client resets the stream, then ends
/// (a held request's client leaving, as an HTTP/1.1 client's close ends its read).
pub struct Body {
    recv: RecvStream,
    /// The stream's sending half until the response begins.
    respond: Option<SendResponse<Bytes>>,
    chunked: bool,
    state: Part,
    /// Bytes taken from the stream and not yet read.
    pending: Bytes,
}

impl tokio::io::AsyncRead for Body {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        loop {
            if !me.pending.is_empty() {
                let n = me.pending.len().min(buf.remaining());
                buf.put_slice(&me.pending[..n]);
                me.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            match me.state {
                Part::Data => match ready!(me.recv.poll_data(cx)) {
                    Some(Ok(data)) => {
                        let _ = me.recv.flow_control().release_capacity(data.len());
                        me.pending = match me.chunked {
                            true if !data.is_empty() => chunk(&data),
                            _ => data,
                        };
                    }
                    Some(Err(e)) => return Poll::Ready(Err(io::Error::other(e))),
                    None if me.chunked => me.state = Part::Trailers,
                    None => me.state = Part::Done,
                },
                Part::Trailers => {
                    let trailers = ready!(me.recv.poll_trailers(cx)).map_err(io::Error::other)?;
                    me.pending = Bytes::from(last_chunk(trailers.as_ref()));
                    me.state = Part::Done;
                }
                Part::Done => {
                    if let Some(r) = me.respond.as_mut() {
                        let _ = ready!(r.poll_reset(cx));
                    }
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}

/// One DATA frame's payload as a chunk.
fn chunk(data: &[u8]) -> Bytes {
    let mut c = BytesMut::with_capacity(data.len() + 20);
    let _ = std::fmt::Write::write_fmt(&mut c, format_args!("{:x}\r\n", data.len()));
    c.put_slice(data);
    c.put_slice(b"\r\n");
    c.freeze()
}

/// A stream's response side once it began: its DATA, and what it has sent.
pub struct Out {
    /// DATA bytes sent (the access log's bytes out).
    pub written: u64,
    /// A `HEAD` request: answers without a body.
    is_head: bool,
}

/// An answer of the proxy's own: status, `Retry-After`, the short text body (the same
/// as an HTTP/1.1 client reads).
pub fn answer(body: &mut Body, out: &mut Out, a: Answer) {
    let Some(mut respond) = body.respond.take() else { return };
    let text = Bytes::from(format!("{} {}: {}\n", a.status, crate::http1::answer::reason(a.status), a.why));
    let mut res = http::Response::new(());
    *res.status_mut() = StatusCode::from_u16(a.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(text.len()));
    if let Some(s) = a.retry_after {
        h.insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    if let Ok(mut s) = respond.send_response(res, out.is_head) {
        if !out.is_head {
            out.written += text.len() as u64;
            let _ = s.send_data(text, true);
        }
    }
}

/// An interim response passed on (its fields as the client gets them).
pub fn interim(body: &mut Body, res: &ResponseHead, buf: &Bytes) -> bool {
    informational(body, res.status, response_fields(res, buf))
}

/// `100 Continue`.
pub fn go_on(body: &mut Body) -> bool {
    informational(body, 100, HeaderMap::new())
}

fn informational(body: &mut Body, status: u16, fields: HeaderMap) -> bool {
    let (Some(r), Ok(status)) = (body.respond.as_mut(), StatusCode::from_u16(status)) else { return false };
    let mut res = http::Response::new(());
    *res.status_mut() = status;
    *res.headers_mut() = fields;
    r.send_informational(res).is_ok()
}

/// The final response: its head (`fields`), then its body: `at_hand` (the whole body,
/// already read), or what `rest` delivers as `framing` delimits it, read within
/// `t.read` and sent as the client's window opens within `t.write`.
pub async fn respond(
    body: &mut Body,
    out: &mut Out,
    (status, fields): (u16, HeaderMap),
    at_hand: Option<Bytes>,
    rest: Option<(&mut Inbound<ReadSide>, Framing)>,
    t: Timeouts,
) -> Result<(), Undelivered> {
    let Some(mut respond) = body.respond.take() else { return Err(Undelivered::Head) };
    let mut head = http::Response::new(());
    *head.status_mut() = StatusCode::from_u16(status).map_err(|_| Undelivered::Head)?;
    *head.headers_mut() = fields;
    let empty = rest.is_none() && at_hand.as_ref().is_none_or(Bytes::is_empty);
    let mut send = respond.send_response(head, empty).map_err(|_| Undelivered::Head)?;
    if empty {
        return Ok(());
    }
    let sent = match (at_hand, rest) {
        (Some(all), _) => self::send(&mut send, out, all, true, t.write).await,
        (None, Some((src, framing))) => relay(src, &mut send, out, framing, t).await,
        (None, None) => Ok(()),
    };
    sent.map_err(|e| {
        // The client's window stayed shut, or it left: CANCEL; the backend's body failed:
        // INTERNAL_ERROR.
        send.send_reset(if matches!(e, RelayError::Write(_)) { Reason::CANCEL } else { Reason::INTERNAL_ERROR });
        Undelivered::Body(e)
    })
}

/// The response body from the backend, as its HTTP/1.1 framing delimits it, in DATA
/// frames (a chunked body's trailer section as trailers).
async fn relay(
    src: &mut Inbound<ReadSide>,
    out: &mut SendStream<Bytes>,
    o: &mut Out,
    framing: Framing,
    t: Timeouts,
) -> Result<(), RelayError> {
    match framing {
        Framing::None => out.send_data(Bytes::new(), true).map_err(gone),
        Framing::Length(mut n) => {
            while n > 0 {
                if src.buf.is_empty() && src.fill(t.read).await? == 0 {
                    return Err(RelayError::Eof);
                }
                let take = (src.buf.len() as u64).min(n) as usize;
                n -= take as u64;
                send(out, o, src.buf.split_to(take).freeze(), n == 0, t.write).await?;
            }
            Ok(())
        }
        Framing::Chunked => {
            let mut dec = ChunkedDecoder::keeping_trailers();
            loop {
                let mut data = Vec::new();
                let used = dec.feed(&src.buf, Some(&mut data), true)?;
                src.buf.advance(used);
                if !data.is_empty() {
                    send(out, o, Bytes::from(data), false, t.write).await?;
                }
                if dec.is_done() {
                    break;
                }
                if src.fill(t.read).await? == 0 {
                    return Err(RelayError::Eof);
                }
            }
            let trailers = trailer_fields(dec.trailers.as_deref().unwrap_or_default());
            match trailers.is_empty() {
                true => out.send_data(Bytes::new(), true),
                false => out.send_trailers(trailers),
            }
            .map_err(gone)
        }
        Framing::UntilClose => loop {
            if !src.buf.is_empty() {
                let all = src.buf.split().freeze();
                send(out, o, all, false, t.write).await?;
            }
            if src.fill(t.read).await? == 0 {
                return out.send_data(Bytes::new(), true).map_err(gone);
            }
        },
    }
}

/// The stream can no longer be sent on (the client reset it, the connection ended).
fn gone(e: h2::Error) -> RelayError {
    RelayError::Write(io::Error::other(e))
}

/// Sends `data` as the client's window opens (`end`: the last of the body), all of it
/// within `window_wait` (as an HTTP/1.1 write must end within it): a client that does not
/// read, or opens its window a byte at a time, ends it with a write timeout.
async fn send(
    out: &mut SendStream<Bytes>,
    o: &mut Out,
    mut data: Bytes,
    end: bool,
    window_wait: Duration,
) -> Result<(), RelayError> {
    if data.is_empty() {
        return if end { out.send_data(data, true).map_err(gone) } else { Ok(()) };
    }
    let deadline = tokio::time::Instant::now() + window_wait;
    while !data.is_empty() {
        out.reserve_capacity(data.len());
        let granted = match tokio::time::timeout_at(deadline, poll_fn(|cx| out.poll_capacity(cx))).await {
            Err(_) => {
                tracing::debug!("HTTP/2 client kept its window shut past client_timeout: stream reset");
                return Err(RelayError::Write(io::ErrorKind::TimedOut.into()));
            }
            Ok(Some(Ok(n))) => n,
            Ok(Some(Err(e))) => return Err(gone(e)),
            Ok(None) => return Err(RelayError::Write(io::ErrorKind::BrokenPipe.into())),
        };
        if granted == 0 {
            continue;
        }
        let piece = data.split_to(granted.min(data.len()));
        o.written += piece.len() as u64;
        out.send_data(piece, end && data.is_empty()).map_err(gone)?;
    }
    Ok(())
}

/// The whole response body when it is already read (or there is none): taken from
/// `buf`, so that the backend connection can go back to its pool before it is sent.
pub fn body_at_hand(buf: &mut BytesMut, framing: Framing) -> Option<Bytes> {
    match framing {
        Framing::None => Some(Bytes::new()),
        Framing::Length(n) if buf.len() as u64 >= n => Some(buf.split_to(n as usize).freeze()),
        _ => None,
    }
}

/// A response head (the first `n` bytes of the backend connection's read buffer) for
/// the stream's header map, copied out rather than shared: the HPACK encoder's table
/// would keep slices of it for as long as the client connection lives (a value it
/// indexed), pinning the whole read buffer (16 KiB) to an idle connection, and while
/// shared the backend connection allocates a new buffer for its next response. A body
/// is shared: the crate lets go of its DATA once written.
pub fn copied(buf: &mut BytesMut, n: usize) -> Bytes {
    let piece = Bytes::copy_from_slice(&buf[..n]);
    buf.advance(n);
    piece
}

/// An HTTP/2 request's head as text, for `GET /errors`: `METHOD URI HTTP/2`, then one
/// `name: value` line per field, CRLF-ended (the first `refusals::CAPTURE` bytes).
fn as_text(parts: &http::request::Parts) -> Vec<u8> {
    let mut o = format!("{} {} HTTP/2\r\n", parts.method, parts.uri).into_bytes();
    for (name, value) in &parts.headers {
        if o.len() >= crate::refusals::CAPTURE {
            break;
        }
        o.extend_from_slice(name.as_str().as_bytes());
        o.extend_from_slice(b": ");
        o.extend_from_slice(value.as_bytes());
        o.extend_from_slice(b"\r\n");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    type Stream = (http::Request<RecvStream>, SendResponse<Bytes>);

    /// An h2 client over an in-process pipe, and the streams its server accepts.
    async fn pair() -> (h2::client::SendRequest<Bytes>, tokio::sync::mpsc::UnboundedReceiver<Stream>) {
        let (c, s) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(h2::server::handshake(s));
        let (client, conn) = h2::client::handshake(c).await.unwrap();
        tokio::spawn(conn);
        let mut conn = server.await.unwrap().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(Ok(s)) = conn.accept().await {
                let _ = tx.send(s);
            }
        });
        (client.ready().await.unwrap(), rx)
    }

    fn body(s: Stream, chunked: bool) -> Body {
        let (req, respond) = s;
        Body { recv: req.into_body(), respond: Some(respond), chunked, state: Part::Data, pending: Bytes::new() }
    }

    /// A body without content-length reaches the proxy chunked, one chunk per DATA
    /// frame, the client's trailers as the trailer section; the client's window reopens
    /// as the proxy reads.
    #[tokio::test]
    async fn a_body_is_read_as_http1_frames_it() {
        let (mut client, mut streams) = pair().await;
        let (_res, mut send) = client.send_request(http::Request::post("http://a/x").body(()).unwrap(), false).unwrap();
        send.send_data(Bytes::from_static(b"he"), false).unwrap();
        send.send_data(Bytes::from_static(b"llo"), false).unwrap();
        let mut trailers = HeaderMap::new();
        trailers.insert("x-sum", HeaderValue::from_static("5"));
        send.send_trailers(trailers).unwrap();
        let mut b = body(streams.recv().await.unwrap(), true);
        let want = "2\r\nhe\r\n3\r\nllo\r\n0\r\nx-sum: 5\r\n\r\n";
        let mut got = vec![0u8; want.len()];
        tokio::time::timeout(Duration::from_secs(5), b.read_exact(&mut got)).await.unwrap().unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), want);
    }

    /// A response whole in the backend connection's read buffer goes out, and the buffer
    /// is not left shared with the client connection, whose HPACK encoder would keep
    /// the values it indexed for as long as the connection lives: the buffer is reused
    /// for the backend's next response rather than reallocated, and an idle client
    /// connection does not pin it.
    #[tokio::test]
    async fn a_response_sent_leaves_the_backend_buffer_unshared() {
        use crate::http1::head::{parse_request, parse_response, HeadLimits};
        let (mut client, mut streams) = pair().await;
        let (res, _) = client.send_request(http::Request::get("http://a/x").body(()).unwrap(), true).unwrap();
        let mut b = body(streams.recv().await.unwrap(), false);
        let limits = HeadLimits::default();
        let req = parse_request(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n", &limits, &mut Vec::new()).unwrap().unwrap();
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let base = buf.as_ptr() as usize;
        buf.extend_from_slice(b"HTTP/1.1 200 OK\r\nServer: app\r\nX-Id: 7\r\nContent-Length: 5\r\n\r\nhello");
        let head = parse_response(&buf, &req, &limits, &mut Vec::new()).unwrap().unwrap();
        let head_buf = copied(&mut buf, head.len);
        let fields = response_fields(&head, &head_buf);
        let at_hand = body_at_hand(&mut buf, head.framing);
        let mut out = Out { written: 0, is_head: false };
        let t = Timeouts { read: Duration::from_secs(5), write: Duration::from_secs(5) };
        respond(&mut b, &mut out, (200, fields), at_hand, None, t).await.unwrap();
        drop(head_buf);
        let res = tokio::time::timeout(Duration::from_secs(5), res).await.unwrap().unwrap();
        assert_eq!(res.headers().get("x-id").unwrap(), "7");
        let mut got = res.into_body();
        let data = tokio::time::timeout(Duration::from_secs(5), got.data()).await.unwrap().unwrap().unwrap();
        assert_eq!((&data[..], out.written), (&b"hello"[..], 5));
        buf.reserve(16 * 1024 - 64);
        let at = buf.as_ptr() as usize;
        assert!((base..base + 16 * 1024).contains(&at), "the read buffer was reallocated: still shared");
    }

    /// Once the body is whole, a read waits (a held request waits with it) until the
    /// client resets the stream, which ends it as a closed connection would.
    #[tokio::test]
    async fn a_whole_body_waits_for_the_client_to_leave() {
        let (mut client, mut streams) = pair().await;
        let (_res, mut send) = client.send_request(http::Request::get("http://a/x").body(()).unwrap(), false).unwrap();
        send.send_data(Bytes::from_static(b"ok"), true).unwrap();
        let mut b = body(streams.recv().await.unwrap(), false);
        let mut got = [0u8; 2];
        b.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"ok");
        let mut more = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(100), b.read(&mut more)).await;
        assert!(early.is_err(), "nothing more, and no end while the client stays: {early:?}");
        send.send_reset(Reason::CANCEL);
        let n = tokio::time::timeout(Duration::from_secs(5), b.read(&mut more)).await.unwrap().unwrap();
        assert_eq!(n, 0, "the reset ends the read");
    }
}
