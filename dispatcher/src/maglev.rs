//! Maglev lookup table (Eisenbud et al., NSDI 2016), weighted.
//!
//! Each backend walks its own permutation of the table (offset + j * skip mod M, M prime)
//! and claims the first free slot on its turn. Weights decide how often a backend gets a
//! turn: every round each backend adds its weight to a credit and takes one turn per
//! `max_weight` of credit, so slot counts follow the weights. The permutation depends only
//! on the backend's name, so dispatchers with the same configuration build the same table,
//! and removing one backend moves only the slots it held (plus a small Maglev churn).

use dispatcher_common::NO_BACKEND;

/// One ring member: the id written into the table, the key its permutation comes from,
/// and its weight.
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub id: u32,
    pub key: &'a str,
    pub weight: u32,
}

fn fnv64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Final avalanche (splitmix64), FNV alone is weak in the low bits.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// Builds a table of `size` slots (prime). With no member every slot is `NO_BACKEND`.
pub fn build(members: &[Member], size: u32) -> Vec<u32> {
    let m = size as u64;
    let mut table = vec![NO_BACKEND; size as usize];
    let members: Vec<&Member> = members.iter().filter(|b| b.weight > 0).collect();
    if members.is_empty() || size == 0 {
        return table;
    }
    let perm: Vec<(u64, u64)> = members
        .iter()
        .map(|b| {
            let offset = fnv64(0x6f66_6673_6574, b.key.as_bytes()) % m;
            let skip = fnv64(0x736b_6970, b.key.as_bytes()) % (m - 1).max(1) + 1;
            (offset, skip)
        })
        .collect();
    let max_w = members.iter().map(|b| b.weight).max().unwrap_or(1) as u64;
    let mut next = vec![0u64; members.len()];
    let mut credit = vec![0u64; members.len()];
    let mut filled = 0u64;
    'fill: loop {
        for i in 0..members.len() {
            credit[i] += members[i].weight as u64;
            while credit[i] >= max_w {
                credit[i] -= max_w;
                let (offset, skip) = perm[i];
                // Each permutation visits every slot once in m steps (m prime, skip < m).
                loop {
                    let slot = ((offset + next[i] * skip) % m) as usize;
                    next[i] += 1;
                    if table[slot] == NO_BACKEND {
                        table[slot] = members[i].id;
                        break;
                    }
                }
                filled += 1;
                if filled == m {
                    break 'fill;
                }
            }
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(table: &[u32], id: u32) -> usize {
        table.iter().filter(|&&x| x == id).count()
    }

    #[test]
    fn fills_every_slot_evenly() {
        let names = ["a", "b", "c", "d"];
        let members: Vec<Member> =
            names.iter().enumerate().map(|(i, n)| Member { id: i as u32, key: n, weight: 1 }).collect();
        let t = build(&members, 65537);
        assert!(t.iter().all(|&x| x != NO_BACKEND));
        for i in 0..4 {
            let c = count(&t, i);
            assert!((16300..=16470).contains(&c), "backend {i} has {c} slots");
        }
    }

    #[test]
    fn follows_weights() {
        let members = [Member { id: 0, key: "a", weight: 100 }, Member { id: 1, key: "b", weight: 300 }];
        let t = build(&members, 65537);
        let ratio = count(&t, 1) as f64 / count(&t, 0) as f64;
        assert!((2.9..3.1).contains(&ratio), "ratio {ratio}");
    }

    #[test]
    fn removing_a_backend_moves_little_else() {
        let names: Vec<String> = (0..10).map(|i| format!("backend-{i}")).collect();
        let all: Vec<Member> =
            names.iter().enumerate().map(|(i, n)| Member { id: i as u32, key: n, weight: 1 }).collect();
        let before = build(&all, 65537);
        let after = build(&all[..9], 65537);
        let moved = before.iter().zip(&after).filter(|(b, a)| **b != 9 && b != a).count();
        // Only slots of the removed backend must move; Maglev's extra churn is small.
        assert!(moved < 65537 / 50, "{moved} slots of surviving backends moved");
        assert!(after.iter().all(|&x| x < 9));
    }

    #[test]
    fn same_input_same_table() {
        let members = [Member { id: 0, key: "x", weight: 1 }, Member { id: 1, key: "y", weight: 2 }];
        assert_eq!(build(&members, 251), build(&members, 251));
        assert!(build(&[], 251).iter().all(|&x| x == NO_BACKEND));
    }
}
