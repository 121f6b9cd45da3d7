//! Hashes both sides must compute identically: the flow hash that indexes a VIP's Maglev
//! table (XDP) and the cookie hash that keys `CLONES` (agent). Tests use them to predict
//! where a packet goes.

use crate::FlowKey;

#[inline(always)]
fn mix32(mut h: u32) -> u32 {
    // murmur3 finaliser: full avalanche for a few instructions.
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

#[inline(always)]
fn step(h: u32, w: u32) -> u32 {
    (h ^ mix32(w)).rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

/// Hash of a flow's 5-tuple (addresses, ports, protocol). Unrolled, loop-free, so the
/// verifier sees straight-line code.
#[inline(always)]
pub fn flow_hash(k: &FlowKey) -> u32 {
    let mut h: u32 = 0x9e37_79b9 ^ (k.proto as u32);
    h = step(h, k.src[0]);
    h = step(h, k.src[1]);
    h = step(h, k.src[2]);
    h = step(h, k.src[3]);
    h = step(h, k.dst[0]);
    h = step(h, k.dst[1]);
    h = step(h, k.dst[2]);
    h = step(h, k.dst[3]);
    h = step(h, ((k.sport as u32) << 16) | k.dport as u32);
    mix32(h)
}

/// 64-bit FNV-1a of a clone or partition ID: the `CLONES` key.
pub fn cookie_hash(id: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in id {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_hash_depends_on_every_field() {
        let base = FlowKey { proto: 6, family: 2, ..Default::default() };
        let h0 = flow_hash(&base);
        let mut k = base;
        k.src[3] = 1;
        assert_ne!(flow_hash(&k), h0);
        let mut k = base;
        k.dst[0] = 1;
        assert_ne!(flow_hash(&k), h0);
        let mut k = base;
        k.sport = 1;
        assert_ne!(flow_hash(&k), h0);
        let mut k = base;
        k.dport = 1;
        assert_ne!(flow_hash(&k), h0);
        let mut k = base;
        k.proto = 17;
        assert_ne!(flow_hash(&k), h0);
    }

    #[test]
    fn cookie_hash_is_fnv1a() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(cookie_hash(b""), 0xcbf29ce484222325);
        assert_eq!(cookie_hash(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(cookie_hash(b"foobar"), 0x85944171f73967e8);
    }
}
