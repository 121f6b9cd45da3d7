//! The receiving side: the records other dispatchers sent this one (it is their fallback
//! owner for those slots), armed when their sender dies, and the socket rebuilt when a
//! client's segment of an armed connection arrives.
//!
//! - Records are kept per sender, in memory only, at most `MAX_RECORDS` over all senders
//!   (more are refused and counted). A batch must be newer than the last one taken from
//!   its sender's incarnation; a newer incarnation (the sender restarted) replaces the
//!   older one's records; `FORGET` (a graceful stop) drops them all.
//! - A sender that is gone from the store's live members (its lease expired) or that most
//!   of the others cannot reach (`View::out_unreachable`) is dead: its records are armed —
//!   written to `TAKEOVER` for the XDP program, which then reports their segments — for
//!   `[http] client_idle_timeout` (the dead dispatcher would have closed an idle connection
//!   by then). A dispatcher that leaves (`dispatcher leave`) keeps its connections, and one
//!   that stops says `FORGET` first: neither is dead.
//! - A report (`TakeoverEvent`) is untrusted: it must name an armed tuple, and its
//!   timestamp echo must be a TSval the dead dispatcher could have sent on that connection
//!   (between its clock at accept and that clock plus the connection's age; a forged
//!   segment must guess it, one try per `TAKEOVER_REPORT_EVERY_NS`; connections without
//!   timestamps are not registered). Then the socket is rebuilt (`repair::rebuild`):
//!   - a connection that was quiet at its dispatcher's last batch (no request in
//!     progress), once the client sends data (its next request) or a FIN, is handed to an
//!     HTTP worker as if just accepted; the segment's data, when the report carries all
//!     of it, is queued into the rebuilt socket (the client need not retransmit it). A
//!     bare acknowledgement is not enough: the client may still be waiting for the end
//!     of an answer lost with the dead host, which no one can send; the record stays
//!     armed;
//!   - any other was mid-request or mid-response and cannot be continued honestly: it is
//!     reset at once (the rebuilt socket closed with a zero linger, so the reset carries
//!     the sequence number the client expects). Its client may have nothing to send (it
//!     waits for an answer): it is made to speak (`repair::probe`) at the death and three
//!     times more while its record is armed.
//!
//! The work a death brings (a map write per record, the probes) runs off the agent's
//! event loop (`spawn_blocking`), without holding the records' lock over system calls.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, MapData};
use dispatcher_common::{FlowKey, TakeoverEvent, TakeoverRec, AF_INET};

use super::{
    repair::{probe, rebuild_with, Resume},
    wire::{Batch, Item, Open},
    Adoption,
};

const TCP_FIN: u8 = 1;

/// Records held at most, over all senders.
pub const MAX_RECORDS: usize = 262_144;
/// Slack on a report's timestamp echo (ms): the batches' delay, the clocks' steps.
const TS_SLACK_MS: i64 = 2_000;

struct Held {
    open: Open,
    received: Instant,
}

#[derive(Default)]
struct FromPeer {
    incarnation: u64,
    /// The time of the last batch taken (incarnation + number, µs since the epoch).
    last_at: u64,
    records: HashMap<u32, Held>,
    /// Bit `id` set: the connection was quiet at the sender's last batch.
    quiet: Vec<u8>,
}

impl FromPeer {
    fn is_quiet(&self, id: u32) -> bool {
        self.quiet.get(id as usize / 8).is_some_and(|b| b & (1 << (id % 8)) != 0)
    }
}

struct Armed {
    open: Open,
    received: Instant,
    quiet: bool,
    until: Instant,
}

impl Armed {
    /// Whether `echo` is a TSval the dead dispatcher could have sent on the connection.
    fn plausible(&self, echo: Option<u32>) -> bool {
        let Some(echo) = echo else { return false };
        let since = echo.wrapping_sub(self.open.ts_clock) as i32 as i64;
        let age = self.open.age_ms as i64 + self.received.elapsed().as_millis() as i64;
        (-TS_SLACK_MS..=age + TS_SLACK_MS).contains(&since)
    }
}

#[derive(Default)]
pub struct Counters {
    pub batches: AtomicU64,
    pub batches_refused: AtomicU64,
    pub records_refused: AtomicU64,
    pub armed: AtomicU64,
    pub rebuilt: AtomicU64,
    pub reset: AtomicU64,
    pub failed: AtomicU64,
    pub reports_refused: AtomicU64,
    /// Bare acknowledgements of quiet connections (the request awaited).
    pub waited: AtomicU64,
    /// Busy connections' clients probed.
    pub probed: AtomicU64,
    /// Reports whose timestamp echo the dead dispatcher could not have sent.
    pub implausible: AtomicU64,
    /// Rebuilt connections given their client's segment with the report (no
    /// retransmission needed).
    pub given: AtomicU64,
}

/// The records held, by sender: pure (tested below).
#[derive(Default)]
struct Received {
    peers: HashMap<String, FromPeer>,
    total: usize,
}

/// How far in the future a batch's time may be (clocks apart).
const FUTURE_SLACK_US: u64 = 60_000_000;

/// Whether a batch's incarnation and number (µs since the epoch, and since that) are not
/// in the future, by `now_us` (µs since the epoch) with `FUTURE_SLACK_US`.
fn not_in_future(incarnation: u64, number: u64, now_us: u64) -> bool {
    incarnation.checked_add(number).is_some_and(|at| at <= now_us.saturating_add(FUTURE_SLACK_US))
}

fn epoch_us() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64)
}

impl Received {
    /// Takes a batch: whether it was newer than the last one from its sender, and how many
    /// of its items were refused (past `MAX_RECORDS`, an id or bitmap out of bounds).
    fn take(&mut self, batch: Batch, now: Instant) -> (bool, u64) {
        self.take_at(batch, now, epoch_us())
    }

    fn take_at(&mut self, batch: Batch, now: Instant, now_us: u64) -> (bool, u64) {
        if !not_in_future(batch.incarnation, batch.number, now_us) {
            return (false, 0);
        }
        // Batches are ordered by their time, whatever their incarnation: a sender's runs
        // follow each other in time, so a batch of another incarnation that is newer is
        // a new run (or the real one again after a forged batch: a forged incarnation
        // then costs the records it made forget, not the sender's later batches).
        let at = batch.incarnation + batch.number;
        let from = self.peers.entry(batch.sender).or_default();
        if at <= from.last_at {
            return (false, 0);
        }
        if batch.incarnation != from.incarnation {
            // Another run: the earlier run's records are gone with it.
            self.total -= from.records.len();
            *from = FromPeer { incarnation: batch.incarnation, ..Default::default() };
        }
        from.last_at = at;
        let mut refused = 0;
        for item in batch.items {
            match item {
                Item::Open(o) => {
                    if o.id as usize >= super::outbox::MAX_TRACKED {
                        refused += 1;
                        continue;
                    }
                    match from.records.get_mut(&o.id) {
                        // Sent again (a refresh, a new fallback owner): the same
                        // connection keeps when it was first heard of.
                        Some(h) if h.open.client == o.client && h.open.local == o.local => h.open = o,
                        Some(h) => *h = Held { open: o, received: now },
                        None if self.total >= MAX_RECORDS => refused += 1,
                        None => {
                            from.records.insert(o.id, Held { open: o, received: now });
                            self.total += 1;
                        }
                    }
                }
                Item::Close(id) => {
                    if from.records.remove(&id).is_some() {
                        self.total -= 1;
                    }
                }
                Item::Quiet { first, bits } => {
                    let at = first as usize / 8;
                    let end = at + bits.len();
                    if first % 8 != 0 || end > super::outbox::MAX_TRACKED / 8 {
                        refused += 1;
                        continue;
                    }
                    if from.quiet.len() < end {
                        from.quiet.resize(end, 0);
                    }
                    from.quiet[at..end].copy_from_slice(&bits);
                    // A bitmap from id 0 is a whole new one: ids past its last chunk are
                    // not quiet.
                    if first == 0 {
                        from.quiet.truncate(end);
                    }
                }
                Item::Forget => {
                    self.total -= from.records.len();
                    from.records.clear();
                    from.quiet.clear();
                }
            }
        }
        (true, refused)
    }

    /// A dead sender's records, no longer held.
    fn remove(&mut self, name: &str) -> Option<FromPeer> {
        let from = self.peers.remove(name)?;
        self.total -= from.records.len();
        Some(from)
    }
}

#[derive(Default)]
struct State {
    received: Received,
    armed: HashMap<(SocketAddr, SocketAddr), Armed>,
}

pub struct Inbox {
    state: Mutex<State>,
    /// Held while a socket is rebuilt or a probe's socket lives: a client answers a probe
    /// within microseconds here, and its report must not find the probe's socket still
    /// holding the tuple.
    repairing: Mutex<()>,
    map: Mutex<BpfHashMap<MapData, FlowKey, TakeoverRec>>,
    /// Sets or clears `STEER_TAKEOVER` (something is armed).
    armed_flag: Box<dyn Fn(bool) + Send + Sync>,
    /// How long a death's records stay armed (ms): `[http] client_idle_timeout`, as the
    /// last reload has it (records armed before keep theirs).
    lifetime_ms: AtomicU64,
    pub counters: Counters,
}

/// The tuple's key as XDP builds it.
fn key_of(client: SocketAddr, local: SocketAddr) -> FlowKey {
    crate::steering::table::tcp_key(client, local)
}

fn addr_of(family: u8, words: &[u32; 4], port_be: u16) -> Option<SocketAddr> {
    let ip = if family == AF_INET {
        IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))
    } else {
        let mut b = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(b))
    };
    Some(SocketAddr::new(ip, u16::from_be(port_be)))
}

/// The timestamp echo in a segment's TCP options (kind 8), if any; malformed options
/// end the walk.
pub fn ts_echo(options: &[u8]) -> Option<u32> {
    let mut i = 0;
    while i < options.len() {
        match options[i] {
            0 => return None,
            1 => i += 1,
            kind => {
                let len = *options.get(i + 1)? as usize;
                if len < 2 || i + len > options.len() {
                    return None;
                }
                if kind == 8 && len == 10 {
                    return Some(u32::from_be_bytes(options[i + 6..i + 10].try_into().ok()?));
                }
                i += len;
            }
        }
    }
    None
}

/// A number to start a probe's sequence numbers from (outside any window but by chance).
fn probe_seq(i: usize) -> u32 {
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.subsec_nanos());
    seed.wrapping_mul(2_654_435_761).wrapping_add((i as u32).wrapping_mul(0x9e37_79b9))
}

impl Inbox {
    pub fn new(
        map: BpfHashMap<MapData, FlowKey, TakeoverRec>,
        armed_flag: Box<dyn Fn(bool) + Send + Sync>,
        lifetime: Duration,
    ) -> Inbox {
        Inbox {
            state: Mutex::new(State::default()),
            repairing: Mutex::new(()),
            map: Mutex::new(map),
            armed_flag,
            lifetime_ms: AtomicU64::new(lifetime.as_millis() as u64),
            counters: Counters::default(),
        }
    }

    /// A reload's `[http] client_idle_timeout`: the lifetime of records armed from now on.
    pub fn set_lifetime(&self, lifetime: Duration) {
        self.lifetime_ms.store(lifetime.as_millis() as u64, Ordering::Relaxed);
    }

    fn lifetime(&self) -> Duration {
        Duration::from_millis(self.lifetime_ms.load(Ordering::Relaxed))
    }

    /// A batch from `batch.sender` (the channel checked it came from that peer's address).
    pub fn take(&self, batch: Batch) {
        let (taken, refused) = self.state.lock().unwrap().received.take(batch, Instant::now());
        let c = &self.counters;
        if taken { &c.batches } else { &c.batches_refused }.fetch_add(1, Ordering::Relaxed);
        c.records_refused.fetch_add(refused, Ordering::Relaxed);
    }

    /// `name` is dead: its connections are armed, and the busy ones' clients probed
    /// (blocking: map writes and socket calls; run off the event loop).
    pub fn dead(&self, name: &str) {
        let Some(from) = self.state.lock().unwrap().received.remove(name) else { return };
        let until = Instant::now() + self.lifetime();
        let mut armed = Vec::with_capacity(from.records.len());
        {
            let mut map = self.map.lock().unwrap();
            for (id, h) in &from.records {
                if map.insert(key_of(h.open.client, h.open.local), TakeoverRec::default(), 0).is_ok() {
                    armed.push(Armed { open: h.open, received: h.received, quiet: from.is_quiet(*id), until });
                }
            }
        }
        let n = armed.len();
        let quiet = armed.iter().filter(|a| a.quiet).count();
        {
            let mut st = self.state.lock().unwrap();
            for a in armed {
                st.armed.insert((a.open.client, a.open.local), a);
            }
            if !st.armed.is_empty() {
                (self.armed_flag)(true);
            }
        }
        self.counters.armed.fetch_add(n as u64, Ordering::Relaxed);
        tracing::warn!(dispatcher = name, armed = n, quiet, "dispatcher dead: its connections are armed for takeover");
        self.probe_busy();
    }

    /// Makes the clients of the busy armed connections speak (at a death, and again a
    /// little later: a survivor may still have steered the first answer to the dead host).
    pub fn probe_busy(&self) {
        let busy: Vec<Open> = self.state.lock().unwrap().armed.values().filter(|a| !a.quiet).map(|a| a.open).collect();
        for (i, o) in busy.iter().enumerate() {
            let _repairing = self.repairing.lock().unwrap();
            match probe(o.local, o.client, &o.handshake, probe_seq(i)) {
                Ok(()) => self.counters.probed.fetch_add(1, Ordering::Relaxed),
                Err(e) => {
                    crate::ratelimit::warn("probing a busy connection of a dead dispatcher", &e);
                    0
                }
            };
        }
    }

    /// Drops armed records past their time; returns how many are left.
    pub fn expire(&self) -> usize {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap();
        if st.armed.is_empty() {
            return 0;
        }
        let gone: Vec<(SocketAddr, SocketAddr)> =
            st.armed.iter().filter(|(_, a)| a.until <= now).map(|(k, _)| *k).collect();
        if !gone.is_empty() {
            let mut map = self.map.lock().unwrap();
            for k in &gone {
                st.armed.remove(k);
                let _ = map.remove(&key_of(k.0, k.1));
            }
        }
        if st.armed.is_empty() {
            (self.armed_flag)(false);
        }
        st.armed.len()
    }

    /// One report from the XDP program.
    pub fn report(&self, bytes: &[u8], adoption: &Adoption) {
        if bytes.len() < std::mem::size_of::<TakeoverEvent>() {
            self.counters.reports_refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // SAFETY: the ring's record holds a whole `TakeoverEvent` (checked above);
        // read unaligned, every bit pattern is a valid value of its plain fields.
        let e: TakeoverEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        let k = e.key;
        // A header shorter than TCP's least (data offset under 5; XDP reports it as 20
        // bytes) is no segment the kernel would take: refused, its "data" never given.
        if (e.tcp[12] >> 4) < 5 {
            self.counters.reports_refused.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let header = &e.tcp[..(e.header_len as usize).clamp(20, dispatcher_common::TAKEOVER_TCP_HEADER)];
        let word = |at: usize| u32::from_be_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]]);
        let (seq, ack, flags) = (word(4), word(8), header[13]);
        let window = u16::from_be_bytes([header[14], header[15]]);
        let payload = (e.segment_len as usize).saturating_sub(header.len());
        let echo = ts_echo(&header[20..]);
        let (Some(client), Some(local)) = (addr_of(k.family, &k.src, k.sport), addr_of(k.family, &k.dst, k.dport))
        else {
            self.counters.reports_refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let armed = {
            let mut st = self.state.lock().unwrap();
            match st.armed.get(&(client, local)) {
                None => None,
                // A segment the dead dispatcher's peer could not have sent: forged, or
                // nothing we can continue. The record stays for the genuine one.
                Some(a) if !a.plausible(echo) => {
                    self.counters.implausible.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                // A quiet connection's bare acknowledgement: wait for its request.
                Some(a) if a.quiet && payload == 0 && flags & TCP_FIN == 0 => {
                    self.counters.waited.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Some(_) => st.armed.remove(&(client, local)),
            }
        };
        let Some(armed) = armed else {
            self.counters.reports_refused.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let resume = Resume { rcv_nxt: seq, snd_nxt: ack, ts_echo: echo, window };
        // A quiet connection's next request, when the report carries all of the segment's
        // data: the rebuilt socket gets it at once (else the client retransmits it).
        let given = match e.data_len as usize {
            n if armed.quiet && payload > 0 && n == payload && n <= e.data.len() => &e.data[..n],
            _ => &[][..],
        };
        let rebuilt = {
            let _repairing = self.repairing.lock().unwrap();
            rebuild_with(local, client, &armed.open.handshake, &resume, given, armed.quiet)
        };
        if let Err(err) = &rebuilt {
            // Armed again: the client's next segment (or the next probe's answer) tries
            // once more, until the record expires.
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            crate::ratelimit::warn("rebuilding a taken-over connection", err);
            self.state.lock().unwrap().armed.insert((client, local), armed);
            return;
        }
        // The socket exists: the XDP program lets the segments through.
        let _ = self.map.lock().unwrap().remove(&k);
        {
            let st = self.state.lock().unwrap();
            if st.armed.is_empty() {
                (self.armed_flag)(false);
            }
        }
        match rebuilt {
            Ok(sock) if armed.quiet => {
                self.counters.rebuilt.fetch_add(1, Ordering::Relaxed);
                if !given.is_empty() {
                    self.counters.given.fetch_add(1, Ordering::Relaxed);
                }
                tracing::debug!(%client, %local, "connection taken over");
                if let Err(sock) = adoption.hand(local, sock) {
                    // No worker serves the VIP any more: ends as a reset.
                    reset(sock);
                }
            }
            Ok(sock) => {
                self.counters.reset.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%client, %local, "connection was busy when its dispatcher died: reset");
                reset(sock);
            }
            Err(_) => {}
        }
    }

    /// Armed records now.
    pub fn armed(&self) -> usize {
        self.state.lock().unwrap().armed.len()
    }

    /// Records held (not armed), over all senders.
    pub fn held(&self) -> usize {
        self.state.lock().unwrap().received.total
    }
}

/// Closes a socket with a reset (a zero linger).
pub fn reset(sock: std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: `linger` is a live value of the size passed; the descriptor is `sock`'s.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(sock);
}

#[cfg(test)]
mod tests {
    use super::{super::repair::Handshake, *};

    fn open(id: u32, port: u16) -> Item {
        Item::Open(Open {
            id,
            client: SocketAddr::from(([10, 98, 0, 7], port)),
            local: "10.99.100.40:80".parse().unwrap(),
            handshake: Handshake {
                mss: 1448,
                snd_wscale: 7,
                rcv_wscale: 7,
                sack: true,
                timestamps: true,
                wscale: true,
            },
            ts_clock: 1_000_000,
            age_ms: 0,
        })
    }

    fn batch(sender: &str, number: u64, items: Vec<Item>) -> Batch {
        Batch { sender: sender.into(), incarnation: 1, number, items }
    }

    impl Received {
        fn take_now(&mut self, b: Batch) -> (bool, u64) {
            self.take(b, Instant::now())
        }
    }

    #[test]
    fn records_follow_opens_closes_and_bitmaps_and_old_batches_are_refused() {
        let mut r = Received::default();
        assert_eq!(r.take_now(batch("d1", 10, vec![open(0, 1000), open(1, 1001), open(9, 1009)])), (true, 0));
        assert_eq!(r.take_now(batch("d1", 11, vec![Item::Quiet { first: 0, bits: vec![0b10, 0b10] }])), (true, 0));
        let d1 = &r.peers["d1"];
        assert_eq!((d1.is_quiet(0), d1.is_quiet(1), d1.is_quiet(9)), (false, true, true));
        // A replayed or reordered batch changes nothing.
        assert_eq!(r.take_now(batch("d1", 11, vec![Item::Close(1)])), (false, 0));
        assert_eq!(r.take_now(batch("d1", 5, vec![Item::Close(1)])), (false, 0));
        assert_eq!(r.total, 3);
        assert_eq!(r.take_now(batch("d1", 12, vec![Item::Close(1), Item::Close(4)])), (true, 0));
        assert_eq!(r.total, 2);
        // A shorter bitmap from id 0: the ids past it are not quiet any more.
        r.take_now(batch("d1", 13, vec![Item::Quiet { first: 0, bits: vec![0b1] }]));
        assert!(r.peers["d1"].is_quiet(0) && !r.peers["d1"].is_quiet(9));
        // Out of bounds: an id past the tracked range, a bitmap not on a byte or too long.
        let far = super::super::outbox::MAX_TRACKED as u32;
        let (taken, refused) = r.take_now(batch(
            "d1",
            14,
            vec![open(far, 2000), Item::Quiet { first: 3, bits: vec![1] }, Item::Quiet { first: far, bits: vec![1] }],
        ));
        assert_eq!((taken, refused, r.total), (true, 3, 2));
        // Another sender's records are its own; a dead one's go with it.
        r.take_now(batch("d2", 1, vec![open(0, 3000)]));
        assert_eq!(r.total, 3);
        // A restarted sender (a newer incarnation): its earlier records are gone; an older
        // incarnation's batch is refused.
        let mut again = batch("d2", 1, vec![open(5, 3005)]);
        again.incarnation = 200;
        assert_eq!(r.take_now(again), (true, 0));
        assert_eq!((r.peers["d2"].records.len(), r.total), (1, 3));
        assert_eq!(r.take_now(batch("d2", 99, vec![open(6, 3006)])), (false, 0));
        let gone = r.remove("d1").unwrap();
        assert_eq!((gone.records.len(), r.total), (2, 1));
        assert!(r.remove("d1").is_none());
        // A graceful stop: everything of the sender forgotten (nothing to arm).
        let mut forget = batch("d2", 5, vec![Item::Forget]);
        forget.incarnation = 200;
        r.take_now(forget);
        assert_eq!((r.peers["d2"].records.len(), r.total), (0, 0));
    }

    #[test]
    fn a_report_must_echo_a_timestamp_the_dead_dispatcher_could_have_sent() {
        let Item::Open(open) = open(0, 1000) else { unreachable!() };
        let a = Armed {
            open: Open { age_ms: 30_000, ..open },
            received: Instant::now(),
            quiet: true,
            until: Instant::now(),
        };
        for (echo, ok) in [
            (Some(1_000_000), true),
            (Some(1_000_000 + 30_000), true),
            (Some(1_000_000 - 1_500), true),
            (Some(1_000_000 + 40_000), false),
            (Some(999_000_000), false),
            (Some(1_000_000u32.wrapping_sub(3_000_000_000)), false),
            (None, false),
        ] {
            assert_eq!(a.plausible(echo), ok, "{echo:?}");
        }
        // Around the clock's wrap.
        let w = Armed { open: Open { ts_clock: u32::MAX - 10, ..a.open }, ..a };
        assert!(w.plausible(Some(5)) && !w.plausible(Some(u32::MAX - 5_000)));
    }

    #[test]
    fn a_batch_from_the_future_is_refused() {
        let now_us = 1_800_000_000_000_000;
        let mut r = Received::default();
        let mut b = batch("d1", 5_000_000, vec![open(0, 1000)]);
        b.incarnation = now_us - 10_000_000;
        assert_eq!(r.take_at(b.clone(), Instant::now(), now_us), (true, 0));
        // A forged batch far ahead (its incarnation, or its number) is not taken, and does
        // not hold the real ones back.
        for (incarnation, number) in [(u64::MAX, 1), (now_us - 10_000_000, u64::MAX), (now_us + 61_000_000, 1)] {
            let f = Batch { incarnation, number, ..batch("d1", 0, vec![Item::Forget]) };
            assert_eq!(r.take_at(f, Instant::now(), now_us), (false, 0), "{incarnation} {number}");
        }
        b.number = 6_000_000;
        assert_eq!(r.take_at(b, Instant::now(), now_us), (true, 0));
        assert_eq!(r.total, 1);
    }

    /// A forged batch with a newer incarnation (from the sender's address) makes its
    /// records forgotten, but does not lock the sender out: its next real batch, later in
    /// time, is taken and its run's records come back with it.
    #[test]
    fn a_forged_incarnation_does_not_lock_the_sender_out() {
        let now_us = 1_800_000_000_000_000;
        let run = now_us - 100_000_000;
        let mut r = Received::default();
        let real = |number: u64, items| Batch { incarnation: run, ..batch("d1", number, items) };
        assert_eq!(r.take_at(real(99_000_000, vec![open(0, 1000)]), Instant::now(), now_us), (true, 0));
        let forged = Batch { incarnation: now_us - 500_000, ..batch("d1", 0, vec![]) };
        assert_eq!(r.take_at(forged, Instant::now(), now_us), (true, 0));
        assert_eq!(r.total, 0, "the forged run's start drops the real run's records");
        let later = now_us + 10_000;
        assert_eq!(r.take_at(real(100_010_000, vec![open(1, 1001)]), Instant::now(), later), (true, 0));
        assert_eq!((r.peers["d1"].incarnation, r.total), (run, 1), "the real run is taken again");
    }

    #[test]
    fn records_past_the_cap_are_refused() {
        let mut r = Received { total: MAX_RECORDS - 1, ..Default::default() };
        assert_eq!(r.take_now(batch("d1", 1, vec![open(0, 1000), open(1, 1001)])), (true, 1));
        // A record already held may be sent again (a new fallback owner, a refresh).
        assert_eq!(r.take_now(batch("d1", 2, vec![open(0, 1000)])), (true, 0));
        assert_eq!(r.total, MAX_RECORDS);
    }

    #[test]
    fn the_timestamp_echo_is_found_past_nops_and_other_options() {
        let mut o = vec![1, 1, 8, 10, 0, 0, 0, 5, 0, 0, 1, 2];
        assert_eq!(ts_echo(&o), Some(0x0102));
        o = vec![5, 10, 0, 0, 0, 0, 0, 0, 0, 0, 8, 10, 0, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef];
        assert_eq!(ts_echo(&o), Some(0xdeadbeef));
        assert_eq!(ts_echo(&[8, 10, 0, 0]), None, "cut short");
        assert_eq!(ts_echo(&[3, 0, 8, 10, 0, 0, 0, 0, 0, 0, 0, 1]), None, "a zero length ends the walk");
        assert_eq!(ts_echo(&[0, 8, 10, 0, 0, 0, 0, 0, 0, 0, 1]), None, "end of options");
        assert_eq!(ts_echo(&[]), None);
    }
}
