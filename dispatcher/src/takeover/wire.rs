//! The takeover records on the peer channel (`peers`): what a dispatcher tells the one
//! that would take over a connection's slot, batched every heartbeat interval. Pure, so
//! that every malformed datagram is tested here.
//!
//! A datagram: the channel's `MAGIC`, `VERSION`, `KIND_TAKEOVER`, the sender's name (one
//! length byte, then the name), its incarnation (u64, the start of its run in µs since
//! the epoch: a newer one replaces the records of an older one) and a batch number (u64,
//! big-endian, µs since that start: one that is not newer than the last one taken from
//! that incarnation is refused, so that a reordered or replayed batch cannot undo a later
//! one; one from the future is refused too, so that a forged one can hold the sender's
//! batches back for a minute at most), then items to the end:
//! - `OPEN`: a connection id (u32), the tuple (family 4 or 6, client and local address in
//!   16 bytes each, client and local port), the handshake's options (MSS u16, the client's
//!   and our window scale, a flags byte: SACK, timestamps, window scaling), the
//!   connection's timestamp clock at accept (u32) and the connection's age when the record
//!   was sent (ms, u32) — `OPEN_LEN` bytes;
//! - `CLOSE`: a connection id — the connection ended;
//! - `QUIET`: a first id (u32, a multiple of 8), a byte count (u16) and that many bytes
//!   of a bitmap: the connections with no request in progress (their bit set);
//! - `FORGET`: the sender stops gracefully: drop all its records (a stop is not a death).
//!
//! Everything is untrusted: lengths are checked against what is there, a family must be
//! 4 or 6, an MSS nonzero, scales at most 14, a bitmap within `MAX_QUIET_BYTES`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use super::repair::Handshake;
pub use crate::peers::tracker::{is_batch, KIND_BATCH as KIND_TAKEOVER, MAX_BATCH};
use crate::peers::tracker::{MAGIC, MAX_NAME, VERSION};
pub const OPEN: u8 = 1;
pub const CLOSE: u8 = 2;
pub const QUIET: u8 = 3;
pub const FORGET: u8 = 4;
/// An `OPEN` item's length, its tag included.
pub const OPEN_LEN: usize = 1 + 4 + 1 + 16 + 16 + 2 + 2 + 2 + 1 + 1 + 1 + 4 + 4;
pub const CLOSE_LEN: usize = 5;
/// A `QUIET` item's fixed part.
pub const QUIET_HEAD: usize = 7;
const FLAG_SACK: u8 = 1;
const FLAG_TIMESTAMPS: u8 = 2;
const FLAG_WSCALE: u8 = 4;

/// One connection, as its dispatcher accepted it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Open {
    pub id: u32,
    pub client: SocketAddr,
    pub local: SocketAddr,
    pub handshake: Handshake,
    /// The connection's timestamp clock (its next TSval) at accept, and its age (ms) when
    /// the record was sent: the dead dispatcher's last TSval, which the client's next
    /// segment echoes, lies between the two (`inbox` checks a report against them).
    pub ts_clock: u32,
    pub age_ms: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    Open(Open),
    Close(u32),
    /// Ids from `first`, one bit each (bit `i % 8` of byte `i / 8`).
    Quiet {
        first: u32,
        bits: Vec<u8>,
    },
    Forget,
}

impl Item {
    pub fn wire_len(&self) -> usize {
        match self {
            Item::Open(_) => OPEN_LEN,
            Item::Close(_) => CLOSE_LEN,
            Item::Quiet { bits, .. } => QUIET_HEAD + bits.len(),
            Item::Forget => 1,
        }
    }
}

/// A batch from one dispatcher.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub sender: String,
    pub incarnation: u64,
    pub number: u64,
    pub items: Vec<Item>,
}

/// Why a datagram was not taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    Header,
    Truncated,
    UnknownItem,
    BadTuple,
    BadHandshake,
}

/// The start of a batch datagram from `me` (`items` appended with `put`).
pub fn header(me: &str, incarnation: u64, number: u64) -> Vec<u8> {
    let name = &me.as_bytes()[..me.len().min(MAX_NAME)];
    let mut d = Vec::with_capacity(MAX_BATCH);
    d.extend_from_slice(MAGIC);
    d.extend_from_slice(&[VERSION, KIND_TAKEOVER, name.len() as u8]);
    d.extend_from_slice(name);
    d.extend_from_slice(&incarnation.to_be_bytes());
    d.extend_from_slice(&number.to_be_bytes());
    d
}

/// The header's length for `me`.
pub fn header_len(me: &str) -> usize {
    MAGIC.len() + 3 + me.len().min(MAX_NAME) + 16
}

fn put_addr(d: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(a) => {
            d.extend_from_slice(&a.octets());
            d.extend_from_slice(&[0; 12]);
        }
        IpAddr::V6(a) => d.extend_from_slice(&a.octets()),
    }
}

/// Appends `item` to datagram `d`.
pub fn put(d: &mut Vec<u8>, item: &Item) {
    match item {
        Item::Open(o) => {
            d.push(OPEN);
            d.extend_from_slice(&o.id.to_be_bytes());
            d.push(if o.client.is_ipv4() { 4 } else { 6 });
            put_addr(d, o.client.ip());
            put_addr(d, o.local.ip());
            d.extend_from_slice(&o.client.port().to_be_bytes());
            d.extend_from_slice(&o.local.port().to_be_bytes());
            let h = &o.handshake;
            d.extend_from_slice(&h.mss.to_be_bytes());
            d.extend_from_slice(&[h.snd_wscale, h.rcv_wscale]);
            let flags =
                (h.sack as u8 * FLAG_SACK) | (h.timestamps as u8 * FLAG_TIMESTAMPS) | (h.wscale as u8 * FLAG_WSCALE);
            d.push(flags);
            d.extend_from_slice(&o.ts_clock.to_be_bytes());
            d.extend_from_slice(&o.age_ms.to_be_bytes());
        }
        Item::Forget => d.push(FORGET),
        Item::Close(id) => {
            d.push(CLOSE);
            d.extend_from_slice(&id.to_be_bytes());
        }
        Item::Quiet { first, bits } => {
            d.push(QUIET);
            d.extend_from_slice(&first.to_be_bytes());
            d.extend_from_slice(&(bits.len() as u16).to_be_bytes());
            d.extend_from_slice(bits);
        }
    }
}

fn take<'a>(d: &mut &'a [u8], n: usize) -> Result<&'a [u8], Malformed> {
    if d.len() < n {
        return Err(Malformed::Truncated);
    }
    let (a, b) = d.split_at(n);
    *d = b;
    Ok(a)
}

fn u16_at(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

fn addr(family: u8, b: &[u8], port: u16) -> Result<SocketAddr, Malformed> {
    let ip = match family {
        4 if b[4..].iter().all(|&x| x == 0) => IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])),
        6 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap())),
        _ => return Err(Malformed::BadTuple),
    };
    if port == 0 || ip.is_unspecified() || ip.is_multicast() {
        return Err(Malformed::BadTuple);
    }
    Ok(SocketAddr::new(ip, port))
}

/// Reads a batch datagram (of at most `MAX_BATCH` bytes).
pub fn parse(d: &[u8]) -> Result<Batch, Malformed> {
    if d.len() > MAX_BATCH {
        return Err(Malformed::Header);
    }
    let mut rest = d.strip_prefix(MAGIC).ok_or(Malformed::Header)?;
    let head = take(&mut rest, 3).map_err(|_| Malformed::Header)?;
    if head[0] != VERSION || head[1] != KIND_TAKEOVER || head[2] == 0 || head[2] as usize > MAX_NAME {
        return Err(Malformed::Header);
    }
    let name = take(&mut rest, head[2] as usize).map_err(|_| Malformed::Header)?;
    let sender = std::str::from_utf8(name).map_err(|_| Malformed::Header)?.to_string();
    let incarnation = u64::from_be_bytes(take(&mut rest, 8).map_err(|_| Malformed::Header)?.try_into().unwrap());
    let number = u64::from_be_bytes(take(&mut rest, 8).map_err(|_| Malformed::Header)?.try_into().unwrap());
    let mut items = Vec::new();
    while let Some((&tag, after)) = rest.split_first() {
        rest = after;
        items.push(match tag {
            OPEN => {
                let b = take(&mut rest, OPEN_LEN - 1)?;
                let family = b[4];
                let client = addr(family, &b[5..21], u16_at(&b[37..39]))?;
                let local = addr(family, &b[21..37], u16_at(&b[39..41]))?;
                let (mss, snd_wscale, rcv_wscale, flags) = (u16_at(&b[41..43]), b[43], b[44], b[45]);
                if mss == 0
                    || snd_wscale > 14
                    || rcv_wscale > 14
                    || flags & !(FLAG_SACK | FLAG_TIMESTAMPS | FLAG_WSCALE) != 0
                {
                    return Err(Malformed::BadHandshake);
                }
                let wscale = flags & FLAG_WSCALE != 0;
                if !wscale && (snd_wscale | rcv_wscale) != 0 {
                    return Err(Malformed::BadHandshake);
                }
                let handshake = Handshake {
                    mss,
                    snd_wscale,
                    rcv_wscale,
                    sack: flags & FLAG_SACK != 0,
                    timestamps: flags & FLAG_TIMESTAMPS != 0,
                    wscale,
                };
                Item::Open(Open {
                    id: u32_at(b),
                    client,
                    local,
                    handshake,
                    ts_clock: u32_at(&b[46..50]),
                    age_ms: u32_at(&b[50..54]),
                })
            }
            CLOSE => Item::Close(u32_at(take(&mut rest, CLOSE_LEN - 1)?)),
            FORGET => Item::Forget,
            QUIET => {
                let b = take(&mut rest, QUIET_HEAD - 1)?;
                let n = u16_at(&b[4..6]) as usize;
                Item::Quiet { first: u32_at(b), bits: take(&mut rest, n)?.to_vec() }
            }
            _ => return Err(Malformed::UnknownItem),
        });
    }
    Ok(Batch { sender, incarnation, number, items })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(id: u32, client: &str, local: &str) -> Item {
        Item::Open(Open {
            id,
            client: client.parse().unwrap(),
            local: local.parse().unwrap(),
            handshake: Handshake {
                mss: 1448,
                snd_wscale: 7,
                rcv_wscale: 9,
                sack: true,
                timestamps: true,
                wscale: true,
            },
            ts_clock: 0xdead_beef,
            age_ms: 61_000,
        })
    }

    fn datagram(items: &[Item]) -> Vec<u8> {
        let mut d = header("d1", 7, 42);
        for i in items {
            put(&mut d, i);
        }
        d
    }

    #[test]
    fn a_batch_round_trips() {
        let items = vec![
            open(7, "10.98.0.7:40000", "10.99.100.40:80"),
            open(8, "[fd00::7]:40001", "[fd00:99::40]:8080"),
            Item::Close(3),
            Item::Quiet { first: 0, bits: vec![0b1010_0000, 1] },
            Item::Forget,
        ];
        let d = datagram(&items);
        assert_eq!(header("d1", 7, 42).len(), header_len("d1"));
        assert_eq!(d.len(), header_len("d1") + items.iter().map(Item::wire_len).sum::<usize>());
        assert!(is_batch(&d));
        assert_eq!(parse(&d).unwrap(), Batch { sender: "d1".into(), incarnation: 7, number: 42, items });
        assert!(!is_batch(&crate::peers::tracker::heartbeat("d1")));
    }

    #[test]
    fn hostile_datagrams_are_refused() {
        let good = datagram(&[open(7, "10.98.0.7:40000", "10.99.100.40:80")]);
        let at = header_len("d1");
        for cut in (1..good.len()).filter(|&c| c != at) {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        assert_eq!(parse(&good[..at]).unwrap().items, [], "a batch of no items");
        let mut bad = good.clone();
        bad[at] = 99;
        assert_eq!(parse(&bad), Err(Malformed::UnknownItem));
        let mut bad = good.clone();
        bad[at + 5] = 5; // family
        assert_eq!(parse(&bad), Err(Malformed::BadTuple));
        let mut bad = good.clone();
        bad[at + 6 + 5] = 1; // an IPv4 client address with bytes past its four
        assert_eq!(parse(&bad), Err(Malformed::BadTuple));
        let mut bad = good.clone();
        bad[at + 42..at + 44].copy_from_slice(&[0, 0]); // MSS 0
        assert_eq!(parse(&bad), Err(Malformed::BadHandshake));
        let mut bad = good.clone();
        bad[at + 44] = 15; // scale
        assert_eq!(parse(&bad), Err(Malformed::BadHandshake));
        let mut bad = good.clone();
        bad[at + 38..at + 40].copy_from_slice(&[0, 0]); // client port 0
        assert_eq!(parse(&bad), Err(Malformed::BadTuple));
        // A bitmap longer than what follows; an oversized datagram.
        let mut q = header("d1", 1, 1);
        q.extend_from_slice(&[QUIET, 0, 0, 0, 0, 0x10, 0]);
        assert_eq!(parse(&q), Err(Malformed::Truncated));
        let mut big = header("d1", 1, 1);
        big.resize(MAX_BATCH + 1, 0);
        assert_eq!(parse(&big), Err(Malformed::Header));
        let mut other = good.clone();
        other[MAGIC.len()] = VERSION + 1;
        assert_eq!(parse(&other), Err(Malformed::Header));
    }
}
