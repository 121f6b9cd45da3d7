//! Heads as they leave the proxy: hop-by-hop fields removed (RFC 9110 7.6.1), the
//! forwarding fields added, the version normalised to HTTP/1.1.

use std::{io::Write as _, net::IpAddr};

use super::head::{framing_field, tokens, Header, RequestHead, ResponseHead};

/// The `Via` element of the responses this proxy relays.
pub const VIA: &str = "1.1 dispatcher";

/// This process's name in the `Via` of the requests it forwards: a pseudonym (RFC 9110
/// 7.6.3) with the instance and a random part, `dispatcher-<instance>-<16 hex digits>`,
/// the same for all its generations (a reload keeps it). A request that arrives with it
/// has been here before: a loop (`looped`). Two dispatchers with the same instance name
/// (on two hosts) have different markers, so a chain of dispatchers is not a loop.
static MARKER: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Names this process's marker after its instance (at start, before any request).
pub fn init_marker(instance: &str) {
    let _ = MARKER.set(new_marker(instance));
}

fn new_marker(instance: &str) -> String {
    use std::hash::BuildHasher;
    // `RandomState` is keyed from the OS's random source once per process.
    let random = std::collections::hash_map::RandomState::new().hash_one((std::process::id(), instance));
    format!("dispatcher-{instance}-{random:016x}")
}

pub fn marker() -> &'static str {
    MARKER.get_or_init(|| new_marker("default"))
}

/// Whether one of the request's `Via` elements was received by this process (its
/// marker as the element's received-by): the request has passed through here already.
/// One pass over the `Via` values; nothing when there is none.
pub fn looped(head: &RequestHead, buf: &[u8]) -> bool {
    let ours = marker().as_bytes();
    head.headers.iter().filter(|h| is(&buf[h.name.clone()], "via")).any(|h| {
        buf[h.value.clone()].split(|&b| b == b',').any(|element| {
            // `protocol received-by [comment]`
            let mut words = element.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty());
            words.next().is_some() && words.next() == Some(ours)
        })
    })
}

pub fn is(name: &[u8], what: &str) -> bool {
    name.eq_ignore_ascii_case(what.as_bytes())
}

/// Hop-by-hop fields (RFC 9110 7.6.1), never forwarded as they are.
fn hop_by_hop(name: &[u8]) -> bool {
    ["connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"].iter().any(|h| is(name, h))
}

/// Field names listed in the `Connection` headers (also hop-by-hop). Framing fields and
/// Host are never among them: the head parser refuses such a message, and removal here
/// would change where the message ends or whom it is for.
fn connection_listed<'a>(buf: &'a [u8], headers: &[Header]) -> Vec<&'a [u8]> {
    headers
        .iter()
        .filter(|h| is(&buf[h.name.clone()], "connection"))
        .flat_map(|h| tokens(&buf[h.value.clone()]))
        .filter(|t| !framing_field(t))
        .collect()
}

fn write_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The request head as it goes upstream: HTTP/1.1, origin-form target, hop-by-hop fields
/// removed, `X-Forwarded-For` appended, `forwarded` (the VIP's `X-Forwarded-Proto` and
/// `X-Forwarded-Port` lines, replacing the client's) and `Via` appended with this
/// process's marker (`marker`).
///
/// Host: an absolute-form target's authority replaces any Host (RFC 9112 3.2.2); an
/// HTTP/1.0 request without Host gets `vip_host` (the VIP's authority).
pub fn build_request(
    out: &mut Vec<u8>,
    head: &RequestHead,
    buf: &[u8],
    client: IpAddr,
    vip_host: &str,
    forwarded: &[u8],
) {
    out.clear();
    // The head as it came, plus what is added (Host, X-Forwarded-*, Via): one allocation
    // for a new buffer (an HTTP/2 stream's) rather than one per doubling.
    out.reserve(head.len + vip_host.len() + forwarded.len() + 128);
    out.extend_from_slice(&buf[head.method.clone()]);
    out.push(b' ');
    // An absolute-form target without a path (`http://a`, `http://a?q`) has the path `/`.
    if head.path.is_empty() || buf[head.path.start] == b'?' {
        out.push(b'/');
    }
    out.extend_from_slice(&buf[head.path.clone()]);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    if let Some(a) = &head.authority {
        write_header(out, b"Host", &buf[a.clone()]);
    }
    let listed = connection_listed(buf, &head.headers);
    let mut xff: Vec<&[u8]> = Vec::new();
    let mut via: Vec<&[u8]> = Vec::new();
    let mut has_host = false;
    for h in &head.headers {
        let (name, value) = (&buf[h.name.clone()], &buf[h.value.clone()]);
        if is(name, "x-forwarded-for") {
            xff.push(value);
        } else if is(name, "via") {
            via.push(value);
        } else if is(name, "upgrade") && head.upgrade {
            // Listed in `Connection`, but the one hop-by-hop field a tunnel must carry.
            write_header(out, name, value);
        } else if is(name, "x-forwarded-proto")
            || is(name, "x-forwarded-port")
            || websphere_private(name)
            || listed.iter().any(|l| name.eq_ignore_ascii_case(l))
        {
        } else if is(name, "host") {
            if head.authority.is_none() {
                has_host = true;
                write_header(out, name, value);
            }
        } else if !hop_by_hop(name) {
            write_header(out, name, value);
        }
    }
    if !has_host && head.authority.is_none() {
        // An HTTP/1.0 request may come without Host; the hop upstream is HTTP/1.1.
        write_header(out, b"Host", vip_host.as_bytes());
    }
    write_list(out, b"X-Forwarded-For", &xff, format_args!("{client}"));
    out.extend_from_slice(forwarded);
    // The client's address as the WebSphere plug-in gives it to the web container
    // (`getRemoteAddr`, `getRemoteHost`).
    let _ = write!(out, "$WSRA: {client}\r\n$WSRH: {client}\r\n");
    write_list(out, b"Via", &via, format_args!("1.1 {}", marker()));
    if head.upgrade {
        out.extend_from_slice(b"Connection: upgrade\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The `X-Forwarded-Proto` and `X-Forwarded-Port` lines of a VIP's forwarded requests,
/// and the WebSphere plug-in's private headers that say the same to a web container:
/// `$WSSC` (scheme), `$WSIS` (secure) and `$WSSP` (port), so that an application behind
/// an HTTPS VIP sees `isSecure()` and `https` as behind the plug-in.
pub fn forwarded_fields(tls: bool, port: u16) -> Vec<u8> {
    let scheme = if tls { "https" } else { "http" };
    format!(
        "X-Forwarded-Proto: {scheme}\r\nX-Forwarded-Port: {port}\r\n$WSSC: {scheme}\r\n$WSIS: {tls}\r\n$WSSP: {port}\r\n"
    )
    .into_bytes()
}

/// A WebSphere private header (`$WS...`): the web container trusts them from the plug-in
/// (client address, scheme, client certificate, user), so one a client sends is never
/// passed on, as the plug-in removes them (`RemoveSpecialHeaders`, on by default).
fn websphere_private(name: &[u8]) -> bool {
    name.len() >= 3 && name[..3].eq_ignore_ascii_case(b"$ws")
}

/// The response head as it goes to the client.
/// `close`: the client connection ends after this response; an HTTP/1.0 client that
/// keeps it must be told so explicitly (`http10`).
pub fn build_response(out: &mut Vec<u8>, res: &ResponseHead, buf: &[u8], close: bool, dechunk: bool, http10: bool) {
    out.clear();
    let _ = std::io::Write::write_fmt(out, format_args!("HTTP/1.1 {} ", res.status));
    out.extend_from_slice(&buf[res.reason.clone()]);
    out.extend_from_slice(b"\r\n");
    let via = response_fields(res, buf, dechunk, |h| write_header(out, &buf[h.name.clone()], &buf[h.value.clone()]));
    write_list(out, b"Via", &via, format_args!("{VIA}"));
    if res.status == 101 {
        out.extend_from_slice(b"Connection: upgrade\r\n");
    } else if close {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if http10 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The fields of a response head (in `buf`) that go to the client, whatever its
/// protocol, each given to `each`: not the hop-by-hop ones nor those its `Connection`
/// names (`Upgrade` stays on a 101), nor `Transfer-Encoding` when the body is
/// de-chunked. `Via` is not among them: its values are returned, for a `Via` that ends
/// with ours (`VIA`).
pub fn response_fields<'b>(
    res: &ResponseHead,
    buf: &'b [u8],
    dechunk: bool,
    mut each: impl FnMut(&Header),
) -> Vec<&'b [u8]> {
    let listed = connection_listed(buf, &res.headers);
    let mut via: Vec<&[u8]> = Vec::new();
    for h in &res.headers {
        let (name, value) = (&buf[h.name.clone()], &buf[h.value.clone()]);
        if is(name, "via") {
            via.push(value);
        } else if is(name, "upgrade") && res.status == 101 {
            each(h);
        } else if listed.iter().any(|l| name.eq_ignore_ascii_case(l)) || (dechunk && is(name, "transfer-encoding")) {
        } else if !hop_by_hop(name) {
            each(h);
        }
    }
    via
}

/// `Name: earlier values, ours` — one field carrying the list (X-Forwarded-For, Via).
fn write_list(out: &mut Vec<u8>, name: &[u8], earlier: &[&[u8]], ours: std::fmt::Arguments) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    for v in earlier {
        out.extend_from_slice(v);
        out.extend_from_slice(b", ");
    }
    let _ = std::io::Write::write_fmt(out, ours);
    out.extend_from_slice(b"\r\n");
}

/// The authority a request without Host is given: the VIP's address (IPv6 in brackets)
/// and its port unless it is 80.
pub fn vip_authority(addr: std::net::SocketAddr) -> String {
    match (addr.ip(), addr.port()) {
        (IpAddr::V4(a), 80) => a.to_string(),
        (IpAddr::V6(a), 80) => format!("[{a}]"),
        _ => addr.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::head::{parse_request, HeadLimits};

    fn forwarded(text: &str, vip: &str) -> String {
        let h = parse_request(text.as_bytes(), &HeadLimits::default(), &mut Vec::new()).unwrap().unwrap();
        let mut out = Vec::new();
        build_request(&mut out, &h, text.as_bytes(), "192.0.2.1".parse().unwrap(), vip, &forwarded_fields(false, 80));
        String::from_utf8(out).unwrap()
    }

    /// RFC 9112 3.2.2: the absolute-form target's authority wins; one Host, origin-form.
    #[test]
    fn an_absolute_target_replaces_host() {
        let out = forwarded("GET http://a.example/p?x HTTP/1.1\r\nHost: b.example\r\n\r\n", "10.0.0.1");
        assert!(out.starts_with("GET /p?x HTTP/1.1\r\nHost: a.example\r\n"), "{out}");
        assert_eq!(out.matches("Host:").count(), 1, "{out}");
        assert!(!out.contains("b.example"), "{out}");
        let out = forwarded("OPTIONS http://a.example HTTP/1.1\r\nHost: a.example\r\n\r\n", "10.0.0.1");
        assert!(out.starts_with("OPTIONS / HTTP/1.1\r\n"), "{out}");
        let out = forwarded("GET http://a.example?q=1 HTTP/1.1\r\nHost: a.example\r\n\r\n", "10.0.0.1");
        assert!(out.starts_with("GET /?q=1 HTTP/1.1\r\n"), "{out}");
    }

    #[test]
    fn our_via_marker_is_a_loop_and_others_are_not() {
        let out = forwarded("GET / HTTP/1.1\r\nHost: a\r\nVia: 1.0 fred, 1.1 p.example (Apache/1.1)\r\n\r\n", "v");
        let ours = format!("Via: 1.0 fred, 1.1 p.example (Apache/1.1), 1.1 {}\r\n", marker());
        assert!(out.contains(&ours), "{out}");
        let parse = |t: &str| parse_request(t.as_bytes(), &HeadLimits::default(), &mut Vec::new()).unwrap().unwrap();
        // What went upstream, coming back: a loop.
        assert!(looped(&parse(&out), out.as_bytes()));
        for t in [
            "GET / HTTP/1.1\r\nHost: a\r\n\r\n".to_string(),
            "GET / HTTP/1.1\r\nHost: a\r\nVia: 1.1 dispatcher\r\n\r\n".to_string(),
            // Another dispatcher with the same instance name has another random part.
            format!("GET / HTTP/1.1\r\nHost: a\r\nVia: 1.1 {}\r\n\r\n", new_marker("default")),
            format!("GET / HTTP/1.1\r\nHost: a\r\nVia: 1.1 {}x\r\n\r\n", marker()),
        ] {
            assert!(!looped(&parse(&t), t.as_bytes()), "{t}");
        }
        let t = format!("GET / HTTP/1.1\r\nHost: a\r\nVia: 1.0 a\r\nVia: HTTP/1.1   {} (x),1.0 b\r\n\r\n", marker());
        assert!(looped(&parse(&t), t.as_bytes()), "{t}");
    }

    /// A client's WebSphere private headers never reach the web container (it trusts
    /// them: client address, scheme, certificate, user); ours say what the plug-in would.
    #[test]
    fn websphere_private_headers_are_the_dispatchers_own() {
        let out = forwarded(
            "GET / HTTP/1.1\r\nHost: a\r\n$WSRA: 10.6.6.6\r\n$wsis: true\r\n$WSCC: forged\r\n$WSRU: admin\r\nX-Ok: 1\r\n\r\n",
            "v",
        );
        for forged in ["10.6.6.6", "forged", "admin", "$wsis"] {
            assert!(!out.contains(forged), "{forged}: {out}");
        }
        assert!(out.contains("\r\nX-Ok: 1\r\n"), "{out}");
        for ours in
            ["$WSRA: 192.0.2.1\r\n", "$WSRH: 192.0.2.1\r\n", "$WSSC: http\r\n", "$WSIS: false\r\n", "$WSSP: 80\r\n"]
        {
            assert_eq!(out.matches(ours).count(), 1, "{ours}: {out}");
        }
        // Every line is still a field an HTTP/1.1 parser takes.
        assert!(parse_request(out.as_bytes(), &HeadLimits::default(), &mut Vec::new()).unwrap().is_some());
        assert!(String::from_utf8(forwarded_fields(true, 443)).unwrap().contains("$WSSC: https\r\n$WSIS: true\r\n"));
    }

    #[test]
    fn an_http10_request_without_host_gets_the_vips_authority() {
        let v6: std::net::SocketAddr = "[fd00::5]:8080".parse().unwrap();
        assert_eq!(vip_authority(v6), "[fd00::5]:8080");
        assert_eq!(vip_authority("[fd00::5]:80".parse().unwrap()), "[fd00::5]");
        assert_eq!(vip_authority("10.0.0.1:80".parse().unwrap()), "10.0.0.1");
        assert_eq!(vip_authority("10.0.0.1:8080".parse().unwrap()), "10.0.0.1:8080");
        let out = forwarded("GET / HTTP/1.0\r\n\r\n", &vip_authority(v6));
        assert!(out.contains("\r\nHost: [fd00::5]:8080\r\n"), "{out}");
    }
}
