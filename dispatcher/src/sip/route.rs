//! Which container a SIP message from a caller goes to: the rules of the XDP program
//! (`dispatcher-ebpf/src/sip.rs`) over the same table. The shared scanner reads the
//! affinity (Route `ibmsid`, To/From tag, else Call-ID); a logical name goes to its owner
//! in the clone table, held while the owner is suspect, to its replica when it is down,
//! never to a third container; a Call-ID without a logical name is placed on the VIP's
//! backends (highest random weight over those up) and pinned (`Pins`, bounded).

use std::collections::{HashMap, VecDeque};

use dispatcher_common::{
    sip::{Scan, SRC_CALL_ID},
    BackendState,
};

use crate::state::Servers;

/// Where a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// To this container (`replica`: because the owner is out).
    To { backend: usize, replica: bool },
    /// Its owner is suspect: wait for its state to change, then choose again.
    Hold(usize),
    /// Neither the owner nor its replica can take it (503).
    NoBackend,
    /// A logical name nobody owns and no pin for its Call-ID.
    UnknownLn,
    /// No complete SIP header section, or no Call-ID.
    Invalid,
}

/// Call-ID hash -> container, for dialogs placed without a logical name. Bounded: the
/// oldest pin goes first when it is full.
pub struct Pins {
    map: HashMap<u64, usize>,
    order: VecDeque<u64>,
    cap: usize,
}

impl Pins {
    pub fn new(cap: usize) -> Pins {
        Pins { map: HashMap::new(), order: VecDeque::new(), cap: cap.max(1) }
    }

    pub fn get(&self, call_id: u64) -> Option<usize> {
        self.map.get(&call_id).copied()
    }

    pub fn pin(&mut self, call_id: u64, backend: usize) {
        if self.map.insert(call_id, backend).is_none() {
            self.order.push_back(call_id);
            while self.map.len() > self.cap {
                match self.order.pop_front() {
                    Some(old) => {
                        self.map.remove(&old);
                    }
                    None => break,
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The affinity source's outcome name (`metrics::SIP_STREAM_OUTCOMES`).
pub fn source_name(src: u8) -> &'static str {
    match src {
        dispatcher_common::sip::SRC_ROUTE => "route",
        dispatcher_common::sip::SRC_VIA => "via",
        dispatcher_common::sip::SRC_TO_TAG => "to_tag",
        dispatcher_common::sip::SRC_FROM_TAG => "from_tag",
        _ => "call_id",
    }
}

/// Scans a whole header section (no 2048-byte bound here: the framing bounds it).
pub fn scan(head: &[u8]) -> Scan {
    let mut s = Scan::default();
    for &b in head {
        if !s.step(b) {
            break;
        }
    }
    s
}

/// The owner, its replica when it is out, or a hold while it is suspect.
fn owner_or_replica(servers: &Servers, owner: usize, replica: Option<usize>) -> Choice {
    let Some(b) = servers.backends.get(owner) else { return Choice::NoBackend };
    match b.state() {
        BackendState::Up | BackendState::Drain => Choice::To { backend: owner, replica: false },
        BackendState::Suspect => Choice::Hold(owner),
        _ => match replica.and_then(|r| Some((r, servers.backends.get(r)?.state()))) {
            Some((r, BackendState::Up | BackendState::Drain)) => Choice::To { backend: r, replica: true },
            Some((r, BackendState::Suspect)) => Choice::Hold(r),
            _ => Choice::NoBackend,
        },
    }
}

/// A Call-ID's pin on VIP `vip`: a dialog is pinned per VIP (as XDP keys its pins by
/// VIP), so one Call-ID on two VIPs never sends the second's messages to the first's
/// container.
fn pin_key(vip: usize, call_id: u64) -> u64 {
    dispatcher_common::hash::cookie_hash(&[call_id.to_le_bytes(), (vip as u64).to_le_bytes()].concat())
}

/// The container for a caller's message with scan `s`, on VIP `vip` whose containers
/// are `members`.
pub fn choose(
    servers: &Servers,
    vip: usize,
    members: &[usize],
    pins: &std::sync::Mutex<Pins>,
    s: &Scan,
) -> (Choice, u8) {
    let Some((src, hash)) = s.affinity() else { return (Choice::Invalid, 0) };
    let replica_of = |b: usize| servers.backends.get(b).and_then(|x| x.replica);
    let key = pin_key(vip, s.call_id);
    // A pin names one of this VIP's containers (checked, not assumed).
    let pinned = |pins: &Pins| pins.get(key).filter(|b| members.contains(b));
    if src != SRC_CALL_ID {
        if let Some((owner, replica)) = servers.owner_by_hash(hash) {
            return (owner_or_replica(servers, owner, replica), src);
        }
        // A name nobody owns: where its Call-ID was placed, else nowhere.
        return match pinned(&pins.lock().unwrap()) {
            Some(b) => (owner_or_replica(servers, b, replica_of(b)), SRC_CALL_ID),
            None => (Choice::UnknownLn, src),
        };
    }
    let mut pins = pins.lock().unwrap();
    if let Some(b) = pinned(&pins) {
        return (owner_or_replica(servers, b, replica_of(b)), src);
    }
    let up =
        members.iter().copied().filter(|&b| servers.backends.get(b).is_some_and(|x| x.state() == BackendState::Up));
    let weight = |b: usize| {
        let w = servers.backends[b].weight().max(1) as f64;
        let h = dispatcher_common::hash::cookie_hash(&[s.call_id.to_le_bytes(), (b as u64).to_le_bytes()].concat());
        // Weighted rendezvous: -w / ln(u), u in (0, 1).
        let u = ((h >> 11) as f64 + 1.0) / ((1u64 << 53) as f64 + 2.0);
        -w / u.ln()
    };
    match up.max_by(|&a, &b| weight(a).total_cmp(&weight(b))) {
        Some(b) => {
            pins.pin(key, b);
            (Choice::To { backend: b, replica: false }, src)
        }
        None => (Choice::NoBackend, src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two SIP VIPs with containers of their own (a, b) and (c, d).
    const CFG: &str = "[dispatcher]\ninterface = \"lo\"\n\n\
        [[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\nmac = \"02:00:00:00:00:01\"\n\n\
        [[backend]]\nname = \"b\"\naddress = \"10.0.0.2\"\nmac = \"02:00:00:00:00:02\"\n\n\
        [[backend]]\nname = \"c\"\naddress = \"10.0.0.3\"\nmac = \"02:00:00:00:00:03\"\n\n\
        [[backend]]\nname = \"d\"\naddress = \"10.0.0.4\"\nmac = \"02:00:00:00:00:04\"\n\n\
        [[vip]]\nname = \"one\"\naddress = \"10.0.100.5\"\nport = 5060\nprotocol = \"udp\"\nmode = \"sip\"\nbackends = [\"a\", \"b\"]\n\n\
        [[vip]]\nname = \"two\"\naddress = \"10.0.100.6\"\nport = 5060\nprotocol = \"udp\"\nmode = \"sip\"\nbackends = [\"c\", \"d\"]\n";

    /// A Call-ID placed on one VIP is pinned there only: the same Call-ID on another VIP
    /// goes to one of that VIP's own containers, never to the first one's.
    #[test]
    fn a_call_id_pinned_on_one_vip_never_sends_another_vips_messages_there() {
        let cfg = crate::config::Config::parse(CFG, "t").unwrap();
        let servers = Servers::new(&cfg, &[], &[], None);
        let pins = std::sync::Mutex::new(Pins::new(16));
        let scan = scan(b"OPTIONS sip:x@h SIP/2.0\r\nCall-ID: shared-1\r\n\r\n");
        let (first, _) = choose(&servers, 0, &[0, 1], &pins, &scan);
        assert!(matches!(first, Choice::To { backend: 0 | 1, .. }), "{first:?}");
        for _ in 0..3 {
            let (second, _) = choose(&servers, 1, &[2, 3], &pins, &scan);
            assert!(matches!(second, Choice::To { backend: 2 | 3, .. }), "{second:?}");
        }
        assert_eq!(choose(&servers, 0, &[0, 1], &pins, &scan).0, first, "the first VIP's pin is kept");
    }

    #[test]
    fn pins_are_bounded_oldest_first() {
        let mut p = Pins::new(3);
        for k in 0..5u64 {
            p.pin(k, k as usize);
        }
        assert_eq!(p.len(), 3);
        assert_eq!((p.get(0), p.get(1), p.get(2), p.get(4)), (None, None, Some(2), Some(4)));
        p.pin(4, 9);
        assert_eq!(p.get(4), Some(9), "re-pinned in place");
        assert_eq!(p.len(), 3);
    }
}
