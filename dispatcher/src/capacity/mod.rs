//! What the request path may take of this host and of each backend, shared by every
//! worker and handed to a reload's successor: the descriptor budget of idle upstream
//! connections, `maxconn` slots with their queue per backend (`queue`), and per-source
//! client connection limits (`sources`). Depends on the configuration and the metrics only.

pub mod queue;
pub mod sources;

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

/// The descriptor limit this process runs with.
pub fn descriptor_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map(|(soft, _)| soft).unwrap_or(1024)
}

/// How many idle upstream connections all pools may keep together: every one is a
/// descriptor, and a burst on one VIP followed by a burst on another must not leave the
/// first one's idle connections eating the descriptors the second needs.
pub struct IdleBudget {
    count: AtomicU64,
    cap: u64,
}

impl IdleBudget {
    pub fn new(cap: u64) -> IdleBudget {
        IdleBudget { count: AtomicU64::new(0), cap }
    }

    /// For a descriptor limit: an eighth of it (at least 16).
    pub fn for_descriptors(nofile: u64) -> IdleBudget {
        IdleBudget::new(idle_cap(nofile))
    }

    pub(crate) fn take(self: &Arc<Self>) -> Option<IdleSlot> {
        let mut n = self.count.load(Ordering::Relaxed);
        loop {
            if n >= self.cap {
                return None;
            }
            match self.count.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(IdleSlot(self.clone())),
                Err(now) => n = now,
            }
        }
    }

    pub fn idle(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The idle connections all pools may keep for a descriptor limit.
pub fn idle_cap(nofile: u64) -> u64 {
    (nofile / 8).max(16)
}

/// An idle connection's place in the budget, given back when it leaves the idle list.
pub(crate) struct IdleSlot(Arc<IdleBudget>);

impl Drop for IdleSlot {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}
