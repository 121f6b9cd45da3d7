//! SIP over TCP and TLS (`mode = "sip"`, `transport = "tcp"` or `"tls"`), terminated by
//! the agent (RFC 3261 18): XDP passes these VIPs to the host stack as it does HTTP VIPs.
//!
//! - `framing.rs`: a byte stream cut into messages by `Content-Length`, keepalives, limits;
//! - `message.rs`: our `Via` and `Record-Route` on the way in, taken off on the way back;
//! - `route.rs`: the container for a caller's message, by the XDP program's rules through
//!   the same clone table, and the bounded Call-ID pins;
//! - `conn.rs`: one caller's connection (read, route, hold, answer), its timeouts;
//! - `upstream.rs`: the pooled connections to the containers (one per container and port,
//!   messages multiplexed), what comes back on them, and the requests they still owe an
//!   answer to, routed again when the container goes down.
//!
//! The `[http]` settings bound it as they bound the HTTP proxy: `max_header_bytes` (the
//! header section), `header_timeout` (a message's header section from its first byte),
//! `body_timeout` (its body after that), `client_idle_timeout`, `connect_timeout`,
//! `hold_time` and `max_held`, `max_tls_handshakes` and `tls_session_cache`.

pub mod conn;
pub mod framing;
pub mod message;
pub mod route;
pub mod upstream;
pub mod wire;

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};

use crate::{
    config::{Config, SipTransport},
    state::Servers,
    tls::server::ServerTls,
};

/// Bytes a message's body may have.
pub const MAX_BODY: usize = 64 * 1024;
/// Call-IDs pinned at once (about 40 bytes each).
pub const MAX_PINS: usize = 1 << 20;
/// Messages queued toward a TLS caller's connection (its writer task's) before more are
/// dropped (and at most `BACKLOG` bytes of them).
pub const QUEUE: usize = 256;
/// Bytes a plain connection (a caller's or a container's) holds when its socket takes no
/// more (`wire.rs`); past them a message is dropped (caller) or waited with (container).
pub const BACKLOG: usize = 256 << 10;

/// What a container may send on its connection. An answer copies the request's `Via`
/// and `Record-Route` fields (RFC 3261 8.2.6.2, 12.1.1) and adds its own, so the
/// answer to a request a caller was allowed to send may be larger than a caller's own
/// limit: twice the caller's header bound and 16 KiB more. Were it the caller's bound, a
/// caller could break a container's connection, shared by every caller, at will.
pub fn container_limits(max_header_bytes: usize) -> framing::Limits {
    framing::Limits { max_header: max_header_bytes.saturating_mul(2).saturating_add(16 << 10), max_body: MAX_BODY }
}

/// A stream SIP VIP as its connections see it.
pub struct SipVip {
    pub name: String,
    pub members: Vec<usize>,
    /// `address:port`, as our `Via` and `Record-Route` name it.
    pub host: String,
    pub transport: SipTransport,
    pub backend_port: u16,
    pub tls: Option<Arc<ServerTls>>,
    pub max_connections: usize,
    pub open: AtomicUsize,
}

/// The `[http]` bounds the SIP connections obey.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// What a caller may send.
    pub limits: framing::Limits,
    /// What a container's connection may carry (`container_limits`).
    pub container_limits: framing::Limits,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub idle_timeout: Duration,
    pub connect_timeout: Duration,
    pub hold_time: Duration,
    pub max_held: usize,
}

/// Where a caller's connection is written: over plain TCP by whichever task has the
/// message (`wire.rs`); over TLS through its writer task's queue (the TLS state is that
/// task's).
#[derive(Clone)]
pub enum CallerTx {
    Plain(Arc<wire::Wire>),
    /// The queue, and the bytes in it (at most `BACKLOG`, as a plain connection's).
    Tls(tokio::sync::mpsc::Sender<Vec<u8>>, Arc<AtomicUsize>),
}

impl CallerTx {
    /// Writes or queues one message.
    pub fn send(&self, bytes: Vec<u8>) -> Result<(), wire::Refused> {
        use tokio::sync::mpsc::error::TrySendError;
        match self {
            CallerTx::Plain(w) => w.try_send(&bytes),
            CallerTx::Tls(tx, queued) => {
                // A message is taken whatever its size when nothing waits, as on a plain
                // connection; past `BACKLOG` bytes waiting, refused.
                let len = bytes.len();
                let before = queued.fetch_add(len, Ordering::SeqCst);
                if before > 0 && before + len > BACKLOG {
                    queued.fetch_sub(len, Ordering::SeqCst);
                    return Err(wire::Refused::Full);
                }
                tx.try_send(bytes).map_err(|e| {
                    queued.fetch_sub(len, Ordering::SeqCst);
                    match e {
                        TrySendError::Full(_) => wire::Refused::Full,
                        TrySendError::Closed(_) => wire::Refused::Closed,
                    }
                })
            }
        }
    }

    /// Ends the connection once what is queued is written.
    pub fn close(&self) {
        match self {
            CallerTx::Plain(w) => w.close_after_flush(),
            // Empty bytes: the writer task ends there.
            CallerTx::Tls(tx, _) => {
                let _ = tx.try_send(Vec::new());
            }
        }
    }
}

/// A caller's connection as the others reach it: how it is written, and its VIP.
pub type Caller = (CallerTx, usize);

/// What every connection shares: the servers, the callers' connections by id (where
/// responses and containers' requests go), the pins, the pool.
pub struct Hub {
    pub servers: Arc<Servers>,
    pub vips: Vec<SipVip>,
    pub bounds: Bounds,
    /// Caller connection id -> its queue and its VIP.
    pub clients: Mutex<HashMap<u64, Caller>>,
    next_client: AtomicU64,
    pub pins: Mutex<route::Pins>,
    pub pool: upstream::Pool,
}

impl Hub {
    /// Counts one message's outcome.
    pub fn count(&self, outcome: &str) {
        if let Some(i) = crate::metrics::SIP_STREAM_OUTCOMES.iter().position(|o| *o == outcome) {
            self.servers.counters.sip_stream_messages[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Queues bytes toward caller connection `id`; false when it is gone (`stray`) or its
    /// queue is full (`overflow`).
    pub fn to_client(&self, id: u64, bytes: Vec<u8>) -> bool {
        let tx = self.clients.lock().unwrap().get(&id).map(|c| c.0.clone());
        match tx.map(|tx| tx.send(bytes).is_ok()) {
            Some(true) => true,
            Some(false) => {
                self.count("overflow");
                false
            }
            // The connection is gone: nothing else reaches that caller.
            None => {
                self.count("stray");
                false
            }
        }
    }

    /// The VIP of caller connection `id`, while it is open.
    pub fn client_vip(&self, id: u64) -> Option<usize> {
        self.clients.lock().unwrap().get(&id).map(|c| c.1)
    }
}

/// The stream SIP VIPs of one configuration: their listeners and connections, on
/// runtimes of their own: one per `[http] workers` (at most 4), one thread each. A
/// connection lives on one of them (taken in turn as they are accepted), so that what a
/// message wakes runs on the thread that read it: no hand-over between worker threads,
/// no wake-up of an idle one to steal work (one work-stealing runtime of two threads
/// cost about 15% more CPU per message than one thread in interleaved `bench --sip`
/// runs).
pub struct SipServer {
    runtimes: Vec<tokio::runtime::Runtime>,
    pub hub: Arc<Hub>,
}

impl SipServer {
    /// Binds every stream SIP VIP of `cfg` and starts serving them.
    pub fn start(cfg: &Config, servers: Arc<Servers>) -> anyhow::Result<SipServer> {
        let h = &cfg.http;
        let bounds = Bounds {
            limits: framing::Limits { max_header: h.max_header_bytes, max_body: MAX_BODY },
            container_limits: container_limits(h.max_header_bytes),
            header_timeout: h.header_timeout,
            body_timeout: h.body_timeout,
            idle_timeout: h.client_idle_timeout,
            connect_timeout: h.connect_timeout,
            hold_time: h.hold_time,
            max_held: h.max_held,
        };
        let runtimes = (0..h.workers.clamp(1, 4))
            .map(|_| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("sip")
                    .enable_all()
                    .build()
                    .context("starting the SIP runtimes")
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        // Listeners are made inside the first (tokio's listeners need its reactor).
        let _inside = runtimes[0].enter();
        let handshakes = Arc::new(tokio::sync::Semaphore::new(h.max_tls_handshakes));
        let mut vips = Vec::new();
        let mut listeners = Vec::new();
        for v in cfg.vips.iter().filter(|v| !v.retired) {
            let Some(s) = v.sip_stream() else { continue };
            let tls = match &s.tls {
                Some(t) => {
                    let stats = Arc::new(crate::tls::server::TlsStats::default());
                    let tls = ServerTls::load(t, false, h, handshakes.clone(), stats)
                        .with_context(|| format!("the certificates of SIP VIP {}", v.name))?;
                    Some(Arc::new(tls))
                }
                None => None,
            };
            listeners.push(crate::http::listener::bind(v)?);
            vips.push(SipVip {
                name: v.name.clone(),
                members: v.backends.clone(),
                host: SocketAddr::new(v.address, v.port).to_string(),
                transport: s.transport,
                backend_port: s.backend_port,
                tls,
                max_connections: s.max_connections,
                open: AtomicUsize::new(0),
            });
        }
        let hub = Arc::new(Hub {
            servers,
            vips,
            bounds,
            clients: Mutex::new(HashMap::new()),
            next_client: AtomicU64::new(1),
            pins: Mutex::new(route::Pins::new(MAX_PINS)),
            pool: upstream::Pool::default(),
        });
        let shards: Arc<[tokio::runtime::Handle]> = runtimes.iter().map(|r| r.handle().clone()).collect();
        for (i, l) in listeners.into_iter().enumerate() {
            runtimes[0].spawn(accept(hub.clone(), i, l, shards.clone()));
        }
        for v in hub.vips.iter().filter_map(|v| v.tls.as_ref()) {
            v.publish();
        }
        drop(_inside);
        Ok(SipServer { runtimes, hub })
    }

    /// Stops listening and ends every connection (within a second).
    pub fn shutdown(mut self) {
        for rt in self.runtimes.drain(..) {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl Drop for SipServer {
    fn drop(&mut self) {
        for rt in self.runtimes.drain(..) {
            rt.shutdown_background();
        }
    }
}

/// Accepts on VIP `vi` under its connection cap; each connection goes to the next of
/// `shards` (the runtimes), whose reactor it is registered with.
async fn accept(hub: Arc<Hub>, vi: usize, listener: TcpListener, shards: Arc<[tokio::runtime::Handle]>) {
    let mut next_shard = 0;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                crate::ratelimit::warn("SIP accept failed", &e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let v = &hub.vips[vi];
        if v.open.fetch_add(1, Ordering::SeqCst) >= v.max_connections {
            v.open.fetch_sub(1, Ordering::SeqCst);
            hub.servers.counters.sip_stream_refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        }
        let id = hub.next_client.fetch_add(1, Ordering::Relaxed);
        let hub = hub.clone();
        next_shard = (next_shard + 1) % shards.len();
        let stream = stream.into_std();
        shards[next_shard].spawn(async move {
            // Registered with this runtime's reactor from here on.
            let Ok(stream) = stream.and_then(TcpStream::from_std) else {
                hub.vips[vi].open.fetch_sub(1, Ordering::SeqCst);
                return;
            };
            let counters = hub.servers.counters.clone();
            counters.sip_stream_connections.fetch_add(1, Ordering::Relaxed);
            let _ = stream.set_nodelay(true);
            // Boxed, each: a plain connection's task does not carry the size of the TLS
            // handshake's state, nor of the other kind of connection.
            match hub.vips[vi].tls.clone() {
                None => Box::pin(conn::serve_plain(&hub, vi, id, stream)).await,
                Some(tls) => {
                    if let Some(s) = Box::pin(tls.accept(stream)).await {
                        Box::pin(conn::serve_tls(&hub, vi, id, s)).await;
                    }
                }
            }
            counters.sip_stream_connections.fetch_sub(1, Ordering::Relaxed);
            hub.vips[vi].open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}
