//! Warnings that can come in floods (accept and connect errors when descriptors run out):
//! logged at most once per interval per kind (or per key: `PerKey`), with
//! how many were left unlogged since.

use std::{
    collections::HashMap,
    fmt::Display,
    sync::Mutex,
    time::{Duration, Instant},
};

const INTERVAL: Duration = Duration::from_secs(10);

static SEEN: Mutex<Option<HashMap<&'static str, (Instant, u64)>>> = Mutex::new(None);

/// Whether `kind` may be logged now, and how many were suppressed before it.
fn admit(kind: &'static str, now: Instant) -> Option<u64> {
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    tick(seen.get_or_insert_with(HashMap::new).entry(kind).or_insert((now - INTERVAL * 2, 0)), now)
}

/// One message's turn: (when it was last logged, how many since): `Some(suppressed)` when
/// it may be logged now.
fn tick(entry: &mut (Instant, u64), now: Instant) -> Option<u64> {
    if now.duration_since(entry.0) >= INTERVAL {
        let suppressed = entry.1;
        *entry = (now, 0);
        Some(suppressed)
    } else {
        entry.1 += 1;
        None
    }
}

/// One kind of message, once per interval for each key (e.g. the backend it is about),
/// with how many were left unlogged. Keys must come from a bounded set (backend ids).
#[derive(Default)]
pub struct PerKey(Mutex<HashMap<u64, (Instant, u64)>>);

impl PerKey {
    /// `Some(suppressed)` when a message about `key` may be logged now.
    pub fn admit(&self, key: u64, now: Instant) -> Option<u64> {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        tick(seen.entry(key).or_insert((now - INTERVAL * 2, 0)), now)
    }
}

/// A warning about `kind`, at most once per 10 s.
pub fn warn(kind: &'static str, error: &dyn Display) {
    if let Some(suppressed) = admit(kind, Instant::now()) {
        tracing::warn!(%error, more_since_last = suppressed, "{kind} failed");
    }
}

/// A warning about `kind` in words of its own (`what`), at most once per 10 s.
pub fn warn_that(kind: &'static str, what: &dyn Display) {
    if let Some(suppressed) = admit(kind, Instant::now()) {
        tracing::warn!(more_since_last = suppressed, "{what}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn once_per_interval_with_a_count() {
        let t = Instant::now();
        assert_eq!(admit("test-kind", t), Some(0));
        assert_eq!(admit("test-kind", t + Duration::from_secs(1)), None);
        assert_eq!(admit("test-kind", t + Duration::from_secs(2)), None);
        assert_eq!(admit("other-kind", t + Duration::from_secs(2)), Some(0), "kinds are separate");
        assert_eq!(admit("test-kind", t + INTERVAL), Some(2));
    }

    #[test]
    fn once_per_interval_per_key() {
        let (p, t) = (PerKey::default(), Instant::now());
        assert_eq!(p.admit(1, t), Some(0));
        assert_eq!(p.admit(1, t + Duration::from_secs(1)), None);
        assert_eq!(p.admit(2, t + Duration::from_secs(1)), Some(0), "keys are separate");
        assert_eq!(p.admit(1, t + INTERVAL), Some(1));
    }
}
