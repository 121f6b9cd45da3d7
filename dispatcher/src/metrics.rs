//! Measurements the request path and the control plane record and the admin endpoint
//! shows: lock-free, depending on nothing else in the crate.
//!
//! Each of the agent's own counters is declared once, in `counters!` below: its field
//! (what the request path increments, one relaxed atomic add), its Prometheus family
//! (name, kind, help, label) and its key in `GET /status`. The struct, the status view
//! (`CounterStatus`) and the exposition are made from that one declaration, so a counter
//! cannot be counted and never shown. The other families (per backend, per VIP, the
//! shared store, XDP) are `Family` constants beside the code that reads their values,
//! written through `Exposition`, which names every sample after its family.
//!
//! Not the prometheus-client crate: its text encoder writes OpenMetrics (a counter's
//! family is named without `_total`, which it appends to the samples, and `# EOF`), which
//! `promtool check metrics` rejects as Prometheus text ("no help text") and which would
//! rename every counter family; its counters are `Arc`s with `inc()`, where ours are
//! fields of one struct that the hot path adds to as before (docs/design.md, "Metrics").

use std::{
    fmt::{Display, Write as _},
    sync::atomic::{AtomicU64, Ordering},
};

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

/// The `class` label of responses by status: indexed by `status_class`.
pub const STATUS_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "other"];

/// The index in `STATUS_CLASSES` of an HTTP status.
pub fn status_class(status: u16) -> usize {
    match status {
        100..=599 => (status / 100 - 1) as usize,
        _ => 5,
    }
}

/// Responses counted by status class (`STATUS_CLASSES`): one relaxed add each.
#[derive(Default)]
pub struct StatusClasses(pub [AtomicU64; STATUS_CLASSES.len()]);

impl StatusClasses {
    pub fn record(&self, status: u16) {
        self.0[status_class(status)].fetch_add(1, Ordering::Relaxed);
    }

    /// (class, count) in `STATUS_CLASSES` order.
    pub fn counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        STATUS_CLASSES.iter().zip(&self.0).map(|(c, n)| (*c, n.load(Ordering::Relaxed)))
    }
}

/// Nanoseconds on the process's monotonic clock, plus one (0 stands for "never").
pub fn mono_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_nanos() as u64 + 1
}

/// A family's `# TYPE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A metric family as Prometheus sees it: declared once, its samples named after it.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

impl Family {
    pub const fn counter(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: Kind::Counter, help }
    }
    pub const fn gauge(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: Kind::Gauge, help }
    }
    pub const fn histogram(name: &'static str, help: &'static str) -> Family {
        Family { name, kind: Kind::Histogram, help }
    }
}

/// The Prometheus text exposition (format 0.0.4) being written: one family at a time,
/// each sample named after the family it follows, label values escaped.
#[derive(Default)]
pub struct Exposition {
    out: String,
    family: &'static str,
}

impl Exposition {
    /// Starts `f`: its `# HELP` and `# TYPE` lines; the samples that follow are its.
    pub fn family(&mut self, f: &Family) -> &mut Self {
        let _ = writeln!(self.out, "# HELP {} {}\n# TYPE {} {}", f.name, f.help, f.name, f.kind.name());
        self.family = f.name;
        self
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, f: &Family, v: impl Display) {
        self.family(f).sample(&[], v);
    }

    /// One sample of the current family.
    pub fn sample(&mut self, labels: &[(&str, &str)], v: impl Display) -> &mut Self {
        self.line("", labels, None, v);
        self
    }

    /// One series of the current (histogram) family: cumulative buckets, sum and count.
    pub fn histogram(&mut self, labels: &[(&str, &str)], h: &Histogram) -> &mut Self {
        let mut cumulative = 0;
        for (i, le) in Histogram::BOUNDS_US.iter().enumerate() {
            cumulative += h.buckets[i].load(Ordering::Relaxed);
            self.line("_bucket", labels, Some(&(*le as f64 / 1e6)), cumulative);
        }
        let count = h.count.load(Ordering::Relaxed);
        self.line("_bucket", labels, Some(&"+Inf"), count);
        self.line("_sum", labels, None, h.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
        self.line("_count", labels, None, count);
        self
    }

    fn line(&mut self, suffix: &str, labels: &[(&str, &str)], le: Option<&dyn Display>, v: impl Display) {
        let o = &mut self.out;
        o.push_str(self.family);
        o.push_str(suffix);
        if !labels.is_empty() || le.is_some() {
            o.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                let _ = write!(o, "{}{k}=\"{}\"", if i == 0 { "" } else { "," }, escape(val));
            }
            if let Some(le) = le {
                let _ = write!(o, "{}le=\"{le}\"", if labels.is_empty() { "" } else { "," });
            }
            o.push('}');
        }
        let _ = writeln!(o, " {v}");
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A label value as the exposition format wants it: backslash, double quote and newline
/// escaped.
fn escape(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    let mut o = String::with_capacity(v.len() + 2);
    for ch in v.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o.into()
}

/// The `reason` label of `dispatcher_client_connections_refused_total`, indexed like
/// `Counters::conn_refused_by` (and `http::listener::Cap`).
pub const CONN_REFUSED_REASONS: [&str; 4] = ["global", "vip", "source_connections", "source_rate"];

/// The `protocol` label: HTTP/1.x, HTTP/2 (indexed by `http::Protocol`).
/// What became of a SIP message over TCP or TLS (`sip/`): the affinity source it
/// was routed by (`route`, `via`, `to_tag`, `from_tag`, `call_id`), and of those sent to
/// the replica (`replica`) or routed again after their container's connection ended
/// (`rerouted`); responses and containers' requests relayed; keepalives answered; held;
/// answered 503 (`rejected`); an unknown logical name; not SIP; the stream's faults
/// (`no_length`, `too_large`, `incomplete`: closed at a timeout mid-message); `stray`
/// (a response or request naming no connection of ours); `overflow` (a connection's
/// queue was full); `busy` (a container's connection stayed full: 503 to the caller,
/// the container not suspect).
pub const SIP_STREAM_OUTCOMES: [&str; 22] = [
    "route",
    "via",
    "to_tag",
    "from_tag",
    "call_id",
    "replica",
    "rerouted",
    "response",
    "container_request",
    "keepalive",
    "held",
    "rejected",
    "unknown_ln",
    "invalid",
    "no_length",
    "too_large",
    "incomplete",
    "stray",
    "overflow",
    "busy",
    "container_framing",
    "resend_limit",
];

pub const PROTOCOLS: [&str; 2] = ["h1", "h2"];

/// The `reason` label of HTTP/2 resets: the error codes of RFC 9113 7 by name, indexed
/// by code (`other` for a code past the table).
pub const H2_ERRORS: [&str; 15] = [
    "no_error",
    "protocol_error",
    "internal_error",
    "flow_control_error",
    "settings_timeout",
    "stream_closed",
    "frame_size_error",
    "refused_stream",
    "cancel",
    "compression_error",
    "connect_error",
    "enhance_your_calm",
    "inadequate_security",
    "http_1_1_required",
    "other",
];

/// The `reason` label of the GOAWAYs the dispatcher sends, indexed by `http::h2::GoAway`.
pub const H2_GOAWAY_REASONS: [&str; 7] =
    ["stop", "leave", "idle", "rapid_reset", "control_flood", "protocol_error", "enhance_your_calm"];

/// One declared counter or gauge: its family, its `GET /status` key and, for a labelled
/// one (an array of atomics), the label and its values in index order.
#[derive(Debug)]
pub struct Declared {
    pub family: Family,
    pub status: &'static str,
    pub label: Option<(&'static str, &'static [&'static str])>,
}

/// Declares the counters: each line makes a field of `Counters`, a field of
/// `CounterStatus` and an entry of `Counters::DECLARED` (what the exposition writes).
/// `field: kind "family" [label = VALUES] => status_key, "help";` — a labelled one is
/// an array of atomics, one per value, and its status key shows their sum.
macro_rules! counters {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident : $kind:ident $name:literal $([$label:ident = $values:ident])? => $status:ident, $help:literal;
    )*) => {
        /// The agent's own counters, shared by a cluster and the one a reload replaces it
        /// with: totals go on, and the gauges count the requests of both.
        #[derive(Default)]
        pub struct Counters {
            $( $(#[doc = $doc])* pub $field: counters!(@type $($values)?), )*
        }

        /// `GET /status` `counters`: the declared counters' values, by status key.
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(default)]
        pub struct CounterStatus {
            $( pub $status: u64, )*
            /// Each labelled counter by its label's values (its key above is their sum).
            pub by_label: std::collections::BTreeMap<String, std::collections::BTreeMap<String, u64>>,
        }

        impl Counters {
            /// Every declared counter, in exposition order.
            pub const DECLARED: &'static [Declared] = &[$(
                Declared {
                    family: Family::$kind($name, $help),
                    status: stringify!($status),
                    label: counters!(@label $($label, $values)?),
                },
            )*];

            /// The atomics of each declared counter, in `DECLARED` order (one for an
            /// unlabelled counter, one per label value otherwise).
            pub fn values(&self) -> Vec<&[AtomicU64]> {
                vec![$( counters!(@slice self.$field $(, $values)?), )*]
            }

            /// The status view.
            pub fn status(&self) -> CounterStatus {
                let mut by_label = std::collections::BTreeMap::new();
                for (d, atomics) in Self::DECLARED.iter().zip(self.values()) {
                    if let Some((_, values)) = d.label {
                        let split = values.iter().zip(atomics).map(|(v, a)| (v.to_string(), a.load(Ordering::Relaxed)));
                        by_label.insert(d.status.to_string(), split.collect());
                    }
                }
                CounterStatus { $( $status: total(counters!(@slice self.$field $(, $values)?)), )* by_label }
            }
        }
    };
    (@type) => { AtomicU64 };
    (@type $values:ident) => { [AtomicU64; $values.len()] };
    (@label) => { None };
    (@label $label:ident, $values:ident) => { Some((stringify!($label), &$values)) };
    (@slice $v:expr) => { std::slice::from_ref(&$v) };
    (@slice $v:expr, $values:ident) => { &$v[..] };
}

fn total(atomics: &[AtomicU64]) -> u64 {
    atomics.iter().map(|a| a.load(Ordering::Relaxed)).sum()
}

counters! {
    /// Session requests sent to a server that is neither the session's owner nor its
    /// replica. Must stay zero.
    misroutes: counter "dispatcher_misroutes_total" => misroutes,
        "Session requests sent to neither the owner nor its replica (must stay 0).";
    holds: counter "dispatcher_holds_total" => holds, "Requests held while their session's owner was suspect.";
    hold_timeouts: counter "dispatcher_hold_timeouts_total" => hold_timeouts, "Holds that ended at the hold time.";
    /// Requests whose clone IDs no one here knew, that waited for the shared table.
    learn_waits: counter "dispatcher_learn_waits_total" => learn_waits,
        "Requests whose clone IDs no one here knew that waited for the shared table ([cluster] learn_wait).";
    hold_refused: counter "dispatcher_hold_refused_total" => hold_refused, "Requests refused because max_held were held.";
    held_now: gauge "dispatcher_held_requests" => held_now, "Requests held now.";
    sip_stream_messages: counter "dispatcher_sip_stream_messages_total" [outcome = SIP_STREAM_OUTCOMES]
        => sip_stream_messages, "SIP messages over TCP and TLS by outcome.";
    sip_stream_connections: gauge "dispatcher_sip_stream_connections" => sip_stream_connections,
        "SIP client connections over TCP and TLS open now.";
    sip_stream_refused: counter "dispatcher_sip_stream_connections_refused_total" => sip_stream_refused,
        "SIP client connections closed at once: the VIP's max_connections were open.";
    retries: counter "dispatcher_retries_total" => retries, "Extra attempts after a failure before any response byte.";
    retry_budget_refusals: counter "dispatcher_retry_budget_refusals_total" => retry_budget_refusals,
        "Retries refused by the cluster-wide budget.";
    failovers: counter "dispatcher_failovers_total" => failovers, "Backends that went out of service.";
    clone_rewrites: counter "dispatcher_clone_rewrites_total" => clone_rewrites,
        "CLONES entries rewritten on failover and return.";
    flow_rewrites: counter "dispatcher_flow_rewrites_total" => flow_rewrites, "FLOWS entries moved off a failed backend.";
    transitions: counter "dispatcher_state_transitions_total" => state_transitions, "Backend state changes.";
    passive_failures: counter "dispatcher_passive_failures_total" => passive_failures,
        "Backends made suspect by a failed request.";
    learned: counter "dispatcher_learned_clones_total" => learned_clones, "Clone IDs learned from Set-Cookie.";
    learn_conflicts: counter "dispatcher_learn_conflicts_total" => learn_conflicts,
        "Clone IDs claimed by a second backend.";
    /// Reports of a SIP dialog's logical name (`SIP_LEARN`) that did not hold together.
    sip_learn_refused: counter "dispatcher_sip_learn_reports_refused_total" => sip_learn_refused,
        "Reports of a SIP dialog's logical name from the XDP program not learned: cut short, ids not of a SIP VIP, or a message that does not name what was reported.";
    /// SIP health checks that failed while callers kept acknowledging the container's
    /// answers: not counted against it.
    sip_check_failures_excused: counter "dispatcher_sip_check_failures_excused_total" => sip_check_failures_excused,
        "Failed SIP OPTIONS checks not counted against a container because callers acknowledged its answers (ACKs forwarded to it) since the previous check.";
    /// Clone IDs not kept: the table was full (`MAX_CLONES`, the size of `CLONES`).
    clones_full: counter "dispatcher_clones_table_full_total" => clones_full,
        "New clone IDs not kept because the clone table was full (its sessions are balanced).";
    /// Clone IDs not kept: empty, longer than `MAX_CLONE_ID_LEN` or not printable.
    clone_ids_refused: counter "dispatcher_clone_ids_refused_total" => clone_ids_refused,
        "Clone IDs not kept: empty, too long or not printable.";
    /// Access log lines written (once per destination that took it), and dropped because
    /// the writer was behind or a destination did not take them.
    access_log_lines: counter "dispatcher_access_log_lines_total" => access_log_lines,
        "Access log lines written (to a file or standard output, and sent to syslog: once per destination).";
    access_log_dropped: counter "dispatcher_access_log_dropped_total" => access_log_dropped,
        "Access log lines dropped because the writer was behind or syslog did not take them (requests are never delayed for the log).";
    /// Requests answered 503 "busy": their backend stayed at its connection limit for the
    /// whole queue timeout.
    queue_timeouts: counter "dispatcher_queue_timeouts_total" => queue_timeouts,
        "Requests answered 503 busy: no connection or maxconn slot came free in time, or the backend's queue was full.";
    /// Shortages on this host (descriptors, ports, buffers) met while connecting upstream
    /// or accepting; never counted against a backend.
    local_errors: counter "dispatcher_local_errors_total" => local_errors,
        "Shortages on this host (descriptors, ports, buffers) met accepting or connecting; never a backend failure.";
    /// Client connections closed at once because a connection cap was reached, by cap
    /// (`CONN_REFUSED_REASONS`, indexed by `http::listener::Cap`).
    conn_refused_by: counter "dispatcher_client_connections_refused_total" [reason = CONN_REFUSED_REASONS]
        => connections_refused,
        "Client connections refused at once (503, or closed on HTTPS VIPs), by the cap they met.";
    /// Requests that came back carrying this dispatcher's own `Via` marker (a loop),
    /// answered 508 and not forwarded.
    loops: counter "dispatcher_http_loops_total" => http_loops,
        "Requests that came back carrying this dispatcher's own Via marker (a forwarding loop), answered 508.";
    /// Routing decisions by the session's affinity (a known clone ID or the persistence
    /// cookie) to the owner, balancing, or none to be had.
    affinity_hits: counter "dispatcher_affinity_hits_total" => affinity_hits,
        "Routing decisions that sent a request to the owner its session names (clone ID or persistence cookie).";
    balanced: counter "dispatcher_balanced_total" => balanced,
        "Routing decisions left to the balancer (no session, or one whose clone IDs no one knows).";
    no_backend: counter "dispatcher_no_backend_total" => no_backend,
        "Routing decisions that found no backend up to balance to (answered 503).";
    /// Requests no route of their VIP matched (answered 404).
    no_route: counter "dispatcher_no_route_total" => no_route,
        "Requests no route of their HTTP VIP matched by host and path (answered 404).";
    /// Requests in flight to any backend, and retries among them (the retry budget).
    in_flight: gauge "dispatcher_requests_in_flight" => in_flight, "Requests in flight to any backend.";
    retries_in_flight: gauge "dispatcher_retries_in_flight" => retries_in_flight,
        "Retries among the requests in flight (the retry budget's share).";
    /// HTTP requests and client connections by the protocol the client spoke.
    requests_by_protocol: counter "dispatcher_http_requests_by_protocol_total" [protocol = PROTOCOLS]
        => requests_by_protocol, "HTTP requests by the protocol the client spoke (h1: HTTP/1.x, h2: HTTP/2 streams).";
    connections_by_protocol: counter "dispatcher_http_client_connections_by_protocol_total" [protocol = PROTOCOLS]
        => connections_by_protocol, "HTTP client connections served, by the protocol they spoke (ALPN or prior knowledge).";
    h2_connections_open: gauge "dispatcher_h2_connections_open" => h2_connections_open,
        "HTTP/2 client connections open now.";
    h2_streams_in_flight: gauge "dispatcher_h2_streams_in_flight" => h2_streams_in_flight,
        "HTTP/2 streams (requests) in flight now.";
    /// RST_STREAM frames by error code, as sent to clients and as received from them.
    h2_resets_sent: counter "dispatcher_h2_resets_sent_total" [reason = H2_ERRORS] => h2_resets_sent,
        "HTTP/2 streams the dispatcher reset (RST_STREAM sent), by error code.";
    h2_resets_received: counter "dispatcher_h2_resets_received_total" [reason = H2_ERRORS] => h2_resets_received,
        "HTTP/2 streams clients reset (RST_STREAM received), by error code.";
    /// GOAWAYs sent, by why (`H2_GOAWAY_REASONS`).
    h2_goaways: counter "dispatcher_h2_goaways_total" [reason = H2_GOAWAY_REASONS] => h2_goaways,
        "HTTP/2 connections the dispatcher ended with GOAWAY, by why (stop/leave/idle: graceful; the others: a bound was hit).";
    /// Streams refused before anything was forwarded (translation rules, CONNECT).
    h2_refused: counter "dispatcher_h2_requests_refused_total" => h2_refused,
        "HTTP/2 requests answered by the dispatcher without forwarding (CONNECT, a malformed translation).";
}

impl Counters {
    /// Every declared counter, in declaration order.
    pub fn expose(&self, o: &mut Exposition) {
        for (d, atomics) in Self::DECLARED.iter().zip(self.values()) {
            o.family(&d.family);
            match d.label {
                None => {
                    o.sample(&[], total(atomics));
                }
                Some((label, values)) => {
                    for (value, a) in values.iter().zip(atomics) {
                        o.sample(&[(label, value)], a.load(Ordering::Relaxed));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;

    /// What `promtool check metrics` checks, for the unit tests (the namespace tests run
    /// promtool itself on the agent's `/metrics`): every family has one `# HELP` and one
    /// `# TYPE`, before its samples and once; every sample belongs to the family just
    /// declared (a histogram's `_bucket`, `_sum`, `_count`); names and labels are
    /// well-formed; values are numbers; a series appears once. `Ok`: (family, labels)
    /// -> value of every sample.
    pub(crate) fn check_format(text: &str) -> Result<BTreeMap<(String, String), f64>, String> {
        let valid_name = |n: &str| {
            !n.is_empty()
                && !n.starts_with(|c: char| c.is_ascii_digit())
                && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        };
        let mut seen_families = BTreeSet::new();
        let mut current: Option<(String, Kind)> = None;
        let mut help: Option<String> = None;
        let mut samples = BTreeMap::new();
        for (n, line) in text.lines().enumerate() {
            let at = |e: String| format!("line {}: {e}: {line}", n + 1);
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, h) = rest.split_once(' ').ok_or_else(|| at("HELP without text".into()))?;
                if !valid_name(name) || h.trim().is_empty() || !seen_families.insert(name.to_string()) {
                    return Err(at("bad or repeated HELP".into()));
                }
                help = Some(name.to_string());
                current = None;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').ok_or_else(|| at("TYPE without kind".into()))?;
                if help.as_deref() != Some(name) {
                    return Err(at("TYPE not right after its HELP".into()));
                }
                let kind = [Kind::Counter, Kind::Gauge, Kind::Histogram]
                    .into_iter()
                    .find(|k| k.name() == kind)
                    .ok_or_else(|| at("unknown kind".into()))?;
                current = Some((name.to_string(), kind));
                help = None;
            } else if line.starts_with('#') || line.is_empty() {
                return Err(at("a line that is neither HELP, TYPE nor a sample".into()));
            } else {
                let (series, value) = line.rsplit_once(' ').ok_or_else(|| at("no value".into()))?;
                let value: f64 = value.parse().map_err(|_| at("value is not a number".into()))?;
                let (name, labels) = match series.split_once('{') {
                    Some((name, l)) => (name, l.strip_suffix('}').ok_or_else(|| at("unclosed labels".into()))?),
                    None => (series, ""),
                };
                check_labels(labels).map_err(at)?;
                let Some((family, kind)) = &current else { return Err(at("sample without HELP and TYPE".into())) };
                let belongs = match kind {
                    Kind::Histogram => ["_bucket", "_sum", "_count"].iter().any(|s| name == format!("{family}{s}")),
                    _ => name == family,
                };
                if !valid_name(name) || !belongs {
                    return Err(at(format!("sample not of family {family}")));
                }
                if samples.insert((name.to_string(), labels.to_string()), value).is_some() {
                    return Err(at("series repeated".into()));
                }
            }
        }
        Ok(samples)
    }

    /// `k="v",...`: names well-formed, values quoted with only `\\`, `\"`, `\n` escapes.
    fn check_labels(labels: &str) -> Result<(), String> {
        let mut rest = labels;
        let mut names = BTreeSet::new();
        while !rest.is_empty() {
            let (k, v) = rest.split_once("=\"").ok_or("label without =\"")?;
            if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || !names.insert(k) {
                return Err(format!("bad label name {k}"));
            }
            let mut chars = v.char_indices();
            let end = loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\' | '"' | 'n')) => {}
                        _ => return Err("bad escape".into()),
                    },
                    Some((i, '"')) => break i,
                    Some((_, '\n')) | None => return Err("unterminated label value".into()),
                    _ => {}
                }
            };
            rest = &v[end + 1..];
            rest = match rest.strip_prefix(',') {
                Some(r) if !r.is_empty() => r,
                None if rest.is_empty() => rest,
                _ => return Err("bad label separator".into()),
            };
        }
        Ok(())
    }

    /// Each declared counter, set to its own value, shows in the exposition (every label
    /// value) and in the status view under its key, with the same total; nothing else is
    /// in the status view, and names and keys are unique.
    #[test]
    fn every_declared_counter_is_exposed_and_in_the_status_view() {
        let c = Counters::default();
        for (i, atomics) in c.values().into_iter().enumerate() {
            for (j, a) in atomics.iter().enumerate() {
                a.store(1000 * (i as u64 + 1) + j as u64, Ordering::Relaxed);
            }
        }
        let mut o = Exposition::default();
        c.expose(&mut o);
        let samples = check_format(&o.finish()).unwrap();
        let status = serde_json::to_value(c.status()).unwrap();
        let status = status.as_object().unwrap();
        // Every declared key, and `by_label`.
        assert_eq!(status.len(), Counters::DECLARED.len() + 1, "{status:?}");
        for (i, d) in Counters::DECLARED.iter().enumerate() {
            let base = 1000 * (i as u64 + 1);
            let expect: Vec<(String, u64)> = match d.label {
                None => vec![(String::new(), base)],
                Some((label, values)) => {
                    values.iter().enumerate().map(|(j, v)| (format!("{label}=\"{v}\""), base + j as u64)).collect()
                }
            };
            let sum: u64 = expect.iter().map(|e| e.1).sum();
            if let Some((_, values)) = d.label {
                let split = &status["by_label"][d.status];
                for (j, v) in values.iter().enumerate() {
                    assert_eq!(split[v], base + j as u64, "{} {v}", d.status);
                }
            }
            for (labels, v) in expect {
                assert_eq!(
                    samples.get(&(d.family.name.to_string(), labels.clone())),
                    Some(&(v as f64)),
                    "{d:?} {labels}"
                );
            }
            assert_eq!(status[d.status], sum, "{}", d.status);
            assert!(matches!(d.family.kind, Kind::Counter | Kind::Gauge), "{d:?}");
            assert_eq!(d.family.name.ends_with("_total"), d.family.kind == Kind::Counter, "{d:?}");
        }
        let names: BTreeSet<_> = Counters::DECLARED.iter().map(|d| d.family.name).collect();
        assert_eq!(names.len(), Counters::DECLARED.len());
        let keys: BTreeSet<_> = Counters::DECLARED.iter().map(|d| d.status).collect();
        assert_eq!(keys.len(), Counters::DECLARED.len());
    }

    /// The JSON of an agent from before a counter was declared still reads (missing keys
    /// are 0), and the keys readers already use keep their names.
    #[test]
    fn the_status_view_keeps_its_keys_and_reads_older_agents() {
        let old: CounterStatus = serde_json::from_str(r#"{"holds": 3, "misroutes": 0}"#).unwrap();
        assert_eq!((old.holds, old.balanced), (3, 0));
        let keys = serde_json::to_value(CounterStatus::default()).unwrap();
        for key in [
            "holds",
            "held_now",
            "hold_timeouts",
            "retries",
            "retry_budget_refusals",
            "failovers",
            "flow_rewrites",
            "clone_rewrites",
            "misroutes",
            "learned_clones",
            "learn_conflicts",
            "clones_full",
            "clone_ids_refused",
            "queue_timeouts",
            "local_errors",
            "connections_refused",
            "affinity_hits",
            "balanced",
            "no_backend",
        ] {
            assert!(keys.get(key).is_some(), "{key}");
        }
    }

    /// The operators' metrics list (docs/operations.md) names every declared counter.
    #[test]
    fn the_operations_page_lists_every_declared_counter() {
        let page = include_str!("../../docs/operations.md");
        for d in Counters::DECLARED {
            assert!(page.contains(&format!("`{}", d.family.name)), "docs/operations.md lacks {}", d.family.name);
        }
    }

    #[test]
    fn histograms_and_labels_are_written_as_the_format_wants() {
        let h = Histogram::default();
        h.record(std::time::Duration::from_micros(300));
        h.record(std::time::Duration::from_secs(9));
        let mut o = Exposition::default();
        o.family(&Family::histogram("x_seconds", "X.")).histogram(&[("vip", "a\"b\\c\nd")], &h);
        o.single(&Family::gauge("y", "Y."), 1);
        let text = o.finish();
        let s = check_format(&text).unwrap();
        let vip = r#"vip="a\"b\\c\nd""#;
        assert_eq!(s[&("x_seconds_bucket".into(), format!("{vip},le=\"0.00025\""))], 0.0);
        assert_eq!(s[&("x_seconds_bucket".into(), format!("{vip},le=\"0.0005\""))], 1.0);
        assert_eq!(s[&("x_seconds_bucket".into(), format!("{vip},le=\"5\""))], 1.0);
        assert_eq!(s[&("x_seconds_bucket".into(), format!("{vip},le=\"+Inf\""))], 2.0);
        assert_eq!(s[&("x_seconds_count".into(), vip.to_string())], 2.0);
        assert_eq!(s[&("x_seconds_sum".into(), vip.to_string())], 9.0003);
        assert_eq!(s[&("y".into(), String::new())], 1.0);
    }

    /// The checker refuses what promtool refuses, among them the OpenMetrics shape of a
    /// counter (family without `_total`, samples with it) that prometheus-client writes.
    #[test]
    fn the_format_check_refuses_what_promtool_refuses() {
        for bad in [
            "# HELP x_total X.\n# TYPE x_total counter\nx_total 1\nx_total 2\n",
            "# HELP x X.\n# TYPE x counter\nx_total 1\n# EOF\n",
            "x 1\n",
            "# HELP x X.\n# TYPE x gauge\nx{a=\"b} 1\n",
            "# HELP x X.\n# TYPE x gauge\nx{a=\"b\\t\"} 1\n",
            "# HELP x X.\n# TYPE x gauge\nx one\n",
            "# HELP x X.\n# TYPE x gauge\nx 1\n# HELP x X.\n# TYPE x gauge\n",
            "# HELP x X.\n# TYPE x histogram\nx_total 1\n",
        ] {
            assert!(check_format(bad).is_err(), "{bad}");
        }
    }
}
