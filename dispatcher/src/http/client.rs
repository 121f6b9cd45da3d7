//! The client side of one request as the proxy's phases use it, whichever protocol it
//! came in: an HTTP/1.x connection, or one HTTP/2 stream (`h2::stream`). The request
//! head is already parsed and checked by the one validation both take
//! (`http1::head::check_request`); the proxy reads the request body from `r` (an HTTP/2
//! stream's DATA, framed as HTTP/1.1 frames a body) and answers through `Client`'s
//! methods: its own answers, interim responses, and (in `proxy::deliver_final`) the
//! final response and its body. Enums, no dynamic dispatch: this is the request path.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};

use super::{answer::Answer, h2::stream};
use crate::http1::{
    body::Inbound,
    head::ResponseHead,
    io::{ReadSide, WriteSide},
    write_client,
};

/// One request's client: where its body comes from and where its answer goes.
pub struct Client {
    pub r: Inbound<ClientRead>,
    pub w: Sink,
}

/// Where a request's body comes from.
pub enum ClientRead {
    /// An HTTP/1.x connection (plain or TLS).
    Conn(ReadSide),
    /// An HTTP/2 stream's DATA, framed as HTTP/1.1 (`h2::stream::Body`). Boxed: every
    /// HTTP/1.x connection's task would carry its size otherwise, idle or not.
    H2(Box<stream::Body>),
}

/// Where a request's answer goes.
pub enum Sink {
    Conn(WriteSide),
    H2(stream::Out),
}

impl AsyncRead for ClientRead {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientRead::Conn(r) => Pin::new(r).poll_read(cx, buf),
            ClientRead::H2(b) => Pin::new(&mut **b).poll_read(cx, buf),
        }
    }
}

impl Client {
    /// An HTTP/1.x connection's two halves. Request heads are small: 4 KiB reads (more
    /// for bodies), allocated at the first read, keep many idle keep-alive clients cheap.
    pub fn conn(r: ReadSide, w: WriteSide) -> Client {
        Client { r: Inbound::with_chunk(ClientRead::Conn(r), 4096), w: Sink::Conn(w) }
    }

    /// What has gone to the client so far (the access log's bytes out): an HTTP/1.x
    /// connection's bytes, an HTTP/2 stream's DATA.
    pub fn written(&self) -> u64 {
        match &self.w {
            Sink::Conn(w) => w.written,
            Sink::H2(o) => o.written,
        }
    }

    /// An HTTP/1.x connection's write half, `None` on an HTTP/2 stream.
    pub fn conn_w(&mut self) -> Option<&mut WriteSide> {
        match &mut self.w {
            Sink::Conn(w) => Some(w),
            Sink::H2(_) => None,
        }
    }

    /// An HTTP/2 stream's two sides, `None` on an HTTP/1.x connection.
    pub fn h2(&mut self) -> Option<(&mut stream::Body, &mut stream::Out)> {
        match (&mut self.r.io, &mut self.w) {
            (ClientRead::H2(b), Sink::H2(o)) => Some((&mut **b, o)),
            _ => None,
        }
    }

    /// An answer of the proxy's own (bounded in time); an HTTP/1.x connection closes
    /// after it.
    pub async fn answer(&mut self, a: Answer) {
        match self.h2() {
            Some((body, out)) => stream::answer(body, out, a),
            None => {
                if let Some(w) = self.conn_w() {
                    a.send(w).await
                }
            }
        }
    }

    /// An interim response (`100`, `103`: `buf` holds the head `res` was parsed from)
    /// passed on; `false`: the client could not take it.
    pub async fn interim(&mut self, res: &ResponseHead, buf: &Bytes, timeout: Duration) -> bool {
        match self.h2() {
            Some((body, _)) => stream::interim(body, res, buf),
            None => match self.conn_w() {
                Some(w) => write_client(w, buf, timeout).await,
                None => false,
            },
        }
    }

    /// `100 Continue`, to a request that waits for it before it sends its body.
    pub async fn go_on(&mut self, timeout: Duration) -> bool {
        match self.h2() {
            Some((body, _)) => stream::go_on(body),
            None => match self.conn_w() {
                Some(w) => write_client(w, b"HTTP/1.1 100 Continue\r\n\r\n", timeout).await,
                None => false,
            },
        }
    }

    /// Closes an HTTP/1.x connection's write side (an HTTP/2 stream ends with its
    /// response).
    pub async fn shutdown(&mut self) {
        if let Some(w) = self.conn_w() {
            let _ = w.shutdown().await;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::{io::AsyncReadExt, net::TcpStream};

    /// An HTTP/1.x client side over a loopback TCP connection, and its peer (the client
    /// program).
    pub async fn over_tcp() -> (Client, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (ours, _) = l.accept().await.unwrap();
        let (r, w, _) = crate::http1::io::split_plain(ours);
        (Client::conn(r, w), peer)
    }

    /// Everything the client program reads until the connection closes.
    pub async fn read_all(mut peer: TcpStream) -> String {
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.unwrap();
        String::from_utf8(got).unwrap()
    }
}
