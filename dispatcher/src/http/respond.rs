//! The response phase of one request: interim (1xx) responses passed on, an upgrade
//! (`101` and the tunnel after it), whether the client connection stays open, and the
//! final response delivered (head, then the body relayed from the backend).

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::{
    attempt::read_response,
    client::{Client, ClientRead},
    pool::Upstream,
    tunnel::{tunnel, TunnelTimeouts},
};
use crate::config::HttpSettings;
use crate::http1::{
    body::{relay_body, Inbound, RelayError, Timeouts},
    head::{Framing, HeadLimits, Header, RequestHead, ResponseHead},
    io::WriteSide,
    rewrite::build_response,
    write_client,
};

/// Interim responses a request passes on to its client at most; later ones are read
/// and dropped (an HTTP/2 stream queues each in the codec whether or not the client
/// reads: a backend sending `102` after `102` must not grow it).
pub const MAX_INTERIM: usize = 8;

/// Interim responses (other than 101) go to the client as they are, `MAX_INTERIM` at
/// most; the final one (or a 101) is returned. `None`: the client could not be written
/// to, or no further head came from the backend.
pub async fn forward_interim<R: AsyncRead + Unpin>(
    up: &mut Inbound<R>,
    client: &mut Client,
    mut res: ResponseHead,
    head: &RequestHead,
    limits: &HeadLimits,
    scratch: &mut Vec<Header>,
    s: &HttpSettings,
) -> Option<ResponseHead> {
    let mut passed = 0;
    while (100..200).contains(&res.status) && res.status != 101 {
        // Copied, not shared: an HTTP/2 stream's fields would keep the backend's read
        // buffer alive for as long as the codec holds them.
        let interim = crate::http::h2::copied(&mut up.buf, res.len);
        if passed < MAX_INTERIM {
            passed += 1;
            if !client.interim(&res, &interim, s.client_timeout).await {
                return None;
            }
        }
        res = read_response(up, head, limits, scratch, s.server_timeout).await.ok()?;
    }
    Some(res)
}

/// `101 Switching Protocols` to a request that asked for it: its head goes to the
/// client, then the connection is a tunnel until either side is done.
pub async fn upgrade(
    client: &mut Inbound<ClientRead>,
    w: &mut WriteSide,
    out: &mut Vec<u8>,
    up: Upstream,
    (res, res_buf): (&ResponseHead, &[u8]),
    s: &HttpSettings,
) {
    build_response(out, res, res_buf, false, false, false);
    if !write_client(w, out, s.client_timeout).await {
        return;
    }
    let t = TunnelTimeouts { idle: s.tunnel_timeout, client_write: s.client_timeout, server_write: s.server_timeout };
    // The client's bytes through the tunnel count as the request's.
    client.total_read += tunnel(client, w, up, t).await;
}

/// Whether the client connection closes after this response, and whether its body is
/// de-chunked (an HTTP/1.0 client cannot read chunked: it gets the bare body,
/// delimited by the close).
/// `body_skipped`: a server that answered before `100 Continue` leaves the request body
/// unread: the connection cannot carry another request.
/// `closing`: this listener is stopping (shutdown or reload): the client is told to
/// reconnect, which reaches the new listeners.
/// `keeps`: after a membership change, a connection another dispatcher owns now (or
/// any, once this one leaves) moves there between two requests.
pub fn closes(head: &RequestHead, res: &ResponseHead, body_skipped: bool, closing: bool, keeps: bool) -> (bool, bool) {
    let dechunk = head.minor == 0 && res.framing == Framing::Chunked;
    let close = !head.keep_alive || res.framing == Framing::UntilClose || dechunk || body_skipped || closing || !keeps;
    (close, dechunk)
}

/// A small body already read goes out with the head (one write per response): moved
/// from `buf` to `out`. Returns the framing of what is left to relay.
pub fn inline_small_body(out: &mut Vec<u8>, buf: &mut BytesMut, framing: Framing) -> Framing {
    if let Framing::Length(n) = framing {
        if buf.len() as u64 >= n && n <= 64 * 1024 {
            out.extend_from_slice(&buf.split_to(n as usize));
            return Framing::None;
        }
    }
    framing
}

/// Why a response did not reach the client whole.
#[derive(Debug)]
pub enum Undelivered {
    /// The client did not take the head in time.
    Head,
    /// The body relay failed after the head went out: the client must see the
    /// connection abort, never a response that looks complete.
    Body(RelayError),
}

/// Delivers the response: the head in `out`, then the rest of the body from `body` (the
/// backend, `None` when there is nothing more to relay), de-chunked when asked.
pub async fn deliver<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    w: &mut W,
    out: &[u8],
    body: Option<&mut Inbound<R>>,
    (framing, dechunk): (Framing, bool),
    s: &HttpSettings,
) -> Result<(), Undelivered> {
    if !write_client(w, out, s.client_timeout).await {
        return Err(Undelivered::Head);
    }
    if let Some(src) = body {
        let t = Timeouts { read: s.server_timeout, write: s.client_timeout };
        relay_body(framing, src, w, t, dechunk).await.map_err(Undelivered::Body)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::attempt::tests::{drain, request};
    use crate::http::client::tests::{over_tcp, read_all};
    use crate::http1::head::parse_response;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// The next response head from a backend.
    async fn next_head(up: &mut Inbound<tokio::io::DuplexStream>, req: &RequestHead) -> ResponseHead {
        let limits = HeadLimits::default();
        read_response(up, req, &limits, &mut Vec::new(), Duration::from_secs(1)).await.unwrap()
    }

    fn response(req: &RequestHead, text: &str) -> ResponseHead {
        parse_response(text.as_bytes(), req, &HeadLimits::default(), &mut Vec::new()).unwrap().expect("a whole head")
    }

    #[tokio::test]
    async fn interim_responses_go_to_the_client_and_the_final_one_is_returned() {
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let interim = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n";
        let (mut backend, io) = tokio::io::duplex(1 << 16);
        backend.write_all(format!("{interim}HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").as_bytes()).await.unwrap();
        let mut up = Inbound::new(io);
        let (mut w, client) = over_tcp().await;
        let s = HttpSettings::default();
        let first = next_head(&mut up, &req).await;
        assert_eq!(first.status, 100);
        let last = forward_interim(&mut up, &mut w, first, &req, &HeadLimits::default(), &mut Vec::new(), &s).await;
        assert_eq!(last.map(|r| r.status), Some(200));
        assert!(up.buf.starts_with(b"HTTP/1.1 200 OK\r\n"), "the final head stays for the caller");
        drop(w);
        assert_eq!(read_all(client).await, interim);
        // A 101 is not interim: it is returned as it is, nothing written.
        let (mut backend, io) = tokio::io::duplex(1024);
        backend.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n").await.unwrap();
        let mut up = Inbound::new(io);
        let res = next_head(&mut up, &req).await;
        let (mut w, client) = over_tcp().await;
        let limits = HeadLimits::default();
        let got = forward_interim(&mut up, &mut w, res, &req, &limits, &mut Vec::new(), &s).await;
        assert_eq!(got.map(|r| r.status), Some(101));
        drop(w);
        assert_eq!(read_all(client).await, "");
    }

    #[tokio::test]
    async fn interim_then_silence_ends_the_exchange() {
        let req = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let (mut backend, io) = tokio::io::duplex(1024);
        backend.write_all(b"HTTP/1.1 103 Early Hints\r\n\r\n").await.unwrap();
        drop(backend);
        let mut up = Inbound::new(io);
        let first = next_head(&mut up, &req).await;
        let (mut w, _client) = over_tcp().await;
        let s = HttpSettings::default();
        let got = forward_interim(&mut up, &mut w, first, &req, &HeadLimits::default(), &mut Vec::new(), &s).await;
        assert!(got.is_none());
    }

    #[test]
    fn when_the_client_connection_closes() {
        let keep = request("GET / HTTP/1.1\r\nHost: h\r\n\r\n");
        let old = request("GET / HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n");
        let length = response(&keep, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n");
        let chunked = response(&keep, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        let until_close = response(&keep, "HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(closes(&keep, &length, false, false, true), (false, false));
        assert_eq!(closes(&keep, &chunked, false, false, true), (false, false));
        assert_eq!(closes(&old, &length, false, false, true), (false, false));
        assert_eq!(closes(&old, &chunked, false, false, true), (true, true), "HTTP/1.0 gets the bare body");
        assert_eq!(closes(&keep, &until_close, false, false, true), (true, false));
        assert_eq!(closes(&keep, &length, true, false, true), (true, false), "body left unread");
        assert_eq!(closes(&keep, &length, false, true, true), (true, false), "listener stopping");
        assert_eq!(closes(&keep, &length, false, false, false), (true, false), "another dispatcher's");
        let close = request("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n");
        assert_eq!(closes(&close, &length, false, false, true), (true, false));
    }

    #[test]
    fn a_small_body_at_hand_goes_with_the_head() {
        let mut out = b"HEAD".to_vec();
        let mut buf = BytesMut::from(&b"okNEXT"[..]);
        assert_eq!(inline_small_body(&mut out, &mut buf, Framing::Length(2)), Framing::None);
        assert_eq!((&out[..], &buf[..]), (&b"HEADok"[..], &b"NEXT"[..]));
        // Not all of it here yet, or chunked: relayed.
        assert_eq!(inline_small_body(&mut out, &mut buf, Framing::Length(10)), Framing::Length(10));
        assert_eq!(inline_small_body(&mut out, &mut buf, Framing::Chunked), Framing::Chunked);
        let mut big = BytesMut::from(&vec![b'x'; 70 * 1024][..]);
        assert_eq!(inline_small_body(&mut out, &mut big, Framing::Length(70 * 1024)), Framing::Length(70 * 1024));
        assert_eq!(out, b"HEADok");
    }

    #[tokio::test]
    async fn deliver_relays_the_body_after_the_head() {
        let s = HttpSettings { server_timeout: Duration::from_millis(200), ..HttpSettings::default() };
        let (mut backend, io) = tokio::io::duplex(1024);
        backend.write_all(b"3\r\nabc\r\n0\r\n\r\nleftover").await.unwrap();
        let mut up = Inbound::new(io);
        let (mut w, client) = tokio::io::duplex(1024);
        let sent = deliver(&mut w, b"HTTP/1.0 200 OK\r\n\r\n", Some(&mut up), (Framing::Chunked, true), &s).await;
        assert!(sent.is_ok(), "{sent:?}");
        drop(w);
        assert_eq!(drain(client).await, "HTTP/1.0 200 OK\r\n\r\nabc", "de-chunked for HTTP/1.0");
        // A backend that stops inside the body: the head went out, the relay fails.
        backend.shutdown().await.unwrap();
        let (mut backend, io) = tokio::io::duplex(1024);
        backend.write_all(b"ab").await.unwrap();
        drop(backend);
        let (mut w, client) = tokio::io::duplex(1024);
        let got = deliver(&mut w, b"H\r\n\r\n", Some(&mut Inbound::new(io)), (Framing::Length(5), false), &s).await;
        assert!(matches!(got, Err(Undelivered::Body(RelayError::Eof))), "{got:?}");
        drop(w);
        assert_eq!(drain(client).await, "H\r\n\r\nab");
        // Nothing more to relay: the head alone.
        let (mut w, client) = tokio::io::duplex(1024);
        let none: Option<&mut Inbound<tokio::io::DuplexStream>> = None;
        assert!(deliver(&mut w, b"H\r\n\r\nok", none, (Framing::None, false), &s).await.is_ok());
        drop(w);
        assert_eq!(drain(client).await, "H\r\n\r\nok");
    }
}
