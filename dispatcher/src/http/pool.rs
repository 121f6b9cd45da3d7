//! Upstream connections per backend: keep-alive reuse (most recently used first, so the
//! idle ones age out), idle timeout, at most `max_idle` idle, at most
//! `max_connections_per_backend` open, connect timeout.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use tokio::{
    net::{
        tcp::{OwnedReadHalf, OwnedWriteHalf},
        TcpStream,
    },
    sync::{OwnedSemaphorePermit, Semaphore},
};

use super::body::Inbound;
use crate::config::HttpSettings;

pub struct Upstream {
    pub backend: usize,
    pub r: Inbound<OwnedReadHalf>,
    pub w: OwnedWriteHalf,
    /// Came from the idle list (it may have been closed by the server meanwhile).
    pub reused: bool,
    _permit: OwnedSemaphorePermit,
    _open: Open,
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
    #[error("{addr}: connection limit reached")]
    Full { addr: SocketAddr },
}

pub struct Pool {
    pub backend: usize,
    pub addr: SocketAddr,
    idle: Mutex<Vec<(Upstream, Instant)>>,
    limit: Arc<Semaphore>,
    max_idle: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    open: Arc<AtomicU64>,
    /// Signalled when a connection goes back to the idle list.
    returned: tokio::sync::Notify,
}

impl Pool {
    /// `open`: the backend's gauge of open connections (shared by all workers' pools).
    pub fn new(backend: usize, addr: SocketAddr, s: &HttpSettings, open: Arc<AtomicU64>) -> Pool {
        Pool {
            backend,
            open,
            addr,
            idle: Mutex::new(Vec::new()),
            limit: Arc::new(Semaphore::new(s.max_connections_per_backend)),
            max_idle: s.pool_max_idle,
            idle_timeout: s.pool_idle_timeout,
            connect_timeout: s.connect_timeout,
            returned: tokio::sync::Notify::new(),
        }
    }

    /// An idle connection if one is fresh enough, else a new one. `trusted`: the backend
    /// is in good health; otherwise its idle connections are closed, not reused.
    ///
    /// At the connection limit it waits (up to the connect timeout) for whichever comes
    /// first: a connection returned to the pool or one closed. (Waiting for a closed one
    /// only would starve behind connections that go back to the pool.)
    pub async fn get(&self, trusted: bool) -> Result<Upstream, PoolError> {
        if !trusted {
            self.clear();
        }
        let deadline = tokio::time::Instant::now() + self.connect_timeout;
        loop {
            // Registered before looking, so that a return in between is not missed.
            let returned = self.returned.notified();
            if trusted {
                if let Some(up) = self.take_idle() {
                    return Ok(up);
                }
            }
            tokio::select! {
                permit = self.limit.clone().acquire_owned() => {
                    let permit = permit.map_err(|_| PoolError::Full { addr: self.addr })?;
                    return self.open(permit).await;
                }
                _ = returned, if trusted => continue,
                _ = tokio::time::sleep_until(deadline) => return Err(PoolError::Full { addr: self.addr }),
            }
        }
    }

    fn take_idle(&self) -> Option<Upstream> {
        let mut idle = self.idle.lock().unwrap();
        let now = Instant::now();
        while let Some((mut up, since)) = idle.pop() {
            if now.duration_since(since) < self.idle_timeout {
                up.reused = true;
                return Some(up);
            }
        }
        None
    }

    /// Always a new connection (the retry after a reused one turned out closed).
    pub async fn connect(&self) -> Result<Upstream, PoolError> {
        let addr = self.addr;
        let permit = tokio::time::timeout(self.connect_timeout, self.limit.clone().acquire_owned())
            .await
            .map_err(|_| PoolError::Full { addr })?
            .map_err(|_| PoolError::Full { addr })?;
        self.open(permit).await
    }

    async fn open(&self, permit: OwnedSemaphorePermit) -> Result<Upstream, PoolError> {
        let addr = self.addr;
        let stream = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(source)) => return Err(PoolError::Connect { addr, source }),
            Err(_) => return Err(PoolError::ConnectTimeout { addr }),
        };
        let _ = stream.set_nodelay(true);
        let (r, w) = stream.into_split();
        self.open.fetch_add(1, Ordering::Relaxed);
        let open = Open(self.open.clone());
        Ok(Upstream { backend: self.backend, r: Inbound::new(r), w, reused: false, _permit: permit, _open: open })
    }

    /// Returns a connection after a complete exchange; dropped if the pool is full or it
    /// holds unread bytes (a server that sent more than the response is not trusted).
    pub fn put(&self, mut up: Upstream) {
        if !up.r.buf.is_empty() {
            return;
        }
        // An idle connection keeps no read buffer (the next read allocates one).
        up.r.buf = bytes::BytesMut::new();
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < self.max_idle {
            idle.push((up, Instant::now()));
            drop(idle);
            self.returned.notify_one();
        }
    }

    /// Closes every idle connection (a backend turned suspect: none of them is trusted).
    pub fn clear(&self) -> usize {
        let mut idle = self.idle.lock().unwrap();
        let n = idle.len();
        idle.clear();
        n
    }

    pub fn idle_count(&self) -> usize {
        self.idle.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the connection limit, a waiting request gets the connection another one puts
    /// back (before the fix it waited for a close that never came, and timed out).
    #[tokio::test]
    async fn a_waiter_at_the_limit_gets_a_returned_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let s = HttpSettings {
            max_connections_per_backend: 1,
            connect_timeout: Duration::from_millis(500),
            ..HttpSettings::default()
        };
        let open = Arc::new(AtomicU64::new(0));
        let pool = Arc::new(Pool::new(0, addr, &s, open.clone()));
        let first = pool.get(true).await.unwrap();
        assert_eq!(open.load(Ordering::Relaxed), 1);
        let waiter = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.get(true).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        pool.put(first);
        let second = tokio::time::timeout(Duration::from_millis(300), waiter).await.unwrap().unwrap().unwrap();
        assert!(second.reused, "the returned connection, not a new one");
        assert_eq!(open.load(Ordering::Relaxed), 1, "still one connection open");
        // And with nothing returned, the waiter gives up at the connect timeout.
        let started = std::time::Instant::now();
        assert!(matches!(pool.get(true).await, Err(PoolError::Full { .. })));
        assert!(started.elapsed() >= Duration::from_millis(450));
        drop(second);
        assert_eq!(open.load(Ordering::Relaxed), 0, "the gauge follows closes");
        accepted.abort();
    }
}
