//! Per-CPU counters: no atomics needed, the agent sums the CPUs.

use crate::maps::STATS;

#[inline(always)]
pub fn count(slot: u32, bytes: u64) {
    if let Some(c) = STATS.get_ptr_mut(slot) {
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes;
        }
    }
}
