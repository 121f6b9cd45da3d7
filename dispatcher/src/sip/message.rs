//! The dispatcher's own marks on a SIP message it relays over a stream transport, so that
//! answers and requests in the other direction come back through it to the right
//! connection (RFC 3261 16.6, 16.7):
//!
//! - on a request it forwards, its own `Via` on top, whose branch names where the request
//!   came from (`z9hG4bK-dsp-c<client connection>-<hash of the sender's branch>`, or
//!   `-u<container>-` for a request a container sent toward a caller); a response pops it
//!   and goes to that connection;
//! - on a dialog-creating request, a `Record-Route` naming the dispatcher (`;lr`) with
//!   `dsp=c<client connection>`: a container's in-dialog request (a BYE from the UAS)
//!   carries it as its top `Route`, which is taken off and names the caller's connection.
//!
//! Pure functions over one message's bytes (the body is never touched, so
//! `Content-Length` stays right).

use std::{fmt, io::Write, ops::Range};

use super::framing::split_header;

/// Where a `dsp` mark points: a caller's connection or a container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Client(u64),
    Container(usize),
}

const BRANCH_PREFIX: &[u8] = b"z9hG4bK-dsp-";

fn is_name(name: &[u8], long: &[u8], compact: &[u8]) -> bool {
    name.eq_ignore_ascii_case(long) || name.eq_ignore_ascii_case(compact)
}

/// The first line's end (after its line feed).
fn start_line_end(msg: &[u8]) -> usize {
    msg.iter().position(|&c| c == b'\n').map_or(msg.len(), |p| p + 1)
}

/// A response (`SIP/2.0 ...` start line).
pub fn is_response(msg: &[u8]) -> bool {
    msg.len() >= 8 && msg[..8].eq_ignore_ascii_case(b"SIP/2.0 ")
}

/// A request's method.
pub fn method(msg: &[u8]) -> &[u8] {
    let end = msg.iter().position(|&c| c == b' ' || c == b'\r' || c == b'\n').unwrap_or(msg.len());
    &msg[..end]
}

/// The header lines of a message, one at a time, up to the empty line: each physical
/// line's byte range (its line end included) and whether it starts a header (`name:
/// value`; a folded line does not). Nothing allocated: a lookup walks it and stops at
/// what it needs.
fn header_lines(msg: &[u8]) -> impl Iterator<Item = (Range<usize>, bool)> + '_ {
    let mut at = start_line_end(msg);
    std::iter::from_fn(move || {
        let end = msg.get(at..)?.iter().position(|&c| c == b'\n').map_or(msg.len(), |p| at + p + 1);
        let line = &msg[at..end];
        let bare = line.strip_suffix(b"\n").unwrap_or(line);
        let bare = bare.strip_suffix(b"\r").unwrap_or(bare);
        if bare.is_empty() {
            return None;
        }
        let range = at..end;
        at = end;
        Some((range, split_header(bare).is_some()))
    })
}

/// The first header named `long` or `compact`: its line's byte range and its value.
fn find_header<'a>(msg: &'a [u8], long: &[u8], compact: &[u8]) -> Option<(Range<usize>, &'a [u8])> {
    header_lines(msg).filter(|(_, named)| *named).find_map(|(r, _)| {
        let (name, value) = split_header(msg[r.clone()].trim_ascii_end())?;
        is_name(name, long, compact).then_some((r, value))
    })
}

/// The value of the first header named `long` or `compact`.
pub fn header<'a>(msg: &'a [u8], long: &[u8], compact: &[u8]) -> Option<&'a [u8]> {
    find_header(msg, long, compact).map(|(_, v)| v)
}

/// A parameter's value in a header value's first element (`;name=value`).
fn param<'a>(first: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    first.split(|&c| c == b';').skip(1).find_map(|p| {
        let (n, v) = match p.iter().position(|&c| c == b'=') {
            Some(eq) => (p[..eq].trim_ascii(), p[eq + 1..].trim_ascii()),
            None => (p.trim_ascii(), &b""[..]),
        };
        n.eq_ignore_ascii_case(name).then_some(v)
    })
}

/// The first element of a header value (up to a comma outside `<...>`).
fn first_element(v: &[u8]) -> &[u8] {
    let mut angle = false;
    for (i, &c) in v.iter().enumerate() {
        match c {
            b'<' => angle = true,
            b'>' => angle = false,
            b',' if !angle => return &v[..i],
            _ => {}
        }
    }
    v
}

/// The branch of the top `Via`.
pub fn top_branch(msg: &[u8]) -> Option<&[u8]> {
    param(first_element(header(msg, b"via", b"v")?), b"branch")
}

/// A transaction's key: its top `Via` branch, and whether it is a CANCEL's (a CANCEL
/// carries its INVITE's branch, RFC 3261 9.1, yet is a transaction of its own: its
/// answer must not end the INVITE's). `cancel`: the request's method, or its answer's
/// `CSeq` method, is CANCEL.
pub fn transaction_key(msg: &[u8], cancel: bool) -> Option<Vec<u8>> {
    let branch = top_branch(msg)?;
    let mut k = Vec::with_capacity(branch.len() + 1);
    k.extend_from_slice(branch);
    if cancel {
        k.push(0);
    }
    Some(k)
}

/// Whether an answer answers a CANCEL (its `CSeq` method).
pub fn answers_cancel(msg: &[u8]) -> bool {
    header(msg, b"cseq", b"cseq")
        .and_then(|v| v.split(|c| c.is_ascii_whitespace()).rfind(|t| !t.is_empty()))
        .is_some_and(|m| m.eq_ignore_ascii_case(b"CANCEL"))
}

/// FNV-1a of some bytes (the branch hash: the same sender's branch gives the same one,
/// so a CANCEL or a retransmission matches its INVITE's transaction downstream).
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// As a `dsp` mark reads: `c<connection>` or `u<container>`, in hex.
impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mark::Client(id) => write!(f, "c{id:x}"),
            Mark::Container(b) => write!(f, "u{b:x}"),
        }
    }
}

fn parse_mark(t: &[u8]) -> Option<Mark> {
    let (kind, hex) = t.split_first()?;
    let n = u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
    match kind {
        b'c' => Some(Mark::Client(n)),
        b'u' => Some(Mark::Container(usize::try_from(n).ok()?)),
        _ => None,
    }
}

/// Requests that create a dialog: they get our `Record-Route`.
fn creates_dialog(method: &[u8]) -> bool {
    [&b"INVITE"[..], b"SUBSCRIBE", b"REFER", b"NOTIFY"].iter().any(|m| m.eq_ignore_ascii_case(method))
}

/// `Max-Forwards` taken down by one, in place (RFC 3261 16.6 step 3: added as 70 taken
/// down, 69, when absent); false when it was already 0 or is not a number (the caller
/// answers 483). Leading zeros are a number (`1*DIGIT`).
pub fn take_hop(msg: &mut Vec<u8>) -> bool {
    let Some((range, value)) = find_header(msg, b"max-forwards", b"max-forwards") else {
        let at = start_line_end(msg);
        msg.splice(at..at, b"Max-Forwards: 69\r\n".iter().copied());
        return true;
    };
    let n: Option<u32> = std::str::from_utf8(value)
        .ok()
        .filter(|v| (1..=9).contains(&v.len()) && v.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|v| v.parse().ok());
    let Some(n) = n.filter(|&n| n > 0) else { return false };
    let mut line = [0u8; 24];
    let mut w = &mut line[..];
    let _ = write!(w, "Max-Forwards: {}\r\n", n - 1);
    let len = 24 - w.len();
    msg.splice(range, line[..len].iter().copied());
    true
}

/// What a forwarded request carries: our `Via` (its branch names `from`) and, for a
/// dialog-creating request from a caller, our `Record-Route`. `host` is the VIP's
/// `address:port`, `transport` `TCP` or `TLS`.
pub fn forward_request(msg: &[u8], from: Mark, host: &str, transport: &str) -> Vec<u8> {
    forward_request_sealed(msg, from, host, transport, None)
}

/// A container's request toward caller connection `client`: our `Via`'s branch names the
/// container and carries a seal of it, the caller and the branch hash under a key of this
/// process (`seal`), so that only that caller's answer to that request reaches that
/// container: a caller cannot forge a response that goes to a container of its choice.
pub fn forward_to_caller(msg: &[u8], container: usize, client: u64, host: &str, transport: &str) -> Vec<u8> {
    forward_request_sealed(msg, Mark::Container(container), host, transport, Some(client))
}

/// The keyed hash that binds a container's request to the caller it was sent to.
fn seal(container: usize, client: u64, hash: u64) -> u64 {
    use std::hash::BuildHasher;
    static KEY: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(std::collections::hash_map::RandomState::new).hash_one((container, client, hash))
}

/// The container a caller's response goes to: its top `Via` is ours, names a container,
/// and carries the seal made for this caller (`forward_to_caller`).
pub fn sealed_container(msg: &[u8], client: u64) -> Option<usize> {
    let rest = top_branch(msg)?.strip_prefix(BRANCH_PREFIX)?;
    let mut parts = rest.split(|&c| c == b'-');
    let Mark::Container(b) = parse_mark(parts.next()?)? else { return None };
    let hex = |t: &[u8]| u64::from_str_radix(std::str::from_utf8(t).ok()?, 16).ok();
    let (hash, s) = (hex(parts.next()?)?, hex(parts.next()?)?);
    (parts.next().is_none() && s == seal(b, client, hash)).then_some(b)
}

fn forward_request_sealed(msg: &[u8], from: Mark, host: &str, transport: &str, client: Option<u64>) -> Vec<u8> {
    let hash = fnv(top_branch(msg).unwrap_or(b""));
    // One buffer, written once: the start line, our lines, the rest as it came.
    let at = start_line_end(msg);
    let mut out = Vec::with_capacity(msg.len() + 2 * host.len() + 128);
    out.extend_from_slice(&msg[..at]);
    let _ = write!(out, "Via: SIP/2.0/{transport} {host};branch=z9hG4bK-dsp-{from}-{hash:x}");
    if let (Mark::Container(b), Some(c)) = (from, client) {
        let _ = write!(out, "-{:x}", seal(b, c, hash));
    }
    out.extend_from_slice(b"\r\n");
    if matches!(from, Mark::Client(_)) && creates_dialog(method(msg)) {
        let _ = write!(out, "Record-Route: <sip:{host};transport=");
        out.extend(transport.bytes().map(|c| c.to_ascii_lowercase()));
        let _ = write!(out, ";lr;dsp={from}>\r\n");
    }
    out.extend_from_slice(&msg[at..]);
    out
}

/// Removes the first element of the header line at `range`, in place (the whole line
/// when it is its only element; else `Name: <the elements after the comma>`).
fn remove_first_element(msg: &mut Vec<u8>, range: Range<usize>) {
    let line = &msg[range.clone()];
    let Some(colon) = line.iter().position(|&c| c == b':') else { return };
    let value = &line[colon + 1..];
    let first = first_element(value).len();
    if first == value.len() {
        msg.drain(range);
        return;
    }
    // From the value's start to the next element (blanks after the comma included).
    let blanks = value[first + 1..].iter().take_while(|&&c| c == b' ' || c == b'\t').count();
    let from = range.start + colon + 1;
    msg.splice(from..from + first + 1 + blanks, [b' ']);
}

/// A response's top `Via`, if it is ours: where the response goes; the `Via` is taken
/// off `msg`.
pub fn pop_our_via(msg: &mut Vec<u8>) -> Option<Mark> {
    let (range, value) = find_header(msg, b"via", b"v")?;
    let rest = param(first_element(value), b"branch")?.strip_prefix(BRANCH_PREFIX)?;
    let mark = parse_mark(rest.split(|&c| c == b'-').next()?)?;
    remove_first_element(msg, range);
    Some(mark)
}

/// A request's top `Route`, if it is ours (`;dsp=`): the caller's connection it names;
/// the `Route` is taken off `msg` (RFC 3261 16.4: a proxy removes its own top Route).
pub fn pop_our_route(msg: &mut Vec<u8>) -> Option<Mark> {
    let (range, value) = find_header(msg, b"route", b"route")?;
    let inner = first_element(value).split(|&c| c == b'>').next()?;
    let mark = parse_mark(param(inner, b"dsp")?)?;
    remove_first_element(msg, range);
    Some(mark)
}

/// The dispatcher's own final answer to a request: its `Via`s, `From`, `To` (tagged),
/// `Call-ID` and `CSeq` copied (RFC 3261 8.2.6), no body; `retry_after` seconds when
/// given.
pub fn answer(req: &[u8], status: u16, reason: &str, retry_after: Option<u32>) -> Vec<u8> {
    let mut out = format!("SIP/2.0 {status} {reason}\r\n").into_bytes();
    for (range, named) in header_lines(req) {
        let line = &req[range];
        let bare = line.trim_ascii_end();
        let Some((name, value)) = split_header(bare).filter(|_| named) else { continue };
        let keep = [(&b"via"[..], &b"v"[..]), (b"from", b"f"), (b"call-id", b"i"), (b"cseq", b"cseq")];
        if keep.iter().any(|(l, c)| is_name(name, l, c)) {
            out.extend_from_slice(bare);
            out.extend_from_slice(b"\r\n");
        } else if is_name(name, b"to", b"t") {
            out.extend_from_slice(bare);
            if param(first_element(value), b"tag").is_none() {
                out.extend_from_slice(format!(";tag=dsp{:x}", fnv(req) & 0xffff_ffff).as_bytes());
            }
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(s) = retry_after {
        out.extend_from_slice(format!("Retry-After: {s}\r\n").as_bytes());
    }
    out.extend_from_slice(b"Content-Length: 0\r\n\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CANCEL shares its INVITE's branch but is its own transaction: its key differs,
    /// and its answer (by `CSeq`) names the CANCEL's key, not the INVITE's.
    #[test]
    fn a_cancel_and_its_invite_are_two_transactions() {
        let invite = transaction_key(INVITE, false).unwrap();
        let cancel = transaction_key(INVITE, true).unwrap();
        assert_ne!(invite, cancel);
        let ok_cancel =
            b"SIP/2.0 200 OK\r\nVia: SIP/2.0/TCP 10.0.1.2:5061;branch=z9hG4bK-1-0\r\nCSeq: 1  cancel \r\n\r\n";
        let terminated =
            b"SIP/2.0 487 Terminated\r\nVia: SIP/2.0/TCP 10.0.1.2:5061;branch=z9hG4bK-1-0\r\nCSeq: 1 INVITE\r\n\r\n";
        assert!(answers_cancel(ok_cancel) && !answers_cancel(terminated));
        assert_eq!(transaction_key(ok_cancel, answers_cancel(ok_cancel)), Some(cancel));
        assert_eq!(transaction_key(terminated, answers_cancel(terminated)), Some(invite));
    }

    const INVITE: &[u8] = b"INVITE sip:svc@10.0.0.1:5060 SIP/2.0\r\n\
Via: SIP/2.0/TCP 10.0.1.2:5061;branch=z9hG4bK-1-0\r\n\
From: <sip:a@x>;tag=1\r\nTo: <sip:svc@y>\r\nCall-ID: 1-1@x\r\nCSeq: 1 INVITE\r\n\
Content-Length: 4\r\n\r\nv=0\n";

    fn text(b: &[u8]) -> String {
        String::from_utf8_lossy(b).into_owned()
    }

    /// A request gets our Via and Record-Route on top; the container's response (which
    /// copies both) gives our Via back to the client's connection, and the response
    /// then has the caller's Via on top, and its body intact.
    #[test]
    fn via_goes_down_and_comes_off_on_the_way_back() {
        let fwd = forward_request(INVITE, Mark::Client(0x2a), "10.0.0.1:5060", "TCP");
        let t = text(&fwd);
        assert!(
            t.starts_with(
                "INVITE sip:svc@10.0.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/TCP 10.0.0.1:5060;branch=z9hG4bK-dsp-c2a-"
            ),
            "{t}"
        );
        assert!(t.contains("Record-Route: <sip:10.0.0.1:5060;transport=tcp;lr;dsp=c2a>\r\n"), "{t}");
        assert!(t.ends_with("\r\n\r\nv=0\n"));
        // The same client branch gives the same branch (a CANCEL matches its INVITE).
        assert_eq!(fwd, forward_request(INVITE, Mark::Client(0x2a), "10.0.0.1:5060", "TCP"));

        // The container's answer: the Vias in order, ours first (here both on one line).
        let our_via = t.lines().nth(1).unwrap().trim_start_matches("Via: ").to_string();
        let resp = format!(
            "SIP/2.0 200 OK\r\nv: {our_via}, SIP/2.0/TCP 10.0.1.2:5061;branch=z9hG4bK-1-0\r\nCall-ID: 1-1@x\r\nContent-Length: 0\r\n\r\n"
        );
        let mut back = resp.into_bytes();
        assert_eq!(pop_our_via(&mut back), Some(Mark::Client(0x2a)));
        assert_eq!(
            text(&back),
            "SIP/2.0 200 OK\r\nv: SIP/2.0/TCP 10.0.1.2:5061;branch=z9hG4bK-1-0\r\nCall-ID: 1-1@x\r\nContent-Length: 0\r\n\r\n"
        );
        // Not ours: left alone.
        let before = back.clone();
        assert!(pop_our_via(&mut back).is_none());
        assert_eq!(back, before);
        // Ours alone on its line: the line goes.
        let mut alone =
            format!("SIP/2.0 200 OK\r\nVia: {our_via}\r\nVia: SIP/2.0/TCP x\r\nContent-Length: 0\r\n\r\n").into_bytes();
        assert_eq!(pop_our_via(&mut alone), Some(Mark::Client(0x2a)));
        assert_eq!(text(&alone), "SIP/2.0 200 OK\r\nVia: SIP/2.0/TCP x\r\nContent-Length: 0\r\n\r\n");
    }

    /// A BYE from the container carries our Record-Route as its top Route: it names the
    /// caller's connection and comes off; the BYE gets a Via naming the container.
    #[test]
    fn a_containers_request_finds_the_callers_connection() {
        let bye = b"BYE sip:a@10.0.1.2:5061 SIP/2.0\r\nVia: SIP/2.0/TCP 10.0.2.1:5060;branch=z9hG4bK-u1\r\n\
Route: <sip:10.0.0.1:5060;transport=tcp;lr;dsp=c7>, <sip:edge;lr>\r\nCall-ID: 1-1@x\r\nContent-Length: 0\r\n\r\n";
        let mut rest = bye.to_vec();
        assert_eq!(pop_our_route(&mut rest), Some(Mark::Client(7)));
        assert!(text(&rest).contains("\r\nRoute: <sip:edge;lr>\r\n"), "{}", text(&rest));
        let fwd = forward_to_caller(&rest, 3, 7, "10.0.0.1:5060", "TLS");
        assert!(text(&fwd).contains("Via: SIP/2.0/TLS 10.0.0.1:5060;branch=z9hG4bK-dsp-u3-"));
        // Only the caller it was sent to can answer it to container 3; a forged mark
        // (no seal, another caller's, another container's) reaches nobody.
        let answered = |req: &[u8]| {
            let t = text(req);
            let via = t.lines().find(|l| l.starts_with("Via:")).unwrap().to_string();
            format!("SIP/2.0 200 OK\r\n{via}\r\nCall-ID: x\r\nCSeq: 1 BYE\r\nContent-Length: 0\r\n\r\n").into_bytes()
        };
        let resp7 = answered(&fwd);
        assert_eq!(sealed_container(&resp7, 7), Some(3));
        assert_eq!(sealed_container(&resp7, 8), None, "another caller");
        let forged = text(&resp7).replacen("dsp-u3-", "dsp-u4-", 1).into_bytes();
        assert_eq!(sealed_container(&forged, 7), None, "another container");
        let unsealed = answered(&forward_request(&rest, Mark::Container(3), "10.0.0.1:5060", "TLS"));
        assert_eq!(sealed_container(&unsealed, 7), None, "no seal");
        assert!(!text(&fwd).contains("Record-Route"), "only a caller's dialog-creating request is record-routed");
        let resp = answer(&fwd, 200, "OK", None);
        assert_eq!(pop_our_via(&mut resp.clone()), Some(Mark::Container(3)));
        // Without our Route: nothing.
        assert!(pop_our_route(&mut rest).is_none());
    }

    #[test]
    fn max_forwards_goes_down_by_one_and_stops_at_zero() {
        let m = b"OPTIONS sip:a SIP/2.0\r\nMax-Forwards:  2\r\nCall-ID: x\r\nContent-Length: 0\r\n\r\n";
        let mut m = m.to_vec();
        assert!(take_hop(&mut m));
        assert_eq!(text(&m), "OPTIONS sip:a SIP/2.0\r\nMax-Forwards: 1\r\nCall-ID: x\r\nContent-Length: 0\r\n\r\n");
        assert!(take_hop(&mut m));
        assert!(!take_hop(&mut m), "0: 483");
        assert!(!take_hop(&mut b"OPTIONS sip:a SIP/2.0\r\nMax-Forwards: x\r\n\r\n".to_vec()));
        let mut absent = INVITE.to_vec();
        assert!(take_hop(&mut absent));
        let first = INVITE.iter().position(|&c| c == b'\n').unwrap() + 1;
        assert_eq!(&absent[first..first + 18], b"Max-Forwards: 69\r\n", "absent: 70 less one added");
        assert_eq!([&absent[..first], &absent[first + 18..]].concat(), INVITE);
        let mut zeros = b"OPTIONS sip:a SIP/2.0\r\nMax-Forwards: 0070\r\n\r\n".to_vec();
        assert!(take_hop(&mut zeros));
        assert_eq!(text(&zeros), "OPTIONS sip:a SIP/2.0\r\nMax-Forwards: 69\r\n\r\n");
        assert!(!take_hop(&mut b"OPTIONS sip:a SIP/2.0\r\nMax-Forwards: +5\r\n\r\n".to_vec()));
        // 10 -> 9: the line gets shorter, the body stays whole.
        let mut ten = b"OPTIONS sip:a SIP/2.0\r\nmax-forwards:10\r\nContent-Length: 2\r\n\r\nab".to_vec();
        assert!(take_hop(&mut ten));
        assert_eq!(text(&ten), "OPTIONS sip:a SIP/2.0\r\nMax-Forwards: 9\r\nContent-Length: 2\r\n\r\nab");
    }

    #[test]
    fn our_answers_copy_the_transaction_headers() {
        let a = text(&answer(INVITE, 503, "Service Unavailable", Some(5)));
        assert!(
            a.starts_with("SIP/2.0 503 Service Unavailable\r\nVia: SIP/2.0/TCP 10.0.1.2:5061;branch=z9hG4bK-1-0\r\n")
        );
        assert!(a.contains("To: <sip:svc@y>;tag=dsp"), "{a}");
        assert!(a.contains("Call-ID: 1-1@x\r\nCSeq: 1 INVITE\r\nRetry-After: 5\r\nContent-Length: 0\r\n\r\n"), "{a}");
    }
}
