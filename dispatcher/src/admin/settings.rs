//! Runtime settings (issue 33, after HAProxy's `set weight`, `set maxconn server`,
//! `disable|enable health` and `clear counters`): the orders an operator's request asks
//! for, validated as hostile input, and the clearing of the counters.
//!
//! A runtime weight, maxconn or disabled checks last until a reload, which builds the
//! backends again from the configuration (as HAProxy's reload reads its file again).

use std::{ops::RangeInclusive, sync::atomic::Ordering};

use crate::{capacity::Capacity, control::Order, metrics::Histogram, state::Servers};

/// The configuration's range of `weight` (0 is refused there too: drain a backend).
pub const WEIGHT_RANGE: RangeInclusive<u32> = 1..=10_000;
/// The configuration's range of `maxconn`.
pub const MAXCONN_RANGE: RangeInclusive<u32> = 1..=1_000_000;

/// The backend actions beside drain, disable and enable.
pub const ACTIONS: &str = "drain, disable, enable, weight?value=N, maxconn?value=N|none, disable-checks, enable-checks";

/// A backend action other than drain/disable/enable and its query (`value=`); `None`:
/// no such action. An error is said in words, with the range.
pub fn order(action: &str, query: &str) -> Option<Result<Order, String>> {
    let value = || query.split('&').find_map(|kv| kv.strip_prefix("value=")).unwrap_or("");
    Some(match action {
        "weight" => number(value(), &WEIGHT_RANGE)
            .map(Order::Weight)
            .map_err(|v| format!("weight {v}: must be a whole number in 1..=10000, as in the configuration (to take no new sessions, drain the backend)")),
        "maxconn" if value() == "none" => Ok(Order::Maxconn(None)),
        "maxconn" => number(value(), &MAXCONN_RANGE)
            .map(|m| Order::Maxconn(Some(m)))
            .map_err(|v| format!("maxconn {v}: must be a whole number in 1..=1000000 (requests in flight at once), or none for no limit")),
        "disable-checks" => Ok(Order::ChecksDisabled(true)),
        "enable-checks" => Ok(Order::ChecksDisabled(false)),
        _ => return None,
    })
}

/// A plain decimal within `range`; the error quotes what was given (bounded, escaped).
fn number(text: &str, range: &RangeInclusive<u32>) -> Result<u32, String> {
    let n = (!text.is_empty() && text.len() <= 10 && text.bytes().all(|b| b.is_ascii_digit()))
        .then(|| text.parse::<u32>().ok())
        .flatten()
        .filter(|n| range.contains(n));
    n.ok_or_else(|| match text {
        "" => "(none given)".to_string(),
        t => format!("{:?}", t.chars().take(24).collect::<String>()),
    })
}

fn zero<'a>(atomics: impl IntoIterator<Item = &'a std::sync::atomic::AtomicU64>) {
    for a in atomics {
        a.store(0, Ordering::Relaxed);
    }
}

fn zero_histogram(h: &Histogram) {
    zero(h.buckets.iter().chain([&h.count, &h.sum_us]));
}

/// Zeroes the agent's counters: the declared ones (failovers, retries, holds...), per
/// backend (requests, errors, responses, latency, queue totals, state changes by
/// reason), per VIP (requests, no route, responses, latency, TLS handshakes), per farm
/// and route. Gauges (in flight, connections, queued, states) are states, not counts:
/// they stay.
pub fn clear_counters(servers: &Servers, cap: &Capacity) {
    for atomics in servers.counters.values() {
        zero(atomics);
    }
    zero_histogram(&servers.hold_time);
    for b in &servers.backends {
        zero([&b.requests, &b.errors].into_iter().chain(&b.responses.0));
        zero_histogram(&b.latency);
        let q = &b.slots;
        zero([&q.queued_total, &q.refused_full, &q.refused_timeout, &q.refused_left]);
        zero_histogram(&q.waits);
        b.changes.lock().unwrap().counts.clear();
    }
    for v in &cap.vips {
        zero([&v.requests, &v.no_route, &v.tls.full, &v.tls.resumed].into_iter().chain(&v.tls.failures));
        zero(&v.responses.0);
        zero_histogram(&v.latency);
    }
    for p in cap.farms.iter().chain(&cap.routes) {
        let s = &p.stats;
        zero([&s.requests, &s.affinity_hits, &s.failovers, &s.balanced, &s.misroutes]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_and_refusals_say_the_range() {
        assert_eq!(order("weight", "value=50"), Some(Ok(Order::Weight(50))));
        assert_eq!(order("weight", "x=1&value=10000"), Some(Ok(Order::Weight(10_000))));
        assert_eq!(order("maxconn", "value=1"), Some(Ok(Order::Maxconn(Some(1)))));
        assert_eq!(order("maxconn", "value=none"), Some(Ok(Order::Maxconn(None))));
        assert_eq!(order("disable-checks", ""), Some(Ok(Order::ChecksDisabled(true))));
        assert_eq!(order("enable-checks", ""), Some(Ok(Order::ChecksDisabled(false))));
        assert_eq!(order("melt", "value=1"), None);
        for bad in [
            "value=0",
            "value=10001",
            "value=+5",
            "value=-1",
            "value=0x10",
            "value=1.5",
            "value=",
            "",
            "value=99999999999",
        ] {
            let e = order("weight", bad).unwrap().unwrap_err();
            assert!(e.contains("must be a whole number in 1..=10000"), "{bad}: {e}");
        }
        assert_eq!(
            order("weight", "value=0").unwrap().unwrap_err(),
            "weight \"0\": must be a whole number in 1..=10000, as in the configuration (to take no new sessions, drain the backend)"
        );
        let e = order("maxconn", "value=1000001").unwrap().unwrap_err();
        assert!(e.starts_with("maxconn \"1000001\": must be a whole number in 1..=1000000"), "{e}");
        assert!(order("maxconn", "").unwrap().unwrap_err().starts_with("maxconn (none given):"));
        let long = format!("value={}", "9".repeat(100));
        assert!(order("maxconn", &long).unwrap().unwrap_err().len() < 160, "what was given is quoted bounded");
    }
}
