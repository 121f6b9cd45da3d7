//! `pass`: the trivial XDP program. It is the floor that benchmarks subtract, and the
//! testbed attaches it to the switch side of the dispatcher's veth, because a veth drops
//! frames sent to it by XDP_TX unless its receiving side runs in NAPI mode.
#![no_std]
#![no_main]

mod rt;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

#[xdp]
pub fn pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}
