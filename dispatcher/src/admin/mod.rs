//! The admin endpoint: HTTP/1.1 on a Unix socket (`dispatcher.admin_socket`, mode 0600),
//! and, only if configured, on a TCP address (`dispatcher.admin_address`, for Prometheus).
//!
//! - `GET /metrics`: Prometheus text exposition (XDP counters, requests and latency per
//!   VIP and backend, health, holds, retries, failovers, misroutes).
//! - `GET /status`: the agent's view as JSON (`dispatcher status` merges it with the maps);
//!   `?format=csv`: the status table as CSV (`csv`).
//! - `GET /` (or `/status.html`): the status page, an HTML view of `/status` that polls it
//!   (`page`), served to whoever may read `/status`.
//! - `POST /backends/NAME/drain|disable|enable`: operator commands;
//!   `.../weight?value=N`, `.../maxconn?value=N|none`, `.../disable-checks|enable-checks`:
//!   runtime settings until the next reload (`settings`).
//! - `POST /counters/clear` (`?all=true`: the XDP counters too): counters to zero.
//! - `GET /errors`: the last requests refused as malformed (`refusals`; client data:
//!   operators only).
//! - `GET /clones`, `POST /clones/delete?id=ID`: the clone table listed, a learned entry
//!   forgotten (`clones`).
//! - `POST /reload`: re-read the configuration file.
//! - `POST /stop` (`?detach=true`): the agent exits, leaving (or removing) the data plane.
//!
//! Who may ask (`allowed`): commands only over the Unix socket, from root or the agent's
//! own user; on TCP a loopback peer may read `/metrics`, `/status` and the page, any other peer (and
//! any other user on the socket) only `/metrics`; the status and the page only when the
//! `Host` is an address or localhost (`rebinding`). The socket and TCP have separate
//! connection budgets, so that scrapers can never lock the operator out.

pub mod client;
pub mod clones;
pub mod csv;
mod page;
mod process;
pub mod settings;
pub mod views;

use std::{
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};

use crate::api::{to_json, ClearReply, CommandReply, ErrorReply, MembershipReply, ReloadReply, StopReply};
use crate::http1::{
    body::{HeadError, Inbound, RelayError},
    closing_answer,
    head::{parse_request, HeadLimits},
};
use crate::{
    config::Config,
    control::{AdminCommand, Order},
    dataplane::tables::Tables,
    state::Servers,
};
use dispatcher_common::Operator;

pub struct Admin {
    pub live: std::sync::RwLock<Live>,
    /// What is missing of the agent's pins and could not be pinned again (empty: all
    /// there). The data plane would go with the agent on exit.
    pub pins_missing: Mutex<Vec<&'static str>>,
    pub tables: Arc<Mutex<Tables>>,
    pub requests: mpsc::UnboundedSender<AgentRequest>,
    pub started: Instant,
    /// `[cluster]`: the link to the shared store.
    pub shared: Option<crate::shared::Observer>,
    /// `[cluster]` with steering.
    pub steering: Option<Arc<crate::steering::Steering>>,
    /// Connection takeover (with steering and `[cluster] takeover`).
    pub takeover: Option<Arc<crate::takeover::Takeover>>,
    /// `[announce]`: announced now.
    pub announced: Mutex<Option<bool>>,
}

impl Admin {
    fn current(&self) -> (Arc<Config>, Arc<Servers>, mpsc::UnboundedSender<AdminCommand>) {
        let l = self.live.read().unwrap();
        (l.cfg.clone(), l.servers.clone(), l.commands.clone())
    }

    fn capacity(&self) -> Arc<crate::capacity::Capacity> {
        self.live.read().unwrap().capacity.clone()
    }
}

/// What a reload replaces.
pub struct Live {
    pub cfg: Arc<Config>,
    pub servers: Arc<Servers>,
    /// The request path's capacity and per-VIP counts (`capacity::Capacity`).
    pub capacity: Arc<crate::capacity::Capacity>,
    pub commands: mpsc::UnboundedSender<AdminCommand>,
}

/// A reload request: the reply says what changed, or why nothing did.
pub type ReloadRequest = oneshot::Sender<Result<(String, Vec<String>), String>>;

/// What only the agent's main loop can do: the endpoint asks, the agent (`agent::run`)
/// answers.
pub enum AgentRequest {
    Reload(ReloadRequest),
    /// Exit; `detach`: also detach the program and unpin the maps.
    Stop {
        detach: bool,
    },
    /// `dispatcher join` (true) / `leave` (false): answered with what was done.
    Membership(bool, tokio::sync::oneshot::Sender<Result<String, String>>),
}

/// Who a client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Root or the agent's user on the Unix socket: may command.
    Operator,
    /// A loopback peer on TCP: may read metrics and status.
    LocalReader,
    /// Anybody else (another host on TCP, another user on the socket): metrics only.
    Remote,
}

/// A TCP peer on loopback (IPv4, IPv6 or IPv4-mapped) may read the status; no TCP peer
/// may command (any local user can open a loopback connection).
pub fn tcp_peer(addr: SocketAddr) -> Peer {
    let ip = match addr.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(addr.ip()),
        ip => ip,
    };
    if ip.is_loopback() {
        Peer::LocalReader
    } else {
        Peer::Remote
    }
}

/// A socket peer is an operator when it runs as root or as the agent's user. (The socket
/// is 0600, so others reach it only if an operator widened its mode or directory.)
fn unix_peer(s: &UnixStream) -> Peer {
    match s.peer_cred() {
        Ok(c) if c.uid() == 0 || c.uid() == nix::unistd::geteuid().as_raw() => Peer::Operator,
        _ => Peer::Remote,
    }
}

/// Operators may do anything; local readers may read; others may only read the metrics.
pub fn allowed(peer: Peer, method: &str, path: &str) -> bool {
    match peer {
        Peer::Operator => true,
        Peer::LocalReader => method == "GET" && matches!(path, "/metrics" | "/status" | "/" | "/status.html"),
        Peer::Remote => method == "GET" && path == "/metrics",
    }
}

/// Why a loopback reader's request for the status or the page is refused, if it is: its
/// `Host` is a name. A browser sends the name of the site it believes it talks to; a page
/// of another site whose name was made to resolve to 127.0.0.1 (DNS rebinding) would
/// otherwise read the status as its own. Addresses and `localhost` cannot be rebound.
/// `/metrics` takes any Host: Prometheus may scrape by name.
fn rebinding(peer: Peer, target: &str, host: Option<&str>) -> Option<String> {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    let host = host?;
    if peer != Peer::LocalReader || !matches!(path, "/status" | "/" | "/status.html") || host_is_local_literal(host) {
        return None;
    }
    Some(format!(
        "Host {host:?} is a name: the status and the status page are served over TCP to Host 127.0.0.1, [::1], localhost or another address only (a name could be another site's, rebound to this host by DNS rebinding); browse http://127.0.0.1:PORT/"
    ))
}

/// An IP address or `localhost`, with or without a port.
fn host_is_local_literal(host: &str) -> bool {
    let port_ok = |p: &str| p.is_empty() || p.strip_prefix(':').is_some_and(|d| d.parse::<u16>().is_ok());
    if let Some(rest) = host.strip_prefix('[') {
        return rest
            .split_once(']')
            .is_some_and(|(ip, port)| ip.parse::<std::net::Ipv6Addr>().is_ok() && port_ok(port));
    }
    let (name, port) = host.find(':').map_or((host, ""), |i| host.split_at(i));
    (name.parse::<std::net::Ipv4Addr>().is_ok() || name.eq_ignore_ascii_case("localhost")) && port_ok(port)
}

/// May the agent bind its socket at `path`? Nothing there, or a stale socket (removed
/// here: no process listens on it, the connection is refused). Anything else is refused:
/// a file that is not a socket is someone else's, a socket that answers is another
/// agent's.
pub fn claim_socket_path(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(std::io::Error::other(format!(
            "{} exists and is not a socket: refusing to replace it (set dispatcher.admin_socket to a free path)",
            path.display()
        )));
    }
    // A connect to a live listener completes at once (or waits while its backlog is
    // full: that is a live listener too), so it is bounded here.
    let (tx, rx) = std::sync::mpsc::channel();
    let probe = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(std::os::unix::net::UnixStream::connect(&probe).map(drop));
    });
    let in_use = || {
        std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!(
                "{} is in use by another agent (a process listens on it): stop it, or give this configuration another dispatcher.admin_socket",
                path.display()
            ),
        )
    };
    match rx.recv_timeout(std::time::Duration::from_secs(1)) {
        Ok(Ok(())) | Err(_) => Err(in_use()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            // Stale: left by an agent that died.
            std::fs::remove_file(path).or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(Err(e)) => Err(std::io::Error::new(e.kind(), format!("probing {}: {e}", path.display()))),
    }
}

/// Binds the socket (replacing a stale one, never a live one or another kind of file),
/// owner-only permissions.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    claim_socket_path(path)?;
    let l = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Admin connections served at once on TCP, and on the Unix socket (a scraper or a
/// script never needs many, and a flood of them must not take the agent's descriptors).
/// Separate budgets: TCP clients cannot take the operator's slots.
const MAX_ADMIN_CONNECTIONS: usize = 64;
const MAX_SOCKET_CONNECTIONS: usize = 32;
/// From the accept to the end of the request head: an idle connection is closed then.
pub const HEAD_TIME: Duration = Duration::from_secs(2);
/// From the accept to the end of the answer.
const REQUEST_TIME: Duration = Duration::from_secs(10);

/// A connection still waiting for its request head: its id, and how to close it.
type Waiting = (u64, Arc<tokio::sync::Notify>);

/// One budget of connections. When every slot is taken, a new connection closes the
/// oldest one that has not yet sent a whole request head and takes its slot: idle
/// connections can never lock a request out. Connections busy with a request are never
/// closed for a newcomer; if all are busy, the newcomer is closed.
struct Slots {
    sem: Arc<tokio::sync::Semaphore>,
    /// Connections still waiting for their request head, oldest first: (id, how to close it).
    waiting: Mutex<(u64, std::collections::VecDeque<Waiting>)>,
}

impl Slots {
    fn new(n: usize) -> Arc<Slots> {
        Arc::new(Slots { sem: Arc::new(tokio::sync::Semaphore::new(n)), waiting: Mutex::new((0, Default::default())) })
    }

    /// Records a connection that waits for its head.
    fn waiting(&self) -> (u64, Arc<tokio::sync::Notify>) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.0 += 1;
        let entry = (w.0, Arc::new(tokio::sync::Notify::new()));
        w.1.push_back(entry.clone());
        entry
    }

    fn done_waiting(&self, id: u64) {
        let mut w = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        w.1.retain(|(i, _)| *i != id);
    }

    /// Tells the oldest connection still waiting for its head to close; false if none.
    fn close_oldest_waiting(&self) -> bool {
        let oldest = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).1.pop_front();
        oldest.map(|(_, kick)| kick.notify_one()).is_some()
    }
}

/// Serves the socket, and the TCP listener if there is one, until aborted.
pub async fn serve(admin: Arc<Admin>, unix: UnixListener, tcp: Option<TcpListener>) {
    let tcp_slots = Slots::new(MAX_ADMIN_CONNECTIONS);
    let slots = Slots::new(MAX_SOCKET_CONNECTIONS);
    let tcp_loop = {
        let (admin, slots) = (admin.clone(), tcp_slots);
        async move {
            let Some(tcp) = tcp else { return std::future::pending().await };
            loop {
                let Ok((stream, addr)) = tcp.accept().await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                spawn_handler(&admin, &slots, stream, tcp_peer(addr));
            }
        }
    };
    let unix_loop = async move {
        loop {
            let Ok((stream, _)) = unix.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let peer = unix_peer(&stream);
            spawn_handler(&admin, &slots, stream, peer);
        }
    };
    tokio::join!(tcp_loop, unix_loop);
}

fn spawn_handler<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
    admin: &Arc<Admin>,
    slots: &Arc<Slots>,
    mut stream: S,
    peer: Peer,
) {
    let slot = match slots.sem.clone().try_acquire_owned() {
        Ok(slot) => Some(slot),
        // The slot of the oldest idle connection, once it has closed.
        Err(_) if slots.close_oldest_waiting() => None,
        Err(_) => {
            crate::ratelimit::warn(
                "admin connection (too many requests at once); accepting",
                &format_args!("{peer:?}"),
            );
            return;
        }
    };
    // Recorded now, not when its task first runs: a burst of accepts must find the
    // connections accepted just before it.
    let (id, kick) = slots.waiting();
    let (admin, slots) = (admin.clone(), slots.clone());
    tokio::spawn(async move {
        let _slot = match slot {
            Some(slot) => slot,
            None => {
                let freed = tokio::select! {
                    r = tokio::time::timeout(Duration::from_secs(1), slots.sem.clone().acquire_owned()) => r,
                    _ = kick.notified() => return,
                };
                match freed {
                    Ok(Ok(slot)) => slot,
                    _ => return slots.done_waiting(id),
                }
            }
        };
        let _ = tokio::time::timeout(REQUEST_TIME, async {
            let head = tokio::select! {
                r = tokio::time::timeout(HEAD_TIME, read_request(&mut stream)) => r,
                _ = kick.notified() => return Ok(()),
            };
            slots.done_waiting(id);
            match head {
                Ok(head) => handle(&admin, stream, peer, head?).await,
                Err(_) => Ok(()),
            }
        })
        .await;
    });
}

/// The request heads the endpoint reads: at most 8 KiB and 32 header fields.
const ADMIN_LIMITS: HeadLimits = HeadLimits { max_bytes: 8 * 1024, max_headers: 32 };

/// One request head, as far as the endpoint cares.
#[derive(Debug, PartialEq)]
enum Request {
    Head {
        method: String,
        target: String,
        /// The `Host` field, when there is one.
        host: Option<String>,
    },
    /// Refused by the codec's head parser (within `ADMIN_LIMITS`): answered 400.
    Malformed,
    /// The client closed before sending a whole head.
    Gone,
}

/// Reads one request head by the codec's parser; each read waits at most `HEAD_TIME`
/// (the caller bounds the whole head by it too).
async fn read_request<S: AsyncRead + Unpin>(s: &mut S) -> std::io::Result<Request> {
    let mut from = Inbound::with_chunk(s, 1024);
    match from.read_head(HEAD_TIME, |buf| parse_request(buf, &ADMIN_LIMITS, &mut Vec::new())).await {
        Ok(head) => {
            let text = |r: std::ops::Range<usize>| String::from_utf8_lossy(&from.buf[r]).into_owned();
            let host = head.headers.iter().find(|h| from.buf[h.name.clone()].eq_ignore_ascii_case(b"host"));
            let host = host.map(|h| text(h.value.clone()));
            Ok(Request::Head { method: text(head.method), target: text(head.target), host })
        }
        Err(HeadError::Reject(r)) => {
            tracing::debug!(why = r.reason, "admin request head refused");
            Ok(Request::Malformed)
        }
        Err(HeadError::Closed) => Ok(Request::Gone),
        Err(HeadError::Read(RelayError::Read(e))) => Err(e),
        Err(HeadError::Read(e)) => Err(std::io::Error::other(e)),
    }
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    admin: &Admin,
    mut s: S,
    peer: Peer,
    head: Request,
) -> std::io::Result<()> {
    let (method, target) = match head {
        Request::Head { method, target, host } => {
            if let Some(why) = rebinding(peer, &target, host.as_deref()) {
                tracing::warn!(%method, %target, ?host, "admin request refused: {why}");
                return respond(&mut s, 403, "application/json", &err(why)).await;
            }
            (method, target)
        }
        Request::Malformed => return respond(&mut s, 400, "text/plain", "bad request\n").await,
        Request::Gone => return Ok(()),
    };
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    tracing::debug!(%method, %target, ?peer, "admin request");
    if !allowed(peer, &method, path) {
        let why = match peer {
            // On loopback: a reader, never a commander (whoever runs on the host).
            Peer::LocalReader => format!(
                "commands are accepted on the admin Unix socket only ({}, dispatcher.admin_socket); over TCP: GET /metrics, GET /status and the status page GET /",
                admin.current().0.admin_socket.display()
            ),
            _ => "only GET /metrics is served to clients that are not on this host".to_string(),
        };
        tracing::warn!(%method, %target, ?peer, "admin request refused: {why}");
        return respond(&mut s, 403, "application/json", &err(why)).await;
    }
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["metrics"]) => respond(&mut s, 200, "text/plain; version=0.0.4", &views::metrics(admin)).await,
        ("GET", ["status"]) if query.split('&').any(|kv| kv == "format=csv") => {
            let (cfg, status) = (admin.current().0, views::status(admin));
            let text = csv::status_csv(&cfg, &admin.tables.lock().unwrap(), Some(&status));
            match text {
                Ok(text) => respond(&mut s, 200, "text/csv; charset=utf-8", &text).await,
                Err(e) => respond(&mut s, 500, "application/json", &err(format!("reading the maps: {e}"))).await,
            }
        }
        ("GET", ["clones"]) => match clones::list(&admin.current().1, query) {
            Ok(r) => respond(&mut s, 200, "application/json", &to_json(&r)).await,
            Err(why) => respond(&mut s, 400, "application/json", &err(why)).await,
        },
        ("POST", ["clones", "delete"]) => {
            let (cfg, servers, _) = admin.current();
            let prefix = cfg.cluster.as_ref().map(|c| c.key_prefix.as_str());
            match clones::delete(&servers, query, prefix) {
                Ok(r) => respond(&mut s, 200, "application/json", &to_json(&r)).await,
                Err(why) => respond(&mut s, 409, "application/json", &err(why)).await,
            }
        }
        ("GET", ["errors"]) => {
            respond(&mut s, 200, "application/json", &to_json(&admin.capacity().refusals.reply())).await
        }
        ("GET", ["status"]) => respond(&mut s, 200, "application/json", &to_json(&views::status(admin))).await,
        ("GET", [""] | ["status.html"]) => {
            respond_with(&mut s, 200, page::CONTENT_TYPE, page::fields(), page::HTML).await
        }
        ("POST", ["reload"]) => {
            let (tx, rx) = oneshot::channel();
            if admin.requests.send(AgentRequest::Reload(tx)).is_err() {
                return respond(&mut s, 503, "application/json", &err("agent stopping")).await;
            }
            match rx.await {
                Ok(Ok((what, changes))) => {
                    respond(&mut s, 200, "application/json", &to_json(&ReloadReply { reloaded: what, changes })).await
                }
                Ok(Err(why)) => respond(&mut s, 400, "application/json", &err(why)).await,
                Err(_) => respond(&mut s, 503, "application/json", &err("no reply")).await,
            }
        }
        ("POST", ["stop"]) => {
            let detach = query.split('&').any(|kv| kv == "detach=true" || kv == "detach=1");
            if admin.requests.send(AgentRequest::Stop { detach }).is_err() {
                return respond(&mut s, 503, "application/json", &err("agent stopping")).await;
            }
            let body = StopReply { stopping: true, detach, pid: std::process::id() };
            respond(&mut s, 202, "application/json", &to_json(&body)).await
        }
        ("POST", ["leave" | "join"]) => {
            let join = parts == ["join"];
            let (tx, rx) = tokio::sync::oneshot::channel();
            if admin.requests.send(AgentRequest::Membership(join, tx)).is_err() {
                return respond(&mut s, 503, "application/json", &err("the agent is stopping")).await;
            }
            match tokio::time::timeout(Duration::from_secs(10), rx).await {
                Ok(Ok(Ok(what))) => {
                    respond(&mut s, 200, "application/json", &to_json(&MembershipReply { membership: what })).await
                }
                Ok(Ok(Err(why))) => respond(&mut s, 400, "application/json", &err(why)).await,
                _ => respond(&mut s, 503, "application/json", &err("no reply")).await,
            }
        }
        ("POST", ["backends", name, action]) => backend_command(admin, &mut s, name, action, query).await,
        // `farm/server`.
        ("POST", ["backends", farm, server, action]) => {
            backend_command(admin, &mut s, &format!("{farm}/{server}"), action, query).await
        }
        ("POST", ["counters", "clear"]) => {
            let all = query.split('&').any(|kv| kv == "all=true" || kv == "all=1");
            match clear_counters(admin, all) {
                Ok(cleared) => respond(&mut s, 200, "application/json", &to_json(&ClearReply { cleared })).await,
                Err(why) => respond(&mut s, 500, "application/json", &err(why)).await,
            }
        }
        _ => respond(&mut s, 404, "text/plain", "not found\n").await,
    }
}

async fn backend_command<S: AsyncWrite + Unpin>(
    admin: &Admin,
    s: &mut S,
    name: &str,
    action: &str,
    query: &str,
) -> std::io::Result<()> {
    let (cfg, _, commands) = admin.current();
    let b = match server_named(&cfg, name) {
        Ok(b) => b,
        Err(why) => return respond(s, 404, "application/json", &err(why)).await,
    };
    let order = match action {
        "drain" => Order::Operator(Operator::Drain),
        "disable" => Order::Operator(Operator::Disabled),
        "enable" => Order::Operator(Operator::None),
        _ => match settings::order(action, query) {
            Some(Ok(order)) => order,
            Some(Err(why)) => return respond(s, 400, "application/json", &err(why)).await,
            None => {
                let why = format!("no backend action {action:?}; there are: {}", settings::ACTIONS);
                return respond(s, 404, "application/json", &err(why)).await;
            }
        },
    };
    let (tx, rx) = oneshot::channel();
    if commands.send(AdminCommand { backend: b, order, reply: tx }).is_err() {
        return respond(s, 503, "application/json", &err("control loop stopped")).await;
    }
    match rx.await {
        Ok(done) => {
            let (from, to) = (done.from.name().into(), done.to.name().into());
            let body = CommandReply { backend: name.to_string(), from, to, change: done.change };
            respond(s, 200, "application/json", &to_json(&body)).await
        }
        Err(_) => respond(s, 503, "application/json", &err("no reply")).await,
    }
}

/// `POST /counters/clear`: the agent's counters, and with `all` the XDP counters in the
/// maps; the reply says which.
fn clear_counters(admin: &Admin, all: bool) -> Result<String, String> {
    let (_, servers, _) = admin.current();
    settings::clear_counters(&servers, &admin.capacity());
    let mut cleared =
        "the agent's counters (requests, errors, responses, failovers, retries, holds, queues)".to_string();
    if all {
        admin
            .tables
            .lock()
            .unwrap()
            .clear_counters()
            .map_err(|e| format!("{cleared} cleared; the XDP counters not: {e}"))?;
        cleared.push_str(" and the XDP counters (packets, bytes, flows, drops)");
    }
    tracing::info!("operator: counters cleared: {cleared}");
    Ok(cleared)
}

/// The backend an operator names: by its name when one backend has it, else as
/// `farm/server` (the server of that name among the farm's servers and backups).
pub fn server_named(cfg: &Config, name: &str) -> Result<usize, String> {
    let serving = |b: &usize| cfg.backends.get(*b).is_some_and(|x| !x.retired);
    let mut named = cfg.backends.iter().enumerate().filter(|(_, b)| b.name == name && !b.retired).map(|(i, _)| i);
    match (named.next(), named.next()) {
        (Some(b), None) => return Ok(b),
        (Some(_), Some(_)) => {
            let farms: Vec<String> = cfg
                .farms
                .iter()
                .filter(|f| f.members().any(|b| serving(&b) && cfg.backends[b].name == name))
                .map(|f| format!("{}/{name}", f.name))
                .collect();
            return Err(format!("several backends are named {name:?}: name it as farm/server ({})", farms.join(", ")));
        }
        _ => {}
    }
    let Some((farm, server)) = name.split_once('/') else {
        return Err(format!("no backend or farm/server named {name:?}; known: {}", known_servers(cfg)));
    };
    let Some(f) = cfg.farms.iter().find(|f| f.name == farm) else {
        return Err(format!("no backend or farm/server named {name:?}; known: {}", known_servers(cfg)));
    };
    f.members().filter(serving).find(|&b| cfg.backends[b].name == server).ok_or_else(|| {
        let servers: Vec<&str> = f.members().filter(serving).map(|b| cfg.backends[b].name.as_str()).collect();
        format!("farm {farm} has no server named {server:?}; its servers: {}", servers.join(", "))
    })
}

/// What an operator may name (`server_named`): every backend by its name, then each
/// farm's servers as `farm/server`; the first 20, and how many more.
fn known_servers(cfg: &Config) -> String {
    let mut names: Vec<String> = Vec::new();
    for b in cfg.backends.iter().filter(|b| !b.retired) {
        if !names.contains(&b.name) {
            names.push(b.name.clone());
        }
    }
    for f in &cfg.farms {
        for b in f.members().filter_map(|b| cfg.backends.get(b)).filter(|b| !b.retired) {
            names.push(format!("{}/{}", f.name, b.name));
        }
    }
    const SHOWN: usize = 20;
    match names.len() {
        0 => "none (the configuration has no backend)".into(),
        n if n > SHOWN => format!("{}, ... ({} more)", names[..SHOWN].join(", "), n - SHOWN),
        _ => names.join(", "),
    }
}

/// An `ErrorReply` as JSON.
fn err(why: impl Into<String>) -> String {
    to_json(&ErrorReply { error: why.into() })
}

async fn respond<S: AsyncWrite + Unpin>(s: &mut S, status: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    respond_with(s, status, ctype, "", body).await
}

/// An answer with header `fields` (complete lines), then the connection closes.
async fn respond_with<S: AsyncWrite + Unpin>(
    s: &mut S,
    status: u16,
    ctype: &str,
    fields: &str,
    body: &str,
) -> std::io::Result<()> {
    s.write_all(closing_answer(status, ctype, fields, body).as_bytes()).await?;
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server is named alone when its name is unique, or as `farm/server`.
    #[test]
    fn servers_by_name_or_farm_and_name() {
        let text = "[dispatcher]\ninterface = \"eth0\"\n[[backend]]\nname = \"s1\"\naddress = \"10.0.0.1\"\n\
                    [[backend]]\nname = \"s2\"\naddress = \"10.0.0.2\"\n\
                    [[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n";
        let mut cfg = Config::parse(text, "t").unwrap();
        let implicit = cfg.farms[0].clone();
        cfg.farms.push(crate::config::Farm {
            name: "shop".into(),
            servers: vec![1],
            backup_servers: vec![0],
            implicit: false,
            ..implicit
        });
        assert_eq!(server_named(&cfg, "s2"), Ok(1));
        assert_eq!(server_named(&cfg, "shop/s2"), Ok(1));
        assert_eq!(server_named(&cfg, "shop/s1"), Ok(0), "a backup server");
        assert_eq!(server_named(&cfg, "web/s1"), Ok(0), "the VIP's own farm");
        // An unknown name: in words, with the names there are.
        assert_eq!(
            server_named(&cfg, "nope"),
            Err("no backend or farm/server named \"nope\"; known: s1, s2, web/s1, web/s2, shop/s2, shop/s1".into())
        );
        assert_eq!(
            server_named(&cfg, "shop/nope"),
            Err("farm shop has no server named \"nope\"; its servers: s2, s1".into())
        );
        assert!(server_named(&cfg, "nofarm/s1")
            .unwrap_err()
            .starts_with("no backend or farm/server named \"nofarm/s1\"; known: s1, s2,"));
        cfg.backends[1].name = "s1".into();
        assert_eq!(
            server_named(&cfg, "s1"),
            Err("several backends are named \"s1\": name it as farm/server (web/s1, shop/s1)".into())
        );
        assert_eq!(server_named(&cfg, "shop/s1"), Ok(1), "the farm's own");
    }

    #[test]
    fn only_operators_on_the_socket_may_command() {
        let remote = tcp_peer("10.0.0.5:40000".parse().unwrap());
        assert_eq!(remote, Peer::Remote);
        let local = tcp_peer("127.0.0.1:1".parse().unwrap());
        assert_eq!(local, Peer::LocalReader);
        assert_eq!(tcp_peer("[::1]:1".parse().unwrap()), Peer::LocalReader);
        assert_eq!(tcp_peer("[::ffff:127.0.0.2]:1".parse().unwrap()), Peer::LocalReader);
        assert_eq!(tcp_peer("[::ffff:10.0.0.5]:1".parse().unwrap()), Peer::Remote);
        assert!(allowed(remote, "GET", "/metrics") && allowed(local, "GET", "/metrics"));
        for readable in ["/status", "/", "/status.html"] {
            assert!(allowed(local, "GET", readable) && !allowed(remote, "GET", readable), "{readable}");
            assert!(!allowed(local, "POST", readable), "POST {readable}");
        }
        for (m, p) in [
            ("POST", "/reload"),
            ("POST", "/stop"),
            ("POST", "/backends/a/drain"),
            ("GET", "/backends/a/drain"),
            ("GET", "/errors"),
        ] {
            assert!(!allowed(remote, m, p), "{m} {p}");
            assert!(!allowed(local, m, p), "{m} {p} over loopback TCP");
            assert!(allowed(Peer::Operator, m, p), "{m} {p}");
        }
    }

    /// A loopback reader asking for the status or the page by a name could be a page of
    /// another site (DNS rebinding): refused; by an address or localhost, or for the
    /// metrics, or on the socket: served.
    #[test]
    fn the_status_is_read_by_address_or_localhost_only() {
        for ok in ["127.0.0.1", "127.0.0.1:9901", "[::1]:9901", "[::1]", "localhost:9901", "LOCALHOST", "10.0.0.1:80"] {
            assert!(host_is_local_literal(ok), "{ok}");
            assert_eq!(rebinding(Peer::LocalReader, "/status", Some(ok)), None, "{ok}");
        }
        for bad in
            ["evil.example:9901", "localhost.evil.example", "127.0.0.1.nip.io", "[::1", "127.0.0.1:x", "", "localhost:"]
        {
            assert!(!host_is_local_literal(bad), "{bad}");
        }
        let why = rebinding(Peer::LocalReader, "/?x=1", Some("evil.example:9901")).expect("refused");
        assert!(why.starts_with("Host \"evil.example:9901\" is a name") && why.contains("DNS rebinding"), "{why}");
        assert!(rebinding(Peer::LocalReader, "/status.html", Some("evil.example")).is_some());
        assert!(rebinding(Peer::LocalReader, "/status", Some("evil.example")).is_some());
        assert_eq!(rebinding(Peer::LocalReader, "/metrics", Some("evil.example")), None, "Prometheus by name");
        assert_eq!(rebinding(Peer::Operator, "/status", Some("admin")), None, "the socket's clients");
        assert_eq!(rebinding(Peer::LocalReader, "/status", None), None, "HTTP/1.0 without Host");
    }

    /// What a client sends, read by the codec's head parser over a pipe.
    async fn read(parts: &[&[u8]]) -> std::io::Result<Request> {
        let (mut client, mut server) = tokio::io::duplex(64 * 1024);
        for p in parts {
            client.write_all(p).await.unwrap();
        }
        drop(client);
        read_request(&mut server).await
    }

    #[tokio::test]
    async fn a_head_is_read_whole_across_reads() {
        let head = |m: &str, t: &str| Request::Head { method: m.into(), target: t.into(), host: Some("admin".into()) };
        let got = read(&[b"GET /metr", b"ics HTTP/1.1\r\nHost: admin\r\n", b"\r\n"]).await.unwrap();
        assert_eq!(got, head("GET", "/metrics"));
        let got = read(&[b"POST /stop?detach=true HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\n\r\n"]).await;
        assert_eq!(got.unwrap(), head("POST", "/stop?detach=true"), "the query stays in the target");
    }

    #[tokio::test]
    async fn bad_or_oversized_heads_are_malformed_and_a_close_is_gone() {
        assert_eq!(read(&[b"GET /metrics HTTP/1.1\r\nHost: admin\r\n"]).await.unwrap(), Request::Gone);
        assert_eq!(read(&[]).await.unwrap(), Request::Gone);
        assert_eq!(read(&[b"NOT A REQUEST\r\n\r\n"]).await.unwrap(), Request::Malformed);
        assert_eq!(read(&[b"GET / HTTP/1.1\nHost: a\n\n"]).await.unwrap(), Request::Malformed, "bare LF");
        let big = format!("GET / HTTP/1.1\r\nHost: a\r\nX: {}\r\n\r\n", "x".repeat(9000));
        assert_eq!(read(&[big.as_bytes()]).await.unwrap(), Request::Malformed, "over 8 KiB");
        let many: String = (0..40).map(|i| format!("X-{i}: y\r\n")).collect();
        let many = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        assert_eq!(read(&[many.as_bytes()]).await.unwrap(), Request::Malformed, "over 32 fields");
    }

    /// The answer is framed, says its reason and closes.
    #[tokio::test]
    async fn an_answer_is_framed_and_closes() {
        let (mut server, mut client) = tokio::io::duplex(4096);
        respond(&mut server, 202, "application/json", "{}").await.unwrap();
        let mut got = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut client, &mut got).await.unwrap();
        assert_eq!(
            got,
            "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
    }
}
