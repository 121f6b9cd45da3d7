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

/// The container for a caller's message with scan `s`, on a VIP whose containers are
/// `members`.
pub fn choose(servers: &Servers, members: &[usize], pins: &std::sync::Mutex<Pins>, s: &Scan) -> (Choice, u8) {
    let Some((src, hash)) = s.affinity() else { return (Choice::Invalid, 0) };
    let replica_of = |b: usize| servers.backends.get(b).and_then(|x| x.replica);
    if src != SRC_CALL_ID {
        if let Some((owner, replica)) = servers.owner_by_hash(hash) {
            return (owner_or_replica(servers, owner, replica), src);
        }
        // A name nobody owns: where its Call-ID was placed, else nowhere.
        return match pins.lock().unwrap().get(s.call_id) {
            Some(b) => (owner_or_replica(servers, b, replica_of(b)), SRC_CALL_ID),
            None => (Choice::UnknownLn, src),
        };
    }
    let mut pins = pins.lock().unwrap();
    if let Some(b) = pins.get(s.call_id) {
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
            pins.pin(s.call_id, b);
            (Choice::To { backend: b, replica: false }, src)
        }
        None => (Choice::NoBackend, src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
