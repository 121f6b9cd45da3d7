//! Routes of an HTTP VIP: (virtual hosts, URI patterns) -> a target (a farm), as the
//! WebSphere plug-in routes by its `plugin-cfg.xml` (read by `plugin_cfg`, printed as TOML
//! by `import`). Pure: depends on nothing else in the crate.
//!
//! # The rule
//!
//! A route matches a request when one of its virtual hosts matches the request's host and
//! port, and one of its URI patterns matches the request's path. Among the routes that
//! match, **the most specific URI pattern wins**:
//!
//! 1. an exact path (`/shop/cart`);
//! 2. a path prefix (`/shop/*`), the longest first; `/shop/*` matches `/shop` and
//!    everything under `/shop/` (not `/shopping`). A prefix with an extension
//!    (`/shop/*.jsp`: under `/shop/`, last segment ending in `.jsp`) ranks with the
//!    prefixes by its prefix's length, and before a plain prefix of the same length;
//! 3. an extension (`*.jsp`: the last segment ends in `.jsp`), the longest first;
//! 4. the catch-all (`/*`, or `*` alone).
//!
//! This is the servlet specification's mapping order (exact, longest path prefix,
//! extension, default: Servlet 3.0, section 12.1), which the plug-in's URI groups follow
//! since they are generated from the web modules' context roots and servlet mappings; the
//! plug-in's `/*` plays the default servlet's part (it is what a cluster fronting a whole
//! host is given), so it comes after the extensions. IBM's plugin-cfg.xml reference names
//! the forms (`*.jsp`, `/servlet/*`) but, in what we could read of it, states no
//! precedence; the WebSphere proxy server's documentation ("Request mapping") states the
//! same "best match, not file order" principle.
//!
//! At the same URI pattern, the most specific virtual host wins, in the order IBM gives
//! for its On Demand Router (APAR PI78774): exact host and port, exact host with any port,
//! any host with an exact port, any host and port (a `*.example.com` suffix, our
//! extension, ranks between an exact host and `*`, the longest suffix first). At the same
//! URI pattern and host, the route that comes first (file order) wins; the others are
//! reported by [`Table::shadowed`].
//!
//! # Virtual hosts
//!
//! `host[:port]`, case-insensitive: `*`, `*:80`, `shop.example:*`, `*.example.com:443`,
//! `[::1]:8080`. Without a port (`*` alone too), port 80 (IBM's reference says a
//! `VirtualHost` without a port means the default HTTP port; generated files always write
//! one). The plug-in's own wildcards are `*` for the whole host, the port, or both;
//! `*.domain` is ours. The request's port is the one in its Host header, or the VIP's port
//! when Host has none (the plug-in's default, `VHostMatchingCompat="false"`, also takes
//! the Host header's).
//! A trailing dot on the request's host is ignored.
//!
//! # Paths
//!
//! Matching is on the request's path only, case-sensitive (as the servlet container),
//! after this normalisation, so that the path a backend will resolve is the one routed:
//! the query (`?...`) is dropped; path parameters (`;jsessionid=...`, on any segment) are
//! dropped, as the servlet container drops them before mapping; runs of `/` count as one;
//! `.` and `..` segments are resolved (`..` never above the root); percent-encoded
//! unreserved characters (`%41` -> `A`, RFC 3986 section 6.2.2.2) are decoded, and nothing
//! else is (`%2F` stays a character of a segment, not a separator; other escapes are
//! upper-cased, `%2f` -> `%2F`, section 6.2.2.1). An empty path is `/`.
//! A target that does not start with `/` (`OPTIONS *`) matches only catch-all routes.
//!
//! Patterns other than the four forms (`*` elsewhere than as above, e.g. `/app*`,
//! `/a/*/b`, `*.*`) are refused by [`UriPattern::parse`] rather than guessed at.
//!
//! # Cost
//!
//! No scan of the routes per request: exact paths and prefixes are hash lookups (one per
//! level of the path), extensions one lookup, and each lookup gives the few entries that
//! share that pattern, sorted by host specificity; the first whose host matches wins.
//! Normalisation borrows the path unless it needs changing.

pub mod import;
pub mod plugin_cfg;

use std::{borrow::Cow, collections::HashMap, fmt};

/// A route as configured: any of `hosts` and any of `uris`, to `target`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub hosts: Vec<String>,
    pub uris: Vec<String>,
    /// What the caller routes to (a farm's index); the matcher only hands it back.
    pub target: usize,
}

/// A pattern the matcher refuses, with the route it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("route {route}: URI pattern {pattern:?}: {reason}")]
    Uri { route: usize, pattern: String, reason: &'static str },
    #[error("route {route}: virtual host {pattern:?}: {reason}")]
    Host { route: usize, pattern: String, reason: &'static str },
    #[error("route {route}: no virtual host or no URI pattern")]
    Empty { route: usize },
    #[error("route {route}: the routes pair more than {MAX_PAIRS} virtual hosts with URI patterns")]
    TooLarge { route: usize },
}

/// (virtual host, URI pattern) pairs in one table: what it holds (a large cell has a few
/// thousand).
pub const MAX_PAIRS: usize = 100_000;

/// A URI pattern, in one of the plug-in's forms.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UriPattern {
    /// `/shop/cart`
    Exact(String),
    /// `/shop/*` (stored without `/*`); `ext`: `/shop/*.jsp` (stored as `.jsp`)
    Prefix { prefix: String, ext: Option<String> },
    /// `*.jsp` (stored as `.jsp`)
    Extension(String),
    /// `/*` or `*`
    CatchAll,
}

/// A request path is normalised before matching (see the module's doc): a pattern that
/// is not could never match.
const NOT_NORMAL: &str =
    "the path is not in normal form (no //, . or .. segment, ;parameter, escaped unreserved character or lower-case escape)";
const URI_FORMS: &str = "the forms are /exact/path, /prefix/*, /prefix/*.ext, *.ext and /*";

impl UriPattern {
    pub fn parse(s: &str) -> Result<UriPattern, &'static str> {
        if s == "/*" || s == "*" {
            return Ok(UriPattern::CatchAll);
        }
        if s.contains(['?', '#']) || s.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err("a pattern is a path: no query, fragment, space or control character");
        }
        if let Some(ext) = s.strip_prefix('*') {
            return match ext.strip_prefix('.') {
                Some(e) if !e.is_empty() && !e.contains(['*', '/']) => Ok(UriPattern::Extension(ext.to_string())),
                _ => Err(URI_FORMS),
            };
        }
        if !s.starts_with('/') {
            return Err("a pattern starts with / or *.");
        }
        let Some(star) = s.find('*') else {
            return if normalize_path(s) == s { Ok(UriPattern::Exact(s.to_string())) } else { Err(NOT_NORMAL) };
        };
        let (prefix, rest) = (&s[..star], &s[star + 1..]);
        let Some(prefix) = prefix.strip_suffix('/') else { return Err(URI_FORMS) };
        let ext = match rest {
            "" => None,
            e if e.starts_with('.') && e.len() > 1 && !e.contains(['*', '/']) => Some(e.to_string()),
            _ => return Err(URI_FORMS),
        };
        if prefix.contains('*') {
            return Err(URI_FORMS);
        }
        if prefix.ends_with('/') || (!prefix.is_empty() && normalize_path(prefix) != prefix) {
            return Err(NOT_NORMAL);
        }
        if prefix.is_empty() {
            // `/*.jsp` is `*.jsp`.
            return Ok(match ext {
                Some(e) => UriPattern::Extension(e),
                None => UriPattern::CatchAll,
            });
        }
        Ok(UriPattern::Prefix { prefix: prefix.to_string(), ext })
    }
}

impl fmt::Display for UriPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UriPattern::Exact(p) => f.write_str(p),
            UriPattern::Prefix { prefix, ext: None } => write!(f, "{prefix}/*"),
            UriPattern::Prefix { prefix, ext: Some(e) } => write!(f, "{prefix}/*{e}"),
            UriPattern::Extension(e) => write!(f, "*{e}"),
            UriPattern::CatchAll => f.write_str("/*"),
        }
    }
}

/// The host part of a virtual host pattern (lower case).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostName {
    Exact(String),
    /// `*.example.com`, stored as `.example.com`
    Suffix(String),
    Any,
}

/// A virtual host pattern: `host[:port]`; `port: None` is `*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPattern {
    pub host: HostName,
    pub port: Option<u16>,
}

impl HostPattern {
    pub fn parse(s: &str) -> Result<HostPattern, &'static str> {
        let (host, port) = split_host_port(s.trim()).ok_or("not host[:port]")?;

        let port = match port {
            None => Some(80),
            Some("*") => None,
            Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or("the port is a number 1-65535 or *")?),
        };
        let host = host.to_ascii_lowercase();
        let name = if host == "*" {
            HostName::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            // A trailing dot is dropped, as from a request's host.
            let suffix = suffix.trim_end_matches('.');
            if suffix.is_empty() || suffix.contains('*') {
                return Err("a wildcard host is * or *.domain");
            }
            HostName::Suffix(format!(".{suffix}"))
        } else if host.is_empty() || host.contains('*') {
            return Err("a wildcard host is * or *.domain");
        } else {
            HostName::Exact(host.trim_end_matches('.').to_string())
        };
        // What a request's Host can hold (else the pattern could never match): a name
        // of letters, digits, `-`, `_` and `.`, an IPv4 address, or an [IPv6] literal.
        let name_ok = |h: &str| h.bytes().all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(&c));
        let v6_ok = |h: &str| {
            h.strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                .is_some_and(|a| a.parse::<std::net::Ipv6Addr>().is_ok())
        };
        let valid = match &name {
            HostName::Any => true,
            HostName::Suffix(s) => name_ok(s),
            HostName::Exact(h) => name_ok(h) || v6_ok(h),
        };
        if !valid {
            return Err("a host is a name (letters, digits, -, _ and .), an address, or * or *.domain");
        }
        Ok(HostPattern { host: name, port })
    }

    fn matches(&self, host: &str, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
            && match &self.host {
                HostName::Any => true,
                HostName::Exact(h) => h.eq_ignore_ascii_case(host),
                HostName::Suffix(s) => {
                    host.len() > s.len() && host.as_bytes()[host.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
                }
            }
    }

    /// Lower is more specific (see the module's rule).
    fn rank(&self) -> (u8, usize, u8) {
        let (class, len) = match &self.host {
            HostName::Exact(_) => (0, 0),
            HostName::Suffix(s) => (1, usize::MAX - s.len()),
            HostName::Any => (2, 0),
        };
        (class, len, u8::from(self.port.is_none()))
    }

    /// Every request this one matches, `self` matches too.
    fn covers(&self, other: &HostPattern) -> bool {
        let port = self.port.is_none() || self.port == other.port;
        let host = match (&self.host, &other.host) {
            (HostName::Any, _) => true,
            (HostName::Suffix(a), HostName::Suffix(b)) => b.ends_with(a.as_str()),
            (HostName::Suffix(a), HostName::Exact(b)) => b.len() > a.len() && b.ends_with(a.as_str()),
            (a, b) => a == b,
        };
        port && host
    }
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`.
fn split_host_port(s: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')?;
        let after = &rest[end + 1..];
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':')?),
        };
        return Some((&s[..end + 2], port));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => Some((h, Some(p))),
        Some(_) => None,
        None => Some((s, None)),
    }
}

/// One (host pattern, URI pattern) pair of a route.
#[derive(Debug, Clone)]
struct Entry {
    host: HostPattern,
    route: usize,
}

/// Which route a request matched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// Index in the routes given to [`Table::new`].
    pub route: usize,
    pub target: usize,
}

/// A route that can never be chosen: each of its (host, URI) pairs is matched first by
/// route `by` (an earlier route with the same URI pattern and a host that covers it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shadowed {
    pub route: usize,
    pub by: usize,
}

/// The routes of one VIP, indexed for lookups.
#[derive(Debug, Default)]
pub struct Table {
    targets: Vec<usize>,
    exact: HashMap<String, Vec<Entry>>,
    /// By prefix (`/shop`): the entries with an extension (by extension), then the plain.
    prefix: HashMap<String, PrefixEntries>,
    /// The longest prefix's length: a path is looked up only at the levels that short, so
    /// a request's cost does not grow with the square of its path's depth.
    longest_prefix: usize,
    extension: HashMap<String, Vec<Entry>>,
    /// Extensions' lengths present, longest first (a path is probed for each).
    extension_lengths: Vec<usize>,
    catch_all: Vec<Entry>,
}

#[derive(Debug, Default)]
struct PrefixEntries {
    with_ext: HashMap<String, Vec<Entry>>,
    ext_lengths: Vec<usize>,
    plain: Vec<Entry>,
}

impl Table {
    pub fn new(routes: &[Route]) -> Result<Table, PatternError> {
        let mut t = Table { targets: routes.iter().map(|r| r.target).collect(), ..Table::default() };
        let mut pairs = 0usize;
        for (i, r) in routes.iter().enumerate() {
            if r.hosts.is_empty() || r.uris.is_empty() {
                return Err(PatternError::Empty { route: i });
            }
            pairs = pairs.saturating_add(r.hosts.len().saturating_mul(r.uris.len()));
            if pairs > MAX_PAIRS {
                return Err(PatternError::TooLarge { route: i });
            }
            let hosts = r
                .hosts
                .iter()
                .map(|h| {
                    HostPattern::parse(h).map_err(|reason| PatternError::Host { route: i, pattern: h.clone(), reason })
                })
                .collect::<Result<Vec<_>, _>>()?;
            for u in &r.uris {
                let pattern = UriPattern::parse(u).map_err(|reason| PatternError::Uri {
                    route: i,
                    pattern: u.clone(),
                    reason,
                })?;
                let list = t.list_mut(pattern);
                list.extend(hosts.iter().map(|h| Entry { host: h.clone(), route: i }));
            }
        }
        t.for_each_list(|l| l.sort_by_key(|e| (e.host.rank(), e.route)));
        for p in t.prefix.values_mut() {
            p.ext_lengths = sorted_lengths(p.with_ext.keys());
        }
        t.extension_lengths = sorted_lengths(t.extension.keys());
        t.longest_prefix = t.prefix.keys().map(String::len).max().unwrap_or(0);
        Ok(t)
    }

    fn list_mut(&mut self, pattern: UriPattern) -> &mut Vec<Entry> {
        match pattern {
            UriPattern::Exact(p) => self.exact.entry(p).or_default(),
            UriPattern::Prefix { prefix, ext } => {
                let p = self.prefix.entry(prefix).or_default();
                match ext {
                    Some(e) => p.with_ext.entry(e).or_default(),
                    None => &mut p.plain,
                }
            }
            UriPattern::Extension(e) => self.extension.entry(e).or_default(),
            UriPattern::CatchAll => &mut self.catch_all,
        }
    }

    fn for_each_list(&mut self, mut f: impl FnMut(&mut Vec<Entry>)) {
        self.exact.values_mut().for_each(&mut f);
        for p in self.prefix.values_mut() {
            p.with_ext.values_mut().for_each(&mut f);
            f(&mut p.plain);
        }
        self.extension.values_mut().for_each(&mut f);
        f(&mut self.catch_all);
    }

    fn lists(&self) -> impl Iterator<Item = &Vec<Entry>> {
        self.exact
            .values()
            .chain(self.prefix.values().flat_map(|p| p.with_ext.values().chain(std::iter::once(&p.plain))))
            .chain(self.extension.values())
            .chain(std::iter::once(&self.catch_all))
    }

    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// The route for a request: `host_header` as received (None when absent), the VIP's
    /// port, and the request target (origin-form; the query is ignored).
    pub fn find(&self, host_header: Option<&str>, vip_port: u16, target: &str) -> Option<Match> {
        let (host, port) = request_host(host_header, vip_port);
        let path = normalize_path(target);
        let first = |l: &Vec<Entry>| l.iter().find(|e| e.host.matches(host, port)).map(|e| e.route);
        let route = self.lookup(&path, first)?;
        Some(Match { route, target: self.targets[route] })
    }

    fn lookup(&self, path: &str, first: impl Fn(&Vec<Entry>) -> Option<usize>) -> Option<usize> {
        if !path.starts_with('/') {
            return first(&self.catch_all);
        }
        if let Some(r) = self.exact.get(path).and_then(&first) {
            return Some(r);
        }
        let last_segment = &path[path.rfind('/').map_or(0, |i| i + 1)..];
        // `/a/b/c` is under the prefixes `/a/b/c`, `/a/b` and `/a`; an extension with a
        // prefix applies to what is strictly under it.
        // (Only the levels no longer than the longest prefix: `/a/b/c` with `/a/*` the
        // longest looks up `/a` alone.)
        let mut end = match path.len() <= self.longest_prefix {
            true => path.len(),
            false => path.as_bytes()[..=self.longest_prefix].iter().rposition(|&b| b == b'/').unwrap_or(0),
        };
        while end > 0 {
            if let Some(p) = self.prefix.get(&path[..end]) {
                if end < path.len() {
                    for &n in &p.ext_lengths {
                        let r = ext_of(last_segment, n).and_then(|e| p.with_ext.get(e)).and_then(&first);
                        if r.is_some() {
                            return r;
                        }
                    }
                }
                if let Some(r) = first(&p.plain) {
                    return Some(r);
                }
            }
            end = path[..end].rfind('/').unwrap_or(0);
        }
        for &n in &self.extension_lengths {
            if let Some(r) = ext_of(last_segment, n).and_then(|e| self.extension.get(e)).and_then(&first) {
                return Some(r);
            }
        }
        first(&self.catch_all)
    }

    /// Routes that can never win: every pair of theirs comes after a covering pair of
    /// an earlier (or more specific) route with the same URI pattern.
    /// (A warning, not a decision: the comparisons are bounded by [`SHADOW_BUDGET`]; past
    /// it, the routes not yet compared are not reported.)
    pub fn shadowed(&self) -> Vec<Shadowed> {
        let mut by: Vec<Option<Option<usize>>> = vec![None; self.targets.len()];
        let mut budget = SHADOW_BUDGET;
        for list in self.lists() {
            for (i, e) in list.iter().enumerate() {
                budget = budget.saturating_sub(i);
                if budget == 0 {
                    by[e.route] = Some(None);
                    continue;
                }
                let winner = list[..i].iter().find(|w| w.route != e.route && w.host.covers(&e.host)).map(|w| w.route);
                let slot = &mut by[e.route];
                *slot = match (*slot, winner) {
                    (Some(None), _) | (_, None) => Some(None),
                    (None, Some(w)) => Some(Some(w)),
                    (Some(Some(prev)), Some(_)) => Some(Some(prev)),
                };
            }
        }
        by.iter()
            .enumerate()
            .filter_map(|(route, b)| match b {
                Some(Some(w)) => Some(Shadowed { route, by: *w }),
                _ => None,
            })
            .collect()
    }
}

/// Host comparisons `Table::shadowed` makes at most (a few tens of milliseconds).
pub const SHADOW_BUDGET: usize = 20_000_000;

fn sorted_lengths<'a>(keys: impl Iterator<Item = &'a String>) -> Vec<usize> {
    let mut v: Vec<usize> = keys.map(String::len).collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v.dedup();
    v
}

/// The last `n` bytes of the segment when they start with `.` and leave a name before.
fn ext_of(segment: &str, n: usize) -> Option<&str> {
    let start = segment.len().checked_sub(n)?;
    let e = segment.get(start..)?;
    (e.starts_with('.')).then_some(e)
}

/// The request's host (without port, brackets kept for IPv6, trailing dot dropped) and
/// port (from Host, else the VIP's). A malformed port counts as none.
fn request_host(host_header: Option<&str>, vip_port: u16) -> (&str, u16) {
    let h = host_header.unwrap_or("").trim();
    let (host, port) = split_host_port(h).unwrap_or((h, None));
    let port = port.and_then(|p| p.parse::<u16>().ok()).unwrap_or(vip_port);
    (host.strip_suffix('.').unwrap_or(host), port)
}

/// The path as routed (see the module's rule); borrowed unless it needs changing.
pub fn normalize_path(target: &str) -> Cow<'_, str> {
    let path = target.split(['?', '#']).next().unwrap_or("");
    if path.is_empty() {
        return Cow::Borrowed("/");
    }
    if !path.starts_with('/') {
        return Cow::Borrowed(path);
    }
    let clean = !path.contains(['%', ';'])
        && !path.contains("//")
        && !path.contains("/./")
        && !path.contains("/../")
        && !path.ends_with("/.")
        && !path.ends_with("/..");
    if clean {
        return Cow::Borrowed(path);
    }
    let mut segments: Vec<String> = Vec::new();
    let trailing = path.ends_with('/') || path.ends_with("/.") || path.ends_with("/..");
    for raw in path.split('/').skip(1) {
        let seg = raw.split(';').next().unwrap_or("");
        let seg = decode_unreserved(seg);
        match seg.as_ref() {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            _ => segments.push(seg.into_owned()),
        }
    }
    let mut out = String::with_capacity(path.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    Cow::Owned(out)
}

fn decode_unreserved(seg: &str) -> Cow<'_, str> {
    if !seg.contains('%') {
        return Cow::Borrowed(seg);
    }
    let b = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = seg.get(i + 1..i + 3).filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()));
            if let Some(h) = hex {
                match u8::from_str_radix(h, 16) {
                    Ok(c) if c.is_ascii_alphanumeric() || b"-._~".contains(&c) => out.push(char::from(c)),
                    _ => {
                        out.push('%');
                        out.push_str(&h.to_ascii_uppercase());
                    }
                }
                i += 3;
                continue;
            }
        }
        let ch = seg[i..].chars().next().unwrap_or('%');
        out.push(ch);
        i += ch.len_utf8();
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests;
