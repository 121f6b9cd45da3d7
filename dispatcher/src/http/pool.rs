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
        }
    }

    /// An idle connection if one is fresh enough, else a new one. `trusted`: the backend
    /// is in good health; otherwise its idle connections are closed, not reused.
    pub async fn get(&self, trusted: bool) -> Result<Upstream, PoolError> {
        if !trusted {
            self.clear();
        } else if let Some(up) = self.take_idle() {
            return Ok(up);
        }
        self.connect().await
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
    pub fn put(&self, up: Upstream) {
        if !up.r.buf.is_empty() {
            return;
        }
        let mut idle = self.idle.lock().unwrap();
        if idle.len() < self.max_idle {
            idle.push((up, Instant::now()));
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
