//! Several dispatchers, one truth: the state they share through etcd (`[cluster]`).
//!
//! What is shared, and its rule (docs/design.md, "Several dispatchers"):
//! - learned clone and partition IDs: the first learning in etcd's order wins
//!   (create-if-absent transaction); a dispatcher that learned otherwise takes the stored
//!   owner;
//! - the operator's word (drain, disable, enable), given on any dispatcher: the last
//!   command in etcd's order wins; kept without a lease, so it survives restarts;
//! - health verdicts: each dispatcher publishes the backends its own checks see down,
//!   under its membership lease; a backend is out everywhere when more than half of the
//!   live dispatchers see it down (`view::View::out_by_majority`), and out here at once
//!   when this dispatcher's own checks see it down;
//! - membership: one leased key per dispatcher; with steering, it also says where the
//!   dispatcher takes peer heartbeats and which peers it cannot reach (`peers`); a peer
//!   most others cannot reach is out of every ownership table
//!   (`view::View::out_unreachable`).
//!
//! Nothing per request goes to the store: writes happen on learning a new ID, on a change
//! of a verdict or an operator's state, and at a session's start; leases are renewed.
//! While the store is unreachable the agent keeps its last shared state and its own
//! checks (the majority rule is set aside: stale verdicts of others decide nothing), keeps
//! what it learns and the operator's commands, and writes them when the store is back.

pub mod credentials;
mod session;
pub mod view;

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, RwLock,
    },
    time::{Duration, Instant},
};

use dispatcher_common::Operator;
use tokio::sync::mpsc;

use crate::{
    api::{ClusterStatus, MemberStatus},
    config::{ClusterSettings, Config},
    state::Servers,
};

/// What this dispatcher tells the others (`[cluster]`): the cluster's news
/// (`state::News`, which this link listens to), and what the link itself or the agent
/// asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Publish {
    /// It learned a clone or partition ID from a backend's `Set-Cookie`.
    Learned { id: String, backend: String },
    /// Its own checks' verdicts changed, or it joined or left (the member key is
    /// rewritten from the cluster).
    Verdicts,
    /// An operator's command given here.
    Operator { backend: String, op: Operator },
    /// A reload swapped the configuration and the cluster: the shared state is applied to
    /// the new cluster, and read again if the peers or the backends changed.
    Reloaded,
}

impl From<crate::state::News> for Publish {
    fn from(n: crate::state::News) -> Publish {
        use crate::state::News;
        match n {
            News::Learned { id, backend } => Publish::Learned { id, backend },
            News::Verdicts => Publish::Verdicts,
            News::Operator { backend, op } => Publish::Operator { backend, op },
        }
    }
}

/// The configuration and the cluster state a reload may replace.
pub type Current = Arc<RwLock<(Arc<Config>, Arc<Servers>)>>;

/// Writes waiting for the store that can be kept: the most learned IDs kept while the
/// store is unreachable (the oldest are dropped beyond it, and counted).
const MAX_PENDING: usize = 65_536;

/// Where the store stands, as `status` and the metrics show it.
#[derive(Default)]
pub struct Counters {
    /// Puts, deletes, transactions and lease grants sent.
    pub writes: AtomicU64,
    /// Lease renewals sent.
    pub renewals: AtomicU64,
    /// Sessions begun (the first, and one after every loss of the store).
    pub sessions: AtomicU64,
    /// Writes dropped because too many waited for an unreachable store.
    pub dropped: AtomicU64,
    /// Keys under the prefix not taken, by `view::Refusal`.
    pub refused: [AtomicU64; view::Refusal::ALL.len()],
}

pub(crate) struct Inner {
    pub(crate) settings: ClusterSettings,
    pub(crate) current: Current,
    pub(crate) counters: Counters,
    pub(crate) state: Mutex<StoreState>,
    pub(crate) pending: Mutex<VecDeque<Publish>>,
    pub(crate) started_unix: u64,
    /// Which of `settings.endpoints` the next session talks to.
    pub(crate) endpoint: std::sync::atomic::AtomicUsize,
    /// This dispatcher's steering MAC (published in its member key).
    pub(crate) mac: Option<[u8; 6]>,
    /// It takes connections (`dispatcher leave` clears it).
    pub(crate) joined: Arc<std::sync::atomic::AtomicBool>,
    /// The steering membership, on every change of the members.
    pub(crate) peers: tokio::sync::watch::Sender<Option<Vec<crate::steering::Peer>>>,
    /// The live members not out by the others' heartbeats (`takeover`: one that goes is
    /// dead, where one that leaves stays a member).
    pub(crate) alive: tokio::sync::watch::Sender<Option<std::collections::BTreeSet<String>>>,
    /// Peer heartbeats (with steering): told the live members, read for the member key.
    pub(crate) liveness: Option<Arc<crate::peers::Liveness>>,
}

/// Who this dispatcher is besides its name: what steering needs from the others.
pub struct Identity {
    pub mac: Option<[u8; 6]>,
    pub joined: Arc<std::sync::atomic::AtomicBool>,
    pub liveness: Option<Arc<crate::peers::Liveness>>,
}

pub(crate) struct StoreState {
    pub(crate) connected: bool,
    pub(crate) since: Instant,
    pub(crate) last_error: Option<String>,
    pub(crate) view: view::View,
    pub(crate) revision: i64,
    pub(crate) store_members: usize,
    pub(crate) leader: u64,
    /// The member the current (or last) session talks to.
    pub(crate) via: String,
}

/// The running link to the store (`[cluster]` only).
pub struct Shared {
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
    /// Passes the cluster's news on to `task`.
    listener: tokio::task::JoinHandle<()>,
    /// `task`'s inbox, for what the link and the agent ask for themselves.
    inbox: mpsc::UnboundedSender<Publish>,
    /// Writes the member key again when the peers this dispatcher cannot reach change.
    heartbeats: Option<tokio::task::JoinHandle<()>>,
    lease: Arc<Mutex<Option<(etcd_client::Client, i64)>>>,
}

impl Shared {
    /// Starts the link: a session with the store, again after every loss of it. Returns
    /// once the first shared state is applied to the cluster, or after
    /// `startup_wait` without it (the agent then serves with its own state and says so).
    pub async fn start(settings: ClusterSettings, current: Current, me: Identity) -> Shared {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut news = current.read().unwrap().1.subscribe_news();
        let to_task = tx.clone();
        let listener = tokio::spawn(async move {
            while let Some(n) = news.recv().await {
                if to_task.send(n.into()).is_err() {
                    return;
                }
            }
        });
        let inner = Arc::new(Inner {
            settings,
            current,
            counters: Counters::default(),
            state: Mutex::new(StoreState {
                connected: false,
                since: Instant::now(),
                last_error: None,
                view: view::View::default(),
                revision: 0,
                store_members: 0,
                leader: 0,
                via: String::new(),
            }),
            pending: Mutex::new(VecDeque::new()),
            endpoint: Default::default(),
            mac: me.mac,
            joined: me.joined,
            peers: tokio::sync::watch::Sender::new(None),
            alive: tokio::sync::watch::Sender::new(None),
            liveness: me.liveness.clone(),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        });
        let heartbeats = me.liveness.map(|l| {
            let to_task = tx.clone();
            tokio::spawn(async move {
                loop {
                    l.changed().await;
                    if to_task.send(Publish::Verdicts).is_err() {
                        return;
                    }
                }
            })
        });
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let lease = Arc::new(Mutex::new(None));
        let task = tokio::spawn(run(inner.clone(), rx, ready_tx, lease.clone()));
        let wait = inner.settings.startup_wait;
        match tokio::time::timeout(wait, ready_rx).await {
            Ok(Ok(())) => tracing::info!("shared state taken from the store"),
            _ => tracing::warn!(
                waited = ?wait,
                "the shared store did not answer: serving with this dispatcher's own state until it does"
            ),
        }
        Shared { inner, task, listener, inbox: tx, heartbeats, lease }
    }

    /// Leaves the cluster: the lease is revoked, so that the others stop counting this
    /// dispatcher at once (not after the lease's time).
    pub async fn leave(self) {
        self.task.abort();
        self.listener.abort();
        if let Some(h) = &self.heartbeats {
            h.abort();
        }
        let held = self.lease.lock().unwrap().take();
        if let Some((mut client, id)) = held {
            let t = self.inner.settings.request_timeout;
            match tokio::time::timeout(t, client.lease_revoke(id)).await {
                Ok(Ok(_)) => tracing::info!("left the cluster (lease revoked)"),
                _ => tracing::warn!("could not revoke the lease: the others see this dispatcher go when it expires"),
            }
        }
    }

    /// The steering membership as it changes (`None` until the store was read once).
    pub fn peers(&self) -> tokio::sync::watch::Receiver<Option<Vec<crate::steering::Peer>>> {
        self.inner.peers.subscribe()
    }

    /// The live members not out by the others' heartbeats, as they change.
    pub fn alive(&self) -> tokio::sync::watch::Receiver<Option<std::collections::BTreeSet<String>>> {
        self.inner.alive.subscribe()
    }

    /// This dispatcher joined or left: its member key says so (now, or when the store is
    /// back).
    pub fn publish_member(&self) {
        let _ = self.inbox.send(Publish::Verdicts);
    }

    /// A reload swapped the cluster: the shared state is applied to the new one (and read
    /// again if the peers or the backends changed).
    pub fn reloaded(&self) {
        let _ = self.inbox.send(Publish::Reloaded);
    }

    /// A read-only handle for `status` and the metrics.
    pub fn observer(&self) -> Observer {
        Observer(self.inner.clone())
    }
}

/// Reads the link's state (the admin endpoint holds one).
#[derive(Clone)]
pub struct Observer(Arc<Inner>);

impl Observer {
    pub fn status(&self) -> ClusterStatus {
        let i = &self.0;
        let st = i.state.lock().unwrap();
        let backends: Vec<String> = i.current.read().unwrap().1.backends.iter().map(|b| b.name.clone()).collect();
        let members: Vec<MemberStatus> = st
            .view
            .members
            .values()
            .map(|m| MemberStatus {
                name: m.name.clone(),
                pid: m.pid,
                started: m.started,
                version: m.version.clone(),
                down: m.down.clone(),
                mac: m.mac.clone(),
                joined: m.joined,
                unreachable: m.unreachable.clone(),
            })
            .collect();
        let out_unreachable = st.view.out_unreachable_why();
        let liveness = i.liveness.as_ref();
        // Where the dispatchers' own checks disagree.
        let differing = backends
            .iter()
            .filter_map(|b| {
                let down = st.view.seen_down_by(b);
                (!down.is_empty() && down.len() < st.view.members.len()).then(|| {
                    format!(
                        "{b}: down for {}; up for the others (out cluster-wide: {})",
                        down.join(","),
                        st.view.out_by_majority(b)
                    )
                })
            })
            .collect();
        ClusterStatus {
            name: i.settings.name.clone(),
            store: if st.connected { "connected" } else { "unreachable" }.into(),
            store_for_s: st.since.elapsed().as_secs(),
            last_error: st.last_error.clone(),
            endpoints: i.settings.endpoints.clone(),
            via: st.via.clone(),
            store_members: st.store_members,
            leader: format!("{:x}", st.leader),
            revision: st.revision,
            members,
            differing,
            operators: st.view.operators.iter().map(|(b, op)| format!("{b}={}", op.name())).collect(),
            shared_clones: st.view.clones.len(),
            pending_writes: i.pending.lock().unwrap().len(),
            writes: i.counters.writes.load(Ordering::Relaxed),
            renewals: i.counters.renewals.load(Ordering::Relaxed),
            sessions: i.counters.sessions.load(Ordering::Relaxed),
            dropped_writes: i.counters.dropped.load(Ordering::Relaxed),
            ignored_keys: i.counters.refused.iter().map(|c| c.load(Ordering::Relaxed)).sum(),
            refused_keys: view::Refusal::ALL
                .iter()
                .map(|r| (r.label().to_string(), i.counters.refused[*r as usize].load(Ordering::Relaxed)))
                .collect(),
            security: i.settings.security.describe(),
            insecure: i.settings.security.insecure(),
            peers: i.current.read().unwrap().0.cluster.as_ref().map(|c| c.peers.clone()).unwrap_or_default(),
            heartbeat_address: liveness.map(|l| l.address().to_string()),
            heartbeats: liveness.map(|l| l.status()).unwrap_or_default(),
            heartbeats_sent: liveness.map_or(0, |l| l.counters.sent.load(Ordering::Relaxed)),
            heartbeats_received: liveness.map_or(0, |l| l.counters.received.load(Ordering::Relaxed)),
            heartbeats_refused: liveness.map(|l| l.refused()).unwrap_or_default(),
            out_unreachable,
        }
    }
}

/// Sessions, one after another, until the agent stops.
async fn run(
    inner: Arc<Inner>,
    mut rx: mpsc::UnboundedReceiver<Publish>,
    ready: tokio::sync::oneshot::Sender<()>,
    lease: Arc<Mutex<Option<(etcd_client::Client, i64)>>>,
) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(200);
    loop {
        inner.counters.sessions.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let err = session::run(&inner, &mut rx, &mut ready, &lease).await;
        *lease.lock().unwrap() = None;
        inner.endpoint.fetch_add(1, Ordering::Relaxed);
        let was = {
            let mut st = inner.state.lock().unwrap();
            let was = st.connected;
            if was {
                st.since = Instant::now();
            }
            st.connected = false;
            st.last_error = Some(format!("{err:#}"));
            was
        };
        if was {
            tracing::warn!(error = %format!("{err:#}"), "lost the shared store: keeping the last shared state and this dispatcher's own checks");
        } else {
            tracing::debug!(error = %format!("{err:#}"), "shared store still unreachable");
        }
        // Stale verdicts of others decide nothing while they cannot be renewed.
        set_aside_majority(&inner);
        if began.elapsed() > Duration::from_secs(10) {
            backoff = Duration::from_millis(200);
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn set_aside_majority(inner: &Inner) {
    let servers = inner.current.read().unwrap().1.clone();
    for i in 0..servers.backends.len() {
        if servers.backends[i].peers_out() {
            servers.set_peers_out(i, false);
        }
    }
}

/// Keeps a write for when the store is back (bounded: the oldest learned IDs go first).
fn keep_pending(inner: &Inner, p: Publish) {
    let mut q = inner.pending.lock().unwrap();
    if matches!(p, Publish::Verdicts | Publish::Reloaded) {
        // The member key is written, and the state read, at every session's start anyway.
        return;
    }
    if q.len() >= MAX_PENDING {
        q.pop_front();
        inner.counters.dropped.fetch_add(1, Ordering::Relaxed);
    }
    q.push_back(p);
}

/// Tells steering the membership (when it changed), and the peer heartbeats whom to
/// watch.
pub(crate) fn publish_peers(inner: &Inner, v: &view::View) {
    if let Some(l) = &inner.liveness {
        l.set_targets(&v.heartbeat_targets(&inner.settings.name));
    }
    let out = v.out_unreachable();
    let alive: std::collections::BTreeSet<String> = v.members.keys().filter(|m| !out.contains(*m)).cloned().collect();
    inner.alive.send_if_modified(|cur| {
        let changed = cur.as_ref() != Some(&alive);
        *cur = Some(alive);
        changed
    });
    let peers = v.steering_peers();
    inner.peers.send_if_modified(|cur| {
        if cur.as_ref() == Some(&peers) {
            return false;
        }
        let why = v.out_unreachable_why();
        if !why.is_empty() {
            tracing::info!(out = ?why, "steering membership: dispatchers out by the others' heartbeats");
        }
        *cur = Some(peers);
        true
    });
}

/// Applies the whole view: every backend's operator state and majority verdict, every
/// shared clone ID (a session's start); the IDs taken from the store earlier and no longer
/// in it are forgotten (deleted while this dispatcher did not watch).
fn apply_all(inner: &Inner, v: &view::View) {
    let (cfg, servers) = inner.current.read().unwrap().clone();
    for i in 0..servers.backends.len() {
        apply_backend(&cfg, &servers, v, i, true);
    }
    let in_store: std::collections::HashSet<u64> =
        v.clones.keys().map(|id| dispatcher_common::hash::cookie_hash(id.as_bytes())).collect();
    let gone = servers.forget_store_clones_not_in(&in_store);
    if gone > 0 {
        tracing::info!(gone, "clone IDs deleted from the shared store meanwhile: forgotten");
    }
    let by_name = backend_index(&servers);
    for (id, b) in &v.clones {
        if let Some(&i) = by_name.get(b.as_str()) {
            servers.adopt_shared_clone(id.as_bytes(), i);
        }
    }
}

/// One backend's operator state (`operator`: also that) and majority verdict.
fn apply_backend(cfg: &Config, servers: &Servers, v: &view::View, i: usize, operator: bool) {
    let name = &servers.backends[i].name;
    if operator && !cfg.backends.get(i).is_some_and(|b| b.retired) {
        let op = v.operators.get(name).copied().unwrap_or(Operator::None);
        if servers.backends[i].operator() != op {
            tracing::info!(backend = %name, operator = op.name(), "operator state from the shared store");
            servers.set_admin_shared(i, op);
        }
    }
    let out = v.out_by_majority(name);
    if servers.backends[i].peers_out() != out {
        tracing::info!(backend = %name, out, seen_down_by = ?v.seen_down_by(name), "shared health verdict");
        servers.set_peers_out(i, out);
    }
}

fn backend_index(servers: &Servers) -> std::collections::HashMap<&str, usize> {
    servers.backends.iter().enumerate().map(|(i, b)| (b.name.as_str(), i)).collect()
}

/// This dispatcher's member key: who it is and what its own checks see down.
fn member_value(inner: &Inner) -> String {
    let servers = inner.current.read().unwrap().1.clone();
    let down = servers
        .backends
        .iter()
        // A backend whose checks an operator disabled here has no verdict of this
        // dispatcher's: it abstains (its last health would vote on).
        .filter(|b| b.health() == dispatcher_common::Health::Down && !b.checks_disabled())
        .map(|b| b.name.clone())
        .collect();
    let m = view::Member {
        name: inner.settings.name.clone(),
        started: inner.started_unix,
        pid: std::process::id(),
        version: env!("CARGO_PKG_VERSION").into(),
        down,
        mac: inner.mac.map(|m| crate::mac::format_mac(&m)),
        joined: inner.joined.load(Ordering::Relaxed),
        heartbeat: inner.liveness.as_ref().map(|l| l.address().to_string()),
        unreachable: inner.liveness.as_ref().map(|l| l.unreachable()).unwrap_or_default(),
    };
    serde_json::to_string(&m).unwrap_or_default()
}
