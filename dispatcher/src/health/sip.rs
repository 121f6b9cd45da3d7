//! The agent's side of SIP: the `OPTIONS` health check (IBM's SIP advisor does the same)
//! and reading a logical name out of a SIP answer. Routing SIP messages is the XDP
//! program's job (`dispatcher-ebpf/src/sip.rs`), with the scanner both share
//! (`dispatcher_common::sip`).

use std::net::SocketAddr;

use dispatcher_common::sip::{logical_name, scan};

use crate::health::{Cause, Verdict};

/// Sends `OPTIONS` to a container over UDP and waits for a final answer (any status:
/// the container is alive) to this request (same Call-ID). Returns the logical name its
/// To tag carries, if any.
pub async fn options(to: SocketAddr) -> (Verdict, Option<String>) {
    let bind: SocketAddr = if to.is_ipv4() { "0.0.0.0:0".parse().unwrap() } else { "[::]:0".parse().unwrap() };
    let sock = match tokio::net::UdpSocket::bind(bind).await {
        Ok(s) => s,
        Err(e) => {
            crate::ratelimit::warn("SIP health check socket", &e);
            return (Verdict::Local, None);
        }
    };
    if let Err(e) = sock.connect(to).await {
        return (
            if e.raw_os_error().is_some_and(crate::http1::io::is_local_errno) {
                Verdict::Local
            } else {
                Verdict::Fail(Cause::of_io(&e))
            },
            None,
        );
    }
    let local = sock.local_addr().map(|a| a.to_string()).unwrap_or_default();
    let nonce: u64 = rand_u64();
    let call_id = format!("{nonce:016x}@dispatcher-health");
    let req = format!(
        "OPTIONS sip:{to} SIP/2.0\r\nVia: SIP/2.0/UDP {local};branch=z9hG4bK{nonce:x};rport\r\nMax-Forwards: 70\r\nFrom: <sip:dispatcher@{local}>;tag={nonce:x}\r\nTo: <sip:{to}>\r\nCall-ID: {call_id}\r\nCSeq: 1 OPTIONS\r\nAccept: application/sdp\r\nUser-Agent: dispatcher-health\r\nContent-Length: 0\r\n\r\n"
    );
    if let Err(e) = sock.send(req.as_bytes()).await {
        // ICMP port unreachable from an earlier send shows here: the container is down.
        return (Verdict::Fail(Cause::of_io(&e)), None);
    }
    let mut buf = vec![0u8; 65535];
    loop {
        let n = match sock.recv(&mut buf).await {
            Ok(n) => n,
            Err(e) => return (Verdict::Fail(Cause::of_io(&e)), None),
        };
        let msg = &buf[..n];
        let s = scan(msg);
        if s.response == 0 || s.done == 0 || header_value(msg, &["call-id", "i"]) != Some(call_id.as_bytes()) {
            continue;
        }
        let status = msg.get(8..11).and_then(|d| std::str::from_utf8(d).ok()?.parse::<u16>().ok());
        match status {
            Some(100..=199) => continue,
            Some(200..=699) => {
                let ln = to_tag(msg).and_then(logical_name).map(|l| String::from_utf8_lossy(l).into_owned());
                return (Verdict::Pass, ln);
            }
            Some(status) => return (Verdict::Fail(Cause::Status(status)), None),
            None => return (Verdict::Fail(Cause::BadResponse), None),
        }
    }
}

/// How long ACKs may excuse a SIP container's checks that time out, counted from the first
/// failure they excused (a passing check ends the stretch): a container that answers calls
/// rides through an overload where its `OPTIONS` answers come late, and one whose ACKs
/// come from elsewhere (forged, or late ones of a container that froze) is judged by its
/// checks again after this.
pub const ACK_EXCUSE_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// Passive evidence that a SIP container answers calls: the XDP program counts the ACKs it
/// forwards to it (`stats::BACKEND_SIP_ACKS`). A caller sends an ACK only for a final
/// answer it received, so an ACK forwarded since the previous check means the container
/// answered since about then: a check that timed out meanwhile says it is slow, not dead,
/// and is not counted against it. Only timeouts are excused: a refused check (ICMP port
/// unreachable: nothing listens) or a bad answer counts as always.
#[derive(Clone, Copy, Debug, Default)]
pub struct AckEvidence {
    /// The ACK count at the previous check.
    last: Option<u64>,
    /// When the current stretch of excused failures began.
    excusing_since: Option<std::time::Instant>,
}

impl AckEvidence {
    /// After a check that `passed` (or timed out: `timed_out`), with `acks` forwarded to
    /// the container so far: whether its failure is excused.
    pub fn excuses(&mut self, passed: bool, timed_out: bool, acks: u64, now: std::time::Instant) -> bool {
        let fresh = self.last.is_some_and(|l| acks > l);
        self.last = Some(acks);
        if passed {
            self.excusing_since = None;
            return false;
        }
        if !timed_out || !fresh {
            return false;
        }
        let since = *self.excusing_since.get_or_insert(now);
        now.duration_since(since) < ACK_EXCUSE_MAX
    }
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    h.finish()
}

/// The value of the first header of one of these names (lowercase; compact forms too),
/// trimmed. Header section only.
pub fn header_value<'a>(msg: &'a [u8], names: &[&str]) -> Option<&'a [u8]> {
    let head = &msg[..msg.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 2).unwrap_or(msg.len())];
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let name = line[..colon].trim_ascii();
        if names.iter().any(|n| name.eq_ignore_ascii_case(n.as_bytes())) {
            return Some(line[colon + 1..].trim_ascii());
        }
    }
    None
}

/// The `tag` parameter of the To header (outside `<...>`).
pub fn to_tag(msg: &[u8]) -> Option<&[u8]> {
    let v = header_value(msg, &["to", "t"])?;
    let after = match v.iter().rposition(|&b| b == b'>') {
        Some(p) => &v[p + 1..],
        None => v,
    };
    for param in after.split(|&b| b == b';').skip(1) {
        let Some(eq) = param.iter().position(|&b| b == b'=') else { continue };
        if param[..eq].trim_ascii().eq_ignore_ascii_case(b"tag") {
            let val = param[eq + 1..].trim_ascii();
            let end = val.iter().position(|&b| b == b',' || b == b' ').unwrap_or(val.len());
            return Some(&val[..end]);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use dispatcher_common::{hash::cookie_hash, sip::SRC_TO_TAG};

    #[test]
    fn acks_excuse_timeouts_for_a_bounded_time_and_nothing_else() {
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + std::time::Duration::from_secs(s);
        let mut e = AckEvidence::default();
        assert!(!e.excuses(false, true, 5, at(0)), "no earlier count: no evidence yet");
        assert!(e.excuses(false, true, 9, at(1)), "ACKs since the last check excuse a timeout");
        assert!(!e.excuses(false, true, 9, at(2)), "none since: the timeout counts");
        assert!(!e.excuses(false, false, 12, at(3)), "a refused check is never excused");
        assert!(e.excuses(false, true, 14, at(4)));
        // The stretch began at 1 s: excused until ACK_EXCUSE_MAX after it, then judged.
        let end = 1 + ACK_EXCUSE_MAX.as_secs();
        assert!(e.excuses(false, true, 20, at(end - 1)));
        assert!(!e.excuses(false, true, 30, at(end)), "bounded");
        assert!(!e.excuses(false, true, 40, at(end + 1)));
        // A passing check ends the stretch: a later overload is excused again.
        assert!(!e.excuses(true, false, 41, at(end + 2)));
        assert!(e.excuses(false, true, 50, at(end + 3)));
    }

    #[test]
    fn the_to_tag_of_an_answer_names_the_logical_name() {
        let m = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 1.2.3.4;branch=z\r\nFrom: <sip:d@h>;tag=abc\r\nTo: <sip:c@h;tag=no>;tag=ln7.1153242645968_1_1\r\nCall-ID: x@y\r\n\r\n";
        let tag = to_tag(m).unwrap();
        assert_eq!(tag, b"ln7.1153242645968_1_1");
        assert_eq!(logical_name(tag), Some(&b"ln7"[..]));
        // What the agent learns is what XDP will look up.
        let s = scan(m);
        assert!(s.has(SRC_TO_TAG));
        assert_eq!(s.to, cookie_hash(b"ln7"));
        assert_eq!(header_value(m, &["call-id", "i"]), Some(&b"x@y"[..]));
    }
}
