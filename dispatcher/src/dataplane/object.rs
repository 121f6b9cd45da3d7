//! The XDP programs, built by `build.rs` and embedded in the agent.

use aya::include_bytes_aligned;

/// The dispatcher's XDP program and its maps.
pub static DISPATCHER: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/dispatcher"));
/// The backends' IPIP decapsulation program.
pub static DECAP: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/decap"));
/// A program that passes every packet: the benchmark floor and the testbed's NAPI enabler.
pub static PASS: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/pass"));
/// A program that sends every frame back out: the benchmark's in-kernel packet generator.
pub static TX: &[u8] = include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tx"));
