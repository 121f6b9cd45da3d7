//! Runtime settings (issue 33, after HAProxy's `set weight`, `set maxconn server`,
//! `disable|enable health` and `clear counters`): the orders an operator's request asks
//! for, validated as hostile input, and the clearing of the counters.
//!
//! A runtime weight, maxconn or disabled checks last until a reload, which builds the
//! backends again from the configuration (as HAProxy's reload reads its file again).

use std::{ops::RangeInclusive, sync::atomic::Ordering};

use crate::{capacity::Capacity, config::Config, control::Order, metrics::Histogram, state::Servers};

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

/// The runtime settings a reload from `old_cfg` (served by `old`) to `new_cfg` ends, one
/// line each for its reply and log: `backend b1: runtime weight 50 ended, 100 from the
/// configuration`. (Ids are kept by name: the same index is the same backend.)
pub fn ended(old_cfg: &Config, old: &Servers, new_cfg: &Config) -> Vec<String> {
    let limit = |m: Option<u64>| m.map_or_else(|| "none".to_string(), |m| m.to_string());
    let mut lines = Vec::new();
    let pairs = old_cfg.backends.iter().zip(&old.backends).zip(&new_cfg.backends);
    for ((was, be), now) in pairs.filter(|((was, _), now)| !was.retired && !now.retired) {
        let name = &be.name;
        if be.weight() != was.weight {
            lines.push(format!(
                "backend {name}: runtime weight {} ended, {} from the configuration",
                be.weight(),
                now.weight
            ));
        }
        let (runtime, configured) = (be.slots.max(), was.maxconn.map(u64::from));
        if runtime != configured {
            let now = limit(now.maxconn.map(u64::from));
            lines.push(format!(
                "backend {name}: runtime maxconn {} ended, {now} from the configuration",
                limit(runtime)
            ));
        }
        if be.checks_disabled() {
            lines.push(format!("backend {name}: health checks enabled again (a runtime disable ended)"));
        }
    }
    lines
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
    // The declared gauges (held now, in flight, retries in flight, h2 connections and
    // streams) are decremented by what holds them: zeroed under a request in flight they
    // would wrap, and every hold and retry would then be refused.
    let declared = crate::metrics::Counters::DECLARED.iter().zip(servers.counters.values());
    for (_, atomics) in declared.filter(|(d, _)| d.family.kind != crate::metrics::Kind::Gauge) {
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
    use crate::health::Cause;
    use dispatcher_common::{BackendState, Health};

    const CFG: &str =
        "[dispatcher]\ninterface = \"lo\"\n[[backend]]\nname = \"b1\"\naddress = \"10.0.0.1\"\nmaxconn = 5\n\
                       [[backend]]\nname = \"b2\"\naddress = \"10.0.0.2\"\nweight = 7\n\
                       [[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n";

    /// HAProxy's `disable health`: no verdict counts, failed requests included; enabled
    /// again, the health the checks left counts.
    #[test]
    fn with_checks_disabled_a_backend_counts_as_healthy_and_passive_failures_are_ignored() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let s = Servers::new(&cfg, &[Health::Down], &[], None);
        assert_eq!(s.backends[0].state(), BackendState::Down);
        assert_eq!(s.set_checks_disabled(0, true), Some((BackendState::Down, BackendState::Up)));
        s.passive_failure(0, Cause::Refused);
        assert_eq!(s.backends[0].state(), BackendState::Up, "a failed request makes it no suspect");
        assert_eq!(s.counters.passive_failures.load(Ordering::Relaxed), 0);
        s.set_admin(0, dispatcher_common::Operator::Drain);
        assert_eq!(s.backends[0].state(), BackendState::Drain, "the operator's state still counts");
        s.set_admin(0, dispatcher_common::Operator::None);
        assert_eq!(s.set_checks_disabled(0, false), Some((BackendState::Up, BackendState::Down)));
        s.passive_failure(1, Cause::Refused);
        assert_eq!(s.backends[1].state(), BackendState::Suspect, "checks enabled: passive health as before");
    }

    /// Counters go to zero, gauges stay: a request still in flight (held, retrying) ends
    /// later, and its gauge must not wrap.
    #[test]
    fn clearing_counters_leaves_the_gauges_of_requests_in_flight() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let s = Servers::new(&cfg, &[], &[], None);
        let cap = Capacity::new(&cfg);
        let c = &s.counters;
        for a in [&c.held_now, &c.in_flight, &c.retries_in_flight, &c.h2_streams_in_flight, &c.failovers, &c.holds] {
            a.store(2, Ordering::Relaxed);
        }
        clear_counters(&s, &cap);
        let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        assert_eq!((load(&c.failovers), load(&c.holds)), (0, 0), "counters cleared");
        assert_eq!(
            (load(&c.held_now), load(&c.in_flight), load(&c.retries_in_flight), load(&c.h2_streams_in_flight)),
            (2, 2, 2, 2),
            "gauges stay"
        );
        let gauges = crate::metrics::Counters::DECLARED.iter().filter(|d| d.family.kind == crate::metrics::Kind::Gauge);
        assert!(gauges.count() >= 5, "the declared gauges are known as such");
    }

    /// A reload says which runtime settings it ends.
    #[test]
    fn a_reload_lists_the_runtime_settings_it_ends() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let s = Servers::new(&cfg, &[], &[], None);
        assert!(ended(&cfg, &s, &cfg).is_empty(), "nothing set at runtime");
        s.backends[0].set_weight(50);
        s.backends[0].slots.set_limits(None, 10);
        s.set_checks_disabled(1, true);
        assert_eq!(
            ended(&cfg, &s, &cfg),
            [
                "backend b1: runtime weight 50 ended, 100 from the configuration",
                "backend b1: runtime maxconn none ended, 5 from the configuration",
                "backend b2: health checks enabled again (a runtime disable ended)",
            ]
        );
    }

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
