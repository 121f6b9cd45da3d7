//! Cookie persistence for applications without a session (HAProxy's `cookie NAME
//! insert`): the first response of a client gets `Set-Cookie: NAME=<backend>`, and its
//! later requests go to that backend, or, while it is out, to its configured replica
//! (the same holding and replica rules as sessions: never a third server). A backend
//! without a replica gives way to balancing while it is out, and the response's cookie
//! names the new one (HAProxy's redispatch). A request that carries a JSESSIONID is
//! routed by it instead.

use crate::http1::rewrite::is;

pub struct Persist {
    name: Box<[u8]>,
    /// (cookie value, backend id) for the VIP's members: the value is the backend's name.
    values: Vec<(Box<[u8]>, usize)>,
    /// `Secure` on the cookie (an HTTPS VIP).
    secure: bool,
}

impl Persist {
    pub fn new(name: &str, members: impl Iterator<Item = (usize, String)>, secure: bool) -> Persist {
        let values = members.map(|(b, n)| (n.into_bytes().into_boxed_slice(), b)).collect();
        Persist { name: name.as_bytes().into(), values, secure }
    }

    /// The backend the request's cookie names (the first such cookie), if it is a member.
    pub fn pinned<'a>(&self, cookie_headers: impl Iterator<Item = &'a [u8]>) -> Option<usize> {
        cookie_headers.filter_map(|h| super::session::cookie(h, &self.name)).find_map(|v| {
            let v = v.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(v);
            self.values.iter().find(|(n, _)| &n[..] == v).map(|(_, b)| *b)
        })
    }

    /// Adds `Set-Cookie` naming `backend` to a response head built in `out` (which ends
    /// with the blank line), and `Cache-Control: private` when the response has no
    /// Cache-Control (a shared cache must not hand one client's cookie to others).
    pub fn insert(&self, out: &mut Vec<u8>, backend: usize, has_cache_control: bool) {
        let Some(cookie) = self.set_cookie(backend) else { return };
        debug_assert!(out.ends_with(b"\r\n\r\n"));
        out.truncate(out.len() - 2);
        out.extend_from_slice(b"Set-Cookie: ");
        out.extend_from_slice(&cookie);
        out.extend_from_slice(b"\r\n");
        if !has_cache_control {
            out.extend_from_slice(b"Cache-Control: private\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }

    /// The same fields in an HTTP/2 response's header map.
    pub fn insert_field(&self, map: &mut http::HeaderMap, backend: usize) {
        let Some(v) = self.set_cookie(backend).and_then(|c| http::HeaderValue::from_bytes(&c).ok()) else { return };
        map.append(http::header::SET_COOKIE, v);
        if !map.contains_key(http::header::CACHE_CONTROL) {
            map.insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("private"));
        }
    }

    /// The `Set-Cookie` value naming `backend`, if it is a member.
    fn set_cookie(&self, backend: usize) -> Option<Vec<u8>> {
        let (value, _) = self.values.iter().find(|(_, b)| *b == backend)?;
        let mut c = Vec::with_capacity(self.name.len() + value.len() + 32);
        c.extend_from_slice(&self.name);
        c.push(b'=');
        c.extend_from_slice(value);
        c.extend_from_slice(b"; Path=/; HttpOnly");
        if self.secure {
            c.extend_from_slice(b"; Secure");
        }
        Some(c)
    }
}

/// Whether a response head has a `Cache-Control` field.
pub fn has_cache_control(res: &crate::http1::head::ResponseHead, buf: &[u8]) -> bool {
    res.headers.iter().any(|h| is(&buf[h.name.clone()], "cache-control"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> Persist {
        Persist::new("SRV", [(0, "b0".to_string()), (2, "web-2".to_string())].into_iter(), false)
    }

    #[test]
    fn the_cookie_names_a_member_by_its_name() {
        let pin = |h: &[&str]| p().pinned(h.iter().map(|h| h.as_bytes()));
        assert_eq!(pin(&["SRV=web-2"]), Some(2));
        assert_eq!(pin(&["a=1; SRV=\"b0\"; c=2"]), Some(0), "quoted, among others");
        assert_eq!(pin(&["SRV=b1"]), None, "not a member");
        assert_eq!(pin(&["srv=b0", "XSRV=b0"]), None, "exact name");
        assert_eq!(pin(&["SRV=nope; SRV=b0"]), None, "the first one counts");
        assert_eq!(pin(&["x=1", "SRV=b0"]), Some(0), "any Cookie header");
    }

    #[test]
    fn insert_adds_the_fields_before_the_blank_line() {
        let mut out = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n".to_vec();
        p().insert(&mut out, 2, false);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nSet-Cookie: SRV=web-2; Path=/; HttpOnly\r\nCache-Control: private\r\n\r\n"
        );
        let mut out = b"HTTP/1.1 200 OK\r\n\r\n".to_vec();
        Persist::new("SRV", [(0, "b0".to_string())].into_iter(), true).insert(&mut out, 0, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\nSet-Cookie: SRV=b0; Path=/; HttpOnly; Secure\r\n\r\n"
        );
    }

    /// An HTTP/2 response gets the same fields in its header map.
    #[test]
    fn insert_field_adds_the_same_fields_to_a_header_map() {
        let mut map = http::HeaderMap::new();
        p().insert_field(&mut map, 2);
        assert_eq!(map.get("set-cookie").unwrap(), "SRV=web-2; Path=/; HttpOnly");
        assert_eq!(map.get("cache-control").unwrap(), "private");
        let mut map = http::HeaderMap::new();
        map.insert(http::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
        Persist::new("SRV", [(0, "b0".to_string())].into_iter(), true).insert_field(&mut map, 0);
        assert_eq!(map.get("set-cookie").unwrap(), "SRV=b0; Path=/; HttpOnly; Secure");
        assert_eq!(map.get_all("cache-control").iter().collect::<Vec<_>>(), ["no-store"]);
        // Not a member: nothing.
        let mut map = http::HeaderMap::new();
        p().insert_field(&mut map, 7);
        assert!(map.is_empty());
    }
}
