//! The peer channel between dispatchers: UDP datagrams on the segment steering uses, from
//! and to `[cluster] heartbeat_port` on each dispatcher's address there. It carries
//! heartbeats (peer liveness, issue 31 part 2) and, with `[cluster] takeover`, the
//! batches of connection records (`takeover::wire`), sent with the heartbeats every
//! interval; it is a module of its own, neither part of steering nor of the store's link.
//!
//! A batch counts only from a peer's published address and port and naming that peer
//! (as a heartbeat); else it is refused and counted like one.
//!
//! Every `heartbeat_interval` this dispatcher sends one heartbeat to every other live
//! member that publishes a heartbeat address (its member key, `shared::view`), and
//! judges what it hears (`tracker`): a peer silent for `heartbeat_misses` intervals is
//! unreachable. The set of peers it cannot reach goes into its member key (`shared`); a
//! peer is out of every ownership table when most of the others publish it unreachable
//! (`shared::view::View::out_unreachable`), so that all of them install the same table.
//!
//! Bounded: one heartbeat per peer per interval, of at most `tracker::MAX_DATAGRAM` bytes
//! (batches: at most `tracker::MAX_BATCH` bytes, as many as their sender bounds);
//! what arrives is read into a fixed buffer, and anything but a heartbeat from a peer's
//! published address naming that peer is refused and counted. Nothing received can take a
//! peer out: a forged heartbeat can only keep a dead peer in until its lease expires (as
//! before this channel existed).

pub mod tracker;

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use crate::api::PeerStatus;
pub use tracker::Tracker;

#[derive(Default)]
pub struct Counters {
    pub sent: AtomicU64,
    pub send_errors: AtomicU64,
    pub received: AtomicU64,
    pub refused: [AtomicU64; tracker::Refusal::ALL.len()],
    /// Batches (`Cargo`) sent, and received while nothing here takes them.
    pub batches_sent: AtomicU64,
    pub batches_ignored: AtomicU64,
}

/// The running peer channel: what the store's link (`shared`) reads and tells it.
pub struct Liveness {
    me: String,
    local: SocketAddr,
    tracker: Mutex<Tracker>,
    pub counters: Counters,
    /// The unreachable set changed (the member key is written again).
    changed: tokio::sync::Notify,
    /// New targets (wakes the task to send to them at once).
    retarget: tokio::sync::Notify,
    /// What else the channel carries (takeover's batches; set once at start).
    cargo: std::sync::OnceLock<Arc<dyn Cargo>>,
}

/// What the channel carries besides heartbeats: datagrams of kind
/// `tracker::KIND_BATCH`, from and to peers (`takeover` implements it; this module does
/// not depend on it).
pub trait Cargo: Send + Sync {
    /// A datagram of its kind from peer `from` (its address checked here): taken, or why
    /// not (it must name `from`).
    fn take(&self, from: &str, datagram: &[u8]) -> Result<(), tracker::Refusal>;
    /// This interval's datagrams, by peer name.
    fn outgoing(&self) -> Vec<(String, Vec<u8>)>;
    /// How often `outgoing` is asked (its own interval, not the heartbeats').
    fn every(&self) -> Duration;
}

impl Liveness {
    /// Binds `local` (this dispatcher's address on the segment, `heartbeat_port`) and
    /// starts sending and listening (inside a tokio runtime).
    pub fn start(me: &str, local: SocketAddr, interval: Duration, misses: u32) -> std::io::Result<Arc<Liveness>> {
        let std_sock = std::net::UdpSocket::bind(local)?;
        std_sock.set_nonblocking(true)?;
        let sock = tokio::net::UdpSocket::from_std(std_sock)?;
        let l = Arc::new(Liveness {
            me: me.to_string(),
            local,
            tracker: Mutex::new(Tracker::new(interval, misses)),
            counters: Counters::default(),
            changed: tokio::sync::Notify::new(),
            retarget: tokio::sync::Notify::new(),
            cargo: std::sync::OnceLock::new(),
        });
        tokio::spawn(run(l.clone(), sock, interval));
        tracing::info!(%local, ?interval, misses, "peer heartbeats started");
        Ok(l)
    }

    /// Carries `cargo`'s datagrams from now on.
    pub fn set_cargo(&self, cargo: Arc<dyn Cargo>) {
        let _ = self.cargo.set(cargo);
    }

    /// Where the others send their heartbeats (published in the member key).
    pub fn address(&self) -> SocketAddr {
        self.local
    }

    /// The peers to watch, from the store (every change of the members).
    pub fn set_targets(&self, targets: &[(String, SocketAddr)]) {
        let changed = self.tracker.lock().unwrap().set_targets(targets, Instant::now());
        self.retarget.notify_one();
        if changed {
            self.changed.notify_one();
        }
    }

    /// The peers this dispatcher cannot reach, by name.
    pub fn unreachable(&self) -> Vec<String> {
        self.tracker.lock().unwrap().unreachable()
    }

    /// Returns when the unreachable set changed (since the last call).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Each watched peer, for `status` and the metrics.
    pub fn status(&self) -> Vec<PeerStatus> {
        let now = Instant::now();
        let t = self.tracker.lock().unwrap();
        t.peers()
            .iter()
            .map(|(name, h)| PeerStatus {
                name: name.clone(),
                address: h.addr.to_string(),
                reachable: !h.unreachable,
                last_heard_ms: h.last.map(|l| now.saturating_duration_since(l).as_millis() as u64),
                received: h.received,
                changed_s_ago: h.changed.map(|c| now.saturating_duration_since(c).as_secs_f64()),
            })
            .collect()
    }

    /// Refused datagrams by reason (`tracker::Refusal` labels).
    pub fn refused(&self) -> Vec<(String, u64)> {
        tracker::Refusal::ALL
            .iter()
            .map(|r| (r.label().to_string(), self.counters.refused[*r as usize].load(Ordering::Relaxed)))
            .collect()
    }

    /// A batch: handed over when it comes from a peer's published address (the cargo
    /// checks it names that peer).
    fn batch(&self, from: SocketAddr, datagram: &[u8]) {
        // A peer with takeover on sends batches to one with it off: not an attack, not
        // worth a warning; counted.
        let Some(cargo) = self.cargo.get() else {
            self.counters.batches_ignored.fetch_add(1, Ordering::Relaxed);
            return;
        };
        // The peer the batch names, if it comes from that peer's published address (by
        // name first: another member publishing the same address changes nothing).
        let named = tracker::sender_name(datagram).map(str::to_string);
        let sender = {
            let t = self.tracker.lock().unwrap();
            named.filter(|n| t.peers().get(n).is_some_and(|h| h.addr == from))
        };
        let Some(name) = sender else { return self.refuse(from, tracker::Refusal::UnknownSender) };
        if let Err(why) = cargo.take(&name, datagram) {
            self.refuse(from, why);
        }
    }

    fn refuse(&self, from: SocketAddr, why: tracker::Refusal) {
        self.counters.refused[why as usize].fetch_add(1, Ordering::Relaxed);
        crate::ratelimit::warn_that(
            "peer datagram refused",
            &format_args!("refused a datagram on the peer channel from {from} ({})", why.label()),
        );
    }

    /// This interval's batches, each to its peer's address.
    fn send_batches(&self, sock: &tokio::net::UdpSocket) {
        let Some(cargo) = self.cargo.get() else { return };
        let batches = cargo.outgoing();
        if batches.is_empty() {
            return;
        }
        let addrs: std::collections::HashMap<String, SocketAddr> =
            self.tracker.lock().unwrap().peers().iter().map(|(n, h)| (n.clone(), h.addr)).collect();
        for (to, d) in batches {
            let Some(addr) = addrs.get(&to) else { continue };
            match sock.try_send_to(&d, *addr) {
                Ok(_) => self.counters.batches_sent.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.counters.send_errors.fetch_add(1, Ordering::Relaxed),
            };
        }
    }

    fn judge(&self, from: SocketAddr, datagram: &[u8]) {
        if tracker::is_batch(datagram) {
            return self.batch(from, datagram);
        }
        let r = self.tracker.lock().unwrap().heard(from, datagram, Instant::now());
        match r {
            Ok(back) => {
                self.counters.received.fetch_add(1, Ordering::Relaxed);
                if back {
                    tracing::info!(%from, "peer heartbeats back");
                    self.changed.notify_one();
                }
            }
            Err(why) => self.refuse(from, why),
        }
    }

    fn send_all(&self, sock: &tokio::net::UdpSocket, beat: &[u8]) {
        let targets = self.tracker.lock().unwrap().targets();
        for to in targets {
            // Never blocks: a full socket buffer drops this one (the next interval sends again).
            match sock.try_send_to(beat, to) {
                Ok(_) => self.counters.sent.fetch_add(1, Ordering::Relaxed),
                Err(_) => self.counters.send_errors.fetch_add(1, Ordering::Relaxed),
            };
        }
    }

    fn tick(&self) {
        let went = {
            let mut t = self.tracker.lock().unwrap();
            t.tick(Instant::now()).then(|| t.unreachable())
        };
        if let Some(now_unreachable) = went {
            tracing::warn!(unreachable = ?now_unreachable, "peer heartbeats missed");
            self.changed.notify_one();
        }
    }
}

/// Sends every interval, listens in between, until the agent stops.
async fn run(l: Arc<Liveness>, sock: tokio::net::UdpSocket, interval: Duration) {
    let beat = tracker::heartbeat(&l.me);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The cargo's own interval (set once at start, so looked up until it is there).
    let mut cargo_tick: Option<tokio::time::Interval> = None;
    // One byte more than the longest datagram taken: a longer one is seen as such.
    let mut buf = [0u8; tracker::MAX_BATCH + 1];
    loop {
        tokio::select! {
            _ = tick.tick() => {
                l.send_all(&sock, &beat);
                l.tick();
                if cargo_tick.is_none() {
                    cargo_tick = l.cargo.get().map(|c| {
                        let mut t = tokio::time::interval(c.every());
                        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                        t
                    });
                }
            }
            _ = async { cargo_tick.as_mut().unwrap().tick().await }, if cargo_tick.is_some() => {
                l.send_batches(&sock);
            }
            _ = l.retarget.notified() => l.send_all(&sock, &beat),
            r = sock.recv_from(&mut buf) => match r {
                Ok((n, from)) => l.judge(from, &buf[..n]),
                Err(e) => {
                    crate::ratelimit::warn("receiving on the peer channel", &e);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}
