//! Support for the dispatcher's tests: a packet builder and the XDP fixture harness
//! (BPF_PROG_TEST_RUN), and the network-namespace testbed.

pub mod cluster;
pub mod ecmp;
pub mod fixture;
pub mod netns;
pub mod packet;
pub mod scripted;
pub mod websphere;
