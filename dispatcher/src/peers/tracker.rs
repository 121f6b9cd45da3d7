//! Which peers this dispatcher hears, from their heartbeats: pure (the clock is an
//! argument), so that misses, recovery and what is refused are tested here.
//!
//! A peer is a live member of the store that publishes a heartbeat address
//! (`shared::view::View::heartbeat_targets`). It is unreachable once nothing was heard
//! from it for `misses` heartbeat intervals (a peer never heard yet gets at least
//! `FIRST_HEARD_WITHIN`: it may start sending a moment after its member key appears), and
//! reachable again at its next heartbeat. Every datagram is untrusted: it counts only when
//! it comes from a peer's published address and port and names that peer.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

/// The first bytes of every datagram of the peer channel, then the kind.
pub const MAGIC: &[u8; 4] = b"DSPL";
/// The channel's version.
pub const VERSION: u8 = 1;
/// A heartbeat: `MAGIC`, `VERSION`, `KIND_HEARTBEAT`, the sender's name's length (1 byte)
/// and its name.
pub const KIND_HEARTBEAT: u8 = 1;
/// A batch of another module's (`Cargo`: takeover's records): `MAGIC`, `VERSION`,
/// `KIND_BATCH`, then its own format.
pub const KIND_BATCH: u8 = 2;
/// The longest batch datagram (fits a 1,500-byte MTU with IPv6 and UDP headers).
pub const MAX_BATCH: usize = 1400;

/// A batch, by its kind (not a heartbeat).
pub fn is_batch(d: &[u8]) -> bool {
    d.len() > MAGIC.len() + 1 && d.starts_with(MAGIC) && d[MAGIC.len() + 1] == KIND_BATCH
}

/// The longest name (`[cluster] name` is 1 to 64 characters).
pub const MAX_NAME: usize = 64;
/// The longest datagram taken (a larger one is refused whole).
pub const MAX_DATAGRAM: usize = MAGIC.len() + 3 + MAX_NAME;
/// A peer never heard yet is unreachable after this at least.
pub const FIRST_HEARD_WITHIN: Duration = Duration::from_secs(1);

/// A heartbeat from `name`.
pub fn heartbeat(name: &str) -> Vec<u8> {
    let name = &name.as_bytes()[..name.len().min(MAX_NAME)];
    let mut m = Vec::with_capacity(MAX_DATAGRAM);
    m.extend_from_slice(MAGIC);
    m.extend_from_slice(&[VERSION, KIND_HEARTBEAT, name.len() as u8]);
    m.extend_from_slice(name);
    m
}

/// The sender's name in a heartbeat, if `d` is one.
pub fn parse_heartbeat(d: &[u8]) -> Option<&str> {
    let rest = d.strip_prefix(MAGIC)?;
    let (&[version, kind, len], name) = rest.split_first_chunk::<3>()?;
    if version != VERSION || kind != KIND_HEARTBEAT || len as usize != name.len() || name.is_empty() {
        return None;
    }
    std::str::from_utf8(name).ok()
}

/// The name a datagram of any kind says it comes from (the header every kind begins
/// with: magic, version, kind, the name's length, the name).
pub fn sender_name(d: &[u8]) -> Option<&str> {
    let rest = d.strip_prefix(MAGIC)?;
    let (&[version, _, len], rest) = rest.split_first_chunk::<3>()?;
    if version != VERSION || len == 0 {
        return None;
    }
    std::str::from_utf8(rest.get(..len as usize)?).ok()
}

/// Why a datagram was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a heartbeat of this version (or too long).
    Malformed,
    /// Not from the address and port a live peer published.
    UnknownSender,
    /// From a peer's address, naming another.
    WrongName,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [Refusal::Malformed, Refusal::UnknownSender, Refusal::WrongName];

    pub fn label(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::UnknownSender => "unknown_sender",
            Refusal::WrongName => "wrong_name",
        }
    }
}

/// One peer as this dispatcher hears it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heard {
    pub addr: SocketAddr,
    /// Since when it is watched (its member key first seen with this address).
    pub since: Instant,
    /// Its last heartbeat.
    pub last: Option<Instant>,
    pub unreachable: bool,
    /// Heartbeats taken from it.
    pub received: u64,
    /// When it last went unreachable or came back.
    pub changed: Option<Instant>,
}

pub struct Tracker {
    interval: Duration,
    misses: u32,
    peers: BTreeMap<String, Heard>,
}

impl Tracker {
    pub fn new(interval: Duration, misses: u32) -> Tracker {
        Tracker { interval, misses: misses.max(1), peers: BTreeMap::new() }
    }

    /// Silence longer than this makes a peer unreachable.
    pub fn deadline(&self) -> Duration {
        self.interval * self.misses
    }

    /// The peers to watch (the live members that take heartbeats, this one excepted). A
    /// new peer, or one with a new address, is watched from `now`; a peer no longer listed
    /// is forgotten. Whether the unreachable set changed.
    pub fn set_targets(&mut self, targets: &[(String, SocketAddr)], now: Instant) -> bool {
        let before = self.unreachable();
        self.peers.retain(|name, h| targets.iter().any(|(n, a)| n == name && *a == h.addr));
        for (name, addr) in targets {
            self.peers.entry(name.clone()).or_insert(Heard {
                addr: *addr,
                since: now,
                last: None,
                unreachable: false,
                received: 0,
                changed: None,
            });
        }
        self.unreachable() != before
    }

    /// Where heartbeats go.
    pub fn targets(&self) -> Vec<SocketAddr> {
        self.peers.values().map(|h| h.addr).collect()
    }

    /// A datagram from `from`: a heartbeat of a watched peer marks it heard (`Ok(true)`:
    /// it was unreachable and is back).
    pub fn heard(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) -> Result<bool, Refusal> {
        if datagram.len() > MAX_DATAGRAM {
            return Err(Refusal::Malformed);
        }
        let name = parse_heartbeat(datagram).ok_or(Refusal::Malformed)?;
        // The peer the datagram names, from the address that peer published: found by
        // its name first, so that another member publishing the same address (a forged
        // key) cannot make the real one's heartbeats refused.
        let Some(h) = self.peers.get_mut(name).filter(|h| h.addr == from) else {
            return Err(if self.peers.values().any(|h| h.addr == from) {
                Refusal::WrongName
            } else {
                Refusal::UnknownSender
            });
        };
        h.last = Some(now);
        h.received += 1;
        if h.unreachable {
            h.unreachable = false;
            h.changed = Some(now);
            return Ok(true);
        }
        Ok(false)
    }

    /// Marks unreachable the peers silent past the deadline; whether any changed.
    pub fn tick(&mut self, now: Instant) -> bool {
        let deadline = self.deadline();
        let mut changed = false;
        for h in self.peers.values_mut() {
            let silent = match h.last {
                Some(last) => now.saturating_duration_since(last) > deadline,
                None => now.saturating_duration_since(h.since) > deadline.max(FIRST_HEARD_WITHIN),
            };
            if silent && !h.unreachable {
                h.unreachable = true;
                h.changed = Some(now);
                changed = true;
            }
        }
        changed
    }

    /// The peers this dispatcher publishes unreachable, by name.
    pub fn unreachable(&self) -> Vec<String> {
        self.peers.iter().filter(|(_, h)| h.unreachable).map(|(n, _)| n.clone()).collect()
    }

    pub fn peers(&self) -> &BTreeMap<String, Heard> {
        &self.peers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn addr(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 99, 0, i], 7405))
    }

    fn two() -> Vec<(String, SocketAddr)> {
        vec![("d1".into(), addr(4)), ("d2".into(), addr(5))]
    }

    #[test]
    fn a_peer_is_unreachable_after_its_misses_and_back_at_its_next_heartbeat() {
        let t0 = Instant::now();
        let mut t = Tracker::new(100 * MS, 3);
        assert!(!t.set_targets(&two(), t0));
        for k in 1..=10u32 {
            let now = t0 + 100 * MS * k;
            assert_eq!(t.heard(addr(4), &heartbeat("d1"), now), Ok(false));
            assert_eq!(t.heard(addr(5), &heartbeat("d2"), now), Ok(false));
            assert!(!t.tick(now));
        }
        // d2 goes silent at 1.0 s: still reachable at 3 missed intervals, out just after.
        let last = t0 + 1000 * MS;
        for k in 11..=13u32 {
            let now = t0 + 100 * MS * k;
            t.heard(addr(4), &heartbeat("d1"), now).unwrap();
            assert!(!t.tick(now), "{k}");
        }
        assert!(t.unreachable().is_empty());
        assert!(t.tick(last + 301 * MS));
        assert_eq!(t.unreachable(), ["d2"]);
        assert!(!t.tick(last + 400 * MS), "said once");
        assert_eq!(t.peers()["d2"].changed, Some(last + 301 * MS));
        // Back at its first heartbeat.
        assert_eq!(t.heard(addr(5), &heartbeat("d2"), last + 2000 * MS), Ok(true));
        assert!(t.unreachable().is_empty());
        t.heard(addr(4), &heartbeat("d1"), last + 2100 * MS).unwrap();
        assert!(!t.tick(last + 2100 * MS));
        assert_eq!(t.peers()["d2"].received, 11);
    }

    #[test]
    fn a_new_peer_gets_time_for_its_first_heartbeat() {
        let t0 = Instant::now();
        let mut t = Tracker::new(100 * MS, 3);
        t.set_targets(&two(), t0);
        assert!(!t.tick(t0 + 900 * MS));
        t.heard(addr(4), &heartbeat("d1"), t0 + 950 * MS).unwrap();
        assert!(t.tick(t0 + 1001 * MS));
        assert_eq!(t.unreachable(), ["d2"]);
        // Its member key goes (lease expired): forgotten, no longer published.
        assert!(t.set_targets(&two()[..1], t0 + 1100 * MS));
        assert!(t.unreachable().is_empty());
        // It comes back with another address: watched afresh.
        let moved = vec![("d1".to_string(), addr(4)), ("d2".to_string(), addr(9))];
        assert!(!t.set_targets(&moved, t0 + 1200 * MS));
        assert_eq!(t.peers()["d2"].since, t0 + 1200 * MS);
        assert_eq!(t.peers()["d1"].since, t0, "an unchanged peer keeps its record");
        assert_eq!(t.heard(addr(5), &heartbeat("d2"), t0 + 1250 * MS), Err(Refusal::UnknownSender));
        assert_eq!(t.heard(addr(9), &heartbeat("d2"), t0 + 1250 * MS), Ok(false));
    }

    #[test]
    fn only_a_peer_from_its_own_address_counts() {
        let t0 = Instant::now();
        let mut t = Tracker::new(100 * MS, 3);
        t.set_targets(&two(), t0);
        // From d1's address naming d2; from an unknown address or port; malformed.
        assert_eq!(t.heard(addr(4), &heartbeat("d2"), t0), Err(Refusal::WrongName));
        assert_eq!(t.heard(addr(7), &heartbeat("d2"), t0), Err(Refusal::UnknownSender));
        assert_eq!(t.heard(SocketAddr::from(([10, 99, 0, 5], 9)), &heartbeat("d2"), t0), Err(Refusal::UnknownSender));
        let mut long = heartbeat("d2");
        long.extend_from_slice(&[0; 100]);
        for bad in [
            &b""[..],
            b"DSPL",
            b"DSPL\x02\x01\x02d2",
            b"DSPL\x01\x07\x02d2",
            b"DSPL\x01\x01\x05d2",
            b"XXXX\x01\x01\x02d2",
            &long,
        ] {
            assert_eq!(t.heard(addr(5), bad, t0), Err(Refusal::Malformed), "{bad:?}");
        }
        assert_eq!(t.peers()["d2"].received, 0);
        assert_eq!(parse_heartbeat(&heartbeat("d2")), Some("d2"));
        assert!(heartbeat(&"x".repeat(100)).len() <= MAX_DATAGRAM);
        assert_eq!(sender_name(&heartbeat("d2")), Some("d2"));
        assert_eq!(sender_name(b"DSPL\x01\x01\x05d2"), None, "a name cut short");
    }

    /// Another member (a forged key) publishing a live peer's address does not silence
    /// it: the peer a heartbeat names is found by name, then its address checked.
    #[test]
    fn a_member_publishing_anothers_address_does_not_silence_it() {
        let t0 = Instant::now();
        let mut t = Tracker::new(100 * MS, 3);
        let forged = vec![("d0".to_string(), addr(5)), ("d1".to_string(), addr(4)), ("d2".to_string(), addr(5))];
        t.set_targets(&forged, t0);
        assert_eq!(t.heard(addr(5), &heartbeat("d2"), t0), Ok(false));
        assert_eq!(t.peers()["d2"].received, 1);
        assert_eq!(t.peers()["d0"].received, 0);
    }
}
