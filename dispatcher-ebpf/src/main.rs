//! The dispatcher's XDP program: the L4 fast path.
//!
//! A packet goes: `parse` (Ethernet, one VLAN tag, IPv4/IPv6, TCP/UDP) -> `VIPS` lookup
//! (non-VIP -> pass, HTTP VIP -> pass to the agent) -> `select` (FLOWS, AFFINITY, Maglev
//! ring, backend state) -> `forward` (MAC rewrite or IPIP encapsulation, XDP_TX). HTTP
//! VIPs shared by several dispatchers go through `steer` first (to the owner dispatcher).
//! SIP VIPs go through `sip` (the message's logical name or Call-ID picks the backend).
//! UDP datagrams in IP fragments: the first is dispatched and recorded, the later ones
//! follow it (`frag`).
//! Every verdict is counted in `STATS` (`stats`).
#![no_std]
#![no_main]
// Map keys and values go to the helpers by reference on purpose: a key passed by value
// (which `impl Borrow<K>` would accept) is copied to the BPF stack first.
#![allow(clippy::needless_borrows_for_generic_args)]

mod rt;

mod dispatch;
mod forward;
mod frag;
mod maps;
mod parse;
mod select;
mod sip;
mod stats;
mod steer;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

#[xdp]
pub fn dispatcher(ctx: XdpContext) -> u32 {
    // Any path that cannot complete (a bounds check failing after the head moved) drops:
    // by then the packet is a VIP packet half rewritten and must not reach the host.
    dispatch::try_dispatch(&ctx).unwrap_or(xdp_action::XDP_DROP)
}
