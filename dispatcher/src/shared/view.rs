//! What the store holds, as every dispatcher reads it, and the one rule they all evaluate
//! on it. Pure: no I/O, so that the rule is tested here and is the same everywhere.
//!
//! Keys, under `[cluster] key_prefix`:
//!
//! | key | value | written by | lifetime |
//! |---|---|---|---|
//! | `members/<dispatcher>` | JSON `Member`: who, the backends its own checks see down, the peers its heartbeats do not reach | that dispatcher, at start and on a change of its verdicts | its lease |
//! | `operator/<backend>` | `drain` or `disabled` (absent: none) | any dispatcher, on an operator's command | until the next command |
//! | `clones/<clone or partition ID>` | backend name | the first dispatcher that learned it (create-if-absent) | kept |
//!
//! Everything read is untrusted input (`Policy`): a member counts only when its key is
//! held by a lease (etcd deletes such a key when the lease expires, so a key with a lease
//! is a live one), its name is one of `[cluster] peers` and its MAC a unicast address; an
//! operator key or a clone names a backend of the configuration; sizes and counts are
//! bounded. What is refused is returned as `Change::Refused` with its reason (counted and
//! logged by the caller) and changes nothing.

use std::collections::{BTreeMap, BTreeSet};

use dispatcher_common::Operator;
use serde::{Deserialize, Serialize};

/// The longest key read under the prefix (beyond the prefix itself).
pub const MAX_KEY_REST: usize = 256;
/// The longest member value (JSON).
pub const MAX_MEMBER_VALUE: usize = 16 * 1024;

/// A live dispatcher, as it registered itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    /// Seconds since the epoch when its agent started.
    pub started: u64,
    pub pid: u32,
    pub version: String,
    /// The backends this dispatcher's own checks see down (its published verdicts).
    #[serde(default)]
    pub down: Vec<String>,
    /// Its MAC on the segment it shares with the others, when it steers HTTP connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// It takes connections: in every dispatcher's ownership table (false after
    /// `dispatcher leave`, while its own connections finish).
    #[serde(default)]
    pub joined: bool,
    /// Where it sends and takes peer heartbeats (`peers`): `ip:port` on the segment it
    /// steers over; none: it checks nobody and nobody checks it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<String>,
    /// The peers its heartbeats do not reach (`peers::Tracker`): a peer is out of every
    /// ownership table when most of the others say so (`View::out_unreachable`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable: Vec<String>,
}

/// Why a key was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refusal {
    /// A key this version does not know (written by a newer one, or by someone else).
    UnknownKey,
    /// Not UTF-8, not the JSON or the word expected, a name that does not match its key.
    Malformed,
    /// Longer than the bounds above.
    TooLarge,
    /// A member key without a lease: it would never expire.
    NoLease,
    /// A member whose name is not in `[cluster] peers`.
    UnknownMember,
    /// A member MAC that is not a unicast, non-zero address.
    BadMac,
    /// A member heartbeat address that is not `ip:port` of a unicast host address.
    BadAddress,
    /// An operator key or a clone for a backend the configuration does not have.
    UnknownBackend,
    /// A clone ID that is empty, too long or not printable.
    BadId,
    /// The clone table is full (`Policy::max_clones`).
    TableFull,
}

impl Refusal {
    pub const ALL: [Refusal; 10] = [
        Refusal::UnknownKey,
        Refusal::Malformed,
        Refusal::TooLarge,
        Refusal::NoLease,
        Refusal::UnknownMember,
        Refusal::BadMac,
        Refusal::BadAddress,
        Refusal::UnknownBackend,
        Refusal::BadId,
        Refusal::TableFull,
    ];

    /// Its metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::UnknownKey => "unknown_key",
            Refusal::Malformed => "malformed",
            Refusal::TooLarge => "too_large",
            Refusal::NoLease => "no_lease",
            Refusal::UnknownMember => "unknown_member",
            Refusal::BadMac => "bad_mac",
            Refusal::BadAddress => "bad_address",
            Refusal::UnknownBackend => "unknown_backend",
            Refusal::BadId => "bad_id",
            Refusal::TableFull => "table_full",
        }
    }
}

/// A change the agent acts on, from one key written or deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Membership or a verdict: the health rule may decide differently now.
    Verdicts,
    Operator {
        backend: String,
        op: Operator,
    },
    Clone {
        id: String,
        backend: String,
    },
    /// A shared clone ID deleted from the store (by its operator): not routed by any more
    /// unless configured.
    CloneGone {
        id: String,
    },
    /// Nothing to act on.
    None,
    /// Not taken (counted and logged by the caller).
    Refused(Refusal),
}

/// What this dispatcher accepts from the store: the names its configuration knows, and
/// bounds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// `[cluster] peers`.
    pub peers: BTreeSet<String>,
    /// The peers written `name@MAC`: the MAC each must publish.
    pub peer_macs: BTreeMap<String, [u8; 6]>,
    /// The configuration's backends.
    pub backends: BTreeSet<String>,
    /// The most clone and partition IDs kept (the `CLONES` map's size).
    pub max_clones: usize,
}

impl Policy {
    /// What `cfg` knows: its `[cluster] peers` and its backends (not the retired ones).
    pub fn for_config(cfg: &crate::config::Config) -> Policy {
        let peers = cfg.cluster.as_ref().map(|c| c.peers.clone()).unwrap_or_default();
        let mut p = Policy::new(&peers, cfg.backends.iter().filter(|b| !b.retired).map(|b| b.name.clone()));
        p.peer_macs = cfg.cluster.as_ref().map(|c| c.peer_macs.clone()).unwrap_or_default();
        p
    }

    pub fn new(peers: &[String], backends: impl IntoIterator<Item = String>) -> Policy {
        Policy {
            peers: peers.iter().cloned().collect(),
            backends: backends.into_iter().collect(),
            peer_macs: BTreeMap::new(),
            max_clones: dispatcher_common::MAX_CLONES as usize,
        }
    }
}

/// The store's contents under the prefix, as far as they were taken.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub members: BTreeMap<String, Member>,
    pub operators: BTreeMap<String, Operator>,
    pub clones: BTreeMap<String, String>,
}

pub fn member_key(prefix: &str, me: &str) -> String {
    format!("{prefix}/members/{me}")
}

pub fn operator_key(prefix: &str, backend: &str) -> String {
    format!("{prefix}/operator/{backend}")
}

pub fn clone_key(prefix: &str, id: &str) -> String {
    format!("{prefix}/clones/{id}")
}

pub fn operator_value(op: Operator) -> Option<&'static str> {
    match op {
        Operator::None => None,
        Operator::Drain => Some("drain"),
        Operator::Disabled => Some("disabled"),
    }
}

impl View {
    /// The dispatchers that take HTTP connections: joined, with a MAC, and not
    /// unreachable by the others' word (`out_unreachable`).
    pub fn steering_peers(&self) -> Vec<crate::steering::Peer> {
        let out = self.out_unreachable();
        self.members
            .values()
            .filter(|m| m.joined && !out.contains(&m.name))
            .filter_map(|m| {
                let mac = crate::mac::parse_mac(m.mac.as_deref()?).ok()?;
                Some(crate::steering::Peer { name: m.name.clone(), mac })
            })
            .collect()
    }

    /// A key under `prefix` was written (`Some(value)`, with the lease that holds it, 0
    /// for none) or deleted (`None`).
    pub fn apply(&mut self, policy: &Policy, prefix: &str, key: &[u8], value: Option<&[u8]>, lease: i64) -> Change {
        match self.take(policy, prefix, key, value, lease) {
            Ok(c) => c,
            Err(r) => {
                // A member that no longer passes is no longer counted.
                if let Some(name) = member_name(prefix, key) {
                    if self.members.remove(name).is_some() {
                        return Change::Verdicts;
                    }
                }
                Change::Refused(r)
            }
        }
    }

    fn take(
        &mut self,
        policy: &Policy,
        prefix: &str,
        key: &[u8],
        value: Option<&[u8]>,
        lease: i64,
    ) -> Result<Change, Refusal> {
        let rest = std::str::from_utf8(key)
            .ok()
            .and_then(|k| k.strip_prefix(prefix))
            .and_then(|k| k.strip_prefix('/'))
            .ok_or(Refusal::UnknownKey)?;
        if rest.len() > MAX_KEY_REST {
            return Err(Refusal::TooLarge);
        }
        let parts: Vec<&str> = rest.split('/').collect();
        let text = match value {
            None => None,
            Some(v) if v.len() > MAX_MEMBER_VALUE => return Err(Refusal::TooLarge),
            Some(v) => Some(std::str::from_utf8(v).map(str::trim).map_err(|_| Refusal::Malformed)?),
        };
        match (parts.as_slice(), text) {
            (["members", name], None) => {
                Ok(if self.members.remove(*name).is_some() { Change::Verdicts } else { Change::None })
            }
            (["members", name], Some(v)) => self.take_member(policy, name, v, lease),
            (["operator", backend], v) => self.take_operator(policy, backend, v),
            (["clones", id], Some(backend)) => self.take_clone(policy, id, backend),
            (["clones", id], None) => Ok(if self.clones.remove(*id).is_some() {
                Change::CloneGone { id: id.to_string() }
            } else {
                Change::None
            }),
            _ => Err(Refusal::UnknownKey),
        }
    }

    /// A member key put: a known peer's, under its lease, with its own name and a unicast
    /// MAC (its pinned one, if any).
    fn take_member(&mut self, policy: &Policy, name: &str, v: &str, lease: i64) -> Result<Change, Refusal> {
        if lease == 0 {
            return Err(Refusal::NoLease);
        }
        if !policy.peers.contains(name) {
            return Err(Refusal::UnknownMember);
        }
        let mut m = serde_json::from_str::<Member>(v).map_err(|_| Refusal::Malformed)?;
        if m.name != name {
            return Err(Refusal::Malformed);
        }
        let mac = match &m.mac {
            Some(mac) => Some(crate::mac::parse_mac(mac).ok().filter(crate::mac::is_unicast).ok_or(Refusal::BadMac)?),
            None => None,
        };
        // A peer pinned to its MAC on the segment publishes that one or none.
        if let (Some(pinned), Some(mac)) = (policy.peer_macs.get(name), mac) {
            if *pinned != mac {
                return Err(Refusal::BadMac);
            }
        }
        if let Some(a) = &m.heartbeat {
            heartbeat_address(a).ok_or(Refusal::BadAddress)?;
        }
        // Verdicts on backends this configuration does not have decide nothing, nor do
        // words on peers it does not list (nor on itself).
        m.down.retain(|b| policy.backends.contains(b));
        m.down.sort();
        m.down.dedup();
        m.unreachable.retain(|p| policy.peers.contains(p) && p != name);
        m.unreachable.sort();
        m.unreachable.dedup();
        self.members.insert(name.to_string(), m);
        Ok(Change::Verdicts)
    }

    /// An operator key put (`drain`, `disabled`) or deleted, for a known backend.
    fn take_operator(&mut self, policy: &Policy, backend: &str, v: Option<&str>) -> Result<Change, Refusal> {
        if !policy.backends.contains(backend) {
            return Err(Refusal::UnknownBackend);
        }
        let op = match v {
            None => Operator::None,
            Some("drain") => Operator::Drain,
            Some("disabled") => Operator::Disabled,
            _ => return Err(Refusal::Malformed),
        };
        if op == Operator::None {
            self.operators.remove(backend);
        } else {
            self.operators.insert(backend.to_string(), op);
        }
        Ok(Change::Operator { backend: backend.to_string(), op })
    }

    /// A clone key put: a well-formed ID, a known backend, room in the table (or known).
    fn take_clone(&mut self, policy: &Policy, id: &str, backend: &str) -> Result<Change, Refusal> {
        if !clone_id_ok(id.as_bytes()) {
            return Err(Refusal::BadId);
        }
        if !policy.backends.contains(backend) {
            return Err(Refusal::UnknownBackend);
        }
        if !self.clones.contains_key(id) && self.clones.len() >= policy.max_clones {
            return Err(Refusal::TableFull);
        }
        self.clones.insert(id.to_string(), backend.to_string());
        Ok(Change::Clone { id: id.to_string(), backend: backend.to_string() })
    }

    /// The cluster-wide health rule: a backend is out when more than half of the live
    /// dispatchers (those holding a lease) publish it down. A dispatcher whose lease
    /// expired counts neither way; the operator's word is applied on its own
    /// (`operators`). Every dispatcher evaluates this on the same keys and so decides the
    /// same.
    pub fn out_by_majority(&self, backend: &str) -> bool {
        let live = self.members.len();
        let down = self.members.values().filter(|m| m.down.iter().any(|d| d == backend)).count();
        live > 0 && down * 2 > live
    }

    /// The dispatchers out of every ownership table because their heartbeats do not reach
    /// the others: a dispatcher that sends heartbeats (`Member::heartbeat`) is out when
    /// more than half of the other live ones that send heartbeats, and are not out
    /// themselves, and at least two of them, publish it unreachable. Those out are taken
    /// one at a time, the most accused first (then by name), until no one else
    /// qualifies. With two dispatchers one voice is never enough (which side's receiving
    /// is broken cannot be told): their leases decide, as before the heartbeats. Every
    /// dispatcher evaluates this on the same keys and so installs the same table; one
    /// that alone misses a peer's heartbeats moves nothing.
    pub fn out_unreachable(&self) -> BTreeSet<String> {
        let checkers: Vec<&Member> = self.members.values().filter(|m| m.heartbeat.is_some()).collect();
        let mut out = BTreeSet::new();
        // (accusers, others) of `name`, among those not out.
        let tally = |name: &str, out: &BTreeSet<String>| {
            let others = checkers.iter().filter(|c| c.name != name && !out.contains(&c.name));
            let accusers = others.clone().filter(|c| c.unreachable.iter().any(|u| u == name)).count();
            (accusers, others.count())
        };
        loop {
            let next = checkers
                .iter()
                .filter(|m| !out.contains(&m.name))
                .map(|m| (tally(&m.name, &out), &m.name))
                // At least two voices: one dispatcher alone never moves a peer (with two
                // members, which of them is right cannot be told; their leases decide).
                .filter(|((accusers, others), _)| *accusers >= 2 && accusers * 2 > *others)
                // The most accused first, then by name.
                .min_by(|((a, _), x), ((b, _), y)| b.cmp(a).then(x.cmp(y)));
            match next {
                Some((_, name)) => {
                    out.insert(name.clone());
                }
                None => return out,
            }
        }
    }

    /// `out_unreachable` with who says so, in words: `d2 (unreachable for d0,d3)`.
    pub fn out_unreachable_why(&self) -> Vec<String> {
        self.out_unreachable()
            .into_iter()
            .map(|n| format!("{n} (unreachable for {})", self.unreachable_by(&n).join(",")))
            .collect()
    }

    /// Who publishes `name` unreachable.
    pub fn unreachable_by(&self, name: &str) -> Vec<String> {
        self.members.values().filter(|m| m.unreachable.iter().any(|u| u == name)).map(|m| m.name.clone()).collect()
    }

    /// Where to send heartbeats: every other live member that takes them (`me` excluded).
    pub fn heartbeat_targets(&self, me: &str) -> Vec<(String, std::net::SocketAddr)> {
        self.members
            .values()
            .filter(|m| m.name != me)
            .filter_map(|m| Some((m.name.clone(), heartbeat_address(m.heartbeat.as_deref()?)?)))
            .collect()
    }

    /// The live dispatchers that see `backend` down.
    pub fn seen_down_by(&self, backend: &str) -> Vec<String> {
        self.members.values().filter(|m| m.down.iter().any(|d| d == backend)).map(|m| m.name.clone()).collect()
    }
}

/// The member name of a `members/<name>` key under `prefix`.
fn member_name<'a>(prefix: &str, key: &'a [u8]) -> Option<&'a str> {
    std::str::from_utf8(key).ok()?.strip_prefix(prefix)?.strip_prefix("/members/").filter(|n| !n.contains('/'))
}

/// A member's heartbeat address: `ip:port` of a unicast host address (never loopback,
/// unspecified, multicast or broadcast: heartbeats go there), port not 0.
pub fn heartbeat_address(a: &str) -> Option<std::net::SocketAddr> {
    let sa: std::net::SocketAddr = a.parse().ok()?;
    // An IPv4-mapped IPv6 address is its IPv4 address (`[::ffff:127.0.0.1]` is loopback).
    let ip = match sa.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
        v4 => v4,
    };
    let sa = std::net::SocketAddr::new(ip, sa.port());
    let bad = ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || matches!(ip, std::net::IpAddr::V4(v4) if v4.is_broadcast());
    (!bad && sa.port() != 0).then_some(sa)
}

/// A clone, partition or logical-server ID as the dispatchers share and keep it: 1 to
/// `crate::state::MAX_CLONE_ID_LEN` printable ASCII characters, no `/` (it is a key
/// segment).
pub fn clone_id_ok(id: &[u8]) -> bool {
    crate::state::clone_id_ok(id) && !id.contains(&b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: &str = "/d/t";

    fn pol() -> Policy {
        let peers: Vec<String> =
            ["d1", "d2", "d3", "a", "b", "c", "d", "left", "old"].iter().map(|s| s.to_string()).collect();
        Policy::new(&peers, ["b0", "b1", "b2"].iter().map(|s| s.to_string()))
    }

    fn member_down(v: &mut View, name: &str, down: &[&str]) {
        let m = Member {
            name: name.into(),
            started: 1,
            pid: 2,
            version: "x".into(),
            down: down.iter().map(|d| d.to_string()).collect(),
            mac: Some(format!("02:00:00:00:00:{:02x}", name.len())),
            joined: name != "left",
            heartbeat: None,
            unreachable: Vec::new(),
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(v.apply(&pol(), P, member_key(P, name).as_bytes(), Some(json.as_bytes()), 7), Change::Verdicts);
    }

    fn member(v: &mut View, name: &str) {
        member_down(v, name, &[]);
    }

    fn verdict(v: &mut View, backend: &str, who: &str, down: bool) {
        let mut set: Vec<String> = v.members[who].down.clone();
        set.retain(|d| d != backend);
        if down {
            set.push(backend.to_string());
        }
        let set: Vec<&str> = set.iter().map(|s| s.as_str()).collect();
        member_down(v, who, &set);
    }

    #[test]
    fn steering_peers_are_the_joined_members_with_a_mac() {
        let mut v = View::default();
        member(&mut v, "d1");
        member(&mut v, "left");
        // An older dispatcher without a MAC steers nothing and owns nothing.
        let old = r#"{"name":"old","started":1,"pid":2,"version":"0"}"#;
        assert_eq!(v.apply(&pol(), P, member_key(P, "old").as_bytes(), Some(old.as_bytes()), 7), Change::Verdicts);
        let names: Vec<String> = v.steering_peers().into_iter().map(|p| p.name).collect();
        assert_eq!(names, ["d1"]);
    }

    #[test]
    fn out_needs_more_than_half_of_the_live_dispatchers() {
        let mut v = View::default();
        for m in ["d1", "d2", "d3"] {
            member(&mut v, m);
        }
        verdict(&mut v, "b0", "d1", true);
        assert!(!v.out_by_majority("b0"), "one of three");
        verdict(&mut v, "b0", "d2", true);
        assert!(v.out_by_majority("b0"), "two of three");
        verdict(&mut v, "b0", "d2", false);
        assert!(!v.out_by_majority("b0"));
        // A dispatcher whose lease expired no longer counts, either way.
        verdict(&mut v, "b0", "d2", true);
        v.apply(&pol(), P, member_key(P, "d3").as_bytes(), None, 0);
        assert!(v.out_by_majority("b0"), "two of two");
        assert_eq!(v.seen_down_by("b0"), vec!["d1".to_string(), "d2".to_string()]);
        v.apply(&pol(), P, member_key(P, "d2").as_bytes(), None, 0);
        assert!(v.out_by_majority("b0"), "one of one");
        v.apply(&pol(), P, member_key(P, "d1").as_bytes(), None, 0);
        assert!(!v.out_by_majority("b0"), "nobody live: nobody says so");
        member(&mut v, "d1");
        member(&mut v, "d2");
        verdict(&mut v, "b0", "d1", true);
        assert!(!v.out_by_majority("b0"), "one of two is not more than half");
        // Two of four is not a majority.
        let mut v = View::default();
        for m in ["a", "b", "c", "d"] {
            member(&mut v, m);
        }
        verdict(&mut v, "b0", "a", true);
        verdict(&mut v, "b0", "b", true);
        assert!(!v.out_by_majority("b0"));
        assert!(!v.out_by_majority("b1"), "another backend's verdicts are not this one's");
    }

    /// A member that sends heartbeats from `02:..`'s address and publishes `unreachable`.
    fn checker(v: &mut View, name: &str, unreachable: &[&str]) {
        let m = Member {
            name: name.into(),
            started: 1,
            pid: 2,
            version: "x".into(),
            down: Vec::new(),
            mac: Some(format!("02:00:00:00:00:{:02x}", name.len())),
            joined: true,
            heartbeat: Some("10.0.0.1:7405".into()),
            unreachable: unreachable.iter().map(|u| u.to_string()).collect(),
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(v.apply(&pol(), P, member_key(P, name).as_bytes(), Some(json.as_bytes()), 7), Change::Verdicts);
    }

    fn names(v: &View) -> Vec<String> {
        v.steering_peers().into_iter().map(|p| p.name).collect()
    }

    #[test]
    fn a_peer_is_out_of_the_table_when_most_others_cannot_reach_it() {
        let mut v = View::default();
        for m in ["a", "b", "c", "d"] {
            checker(&mut v, m, &[]);
        }
        // One of three others losing d's heartbeats moves nothing (it alone would steer
        // differently from the others).
        checker(&mut v, "a", &["d"]);
        assert!(v.out_unreachable().is_empty());
        assert_eq!(names(&v), ["a", "b", "c", "d"]);
        // Two of three: out, from everybody's table, d's own included.
        checker(&mut v, "b", &["d"]);
        assert_eq!(v.out_unreachable(), BTreeSet::from(["d".to_string()]));
        assert_eq!(names(&v), ["a", "b", "c"]);
        assert_eq!(v.unreachable_by("d"), ["a", "b"]);
        assert_eq!(v.out_unreachable_why(), ["d (unreachable for a,b)"]);
        // Its heartbeats come back: it is in again.
        checker(&mut v, "a", &[]);
        assert_eq!(names(&v), ["a", "b", "c", "d"]);
        // A dead dispatcher's last word still counts as a voice, not as an accusation:
        // the three others all see it gone.
        checker(&mut v, "a", &["d"]);
        checker(&mut v, "c", &["d"]);
        checker(&mut v, "b", &["d"]);
        assert_eq!(names(&v), ["a", "b", "c"]);
        // Its lease expires: it is gone as a member, and the words on it decide nothing.
        v.apply(&pol(), P, member_key(P, "d").as_bytes(), None, 0);
        assert_eq!(names(&v), ["a", "b", "c"]);
        assert!(v.out_unreachable().is_empty());

        // Two left: one voice alone moves nothing (which of the two is right cannot be
        // told: a dispatcher whose receiving side broke would take a live peer out); the
        // dead one's lease decides, as before the heartbeats.
        let mut v = View::default();
        checker(&mut v, "a", &["b"]);
        checker(&mut v, "b", &[]);
        assert_eq!(names(&v), ["a", "b"]);
        checker(&mut v, "b", &["a"]);
        assert_eq!(names(&v), ["a", "b"], "a split of two: neither goes");
        // Three, two of whom lost each other and the third hears both: nobody goes.
        checker(&mut v, "c", &[]);
        assert_eq!(names(&v), ["a", "b", "c"]);
        // One alone is never out, whatever it says.
        let mut v = View::default();
        checker(&mut v, "a", &["a"]);
        assert_eq!(names(&v), ["a"]);

        // A dispatcher that accuses everybody (its own receiving side is broken) takes
        // nobody out; the others' word on it decides.
        let mut v = View::default();
        checker(&mut v, "a", &["b", "c", "d"]);
        for m in ["b", "c", "d"] {
            checker(&mut v, m, &[]);
        }
        assert_eq!(names(&v), ["a", "b", "c", "d"]);
        // Taken one at a time: with d gone silent for all, d goes first; then c, whom a
        // and b cannot reach, is out by two of the two others left (2 of 3 before d went
        // would have been enough too).
        checker(&mut v, "a", &["c", "d"]);
        checker(&mut v, "b", &["c", "d"]);
        checker(&mut v, "c", &["d"]);
        assert_eq!(names(&v), ["a", "b"]);
        // Members without heartbeats (an older version) are neither judged nor judges.
        let mut v = View::default();
        member(&mut v, "d1");
        checker(&mut v, "a", &["d1"]);
        checker(&mut v, "b", &["d1"]);
        assert_eq!(names(&v), ["a", "b", "d1"]);
        // Names the configuration does not list, and itself, are dropped from its word.
        checker(&mut v, "c", &["evil", "c", "a"]);
        assert_eq!(v.members["c"].unreachable, ["a"]);
    }

    #[test]
    fn heartbeat_addresses_are_unicast_hosts() {
        for bad in [
            "127.0.0.1:7405",
            "0.0.0.0:7405",
            "255.255.255.255:7405",
            "224.0.0.1:7405",
            "10.0.0.1:0",
            "10.0.0.1",
            "x",
            "[::ffff:127.0.0.1]:7405",
            "[::1]:7405",
        ] {
            assert!(heartbeat_address(bad).is_none(), "{bad}");
            let mut m = serde_json::from_str::<Member>(&member_json("d2", &[], None)).unwrap();
            m.heartbeat = Some(bad.into());
            let json = serde_json::to_string(&m).unwrap();
            let mut v = View::default();
            assert_eq!(
                v.apply(&pol(), P, member_key(P, "d2").as_bytes(), Some(json.as_bytes()), 5),
                Change::Refused(Refusal::BadAddress),
                "{bad}"
            );
        }
        assert!(heartbeat_address("10.99.0.3:7405").is_some());
        assert_eq!(
            heartbeat_address("[::ffff:10.99.0.3]:7405"),
            heartbeat_address("10.99.0.3:7405"),
            "mapped: as IPv4"
        );
        assert!(heartbeat_address("[fd00::3]:7405").is_some());
        let mut v = View::default();
        checker(&mut v, "a", &[]);
        checker(&mut v, "b", &[]);
        assert_eq!(v.heartbeat_targets("a"), vec![("b".to_string(), "10.0.0.1:7405".parse().unwrap())]);
    }

    #[test]
    fn keys_parse_and_bad_values_are_ignored() {
        let mut v = View::default();
        assert_eq!(
            v.apply(&pol(), P, operator_key(P, "b1").as_bytes(), Some(b"drain"), 0),
            Change::Operator { backend: "b1".into(), op: Operator::Drain }
        );
        assert_eq!(v.operators.get("b1"), Some(&Operator::Drain));
        assert_eq!(
            v.apply(&pol(), P, operator_key(P, "b1").as_bytes(), None, 0),
            Change::Operator { backend: "b1".into(), op: Operator::None }
        );
        assert!(v.operators.is_empty());
        assert_eq!(
            v.apply(&pol(), P, operator_key(P, "b1").as_bytes(), Some(b"melt"), 0),
            Change::Refused(Refusal::Malformed)
        );
        assert_eq!(
            v.apply(&pol(), P, clone_key(P, "C1").as_bytes(), Some(b"b2"), 0),
            Change::Clone { id: "C1".into(), backend: "b2".into() }
        );
        assert_eq!(
            v.apply(&pol(), P, b"/d/tx/members/a", Some(b"{}"), 7),
            Change::Refused(Refusal::UnknownKey),
            "another prefix"
        );
        assert_eq!(v.apply(&pol(), P, b"/d/t/members/a", Some(b"not json"), 7), Change::Refused(Refusal::Malformed));
        let forged = serde_json::to_string(&Member {
            name: "b".into(),
            started: 0,
            pid: 0,
            version: String::new(),
            down: vec![],
            mac: None,
            joined: true,
            heartbeat: None,
            unreachable: Vec::new(),
        })
        .unwrap();
        assert_eq!(
            v.apply(&pol(), P, b"/d/t/members/a", Some(forged.as_bytes()), 7),
            Change::Refused(Refusal::Malformed),
            "name must match the key"
        );
        assert_eq!(v.apply(&pol(), P, b"/d/t/future/thing", Some(b"1"), 0), Change::Refused(Refusal::UnknownKey));
        assert_eq!(v.apply(&pol(), P, &[0xff, 0xfe], Some(b"1"), 0), Change::Refused(Refusal::UnknownKey));
    }

    fn member_json(name: &str, down: &[&str], mac: Option<&str>) -> String {
        serde_json::to_string(&Member {
            name: name.into(),
            started: 1,
            pid: 2,
            version: "x".into(),
            down: down.iter().map(|d| d.to_string()).collect(),
            mac: mac.map(str::to_string),
            joined: true,
            heartbeat: None,
            unreachable: Vec::new(),
        })
        .unwrap()
    }

    #[test]
    fn forged_members_are_not_counted() {
        let mut v = View::default();
        member(&mut v, "d1");
        // Two keys without a lease, both seeing b1 down: never counted, never expiring.
        for name in ["d2", "d3"] {
            let json = member_json(name, &["b1"], Some("02:00:00:00:00:09"));
            assert_eq!(
                v.apply(&pol(), P, member_key(P, name).as_bytes(), Some(json.as_bytes()), 0),
                Change::Refused(Refusal::NoLease)
            );
        }
        assert_eq!(v.members.len(), 1);
        assert!(!v.out_by_majority("b1"), "one live dispatcher sees b1 up");
        // A name the configuration does not list, with a lease of its own.
        let evil = member_json("evil", &["b1"], Some("02:66:66:66:66:66"));
        assert_eq!(
            v.apply(&pol(), P, member_key(P, "evil").as_bytes(), Some(evil.as_bytes()), 99),
            Change::Refused(Refusal::UnknownMember)
        );
        assert_eq!(v.steering_peers().len(), 1);
        // Broadcast, multicast and zero MACs.
        for mac in ["ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "00:00:00:00:00:00", "zz:00:00:00:00:00"] {
            let json = member_json("d2", &[], Some(mac));
            assert_eq!(
                v.apply(&pol(), P, member_key(P, "d2").as_bytes(), Some(json.as_bytes()), 5),
                Change::Refused(Refusal::BadMac),
                "{mac}"
            );
        }
        // A peer pinned to its MAC (`name@MAC` in peers) publishes that MAC.
        let mut pinned = pol();
        pinned.peer_macs.insert("d3".into(), [2, 0, 0, 0, 0, 3]);
        let other = member_json("d3", &[], Some("02:00:00:00:00:04"));
        assert_eq!(
            v.apply(&pinned, P, member_key(P, "d3").as_bytes(), Some(other.as_bytes()), 5),
            Change::Refused(Refusal::BadMac)
        );
        let own = member_json("d3", &[], Some("02:00:00:00:00:03"));
        assert_eq!(v.apply(&pinned, P, member_key(P, "d3").as_bytes(), Some(own.as_bytes()), 5), Change::Verdicts);
        v.apply(&pinned, P, member_key(P, "d3").as_bytes(), None, 0);
        // A known member that turns bad is no longer counted.
        member(&mut v, "d2");
        assert_eq!(v.members.len(), 2);
        let bad = member_json("d2", &[], Some("ff:ff:ff:ff:ff:ff"));
        assert_eq!(v.apply(&pol(), P, member_key(P, "d2").as_bytes(), Some(bad.as_bytes()), 5), Change::Verdicts);
        assert_eq!(v.members.len(), 1);
        // Verdicts on unknown backends are dropped; an oversized value is refused.
        let json = member_json("d3", &["b0", "nope", "b0"], None);
        v.apply(&pol(), P, member_key(P, "d3").as_bytes(), Some(json.as_bytes()), 5);
        assert_eq!(v.members["d3"].down, vec!["b0".to_string()]);
        let big = member_json("d3", &[&"x".repeat(MAX_MEMBER_VALUE)], None);
        assert_eq!(
            v.apply(&pol(), P, member_key(P, "d3").as_bytes(), Some(big.as_bytes()), 5),
            Change::Verdicts,
            "d3 dropped"
        );
        assert!(!v.members.contains_key("d3"));
    }

    #[test]
    fn clone_and_operator_keys_are_bounded() {
        let mut v = View::default();
        let mut p = pol();
        p.max_clones = 2;
        let long = "c".repeat(crate::state::MAX_CLONE_ID_LEN + 1);
        assert_eq!(v.apply(&p, P, clone_key(P, &long).as_bytes(), Some(b"b0"), 0), Change::Refused(Refusal::BadId));
        assert_eq!(v.apply(&p, P, clone_key(P, "c\u{7f}").as_bytes(), Some(b"b0"), 0), Change::Refused(Refusal::BadId));
        assert_eq!(
            v.apply(&p, P, clone_key(P, "c1").as_bytes(), Some(b"nope"), 0),
            Change::Refused(Refusal::UnknownBackend)
        );
        assert!(matches!(v.apply(&p, P, clone_key(P, "c1").as_bytes(), Some(b"b0"), 0), Change::Clone { .. }));
        assert!(matches!(v.apply(&p, P, clone_key(P, "c2").as_bytes(), Some(b"b1"), 0), Change::Clone { .. }));
        assert_eq!(v.apply(&p, P, clone_key(P, "c3").as_bytes(), Some(b"b1"), 0), Change::Refused(Refusal::TableFull));
        // A known ID may still be rewritten; a deletion makes room.
        assert!(matches!(v.apply(&p, P, clone_key(P, "c2").as_bytes(), Some(b"b2"), 0), Change::Clone { .. }));
        assert_eq!(v.apply(&p, P, clone_key(P, "c1").as_bytes(), None, 0), Change::CloneGone { id: "c1".into() });
        assert_eq!(v.apply(&p, P, clone_key(P, "c1").as_bytes(), None, 0), Change::None);
        assert!(matches!(v.apply(&p, P, clone_key(P, "c3").as_bytes(), Some(b"b1"), 0), Change::Clone { .. }));
        assert_eq!(
            v.apply(&p, P, operator_key(P, "nope").as_bytes(), Some(b"drain"), 0),
            Change::Refused(Refusal::UnknownBackend)
        );
        let key = format!("{P}/clones/{}", "k".repeat(MAX_KEY_REST));
        assert_eq!(v.apply(&p, P, key.as_bytes(), Some(b"b0"), 0), Change::Refused(Refusal::TooLarge));
    }
}
