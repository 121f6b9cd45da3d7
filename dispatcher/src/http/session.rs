//! JSESSIONID: where it is in a request, and what it says.
//!
//! WebSphere's form: a 4-character cache ID, the session ID, then `:` and one or more
//! clone IDs (`0000HHAnbYWnNxGD-iVupvcArfr:14dtuueci:1a2b3c`), tried in order; or a
//! partition ID (a number) where memory-to-memory replication uses partitions.
//!
//! Precedence (documented in docs/http.md): the `Cookie` header wins over `;jsessionid=`
//! in the URL, because a client that sends the cookie has the newer value (URL rewriting
//! is the fallback for clients without cookies). Among several `JSESSIONID` cookies —
//! in one `Cookie` header or several — the first one in header order that yields a
//! usable value wins. Only the exact cookie name matches (configurable); the URL
//! parameter name is matched exactly too.

use crate::config::SessionFormat;

/// A parsed session identifier: the clone (or partition) IDs after the first `:`, or the
/// one jvmRoute after the last `.`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionId<'a> {
    pub value: &'a [u8],
    pub clones: Vec<&'a [u8]>,
}

/// Upper bound on a JSESSIONID value; longer ones give no affinity (header limits apply
/// before this anyway).
pub const MAX_ID_LEN: usize = 4096;
/// At most this many clone IDs are tried.
pub const MAX_CLONES_PER_ID: usize = 8;

/// Splits a JSESSIONID value. `None` when it carries no usable clone ID: empty, no `:`,
/// too long, or only empty parts.
pub fn parse(value: &[u8]) -> Option<SessionId<'_>> {
    let value = unquote(value);
    if value.len() < 6 || value.len() > MAX_ID_LEN {
        return None;
    }
    let colon = value.iter().position(|&b| b == b':')?;
    if colon < 5 {
        // Cache ID (4) plus at least one byte of session ID.
        return None;
    }
    let clones: Vec<&[u8]> =
        value[colon + 1..].split(|&b| b == b':').filter(|c| !c.is_empty()).take(MAX_CLONES_PER_ID).collect();
    if clones.is_empty() {
        return None;
    }
    Some(SessionId { value, clones })
}

/// Tomcat's and JBoss/WildFly's form, `<session ID>.<jvmRoute>`: the route is what follows
/// the last `.` (mod_jk's and mod_proxy_balancer's reading). `None` without a `.`, with
/// an empty session ID or route, or when too long.
pub fn parse_jvm_route(value: &[u8]) -> Option<SessionId<'_>> {
    let value = unquote(value);
    if value.len() > MAX_ID_LEN {
        return None;
    }
    let dot = value.iter().rposition(|&b| b == b'.')?;
    let route = &value[dot + 1..];
    (dot > 0 && !route.is_empty()).then(|| SessionId { value, clones: vec![route] })
}

/// A JSESSIONID value read in the VIP's format.
pub fn parse_as(value: &[u8], format: SessionFormat) -> Option<SessionId<'_>> {
    match format {
        SessionFormat::WebSphere => parse(value),
        SessionFormat::JvmRoute => parse_jvm_route(value),
    }
}

fn unquote(v: &[u8]) -> &[u8] {
    if v.len() >= 2 && v[0] == b'"' && v[v.len() - 1] == b'"' {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

/// The value of cookie `name` in one `Cookie` header value (`a=1; b=2`), first match.
pub fn cookie<'a>(header: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = trim(pair);
        let eq = pair.iter().position(|&b| b == b'=')?;
        (trim(&pair[..eq]) == name).then(|| trim(&pair[eq + 1..]))
    })
}

/// Every value of cookie `name` in one header, in order.
fn cookies<'a>(header: &'a [u8], name: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    header.split(|&b| b == b';').filter_map(move |pair| {
        let pair = trim(pair);
        let eq = pair.iter().position(|&b| b == b'=')?;
        (trim(&pair[..eq]) == name).then(|| trim(&pair[eq + 1..]))
    })
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(v.len());
    let e = v.iter().rposition(|&b| b != b' ' && b != b'\t').map(|e| e + 1).unwrap_or(s);
    &v[s..e.max(s)]
}

/// `;name=value` as a path parameter: the value ends at `?`, `#`, `;` or `/`.
pub fn url_param<'a>(target: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let path_end = target.iter().position(|&b| b == b'?' || b == b'#').unwrap_or(target.len());
    let path = &target[..path_end];
    let mut i = 0;
    while let Some(p) = path[i..].iter().position(|&b| b == b';') {
        let start = i + p + 1;
        let rest = &path[start..];
        if rest.len() > name.len() && &rest[..name.len()] == name && rest[name.len()] == b'=' {
            let v = &rest[name.len() + 1..];
            let end = v.iter().position(|&b| b == b';' || b == b'/').unwrap_or(v.len());
            return Some(&v[..end]);
        }
        i = start;
    }
    None
}

/// The session of a request: cookies first (first usable `name` cookie across all
/// `Cookie` headers in order), then the URL parameter. (The request path ranks them by
/// farm: [`find_ranked`].)
#[cfg(test)]
pub fn find<'a>(
    cookie_headers: impl Iterator<Item = &'a [u8]>,
    target: &'a [u8],
    cookie_name: &'a [u8],
    url_name: &[u8],
    format: SessionFormat,
) -> Option<SessionId<'a>> {
    find_ranked(cookie_headers, target, cookie_name, url_name, format, |_| 0)
}

/// As [`find`] when a request carries several session cookies of one name (a domain
/// cookie and a host cookie): the one of lowest `rank` (0 is the best, and ends the
/// search), the first in order among equals; the URL parameter when no cookie is usable.
/// `rank` is called only when there are two or more (one cookie costs nothing more).
pub fn find_ranked<'a>(
    cookie_headers: impl Iterator<Item = &'a [u8]>,
    target: &'a [u8],
    cookie_name: &'a [u8],
    url_name: &[u8],
    format: SessionFormat,
    rank: impl Fn(&SessionId) -> u8,
) -> Option<SessionId<'a>> {
    let mut found = cookie_headers.flat_map(|h| cookies(h, cookie_name).filter_map(|v| parse_as(v, format)));
    let best = match (found.next(), found.next()) {
        (None, _) => None,
        (Some(only), None) => return Some(only),
        (Some(first), Some(second)) => {
            let mut best = (rank(&first), first);
            for s in std::iter::once(second).chain(found) {
                if best.0 == 0 {
                    break;
                }
                let r = rank(&s);
                if r < best.0 {
                    best = (r, s);
                }
            }
            Some(best)
        }
    };
    match best {
        Some((_, s)) => Some(s),
        // The URL parameter counts only when no cookie is usable.
        None => url_param(target, url_name).and_then(|v| parse_as(v, format)),
    }
}

/// Converged SIP/HTTP applications: the logical name of the `ibmappid` a request
/// carries (`;ibmappid=` path parameter, else `ibmappid=` in the query), routed through
/// the same table as clone IDs. Used only when the request has no usable JSESSIONID:
/// the HTTP session, when there is one, is what the servlet reads.
pub fn app_session(target: &[u8]) -> Option<SessionId<'_>> {
    let value = url_param(target, b"ibmappid").or_else(|| {
        let q = target.iter().position(|&b| b == b'?')?;
        let query = &target[q + 1..target.iter().position(|&b| b == b'#').unwrap_or(target.len())];
        query.split(|&b| b == b'&').find_map(|kv| kv.strip_prefix(b"ibmappid="))
    })?;
    let ln = dispatcher_common::sip::logical_name(value)?;
    Some(SessionId { value, clones: vec![ln] })
}

/// The JSESSIONID value a `Set-Cookie` header sets, if it sets that cookie.
pub fn set_cookie<'a>(header: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let first = header.split(|&b| b == b';').next()?;
    let eq = first.iter().position(|&b| b == b'=')?;
    (trim(&first[..eq]) == name).then(|| trim(&first[eq + 1..]))
}

pub use crate::config::is_partition;

#[cfg(test)]
mod app_session_tests {
    use super::*;

    #[test]
    fn ibmappid_names_a_logical_name_in_the_path_or_the_query() {
        let ln = |t: &str| app_session(t.as_bytes()).map(|s| String::from_utf8_lossy(s.clones[0]).into_owned());
        assert_eq!(ln("/app/call;ibmappid=sip1.1153242645968.4_2_2?x=1").as_deref(), Some("sip1"));
        assert_eq!(ln("/app/call?x=1&ibmappid=local.1132518053302_2_2#f").as_deref(), Some("local"));
        assert_eq!(ln("/app/call?ibmappid=random"), None, "not a session ID");
        assert_eq!(ln("/app/call?xibmappid=sip1.1_2_3"), None, "exact name");
        assert_eq!(ln("/app/call"), None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(s: Option<SessionId>) -> Vec<String> {
        s.map(|s| s.clones.iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect()).unwrap_or_default()
    }

    fn from(cookies: &[&str], target: &str) -> Vec<String> {
        ids(find(
            cookies.iter().map(|c| c.as_bytes()),
            target.as_bytes(),
            b"JSESSIONID",
            b"jsessionid",
            SessionFormat::WebSphere,
        ))
    }

    #[test]
    fn websphere_forms() {
        assert_eq!(ids(parse(b"0000HHAnbYWnNxGD-iVupvcArfr:14dtuueci")), ["14dtuueci"]);
        assert_eq!(ids(parse(b"0000abc:cA:cB")), ["cA", "cB"]);
        assert_eq!(ids(parse(b"\"0000abc:cA\"")), ["cA"], "quoted value");
        assert_eq!(ids(parse(b"0000abc:-1234567890123")), ["-1234567890123"]);
        assert!(
            is_partition(b"-1234567890123")
                && is_partition(b"42")
                && !is_partition(b"14dtuueci")
                && !is_partition(b"-")
        );
        for none in [&b""[..], b"0000abc", b"0000abc:", b"0000abc::", b":cA", b"00:cA"] {
            assert_eq!(parse(none), None, "{:?}", String::from_utf8_lossy(none));
        }
        assert_eq!(parse(&[b'a'; MAX_ID_LEN + 1]), None);
        let long = format!("0000abc:{}", (0..20).map(|i| format!("c{i}")).collect::<Vec<_>>().join(":"));
        assert_eq!(ids(parse(long.as_bytes())).len(), MAX_CLONES_PER_ID);
    }

    #[test]
    fn jvm_route_forms() {
        let jvm = |v: &str| ids(parse_jvm_route(v.as_bytes()));
        assert_eq!(jvm("8E3B2A1C9D0F.tomcat1"), ["tomcat1"]);
        assert_eq!(jvm("a.b.node-2"), ["node-2"], "the route follows the last '.'");
        assert_eq!(jvm("\"A1B2.n1\""), ["n1"], "quoted value");
        assert_eq!(jvm("hU4QvJ_3kP-xq2sWm0Y9fLz8Rb1cTnEo.wildfly-a"), ["wildfly-a"], "WildFly's alphabet");
        for none in ["", "8E3B2A1C9D0F", "8E3B.", ".tomcat1", "."] {
            assert_eq!(parse_jvm_route(none.as_bytes()), None, "{none:?}");
        }
        assert_eq!(parse_jvm_route(format!("{}.n", "a".repeat(MAX_ID_LEN)).as_bytes()), None, "too long");
        // Each VIP reads its own format only: a WebSphere ID has no route, a Tomcat ID no clone.
        assert_eq!(parse_as(b"0000abc:cA", SessionFormat::JvmRoute), None);
        assert_eq!(parse_as(b"8E3B2A1C9D0F.tomcat1", SessionFormat::WebSphere), None);
        let found = |c: &str, t: &str| {
            ids(find([c.as_bytes()].into_iter(), t.as_bytes(), b"JSESSIONID", b"jsessionid", SessionFormat::JvmRoute))
        };
        assert_eq!(found("JSESSIONID=ABC.t1", "/"), ["t1"]);
        assert_eq!(found("x=1", "/app;jsessionid=ABC.t2?q=1"), ["t2"], "URL rewriting");
        assert_eq!(found("JSESSIONID=0000abc:cA; JSESSIONID=ABC.t3", "/"), ["t3"], "first usable in this format");
    }

    #[test]
    fn exact_cookie_name_only() {
        assert_eq!(from(&["JSESSIONID=0000abc:cA"], "/"), ["cA"]);
        assert_eq!(from(&["jsessionid=0000abc:cA"], "/"), Vec::<String>::new());
        assert_eq!(from(&["XJSESSIONID=0000abc:cA"], "/"), Vec::<String>::new());
        assert_eq!(from(&["JSESSIONIDX=0000abc:cA"], "/"), Vec::<String>::new());
        assert_eq!(from(&["a=1; JSESSIONID=0000abc:cA; b=2"], "/"), ["cA"]);
        assert_eq!(from(&["JSESSIONID="], "/"), Vec::<String>::new());
    }

    #[test]
    fn several_cookies_first_usable_wins() {
        assert_eq!(from(&["JSESSIONID=0000abc:cA; JSESSIONID=0000def:cB"], "/"), ["cA"]);
        assert_eq!(from(&["JSESSIONID=garbage; JSESSIONID=0000def:cB"], "/"), ["cB"]);
        assert_eq!(from(&["a=1", "JSESSIONID=0000def:cB"], "/"), ["cB"]);
        assert_eq!(from(&["JSESSIONID=0000abc:cA", "JSESSIONID=0000def:cB"], "/"), ["cA"]);
    }

    #[test]
    fn url_rewriting_and_precedence() {
        assert_eq!(from(&[], "/app/page;jsessionid=0000abc:cA?x=1"), ["cA"]);
        assert_eq!(from(&[], "/app/page;jsessionid=0000abc:cA:cB#frag"), ["cA", "cB"]);
        assert_eq!(from(&[], "/app;jsessionid=0000abc:cA/more"), ["cA"]);
        assert_eq!(from(&[], "/app/page?jsessionid=0000abc:cA"), Vec::<String>::new(), "query, not a path parameter");
        assert_eq!(from(&[], "/app/page;JSESSIONID=0000abc:cA"), Vec::<String>::new());
        // Cookie over URL, both ways round.
        assert_eq!(from(&["JSESSIONID=0000abc:cookie"], "/p;jsessionid=0000abc:url"), ["cookie"]);
        assert_eq!(from(&["JSESSIONID=bad"], "/p;jsessionid=0000abc:url"), ["url"], "unusable cookie: the URL");
    }

    #[test]
    fn set_cookie_value() {
        assert_eq!(set_cookie(b"JSESSIONID=0000abc:cA; Path=/; HttpOnly", b"JSESSIONID"), Some(&b"0000abc:cA"[..]));
        assert_eq!(set_cookie(b"OTHER=1; JSESSIONID=x", b"JSESSIONID"), None);
    }
}
