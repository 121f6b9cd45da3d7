//! Retries: which requests may be replayed, and the dispatcher-wide budget that keeps a mass
//! failure from doubling the survivors' load with replays. A retry after a connection
//! that was never made (refused, unreachable) replays nothing — no server got the
//! request — and is not charged to the budget: when a clone dies under many concurrent
//! requests (an HTTP/2 client's hundred streams), each goes once to the replica instead
//! of most getting 503.

use std::sync::atomic::Ordering;

use super::Counted;
use crate::{config::HttpSettings, state::Servers};

/// RFC 9110 9.2.2: methods whose repetition has the effect of one request.
pub fn is_idempotent(method: &[u8]) -> bool {
    matches!(method, b"GET" | b"HEAD" | b"OPTIONS" | b"TRACE" | b"PUT" | b"DELETE")
}

/// The dispatcher-wide retry budget: retries in flight stay under a share of the requests
/// in flight (with a floor), so a mass failure cannot double the survivors' load.
pub fn retry_allowed(c: &Servers, s: &HttpSettings) -> bool {
    let in_flight = c.counters.in_flight.load(Ordering::Relaxed);
    let retrying = c.counters.retries_in_flight.load(Ordering::Relaxed);
    let budget = (in_flight * s.retry_budget_percent / 100).max(s.retry_budget_min);
    retrying < budget
}

/// One request's retries: how many so far, and its place among the retries in flight
/// (taken at its first retry, kept until the request ends).
#[derive(Default)]
pub struct Retries<'c> {
    pub extra: u32,
    in_flight: Option<Counted<'c>>,
}

impl<'c> Retries<'c> {
    /// Whether a failed attempt that may be replayed is made again: within the VIP's
    /// `retries` and, when the failed attempt reached a server (`budgeted`), the
    /// dispatcher-wide budget (a refusal by the budget is counted).
    pub fn again(&mut self, c: &'c Servers, s: &HttpSettings, budgeted: bool) -> bool {
        if self.extra >= s.retries {
            return false;
        }
        if budgeted && !retry_allowed(c, s) {
            c.counters.retry_budget_refusals.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        self.extra += 1;
        c.counters.retries.fetch_add(1, Ordering::Relaxed);
        if budgeted && self.in_flight.is_none() {
            c.counters.retries_in_flight.fetch_add(1, Ordering::Relaxed);
            self.in_flight = Some(Counted(&c.counters.retries_in_flight));
        }
        true
    }
}
