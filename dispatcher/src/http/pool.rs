//! Upstream connections per backend: keep-alive reuse (most recently used first, so the
//! idle ones age out), idle timeout, at most `max_idle` idle per worker, connect timeout,
//! and at most `max_connections_per_backend` in use — one limit per backend shared by
//! every worker's pool (an idle connection holds no share of it, so one worker's idle
//! connections never starve another worker); a request at the limit waits in the
//! backend's queue up to `queue_timeout`. Idle connections of all pools together stay
//! within an `IdleBudget` derived from the descriptor limit.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::{
    net::TcpStream,
    sync::{OwnedSemaphorePermit, Semaphore},
};

use crate::http1::{
    body::Inbound,
    io::{is_local_errno, ReadSide, WriteSide},
};
use crate::{
    capacity::{IdleBudget, IdleSlot},
    config::HttpSettings,
    tls::upstream::BackendTls,
};

pub struct Upstream {
    pub r: Inbound<ReadSide>,
    pub w: WriteSide,
    /// The socket under both halves (TLS or not).
    fd: std::os::fd::RawFd,
    /// Came from the idle list (it may have been closed by the server meanwhile).
    pub reused: bool,
    /// This connection's share of the backend's limit while it is in use.
    _permit: Option<OwnedSemaphorePermit>,
    _open: Open,
}

impl Upstream {
    /// Resets the connection when it is dropped (SO_LINGER 0): the server sees an abort,
    /// never a request that looks complete.
    pub fn abort(&self) {
        crate::http1::io::reset_on_close(self.fd);
    }
}

/// An idle connection must have nothing to say: bytes that arrived after its last
/// response (a server that sent more than it framed) would be read as the next request's
/// response — another client's. Closed or talkative connections are dropped.
///
/// Asked of the socket itself (a non-blocking peek), not of the runtime's cached
/// readiness, which may not have seen the bytes yet. Over TLS the peek sees records: a
/// server's close_notify or any record after the response makes the connection talkative
/// too (never reused: a conservative verdict).
fn quiet(up: &Upstream) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let fd = up.fd;
    let mut probe = [0u8; 1];
    matches!(recv(fd, &mut probe, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT), Err(nix::errno::Errno::EAGAIN))
}

/// Counts an open upstream connection in its backend's gauge while it lives.
struct Open(Arc<AtomicU64>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("connecting to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("connecting to {addr}: timed out")]
    ConnectTimeout { addr: SocketAddr },
    #[error("TLS with {addr}: {source}")]
    Tls { addr: SocketAddr, source: std::io::Error },
    #[error("{addr}: connection limit reached and no connection freed within the queue timeout")]
    Full { addr: SocketAddr },
}

impl PoolError {
    /// The backend's connection limit, not a failure of the backend.
    pub fn is_busy(&self) -> bool {
        matches!(self, PoolError::Full { .. })
    }

    /// The backend's TLS handshake failed (its certificate, its name, the protocol).
    pub fn is_tls(&self) -> bool {
        matches!(self, PoolError::Tls { .. })
    }

    /// What it says of the backend's health (a failed request's cause).
    pub fn cause(&self) -> crate::health::Cause {
        use crate::health::Cause;
        match self {
            PoolError::Connect { source, .. } => Cause::of_io(source),
            PoolError::ConnectTimeout { .. } => Cause::Timeout(0),
            PoolError::Tls { .. } => Cause::Tls,
            PoolError::Full { .. } => Cause::Unreachable,
        }
    }

    /// A shortage on this host (descriptors, ports, buffers, memory): never the backend's
    /// failure.
    pub fn is_local(&self) -> bool {
        match self {
            PoolError::Connect { source, .. } => source.raw_os_error().is_some_and(is_local_errno),
            _ => false,
        }
    }
}

pub struct Pool {
    pub addr: SocketAddr,
    idle: Mutex<Vec<(Upstream, Instant, IdleSlot)>>,
    budget: Arc<IdleBudget>,
    limit: Arc<Semaphore>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    open: Arc<AtomicU64>,
    /// TLS to this backend (the VIP's `backend_tls`).
    tls: Option<Arc<BackendTls>>,
}

impl Pool {
    /// `open`: the backend's gauge of open connections, and `limit` its connection limit
    /// (both shared by all workers' pools).
    pub fn new(
        addr: SocketAddr,
        s: &HttpSettings,
        open: Arc<AtomicU64>,
        limit: Arc<Semaphore>,
        budget: Arc<IdleBudget>,
        tls: Option<Arc<BackendTls>>,
    ) -> Pool {
        Pool {
            tls,
            open,
            addr,
            idle: Mutex::new(Vec::new()),
            budget,
            limit,
            max_idle: s.pool_max_idle,
            idle_timeout: s.pool_idle_timeout,
            connect_timeout: s.connect_timeout,
        }
    }

    /// A share of the backend's limit (waiting in its queue up to the queue timeout), then
    /// an idle connection if one is fresh enough, else a new one. `trusted`: the backend
    /// is in good health; otherwise its idle connections are closed, not reused.
    pub async fn get(&self, trusted: bool, deadline: Instant) -> Result<Upstream, PoolError> {
        if !trusted {
            self.clear();
        }
        let permit = self.permit(deadline).await?;
        if trusted {
            if let Some(mut up) = self.take_idle() {
                up._permit = Some(permit);
                return Ok(up);
            }
        }
        self.open(permit).await
    }

    /// Waits in the backend's queue for a share of its connection limit, until
    /// `deadline` at most (the request's queueing deadline).
    async fn permit(&self, deadline: Instant) -> Result<OwnedSemaphorePermit, PoolError> {
        let until = tokio::time::Instant::from_std(deadline);
        match tokio::time::timeout_at(until, self.limit.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(p),
            _ => Err(PoolError::Full { addr: self.addr }),
        }
    }

    fn take_idle(&self) -> Option<Upstream> {
        let mut idle = self.idle.lock().unwrap();
        let now = Instant::now();
        while let Some((mut up, since, _slot)) = idle.pop() {
            if now.duration_since(since) < self.idle_timeout && quiet(&up) {
                up.reused = true;
                return Some(up);
            }
        }
        None
    }

    /// Always a new connection (the retry after a reused one turned out closed).
    pub async fn connect(&self, deadline: Instant) -> Result<Upstream, PoolError> {
        let permit = self.permit(deadline).await?;
        self.open(permit).await
    }

    async fn open(&self, permit: OwnedSemaphorePermit) -> Result<Upstream, PoolError> {
        let addr = self.addr;
        // One deadline for the TCP connect and the TLS handshake together.
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        let stream = match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => return Err(PoolError::Connect { addr, source }),
            Err(_) => return Err(PoolError::ConnectTimeout { addr }),
        };
        let _ = stream.set_nodelay(true);
        self.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(self.open.clone());
        let (r, w, fd) = match &self.tls {
            None => crate::http1::io::split_plain(stream),
            Some(tls) => match tokio::time::timeout_at(deadline, tls.connect(stream)).await {
                Ok(Ok(s)) => crate::http1::io::split_tls(s),
                Ok(Err(source)) => return Err(PoolError::Tls { addr, source }),
                Err(_) => return Err(PoolError::ConnectTimeout { addr }),
            },
        };
        Ok(Upstream { r: Inbound::new(r), w, fd, reused: false, _permit: Some(permit), _open: open })
    }

    /// Returns a connection after a complete exchange; dropped if the pool is full or it
    /// holds unread bytes (a server that sent more than the response is not trusted).
    pub fn put(&self, mut up: Upstream) {
        if !up.r.buf.is_empty() || !up.r.io.drained() {
            return;
        }
        // An idle connection keeps no read buffer (the next read allocates one), and no
        // share of the limit: pushed first, then the share is freed, so that a request
        // waiting in this worker's queue finds it.
        up.r.buf = bytes::BytesMut::new();
        let permit = up._permit.take();
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < self.max_idle {
            if let Some(slot) = self.budget.take() {
                idle.push((up, Instant::now(), slot));
            }
        }
        drop(idle);
        drop(permit);
    }

    /// Closes the idle connections that have aged out or have something to say (closed by
    /// the server, or bytes nobody asked for): run periodically, so that a pool nobody
    /// draws from does not keep descriptors (in CLOSE_WAIT) forever.
    pub fn reap(&self) -> usize {
        let now = Instant::now();
        let mut idle = self.idle.lock().unwrap();
        let before = idle.len();
        idle.retain(|(up, since, _)| now.duration_since(*since) < self.idle_timeout && quiet(up));
        before - idle.len()
    }

    /// Closes every idle connection (a backend turned suspect: none of them is trusted).
    pub fn clear(&self) -> usize {
        let mut idle = self.idle.lock().unwrap();
        let n = idle.len();
        idle.clear();
        n
    }

    #[cfg(test)]
    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A queueing deadline `ms` from now.
    fn soon(ms: u64) -> Instant {
        Instant::now() + Duration::from_millis(ms)
    }

    fn budget() -> Arc<IdleBudget> {
        Arc::new(IdleBudget::new(1000))
    }

    /// A server on loopback that accepts and keeps every connection.
    async fn sink() -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        (addr, accepted)
    }

    /// At the connection limit, a waiting request gets the connection another one puts
    /// back (before the fix it waited for a close that never came, and timed out).
    #[tokio::test]
    async fn a_waiter_at_the_limit_gets_a_returned_connection() {
        let (addr, accepted) = sink().await;
        let s = HttpSettings::default();
        let open = Arc::new(AtomicU64::new(0));
        let pool = Arc::new(Pool::new(addr, &s, open.clone(), Arc::new(Semaphore::new(1)), budget(), None));
        let first = pool.get(true, soon(500)).await.unwrap();
        assert_eq!(open.load(Ordering::Relaxed), 1);
        let waiter = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.get(true, soon(500)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        pool.put(first);
        let second = tokio::time::timeout(Duration::from_millis(300), waiter).await.unwrap().unwrap().unwrap();
        assert!(second.reused, "the returned connection, not a new one");
        assert_eq!(open.load(Ordering::Relaxed), 1, "still one connection open");
        // And with nothing returned, the waiter gives up at the queue timeout: busy.
        let started = std::time::Instant::now();
        assert!(pool.get(true, soon(500)).await.is_err_and(|e| e.is_busy() && !e.is_local()));
        assert!(started.elapsed() >= Duration::from_millis(450));
        drop(second);
        assert_eq!(open.load(Ordering::Relaxed), 0, "the gauge follows closes");
        accepted.abort();
    }

    /// The limit is the backend's, not one worker's: a second pool (another worker) that
    /// shares the backend's limit waits for the first pool's connection; once that one is
    /// idle (back in the first pool), the second pool may open its own.
    #[tokio::test]
    async fn the_limit_is_shared_by_every_workers_pool() {
        let (addr, accepted) = sink().await;
        let s = HttpSettings::default();
        let (open, limit) = (Arc::new(AtomicU64::new(0)), Arc::new(Semaphore::new(1)));
        let a = Pool::new(addr, &s, open.clone(), limit.clone(), budget(), None);
        let b = Pool::new(addr, &s, open.clone(), limit.clone(), budget(), None);
        let held = a.get(true, soon(200)).await.unwrap();
        assert!(
            b.get(true, soon(200)).await.is_err_and(|e| e.is_busy()),
            "the other worker's pool is at the limit too"
        );
        a.put(held);
        assert_eq!(a.idle_count(), 1);
        assert!(b.get(true, soon(200)).await.is_ok(), "another worker's idle connection holds no share of the limit");
        accepted.abort();
    }

    #[test]
    fn local_shortages_are_not_backend_failures() {
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let err =
            |e: nix::errno::Errno| PoolError::Connect { addr, source: std::io::Error::from_raw_os_error(e as i32) };
        for e in [nix::errno::Errno::EMFILE, nix::errno::Errno::ENFILE, nix::errno::Errno::EADDRNOTAVAIL] {
            assert!(err(e).is_local(), "{e}");
        }
        assert!(!err(nix::errno::Errno::ECONNREFUSED).is_local());
        assert!(!PoolError::ConnectTimeout { addr }.is_local());
    }

    /// Bytes a server sends after its framed response, even late, never reach the next
    /// request: the connection they arrived on is not reused.
    #[tokio::test]
    async fn an_idle_connection_with_late_bytes_is_not_reused() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            tokio::io::AsyncWriteExt::write_all(&mut c, b"HTTP/1.1 200 OK\r\n\r\nsmuggled").await.unwrap();
            let (second, _) = listener.accept().await.unwrap();
            (c, second)
        });
        let s = HttpSettings::default();
        let pool = Pool::new(addr, &s, Arc::new(AtomicU64::new(0)), Arc::new(Semaphore::new(4)), budget(), None);
        let up = pool.get(true, soon(500)).await.unwrap();
        // Back in the pool before the late bytes are read.
        pool.put(up);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let next = pool.get(true, soon(500)).await.unwrap();
        assert!(!next.reused, "a fresh connection, not the one with unread bytes");
        drop(server.await.unwrap());
    }

    /// A pool nobody draws from still lets go of connections its server closed.
    #[tokio::test]
    async fn reaping_closes_what_the_server_closed() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move { listener.accept().await.map(|(c, _)| c) });
        let s = HttpSettings::default();
        let pool = Pool::new(addr, &s, Arc::new(AtomicU64::new(0)), Arc::new(Semaphore::new(4)), budget(), None);
        pool.put(pool.get(true, soon(500)).await.unwrap());
        assert_eq!(pool.reap(), 0, "an open, quiet connection stays");
        drop(server.await.unwrap().unwrap());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(pool.reap(), 1, "closed by its server: let go");
        assert_eq!(pool.idle_count(), 0);
    }

    /// Idle connections of all pools together stay within the budget, and give their
    /// place back whichever way they leave the idle list.
    #[tokio::test]
    async fn idle_connections_share_one_budget() {
        let (addr, accepted) = sink().await;
        let s = HttpSettings::default();
        let budget = Arc::new(IdleBudget::new(2));
        let pool = |b: &Arc<IdleBudget>| {
            Pool::new(addr, &s, Arc::new(AtomicU64::new(0)), Arc::new(Semaphore::new(8)), b.clone(), None)
        };
        let (a, b) = (pool(&budget), pool(&budget));
        let conns = [
            a.get(true, soon(200)).await.unwrap(),
            a.get(true, soon(200)).await.unwrap(),
            b.get(true, soon(200)).await.unwrap(),
        ];
        let [c1, c2, c3] = conns;
        a.put(c1);
        a.put(c2);
        b.put(c3);
        assert_eq!((a.idle_count(), b.idle_count(), budget.idle()), (2, 0, 2), "the third is closed, not kept");
        assert_eq!(a.clear(), 2);
        assert_eq!(budget.idle(), 0, "cleared connections give their places back");
        b.put(b.get(true, soon(200)).await.unwrap());
        drop(b);
        assert_eq!(budget.idle(), 0, "a dropped pool gives its places back");
        accepted.abort();
    }
}
