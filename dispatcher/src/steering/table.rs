//! The dispatcher-ownership table: which live dispatcher terminates the connections whose
//! flow hash lands in each slot. Pure, so that every dispatcher builds the same table from
//! the same membership, and tests predict it.
//!
//! Maglev over the dispatchers' names (the same builder as the VIP rings): a dispatcher
//! that joins takes about 1/N of the slots, one that leaves gives up only its own.

use std::net::SocketAddr;

use dispatcher_common::{hash::flow_hash, FlowKey, SteerSlot, IPPROTO_TCP, NO_BACKEND, STEER_SIZE};

use crate::{dataplane::tables::addr_key, maglev};

/// A dispatcher that takes connections: its name and its MAC on the shared segment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    pub name: String,
    pub mac: [u8; 6],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Table {
    /// Sorted by name.
    pub peers: Vec<Peer>,
    /// `STEER_SIZE` slots: an index into `peers`, or `u32::MAX` when there is none.
    pub slots: Vec<u32>,
}

impl Table {
    pub fn build(mut peers: Vec<Peer>) -> Table {
        peers.sort();
        peers.dedup_by(|a, b| a.name == b.name);
        let members: Vec<maglev::Member> =
            peers.iter().enumerate().map(|(i, p)| maglev::Member { id: i as u32, key: &p.name, weight: 1 }).collect();
        let slots = maglev::build(&members, STEER_SIZE);
        Table { peers, slots }
    }

    /// The slots as `STEER` holds them.
    pub fn map_slots(&self) -> Vec<SteerSlot> {
        self.slots
            .iter()
            .map(|&i| match self.peers.get(i as usize) {
                Some(p) if i != NO_BACKEND => SteerSlot { mac: p.mac, valid: 1, _pad: 0 },
                _ => SteerSlot::default(),
            })
            .collect()
    }

    /// The dispatcher that owns the connection with this tuple.
    pub fn owner(&self, key: &FlowKey) -> Option<&Peer> {
        self.owner_of_slot((flow_hash(key) % STEER_SIZE) as usize)
    }

    pub fn owner_of_slot(&self, slot: usize) -> Option<&Peer> {
        self.peers.get(*self.slots.get(slot)? as usize)
    }

    pub fn names(&self) -> Vec<String> {
        self.peers.iter().map(|p| p.name.clone()).collect()
    }
}

/// The `FLOWS`-style key of a TCP connection from `client` to `local` (a VIP), as the XDP
/// program hashes it.
pub fn tcp_key(client: SocketAddr, local: SocketAddr) -> FlowKey {
    let (src, family) = addr_key(client.ip());
    let (dst, _) = addr_key(local.ip());
    FlowKey { src, dst, sport: client.port().to_be(), dport: local.port().to_be(), proto: IPPROTO_TCP, family, _pad: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<Peer> {
        (0..n).map(|i| Peer { name: format!("d{i}"), mac: [2, 0, 0, 0, 0, i as u8] }).collect()
    }

    #[test]
    fn the_same_members_in_any_order_build_the_same_table() {
        let a = Table::build(peers(3));
        let mut rev = peers(3);
        rev.reverse();
        assert_eq!(a, Table::build(rev));
        assert!(a.slots.iter().all(|&s| s < 3), "every slot has an owner");
    }

    #[test]
    fn a_join_moves_about_a_quarter_and_a_leave_only_the_leavers_slots() {
        let three = Table::build(peers(3));
        let four = Table::build(peers(4));
        let moved = (0..STEER_SIZE as usize)
            .filter(|&i| three.peers[three.slots[i] as usize].name != four.peers[four.slots[i] as usize].name)
            .count();
        let share = moved as f64 / STEER_SIZE as f64;
        assert!((0.20..0.32).contains(&share), "a 4th dispatcher took {share:.3} of the slots");
        // d1 leaves: its slots move; of the others' slots only Maglev's small churn does
        // (second chance covers those connections too).
        let without: Vec<Peer> = peers(3).into_iter().filter(|p| p.name != "d1").collect();
        let two = Table::build(without);
        let (mut kept, mut churned) = (0, 0);
        for i in 0..STEER_SIZE as usize {
            let before = &three.peers[three.slots[i] as usize].name;
            if before != "d1" {
                if before == &two.peers[two.slots[i] as usize].name {
                    kept += 1;
                } else {
                    churned += 1;
                }
            }
        }
        let churn = churned as f64 / (kept + churned) as f64;
        assert!(churn < 0.05, "{churned} of the others' slots moved when d1 left ({churn:.3})");
    }

    #[test]
    fn owner_uses_the_xdp_flow_hash() {
        let t = Table::build(peers(3));
        let k = tcp_key("10.98.0.7:40000".parse().unwrap(), "10.99.100.40:80".parse().unwrap());
        let slot = (flow_hash(&k) % STEER_SIZE) as usize;
        assert_eq!(t.owner(&k).unwrap().name, t.peers[t.slots[slot] as usize].name);
        assert_eq!(k.sport, 40000u16.to_be());
    }

    #[test]
    fn macs_round_trip() {}

    #[test]
    fn no_peer_no_owner() {
        let t = Table::build(Vec::new());
        assert!(t.map_slots().iter().all(|s| s.valid == 0));
        let k = tcp_key("10.98.0.7:40000".parse().unwrap(), "10.99.100.40:80".parse().unwrap());
        assert!(t.owner(&k).is_none());
    }
}
