//! Accepting on the HTTP VIPs: one event loop per worker thread (a current-thread tokio
//! runtime), each with its own `SO_REUSEPORT` listener per VIP and its own upstream
//! pools, as HAProxy and nginx run — measured against a work-stealing runtime on this
//! machine, it gave more requests/s and a lower p99 (README, performance).
//!
//! Stopping: the listeners close, idle keep-alive connections end, requests in flight
//! finish, bounded by the drain timeout.
//!
//! Reloading: the new server's workers take over the previous server's listening
//! sockets (a duplicate of each descriptor, matched by worker and address) instead of
//! binding new ones. The socket never closes, so neither a SYN in flight nor a
//! connection waiting in the accept queue meets a closed listener (which the kernel
//! answers with a reset unless `net.ipv4.tcp_migrate_req` is set). Only a listener
//! nobody takes over (a VIP removed, fewer workers) is closed.
//!
//! Capping: client connections are counted over all VIPs (`http.max_client_connections`,
//! by default derived from the descriptor limit so that upstream connections, health
//! checks and the admin socket always have descriptors left) and per VIP
//! (`vip.max_connections`), and per source address (`http::sources`: connections held,
//! new connections per second). One over a cap gets a `503` written without reading its
//! request (one non-blocking write into the new socket's empty buffer; never waited for)
//! and is closed, counted by cap. On an HTTPS VIP it is closed without a word: a
//! plain-text answer means nothing to a TLS client, and a handshake is the work the cap
//! refuses to do.

use std::{
    net::SocketAddr,
    os::fd::AsFd,
    sync::{
        atomic::{AtomicUsize, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tokio::{
    net::{TcpListener, TcpSocket},
    sync::watch,
};
use tracing::Instrument as _;

use super::{
    pool::Pool,
    proxy::{serve, VipCtx},
    route::VipRoute,
};
use crate::{
    access_log::AccessLog,
    capacity::{
        descriptor_limit,
        sources::{default_per_source, Refused},
        Capacity,
    },
    config::{Config, Vip},
    http1::head::HeadLimits,
    state::Servers,
    steering::Ownership,
    tls::{server::ServerTls, upstream::BackendTls},
};

pub struct HttpServer {
    stop: watch::Sender<bool>,
    workers: Vec<JoinHandle<usize>>,
    /// Each worker's listening sockets (duplicates), for a successor to take over.
    listeners: Vec<Vec<(SocketAddr, std::net::TcpListener)>>,
}

/// One worker's listening sockets, as plain descriptors that can cross threads.
type Sockets = Vec<(SocketAddr, std::net::TcpListener)>;

fn duplicate(l: &TcpListener) -> std::io::Result<std::net::TcpListener> {
    Ok(std::net::TcpListener::from(l.as_fd().try_clone_to_owned()?))
}

/// Decrements the count of open client connections when a connection task ends.
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Descriptors kept out of the client cap's reach: the admin socket and its clients,
/// health checks, the maps, logs, and headroom.
fn reserve(nofile: u64) -> u64 {
    256 + nofile / 20
}

/// The default cap on client connections for a descriptor limit: every client may need
/// an upstream connection too, so half of what the reserve and the idle upstream
/// connections' budget leave.
pub fn default_client_cap(nofile: u64) -> usize {
    (nofile.saturating_sub(reserve(nofile) + crate::capacity::idle_cap(nofile)) / 2).max(1) as usize
}

/// The caps one accept loop enforces.
#[derive(Clone)]
struct Caps {
    /// Open client connections of this server (all workers, all VIPs) and their cap.
    active: Arc<AtomicUsize>,
    global: usize,
    /// This VIP's cap (its count is `capacity.vips[i].connections`).
    vip: Option<usize>,
}

fn bind(v: &Vip) -> std::io::Result<TcpListener> {
    let addr = SocketAddr::new(v.address, v.port);
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket
        .bind(addr)
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding HTTP VIP {} on {addr}: {e}", v.name)))?;
    socket.listen(1024)
}

/// The listener for a VIP: the predecessor's socket for the same address if there is
/// one, else a new one.
fn listener_for(v: &Vip, inherited: &mut Sockets) -> std::io::Result<TcpListener> {
    let addr = SocketAddr::new(v.address, v.port);
    match inherited.iter().position(|(a, _)| *a == addr) {
        Some(i) => {
            let (_, l) = inherited.swap_remove(i);
            l.set_nonblocking(true)?;
            TcpListener::from_std(l)
        }
        None => bind(v),
    }
}

/// What every worker shares of one HTTP VIP: its balancing state and its TLS, both ways.
#[derive(Clone)]
struct VipShared {
    route: Arc<VipRoute>,
    tls: Option<Arc<ServerTls>>,
    /// Per backend (indexed like `Config::backends`), for a VIP with `backend_tls`.
    backend_tls: Vec<Option<Arc<BackendTls>>>,
    /// Where its requests are logged (`[access_log]`).
    log: Option<super::proxy::LogTo>,
    /// Whether this dispatcher keeps a connection after its response (steering, leave).
    ownership: Arc<Ownership>,
}

/// Reads the TLS files of every HTTP VIP (once, before any worker starts): an error
/// names the VIP and the file, and nothing starts.
fn vip_shared(
    cfg: &Config,
    capacity: &Capacity,
    access_log: Option<&Arc<AccessLog>>,
    ownership: &Arc<Ownership>,
) -> std::io::Result<Vec<VipShared>> {
    let backend_names: Arc<[Arc<str>]> = cfg.backends.iter().map(|b| Arc::from(b.name.as_str())).collect();
    let handshakes = capacity.tls_handshakes.1.clone();
    let fail = |v: &Vip, e: anyhow::Error| std::io::Error::other(format!("VIP {}: {e:#}", v.name));
    let mut out = Vec::new();
    for (i, v, h) in cfg.vips.iter().enumerate().filter_map(|(i, v)| Some((i, v, v.served_http()?))) {
        let tls = match &h.tls {
            Some(t) => Some(Arc::new(
                ServerTls::load(t, &cfg.http, handshakes.clone(), capacity.vips[i].tls.clone())
                    .map_err(|e| fail(v, e))?,
            )),
            None => None,
        };
        let backend_tls = match &h.backend_tls {
            Some(f) => {
                let client = crate::tls::upstream::client_config(f).map_err(|e| fail(v, e))?;
                (0..cfg.backends.len())
                    .map(|b| {
                        let address = cfg.backends[b].address.into();
                        v.backends.contains(&b).then(|| Arc::new(BackendTls::new(client.clone(), f, address)))
                    })
                    .collect()
            }
            None => vec![None; cfg.backends.len()],
        };
        out.push(VipShared {
            route: Arc::new(
                VipRoute::new(v.backends.clone(), h.balance, h.fail_back)
                    .with_slow_start(v.backends.iter().map(|&b| v.slow_start_of(cfg, b)).collect()),
            ),
            tls,
            backend_tls,
            log: access_log.map(|sink| super::proxy::LogTo {
                sink: sink.clone(),
                vip: Arc::from(v.name.as_str()),
                backends: backend_names.clone(),
            }),
            ownership: ownership.clone(),
        });
    }
    Ok(out)
}

/// What one worker serves: a context (own pools) and a listener per HTTP VIP.
fn worker_vips(
    cfg: &Config,
    servers: &Arc<Servers>,
    capacity: &Arc<Capacity>,
    shared: &[VipShared],
    mut inherited: Sockets,
) -> std::io::Result<Vec<(Arc<VipCtx>, TcpListener)>> {
    let mut out = Vec::new();
    for ((vip_index, v, h), sh) in
        cfg.vips.iter().enumerate().filter_map(|(i, v)| Some((i, v, v.served_http()?))).zip(shared)
    {
        let pools = (0..cfg.backends.len())
            .map(|b| {
                v.backends.contains(&b).then(|| {
                    let addr = SocketAddr::new(cfg.backends[b].address.into(), h.backend_port);
                    let be = &servers.backends[b];
                    let budget = capacity.idle_budget.clone();
                    let tls = sh.backend_tls[b].clone();
                    Pool::new(addr, &cfg.http, be.connections.clone(), be.conn_limit.clone(), budget, tls)
                })
            })
            .collect();
        let ctx = Arc::new(VipCtx {
            name: Arc::from(v.name.as_str()),
            host: crate::http1::rewrite::vip_authority(SocketAddr::new(v.address, v.port)),
            vip_index,
            route: sh.route.clone(),
            pools,
            servers: servers.clone(),
            capacity: capacity.clone(),
            settings: cfg.http.clone(),
            limits: HeadLimits { max_bytes: cfg.http.max_header_bytes, max_headers: cfg.http.max_headers },
            suspect_on_status: cfg.health.suspect_on_status.clone(),
            tls: sh.tls.clone(),
            session_format: h.session_format,
            forwarded: crate::http1::rewrite::forwarded_fields(h.tls.is_some(), v.port),
            redirect: h.redirect_to.clone(),
            log: sh.log.clone(),
            ownership: sh.ownership.clone(),
            persist: h.insert_cookie.as_ref().map(|name| {
                let members = v.backends.iter().map(|&b| (b, cfg.backends[b].name.clone()));
                super::persist::Persist::new(name, members, h.tls.is_some())
            }),
        });
        out.push((ctx, listener_for(v, &mut inherited)?));
    }
    // What is left here is not served any more: closed with this worker's copy.
    Ok(out)
}

async fn accept_loop(
    ctx: Arc<VipCtx>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    caps: Caps,
    mine: Arc<AtomicUsize>,
) {
    let counters = &ctx.servers.counters;
    let vip_conns = &ctx.capacity.vips[ctx.vip_index].connections;
    loop {
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => {
                    let total = caps.active.fetch_add(1, Ordering::SeqCst) + 1;
                    let on_vip = vip_conns.fetch_add(1, Ordering::SeqCst) + 1;
                    let guards = (Active(caps.active.clone()), VipOpen(ctx.clone()));
                    let over = if total > caps.global {
                        Err(Cap::Global)
                    } else if caps.vip.is_some_and(|cap| on_vip as usize > cap) {
                        Err(Cap::Vip)
                    } else {
                        ctx.capacity.sources.admit(peer).map_err(|r| match r {
                            Refused::Count => Cap::SourceCount,
                            Refused::Rate => Cap::SourceRate,
                        })
                    };
                    let held = match over {
                        Ok(held) => held,
                        Err(cap) => {
                            // Over a cap: answered and closed at once (the guards undo the counts).
                            counters.conn_refused_by[cap as usize].fetch_add(1, Ordering::Relaxed);
                            cap.log(peer, total, caps.global, on_vip, &ctx.host);
                            if ctx.tls.is_none() {
                                refuse_plain(&stream, cap);
                            }
                            drop(stream);
                            continue;
                        }
                    };
                    mine.fetch_add(1, Ordering::SeqCst);
                    let guards = (guards, Active(mine.clone()), held);
                    let (ctx, stop) = (ctx.clone(), stop.clone());
                    // Every log line of the connection says whose it is (about 0.6 µs per
                    // connection, measured; keep-alive connections carry many requests).
                    let span = tracing::info_span!("conn", vip = %ctx.name, client = %peer);
                    tokio::spawn(
                        async move {
                            let _guards = guards;
                            serve(ctx, stream, peer, stop).await;
                        }
                        .instrument(span),
                    );
                }
                Err(e) => {
                    // Out of descriptors and the like: back off, keep serving, log once
                    // per interval with a count.
                    if e.raw_os_error().is_some_and(crate::http1::io::is_local_errno) {
                        counters.local_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    crate::ratelimit::warn("accept", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = stop.changed() => return,
        }
    }
}

/// The cap a refused client connection met (the index of its refusal counter and of its
/// `reason` label, `metrics::CONN_REFUSED_REASONS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    Global = 0,
    Vip = 1,
    SourceCount = 2,
    SourceRate = 3,
}

impl Cap {
    pub const ALL: [Cap; 4] = [Cap::Global, Cap::Vip, Cap::SourceCount, Cap::SourceRate];

    /// The answer a plain-HTTP client gets: what to wait for before trying again.
    fn response(self) -> &'static [u8] {
        static ANSWERS: std::sync::LazyLock<[Vec<u8>; 4]> = std::sync::LazyLock::new(|| {
            Cap::ALL.map(|cap| {
                let (why, retry) = match cap {
                    Cap::Global | Cap::Vip => ("too many connections", 1),
                    Cap::SourceCount => ("too many connections from your address", 5),
                    Cap::SourceRate => ("too many new connections from your address", 1),
                };
                let body = format!("503 Service Unavailable: {why}\n");
                format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nRetry-After: {retry}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
                .into_bytes()
            })
        });
        &ANSWERS[self as usize]
    }

    /// A warning, at most once per 10 s per cap, with how many more there were.
    fn log(self, peer: SocketAddr, total: usize, global: usize, on_vip: u64, vip: &str) {
        let kind = match self {
            Cap::Global | Cap::Vip => "client connection refused at the connection cap; accepting",
            Cap::SourceCount => "client connection refused at max_connections_per_source; accepting",
            Cap::SourceRate => "client connection refused at max_connection_rate_per_source; accepting",
        };
        let source = crate::capacity::sources::Source::of(peer);
        crate::ratelimit::warn(
            kind,
            &format_args!("from {source}: {total} open (cap {global}), {on_vip} on VIP {vip}"),
        );
    }
}

/// The refusal as a plain-HTTP client reads it, without reading its request: one
/// non-blocking write (a new socket's send buffer is empty; a short write is left short),
/// the write side shut, what the client already sent discarded without waiting (so the
/// close is less likely to become a reset that loses the answer). Never waits.
fn refuse_plain(stream: &tokio::net::TcpStream, cap: Cap) {
    use std::os::fd::AsRawFd;
    let fd = stream.as_raw_fd();
    let answer = cap.response();
    // SAFETY: `fd` is the open socket `stream` owns for the whole call; the buffers are
    // valid for the lengths given.
    unsafe {
        let _ = libc::send(fd, answer.as_ptr().cast(), answer.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL);
        libc::shutdown(fd, libc::SHUT_WR);
        let mut sink = [0u8; 4096];
        for _ in 0..4 {
            if libc::recv(fd, sink.as_mut_ptr().cast(), sink.len(), libc::MSG_DONTWAIT) <= 0 {
                break;
            }
        }
    }
}

/// Closes this worker's idle upstream connections that aged out or were closed by their
/// server, every few seconds (not only when a request looks for one).
async fn reap_idle(ctxs: Vec<Arc<VipCtx>>, idle_timeout: Duration) {
    let every = idle_timeout.clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        for pool in ctxs.iter().flat_map(|c| c.pools.iter().flatten()) {
            pool.reap();
        }
    }
}

/// Counts a client connection on its VIP while it lives.
struct VipOpen(Arc<VipCtx>);

impl Drop for VipOpen {
    fn drop(&mut self) {
        self.0.capacity.vips[self.0.vip_index].connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The per-source limits `cfg` sets: (connections held, new connections per second).
pub fn source_limits(cfg: &Config) -> (usize, usize) {
    let global = cfg.http.max_client_connections.unwrap_or_else(|| default_client_cap(descriptor_limit()));
    (
        cfg.http.max_connections_per_source.unwrap_or_else(|| default_per_source(global)),
        cfg.http.max_connection_rate_per_source,
    )
}

/// The client connection caps `cfg` sets, said in the log; returns the global one. The
/// per-source table is the capacity's (shared with the generation this one replaces):
/// its new limits apply once a reload has succeeded (the agent sets them then: a refused
/// reload changes nothing); a first start sets them here.
fn client_caps(cfg: &Config, capacity: &Capacity, first: bool) -> usize {
    let nofile = descriptor_limit();
    let global = cfg.http.max_client_connections.unwrap_or_else(|| default_client_cap(nofile));
    if global > default_client_cap(nofile) {
        tracing::warn!(
            max_client_connections = global,
            descriptor_limit = nofile,
            "the client connection cap leaves too few descriptors for upstream connections, health checks and the admin socket (at most {} advised)",
            default_client_cap(nofile)
        );
    }
    let (per_source, rate) = source_limits(cfg);
    if first {
        capacity.sources.configure(per_source, rate);
    }
    tracing::info!(
        max_client_connections = global,
        max_connections_per_source = per_source,
        max_connection_rate_per_source = rate,
        descriptor_limit = nofile,
        "client connection caps (0: off)"
    );
    global
}

/// Worker `index`'s copies of the predecessor's listening sockets.
fn inherited(predecessor: Option<&HttpServer>, index: usize) -> std::io::Result<Sockets> {
    match predecessor.and_then(|p| p.listeners.get(index)) {
        Some(socks) => socks.iter().map(|(a, l)| Ok((*a, l.try_clone()?))).collect(),
        None => Ok(Vec::new()),
    }
}

/// Waits for every worker to listen; returns their sockets by worker.
fn all_listening(
    ready: &mpsc::Receiver<std::io::Result<(usize, Sockets)>>,
    workers: usize,
) -> std::io::Result<Vec<Sockets>> {
    let mut listeners: Vec<Sockets> = (0..workers).map(|_| Vec::new()).collect();
    for _ in 0..workers {
        match ready.recv() {
            Ok(Ok((w, socks))) => listeners[w] = socks,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(std::io::Error::other("an HTTP worker died while starting")),
        }
    }
    Ok(listeners)
}

/// One worker thread: its own event loop, pools and listeners.
struct Worker {
    index: usize,
    cfg: Config,
    servers: Arc<Servers>,
    capacity: Arc<Capacity>,
    shared: Vec<VipShared>,
    stop: watch::Receiver<bool>,
    /// The global client connection cap.
    global: usize,
    ready: mpsc::Sender<std::io::Result<(usize, Sockets)>>,
    inherited: Sockets,
}

impl Worker {
    /// Runs until the listeners close and the connections drained (or the drain timeout
    /// ended); returns the connections still open.
    fn run(self) -> usize {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(self.serve()),
            Err(e) => {
                let _ = self.ready.send(Err(e));
                0
            }
        }
    }

    async fn serve(mut self) -> usize {
        let inherited = std::mem::take(&mut self.inherited);
        let vips = match self.listening(inherited) {
            Ok(v) => v,
            Err(e) => {
                let _ = self.ready.send(Err(e));
                return 0;
            }
        };
        let cfg = &self.cfg;
        let reaper =
            tokio::spawn(reap_idle(vips.iter().map(|(ctx, _)| ctx.clone()).collect(), cfg.http.pool_idle_timeout));
        let mine = Arc::new(AtomicUsize::new(0));
        let loops: Vec<_> = vips
            .into_iter()
            .map(|(ctx, l)| {
                let active = self.capacity.client_connections.clone();
                let vip = cfg.vips[ctx.vip_index].http().and_then(|h| h.max_connections);
                let caps = Caps { active, global: self.global, vip };
                tokio::spawn(accept_loop(ctx, l, self.stop.clone(), caps, mine.clone()))
            })
            .collect();
        for l in loops {
            let _ = l.await;
        }
        // Listeners closed: let this loop's connections finish.
        let deadline = Instant::now() + cfg.http.drain_timeout;
        while mine.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        reaper.abort();
        mine.load(Ordering::SeqCst)
    }

    /// Its contexts and listeners, and a duplicate of each listener sent to the starter
    /// (for a successor to take over).
    fn listening(&self, inherited: Sockets) -> std::io::Result<Vec<(Arc<VipCtx>, TcpListener)>> {
        let vips = worker_vips(&self.cfg, &self.servers, &self.capacity, &self.shared, inherited)?;
        let copies = vips
            .iter()
            .map(|(ctx, l)| {
                let v = &self.cfg.vips[ctx.vip_index];
                Ok((SocketAddr::new(v.address, v.port), duplicate(l)?))
            })
            .collect::<std::io::Result<Sockets>>()?;
        let _ = self.ready.send(Ok((self.index, copies)));
        Ok(vips)
    }
}

impl HttpServer {
    /// Starts `http.workers` event loops, each accepting on every HTTP VIP (the VIP
    /// address must be local, e.g. on `lo`), taking over `predecessor`'s listening
    /// sockets where worker and address match. Returns once all are listening.
    /// `capacity`: this generation's, handed on from the predecessor's by a reload (the
    /// caps count the connections still draining on the previous listeners).
    /// `access_log`: where requests are logged (`None`: not logged).
    pub fn start(
        cfg: &Config,
        servers: Arc<Servers>,
        capacity: Arc<Capacity>,
        predecessor: Option<&HttpServer>,
        access_log: Option<&Arc<AccessLog>>,
        ownership: Arc<Ownership>,
    ) -> std::io::Result<HttpServer> {
        let (stop, _) = watch::channel(false);
        // One route (balancing state) per VIP, shared by the workers: weights stay exact.
        let shared = vip_shared(cfg, &capacity, access_log, &ownership)?;
        let global = client_caps(cfg, &capacity, predecessor.is_none());
        let (ready_tx, ready_rx) = mpsc::channel::<std::io::Result<(usize, Sockets)>>();
        let mut workers = Vec::new();
        for index in 0..cfg.http.workers {
            let worker = Worker {
                index,
                cfg: cfg.clone(),
                servers: servers.clone(),
                capacity: capacity.clone(),
                shared: shared.clone(),
                stop: stop.subscribe(),
                global,
                ready: ready_tx.clone(),
                inherited: inherited(predecessor, index)?,
            };
            workers.push(std::thread::Builder::new().name(format!("http-{index}")).spawn(move || worker.run())?);
        }
        drop(ready_tx);
        let listeners = match all_listening(&ready_rx, cfg.http.workers) {
            Ok(l) => l,
            Err(e) => {
                let _ = stop.send(true);
                return Err(e);
            }
        };
        for v in cfg.vips.iter().filter(|v| v.serves_http()) {
            tracing::info!(addr = %SocketAddr::new(v.address, v.port), workers = cfg.http.workers, "HTTP VIP listening");
        }
        // Served from now on: status and metrics show these certificates.
        for t in shared.iter().filter_map(|s| s.tls.as_ref()) {
            t.publish();
        }
        Ok(HttpServer { stop, workers, listeners })
    }

    /// Stops accepting and waits for the workers; returns the connections still open
    /// when the drain timeout ended.
    pub fn shutdown(self) -> usize {
        let _ = self.stop.send(true);
        self.workers.into_iter().map(|w| w.join().unwrap_or(0)).sum()
    }
}
