//! Measurements the request path and the control plane record and the admin endpoint
//! shows: lock-free, depending on nothing else in the crate.

use std::sync::atomic::{AtomicU64, Ordering};

/// A latency histogram with fixed bounds, lock-free.
pub struct Histogram {
    pub buckets: [AtomicU64; Histogram::BOUNDS_US.len()],
    pub count: AtomicU64,
    pub sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Upper bounds in microseconds (Prometheus `le`, in seconds on export).
    pub const BOUNDS_US: [u64; 14] = [
        250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
        5_000_000,
    ];

    pub fn record(&self, d: std::time::Duration) {
        let us = d.as_micros() as u64;
        if let Some(i) = Self::BOUNDS_US.iter().position(|&b| us <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }
}
