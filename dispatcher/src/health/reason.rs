//! Why a backend changed state: what its check found, what a request saw, or who said
//! so. Small `Copy` enums, written out only when a change is logged or shown; the
//! metrics use their bounded `kind` (a class for statuses, never the number).

use std::{fmt, time::Duration};

use dispatcher_common::Operator;

/// What a failed check or a failed request met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The connection was refused (or, for SIP, an ICMP port unreachable came back).
    Refused,
    /// No answer in time: the limit in milliseconds (0: not known here).
    Timeout(u32),
    /// An answer with a status the check does not accept (or a backend's status in
    /// `suspect_on_status`).
    Status(u16),
    /// The TLS handshake failed (certificate, name, protocol).
    Tls,
    /// The connection was reset.
    Reset,
    /// The server closed the connection before a whole answer.
    Closed,
    /// An answer that is not HTTP (or SIP) as it must be.
    BadResponse,
    /// Could not connect for another reason (no route to the host, ...).
    Unreachable,
}

/// `Cause::kind` values, in `Cause::index` order.
pub const CAUSE_KINDS: [&str; 13] = [
    "refused",
    "timeout",
    "status_1xx",
    "status_2xx",
    "status_3xx",
    "status_4xx",
    "status_5xx",
    "status_other",
    "tls",
    "reset",
    "closed",
    "bad_response",
    "unreachable",
];

/// The same, seen by a request (`Reason::Passive`).
pub const PASSIVE_KINDS: [&str; 13] = [
    "passive_refused",
    "passive_timeout",
    "passive_status_1xx",
    "passive_status_2xx",
    "passive_status_3xx",
    "passive_status_4xx",
    "passive_status_5xx",
    "passive_status_other",
    "passive_tls",
    "passive_reset",
    "passive_closed",
    "passive_bad_response",
    "passive_unreachable",
];

impl Cause {
    fn index(self) -> usize {
        match self {
            Cause::Refused => 0,
            Cause::Timeout(_) => 1,
            Cause::Status(s @ 100..=599) => 1 + (s / 100) as usize,
            Cause::Status(_) => 7,
            Cause::Tls => 8,
            Cause::Reset => 9,
            Cause::Closed => 10,
            Cause::BadResponse => 11,
            Cause::Unreachable => 12,
        }
    }

    /// A metric label: bounded (statuses by class).
    pub fn kind(self) -> &'static str {
        CAUSE_KINDS[self.index()]
    }

    /// From a failed connect or I/O: refused, reset, timed out, closed, else unreachable.
    pub fn of_io(e: &std::io::Error) -> Cause {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionRefused => Cause::Refused,
            K::ConnectionReset | K::ConnectionAborted => Cause::Reset,
            K::TimedOut => Cause::Timeout(0),
            K::UnexpectedEof | K::BrokenPipe => Cause::Closed,
            _ => Cause::Unreachable,
        }
    }

    pub fn timeout(limit: Duration) -> Cause {
        Cause::Timeout(limit.as_millis().min(u32::MAX as u128) as u32)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Refused => f.write_str("refused"),
            Cause::Timeout(0) => f.write_str("timeout"),
            Cause::Timeout(ms) => write!(f, "timeout after {:.1}s", *ms as f64 / 1000.0),
            Cause::Status(s) => write!(f, "status {s}"),
            Cause::Tls => f.write_str("tls handshake failed"),
            Cause::Reset => f.write_str("reset"),
            Cause::Closed => f.write_str("closed"),
            Cause::BadResponse => f.write_str("bad response"),
            Cause::Unreachable => f.write_str("unreachable"),
        }
    }
}

/// Why a backend's state changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// A check failed so.
    Check(Cause),
    /// A check passed (suspicion cleared, or `rise` checks passed).
    Passed,
    /// A request saw it fail so.
    Passive(Cause),
    /// An operator's command here: drain, disable, enable (`Operator::None`).
    Operator(Operator),
    /// An operator's command given on another dispatcher (the shared store).
    SharedOperator(Operator),
    /// The shared rule: most live dispatchers see it down (`true`), or no longer.
    Peers(bool),
    /// An operator disabled its health checks (`true`: it counts as healthy), or
    /// enabled them again.
    Checks(bool),
}

/// `Reason::kind` values that are not a cause's.
pub const OTHER_KINDS: [&str; 7] =
    ["passed", "operator", "shared_operator", "peers_down", "peers_up", "checks_disabled", "checks_enabled"];

impl Reason {
    /// A metric label: bounded (`CAUSE_KINDS`, `PASSIVE_KINDS`, `OTHER_KINDS`).
    pub fn kind(self) -> &'static str {
        match self {
            Reason::Check(c) => c.kind(),
            Reason::Passive(c) => PASSIVE_KINDS[c.index()],
            Reason::Passed => OTHER_KINDS[0],
            Reason::Operator(_) => OTHER_KINDS[1],
            Reason::SharedOperator(_) => OTHER_KINDS[2],
            Reason::Peers(true) => OTHER_KINDS[3],
            Reason::Peers(false) => OTHER_KINDS[4],
            Reason::Checks(true) => OTHER_KINDS[5],
            Reason::Checks(false) => OTHER_KINDS[6],
        }
    }
}

/// An operator's command by its verb.
fn verb(op: Operator) -> &'static str {
    match op {
        Operator::None => "enable",
        Operator::Drain => "drain",
        Operator::Disabled => "disable",
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Check(c) => c.fmt(f),
            Reason::Passed => f.write_str("check passed"),
            Reason::Passive(c) => write!(f, "passive: {c}"),
            Reason::Operator(op) => write!(f, "operator {}", verb(*op)),
            Reason::SharedOperator(op) => write!(f, "operator {} (another dispatcher)", verb(*op)),
            Reason::Peers(true) => f.write_str("most dispatchers see it down"),
            Reason::Peers(false) => f.write_str("most dispatchers no longer see it down"),
            Reason::Checks(true) => f.write_str("operator disabled its health checks"),
            Reason::Checks(false) => f.write_str("operator enabled its health checks"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_as_an_operator_expects_and_their_kinds_are_bounded() {
        let cases = [
            (Reason::Check(Cause::Refused), "refused", "refused"),
            (Reason::Check(Cause::timeout(Duration::from_secs(2))), "timeout after 2.0s", "timeout"),
            (Reason::Check(Cause::Status(503)), "status 503", "status_5xx"),
            (Reason::Check(Cause::Status(404)), "status 404", "status_4xx"),
            (Reason::Check(Cause::Status(999)), "status 999", "status_other"),
            (Reason::Check(Cause::Tls), "tls handshake failed", "tls"),
            (Reason::Check(Cause::Reset), "reset", "reset"),
            (Reason::Check(Cause::Closed), "closed", "closed"),
            (Reason::Check(Cause::BadResponse), "bad response", "bad_response"),
            (Reason::Passed, "check passed", "passed"),
            (Reason::Passive(Cause::Timeout(0)), "passive: timeout", "passive_timeout"),
            (Reason::Passive(Cause::Status(502)), "passive: status 502", "passive_status_5xx"),
            (Reason::Operator(Operator::Drain), "operator drain", "operator"),
            (Reason::Operator(Operator::None), "operator enable", "operator"),
            (Reason::SharedOperator(Operator::Disabled), "operator disable (another dispatcher)", "shared_operator"),
            (Reason::Peers(true), "most dispatchers see it down", "peers_down"),
            (Reason::Checks(true), "operator disabled its health checks", "checks_disabled"),
            (Reason::Checks(false), "operator enabled its health checks", "checks_enabled"),
        ];
        for (r, text, kind) in cases {
            assert_eq!((r.to_string().as_str(), r.kind()), (text, kind), "{r:?}");
        }
        let io = |k| Cause::of_io(&std::io::Error::from(k));
        assert_eq!(io(std::io::ErrorKind::ConnectionRefused), Cause::Refused);
        assert_eq!(io(std::io::ErrorKind::ConnectionReset), Cause::Reset);
        assert_eq!(io(std::io::ErrorKind::HostUnreachable), Cause::Unreachable);
    }
}
