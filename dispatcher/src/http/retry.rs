//! Retries: which requests may be replayed, and the cluster-wide budget that keeps a mass
//! failure from doubling the survivors' load.

use std::sync::atomic::Ordering;

use crate::{config::HttpSettings, state::Cluster};

/// RFC 9110 9.2.2: methods whose repetition has the effect of one request.
pub fn is_idempotent(method: &[u8]) -> bool {
    matches!(method, b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE" | b"PUT" | b"DELETE")
}

/// The cluster-wide retry budget: retries in flight stay under a share of the requests
/// in flight (with a floor), so a mass failure cannot double the survivors' load.
pub fn retry_allowed(c: &Cluster, s: &HttpSettings) -> bool {
    let in_flight = c.counters.in_flight.load(Ordering::Relaxed);
    let retrying = c.counters.retries_in_flight.load(Ordering::Relaxed);
    let budget = (in_flight * s.retry_budget_percent / 100).max(s.retry_budget_min);
    retrying < budget
}
