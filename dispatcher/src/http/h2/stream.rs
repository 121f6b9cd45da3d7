//! One HTTP/2 stream: its request translated into HTTP/1.1 and written into an
//! in-process pipe whose other end the HTTP/1.1 proxy serves as a client connection
//! (`proxy::serve_http1`), the proxy's answer read back from it and sent on the stream.
//! The stream's end drops its end of the pipe: the proxy reads the end of its client and
//! its writes fail, so it stops whatever it was doing. Flow control holds both ways:
//! the client's window reopens only as the proxy takes the body (the pipe is bounded),
//! and a response goes out as the client's window allows, never buffered whole. A body
//! cut short either way resets the stream: a truncated message never looks complete.

use std::{future::poll_fn, sync::Arc, task::Poll, time::Duration};

use bytes::{Buf as _, Bytes};
use h2::{server::SendResponse, Reason, RecvStream, SendStream};
use tokio::{
    io::{AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf},
    sync::watch,
};

use super::{
    translate::{last_chunk, request_head, response_fields, trailer_fields},
    At,
};
use crate::http::{
    proxy::{serve_http1, VipCtx},
    Counted, Protocol,
};
use crate::http1::{
    body::{ChunkedDecoder, Inbound, RelayError},
    head::{parse_response, Framing, HeadLimits, RequestHead, MAX_HEADERS},
    io::pipe_sides,
};

/// The pipe's buffer each way: what the proxy may write ahead of the client's window,
/// and the client ahead of the proxy.
const PIPE: usize = 64 * 1024;

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
    let (parts, body) = req.into_parts();
    // The proxy parses the head as it parses any (and answers what it refuses); the
    // answer's framing depends on whether it was HEAD.
    let (head, framing) = match request_head(&parts, body.is_end_stream()) {
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
            refuse(&mut respond, r.status, r.reason);
            return;
        }
    };
    let parsed = RequestHead::answered(parts.method == http::Method::HEAD);
    let (ours, theirs) = tokio::io::duplex(PIPE);
    let proxy = serve_http1(ctx.clone(), pipe_sides(theirs), at.peer, at.steer_slot, stop, Protocol::H2);
    let exchange = async {
        let (res_r, mut req_w) = tokio::io::split(ours);
        let upload = async {
            // A request the client gave up on: the proxy reads the end of its client.
            if !upload(head, framing, body, &mut req_w).await {
                let _ = req_w.shutdown().await;
            }
        };
        let download = download(&ctx, res_r, &mut respond, &parsed);
        tokio::pin!(upload, download);
        // The pipe stays open until the response is through (its end would tell the
        // proxy that the client left); a client still sending then is cut off.
        let mut uploading = true;
        loop {
            tokio::select! {
                () = &mut upload, if uploading => uploading = false,
                () = &mut download => break,
            }
        }
    };
    // The exchange's end drops our end of the pipe: the proxy stops.
    tokio::join!(proxy, exchange);
}

/// The dispatcher's own answer on a stream (a request it will not translate).
fn refuse(respond: &mut SendResponse<Bytes>, status: u16, reason: &str) {
    let body = Bytes::from(format!("{status} {reason}\n"));
    let res = http::Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "text/plain")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(())
        .expect("a valid status and fields");
    if let Ok(mut s) = respond.send_response(res, false) {
        let _ = s.send_data(body, true);
    }
}

/// The request into the proxy's pipe: its head, then its body as DATA frames come
/// (chunked, with the client's trailers, when it has no `content-length`). `true`: the
/// whole request written; `false`: the client reset the stream or the proxy stopped
/// reading.
async fn upload(head: Vec<u8>, framing: Framing, body: RecvStream, w: &mut WriteHalf<DuplexStream>) -> bool {
    upload_all(head, framing, body, w).await.is_some()
}

async fn upload_all(
    head: Vec<u8>,
    framing: Framing,
    mut body: RecvStream,
    w: &mut WriteHalf<DuplexStream>,
) -> Option<()> {
    w.write_all(&head).await.ok()?;
    if framing == Framing::None {
        return Some(());
    }
    let chunked = framing == Framing::Chunked;
    while let Some(data) = body.data().await {
        let data = data.ok()?;
        let n = data.len();
        if n == 0 {
            continue;
        }
        if chunked {
            w.write_all(format!("{n:x}\r\n").as_bytes()).await.ok()?;
        }
        w.write_all(&data).await.ok()?;
        if chunked {
            w.write_all(b"\r\n").await.ok()?;
        }
        // The client may send as much again once the proxy has it.
        let _ = body.flow_control().release_capacity(n);
    }
    if chunked {
        let trailers = body.trailers().await.ok()?;
        w.write_all(&last_chunk(trailers.as_ref())).await.ok()?;
    }
    Some(())
}

/// The proxy's answer onto the stream: interim responses, the final head, its body.
async fn download(ctx: &VipCtx, res_r: ReadHalf<DuplexStream>, respond: &mut SendResponse<Bytes>, req: &RequestHead) {
    // Reads from the pipe need no deadline: the proxy bounds its own waits (server,
    // queue and hold timeouts) and ends its side when it gives up.
    let mut src = Inbound::with_chunk(res_r, 8 * 1024);
    // The proxy's head may be a little larger than the backend's (fields it adds).
    let limits = HeadLimits { max_bytes: ctx.limits.max_bytes * 2 + 4096, max_headers: MAX_HEADERS };
    let mut scratch = Vec::new();
    let (res, buf) = loop {
        match parse_response(&src.buf, req, &limits, &mut scratch) {
            Ok(Some(res)) => {
                let buf = src.buf.split_to(res.len);
                if (100..200).contains(&res.status) {
                    let mut interim = http::Response::new(());
                    *interim.status_mut() = http::StatusCode::from_u16(res.status).expect("1xx");
                    *interim.headers_mut() = response_fields(&res, &buf);
                    if respond.send_informational(interim).is_err() {
                        return;
                    }
                    continue;
                }
                break (res, buf);
            }
            Ok(None) => {}
            Err(_) => return respond.send_reset(Reason::INTERNAL_ERROR),
        }
        tokio::select! {
            filled = src.fill_unbounded() => match filled {
                Ok(n) if n > 0 => {}
                // The proxy ended without an answer (the client is gone, or it gave up).
                _ => return respond.send_reset(Reason::INTERNAL_ERROR),
            },
            // The client reset the stream: the pipes close, the proxy stops.
            _ = poll_fn(|cx| respond.poll_reset(cx)) => return,
        }
    };
    let mut head = http::Response::new(());
    *head.status_mut() = match http::StatusCode::from_u16(res.status) {
        Ok(s) => s,
        Err(_) => return respond.send_reset(Reason::INTERNAL_ERROR),
    };
    *head.headers_mut() = response_fields(&res, &buf);
    let no_body = res.framing == Framing::None;
    let Ok(mut out) = respond.send_response(head, no_body) else { return };
    if no_body {
        return;
    }
    if let Err(reason) = body(&mut src, &mut out, res.framing, ctx.settings.client_timeout).await {
        out.send_reset(reason);
    }
}

/// The response body, as its HTTP/1.1 framing delimits it, in DATA frames (and trailers).
async fn body(
    src: &mut Inbound<ReadHalf<DuplexStream>>,
    out: &mut SendStream<Bytes>,
    framing: Framing,
    window_wait: Duration,
) -> Result<(), Reason> {
    // A body the proxy could not deliver whole (its chunks bad, its pipe cut).
    let cut = |_: RelayError| Reason::INTERNAL_ERROR;
    match framing {
        Framing::Length(mut n) => {
            while n > 0 {
                if src.buf.is_empty() && src.fill_unbounded().await.map_err(cut)? == 0 {
                    return Err(Reason::INTERNAL_ERROR);
                }
                let take = (src.buf.len() as u64).min(n) as usize;
                n -= take as u64;
                send(out, src.buf.split_to(take).freeze(), n == 0, window_wait).await?;
            }
            Ok(())
        }
        Framing::Chunked => {
            let mut dec = ChunkedDecoder::keeping_trailers();
            loop {
                let mut data = Vec::new();
                let used = dec.feed(&src.buf, Some(&mut data), true).map_err(cut)?;
                src.buf.advance(used);
                if !data.is_empty() {
                    send(out, Bytes::from(data), false, window_wait).await?;
                }
                if dec.is_done() {
                    break;
                }
                if src.fill_unbounded().await.map_err(cut)? == 0 {
                    return Err(Reason::INTERNAL_ERROR);
                }
            }
            let trailers = trailer_fields(dec.trailers.as_deref().unwrap_or_default());
            match trailers.is_empty() {
                true => out.send_data(Bytes::new(), true),
                false => out.send_trailers(trailers),
            }
            .map_err(|_| Reason::CANCEL)
        }
        _ => loop {
            if !src.buf.is_empty() {
                let all = src.buf.split().freeze();
                send(out, all, false, window_wait).await?;
            }
            if src.fill_unbounded().await.map_err(cut)? == 0 {
                return out.send_data(Bytes::new(), true).map_err(|_| Reason::CANCEL);
            }
        },
    }
}

/// Sends `data` as the client's window opens (`end`: the last of the body). A window
/// that stays shut for `window_wait` (a client that does not read) resets the stream.
async fn send(out: &mut SendStream<Bytes>, mut data: Bytes, end: bool, window_wait: Duration) -> Result<(), Reason> {
    if data.is_empty() {
        return if end { out.send_data(data, true).map_err(|_| Reason::CANCEL) } else { Ok(()) };
    }
    while !data.is_empty() {
        out.reserve_capacity(data.len());
        let granted = match tokio::time::timeout(window_wait, poll_fn(|cx| out.poll_capacity(cx))).await {
            Err(_) => {
                tracing::debug!("HTTP/2 client kept its window shut past client_timeout: stream reset");
                return Err(Reason::CANCEL);
            }
            Ok(Some(Ok(n))) => n,
            Ok(_) => return Err(Reason::CANCEL),
        };
        if granted == 0 {
            continue;
        }
        let piece = data.split_to(granted.min(data.len()));
        out.send_data(piece, end && data.is_empty()).map_err(|_| Reason::CANCEL)?;
    }
    Ok(())
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
