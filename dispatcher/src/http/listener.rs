//! Accepting on the HTTP VIPs: one event loop per worker thread (a current-thread tokio
//! runtime), each with its own `SO_REUSEPORT` listener per VIP and its own upstream
//! pools, as HAProxy and nginx run — measured against a work-stealing runtime on this
//! machine, it gave more requests/s and a lower p99 (the current figures: docs/benchmarks.md, HTTP).
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
    route::{FarmCtx, FarmRoute, RouteCtx, VipRoutes},
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

/// A VIP's listening socket (`SO_REUSEPORT`: a reload's listeners bind beside the old
/// ones); the SIP VIPs over TCP and TLS use it too.
pub fn bind(v: &Vip) -> std::io::Result<TcpListener> {
    let addr = SocketAddr::new(v.address, v.port);
    let kind = if v.sip_stream().is_some() { "SIP" } else { "HTTP" };
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket
        .bind(addr)
        .map_err(|e| std::io::Error::new(e.kind(), format!("binding {kind} VIP {} on {addr}: {e}", v.name)))?;
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

/// What every worker shares of one HTTP VIP: its routes (and their farms' balancing
/// state) and its TLS, both ways.
#[derive(Clone)]
struct VipShared {
    routes: Arc<VipRoutes>,
    /// Per backend (indexed like `Config::backends`): the port its routes reach it on.
    ports: Vec<Option<u16>>,
    tls: Option<Arc<ServerTls>>,
    /// Per backend (indexed like `Config::backends`), for a VIP with `backend_tls`.
    backend_tls: Vec<Option<Arc<BackendTls>>>,
    /// Where its requests are logged (`[access_log]`).
    log: Option<super::proxy::LogTo>,
    /// Whether this dispatcher keeps a connection after its response (steering, leave).
    ownership: Arc<Ownership>,
    /// Connection takeover (registering plain HTTP/1.x connections, adopting rebuilt ones).
    takeover: Option<crate::takeover::Http>,
}

/// A farm's balancing state: its servers, its backups, each one's `slow_start` (its own,
/// else the farm's).
fn farm_route(cfg: &Config, f: &crate::config::Farm) -> FarmRoute {
    let route = FarmRoute::new(f.servers.clone(), f.balance, f.fail_back).with_backups(&f.backup_servers);
    let slow = route.members.iter().map(|&b| cfg.backends[b].slow_start.or(f.slow_start)).collect();
    route.with_slow_start(slow)
}

/// Each farm's request path state, indexed like `Config::farms`.
fn farms(cfg: &Config, capacity: &Capacity) -> Vec<Arc<FarmCtx>> {
    (cfg.farms.iter().enumerate())
        .map(|(i, f)| {
            let settings = crate::config::HttpSettings {
                connect_timeout: f.connect_timeout.unwrap_or(cfg.http.connect_timeout),
                server_timeout: f.io_timeout.unwrap_or(cfg.http.server_timeout),
                ..cfg.http.clone()
            };
            Arc::new(FarmCtx {
                name: Arc::from(f.name.as_str()),
                implicit: f.implicit,
                route: farm_route(cfg, f),
                session_format: f.session_format,
                settings: Arc::new(settings),
                stats: capacity.farms.get(i).map(|k| k.stats.clone()).unwrap_or_default(),
            })
        })
        .collect()
}

/// The routes that apply to HTTP VIP `vip`, in `Config::routes` order.
fn vip_routes(cfg: &Config, capacity: &Capacity, farms: &[Arc<FarmCtx>], vip: usize) -> Result<VipRoutes, String> {
    let mut list = Vec::new();
    let mut patterns = Vec::new();
    for (index, r) in cfg.routes.iter().enumerate().filter(|(_, r)| r.vips.contains(&vip)) {
        let farm = farms.get(r.farm).ok_or_else(|| format!("route {index} names no farm"))?.clone();
        // An implicit farm's route reads the session as the VIP always did: by `[http]`'s
        // names.
        let (cookie, url_parameter) = match farm.implicit {
            true => (cfg.http.cookie_name.as_str(), cfg.http.url_parameter.as_str()),
            false => (r.cookie.as_str(), r.url_parameter.as_str()),
        };
        list.push(RouteCtx {
            index,
            label: (!farm.implicit).then(|| Arc::from(r.name.as_str())),
            farm,
            cookie: cookie.as_bytes().into(),
            url_parameter: url_parameter.as_bytes().into(),
            stats: capacity.routes.get(index).map(|k| k.stats.clone()).unwrap_or_default(),
        });
        patterns.push((r.hosts.clone(), r.uris.clone()));
    }
    VipRoutes::new(list, &patterns)
}

/// The port each backend the routes of a VIP reach is reached on (`None`: not reached):
/// its own, else its farm's, else the VIP's `backend_port`.
fn reached(cfg: &Config, routes: &VipRoutes, backend_port: u16) -> Vec<Option<u16>> {
    let mut ports = vec![None; cfg.backends.len()];
    for r in routes.routes() {
        let farm = &cfg.farms[cfg.routes[r.index].farm];
        let n = ports.len();
        for b in farm.members().filter(|&b| b < n) {
            ports[b] = Some(farm.port_of(&cfg.backends[b], backend_port));
        }
    }
    ports
}

/// Reads the TLS files of every HTTP VIP (once, before any worker starts): an error
/// names the VIP and the file, and nothing starts.
fn vip_shared(
    cfg: &Config,
    capacity: &Capacity,
    access_log: Option<&Arc<AccessLog>>,
    ownership: &Arc<Ownership>,
    takeover: Option<&crate::takeover::Http>,
) -> std::io::Result<Vec<VipShared>> {
    let backend_names: Arc<[Arc<str>]> = cfg.backends.iter().map(|b| Arc::from(b.name.as_str())).collect();
    let handshakes = capacity.tls_handshakes.1.clone();
    let fail = |v: &Vip, e: anyhow::Error| std::io::Error::other(format!("VIP {}: {e:#}", v.name));
    let farms = farms(cfg, capacity);
    let mut out = Vec::new();
    for (i, v, h) in cfg.vips.iter().enumerate().filter_map(|(i, v)| Some((i, v, v.served_http()?))) {
        let routes = vip_routes(cfg, capacity, &farms, i).map_err(|e| fail(v, anyhow::anyhow!(e)))?;
        let ports = reached(cfg, &routes, h.backend_port);
        let tls = match &h.tls {
            Some(t) => Some(Arc::new(
                ServerTls::load(t, h.http2, &cfg.http, handshakes.clone(), capacity.vips[i].tls.clone())
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
                        ports[b].map(|_| Arc::new(BackendTls::new(client.clone(), f, address)))
                    })
                    .collect()
            }
            None => vec![None; cfg.backends.len()],
        };
        out.push(VipShared {
            routes: Arc::new(routes),
            ports,
            tls,
            backend_tls,
            log: access_log.map(|sink| super::proxy::LogTo {
                sink: sink.clone(),
                vip: Arc::from(v.name.as_str()),
                backends: backend_names.clone(),
            }),
            ownership: ownership.clone(),
            takeover: takeover.cloned(),
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
        // Each backend's timeouts are its farm's (a backend is in one farm at most).
        let mut settings: Vec<&crate::config::HttpSettings> = vec![&cfg.http; cfg.backends.len()];
        for r in sh.routes.routes() {
            for &b in &r.farm.route.members {
                settings[b] = &r.farm.settings;
            }
        }
        let pools = (0..cfg.backends.len())
            .map(|b| {
                sh.ports[b].map(|port| {
                    let addr = SocketAddr::new(cfg.backends[b].address.into(), port);
                    let be = &servers.backends[b];
                    let budget = capacity.idle_budget.clone();
                    let tls = sh.backend_tls[b].clone();
                    Pool::new(addr, settings[b], be.connections.clone(), be.conn_limit.clone(), budget, tls)
                })
            })
            .collect();
        let ctx = Arc::new(VipCtx {
            name: Arc::from(v.name.as_str()),
            host: crate::http1::rewrite::vip_authority(SocketAddr::new(v.address, v.port)),
            vip_index,
            port: v.port,
            routes: sh.routes.clone(),
            pools,
            servers: servers.clone(),
            capacity: capacity.clone(),
            settings: cfg.http.clone(),
            limits: HeadLimits { max_bytes: cfg.http.max_header_bytes, max_headers: cfg.http.max_headers },
            suspect_on_status: cfg.health.suspect_on_status.clone(),
            tls: sh.tls.clone(),
            forwarded: crate::http1::rewrite::forwarded_fields(h.tls.is_some(), v.port),
            redirect: h.redirect_to.clone(),
            log: sh.log.clone(),
            ownership: sh.ownership.clone(),
            takeover: sh.takeover.clone(),
            address: v.address,
            h2c: h.h2c,
            persist: h.insert_cookie.as_ref().map(|name| {
                // The backends its routes reach (an implicit farm's: the VIP's own).
                let reached = (0..cfg.backends.len()).filter(|&b| sh.ports[b].is_some());
                let members = reached.map(|b| (b, cfg.backends[b].name.clone()));
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
    // Connections of a dead dispatcher rebuilt here (`takeover`) come in beside the
    // accepted ones.
    let mut adopted = ctx.takeover.as_ref().map(|t| t.adoption.listen(SocketAddr::new(ctx.address, ctx.port)));
    loop {
        let next_adopted = async {
            match adopted.as_mut() {
                Some(a) => a.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, peer)) => admit(&ctx, &caps, &mine, &stop, stream, peer),
                Err(e) => {
                    // Out of descriptors and the like: back off, keep serving, log once
                    // per interval with a count.
                    if e.raw_os_error().is_some_and(crate::http1::io::is_local_errno) {
                        ctx.servers.counters.local_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    crate::ratelimit::warn("accept", &e);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(sock) = next_adopted => {
                let adopted = sock.set_nonblocking(true).and_then(|_| {
                    let peer = sock.peer_addr()?;
                    Ok((tokio::net::TcpStream::from_std(sock)?, peer))
                });
                match adopted {
                    Ok((stream, peer)) => admit(&ctx, &caps, &mine, &stop, stream, peer),
                    Err(e) => crate::ratelimit::warn("adopting a taken-over connection", &e),
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// A new client connection: counted against the caps, then served on a task of its own
/// (or answered and closed when over a cap).
fn admit(
    ctx: &Arc<VipCtx>,
    caps: &Caps,
    mine: &Arc<AtomicUsize>,
    stop: &watch::Receiver<bool>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
) {
    let counters = &ctx.servers.counters;
    let vip_conns = &ctx.capacity.vips[ctx.vip_index].connections;
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
            return;
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
        takeover: Option<crate::takeover::Http>,
    ) -> std::io::Result<HttpServer> {
        let (stop, _) = watch::channel(false);
        // One balancing state per farm, shared by the VIPs and workers: weights stay exact.
        let shared = vip_shared(cfg, &capacity, access_log, &ownership, takeover.as_ref())?;
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

#[cfg(test)]
mod tests {
    //! The request path with farms and routes, end to end on loopback: a VIP whose two
    //! routes lead to two farms, in front of backends that answer with their name and set
    //! a session cookie.

    use super::*;
    use crate::config::{Balance, Farm, Route, SessionFormat};
    use dispatcher_common::{Health, Operator};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpStream,
    };

    const CFG: &str = r#"
[dispatcher]
interface = "eth0"
[[backend]]
name = "s1"
address = "10.0.0.1"
clone_ids = ["c1"]
replica = "s2"
[[backend]]
name = "s2"
address = "10.0.0.2"
clone_ids = ["c2"]
replica = "s1"
[[backend]]
name = "a1"
address = "10.0.0.3"
clone_ids = ["ca1"]
[[backend]]
name = "bk"
address = "10.0.0.4"
clone_ids = ["cbk"]
[[vip]]
name = "web"
address = "10.0.100.1"
port = 80
mode = "http"
backends = ["s1"]
"#;

    /// A backend answering every request with its name, and `Set-Cookie: COOKIE=...:learned-NAME`
    /// (and an `OTHER` cookie, never learned).
    async fn backend(name: &'static str, cookie: &'static str) -> u16 {
        answering(move |_head| {
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nSet-Cookie: {cookie}=0000zz:learned-{name}; Path=/\r\nSet-Cookie: OTHER=0000zz:other-{name}\r\n\r\n{name}",
                name.len()
            )
        })
        .await
    }

    /// A backend on loopback answering each bodiless request with `answer(its head)`;
    /// its port.
    pub(super) async fn answering(answer: impl Fn(&str) -> String + Copy + Send + 'static) -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                        buf.drain(..end);
                        if s.write_all(answer(&head).as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    /// Status and body of `GET path` (with a `Cookie` header when given).
    async fn get(addr: SocketAddr, path: &str, cookie: Option<&str>) -> (u16, String) {
        let exchange = async {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let cookie = cookie.map(|c| format!("Cookie: {c}\r\n")).unwrap_or_default();
            let head = format!("GET {path} HTTP/1.1\r\nHost: shop.example\r\n{cookie}Connection: close\r\n\r\n");
            s.write_all(head.as_bytes()).await.unwrap();
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.unwrap();
            String::from_utf8_lossy(&out).into_owned()
        };
        let text = tokio::time::timeout(Duration::from_secs(10), exchange).await.expect("answered in time");
        let status = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
    }

    fn farm(name: &str, servers: Vec<usize>, backup_servers: Vec<usize>) -> Farm {
        Farm {
            name: name.into(),
            servers,
            backup_servers,
            balance: Balance::RoundRobin,
            port: None,
            fail_back: true,
            session_format: SessionFormat::WebSphere,
            slow_start: None,
            connect_timeout: Some(Duration::from_secs(2)),
            io_timeout: None,
            implicit: false,
        }
    }

    fn route(uri: &str, farm: usize, cookie: &str) -> Route {
        Route {
            name: format!("{}{farm}", uri.trim_matches(|c| c == '/' || c == '*')),
            vips: vec![0],
            hosts: vec!["*:*".into()],
            uris: vec![uri.into()],
            farm,
            cookie: cookie.into(),
            url_parameter: cookie.to_ascii_lowercase(),
        }
    }

    #[tokio::test]
    async fn each_route_reaches_its_farm_with_its_own_cookie_and_no_route_is_a_counted_404() {
        let mut cfg = Config::parse(CFG, "t").unwrap();
        let names = [("s1", "SHOPID"), ("s2", "SHOPID"), ("a1", "JSESSIONID"), ("bk", "SHOPID")];
        for (b, (name, cookie)) in cfg.backends.iter_mut().zip(names) {
            b.address = std::net::Ipv4Addr::LOCALHOST;
            b.port = Some(backend(name, cookie).await);
        }
        cfg.vips[0].address = std::net::Ipv4Addr::LOCALHOST.into();
        cfg.vips[0].port = 0;
        // shop: s1 and s2 (replicas of each other), bk their backup; admin: a1.
        cfg.farms = vec![farm("shop", vec![0, 1], vec![3]), farm("admin", vec![2], vec![])];
        cfg.routes = vec![route("/shop/*", 0, "SHOPID"), route("/admin/*", 1, "JSESSIONID")];
        let servers = Arc::new(Servers::new(&cfg, &[Health::Up; 4], &[Operator::None; 4], None));
        let capacity = Arc::new(Capacity::new(&cfg));
        let shared = vip_shared(&cfg, &capacity, None, &Arc::new(Ownership::default()), None).unwrap();
        let (ctx, listener) = worker_vips(&cfg, &servers, &capacity, &shared, Vec::new()).unwrap().remove(0);
        let addr = listener.local_addr().unwrap();
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                tokio::spawn(serve(ctx.clone(), stream, peer, stop.clone()));
            }
        });

        // Each route to its farm; balanced over the primaries only (the backup is up).
        let mut shop = Vec::new();
        for _ in 0..4 {
            let (status, body) = get(addr, "/shop/cart", None).await;
            assert_eq!(status, 200);
            shop.push(body);
        }
        shop.sort();
        assert_eq!(shop, ["s1", "s1", "s2", "s2"], "round robin over the primaries, never the backup");
        assert_eq!(get(addr, "/admin/users", None).await, (200, "a1".to_string()));

        // No route: 404 with a short body, counted globally and on the VIP.
        let (status, body) = get(addr, "/elsewhere", None).await;
        assert_eq!(status, 404);
        assert!(body.contains("no route"), "{body}");
        assert_eq!(servers.counters.no_route.load(Ordering::Relaxed), 1);
        assert_eq!(capacity.vips[0].no_route.load(Ordering::Relaxed), 1);

        // The route's cookie names the session; another cookie name is not read.
        for _ in 0..3 {
            assert_eq!(get(addr, "/shop/cart", Some("SHOPID=0000abc:c2")).await.1, "s2");
        }
        let mut by_jsessionid = Vec::new();
        for _ in 0..4 {
            by_jsessionid.push(get(addr, "/shop/cart", Some("JSESSIONID=0000abc:c2")).await.1);
        }
        assert!(by_jsessionid.iter().any(|b| b == "s1"), "JSESSIONID is not the shop's cookie: {by_jsessionid:?}");
        assert_eq!(get(addr, "/shop/cart;shopid=0000abc:c1", None).await.1, "s1", "the route's URL parameter");

        // Learned from the route's own cookie only.
        assert_eq!(servers.owner(b"learned-s1"), Some((0, Some(1))));
        assert_eq!(servers.owner(b"learned-a1").map(|o| o.0), Some(2));
        assert_eq!(servers.owner(b"other-s1"), None, "not the route's cookie");

        // A session of the shop farm on the admin route: balanced within admin, never
        // followed out of it, and no misroute.
        for _ in 0..3 {
            assert_eq!(get(addr, "/admin/users", Some("JSESSIONID=0000abc:c1")).await.1, "a1");
        }
        assert_eq!(servers.counters.misroutes.load(Ordering::Relaxed), 0);

        // A session the backup owns goes to it while it serves; new sessions go to the
        // backup only once no primary is up.
        assert_eq!(get(addr, "/shop/cart", Some("SHOPID=0000abc:cbk")).await.1, "bk");
        servers.set_health(0, Health::Down);
        assert_eq!(get(addr, "/shop/cart", None).await.1, "s2", "one primary up: no backup");
        servers.set_health(1, Health::Down);
        for _ in 0..3 {
            assert_eq!(get(addr, "/shop/cart", None).await.1, "bk", "every primary down: the backup");
        }
        servers.set_health(0, Health::Up);
        assert_eq!(get(addr, "/shop/cart", None).await.1, "s1", "a primary back: the backup is left");

        // Per farm and per route counters; the 404 counted on neither.
        let shop_stats = &capacity.farms[0].stats;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!(load(&shop_stats.requests), 4 + 3 + 4 + 1 + 1 + 1 + 3 + 1);
        assert_eq!(load(&capacity.routes[0].stats.requests), load(&shop_stats.requests));
        assert_eq!(load(&shop_stats.affinity_hits), 3 + 1 + 1, "c2 three times, c1 by URL, cbk");
        assert_eq!(load(&capacity.farms[1].stats.requests), 1 + 3);
        assert_eq!(load(&capacity.farms[1].stats.balanced), 1 + 3);
        assert_eq!(load(&shop_stats.misroutes) + load(&capacity.farms[1].stats.misroutes), 0);

        // Each status a client got, by class, on the VIP (the dispatcher's own 404
        // included); the backends' own on each backend.
        let classes = |r: &crate::metrics::StatusClasses| r.counts().filter(|(_, n)| *n > 0).collect::<Vec<_>>();
        assert_eq!(classes(&capacity.vips[0].responses), [("2xx", 22), ("4xx", 1)]);
        let backends: Vec<_> = servers.backends.iter().flat_map(|b| classes(&b.responses)).collect();
        assert!(backends.iter().all(|(c, _)| *c == "2xx"), "{backends:?}");
        assert_eq!(backends.iter().map(|(_, n)| n).sum::<u64>(), 22, "the 404 was the dispatcher's own");
    }
}

#[cfg(test)]
mod h2_tests {
    //! HTTP/2 by prior knowledge on loopback: each stream of one connection follows its
    //! own session, as an HTTP/1.1 request would.

    use super::*;
    use crate::{config::Config, http::Protocol};
    use dispatcher_common::{Health, Operator};

    const CFG: &str = r#"
[dispatcher]
interface = "eth0"
[[backend]]
name = "s1"
address = "10.0.0.1"
clone_ids = ["c1"]
replica = "s2"
[[backend]]
name = "s2"
address = "10.0.0.2"
clone_ids = ["c2"]
replica = "s1"
[[vip]]
name = "web"
address = "10.0.100.1"
port = 80
mode = "http"
backends = ["s1", "s2"]
h2c = true
"#;

    /// A backend answering with its name and the request head it got.
    async fn backend(name: &'static str) -> u16 {
        super::tests::answering(move |head| {
            let body = format!("{name}\n{head}");
            format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len())
        })
        .await
    }

    #[tokio::test]
    async fn streams_of_one_connection_follow_their_own_sessions() {
        let mut cfg = Config::parse(CFG, "t").unwrap();
        for (b, name) in cfg.backends.iter_mut().zip(["s1", "s2"]) {
            b.address = std::net::Ipv4Addr::LOCALHOST;
            b.port = Some(backend(name).await);
        }
        cfg.vips[0].address = std::net::Ipv4Addr::LOCALHOST.into();
        cfg.vips[0].port = 0;
        let servers = Arc::new(Servers::new(&cfg, &[Health::Up; 2], &[Operator::None; 2], None));
        let capacity = Arc::new(Capacity::new(&cfg));
        let shared = vip_shared(&cfg, &capacity, None, &Arc::new(Ownership::default()), None).unwrap();
        let (ctx, listener) = worker_vips(&cfg, &servers, &capacity, &shared, Vec::new()).unwrap().remove(0);
        let addr = listener.local_addr().unwrap();
        let (_stop_tx, stop) = watch::channel(false);
        tokio::spawn(async move {
            while let Ok((stream, peer)) = listener.accept().await {
                tokio::spawn(serve(ctx.clone(), stream, peer, stop.clone()));
            }
        });

        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (client, conn) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(conn);
        let ask = |cookies: &'static [&'static str]| {
            let mut client = client.clone();
            async move {
                let mut req = http::Request::builder().uri("http://shop.example/cart");
                for c in cookies {
                    req = req.header("cookie", *c);
                }
                client = client.ready().await.unwrap();
                let (res, _) = client.send_request(req.body(()).unwrap(), true).unwrap();
                let res = res.await.unwrap();
                let status = res.status().as_u16();
                let mut body = res.into_body();
                let mut text = Vec::new();
                while let Some(d) = body.data().await {
                    let d = d.unwrap();
                    let _ = body.flow_control().release_capacity(d.len());
                    text.extend_from_slice(&d);
                }
                (status, String::from_utf8(text).unwrap())
            }
        };
        // Two sessions on one connection, at once; the first with its cookie split into
        // two fields, as HTTP/2 clients send them.
        for _ in 0..3 {
            let ((st1, b1), (st2, b2)) = tokio::join!(
                ask(&["theme=dark", "JSESSIONID=0000aaaa:c1"]),
                ask(&["JSESSIONID=0000bbbb:c2; theme=light"])
            );
            assert_eq!((st1, st2), (200, 200));
            assert!(b1.starts_with("s1\nGET /cart HTTP/1.1\r\n"), "{b1}");
            assert!(b1.contains("Cookie: theme=dark; JSESSIONID=0000aaaa:c1\r\n"), "{b1}");
            assert!(b1.contains("Host: shop.example\r\n"), "{b1}");
            assert!(b2.starts_with("s2\n"), "{b2}");
        }
        let counters = &servers.counters;
        assert_eq!(counters.requests_by_protocol[Protocol::H2 as usize].load(Ordering::Relaxed), 6);
        assert_eq!(counters.connections_by_protocol[Protocol::H2 as usize].load(Ordering::Relaxed), 1);
        assert_eq!(counters.misroutes.load(Ordering::Relaxed), 0);
        // Every stream's task ends with its exchange (each held ~10 KiB forever when the
        // proxy was never told its client was gone).
        let ended = async {
            while counters.h2_streams_in_flight.load(Ordering::Relaxed) != 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), ended).await.expect("no stream task left");
    }
}
