//! The sending side: every plain HTTP/1.x connection this dispatcher accepts (with
//! steering and `[cluster] takeover` on) is registered with its handshake's options and
//! its timestamp clock (`Handshake::of`, `TCP_INFO` and `TCP_TIMESTAMP` read once at
//! accept), and every `BATCH_EVERY` (10 ms) the peer channel takes a batch for each peer:
//! the connections opened and closed since, for the peer the fallback table names for
//! their slot (the dispatcher that takes the slot if this one dies), a slow refresh of
//! every record (a receiver that restarted, or a datagram lost, is made good), and which
//! of them are quiet (no request in progress), when that changed.
//!
//! Never per request: a request sets and clears its connection's bit in an atomic
//! bitmap (`busy`, and `touched` for any change since the last batch); a batch is a few
//! word-wise operations per peer over them, not a walk of the connections. Bounded: at most `MAX_TRACKED` connections are registered (more
//! are served as before, not taken over, and counted), and at most
//! `MAX_DATAGRAMS_PER_PEER` datagrams go to a peer per batch (what is left waits).
//!
//! A membership change may give a connection's slot another fallback owner: its record is
//! then sent again, to the new one (and closed at the old one). At a graceful stop
//! (`forget_all`) every peer is told to forget this dispatcher's records: a stop is not a
//! death, and its connections drain where they are.

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    os::fd::RawFd,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
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
const WORDS: usize = MAX_TRACKED / 64;
/// Datagrams sent to one peer per batch at most (about 27 OPEN records each): 800 a
/// second, about 21,000 records.
pub const MAX_DATAGRAMS_PER_PEER: usize = 8;
/// A quiet bitmap that did not change is sent again this often (one lost is made good).
pub const QUIET_REFRESH: Duration = Duration::from_secs(1);
/// Every record is sent again about this often (a receiver that restarted gets them).
pub const RECORD_REFRESH: Duration = Duration::from_secs(10);

struct Entry {
    open: Open,
    accepted: Instant,
    /// The peer its record went to.
    sent_to: Option<String>,
}

impl Entry {
    /// Its record as sent now (with its age).
    fn aged(&self) -> Open {
        Open { age_ms: self.accepted.elapsed().as_millis().min(u32::MAX as u128) as u32, ..self.open }
    }
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
    /// Per peer, the ids whose record it holds (bit `id`).
    members: HashMap<String, Vec<u64>>,
    /// The quiet bitmap last sent to each peer, and when.
    last_quiet: HashMap<String, (Vec<u64>, Instant)>,
    /// Where the slow refresh goes on from.
    refresh_at: usize,
    /// Peers told to forget this dispatcher's records (at stop).
    forgotten: Vec<String>,
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
    /// This run of the dispatcher (its start, µs since the epoch): a receiver drops the
    /// records of an earlier one.
    incarnation: u64,
    slab: Mutex<Slab>,
    /// Bit `id`: a request is in progress on the connection.
    busy: Box<[AtomicU64]>,
    /// Bit `id`: a request began or ended since the last batch (a connection between two
    /// requests at the moment of a batch is not quiet: its next one may be on its way).
    touched: Box<[AtomicU64]>,
    ownership: Arc<Ownership>,
    number: AtomicU64,
    /// When this run began (`incarnation`, monotonic).
    started: Instant,
    stopping: AtomicBool,
    pub counters: Counters,
}

/// A registered connection; its record closed when dropped.
pub struct Tracked {
    outbox: Arc<Outbox>,
    id: u32,
}

impl Tracked {
    /// A request began (its first bytes arrived) or ended (its answer written, nothing
    /// more waiting).
    pub fn set_busy(&self, busy: bool) {
        let (w, bit) = (self.id as usize / 64, 1u64 << (self.id % 64));
        if busy {
            self.outbox.busy[w].fetch_or(bit, Ordering::Relaxed);
        } else {
            self.outbox.busy[w].fetch_and(!bit, Ordering::Relaxed);
        }
        self.outbox.touched[w].fetch_or(bit, Ordering::Relaxed);
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.outbox.close(self.id);
    }
}

fn set_bit(v: &mut Vec<u64>, id: u32, on: bool) {
    let w = id as usize / 64;
    if v.len() <= w {
        v.resize(w + 1, 0);
    }
    if on {
        v[w] |= 1 << (id % 64);
    } else {
        v[w] &= !(1 << (id % 64));
    }
}

impl Outbox {
    pub fn new(me: &str, ownership: Arc<Ownership>) -> Arc<Outbox> {
        let incarnation =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64);
        Arc::new(Outbox {
            me: me.to_string(),
            incarnation,
            slab: Mutex::new(Slab::default()),
            busy: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
            touched: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
            ownership,
            number: AtomicU64::new(0),
            started: Instant::now(),
            stopping: AtomicBool::new(false),
            counters: Counters::default(),
        })
    }

    /// Registers an accepted connection (`None`: its options are unreadable, it has no
    /// timestamps (whose clock is what lets a successor check a segment, `inbox`), or
    /// `MAX_TRACKED` are registered, or this dispatcher is stopping). Busy at first: its
    /// first request is on its way.
    pub fn register(self: &Arc<Outbox>, fd: RawFd, client: SocketAddr, local: SocketAddr) -> Option<Tracked> {
        let started = Instant::now();
        let t = self.register_timed(fd, client, local);
        self.counters.busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        t
    }

    fn register_timed(self: &Arc<Outbox>, fd: RawFd, client: SocketAddr, local: SocketAddr) -> Option<Tracked> {
        let untracked = || {
            self.counters.untracked.fetch_add(1, Ordering::Relaxed);
            None
        };
        if self.stopping.load(Ordering::Relaxed) {
            return untracked();
        }
        let Ok((handshake, ts_clock)) = Handshake::with_clock(fd) else { return untracked() };
        let Some(ts_clock) = ts_clock else { return untracked() };
        let mut s = self.slab.lock().unwrap();
        let id = match s.free.pop() {
            Some(id) => id,
            None if s.entries.len() < MAX_TRACKED => {
                s.entries.push(None);
                (s.entries.len() - 1) as u32
            }
            None => {
                drop(s);
                return untracked();
            }
        };
        let open = Open { id, client, local, handshake, ts_clock, age_ms: 0 };
        s.entries[id as usize] = Some(Entry { open, accepted: Instant::now(), sent_to: None });
        s.pending.push_back(id);
        drop(s);
        let t = Tracked { outbox: self.clone(), id };
        t.set_busy(true);
        self.counters.registered.fetch_add(1, Ordering::Relaxed);
        Some(t)
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
                if let Some(m) = s.members.get_mut(&to) {
                    set_bit(m, id, false);
                }
                s.closes.push_back((to, id));
            }
            s.free.push(id);
        }
    }

    /// A graceful stop: from now on, the batches tell every peer to forget this
    /// dispatcher's records (and none are sent or registered any more).
    pub fn forget_all(&self) {
        self.stopping.store(true, Ordering::Relaxed);
    }

    /// Every peer that holds records was told to forget them.
    pub fn forgotten(&self) -> bool {
        let s = self.slab.lock().unwrap();
        s.members.keys().all(|p| s.forgotten.contains(p))
    }

    /// This interval's datagrams, by peer name (the channel sends each to that peer's
    /// heartbeat address).
    pub fn batches(&self) -> Vec<(String, Vec<u8>)> {
        let started = Instant::now();
        let out = self.build_batches();
        self.counters.busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    fn build_batches(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = self.writer();
        let mut s = self.slab.lock().unwrap();
        let s = &mut *s;
        if self.stopping.load(Ordering::Relaxed) {
            let peers: Vec<String> = s.members.keys().cloned().collect();
            for p in peers {
                // Sent with every batch while stopping: one lost is made good.
                if out.put(&p, &Item::Forget) && !s.forgotten.contains(&p) {
                    s.forgotten.push(p);
                }
            }
            return out.done();
        }
        let fallback = self.ownership.fallback();
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
        // Closes first, in order per peer (an id reused later must not be closed after
        // its new record); a full peer's wait for the next batch.
        let mut left = VecDeque::new();
        while let Some((to, id)) = s.closes.pop_front() {
            if left.iter().any(|(p, _): &(String, u32)| *p == to) || !out.put(&to, &Item::Close(id)) {
                left.push_back((to, id));
            }
        }
        s.closes = left;
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
                if s.closes.iter().any(|(p, _)| p == old) || !out.put(old, &Item::Close(id)) {
                    break;
                }
                set_bit(s.members.entry(old.clone()).or_default(), id, false);
                e.sent_to = None;
            }
            if let Some(new) = &to {
                if !out.put(new, &Item::Open(e.aged())) {
                    break;
                }
                set_bit(s.members.entry(new.clone()).or_default(), id, true);
                self.counters.records_sent.fetch_add(1, Ordering::Relaxed);
            }
            e.sent_to = to;
            s.pending.pop_front();
        }
        // The slow refresh: a few records again, round the slab.
        let n = s.entries.len();
        let per_batch = (n * BATCH_EVERY.as_millis() as usize).div_ceil(RECORD_REFRESH.as_millis() as usize);
        for _ in 0..per_batch.min(n) {
            s.refresh_at = (s.refresh_at + 1) % n;
            if let Some(e @ Entry { sent_to: Some(to), .. }) = &s.entries[s.refresh_at] {
                if !out.put(to, &Item::Open(e.aged())) {
                    break;
                }
            }
        }
        // Quiet bitmaps, per peer: its members with no request in progress and none begun
        // or ended since the last batch, when that changed (or every `QUIET_REFRESH`).
        let now = Instant::now();
        let chunk_words = (wire::MAX_BATCH - wire::header_len(&self.me) - wire::QUIET_HEAD) / 8;
        let words = s.members.values().map(Vec::len).max().unwrap_or(0);
        let active: Vec<u64> = (0..words)
            .map(|w| self.busy[w].load(Ordering::Relaxed) | self.touched[w].swap(0, Ordering::Relaxed))
            .collect();
        for (to, members) in &s.members {
            let quiet: Vec<u64> = members.iter().zip(&active).map(|(m, a)| m & !a).collect();
            if s.last_quiet.get(to).is_some_and(|(last, at)| *last == quiet && now.duration_since(*at) < QUIET_REFRESH)
            {
                continue;
            }
            let all = quiet.chunks(chunk_words).enumerate().all(|(k, part)| {
                let bits: Vec<u8> = part.iter().flat_map(|w| w.to_le_bytes()).collect();
                out.put(to, &Item::Quiet { first: (k * chunk_words * 64) as u32, bits })
            });
            if all {
                s.last_quiet.insert(to.clone(), (quiet, now));
            }
        }
        out.done()
    }

    /// A batch's number: microseconds since this run began (so that a receiver can
    /// refuse one from the future), one more than the last at least.
    fn next_number(&self) -> u64 {
        let now = self.started.elapsed().as_micros() as u64;
        let prev = self.number.fetch_max(now, Ordering::Relaxed);
        if prev < now {
            now
        } else {
            // Two in the same microsecond: the later one a microsecond ahead.
            self.number.fetch_add(1, Ordering::Relaxed) + 1
        }
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
    /// Adds `item` for `to`; false when that peer's datagrams are full for this batch.
    fn put(&mut self, to: &str, item: &Item) -> bool {
        let list = self.by_peer.entry(to.to_string()).or_default();
        if list.last().is_none_or(|d| d.len() + item.wire_len() > wire::MAX_BATCH) {
            if list.len() >= MAX_DATAGRAMS_PER_PEER {
                return false;
            }
            let number = self.outbox.next_number();
            list.push(wire::header(&self.outbox.me, self.outbox.incarnation, number));
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
