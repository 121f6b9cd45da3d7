//! One plain TCP connection's sending side, shared by every task that sends on it: a
//! message is written by the task that has it, at once, when the socket takes it (the
//! common case: no hand-over to another task, no wake-up, one system call); what the
//! socket does not take waits in a bounded backlog that the connection's own task
//! flushes when the socket is writable again. Writes go under one lock, so messages from
//! several tasks never interleave and keep their order.
//!
//! Bounded: the backlog holds at most `cap` bytes (a message is taken whatever its size
//! when the backlog is empty); past that a send is refused (`Refused::Full`) and the
//! sender decides (drop and count it, or wait for room a while).

use std::{io, os::fd::AsRawFd, sync::Mutex, time::Duration};

use tokio::{net::tcp::OwnedWriteHalf, sync::Notify};

/// Why a message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The backlog is full (the peer reads too slowly).
    Full,
    /// The connection is closed or broken.
    Closed,
}

#[derive(Default)]
struct Backlog {
    bytes: Vec<u8>,
    /// Bytes of `bytes` already written.
    done: usize,
    /// No more messages: the flusher ends once the backlog is written.
    closing: bool,
    closed: bool,
}

pub struct Wire {
    /// The socket's sending half (the connection's task owns the reading half).
    sock: OwnedWriteHalf,
    out: Mutex<Backlog>,
    /// Bytes wait in the backlog, or the wire is closing: the flusher has work.
    more: Notify,
    /// The backlog was written out: senders waiting for room try again.
    room: Notify,
    cap: usize,
}

impl Wire {
    pub fn new(sock: OwnedWriteHalf, cap: usize) -> Wire {
        Wire { sock, out: Mutex::new(Backlog::default()), more: Notify::new(), room: Notify::new(), cap }
    }

    /// Writes `bytes` now, or queues what the socket does not take.
    pub fn try_send(&self, bytes: &[u8]) -> Result<(), Refused> {
        let mut q = self.out.lock().unwrap();
        if q.closed || q.closing {
            return Err(Refused::Closed);
        }
        if q.bytes.is_empty() {
            let n = match self.sock.try_write(bytes) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                Err(_) => {
                    q.closed = true;
                    drop(q);
                    self.more.notify_one();
                    return Err(Refused::Closed);
                }
            };
            if n == bytes.len() {
                return Ok(());
            }
            q.bytes.extend_from_slice(&bytes[n..]);
        } else if q.bytes.len() - q.done + bytes.len() <= self.cap {
            q.bytes.extend_from_slice(bytes);
        } else {
            return Err(Refused::Full);
        }
        drop(q);
        self.more.notify_one();
        Ok(())
    }

    /// As `try_send`, waiting at most `wait` for room in a full backlog (then
    /// `WouldBlock`); a closed connection is an error.
    pub async fn send(&self, bytes: &[u8], wait: Duration) -> io::Result<()> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            match self.try_send(bytes) {
                Ok(()) => return Ok(()),
                Err(Refused::Closed) => return Err(io::Error::other("connection closed")),
                Err(Refused::Full) => {
                    if tokio::time::timeout_at(deadline, room).await.is_err() {
                        return Err(io::ErrorKind::WouldBlock.into());
                    }
                }
            }
        }
    }

    /// No more messages; what is queued is still written, then the connection's sending
    /// side is shut down (`flush`).
    pub fn close_after_flush(&self) {
        self.out.lock().unwrap().closing = true;
        self.more.notify_one();
    }

    /// The connection task's part: writes out the backlog whenever there is one, until
    /// the connection breaks, or it was closed and everything queued is written (then
    /// the sending side is shut down).
    pub async fn flush(&self) {
        loop {
            let more = self.more.notified();
            tokio::pin!(more);
            more.as_mut().enable();
            loop {
                let blocked = {
                    let mut q = self.out.lock().unwrap();
                    if q.closed {
                        return;
                    }
                    if q.bytes.is_empty() {
                        if q.closing {
                            q.closed = true;
                            let fd = self.sock.as_ref().as_raw_fd();
                            let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Write);
                            return;
                        }
                        break;
                    }
                    let at = q.done;
                    match self.sock.try_write(&q.bytes[at..]) {
                        Ok(n) => {
                            q.done += n;
                            if q.done == q.bytes.len() {
                                q.bytes = Vec::new();
                                q.done = 0;
                                self.room.notify_waiters();
                            } else if q.done >= q.bytes.len() / 2 {
                                // Written bytes go once they are half of the backlog: a
                                // peer that reads a little slower than it is sent to
                                // never empties it, and the backlog stays within twice
                                // what waits (`cap`) instead of growing with all ever sent.
                                let done = q.done;
                                q.bytes.drain(..done);
                                q.done = 0;
                            }
                            false
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => true,
                        Err(_) => {
                            q.closed = true;
                            self.room.notify_waiters();
                            return;
                        }
                    }
                };
                if blocked && self.sock.writable().await.is_err() {
                    self.out.lock().unwrap().closed = true;
                    return;
                }
            }
            more.await;
        }
    }

    /// Broken or done: every later send is refused.
    pub fn set_closed(&self) {
        self.out.lock().unwrap().closed = true;
        self.room.notify_waiters();
        self.more.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    /// A wire on `wr` with its flusher running, as a connection's task runs it.
    fn flushed(wr: OwnedWriteHalf, cap: usize) -> (std::sync::Arc<Wire>, tokio::task::JoinHandle<()>) {
        let wire = std::sync::Arc::new(Wire::new(wr, cap));
        let flusher = tokio::spawn({
            let wire = wire.clone();
            async move { wire.flush().await }
        });
        (wire, flusher)
    }

    /// A peer that reads nothing: messages are taken until the socket and then the
    /// backlog (`cap`) are full, then refused (`Full`), never more memory. When the peer
    /// reads, it gets every taken message whole and in order, then, after
    /// `close_after_flush`, the end of the stream.
    #[tokio::test]
    async fn a_peer_that_does_not_read_fills_a_bounded_backlog_then_gets_everything_in_order() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ours, theirs) = tokio::join!(tokio::net::TcpStream::connect(addr), listener.accept());
        let (_rd, wr) = ours.unwrap().into_split();
        let mut peer = theirs.unwrap().0;
        let cap = 64 << 10;
        let (wire, flusher) = flushed(wr, cap);
        // Messages of 1,000 bytes, each filled with its number.
        let msg = |i: usize| vec![b'a' + (i % 26) as u8; 1000];
        let mut taken = 0;
        let refused = loop {
            match wire.try_send(&msg(taken)) {
                Ok(()) => taken += 1,
                Err(r) => break r,
            }
            assert!(taken < 100_000, "never refused: the backlog is unbounded");
        };
        assert_eq!(refused, Refused::Full);
        let queued = {
            let q = wire.out.lock().unwrap();
            q.bytes.len() - q.done
        };
        assert!(queued <= cap && queued + 1000 > cap, "the backlog stops at its bound: {queued} bytes");
        // Waiting for room a while gives up as `WouldBlock`, not an error of the peer.
        let waited = wire.send(&msg(taken), Duration::from_millis(50)).await;
        assert_eq!(waited.map_err(|e| e.kind()), Err(io::ErrorKind::WouldBlock));
        wire.close_after_flush();
        assert_eq!(wire.try_send(b"late"), Err(Refused::Closed));
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), peer.read_to_end(&mut got)).await.unwrap().unwrap();
        assert_eq!(got.len(), taken * 1000, "every taken message, nothing else");
        for (i, chunk) in got.chunks(1000).enumerate() {
            assert_eq!(chunk, &msg(i)[..], "message {i} whole and in its place");
        }
        tokio::time::timeout(Duration::from_secs(5), flusher).await.unwrap().unwrap();
    }

    /// A peer that reads, but never fast enough to empty the backlog: the written part
    /// is dropped as it goes, so the backlog's memory stays within about twice its bound
    /// however much goes through.
    #[tokio::test]
    async fn a_backlog_that_never_empties_does_not_grow() {
        // Small socket buffers (no autotuning): the backlog is where bytes wait.
        let listen = tokio::net::TcpSocket::new_v4().unwrap();
        listen.set_recv_buffer_size(4096).unwrap();
        listen.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = listen.listen(8).unwrap();
        let addr = listener.local_addr().unwrap();
        let ours = tokio::net::TcpSocket::new_v4().unwrap();
        ours.set_send_buffer_size(4096).unwrap();
        let (ours, theirs) = tokio::join!(ours.connect(addr), listener.accept());
        let (_rd, wr) = ours.unwrap().into_split();
        let mut peer = theirs.unwrap().0;
        let cap = 64 << 10;
        let (wire, flusher) = flushed(wr, cap);
        let msg = [b'x'; 1000];
        let (mut sent, mut largest) = (0usize, 0usize);
        let mut buf = vec![0u8; 4 << 10];
        for _ in 0..2000 {
            while wire.try_send(&msg).is_ok() {
                sent += msg.len();
            }
            largest = largest.max(wire.out.lock().unwrap().bytes.len());
            // Read a little: the flusher writes some of the backlog, never all of it.
            let n = tokio::time::timeout(Duration::from_secs(5), peer.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0);
            tokio::task::yield_now().await;
        }
        assert!(sent > 8 * cap, "enough went through to tell: {sent} bytes");
        assert!(largest <= 2 * cap + msg.len(), "the backlog held {largest} bytes (bound {cap})");
        // The flusher may wait for a socket the peer no longer reads: its connection's
        // task drops it, as here.
        flusher.abort();
    }
}
