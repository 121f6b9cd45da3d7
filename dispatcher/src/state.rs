//! The servers as the agent's request path sees them (`Servers`): backends and their
//! states, the clone table (clone or partition ID -> owner and replica) with its
//! write-through to the `CLONES` map, and the counters. It tells its news to whoever
//! listens; the shared store (`shared`, docs/design.md "Several dispatchers") listens and
//! feeds it what the other dispatchers learn.
//!
//! Words: `Servers` is this set of backends; "cluster" is only `[cluster]`, the group of
//! dispatchers sharing state (`shared`); the tests' WebSphere-like backends are `Clones`
//! (`dispatcher_testbed::websphere`).

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    sync::{
        atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering},
        Arc, Mutex, RwLock,
    },
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use dispatcher_common::{
    effective_state, hash::cookie_hash, BackendState, CloneValue, Health, Operator, CLONE_F_FAILED_OVER,
    CLONE_F_LEARNED, MAX_CLONES, NO_BACKEND,
};

use crate::{
    config::Config,
    health::{Cause, Reason},
    metrics::{mono_ns, Counters, Histogram, StatusClasses},
};

pub struct Backend {
    pub name: String,
    pub address: Ipv4Addr,
    /// The weight new sessions and L4 flows are balanced by: the configuration's, or an
    /// operator's (`dispatcher weight`, until a reload builds the servers again).
    weight: AtomicU32,
    /// Health checks disabled by the operator (`dispatcher checks disable`, until a
    /// reload): none are sent, passive failures are ignored and it counts as healthy.
    checks_off: std::sync::atomic::AtomicBool,
    pub replica: Option<usize>,
    /// What routing obeys: `effective_state(operator, health)` (a `BackendState` byte;
    /// read it with `state()`).
    state: AtomicU8,
    /// From active checks and passive signals (a `Health` byte; `health()`).
    health: AtomicU8,
    /// The operator's state (an `Operator` byte; `operator()`).
    admin: AtomicU8,
    /// Out by the shared rule: most live dispatchers see it down (`shared`; false when
    /// standalone or while the store is unreachable).
    peers_out: std::sync::atomic::AtomicBool,
    /// When a request last saw it fail (nanoseconds after the servers's epoch, plus one;
    /// 0: never).
    failed_at: AtomicU64,
    /// Woken on every state change (held requests wait here).
    pub changed: tokio::sync::Notify,
    /// Time to the response head.
    pub latency: Histogram,
    /// Requests in flight to this backend (least-outstanding balancing).
    pub outstanding: AtomicU64,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    /// Open upstream connections (all workers' pools, idle ones included).
    pub connections: Arc<AtomicU64>,
    /// `http.max_connections_per_backend`, shared by all workers' pools.
    pub conn_limit: Arc<tokio::sync::Semaphore>,
    /// `maxconn` and its queue (shared with a reload's successor).
    pub slots: Arc<crate::capacity::queue::Slots>,
    /// `slow_start`: when it came back (`mono_ns`), 0 when it is not ramping up.
    pub ramp_since: AtomicU64,
    /// It went out of service (down, disabled, drained) and has not been up since: its
    /// return ramps up, even by way of suspect.
    pub left: std::sync::atomic::AtomicBool,
    /// Final response statuses it returned, by class.
    pub responses: StatusClasses,
    /// How long its last health check took, in microseconds plus one (0: none yet).
    pub last_check_us: AtomicU64,
    /// Its last change of state and the count of changes (shared with a reload's
    /// successor: the history goes on).
    pub changes: Arc<Mutex<Changes>>,
}

/// A change of a backend's state, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Change {
    pub from: BackendState,
    pub to: BackendState,
    pub reason: Reason,
    /// What the deciding check took (a change a check decided).
    pub check: Option<std::time::Duration>,
    /// Seconds since the epoch.
    pub at_unix: u64,
}

/// A backend's changes of state: the last one, and how many by (from, to, reason kind)
/// (all bounded sets: `dispatcher_backend_transitions_total`).
#[derive(Debug, Default)]
pub struct Changes {
    pub last: Option<Change>,
    pub counts: std::collections::BTreeMap<(&'static str, &'static str, &'static str), u64>,
}

impl Changes {
    pub fn record(&mut self, change: Change) {
        *self.counts.entry((change.from.name(), change.to.name(), change.reason.kind())).or_default() += 1;
        self.last = Some(change);
    }
}

/// The smallest share of its weight a backend that just came back gets (HAProxy starts
/// near zero too; never zero, so that it is seen to serve).
pub const RAMP_FLOOR: f64 = 0.05;

/// The share of its weight a backend ramping up since `since` (`mono_ns`, 0: not
/// ramping) has at `now` over `slow`: from `RAMP_FLOOR` to 1, linearly.
pub fn ramp_share(since: u64, slow: Option<std::time::Duration>, now: u64) -> f64 {
    match slow {
        Some(slow) if since != 0 => {
            let t = now.saturating_sub(since) as f64 / slow.as_nanos().max(1) as f64;
            t.clamp(RAMP_FLOOR, 1.0)
        }
        _ => 1.0,
    }
}

impl Backend {
    /// Back in service (from down, disabled or drained, directly or by way of suspect):
    /// `slow_start` ramps it up. A suspect that recovers without having left does not.
    fn track_return(&self, new: BackendState) {
        match new {
            BackendState::Up => {
                if self.left.swap(false, Ordering::SeqCst) {
                    self.ramp_since.store(mono_ns(), Ordering::SeqCst);
                }
            }
            BackendState::Suspect => {}
            _ => {
                self.left.store(true, Ordering::SeqCst);
                self.ramp_since.store(0, Ordering::SeqCst);
            }
        }
    }

    /// Its weight now: `weight` times its ramp-up share (`slow_start` of the VIP or
    /// the backend; at least 1, so that it is seen to serve).
    pub fn ramped_weight(&self, weight: u32, slow: Option<std::time::Duration>, now: u64) -> u64 {
        let share = ramp_share(self.ramp_since.load(Ordering::Relaxed), slow, now);
        ((weight as f64 * share).ceil() as u64).max(1)
    }

    /// The weight it is balanced by now (before any ramp-up).
    pub fn weight(&self) -> u32 {
        self.weight.load(Ordering::Relaxed)
    }

    /// An operator's weight; returns the one it replaces.
    pub fn set_weight(&self, weight: u32) -> u32 {
        self.weight.swap(weight, Ordering::Relaxed)
    }

    /// Its health checks are disabled by the operator.
    pub fn checks_disabled(&self) -> bool {
        self.checks_off.load(Ordering::SeqCst)
    }

    /// Takes new sessions and unbound requests.
    pub fn is_up(&self) -> bool {
        self.state() == BackendState::Up
    }

    pub fn state(&self) -> BackendState {
        BackendState::from_u8(self.state.load(Ordering::SeqCst))
    }

    pub fn health(&self) -> Health {
        Health::from_u8(self.health.load(Ordering::SeqCst))
    }

    pub fn operator(&self) -> Operator {
        Operator::from_u8(self.admin.load(Ordering::SeqCst))
    }

    /// Out by the shared health rule (several dispatchers).
    pub fn peers_out(&self) -> bool {
        self.peers_out.load(Ordering::SeqCst)
    }

    /// Keeps serving the sessions it owns: up, suspect or draining (as XDP keeps flows).
    pub fn serves_sessions(&self) -> bool {
        self.state().keeps()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct CloneEntry {
    owner: usize,
    replica: Option<usize>,
    /// From the configuration (`clone_ids`, partitions): learning never overrides it.
    configured: bool,
    /// Where it comes from, and since when (seconds since the epoch; 0: not known), for
    /// `dispatcher clones`.
    origin: Origin,
    since: u64,
    /// The ID as text (the table is keyed by its hash); `None` for an entry an earlier
    /// agent left in CLONES, which keeps only the hash.
    id: Option<Arc<str>>,
}

/// Where a clone-table entry comes from (`dispatcher clones`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A backend's `clone_ids`.
    ConfiguredClone,
    /// A backend's `logical_names` (SIP).
    ConfiguredLogicalName,
    /// A `[[partition]]`.
    ConfiguredPartition,
    /// Learned here from a backend's `Set-Cookie`.
    Response,
    /// Learned here from a SIP container's answer to a health check (a logical name).
    SipCheck,
    /// Learned here from a SIP dialog: a request naming it reached the container that
    /// took the dialog's first request (reported by the XDP program, `sip_learn`).
    SipDialog,
    /// Taken from the shared store (`[cluster]`): learned by another dispatcher first.
    Store,
    /// Left in the pinned CLONES map by an earlier agent (only its hash is known).
    Pinned,
}

impl Origin {
    /// `configured` or `learned`, and from where.
    pub fn words(self) -> (&'static str, &'static str) {
        match self {
            Origin::ConfiguredClone => ("configured", "clone_ids"),
            Origin::ConfiguredLogicalName => ("configured", "logical_names"),
            Origin::ConfiguredPartition => ("configured", "partition"),
            Origin::Response => ("learned", "local (Set-Cookie)"),
            Origin::SipCheck => ("learned", "local (SIP check)"),
            Origin::SipDialog => ("learned", "local (SIP dialog)"),
            Origin::Store => ("learned", "store"),
            Origin::Pinned => ("learned", "pinned (earlier agent)"),
        }
    }

    /// A SIP logical name rather than a clone or partition ID.
    pub fn logical_name(self) -> bool {
        matches!(self, Origin::ConfiguredLogicalName | Origin::SipCheck | Origin::SipDialog)
    }
}

/// One entry of the clone table as `dispatcher clones` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneRow {
    /// The ID, or `#` and its hash in hex when only the hash is known.
    pub id: String,
    pub owner: usize,
    pub replica: Option<usize>,
    pub origin: Origin,
    pub since: u64,
}

/// An entry as `dispatcher clones` lists it.
fn row((key, e): (&u64, &CloneEntry)) -> CloneRow {
    let id = e.id.as_deref().map_or_else(|| format!("#{key:016x}"), str::to_string);
    CloneRow { id, owner: e.owner, replica: e.replica, origin: e.origin, since: e.since }
}

/// Seconds since the epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A new entry, learned now.
fn learned(owner: usize, replica: Option<usize>, origin: Origin, id: &[u8]) -> CloneEntry {
    let id = Some(String::from_utf8_lossy(id).into());
    CloneEntry { owner, replica, configured: false, origin, since: unix_now(), id }
}

/// The most logical names learned from SIP dialogs (`Origin::SipDialog`) kept at once.
pub const MAX_DIALOG_LEARNED: usize = 4096;

/// What the control loop hears from the request path and the shared state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A request saw the backend fail so (it is suspect in the mirror).
    PassiveFailure(usize, Cause),
    /// The shared state changed the backend's state (operator's word, majority verdict).
    Shared(usize),
}

/// What learning a clone ID from a response did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    New,
    Known,
    /// The ID is owned by another backend already (configured, or learned earlier);
    /// the table is left as it is.
    Conflict {
        owner: usize,
    },
    /// Not kept: a malformed ID, or the table is full (counted).
    Refused,
}

/// The longest clone, partition or logical-server ID kept (WebSphere's are about ten
/// characters; a longer one from a backend or the store is refused and counted).
pub const MAX_CLONE_ID_LEN: usize = 128;

/// A clone ID the table keeps: 1 to `MAX_CLONE_ID_LEN` printable ASCII characters.
pub fn clone_id_ok(id: &[u8]) -> bool {
    !id.is_empty() && id.len() <= MAX_CLONE_ID_LEN && id.iter().all(|b| b.is_ascii_graphic())
}

/// What the servers decided here that others may want to know: whoever listens
/// (`subscribe_news`; with `[cluster]`, the shared store's link, which tells the other
/// dispatchers) hears it. The cluster knows nothing of who that is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum News {
    /// It learned a clone or partition ID from a backend's `Set-Cookie`.
    Learned { id: String, backend: String },
    /// A backend's health verdict went to or from down here.
    Verdicts,
    /// An operator's command given here (`operator_command`).
    Operator { backend: String, op: Operator },
}

pub struct Servers {
    pub backends: Vec<Backend>,
    /// The in-memory mirror the request path reads (no syscall per request).
    clones: RwLock<HashMap<u64, CloneEntry>>,
    /// Write-through target; `None` when running without the data plane (unit tests).
    clones_map: Mutex<Option<BpfHashMap<MapData, u64, CloneValue>>>,
    events: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Event>>>,
    /// Who hears its news (`subscribe_news`; `None`: nobody, standalone).
    news: Mutex<Option<tokio::sync::mpsc::UnboundedSender<News>>>,
    /// Woken when the clone table gains an entry (learned here or taken from the store):
    /// requests waiting for an unknown clone ID look again.
    pub clones_changed: tokio::sync::Notify,
    pub counters: Arc<Counters>,
    /// The conflict warning, per claiming backend (shared like the counters: a reload
    /// does not start it over).
    conflict_log: Arc<crate::ratelimit::PerKey>,
    /// `http.max_connections_per_backend` the `conn_limit`s were made with.
    conn_limit: usize,
    /// The servers a reload replaced this one with: what this one still learns while its
    /// connections drain is passed on.
    /// (Held strongly: a successor that finished draining first must still receive; a
    /// successor never points back, so the chain goes with its oldest servers.)
    successor: Mutex<Option<Arc<Servers>>>,
    /// The origin of the backends' `failed_at`.
    epoch: std::time::Instant,
    /// How long held requests waited, whatever the outcome.
    pub hold_time: Histogram,
}

impl Servers {
    /// `health` (up, suspect, down) and `admin` (0, drain, disabled) per backend; missing
    /// entries are up and without an operator's state.
    pub fn new(
        cfg: &Config,
        health: &[Health],
        admin: &[Operator],
        clones_map: Option<BpfHashMap<MapData, u64, CloneValue>>,
    ) -> Servers {
        let backends = cfg
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let h = health.get(i).copied().unwrap_or(Health::Up);
                let a = admin.get(i).copied().unwrap_or(Operator::None);
                (b, h, a)
            })
            .map(|(b, h, a)| Backend {
                name: b.name.clone(),
                address: b.address,
                weight: AtomicU32::new(b.weight),
                checks_off: Default::default(),
                replica: b.replica,
                state: AtomicU8::new(effective_state(a, h) as u8),
                health: AtomicU8::new(h as u8),
                admin: AtomicU8::new(a as u8),
                peers_out: Default::default(),
                failed_at: AtomicU64::new(0),
                changed: tokio::sync::Notify::new(),
                latency: Histogram::default(),
                outstanding: AtomicU64::new(0),
                requests: AtomicU64::new(0),
                errors: AtomicU64::new(0),
                connections: Arc::new(AtomicU64::new(0)),
                conn_limit: Arc::new(tokio::sync::Semaphore::new(cfg.http.max_connections_per_backend)),
                slots: Arc::new(crate::capacity::queue::Slots::new(b.maxconn.map(u64::from), b.maxqueue.into())),
                ramp_since: AtomicU64::new(0),
                left: std::sync::atomic::AtomicBool::new(!matches!(
                    effective_state(a, h),
                    BackendState::Up | BackendState::Suspect
                )),
                responses: StatusClasses::default(),
                last_check_us: AtomicU64::new(0),
                changes: Default::default(),
            })
            .collect();
        let mut table = HashMap::new();
        for (i, b) in cfg.backends.iter().enumerate() {
            // Logical names share the table (and CLONES) with clone IDs: XDP reads them
            // for SIP, the proxy for `ibmappid`.
            let ids = b.clone_ids.iter().map(|id| (id, Origin::ConfiguredClone));
            for (id, origin) in ids.chain(b.logical_names.iter().map(|id| (id, Origin::ConfiguredLogicalName))) {
                let e = CloneEntry { configured: true, ..learned(i, b.replica, origin, id.as_bytes()) };
                table.insert(cookie_hash(id.as_bytes()), e);
            }
        }
        for p in &cfg.partitions {
            let e = learned(p.primary, p.replica, Origin::ConfiguredPartition, p.id.as_bytes());
            table.insert(cookie_hash(p.id.as_bytes()), CloneEntry { configured: true, ..e });
        }
        let servers = Servers {
            backends,
            clones: RwLock::new(table),
            clones_map: Mutex::new(clones_map),
            events: Mutex::new(None),
            news: Mutex::new(None),
            clones_changed: tokio::sync::Notify::new(),
            counters: Arc::new(Counters::default()),
            conflict_log: Default::default(),
            conn_limit: cfg.http.max_connections_per_backend,
            successor: Mutex::new(None),
            epoch: std::time::Instant::now(),
            hold_time: Histogram::default(),
        };
        servers.adopt_learned();
        servers.rewrite_all_clones();
        servers
    }

    /// Entries an earlier agent learned and left in the pinned CLONES map: a restarted
    /// agent routes those sessions at once, without waiting for new Set-Cookies. An entry
    /// rewritten for a failover is taken back to its own backend (routing sends its
    /// sessions to the replica for as long as that backend is out).
    fn adopt_learned(&self) {
        let found: Vec<(u64, CloneValue)> = match self.clones_map.lock().unwrap().as_ref() {
            Some(map) => map.iter().filter_map(|r| r.ok()).collect(),
            None => return,
        };
        let mut t = self.clones.write().unwrap();
        let n = self.backends.len();
        let id = |x: u32| (x != NO_BACKEND && (x as usize) < n).then_some(x as usize);
        for (key, v) in found {
            if t.contains_key(&key) {
                continue;
            }
            let (owner, replica) = if v.flags & CLONE_F_FAILED_OVER != 0 {
                (id(v.replica), id(v.owner))
            } else {
                (id(v.owner), id(v.replica))
            };
            if let Some(owner) = owner {
                let e = CloneEntry { owner, replica, configured: false, origin: Origin::Pinned, since: 0, id: None };
                t.insert(key, e);
            }
        }
    }

    /// Health and operator state of backend `i` (what a reload carries over).
    pub fn health_and_admin(&self, i: usize) -> Option<(Health, Operator)> {
        self.backends.get(i).map(|b| (b.health(), b.operator()))
    }

    /// Owner and replica of a clone or partition ID.
    pub fn owner(&self, id: &[u8]) -> Option<(usize, Option<usize>)> {
        self.clones.read().unwrap().get(&cookie_hash(id)).map(|e| (e.owner, e.replica))
    }

    /// Owner and replica of an entry by its hash (`cookie_hash` of the ID): what the SIP
    /// scanner gives for a logical name.
    pub fn owner_by_hash(&self, key: u64) -> Option<(usize, Option<usize>)> {
        self.clones.read().unwrap().get(&key).map(|e| (e.owner, e.replica))
    }

    /// Recomputes the effective state from health and the operator's state (two
    /// dimensions, `effective_state`); returns the old and new state when it changed (and
    /// wakes the requests held on it).
    fn settle(&self, backend: usize) -> Option<(BackendState, BackendState)> {
        let b = &self.backends[backend];
        // With its checks disabled, no verdict counts (HAProxy's `disable health`).
        let health = match (b.checks_disabled(), b.peers_out()) {
            (true, _) => Health::Up,
            (false, true) => Health::Down,
            (false, false) => b.health(),
        };
        let new = effective_state(b.operator(), health);
        let old = BackendState::from_u8(b.state.swap(new as u8, Ordering::SeqCst));
        if old == new {
            return None;
        }
        b.track_return(new);
        b.changed.notify_waiters();
        Some((old, new))
    }

    /// A health verdict (active check or passive signal). One to or from down is news.
    pub fn set_health(&self, backend: usize, health: Health) -> Option<(BackendState, BackendState)> {
        let before = Health::from_u8(self.backends[backend].health.swap(health as u8, Ordering::SeqCst));
        if (before == Health::Down) != (health == Health::Down) {
            self.tell(News::Verdicts);
        }
        self.settle(backend)
    }

    /// The operator's command given here (`Operator::None` clears it): applied, and news.
    pub fn operator_command(&self, backend: usize, op: Operator) -> Option<(BackendState, BackendState)> {
        let changed = self.set_admin(backend, op);
        self.tell(News::Operator { backend: self.backends[backend].name.clone(), op });
        changed
    }

    /// An operator disables (`true`) or enables the backend's health checks: while
    /// disabled, it counts as healthy whatever the checks said; once enabled, the checks
    /// go on from the health they left. Returns the change of state, if any.
    pub fn set_checks_disabled(&self, backend: usize, disabled: bool) -> Option<(BackendState, BackendState)> {
        self.backends[backend].checks_off.store(disabled, Ordering::SeqCst);
        self.settle(backend)
    }

    /// The operator's state (`Operator::None` clears it).
    pub fn set_admin(&self, backend: usize, op: Operator) -> Option<(BackendState, BackendState)> {
        self.backends[backend].admin.store(op as u8, Ordering::SeqCst);
        self.settle(backend)
    }

    /// A request saw the backend fail (`cause`: refused, reset, timed out...): suspect at
    /// once, and the control loop is told so that it writes the maps and confirms with
    /// checks.
    pub fn passive_failure(&self, backend: usize, cause: Cause) {
        let b = &self.backends[backend];
        if b.checks_disabled() {
            // No check would clear the suspicion: failures are the requests' only.
            return;
        }
        b.failed_at.store(self.epoch.elapsed().as_nanos() as u64 + 1, Ordering::SeqCst);
        let (up, suspect) = (Health::Up as u8, Health::Suspect as u8);
        if b.health.compare_exchange(up, suspect, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.counters.passive_failures.fetch_add(1, Ordering::Relaxed);
            if self.settle(backend).is_some() {
                tracing::warn!(backend = %b.name, cause = %cause, "backend suspect after a failed request");
            }
            self.tell_control(Event::PassiveFailure(backend, cause));
        }
    }

    fn tell_control(&self, e: Event) {
        if let Some(tx) = self.events.lock().unwrap().as_ref() {
            let _ = tx.send(e);
        }
    }

    /// The shared rule's verdict on `backend` (most live dispatchers see it down).
    pub fn set_peers_out(&self, backend: usize, out: bool) {
        self.backends[backend].peers_out.store(out, Ordering::SeqCst);
        if self.settle(backend).is_some() {
            self.tell_control(Event::Shared(backend));
        }
    }

    /// The operator's state as the shared store has it (given on any dispatcher).
    pub fn set_admin_shared(&self, backend: usize, op: Operator) {
        if self.set_admin(backend, op).is_some() {
            self.tell_control(Event::Shared(backend));
        }
    }

    fn tell(&self, news: News) {
        if let Some(tx) = self.news.lock().unwrap().as_ref() {
            let _ = tx.send(news);
        }
    }

    /// Someone listens to its news, so clone IDs may also be learned elsewhere
    /// (`[cluster]`: the shared store).
    pub fn shared(&self) -> bool {
        self.news.lock().unwrap().is_some()
    }

    /// Where its news goes from now on, and its successors' (a reload's servers keeps the
    /// listener).
    pub fn subscribe_news(&self) -> tokio::sync::mpsc::UnboundedReceiver<News> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.news.lock().unwrap() = Some(tx);
        rx
    }

    /// A clone or partition ID as the shared store has it: the first learning anywhere
    /// wins, so it replaces what this dispatcher learned itself (a configured entry is
    /// the same everywhere and is kept). Returns whether the table changed.
    pub fn adopt_shared_clone(&self, id: &[u8], backend: usize) -> bool {
        let key = cookie_hash(id);
        let entry = learned(backend, self.backends[backend].replica, Origin::Store, id);
        if !clone_id_ok(id) {
            self.refuse_clone_id(id);
            return false;
        }
        {
            let mut t = self.clones.write().unwrap();
            match t.get(&key) {
                Some(e) if e.configured || e.owner == backend => return false,
                Some(e) => {
                    crate::ratelimit::warn_that(
                        "shared clone owner",
                        &format_args!(
                            "clone ID {} learned for {} here and for {} elsewhere first: taking the shared owner",
                            String::from_utf8_lossy(id).escape_debug(),
                            self.backends[e.owner].name,
                            self.backends[backend].name
                        ),
                    );
                }
                None if t.len() >= MAX_CLONES as usize => {
                    drop(t);
                    self.table_full(id);
                    return false;
                }
                None => {}
            }
            t.insert(key, entry.clone());
        }
        self.write_through(key, entry);
        self.clones_changed.notify_waiters();
        let next = self.successor.lock().unwrap().clone();
        if let Some(next) = next.filter(|n| backend < n.backends.len()) {
            next.adopt_shared_clone(id, backend);
        }
        true
    }

    /// A shared clone ID deleted from the store: no longer routed by here (a configured
    /// one stays). The way out of a table filled with junk: delete the keys. Returns
    /// whether the table changed.
    pub fn forget_shared_clone(&self, id: &[u8]) -> bool {
        self.forget_key(cookie_hash(id))
    }

    /// After a fresh read of the shared store: the entries that came from it (`Origin::
    /// Store`) and are no longer in it were deleted meanwhile (events a new watch never
    /// sees): forgotten, as a deletion event would have them. `in_store`: the hashes of the
    /// IDs the store holds. Returns how many went.
    pub fn forget_store_clones_not_in(&self, in_store: &std::collections::HashSet<u64>) -> usize {
        let gone: Vec<u64> = self
            .clones
            .read()
            .unwrap()
            .iter()
            .filter(|(k, e)| !e.configured && e.origin == Origin::Store && !in_store.contains(k))
            .map(|(k, _)| *k)
            .collect();
        gone.into_iter().filter(|k| self.forget_key(*k)).count()
    }

    /// Forgets a learned entry here, in CLONES and in the successors (a configured one
    /// stays). Returns whether the table changed.
    fn forget_key(&self, key: u64) -> bool {
        {
            let mut t = self.clones.write().unwrap();
            match t.get(&key) {
                Some(e) if !e.configured => {
                    t.remove(&key);
                }
                _ => return false,
            }
        }
        if let Some(map) = self.clones_map.lock().unwrap().as_mut() {
            let _ = map.remove(&key);
        }
        let next = self.successor.lock().unwrap().clone();
        if let Some(next) = next {
            next.forget_key(key);
        }
        true
    }

    /// The clone table as `dispatcher clones` lists it: the SIP logical names (`sip`) or
    /// the clone and partition IDs, sorted by ID, `limit` of them from `offset`; and how
    /// many there are in all.
    pub fn clone_rows(&self, sip: bool, offset: usize, limit: usize) -> (usize, Vec<CloneRow>) {
        let t = self.clones.read().unwrap();
        let mut rows: Vec<CloneRow> = t.iter().filter(|(_, e)| e.origin.logical_name() == sip).map(row).collect();
        drop(t);
        rows.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        let total = rows.len();
        (total, rows.into_iter().skip(offset).take(limit).collect())
    }

    /// `dispatcher clones delete ID`: a learned entry forgotten (here, in the successors
    /// a reload made, in CLONES): the next request that carries it is routed as one with
    /// an unknown ID (balanced), and its owner's next `Set-Cookie` (or SIP answer) teaches
    /// it again. `id` may be `#` and the hash in hex (an entry an earlier agent left, whose
    /// text is not known). A configured entry is refused, as is an ID not in the table.
    /// Never to a non-owner: while its owner or the owner's replica can serve (neither down
    /// nor disabled), its sessions would go to servers that do not hold them, so it is
    /// refused unless `force`.
    pub fn delete_learned(&self, id: &str, force: bool) -> Result<CloneRow, String> {
        let key = match id.strip_prefix('#') {
            Some(hex) if hex.len() == 16 => {
                u64::from_str_radix(hex, 16).map_err(|_| format!("{id:?}: # and 16 hex digits name a hash"))?
            }
            _ => cookie_hash(id.as_bytes()),
        };
        let found = self.clones.read().unwrap().get(&key).cloned();
        let Some(e) = found else {
            return Err(format!(
                "no clone ID or logical name {id:?} in the table ({} entries; `dispatcher clones` lists them)",
                self.clone_count()
            ));
        };
        if e.configured {
            let owner = &self.backends[e.owner].name;
            return Err(match e.origin {
                Origin::ConfiguredPartition => format!("{id:?} is a configured partition (primary {owner}): it cannot be deleted; remove its [[partition]] and reload"),
                o => format!("{id:?} is configured (in {}'s {}): it cannot be deleted; remove it from the configuration and reload", owner, o.words().1),
            });
        }
        let serving = |b: usize| {
            self.backends.get(b).is_some_and(|x| !matches!(x.state(), BackendState::Down | BackendState::Disabled))
        };
        let holders = std::iter::once(e.owner).chain(e.replica).filter(|&b| serving(b));
        let holders: Vec<&str> = holders.map(|b| self.backends[b].name.as_str()).collect();
        if !holders.is_empty() && !force {
            return Err(format!(
                "{id:?} belongs to {}, which can serve its sessions ({} now): deleted, its requests would be balanced to servers that do not hold them; nothing deleted. Disable or drain them first, or add --force (?force=true)",
                self.backends[e.owner].name,
                holders.join(" and ")
            ));
        }
        self.forget_key(key);
        Ok(row((&key, &e)))
    }

    /// Did a request see `backend` fail after `t` (when a check began)?
    pub fn failed_since(&self, backend: usize, t: std::time::Instant) -> bool {
        let at = self.backends[backend].failed_at.load(Ordering::SeqCst);
        at != 0 && at > t.saturating_duration_since(self.epoch).as_nanos() as u64 + 1
    }

    /// Hands the CLONES map over (to the servers that replaces this one on reload).
    pub fn take_clones_map(&self) -> Option<BpfHashMap<MapData, u64, CloneValue>> {
        self.clones_map.lock().unwrap().take()
    }

    /// A successor that will not serve (its reload was refused) learns nothing more.
    pub fn forget_successor(&self) {
        *self.successor.lock().unwrap() = None;
    }

    /// The configuration's `maxconn` and `maxqueue` on the (shared) slots: a reload's
    /// last step, once nothing can refuse it.
    pub fn apply_limits(&self, cfg: &Config) {
        for (be, b) in self.backends.iter().zip(&cfg.backends) {
            be.slots.set_limits(b.maxconn.map(u64::from), b.maxqueue.into());
        }
    }

    /// The servers that replace `old` on a reload (ids kept by name): built before it
    /// serves a request, with `old`'s learned (not configured) clone table, so that no
    /// request with a learned clone ID is balanced for want of its entry; the same counters
    /// and, per backend, the same connection gauge and limit and the same `maxconn`
    /// slots (no limit is doubled while `old` drains; the new limits come with
    /// `apply_limits`). What `old` learns meanwhile is passed on. The CLONES map follows
    /// with `adopt_map` once this servers takes over.
    pub fn successor_of(cfg: &Config, health: &[Health], admin: &[Operator], old: &Arc<Servers>) -> Arc<Servers> {
        let mut c = Servers::new(cfg, health, admin, None);
        c.counters = old.counters.clone();
        c.conflict_log = old.conflict_log.clone();
        *c.news.lock().unwrap() = old.news.lock().unwrap().clone();
        for (i, prev) in old.backends.iter().enumerate().take(c.backends.len()) {
            if prev.peers_out() {
                c.backends[i].peers_out.store(true, Ordering::SeqCst);
                c.settle(i);
            }
        }
        for (new, prev) in c.backends.iter_mut().zip(&old.backends) {
            new.connections = prev.connections.clone();
            new.ramp_since.store(prev.ramp_since.load(Ordering::SeqCst), Ordering::SeqCst);
            new.changes = prev.changes.clone();
            new.last_check_us.store(prev.last_check_us.load(Ordering::Relaxed), Ordering::Relaxed);
            new.left.store(prev.left.load(Ordering::SeqCst), Ordering::SeqCst);
            // Back by the reload (a retired backend configured again): ramps up as if it
            // had come back by itself.
            new.track_return(new.state());
            // Requests in flight in the old generation keep their slots: the limit holds
            // over both while it drains.
            new.slots = prev.slots.clone();
            if c.conn_limit == old.conn_limit {
                new.conn_limit = prev.conn_limit.clone();
            }
        }
        // A backend the reload adds ramps up like one that came back.
        for b in c.backends.iter().skip(old.backends.len()) {
            b.ramp_since.store(mono_ns(), Ordering::SeqCst);
        }
        // Linked before the copy: what `old` learns from here on is passed on, what it
        // learned before is copied (an ID that arrives both ways is simply known).
        let c = Arc::new(c);
        *old.successor.lock().unwrap() = Some(c.clone());
        c.inherit(old);
        c
    }

    fn inherit(&self, old: &Servers) {
        let learned: Vec<(u64, CloneEntry)> =
            old.clones.read().unwrap().iter().filter(|(_, e)| !e.configured).map(|(k, e)| (*k, e.clone())).collect();
        {
            let mut t = self.clones.write().unwrap();
            for (k, e) in learned {
                if e.owner < self.backends.len() {
                    t.entry(k).or_insert(CloneEntry { replica: self.backends[e.owner].replica, ..e });
                }
            }
        }
        // Ids are kept by name across a reload: per-backend totals go on (added: whatever
        // this servers counted already stays counted).
        for (new, old) in self.backends.iter().zip(&old.backends) {
            let classes = new.responses.0.iter().zip(&old.responses.0);
            for (to, from) in [(&new.requests, &old.requests), (&new.errors, &old.errors)].into_iter().chain(classes) {
                to.fetch_add(from.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// Takes the CLONES map over from `old` and writes this servers's table into it
    /// (the configured entries a reload added, the replicas it changed).
    pub fn adopt_map(&self, old: &Servers) {
        *self.clones_map.lock().unwrap() = old.take_clones_map();
        self.rewrite_all_clones();
    }

    /// Where the control loop hears of passive failures.
    pub fn subscribe_events(&self) -> tokio::sync::mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        *self.events.lock().unwrap() = Some(tx);
        rx
    }

    /// Rewrites the CLONES entries owned by `backend` (its state changed: they name its
    /// replica while it is out, itself again when it is back); returns how many.
    pub fn rewrite_clones_of(&self, backend: usize) -> u64 {
        let owned: Vec<(u64, CloneEntry)> = self
            .clones
            .read()
            .unwrap()
            .iter()
            .filter(|(_, e)| e.owner == backend)
            .map(|(k, e)| (*k, e.clone()))
            .collect();
        let n = owned.len() as u64;
        for (k, e) in owned {
            self.write_through(k, e);
        }
        n
    }

    /// Rewrites every CLONES entry from the table and the current states.
    pub fn rewrite_all_clones(&self) {
        let entries: Vec<(u64, CloneEntry)> =
            self.clones.read().unwrap().iter().map(|(k, v)| (*k, v.clone())).collect();
        for (k, e) in entries {
            self.write_through(k, e);
        }
    }

    pub fn clone_count(&self) -> usize {
        self.clones.read().unwrap().len()
    }

    /// Records that `backend` issued a session cookie naming `id` as its clone ID.
    pub fn learn(&self, id: &[u8], backend: usize) -> Learned {
        self.learn_as(id, backend, true, Origin::Response)
    }

    /// Records that SIP container `backend` said it serves logical name `ln`.
    pub fn learn_logical_name(&self, ln: &[u8], backend: usize) -> Learned {
        self.learn_as(ln, backend, true, Origin::SipCheck)
    }

    /// Records that a SIP dialog naming `ln` belongs to container `backend` (the one that
    /// took its first request). Callers write those names: at most `MAX_DIALOG_LEARNED`
    /// are kept this way, so that a caller inventing names cannot fill the clone table
    /// (a name beyond it is refused, its dialogs still go by their pins).
    pub fn learn_logical_name_from_dialog(&self, ln: &[u8], backend: usize) -> Learned {
        let key = cookie_hash(ln);
        {
            let t = self.clones.read().unwrap();
            if !t.contains_key(&key)
                && t.values().filter(|e| e.origin == Origin::SipDialog).count() >= MAX_DIALOG_LEARNED
            {
                return Learned::Refused;
            }
        }
        self.learn_as(ln, backend, true, Origin::SipDialog)
    }

    /// `counted`: false for what a predecessor passes on (it counted it already; the
    /// counters are shared).
    fn learn_as(&self, id: &[u8], backend: usize, counted: bool, origin: Origin) -> Learned {
        if !clone_id_ok(id) {
            if counted {
                self.refuse_clone_id(id);
            }
            return Learned::Refused;
        }
        let key = cookie_hash(id);
        if let Some(e) = self.clones.read().unwrap().get(&key) {
            return match (e.owner == backend, counted) {
                (true, _) => Learned::Known,
                (false, true) => self.conflict(id, backend, e.owner),
                // Passed on by a predecessor, which counted the conflict itself.
                (false, false) => Learned::Conflict { owner: e.owner },
            };
        }
        let entry = learned(backend, self.backends[backend].replica, origin, id);
        {
            let mut t = self.clones.write().unwrap();
            if let Some(e) = t.get(&key) {
                let owner = e.owner;
                drop(t);
                return if owner == backend { Learned::Known } else { self.conflict(id, backend, owner) };
            }
            if t.len() >= MAX_CLONES as usize {
                drop(t);
                if counted {
                    self.table_full(id);
                }
                return Learned::Refused;
            }
            t.insert(key, entry.clone());
        }
        self.write_through(key, entry);
        self.clones_changed.notify_waiters();
        if counted {
            self.counters.learned.fetch_add(1, Ordering::Relaxed);
            tracing::info!(clone = %String::from_utf8_lossy(id), backend = %self.backends[backend].name, "learned clone ID");
            // Once: a predecessor passing it on published it already.
            self.tell(News::Learned {
                id: String::from_utf8_lossy(id).into_owned(),
                backend: self.backends[backend].name.clone(),
            });
        }
        let next = self.successor.lock().unwrap().clone();
        if let Some(next) = next.filter(|n| backend < n.backends.len()) {
            next.learn_as(id, backend, false, origin);
        }
        Learned::New
    }

    /// The table holds as many IDs as `CLONES` (`MAX_CLONES`): a new ID beyond it is not
    /// kept (its sessions are balanced, as the plug-in does with an unknown clone ID), and
    /// counted.
    fn table_full(&self, id: &[u8]) {
        self.counters.clones_full.fetch_add(1, Ordering::Relaxed);
        crate::ratelimit::warn_that(
            "clone table full",
            &format_args!(
                "clone table full ({MAX_CLONES} IDs): `{}` not kept; its sessions are balanced",
                String::from_utf8_lossy(&id[..id.len().min(MAX_CLONE_ID_LEN)]).escape_debug()
            ),
        );
    }

    fn refuse_clone_id(&self, id: &[u8]) {
        self.counters.clone_ids_refused.fetch_add(1, Ordering::Relaxed);
        crate::ratelimit::warn_that(
            "clone id refused",
            &format_args!(
                "clone ID refused ({} bytes; at most {MAX_CLONE_ID_LEN} printable characters): `{}...`",
                id.len(),
                String::from_utf8_lossy(&id[..id.len().min(32)]).escape_debug()
            ),
        );
    }

    fn conflict(&self, id: &[u8], backend: usize, owner: usize) -> Learned {
        self.counters.learn_conflicts.fetch_add(1, Ordering::Relaxed);
        // A backend that claims another's IDs does so on every answer (a SIP container
        // at every OPTIONS check): logged once per 10 s per claiming backend, with how
        // many were left unlogged; the counter counts every one.
        let now = std::time::Instant::now();
        if let Some(more) = self.conflict_log.admit(backend as u64, now) {
            tracing::warn!(
                clone = %String::from_utf8_lossy(id),
                claimed_by = %self.backends[backend].name,
                owner = %self.backends[owner].name,
                more_since_last = more,
                "clone ID claimed by a second backend; keeping the first owner"
            );
        }
        Learned::Conflict { owner }
    }

    /// Writes an entry to CLONES as the backends' states make it: while its owner is out
    /// and its replica serves, it names the replica (flagged as failed over), otherwise
    /// the owner. The same state gives the same entry on every dispatcher.
    fn write_through(&self, key: u64, e: CloneEntry) {
        if let Some(map) = self.clones_map.lock().unwrap().as_mut() {
            let stand_in =
                e.replica.filter(|&r| self.backends[e.owner].state().is_out() && self.backends[r].serves_sessions());
            let v = match stand_in {
                Some(r) => CloneValue { owner: r as u32, replica: e.owner as u32, flags: CLONE_F_FAILED_OVER, _pad: 0 },
                None => CloneValue {
                    owner: e.owner as u32,
                    replica: e.replica.map(|r| r as u32).unwrap_or(NO_BACKEND),
                    flags: 0,
                    _pad: 0,
                },
            };
            // A learned name yields to a dialog pinned elsewhere (dispatcher-ebpf/src/sip.rs).
            let v = CloneValue { flags: v.flags | if e.configured { 0 } else { CLONE_F_LEARNED }, ..v };
            if let Err(err) = map.insert(key, v, 0) {
                tracing::warn!(error = %err, "writing CLONES");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = "[dispatcher]\ninterface = \"lo\"\n\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\nreplica = \"b\"\n\n[[backend]]\nname = \"b\"\naddress = \"10.0.0.2\"\nreplica = \"a\"\n\n[[vip]]\nname = \"app\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n";

    /// `dispatcher clones`: entries listed by ID with where they come from; a learned one
    /// deleted (learned again afterwards), a configured one refused, an unknown one too.
    #[test]
    fn learned_entries_are_listed_and_deleted_configured_ones_stay() {
        let text =
            CFG.replace("replica = \"b\"\n", "replica = \"b\"\nclone_ids = [\"ca\"]\nlogical_names = [\"lna\"]\n");
        let cfg = Config::parse(&text, "t").unwrap();
        let c = Servers::new(&cfg, &[], &[], None);
        assert_eq!(c.learn(b"cb", 1), Learned::New);
        assert_eq!(c.learn_logical_name(b"lnb", 1), Learned::New);
        let (total, rows) = c.clone_rows(false, 0, 10);
        let seen: Vec<(&str, usize, Origin)> = rows.iter().map(|r| (r.id.as_str(), r.owner, r.origin)).collect();
        assert_eq!((total, seen), (2, vec![("ca", 0, Origin::ConfiguredClone), ("cb", 1, Origin::Response)]));
        assert!(rows[1].since > 0 && rows[1].replica == Some(0));
        let (total, rows) = c.clone_rows(true, 1, 10);
        assert_eq!((total, rows.len(), rows[0].origin), (2, 1, Origin::SipCheck), "a page from offset 1");
        // Never to a non-owner: refused while the owner or its replica can serve.
        let why = c.delete_learned("cb", false).unwrap_err();
        assert!(why.contains("\"cb\" belongs to b, which can serve its sessions (b and a now)"), "{why}");
        assert_eq!(c.owner(b"cb"), Some((1, Some(0))), "kept");
        c.set_admin(1, Operator::Disabled);
        assert!(c.delete_learned("cb", false).unwrap_err().contains("(a now)"), "the replica can still serve");
        c.set_admin(0, Operator::Disabled);
        assert_eq!(c.delete_learned("cb", false).unwrap().owner, 1, "both out: deleted");
        c.set_admin(0, Operator::None);
        c.set_admin(1, Operator::None);
        assert_eq!(c.owner(b"cb"), None, "forgotten: routed as unknown");
        assert_eq!(c.learn(b"cb", 1), Learned::New, "and learned again");
        assert_eq!(c.delete_learned("cb", true).unwrap().owner, 1, "--force");
        assert!(c.delete_learned("ca", true).unwrap_err().contains("\"ca\" is configured (in a's clone_ids)"));
        assert!(c.delete_learned("lna", true).unwrap_err().contains("logical_names"));
        assert!(c.delete_learned("nosuch", true).unwrap_err().starts_with("no clone ID or logical name \"nosuch\""));
        let by_hash = format!("#{:016x}", cookie_hash(b"lnb"));
        assert_eq!(c.delete_learned(&by_hash, true).unwrap().id, "lnb", "by its hash");
        assert_eq!(c.owner(b"ca"), Some((0, Some(1))));
    }

    /// After a fresh read of the store, the IDs that came from it and are gone from it
    /// (deleted while no watch saw it) are forgotten; IDs learned here and configured
    /// ones stay.
    #[test]
    fn store_ids_deleted_meanwhile_are_forgotten_on_a_fresh_read() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let c = Servers::new(&cfg, &[], &[], None);
        assert!(c.adopt_shared_clone(b"kept", 0));
        assert!(c.adopt_shared_clone(b"deleted", 1));
        assert_eq!(c.learn(b"mine", 1), Learned::New);
        let in_store: std::collections::HashSet<u64> = [cookie_hash(b"kept")].into();
        assert_eq!(c.forget_store_clones_not_in(&in_store), 1);
        assert_eq!((c.owner(b"kept"), c.owner(b"deleted")), (Some((0, Some(1))), None));
        assert_eq!(c.owner(b"mine"), Some((1, Some(0))), "learned here: kept");
    }

    /// The clone table holds as many IDs as `CLONES`: a new one past that is not kept (and
    /// counted), a known one still routes; a malformed ID is never kept.
    #[test]
    fn the_clone_table_is_bounded_by_the_map() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let c = Servers::new(&cfg, &[], &[], None);
        for k in 0..MAX_CLONES {
            assert_eq!(c.learn(format!("c{k}").as_bytes(), (k % 2) as usize), Learned::New);
        }
        assert_eq!(c.clone_count(), MAX_CLONES as usize);
        assert_eq!(c.learn(b"one-more", 0), Learned::Refused);
        assert!(!c.adopt_shared_clone(b"shared-more", 1));
        assert_eq!(c.counters.clones_full.load(Ordering::Relaxed), 2);
        assert_eq!(c.owner(b"one-more"), None);
        assert_eq!(c.learn(b"c7", 1), Learned::Known, "a known ID still routes");
        let c = Servers::new(&cfg, &[], &[], None);
        assert_eq!(c.learn(&[b'x'; MAX_CLONE_ID_LEN + 1], 0), Learned::Refused);
        assert_eq!(c.learn(b"bad id", 0), Learned::Refused);
        assert!(!c.adopt_shared_clone(b"", 0));
        assert_eq!(c.counters.clone_ids_refused.load(Ordering::Relaxed), 3);
        assert_eq!(c.clone_count(), 0);
    }

    /// A backend that claims another's ID at every check (a malicious SIP container
    /// answering OPTIONS with another's logical name, twice a second): refused every
    /// time, counted every time, warned about once per 10 s.
    #[test]
    fn a_repeated_claim_is_refused_every_time_and_warned_about_once_per_interval() {
        #[derive(Clone, Default)]
        struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Lines {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let sink = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let cfg = Config::parse(CFG, "t").unwrap();
        let c = Servers::new(&cfg, &[], &[], None);
        assert_eq!(c.learn(b"LN-a", 0), Learned::New);
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..40 {
                assert_eq!(c.learn(b"LN-a", 1), Learned::Conflict { owner: 0 });
            }
        });
        assert_eq!(c.owner(b"LN-a"), Some((0, Some(1))), "the first owner kept");
        assert_eq!(c.counters.learn_conflicts.load(Ordering::Relaxed), 40);
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let warned = text.lines().filter(|l| l.contains("claimed by a second backend")).count();
        assert_eq!(warned, 1, "40 claims within 10 s, one warning:\n{text}");
    }

    /// Its news reaches whoever listens, and a reload's servers keeps the listener: a
    /// clone ID learned (once: not again when passed on to the successor), a verdict to or
    /// from down (not suspect), an operator's command given here (not the store's word).
    #[test]
    fn news_goes_to_the_listener_and_follows_a_reload() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let c = Arc::new(Servers::new(&cfg, &[], &[], None));
        assert!(!c.shared());
        let mut news = c.subscribe_news();
        assert!(c.shared());
        let mut heard = || std::iter::from_fn(|| news.try_recv().ok()).collect::<Vec<_>>();
        c.set_health(0, Health::Suspect);
        c.set_admin_shared(1, Operator::Drain);
        c.learn(b"bad id", 0);
        assert_eq!(heard(), vec![], "suspect, the store's word and a refused ID are not news");
        c.learn(b"cA", 0);
        c.set_health(0, Health::Down);
        c.operator_command(1, Operator::Disabled);
        c.set_health(0, Health::Up);
        assert_eq!(
            heard(),
            vec![
                News::Learned { id: "cA".into(), backend: "a".into() },
                News::Verdicts,
                News::Operator { backend: "b".into(), op: Operator::Disabled },
                News::Verdicts,
            ]
        );
        let next = Servers::successor_of(&cfg, &[], &[], &c);
        c.learn(b"cB", 1);
        assert_eq!(next.owner(b"cB"), Some((1, Some(0))), "passed on");
        next.learn(b"cC", 0);
        let learned: Vec<_> = heard().into_iter().filter(|n| matches!(n, News::Learned { .. })).collect();
        assert_eq!(
            learned,
            vec![
                News::Learned { id: "cB".into(), backend: "b".into() },
                News::Learned { id: "cC".into(), backend: "a".into() },
            ],
            "each once, the successor's too"
        );
    }

    /// A check begun before a request saw the backend fail cannot clear that failure.
    #[test]
    fn a_failure_outdates_the_checks_begun_before_it() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let c = Servers::new(&cfg, &[], &[], None);
        let before = std::time::Instant::now();
        assert!(!c.failed_since(0, before), "no failure yet");
        std::thread::sleep(std::time::Duration::from_millis(2));
        c.passive_failure(0, Cause::Reset);
        assert!(c.failed_since(0, before));
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(!c.failed_since(0, std::time::Instant::now()), "a check begun after it counts");
    }

    /// A reload's successor knows what its predecessor learned before it started and
    /// what it learns while it drains; the totals are counted once.
    #[test]
    fn a_successor_learns_what_its_predecessor_still_learns() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let old = Arc::new(Servers::new(&cfg, &[], &[], None));
        old.learn(b"early", 0);
        let new = Servers::successor_of(&cfg, &[], &[], &old);
        assert_eq!(new.owner(b"early"), Some((0, Some(1))));
        old.learn(b"late", 1);
        assert_eq!(new.owner(b"late"), Some((1, Some(0))), "learned by the draining cluster, passed on");
        assert_eq!(new.counters.learned.load(Ordering::Relaxed), 2, "shared counters, each learning once");
        assert!(Arc::ptr_eq(&new.backends[0].conn_limit, &old.backends[0].conn_limit), "one limit while draining");
        // A second reload: the first successor may be gone before the oldest servers is.
        let newer = Servers::successor_of(&cfg, &[], &[], &new);
        drop(new);
        old.learn(b"later", 0);
        assert_eq!(newer.owner(b"later"), Some((0, Some(1))), "passed along the chain");
        assert_eq!(newer.counters.learned.load(Ordering::Relaxed), 3);
    }

    /// A backend that left ramps up when it returns, however it returns: directly, by way
    /// of suspect, or by a reload that configures it again; one that only was suspect
    /// does not.
    #[test]
    fn every_return_ramps_up_and_a_suspicion_alone_does_not() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let ramping = |c: &Servers| c.backends[0].ramp_since.load(Ordering::SeqCst) != 0;
        let c = Servers::new(&cfg, &[], &[], None);
        c.set_health(0, Health::Suspect);
        c.set_health(0, Health::Up);
        assert!(!ramping(&c), "never left");
        c.set_health(0, Health::Down);
        c.set_health(0, Health::Suspect);
        assert!(!ramping(&c));
        c.set_health(0, Health::Up);
        assert!(ramping(&c), "down, suspect, up: back");
        // Retired by a reload (disabled), then configured again by the next.
        let old = Arc::new(Servers::new(&cfg, &[Health::Up; 2], &[Operator::Disabled, Operator::None], None));
        assert!(!ramping(&old));
        let back = Servers::successor_of(&cfg, &[Health::Up; 2], &[Operator::None; 2], &old);
        assert!(ramping(&back), "re-added by a reload: ramps up");
        assert_eq!(back.backends[1].ramp_since.load(Ordering::SeqCst), 0, "the other one never left");
    }
}
