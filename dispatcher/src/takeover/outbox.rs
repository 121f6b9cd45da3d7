//! The sending side: every plain HTTP/1.x connection this dispatcher accepts (with
//! steering and `[cluster] takeover` on) is registered with its handshake's options
//! (`Handshake::of`, one `TCP_INFO` read at accept), and every `BATCH_EVERY` (10 ms) the
//! peer channel takes a batch for each peer: the connections opened and closed since the last
//! one, for the peer the fallback table names for their slot (the dispatcher that takes
//! the slot if this one dies), and which of them are quiet (no request in progress).
//!
//! Never per request: a request only flips its connection's `busy` flag (a relaxed
//! atomic store at its start and end). Bounded: at most `MAX_TRACKED` connections are
//! registered (more are served as before, not taken over, and counted), and at most
//! `MAX_DATAGRAMS_PER_PEER` datagrams go to a peer per interval (what is left waits for
//! the next one).
//!
//! A membership change may give a connection's slot another fallback owner: its record is
//! then sent again, to the new one (and closed at the old one).

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    os::fd::RawFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use super::{
    repair::Handshake,
    wire::{self, Item, Open},
};
use crate::steering::Ownership;

/// How often the batches go (records opened and closed since, and the quiet bitmaps): the
/// bitmap a successor acts on is at most this old (plus its way over the segment), so
/// that a connection whose request ended just before the death is rarely taken for busy.
pub const BATCH_EVERY: Duration = Duration::from_millis(10);

/// Connections registered at most (their slab ids are below this).
pub const MAX_TRACKED: usize = 65_536;
/// Datagrams sent to one peer per `BATCH_EVERY` at most (about 29 OPEN records each):
/// 800 a second, about 23,000 records.
pub const MAX_DATAGRAMS_PER_PEER: usize = 8;
/// A quiet bitmap that did not change is sent again this often (one lost is made good).
pub const QUIET_REFRESH: Duration = Duration::from_secs(1);

/// A request's mark on its connection.
#[derive(Default)]
pub struct ConnState {
    busy: AtomicBool,
}

impl ConnState {
    /// A request began (its head read) or ended (its answer written).
    pub fn set_busy(&self, busy: bool) {
        self.busy.store(busy, Ordering::Relaxed);
    }
}

struct Entry {
    open: Open,
    state: Arc<ConnState>,
    /// The peer its record went to.
    sent_to: Option<String>,
}

#[derive(Default)]
struct Slab {
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    /// Ids whose record must be sent (new, or its fallback owner changed).
    pending: VecDeque<u32>,
    /// Records to close at a peer (the connection ended).
    closes: VecDeque<(String, u32)>,
    /// The fallback table's generation the records were sent for.
    generation: u64,
    /// The quiet bitmap last sent to each peer, and when.
    last_quiet: HashMap<String, (Vec<u8>, std::time::Instant)>,
}

#[derive(Default)]
pub struct Counters {
    pub registered: AtomicU64,
    pub untracked: AtomicU64,
    pub records_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    /// Time spent registering connections and building batches (ns): takeover's CPU on
    /// the sending side.
    pub busy_ns: AtomicU64,
}

pub struct Outbox {
    me: String,
    slab: Mutex<Slab>,
    ownership: Arc<Ownership>,
    number: AtomicU64,
    pub counters: Counters,
}

/// A registered connection: its mark, and its record closed when dropped.
pub struct Tracked {
    outbox: Arc<Outbox>,
    id: u32,
    pub state: Arc<ConnState>,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.outbox.close(self.id);
    }
}

impl Outbox {
    pub fn new(me: &str, ownership: Arc<Ownership>) -> Arc<Outbox> {
        // Batch numbers go on from the clock, so that a restarted dispatcher's batches are
        // newer than its previous run's.
        let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros());
        Arc::new(Outbox {
            me: me.to_string(),
            slab: Mutex::new(Slab::default()),
            ownership,
            number: AtomicU64::new(start as u64),
            counters: Counters::default(),
        })
    }

    /// Registers an accepted connection (`None`: its options are unreadable, or
    /// `MAX_TRACKED` are registered).
    pub fn register(self: &Arc<Outbox>, fd: RawFd, client: SocketAddr, local: SocketAddr) -> Option<Tracked> {
        let started = std::time::Instant::now();
        let t = self.register_timed(fd, client, local);
        self.counters.busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        t
    }

    fn register_timed(self: &Arc<Outbox>, fd: RawFd, client: SocketAddr, local: SocketAddr) -> Option<Tracked> {
        let Ok(handshake) = Handshake::of(fd) else {
            self.counters.untracked.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let state = Arc::new(ConnState::default());
        let entry = Entry { open: Open { id: 0, client, local, handshake }, state: state.clone(), sent_to: None };
        let mut s = self.slab.lock().unwrap();
        let id = match s.free.pop() {
            Some(id) => id,
            None if s.entries.len() < MAX_TRACKED => {
                s.entries.push(None);
                (s.entries.len() - 1) as u32
            }
            None => {
                drop(s);
                self.counters.untracked.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        let mut entry = entry;
        entry.open.id = id;
        s.entries[id as usize] = Some(entry);
        s.pending.push_back(id);
        drop(s);
        self.counters.registered.fetch_add(1, Ordering::Relaxed);
        Some(Tracked { outbox: self.clone(), id, state })
    }

    /// Connections registered now.
    pub fn tracked(&self) -> usize {
        let s = self.slab.lock().unwrap();
        s.entries.len() - s.free.len()
    }

    fn close(&self, id: u32) {
        let mut s = self.slab.lock().unwrap();
        if let Some(e) = s.entries.get_mut(id as usize).and_then(Option::take) {
            if let Some(to) = e.sent_to {
                s.closes.push_back((to, id));
            }
            s.free.push(id);
        }
    }

    /// This interval's datagrams, by peer name (the channel sends each to that peer's
    /// heartbeat address).
    pub fn batches(&self) -> Vec<(String, Vec<u8>)> {
        let started = std::time::Instant::now();
        let out = self.build_batches();
        self.counters.busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    fn build_batches(&self) -> Vec<(String, Vec<u8>)> {
        let fallback = self.ownership.fallback();
        let mut s = self.slab.lock().unwrap();
        let s = &mut *s;
        // A new fallback table: every record whose owner changed is sent again.
        if let Some((generation, _)) = &fallback {
            if *generation != s.generation {
                s.generation = *generation;
                s.pending = (0..s.entries.len() as u32).filter(|&i| s.entries[i as usize].is_some()).collect();
            }
        }
        let owner_of = |o: &Open| -> Option<String> {
            let (_, table) = fallback.as_ref()?;
            let slot = crate::steering::slot_of(o.client, o.local);
            table.owner_of_slot(slot).map(|p| p.name.clone()).filter(|n| *n != self.me)
        };
        let mut out = Outbox::writer(self);
        while let Some((to, id)) = s.closes.front().cloned() {
            if !out.put(&to, &Item::Close(id)) {
                break;
            }
            s.closes.pop_front();
        }
        while let Some(&id) = s.pending.front() {
            let Some(e) = s.entries.get_mut(id as usize).and_then(Option::as_mut) else {
                s.pending.pop_front();
                continue;
            };
            let to = owner_of(&e.open);
            if to == e.sent_to {
                s.pending.pop_front();
                continue;
            }
            if let Some(old) = &e.sent_to {
                if !out.put(old, &Item::Close(id)) {
                    break;
                }
                e.sent_to = None;
            }
            if let Some(new) = &to {
                if !out.put(new, &Item::Open(e.open)) {
                    break;
                }
                self.counters.records_sent.fetch_add(1, Ordering::Relaxed);
            }
            e.sent_to = to;
            s.pending.pop_front();
        }
        // Quiet bitmaps, per peer: no request in progress.
        let mut quiet: HashMap<&str, Vec<u8>> = HashMap::new();
        for (i, e) in s.entries.iter().enumerate() {
            let Some(e) = e else { continue };
            let is_quiet = !e.state.busy.load(Ordering::Relaxed);
            if let Some(to) = &e.sent_to {
                let bits = quiet.entry(to.as_str()).or_default();
                if bits.len() <= i / 8 {
                    bits.resize(i / 8 + 1, 0);
                }
                if is_quiet {
                    bits[i / 8] |= 1 << (i % 8);
                }
            }
        }
        let chunk = wire::MAX_BATCH - wire::header(&self.me, 0).len() - wire::QUIET_HEAD;
        let now = std::time::Instant::now();
        for (to, bits) in quiet {
            // Sent when it changed, and again every `QUIET_REFRESH`.
            match s.last_quiet.get(to) {
                Some((last, at)) if *last == bits && now.duration_since(*at) < QUIET_REFRESH => continue,
                _ => {}
            }
            s.last_quiet.insert(to.to_string(), (bits.clone(), now));
            for (k, part) in bits.chunks(chunk).enumerate() {
                let item = Item::Quiet { first: (k * chunk * 8) as u32, bits: part.to_vec() };
                if !out.put(to, &item) {
                    break;
                }
            }
        }
        out.done()
    }

    fn writer(&self) -> Writer<'_> {
        Writer { outbox: self, by_peer: HashMap::new() }
    }
}

/// Datagrams being filled, per peer, within `MAX_DATAGRAMS_PER_PEER`.
struct Writer<'a> {
    outbox: &'a Outbox,
    by_peer: HashMap<String, Vec<Vec<u8>>>,
}

impl Writer<'_> {
    /// Adds `item` for `to`; false when that peer's datagrams are full for this interval.
    fn put(&mut self, to: &str, item: &Item) -> bool {
        let list = self.by_peer.entry(to.to_string()).or_default();
        if list.last().is_none_or(|d| d.len() + item.wire_len() > wire::MAX_BATCH) {
            if list.len() >= MAX_DATAGRAMS_PER_PEER {
                return false;
            }
            let number = self.outbox.number.fetch_add(1, Ordering::Relaxed);
            list.push(wire::header(&self.outbox.me, number));
        }
        wire::put(list.last_mut().unwrap(), item);
        true
    }

    fn done(self) -> Vec<(String, Vec<u8>)> {
        let out: Vec<(String, Vec<u8>)> =
            self.by_peer.into_iter().flat_map(|(to, ds)| ds.into_iter().map(move |d| (to.clone(), d))).collect();
        let bytes: usize = out.iter().map(|(_, d)| d.len()).sum();
        self.outbox.counters.bytes_sent.fetch_add(bytes as u64, Ordering::Relaxed);
        out
    }
}
