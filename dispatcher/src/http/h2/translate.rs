//! RFC 9113 section 8 between an HTTP/2 stream and the proxy, which speaks HTTP/1.1 to
//! the backends: the request's pseudo-header fields become a request line and `Host`
//! (`:authority` wins over a `Host` field), its `cookie` fields one `Cookie` line
//! (8.2.3), its body framed by its `content-length` or chunked, all written once as the
//! head the proxy forwards (its fields' ranges recorded as they are written, not parsed
//! again) and checked by `http1::head::check_request`, the validation every HTTP/1.x
//! head passes: one framing, no CR, LF or NUL in a value, Host syntax, the size and
//! count limits. The `h2` crate has already refused what may not appear in an HTTP/2
//! request (connection-specific fields, `te` other than `trailers`, uppercase names,
//! pseudo-fields out of place, a `content-length` the DATA does not match). The
//! backend's response head, parsed once by the HTTP/1.1 codec, becomes the stream's
//! header map: without the connection-specific fields (8.2.2), with `Via`.

use bytes::{BufMut as _, Bytes, BytesMut};
use http::{header, HeaderMap, HeaderName, HeaderValue, Method};

use crate::http1::{
    head::{check_request, Framing, HeadLimits, Header, Reject, RequestHead, RequestLine, ResponseHead},
    rewrite::{is, VIA},
};

/// A stream's request the proxy will not take, and what the client is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: &'static str,
}

/// A stream's request as the proxy takes it: the HTTP/1.1 head (its bytes, and the head
/// checked, or why it is refused, as for a head an HTTP/1.x client sent), and how its
/// body follows: `None` when the HEADERS frame ended the stream, else its
/// `content-length`, else chunked.
pub fn request(
    parts: &http::request::Parts,
    end_stream: bool,
    limits: &HeadLimits,
) -> Result<(BytesMut, Result<RequestHead, Reject>, Framing), Refusal> {
    if parts.method == Method::CONNECT {
        return Err(Refusal { status: 501, reason: "CONNECT is not supported" });
    }
    let target = match parts.uri.path_and_query() {
        Some(p) if !p.as_str().is_empty() => p.as_str(),
        _ => return Err(Refusal { status: 400, reason: "the request has no :path" }),
    };
    // More than one Host is refused as over HTTP/1.1 (which one would the backend see?);
    // with :authority, that wins and Host is not sent (as for an absolute-form target).
    let mut hosts = parts.headers.get_all(header::HOST).iter();
    let (first_host, second_host) = (hosts.next(), hosts.next());
    if second_host.is_some() {
        return Err(Refusal { status: 400, reason: "more than one Host" });
    }
    let host = match (parts.uri.authority(), first_host) {
        (Some(a), _) => a.as_str().as_bytes(),
        (None, Some(h)) => h.as_bytes(),
        (None, None) => return Err(Refusal { status: 400, reason: "the request has neither :authority nor Host" }),
    };
    let length = match parts.headers.get(header::CONTENT_LENGTH) {
        // 1*DIGIT (RFC 9110 8.6): no sign, no list.
        Some(v) if !(1..=18).contains(&v.len()) || !v.as_bytes().iter().all(u8::is_ascii_digit) => {
            return Err(Refusal { status: 400, reason: "malformed content-length" })
        }
        Some(v) => match std::str::from_utf8(v.as_bytes()).ok().and_then(|v| v.parse::<u64>().ok()) {
            Some(n) => Some(n),
            None => return Err(Refusal { status: 400, reason: "malformed content-length" }),
        },
        None => None,
    };
    if parts.headers.get_all(header::CONTENT_LENGTH).iter().nth(1).is_some() {
        return Err(Refusal { status: 400, reason: "more than one content-length" });
    }
    let framing = match (end_stream, length) {
        (true, Some(n)) if n > 0 => return Err(Refusal { status: 400, reason: "content-length without DATA" }),
        (true, _) => Framing::None,
        (false, Some(n)) => Framing::Length(n),
        (false, None) => Framing::Chunked,
    };
    let size: usize = parts.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
    let mut w = Writer {
        out: BytesMut::with_capacity(size + target.len() + host.len() + 64),
        headers: Vec::with_capacity(parts.headers.len() + 2),
    };
    let method = w.put(parts.method.as_str().as_bytes());
    w.out.put_u8(b' ');
    let target = w.put(target.as_bytes());
    w.out.put_slice(b" HTTP/1.1\r\n");
    w.field(b"Host", [host]);
    if parts.headers.contains_key(header::COOKIE) {
        w.field(b"Cookie", parts.headers.get_all(header::COOKIE).iter().map(HeaderValue::as_bytes));
    }
    for (name, value) in &parts.headers {
        // Host and Cookie are written above, the framing below; `te: trailers` is
        // hop-by-hop.
        if [header::HOST, header::COOKIE, header::CONTENT_LENGTH, header::TE].contains(name) {
            continue;
        }
        w.field(name.as_str().as_bytes(), [value.as_bytes()]);
    }
    match framing {
        Framing::Length(n) => w.field(b"Content-Length", [n.to_string().as_bytes()]),
        Framing::Chunked => w.field(b"Transfer-Encoding", [b"chunked".as_slice()]),
        // A method whose body means something, sent without one: said, as an HTTP/1.1
        // client says it (RFC 9110 8.6).
        _ if [Method::POST, Method::PUT, Method::PATCH].contains(&parts.method) => {
            w.field(b"Content-Length", [b"0".as_slice()])
        }
        _ => {}
    }
    w.out.put_slice(b"\r\n");
    let line = RequestLine { method, target, minor: 1 };
    let head = check_request(&w.out, w.out.len(), line, w.headers, limits);
    Ok((w.out, head, framing))
}

/// A head being written, and the ranges of its fields.
struct Writer {
    out: BytesMut,
    headers: Vec<Header>,
}

impl Writer {
    fn put(&mut self, bytes: &[u8]) -> std::ops::Range<usize> {
        let start = self.out.len();
        self.out.put_slice(bytes);
        start..self.out.len()
    }

    /// `name: value` CRLF, the value the concatenation of `parts` joined with `; ` (the
    /// cookie fields), its range without leading and trailing spaces and tabs (as a
    /// parser reads an HTTP/1.1 field).
    fn field<'v>(&mut self, name: &[u8], parts: impl IntoIterator<Item = &'v [u8]>) {
        let name = self.put(name);
        self.out.put_slice(b": ");
        let start = self.out.len();
        for (i, p) in parts.into_iter().enumerate() {
            if i > 0 {
                self.out.put_slice(b"; ");
            }
            self.out.put_slice(p);
        }
        let value = &self.out[start..];
        let lead = value.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
        let trail = value[lead..].iter().rev().take_while(|&&b| b == b' ' || b == b'\t').count();
        let value = start + lead..self.out.len() - trail;
        self.out.put_slice(b"\r\n");
        self.headers.push(Header { name, value });
    }
}

/// The fields of the backend's response head (`buf` holds it) as the stream sends them:
/// those an HTTP/1.1 client gets (`rewrite::response_fields`: no hop-by-hop fields, `Via`
/// with ours), without `transfer-encoding` (8.2.2). The values share `buf`.
pub fn response_fields(res: &ResponseHead, buf: &Bytes) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(res.headers.len() + 1);
    let via = crate::http1::rewrite::response_fields(res, buf, true, |h| {
        // The parser has checked names and values already; what `http` still refuses
        // (never seen) is dropped rather than sent.
        let name = HeaderName::from_bytes(&buf[h.name.clone()]);
        if let (Ok(n), Ok(v)) = (name, HeaderValue::from_maybe_shared(buf.slice(h.value.clone()))) {
            map.append(n, unindexed(v));
        }
    });
    // No length on a response that has no content (RFC 9110 8.6): HTTP/2 clients refuse
    // a 1xx or 204 that says one.
    if (100..200).contains(&res.status) || res.status == 204 {
        map.remove(header::CONTENT_LENGTH);
    }
    if via.is_empty() {
        // The usual case: ours alone, without an allocation.
        map.append(header::VIA, unindexed(HeaderValue::from_static(VIA)));
        return map;
    }
    let mut v = Vec::with_capacity(via.iter().map(|e| e.len() + 2).sum::<usize>() + VIA.len());
    for e in via {
        v.extend_from_slice(e);
        v.extend_from_slice(b", ");
    }
    v.extend_from_slice(VIA.as_bytes());
    if let Ok(v) = HeaderValue::from_maybe_shared(Bytes::from(v)) {
        map.append(header::VIA, unindexed(v));
    }
    map
}

/// A response field the HPACK encoder sends as a literal, never into its dynamic table
/// (as HAProxy's encoder does with every field): the table would keep each connection's
/// last response heads (and the buffer they share) for as long as it stays open, and
/// inserting and evicting entries costs time on every response; what it would save is
/// a few dozen bytes per response on the wire. Static-table names stay indexed.
fn unindexed(mut v: HeaderValue) -> HeaderValue {
    v.set_sensitive(true);
    v
}

/// Fields that describe an HTTP/1.1 connection, never sent in HTTP/2 (RFC 9113 8.2.2).
fn connection_specific(name: &[u8]) -> bool {
    ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"].iter().any(|f| is(name, f))
}

/// Trailer lines (`name: value` CRLF, as the chunked decoder keeps them) as HTTP/2
/// trailers.
pub fn trailer_fields(lines: &[u8]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for line in lines.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        let value = line[colon + 1..].trim_ascii();
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(value)) {
            if !connection_specific(n.as_str().as_bytes()) {
                map.append(n, v);
            }
        }
    }
    map
}

/// HTTP/2 trailers as a chunked body's last chunk and trailer section.
pub fn last_chunk(trailers: Option<&HeaderMap>) -> Vec<u8> {
    let mut out = b"0\r\n".to_vec();
    for (name, value) in trailers.into_iter().flatten() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::head::parse_request;

    fn parts(method: &str, uri: &str, fields: &[(&str, &str)]) -> http::request::Parts {
        let mut b = http::Request::builder().method(method).uri(uri);
        for (n, v) in fields {
            b = b.header(*n, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn text(head: &[u8]) -> &str {
        std::str::from_utf8(head).unwrap()
    }

    /// The head of a request translated: its bytes, the head checked, the body's framing.
    fn translated(p: &http::request::Parts, end: bool) -> (String, Result<RequestHead, Reject>, Framing) {
        let (buf, head, framing) = request(p, end, &HeadLimits::default()).unwrap();
        (text(&buf).to_string(), head, framing)
    }

    #[test]
    fn cookies_are_joined_authority_wins_and_the_head_is_what_a_parser_makes_of_it() {
        let p = parts(
            "GET",
            "https://shop.example:8443/cart?x=1",
            &[("cookie", "a=1"), ("host", "other.example"), ("cookie", "JSESSIONID=0000s:c1"), ("accept", "*/*")],
        );
        let (buf, head, framing) = translated(&p, true);
        assert_eq!(framing, Framing::None);
        assert_eq!(
            buf,
            "GET /cart?x=1 HTTP/1.1\r\nHost: shop.example:8443\r\nCookie: a=1; JSESSIONID=0000s:c1\r\naccept: */*\r\n\r\n"
        );
        // The ranges written are those the HTTP/1.1 parser finds in the same bytes.
        let head = head.unwrap();
        let parsed = parse_request(buf.as_bytes(), &HeadLimits::default(), &mut Vec::new()).unwrap().unwrap();
        assert_eq!(
            (head.len, head.method.clone(), head.target.clone()),
            (parsed.len, parsed.method.clone(), parsed.target.clone())
        );
        assert_eq!((head.path.clone(), head.authority.clone()), (parsed.path.clone(), parsed.authority.clone()));
        let fields = |h: &RequestHead| h.headers.iter().map(|f| (f.name.clone(), f.value.clone())).collect::<Vec<_>>();
        assert_eq!(fields(&head), fields(&parsed));
        assert_eq!((head.framing, head.keep_alive, head.is_head), (Framing::None, true, false));
    }

    #[test]
    fn the_body_is_framed_by_its_length_or_chunked() {
        let (buf, head, framing) = translated(&parts("POST", "https://a/x", &[("content-length", "5")]), false);
        assert_eq!((framing, head.unwrap().framing), (Framing::Length(5), Framing::Length(5)));
        assert!(buf.ends_with("Content-Length: 5\r\n\r\n"), "{buf}");
        let (buf, head, framing) = translated(&parts("POST", "https://a/x", &[]), false);
        assert_eq!((framing, head.unwrap().framing), (Framing::Chunked, Framing::Chunked));
        assert!(buf.ends_with("Transfer-Encoding: chunked\r\n\r\n"));
        // An empty POST says so; a GET says nothing.
        let (buf, _, _) = translated(&parts("POST", "https://a/x", &[]), true);
        assert!(buf.ends_with("Content-Length: 0\r\n\r\n"));
        let (buf, _, _) = translated(&parts("GET", "https://a/x", &[("te", "trailers")]), true);
        assert_eq!(buf, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
    }

    #[test]
    fn what_cannot_be_translated_is_refused() {
        let refused = |p: http::request::Parts, end| request(&p, end, &HeadLimits::default()).unwrap_err().status;
        assert_eq!(refused(parts("CONNECT", "a:443", &[]), true), 501);
        assert_eq!(refused(parts("GET", "/x", &[]), true), 400);
        assert_eq!(refused(parts("POST", "https://a/x", &[("content-length", "5")]), true), 400);
        assert_eq!(refused(parts("POST", "https://a/x", &[("content-length", "+5")]), false), 400);
        let two = parts("POST", "https://a/x", &[("content-length", "5"), ("content-length", "5")]);
        assert_eq!(refused(two, false), 400);
        assert_eq!(refused(parts("GET", "/x", &[("host", "b"), ("host", "c")]), true), 400);
        // Without :authority, Host names the origin.
        let (buf, head, _) = translated(&parts("GET", "/x", &[("host", "b:81")]), true);
        assert!(buf.starts_with("GET /x HTTP/1.1\r\nHost: b:81\r\n"));
        assert!(head.is_ok());
    }

    /// What the HTTP/1.1 head checks refuse, they refuse in a translated head too: a
    /// Host that is no authority, more fields or
    /// bytes than the limits, an `Expect` other than 100-continue.
    #[test]
    fn the_head_checks_of_http1_apply_to_translated_heads() {
        let check = |p: http::request::Parts, limits: &HeadLimits| request(&p, true, limits).unwrap().1.map(|_| ());
        let d = HeadLimits::default();
        let reason = |r: Result<(), Reject>| r.unwrap_err().reason;
        assert_eq!(reason(check(parts("GET", "/x", &[("host", "a b")]), &d)), "Host is not a valid authority");
        let few = HeadLimits { max_headers: 2, ..d };
        assert_eq!(check(parts("GET", "https://a/x", &[("x", "1"), ("y", "2")]), &few).unwrap_err().status, 431);
        let small = HeadLimits { max_bytes: 40, ..d };
        assert_eq!(check(parts("GET", "https://a/x", &[("x", &"y".repeat(40))]), &small).unwrap_err().status, 431);
        assert_eq!(check(parts("GET", "https://a/x", &[("expect", "nothing")]), &d).unwrap_err().status, 417);
        // Spaces around a value are not part of it (as a parser reads an HTTP/1.1 field).
        let (buf, head, _) = translated(&parts("GET", "https://a/x", &[("x-a", " v ")]), true);
        let head = head.unwrap();
        assert_eq!(&buf.as_bytes()[head.headers[1].value.clone()], b"v");
    }

    #[test]
    fn connection_fields_are_dropped_from_responses_via_added_and_trailers_go_both_ways() {
        let buf = Bytes::from_static(b"HTTP/1.1 200 OK\r\nConnection: close, x-hop\r\nKeep-Alive: t=5\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\nVia: 1.1 app\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n");
        let res = fake_response(&buf);
        let map = response_fields(&res, &buf);
        let names: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["set-cookie", "via"]);
        assert_eq!(map.get_all("set-cookie").iter().count(), 2);
        assert_eq!(map.get("via").unwrap(), "1.1 app, 1.1 dispatcher");
        // Sent as literals, never into the HPACK encoder's dynamic table.
        assert!(map.values().all(HeaderValue::is_sensitive));
        // No length on a response without content.
        let no_content = Bytes::from_static(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n");
        let mut res = fake_response(&no_content);
        for (status, kept) in [(204, false), (103, false), (200, true)] {
            res.status = status;
            assert_eq!(response_fields(&res, &no_content).contains_key("content-length"), kept, "{status}");
        }
        let plain = Bytes::from_static(b"HTTP/1.1 204 No Content\r\nServer: app\r\n\r\n");
        let map = response_fields(&fake_response(&plain), &plain);
        assert_eq!(map.get("via").unwrap(), VIA);
        assert!(map.values().all(HeaderValue::is_sensitive));

        let t = trailer_fields(b"grpc-status: 0\r\nx-sum:  abc \r\nte: trailers\r\n");
        assert_eq!(t.get("grpc-status").unwrap(), "0");
        assert_eq!(t.get("x-sum").unwrap(), "abc");
        assert!(t.get("te").is_none());
        assert_eq!(last_chunk(Some(&t)), b"0\r\ngrpc-status: 0\r\nx-sum: abc\r\n\r\n");
        assert_eq!(last_chunk(None), b"0\r\n\r\n");
    }

    /// A head with both framings, which the parser rightly refuses: its fields as a
    /// parsed head would carry them, for the field filter alone.
    fn fake_response(buf: &[u8]) -> ResponseHead {
        let text = std::str::from_utf8(buf).unwrap();
        let mut headers = Vec::new();
        let mut at = text.find("\r\n").unwrap() + 2;
        for line in text[at..].split("\r\n").take_while(|l| !l.is_empty()) {
            let colon = line.find(':').unwrap();
            let value_at = at + colon + 1 + (line[colon + 1..].len() - line[colon + 1..].trim_start().len());
            headers.push(crate::http1::head::Header { name: at..at + colon, value: value_at..at + line.len() });
            at += line.len() + 2;
        }
        ResponseHead { len: buf.len(), status: 200, reason: 0..0, headers, framing: Framing::Chunked, close: false }
    }
}
