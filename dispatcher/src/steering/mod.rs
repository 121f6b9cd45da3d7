//! Connection steering for HTTP VIPs behind ECMP, the agent's side: from the shared
//! membership (`shared`) to the ownership tables the XDP program reads (`STEER`,
//! `STEER_CONF`; the packet side is `dispatcher-ebpf/src/steer.rs`).
//!
//! - A membership change installs a new table in a free slot (four take turns, a fifth
//!   holds the fallback: the membership without this dispatcher), then flips
//!   `STEER_CONF` in one word: the new table becomes current, the old ones previous.
//! - The two newest previous tables serve second chances for `[cluster] second_chance`.
//! - A beacon in `STEER_CONF` tells the XDP program the agent is there.
//! - The HTTP path asks `Ownership::keeps` (a handle the agent gives the listener) before
//!   answering: a connection this dispatcher no longer owns (or every connection, once it
//!   leaves) is told `Connection: close` with its next response, so keep-alive clients
//!   move to the owner between requests, not by a reset.

pub mod table;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, RwLock,
    },
    time::{Duration, Instant},
};

use dispatcher_common::{
    steer_sel3, SteerConf, STEER_FALLBACK, STEER_HAS_PREV, STEER_HAS_PREV2, STEER_LEFT, STEER_ON, STEER_TAKEOVER,
};
use tokio::sync::watch;

use crate::{api::SteeringStatus, dataplane::tables::Tables};
pub use table::{Peer, Table};

/// What the HTTP path asks before answering: does this dispatcher keep the connection?
/// One handle, made by the agent, written by `Steering` (the current table) and by the
/// agent (`dispatcher leave`, and at stop), read by the listener's connections.
#[derive(Default)]
pub struct Ownership {
    /// The current table and who this dispatcher is (none: steering is off, or no table
    /// yet; every connection is kept).
    current: RwLock<Option<(Arc<Table>, String)>>,
    /// Every connection is closed after its next response.
    leaving: AtomicBool,
    /// The fallback table (the membership without this dispatcher: who takes each slot if
    /// it dies) and a number that changes with it (`takeover::outbox`).
    fallback: RwLock<Option<(u64, Arc<Table>)>>,
}

impl Ownership {
    /// Should the connection in table slot `slot` stay open after this response?
    pub fn keeps(&self, slot: usize) -> bool {
        if self.leaving.load(Ordering::Relaxed) {
            return false;
        }
        match &*self.current.read().unwrap() {
            None => true,
            Some((table, me)) => table.owner_of_slot(slot).is_none_or(|p| p.name == *me),
        }
    }

    pub fn set_leaving(&self, leaving: bool) {
        self.leaving.store(leaving, Ordering::Relaxed);
    }

    /// The fallback table and its generation (none before the first table).
    pub fn fallback(&self) -> Option<(u64, Arc<Table>)> {
        self.fallback.read().unwrap().clone()
    }
}

/// The ownership-table slot of the connection from `client` to `local` (its flow hash,
/// as XDP computes it): once per connection.
pub fn slot_of(client: SocketAddr, local: SocketAddr) -> usize {
    (dispatcher_common::hash::flow_hash(&table::tcp_key(client, local)) % dispatcher_common::STEER_SIZE) as usize
}

#[derive(Clone)]
struct Installed {
    index: u32,
    table: Arc<Table>,
}

struct State {
    current: Option<Installed>,
    /// The earlier tables still serving second chances, newest first (at most two), each
    /// with the time it goes.
    previous: Vec<(Installed, Instant)>,
    generation: u32,
    changed: Option<Instant>,
    /// What the last change did (`+d3 -d2`).
    change: Option<String>,
}

/// Earlier tables kept at once: two changes within the second-chance time lose nothing.
const KEPT_PREVIOUS: usize = 2;

pub struct Steering {
    tables: Arc<Mutex<Tables>>,
    me: String,
    mac: [u8; 6],
    second_chance: Duration,
    joined: Arc<AtomicBool>,
    state: Mutex<State>,
    /// The membership last seen (before this dispatcher's own joined flag applies).
    last: Mutex<Option<Vec<Peer>>>,
    /// What `STEER_CONF` holds (the beacon rewrites it with a fresh time).
    conf: Mutex<SteerConf>,
    /// Wakes `run` after an install from elsewhere (join, leave): a new deadline.
    wake: tokio::sync::Notify,
    /// Where the HTTP path reads the current table.
    ownership: Arc<Ownership>,
    /// Takeover records are armed (`STEER_TAKEOVER`).
    takeover_armed: AtomicBool,
}

/// How often the agent's beacon is written (the XDP program takes the agent for gone
/// after `STEER_AGENT_STALE_NS` without one).
pub const BEACON_EVERY: Duration = Duration::from_millis(200);

/// CLOCK_MONOTONIC, the clock of `bpf_ktime_get_coarse_ns` (the beacon's time).
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) } != 0 {
        return 0;
    }
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

impl Steering {
    /// Steering off in the data plane until the first membership arrives.
    pub fn new(
        tables: Arc<Mutex<Tables>>,
        me: String,
        mac: [u8; 6],
        second_chance: Duration,
        joined: Arc<AtomicBool>,
        ownership: Arc<Ownership>,
    ) -> Arc<Steering> {
        let generation = tables.lock().unwrap().steer_conf().generation;
        let s = Steering {
            tables,
            me,
            mac,
            second_chance,
            joined,
            state: Mutex::new(State { current: None, previous: Vec::new(), generation, changed: None, change: None }),
            last: Mutex::new(None),
            conf: Mutex::new(SteerConf::default()),
            wake: tokio::sync::Notify::new(),
            ownership,
            takeover_armed: AtomicBool::new(false),
        };
        if let Err(e) = s.write_sel(0, generation) {
            tracing::warn!(error = %e, "clearing STEER_CONF");
        }
        Arc::new(s)
    }

    /// `STEER_CONF` for these tables (and this dispatcher's joined state).
    fn write_state(&self, st: &State) -> Result<(), crate::dataplane::DataplaneError> {
        let Some(cur) = &st.current else { return self.write_sel(0, st.generation) };
        let mut flags = STEER_ON;
        if self.takeover_armed.load(Ordering::Relaxed) {
            flags |= STEER_TAKEOVER;
        }
        if !self.joined.load(Ordering::Relaxed) {
            flags |= STEER_LEFT;
        }
        let p = |i: usize| st.previous.get(i).map(|(t, _)| t.index);
        if p(0).is_some() {
            flags |= STEER_HAS_PREV;
        }
        if p(1).is_some() {
            flags |= STEER_HAS_PREV2;
        }
        self.write_sel(steer_sel3(cur.index, p(0).unwrap_or(0), p(1).unwrap_or(0), flags), st.generation)
    }

    fn write_sel(&self, sel: u32, generation: u32) -> Result<(), crate::dataplane::DataplaneError> {
        let mut conf = self.conf.lock().unwrap();
        let next = SteerConf { sel, generation, self_mac: self.mac, _pad: [0; 2], heartbeat_ns: monotonic_ns() };
        self.tables.lock().unwrap().set_steer_conf(&next)?;
        *conf = next;
        Ok(())
    }

    /// The agent's beacon: `STEER_CONF` again, with the time of now.
    pub fn beacon(&self) {
        let mut conf = self.conf.lock().unwrap();
        if conf.sel & STEER_ON == 0 {
            return;
        }
        conf.heartbeat_ns = monotonic_ns();
        if let Err(e) = self.tables.lock().unwrap().set_steer_conf(&conf) {
            crate::ratelimit::warn("writing the steering beacon", &e);
        }
    }

    /// Installs the table for `peers` (this dispatcher left out while it is not joined);
    /// with the membership the one installed, only `STEER_CONF` is written again (the
    /// joined state may have changed).
    pub fn install(&self, mut peers: Vec<Peer>) {
        *self.last.lock().unwrap() = Some(peers.clone());
        if !self.joined.load(Ordering::Relaxed) {
            peers.retain(|p| p.name != self.me);
        }
        let table = Table::build(peers);
        let mut st = self.state.lock().unwrap();
        if st.current.as_ref().is_some_and(|c| c.table.peers == table.peers) {
            if let Err(e) = self.write_state(&st) {
                tracing::warn!(error = %e, "writing STEER_CONF");
            }
            return;
        }
        // A slot neither current nor previous (XDP reads only those), and the fallback.
        let busy: Vec<u32> =
            st.current.iter().map(|c| c.index).chain(st.previous.iter().map(|(p, _)| p.index)).collect();
        let Some(index) = (0..STEER_FALLBACK).find(|i| !busy.contains(i)) else {
            tracing::warn!("no free ownership table slot (a bug): membership change not applied");
            return;
        };
        // The same membership without this dispatcher: where what it owns goes if its
        // agent dies (the XDP program reads it only then).
        let others: Vec<Peer> = table.peers.iter().filter(|p| p.name != self.me).cloned().collect();
        let fallback = Table::build(others);
        let written = {
            let mut t = self.tables.lock().unwrap();
            t.write_steer_table(STEER_FALLBACK, &fallback.map_slots())
                .and_then(|_| t.write_steer_table(index, &table.map_slots()))
        };
        if let Err(e) = written {
            tracing::warn!(error = %e, "writing an ownership table");
            return;
        }
        // The new state, made the agent's own only once XDP was told (one word).
        let table = Arc::new(table);
        let mut previous = st.previous.clone();
        if let Some(c) = &st.current {
            previous.insert(0, (c.clone(), Instant::now() + self.second_chance));
        }
        previous.truncate(KEPT_PREVIOUS);
        let was = st.current.as_ref().map(|c| c.table.names()).unwrap_or_default();
        let now = table.names();
        let change: Vec<String> = now
            .iter()
            .filter(|n| !was.contains(n))
            .map(|n| format!("+{n}"))
            .chain(was.iter().filter(|n| !now.contains(n)).map(|n| format!("-{n}")))
            .collect();
        let next = State {
            current: Some(Installed { index, table: table.clone() }),
            previous,
            generation: st.generation.wrapping_add(1),
            changed: Some(Instant::now()),
            change: Some(change.join(" ")),
        };
        if let Err(e) = self.write_state(&next) {
            tracing::warn!(error = %e, "writing STEER_CONF: the membership change is not applied");
            return;
        }
        let next_generation = next.generation;
        tracing::info!(
            generation = next.generation,
            dispatchers = ?table.names(),
            previous = ?next.previous.iter().map(|(p, _)| p.table.names()).collect::<Vec<_>>(),
            "ownership table installed"
        );
        *st = next;
        *self.ownership.current.write().unwrap() = Some((table, self.me.clone()));
        *self.ownership.fallback.write().unwrap() = Some((next_generation as u64, Arc::new(fallback)));
        self.wake.notify_one();
    }

    /// Takeover records are armed, or none are any more: the XDP program looks them up
    /// only while some are.
    pub fn set_takeover_armed(&self, armed: bool) {
        if self.takeover_armed.swap(armed, Ordering::Relaxed) == armed {
            return;
        }
        let st = self.state.lock().unwrap();
        if let Err(e) = self.write_state(&st) {
            tracing::warn!(error = %e, "writing STEER_CONF (takeover)");
        }
    }

    /// A table is in place.
    pub fn installed(&self) -> bool {
        self.state.lock().unwrap().current.is_some()
    }

    /// Installs again from the last membership (this dispatcher joined or left).
    pub fn refresh(&self) {
        let last = self.last.lock().unwrap().clone();
        if let Some(p) = last {
            self.install(p);
        }
    }

    /// Drops the earlier tables whose time is up; returns when to look again.
    pub fn expire(&self) -> Option<Instant> {
        let mut st = self.state.lock().unwrap();
        let now = Instant::now();
        if st.previous.iter().any(|(_, u)| *u <= now) {
            let kept: Vec<(Installed, Instant)> = st.previous.clone().into_iter().filter(|(_, u)| *u > now).collect();
            let next = State {
                current: st.current.clone(),
                previous: kept,
                generation: st.generation,
                changed: st.changed,
                change: st.change.clone(),
            };
            match self.write_state(&next) {
                Ok(()) => {
                    tracing::info!(generation = st.generation, "earlier ownership table dropped (second chance over)");
                    *st = next;
                }
                Err(e) => tracing::warn!(error = %e, "writing STEER_CONF"),
            }
        }
        st.previous.iter().map(|(_, u)| *u).min()
    }

    pub fn status(&self, counters: [u64; 4]) -> SteeringStatus {
        let st = self.state.lock().unwrap();
        SteeringStatus {
            active: st.current.is_some(),
            joined: self.joined.load(Ordering::Relaxed),
            generation: st.generation,
            dispatchers: st.current.as_ref().map(|c| c.table.names()).unwrap_or_default(),
            previous: st.previous.first().map(|(p, _)| p.table.names()).unwrap_or_default(),
            second_chance_left_s: st
                .previous
                .iter()
                .map(|(_, u)| u.saturating_duration_since(Instant::now()).as_secs_f64())
                .reduce(f64::max),
            changed_s_ago: st.changed.map(|c| c.elapsed().as_secs_f64()),
            last_change: st.change.clone(),
            steered: counters[0],
            second_chances: counters[1],
            kept_local: counters[2],
            ttl_expired: counters[3],
            takeover: None,
        }
    }
}

/// Follows the membership: a new table on every change, the previous one dropped on time;
/// and the beacon that tells the XDP program the agent is there.
pub async fn run(steering: Arc<Steering>, mut peers: watch::Receiver<Option<Vec<Peer>>>) {
    let beacon = steering.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(BEACON_EVERY);
        loop {
            tick.tick().await;
            beacon.beacon();
        }
    });
    loop {
        let latest = peers.borrow_and_update().clone();
        if let Some(p) = latest {
            steering.install(p);
        }
        let next = steering.expire();
        let sleep = async {
            match next {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = peers.changed() => if r.is_err() { return },
            _ = sleep => {}
            _ = steering.wake.notified() => {}
        }
    }
}
