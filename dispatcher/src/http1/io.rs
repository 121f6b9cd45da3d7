//! The two halves of a connection, plain TCP or TLS, as the proxy reads and writes them:
//! one enum per direction (no boxing, no dynamic dispatch on the request path). A TLS
//! connection is split with `tokio::io::split`; a plain one with the socket's own halves.
//! Also the socket-level rules every connection shares: reset on close, and which errors
//! are this host's shortage rather than the peer's failure.

use std::{
    io,
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    task::{Context, Poll},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpStream,
    },
};

/// A TLS connection, client or server side.
pub type TlsConn = tokio_rustls::TlsStream<TcpStream>;

pub enum ReadSide {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsConn>),
}

/// The write half, and how many bytes it has taken (the access log's bytes out).
pub struct WriteSide {
    half: WriteHalf,
    pub written: u64,
}

enum WriteHalf {
    Plain(OwnedWriteHalf),
    Tls(tokio::io::WriteHalf<TlsConn>),
}

/// A connection's halves and its socket's descriptor (for socket options and peeks that
/// the TLS layer does not expose; valid while either half lives).
pub fn split_plain(s: TcpStream) -> (ReadSide, WriteSide, RawFd) {
    let fd = s.as_raw_fd();
    let (r, w) = s.into_split();
    (ReadSide::Plain(r), WriteSide { half: WriteHalf::Plain(w), written: 0 }, fd)
}

pub fn split_tls(s: TlsConn) -> (ReadSide, WriteSide, RawFd) {
    let fd = s.get_ref().0.as_raw_fd();
    let (r, w) = tokio::io::split(s);
    (ReadSide::Tls(r), WriteSide { half: WriteHalf::Tls(w), written: 0 }, fd)
}

impl ReadSide {
    /// Nothing readable now: over TLS, no decrypted bytes are left inside the TLS layer
    /// (which the socket-level check of an idle connection cannot see) and no record
    /// waits on the socket. Asked by polling a read once without waiting; a connection
    /// that had something to say is not reused (what was read is lost with it). Plain
    /// connections are always drained here (their socket is peeked elsewhere).
    pub fn drained(&mut self) -> bool {
        let ReadSide::Tls(r) = self else { return true };
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut byte = [0u8; 1];
        let mut buf = ReadBuf::new(&mut byte);
        matches!(Pin::new(r).poll_read(&mut cx, &mut buf), Poll::Pending)
    }
}

impl AsyncRead for ReadSide {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ReadSide::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadSide::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for WriteSide {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = match &mut me.half {
            WriteHalf::Plain(w) => Pin::new(w).poll_write(cx, buf),
            WriteHalf::Tls(w) => Pin::new(w).poll_write(cx, buf),
        };
        if let Poll::Ready(Ok(n)) = r {
            me.written += n as u64;
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = match &mut me.half {
            WriteHalf::Plain(w) => Pin::new(w).poll_write_vectored(cx, bufs),
            WriteHalf::Tls(w) => Pin::new(w).poll_write_vectored(cx, bufs),
        };
        if let Poll::Ready(Ok(n)) = r {
            me.written += n as u64;
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        match &self.half {
            WriteHalf::Plain(w) => w.is_write_vectored(),
            WriteHalf::Tls(w) => w.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().half {
            WriteHalf::Plain(w) => Pin::new(w).poll_flush(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    /// On TLS: a close_notify alert, then the socket's write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.get_mut().half {
            WriteHalf::Plain(w) => Pin::new(w).poll_shutdown(cx),
            WriteHalf::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}

/// Resets the connection when it is closed (SO_LINGER 0): the peer sees an abort, never
/// a message that looks complete. Zero linger never blocks the closing thread.
pub fn reset_on_close(fd: RawFd) {
    let off = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid descriptor (the caller holds the connection) and a correctly sized
    // option value.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &off as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Errors that say this host ran out of something, whoever the peer is.
pub fn is_local_errno(e: i32) -> bool {
    [libc_errno::EMFILE, libc_errno::ENFILE, libc_errno::ENOBUFS, libc_errno::ENOMEM, libc_errno::EADDRNOTAVAIL]
        .contains(&e)
}

mod libc_errno {
    use nix::errno::Errno;
    pub const EMFILE: i32 = Errno::EMFILE as i32;
    pub const ENFILE: i32 = Errno::ENFILE as i32;
    pub const ENOBUFS: i32 = Errno::ENOBUFS as i32;
    pub const ENOMEM: i32 = Errno::ENOMEM as i32;
    pub const EADDRNOTAVAIL: i32 = Errno::EADDRNOTAVAIL as i32;
}
