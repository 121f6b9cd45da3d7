//! RFC 9113 section 8 between an HTTP/2 stream and the HTTP/1.1 exchange the proxy
//! serves: the request's pseudo-header fields become a request line and `Host`
//! (`:authority` wins over a `Host` field), its `cookie` fields one `Cookie` line
//! (8.2.3), its body framed by its `content-length` or chunked; the response head's
//! connection-specific fields are dropped (8.2.2). The `h2` crate has already refused
//! what may not appear in an HTTP/2 request (connection-specific fields, `te` other than
//! `trailers`, uppercase names, pseudo-fields out of place, a `content-length` the DATA
//! does not match); the head built here is then parsed by the HTTP/1.1 parser like any
//! other, so every rule it enforces (one framing, no CR, LF or NUL in a value, Host
//! syntax, the size and count limits) applies to translated requests too.

use http::{header, HeaderMap, HeaderName, HeaderValue, Method};

use crate::http1::{
    head::{Framing, ResponseHead},
    rewrite::is,
};

/// A stream's request the proxy will not take, and what the client is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub reason: &'static str,
}

/// The HTTP/1.1 head of an HTTP/2 request, and how its body follows: `None` when the
/// HEADERS frame ended the stream, else its `content-length`, else chunked.
pub fn request_head(parts: &http::request::Parts, end_stream: bool) -> Result<(Vec<u8>, Framing), Refusal> {
    if parts.method == Method::CONNECT {
        return Err(Refusal { status: 501, reason: "CONNECT is not supported" });
    }
    let target = match parts.uri.path_and_query() {
        Some(p) if !p.as_str().is_empty() => p.as_str(),
        _ => return Err(Refusal { status: 400, reason: "the request has no :path" }),
    };
    let host = match parts.uri.authority() {
        Some(a) => a.as_str().as_bytes(),
        None => match parts.headers.get(header::HOST) {
            Some(h) => h.as_bytes(),
            None => return Err(Refusal { status: 400, reason: "the request has neither :authority nor Host" }),
        },
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
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\n");
    let mut cookies = parts.headers.get_all(header::COOKIE).iter();
    if let Some(first) = cookies.next() {
        out.extend_from_slice(b"Cookie: ");
        out.extend_from_slice(first.as_bytes());
        for c in cookies {
            out.extend_from_slice(b"; ");
            out.extend_from_slice(c.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in &parts.headers {
        // Host and Cookie are written above, the framing below; `te: trailers` is
        // hop-by-hop.
        if [header::HOST, header::COOKIE, header::CONTENT_LENGTH, header::TE].contains(name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Length(n) => out.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes()),
        Framing::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        // A method whose body means something, sent without one: said, as an HTTP/1.1
        // client says it (RFC 9110 8.6).
        _ if [Method::POST, Method::PUT, Method::PATCH].contains(&parts.method) => {
            out.extend_from_slice(b"Content-Length: 0\r\n")
        }
        _ => {}
    }
    out.extend_from_slice(b"\r\n");
    Ok((out, framing))
}

/// Fields that describe an HTTP/1.1 connection, never sent in HTTP/2 (RFC 9113 8.2.2).
fn connection_specific(name: &[u8]) -> bool {
    ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"].iter().any(|f| is(name, f))
}

/// The fields of a response head (`buf` holds it) as HTTP/2 sends them: without the
/// connection-specific ones and those its `Connection` names, `content-length` only
/// when the body is framed by it (or the response has no body by its status or method).
pub fn response_fields(res: &ResponseHead, buf: &[u8]) -> HeaderMap {
    let named: Vec<&[u8]> = res
        .headers
        .iter()
        .filter(|h| is(&buf[h.name.clone()], "connection"))
        .flat_map(|h| crate::http1::head::tokens(&buf[h.value.clone()]))
        .collect();
    let mut map = HeaderMap::with_capacity(res.headers.len());
    for h in &res.headers {
        let name = &buf[h.name.clone()];
        if connection_specific(name) || named.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            continue;
        }
        if is(name, "content-length") && res.framing == Framing::Chunked {
            continue;
        }
        // The parser has checked names and values already; what `http` still refuses
        // (never seen) is dropped rather than sent.
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(&buf[h.value.clone()])) {
            map.append(n, v);
        }
    }
    map
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
    use crate::http1::head::{parse_request, HeadLimits};

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

    #[test]
    fn cookies_are_joined_authority_wins_and_the_head_parses() {
        let p = parts(
            "GET",
            "https://shop.example:8443/cart?x=1",
            &[("cookie", "a=1"), ("host", "other.example"), ("cookie", "JSESSIONID=0000s:c1"), ("accept", "*/*")],
        );
        let (head, framing) = request_head(&p, true).unwrap();
        assert_eq!(framing, Framing::None);
        assert_eq!(
            text(&head),
            "GET /cart?x=1 HTTP/1.1\r\nHost: shop.example:8443\r\nCookie: a=1; JSESSIONID=0000s:c1\r\naccept: */*\r\n\r\n"
        );
        let parsed = parse_request(&head, &HeadLimits::default(), &mut Vec::new()).unwrap().unwrap();
        assert_eq!(parsed.len, head.len());
    }

    #[test]
    fn the_body_is_framed_by_its_length_or_chunked() {
        let (head, framing) = request_head(&parts("POST", "https://a/x", &[("content-length", "5")]), false).unwrap();
        assert_eq!(framing, Framing::Length(5));
        assert!(text(&head).ends_with("Content-Length: 5\r\n\r\n"), "{}", text(&head));
        let (head, framing) = request_head(&parts("POST", "https://a/x", &[]), false).unwrap();
        assert_eq!(framing, Framing::Chunked);
        assert!(text(&head).ends_with("Transfer-Encoding: chunked\r\n\r\n"));
        // An empty POST says so; a GET says nothing.
        let (head, _) = request_head(&parts("POST", "https://a/x", &[]), true).unwrap();
        assert!(text(&head).ends_with("Content-Length: 0\r\n\r\n"));
        let (head, _) = request_head(&parts("GET", "https://a/x", &[("te", "trailers")]), true).unwrap();
        assert_eq!(text(&head), "GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
    }

    #[test]
    fn what_cannot_be_translated_is_refused() {
        let refused = |p: http::request::Parts, end| request_head(&p, end).unwrap_err().status;
        assert_eq!(refused(parts("CONNECT", "a:443", &[]), true), 501);
        assert_eq!(refused(parts("GET", "/x", &[]), true), 400);
        assert_eq!(refused(parts("POST", "https://a/x", &[("content-length", "5")]), true), 400);
        assert_eq!(refused(parts("POST", "https://a/x", &[("content-length", "+5")]), false), 400);
        let two = parts("POST", "https://a/x", &[("content-length", "5"), ("content-length", "5")]);
        assert_eq!(refused(two, false), 400);
        // Without :authority, Host names the origin.
        let (head, _) = request_head(&parts("GET", "/x", &[("host", "b:81")]), true).unwrap();
        assert!(text(&head).starts_with("GET /x HTTP/1.1\r\nHost: b:81\r\n"));
    }

    #[test]
    fn connection_fields_are_dropped_from_responses_and_trailers_go_both_ways() {
        let buf = b"HTTP/1.1 200 OK\r\nConnection: close, x-hop\r\nKeep-Alive: t=5\r\nX-Hop: 1\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n";
        let res = fake_response(buf);
        let map = response_fields(&res, buf);
        let names: Vec<&str> = map.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["set-cookie"]);
        assert_eq!(map.get_all("set-cookie").iter().count(), 2);

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
