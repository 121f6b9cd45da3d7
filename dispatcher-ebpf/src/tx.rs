//! `tx`: sends every frame back out (XDP_TX). Run through BPF_PROG_TEST_RUN in live-frames
//! mode on a test client's interface, it is the benchmark's packet generator: the kernel
//! transmits copies of one frame as fast as it can, with no userspace sender in the way.
#![no_std]
#![no_main]

mod rt;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

#[xdp]
pub fn tx(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_TX
}
