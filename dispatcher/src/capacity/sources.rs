//! Per-source client connection limits (HAProxy's `src_conn_cur` and `src_conn_rate`
//! rules): connections one source holds at once (`http.max_connections_per_source`) and
//! new connections per second from it (`http.max_connection_rate_per_source`), so that
//! one client cannot take every slot of the global cap.
//!
//! A source is an IPv4 address, or an IPv6 /64 (one host usually has a whole /64; an
//! IPv4-mapped address counts as IPv4). The table is sharded by a keyed hash (the keys
//! come from the network: SipHash with a random key, as `HashMap`'s default), one lock
//! per accept and one per close, nothing per request. It is bounded: an entry goes when
//! its source holds no connection and its rate bucket is full again (within a second of
//! its last connection), and a full shard takes no new source (the connection is let
//! through untracked, counted: the global cap still holds). One table serves every worker
//! and a reload's successor (`Servers::successor_of`), so the counts include the
//! connections still draining.

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash},
    net::{IpAddr, SocketAddr},
    sync::{
        atomic::{AtomicU32, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::Instant,
};

const SHARDS: usize = 16;
/// Sources tracked per shard: 131,072 in all. At most about 11 MB: 16 tables of 16,384
/// buckets of 41 bytes (a 16-byte key, a 24-byte entry, a control byte).
const SHARD_CAP: usize = 8192;
/// A rate token, in thousandths (the bucket refills `rate` thousandths per millisecond).
const TOKEN: u64 = 1000;

/// A client's source as the limits count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    V4(u32),
    /// The address's first 64 bits.
    V6(u64),
}

impl Source {
    pub fn of(addr: SocketAddr) -> Source {
        match addr.ip() {
            IpAddr::V4(a) => Source::V4(a.into()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.into()),
                None => Source::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::V4(a) => write!(f, "{}", std::net::Ipv4Addr::from(*a)),
            Source::V6(p) => write!(f, "{}/64", std::net::Ipv6Addr::from(u128::from(*p) << 64)),
        }
    }
}

/// Why a connection was refused at a per-source limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The source holds `max_connections_per_source` connections already.
    Count,
    /// The source opened `max_connection_rate_per_source` connections within the last second.
    Rate,
}

#[derive(Clone, Copy)]
struct Entry {
    conns: u32,
    /// Rate tokens in thousandths, as of `at_ms`.
    tokens: u64,
    at_ms: u64,
}

impl Entry {
    /// The bucket refilled up to `now_ms` (capacity: one second's worth).
    fn refill(&mut self, now_ms: u64, rate: u64) {
        let cap = rate * TOKEN;
        let elapsed = now_ms.saturating_sub(self.at_ms);
        self.tokens = self.tokens.saturating_add(elapsed.saturating_mul(rate)).min(cap);
        self.at_ms = now_ms;
    }

    /// Nothing to remember: no connection held, the bucket full again.
    fn idle(&self, now_ms: u64, rate: u64) -> bool {
        let mut e = *self;
        e.refill(now_ms, rate);
        e.conns == 0 && e.tokens >= rate * TOKEN
    }
}

#[derive(Default)]
struct Shard {
    map: HashMap<Source, Entry>,
    /// No sweep before this (a shard full of live entries is not swept at every accept).
    next_sweep_ms: u64,
}

impl Shard {
    fn sweep(&mut self, now_ms: u64, rate: u64) {
        self.map.retain(|_, e| !e.idle(now_ms, rate));
        self.next_sweep_ms = now_ms + 1000;
    }
}

pub struct SourceLimiter {
    shards: Box<[Mutex<Shard>]>,
    hasher: std::collections::hash_map::RandomState,
    /// 0: off.
    max_conns: AtomicU32,
    /// New connections per second; 0: off.
    rate: AtomicU32,
    epoch: Instant,
    /// Connections let through untracked because their shard was full.
    pub untracked: AtomicU64,
}

impl Default for SourceLimiter {
    fn default() -> Self {
        SourceLimiter {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: Default::default(),
            max_conns: AtomicU32::new(0),
            rate: AtomicU32::new(0),
            epoch: Instant::now(),
            untracked: AtomicU64::new(0),
        }
    }
}

/// A connection counted on its source while it lives.
pub struct Held {
    limiter: Arc<SourceLimiter>,
    source: Source,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.limiter.release(self.source, self.limiter.now_ms());
    }
}

impl SourceLimiter {
    /// Sets the limits (at start and at every reload; the counts stay).
    pub fn configure(&self, max_conns: usize, rate: usize) {
        self.max_conns.store(max_conns.min(u32::MAX as usize) as u32, Ordering::Relaxed);
        self.rate.store(rate.min(u32::MAX as usize) as u32, Ordering::Relaxed);
    }

    pub fn limits(&self) -> (u32, u32) {
        (self.max_conns.load(Ordering::Relaxed), self.rate.load(Ordering::Relaxed))
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn shard(&self, s: Source) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(s) as usize) % SHARDS]
    }

    /// Counts a new connection from `peer`, or says which limit refuses it. `None`: not
    /// tracked (limits off, or the table full).
    pub fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<Option<Held>, Refused> {
        let source = Source::of(peer);
        self.admit_at(source, self.now_ms()).map(|tracked| tracked.then(|| Held { limiter: self.clone(), source }))
    }

    fn admit_at(&self, source: Source, now_ms: u64) -> Result<bool, Refused> {
        let (max, rate) = self.limits();
        if max == 0 && rate == 0 {
            return Ok(false);
        }
        let rate = rate as u64;
        let mut shard = self.shard(source).lock().unwrap_or_else(|e| e.into_inner());
        if !shard.map.contains_key(&source) {
            let len = shard.map.len();
            if len >= SHARD_CAP / 2 && now_ms >= shard.next_sweep_ms {
                shard.sweep(now_ms, rate);
            }
            if shard.map.len() >= SHARD_CAP {
                self.untracked.fetch_add(1, Ordering::Relaxed);
                return Ok(false);
            }
        }
        let e = shard.map.entry(source).or_insert(Entry { conns: 0, tokens: rate * TOKEN, at_ms: now_ms });
        e.refill(now_ms, rate);
        if max > 0 && e.conns >= max {
            return Err(Refused::Count);
        }
        if rate > 0 {
            if e.tokens < TOKEN {
                return Err(Refused::Rate);
            }
            e.tokens -= TOKEN;
        }
        e.conns += 1;
        Ok(true)
    }

    fn release(&self, source: Source, now_ms: u64) {
        let rate = self.rate.load(Ordering::Relaxed) as u64;
        let mut shard = self.shard(source).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = shard.map.get_mut(&source) {
            e.conns = e.conns.saturating_sub(1);
            if e.idle(now_ms, rate) {
                shard.map.remove(&source);
            }
        }
    }

    /// Sources in the table.
    pub fn tracked(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).map.len()).sum()
    }
}

/// The default number of connections one source may hold: a tenth of the global cap
/// (ten sources are needed to fill it), but never fewer than 256 (a NAT'd office of a few
/// hundred browsers) unless the cap itself is smaller.
pub fn default_per_source(global: usize) -> usize {
    (global / 10).max(256.min(global))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(max: usize, rate: usize) -> SourceLimiter {
        let l = SourceLimiter::default();
        l.configure(max, rate);
        l
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_v4_as_v4() {
        let a: SocketAddr = "[2001:db8:1:2:aaaa::1]:5".parse().unwrap();
        let b: SocketAddr = "[2001:db8:1:2:bbbb::9]:6".parse().unwrap();
        let c: SocketAddr = "[2001:db8:1:3::1]:6".parse().unwrap();
        assert_eq!(Source::of(a), Source::of(b));
        assert_ne!(Source::of(a), Source::of(c));
        assert_eq!(Source::of("[::ffff:10.0.0.1]:1".parse().unwrap()), Source::of("10.0.0.1:2".parse().unwrap()));
        assert_eq!(Source::of(a).to_string(), "2001:db8:1:2::/64");
    }

    #[test]
    fn count_limit_and_release() {
        let l = limiter(2, 0);
        let s = Source::V4(1);
        assert_eq!(l.admit_at(s, 0), Ok(true));
        assert_eq!(l.admit_at(s, 0), Ok(true));
        assert_eq!(l.admit_at(s, 0), Err(Refused::Count));
        assert_eq!(l.admit_at(Source::V4(2), 0), Ok(true), "another source is not affected");
        l.release(s, 1);
        assert_eq!(l.admit_at(s, 1), Ok(true));
        l.release(s, 2);
        l.release(s, 2);
        l.release(Source::V4(2), 2);
        assert_eq!(l.tracked(), 0, "entries go when their count returns to 0");
    }

    #[test]
    fn rate_limit_refills_over_a_second() {
        let l = limiter(0, 10);
        let s = Source::V6(7);
        for _ in 0..10 {
            assert_eq!(l.admit_at(s, 0), Ok(true));
        }
        assert_eq!(l.admit_at(s, 50), Err(Refused::Rate));
        assert_eq!(l.admit_at(s, 100), Ok(true), "one token back after 100 ms at 10/s");
        assert_eq!(l.admit_at(s, 100), Err(Refused::Rate));
        for _ in 0..11 {
            l.release(s, 100);
        }
        assert_eq!(l.tracked(), 1, "kept while its bucket refills");
        l.release(s, 1200);
        assert_eq!(l.tracked(), 0);
    }

    #[test]
    fn a_flood_of_sources_is_bounded() {
        let l = limiter(0, 100);
        // Each source connects once and leaves: after a second its entry may go.
        for i in 0..(SHARDS * SHARD_CAP * 3) as u32 {
            let now = i as u64 / 50; // 50,000 new sources per second
            let _ = l.admit_at(Source::V4(i), now);
            l.release(Source::V4(i), now);
        }
        assert!(l.tracked() <= SHARDS * SHARD_CAP, "{}", l.tracked());
        // Sources that hold their connections fill the table; then new ones go untracked.
        let l = limiter(5, 0);
        for i in 0..(SHARDS * SHARD_CAP * 2) as u32 {
            assert!(l.admit_at(Source::V4(i), 0).is_ok());
        }
        assert!(l.tracked() <= SHARDS * SHARD_CAP);
        assert!(l.untracked.load(Ordering::Relaxed) >= (SHARDS * SHARD_CAP) as u64);
    }

    #[test]
    fn an_entry_is_as_small_as_the_docs_say() {
        // The memory bound in the module's docs: 16 shards x 16,384 buckets x (40 + 1).
        assert_eq!(std::mem::size_of::<(Source, Entry)>(), 40);
    }

    #[test]
    fn off_tracks_nothing() {
        let l = limiter(0, 0);
        assert_eq!(l.admit_at(Source::V4(1), 0), Ok(false));
        assert_eq!(l.tracked(), 0);
    }

    #[test]
    fn defaults_are_a_fraction_of_the_cap() {
        assert_eq!(default_per_source(10_100), 1010);
        assert_eq!(default_per_source(432_410), 43_241);
        assert_eq!(default_per_source(300), 256);
        assert_eq!(default_per_source(20), 20);
    }
}
