//! Validation: from the raw file to the model, every error with its line and field, all
//! of them in one run (`Ctx` collects them and goes on with fallback values).

use std::{
    cell::RefCell,
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::Range,
    path::PathBuf,
    str::FromStr,
    time::Duration,
};

use toml::Spanned;

use dispatcher_common::{MAX_BACKENDS, MAX_RING_SIZE, MAX_VIPS};

use super::{raw::*, *};
use crate::mac::{check_unicast_mac, parse_mac};

/// What `[dispatcher]` says.
struct DispatcherSection {
    interface: String,
    instance: String,
    bpffs: PathBuf,
    xdp_mode: XdpAttachMode,
    flow_table_size: u32,
    affinity_table_size: u32,
    log_level: String,
    admin_socket: PathBuf,
    admin_address: Option<SocketAddr>,
}

/// A log filter as `tracing_subscriber::EnvFilter` reads it: a level (`info`), or
/// directives (`info,dispatcher::http=debug`).
pub fn check_log_level(s: &str) -> Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(s)
        .map(|_| ())
        .map_err(|e| format!("`{s}` is not a log filter (a level such as info, or info,dispatcher::http=debug): {e}"))
}

/// Parse a duration such as `"2s"`, `"500ms"`, `"1m 30s"`, `"1h"` (humantime's syntax).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is not a duration (e.g. \"2s\", \"500ms\", \"1m 30s\"): {e}"))
}

/// Backend and VIP names travel in admin URLs, metric labels, logs and status tables:
/// 1 to 64 letters, digits, `.`, `_` and `-`, nothing that needs quoting anywhere.
/// An etcd client URL: `https://host:port`, or `http://host:port` (plaintext: only with
/// `insecure_plaintext`, which the caller decides). Returns whether it is TLS.
pub fn check_endpoint(e: &str) -> Result<bool, String> {
    let (tls, rest) = match (e.strip_prefix("https://"), e.strip_prefix("http://")) {
        (Some(r), _) => (true, r),
        (None, Some(r)) => (false, r),
        _ => return Err(format!("`{}`: write it as https://host:port", e.escape_debug())),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(format!("`{}`: the port is missing (etcd's client port is usually 2379)", e.escape_debug()));
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && (host.parse::<std::net::Ipv4Addr>().is_ok()
            || host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok())
            || host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
    if !host_ok || !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
        return Err(format!("`{}` is not https://host:port", e.escape_debug()));
    }
    Ok(tls)
}

/// What a client certificate without its key, and a key without its certificate, lack.
const CERT_AND_KEY: (&str, &str) = ("a client certificate needs its key", "a client key needs its certificate");

/// The most dispatchers one `[cluster]` may list.
pub const MAX_PEERS: usize = 64;

pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(format!("`{}`: use letters, digits, '.', '_' and '-' only", name.escape_debug()));
    }
    Ok(())
}

/// A `redirect_host`: a DNS name, an IPv4 address or a bracketed IPv6 address, with an
/// optional `:port` — nothing that could make the Location another scheme, path or
/// header (no `/`, `@`, `?`, `#`, spaces, controls).
pub fn check_authority(s: &str) -> Result<(), String> {
    let bad = || {
        format!("`{}` is not a host[:port] (e.g. \"shop.example.com\" or \"shop.example.com:8443\")", s.escape_debug())
    };
    let (host, port) = match s.strip_prefix('[') {
        Some(rest) => {
            let (v6, after) = rest.split_once(']').ok_or_else(bad)?;
            v6.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
            match after {
                "" => (None, None),
                p => (None, Some(p.strip_prefix(':').ok_or_else(bad)?)),
            }
        }
        None => match s.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(s), None),
        },
    };
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || !matches!(p.parse::<u32>(), Ok(1..=65535)) {
            return Err(bad());
        }
    }
    if let Some(h) = host {
        // Labels of letters, digits and '-' (not at either end), 1 to 63 each; 253 in all.
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if h.is_empty() || h.len() > 253 || !h.trim_end_matches('.').split('.').all(label_ok) {
            return Err(bad());
        }
    }
    Ok(())
}

/// Is `dir` on a bpffs mount? (`statfs`: the filesystem's magic number.)
pub fn is_bpffs(dir: &std::path::Path) -> bool {
    const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
    nix::sys::statfs::statfs(dir).is_ok_and(|st| st.filesystem_type().0 == BPF_FS_MAGIC)
}

/// An address one host can hold: not unspecified, broadcast or multicast (v4 and v6).
pub fn check_host_address(ip: IpAddr) -> Result<(), String> {
    let why = match ip {
        IpAddr::V4(a) if a.is_unspecified() => "is the unspecified address",
        IpAddr::V4(a) if a.is_broadcast() => "is the broadcast address",
        IpAddr::V4(a) if a.is_multicast() => "is a multicast address (224.0.0.0/4)",
        IpAddr::V6(a) if a.is_unspecified() => "is the unspecified address",
        IpAddr::V6(a) if a.is_multicast() => "is a multicast address (ff00::/8)",
        _ => return Ok(()),
    };
    Err(format!("{ip} {why}: name one host's address"))
}

/// Directories of the system's own files: the access log never writes under them.
pub const SYSTEM_DIRS: &[&str] = &["/etc", "/usr", "/bin", "/sbin", "/boot", "/proc", "/sys", "/dev"];

/// Where the access log may be: not under a system directory (`SYSTEM_DIRS`, and every
/// `/lib*`), and, if something is there already, a regular file that is not a symlink.
pub fn check_log_path(path: &std::path::Path) -> Result<(), String> {
    use std::path::Component;
    if path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        return Err("must not contain `.` or `..` components".into());
    }
    let first = match path.components().nth(1) {
        Some(Component::Normal(c)) => format!("/{}", c.to_string_lossy()),
        _ => return Err("must name a file".into()),
    };
    if SYSTEM_DIRS.contains(&first.as_str()) || first.starts_with("/lib") {
        return Err(format!(
            "is under {first}, a system directory (refused: {}, /lib*); write logs under /var/log",
            SYSTEM_DIRS.join(", ")
        ));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => Err("is a symbolic link: name the file itself".into()),
        Ok(m) if !m.file_type().is_file() => Err("exists and is not a regular file".into()),
        _ => Ok(()),
    }
}

/// The admin socket's path: an absolute path that fits in a Unix socket address, and
/// nothing but a socket if something is there (a live one is told apart at `run`).
pub fn check_socket_path(path: &std::path::Path) -> Result<(), String> {
    use std::os::unix::{ffi::OsStrExt, fs::FileTypeExt};
    if !path.is_absolute() {
        return Err("must be an absolute path".into());
    }
    if path.as_os_str().as_bytes().len() > MAX_SOCKET_PATH {
        return Err(format!("must be at most {MAX_SOCKET_PATH} bytes (a Unix socket address)"));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => {
            Err("exists and is not a socket: the agent would replace it (name a free path)".into())
        }
        _ => Ok(()),
    }
}

/// The longest Unix socket path (`sun_path` less its terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The bpffs directory: absolute; a bpffs, or an empty directory (or nothing) the agent
/// may mount one on.
pub fn check_bpffs_path(path: &std::path::Path) -> Result<(), String> {
    if !path.is_absolute() {
        return Err("must be an absolute path".into());
    }
    let Ok(m) = std::fs::metadata(path) else { return Ok(()) };
    if is_bpffs(path) {
        return Ok(());
    }
    if !m.is_dir() {
        return Err("exists and is not a directory".into());
    }
    match std::fs::read_dir(path).map(|mut entries| entries.next().is_some()) {
        Ok(true) => Err(format!(
            "{} is not a bpffs and not empty: the agent mounts a bpffs only on an empty directory",
            path.display()
        )),
        _ => Ok(()),
    }
}

pub fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u64;
    while d * d <= n as u64 {
        if (n as u64).is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

pub(super) struct Ctx<'a> {
    pub(super) text: &'a str,
    pub(super) file: &'a str,
    /// Every error found so far: validation goes on after one, so that a single
    /// `dispatcher check` lists all of them.
    pub(super) errors: RefCell<Vec<ConfigError>>,
}

impl Ctx<'_> {
    pub(super) fn line(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())].bytes().filter(|&b| b == b'\n').count() + 1
    }

    fn err(&self, span: Range<usize>, field: &str, message: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_string(),
            line: self.line(span.start),
            message: format!("{field}: {message}"),
        }
    }

    /// Records an error and goes on.
    fn report(&self, span: Range<usize>, field: &str, message: impl std::fmt::Display) {
        let e = self.err(span, field, message);
        self.errors.borrow_mut().push(e);
    }

    /// The value, or `fallback` after recording the error.
    fn or<T>(&self, r: Result<T, ConfigError>, fallback: T) -> T {
        r.unwrap_or_else(|e| {
            self.errors.borrow_mut().push(e);
            fallback
        })
    }

    fn parsed<T: FromStr>(&self, v: &Spanned<String>, field: &str, what: &str) -> Result<T, ConfigError> {
        v.get_ref().parse().map_err(|_| self.err(v.span(), field, format!("`{}` is not {what}", v.get_ref())))
    }

    fn choice<T: Copy>(&self, v: &Option<Spanned<String>>, field: &str, default: T, options: &[(&str, T)]) -> T {
        let Some(v) = v else { return default };
        match options.iter().find(|(name, _)| *name == v.get_ref()) {
            Some((_, t)) => *t,
            None => {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                self.report(v.span(), field, format!("`{}` is not one of {}", v.get_ref(), names.join(", ")));
                default
            }
        }
    }

    /// A duration that is more than zero and at least `min`.
    fn duration(&self, v: &Spanned<String>, field: &str, min: Duration) -> Option<Duration> {
        match parse_duration(v.get_ref()) {
            Err(e) => self.report(v.span(), field, e),
            Ok(d) if d.is_zero() => self.report(v.span(), field, "must be more than zero"),
            Ok(d) if d < min => self.report(v.span(), field, format!("must be at least {min:?}")),
            Ok(d) if d > MAX_DURATION => self.report(v.span(), field, "must be at most 1 day (86400s)"),
            Ok(d) => return Some(d),
        }
        None
    }

    /// Reports an address no single host can hold.
    fn host_address(&self, ip: IpAddr, v: &Spanned<String>, field: &str) {
        if let Err(e) = check_host_address(ip) {
            self.report(v.span(), field, e);
        }
    }

    pub(super) fn build(&self, raw: RawConfig) -> Config {
        let d = self.dispatcher(raw.dispatcher.get_ref(), raw.dispatcher.span());
        let (backends, by_name, clone_owner) = self.backends(&raw.backends);
        let vips = self.vips(&raw.vips, &raw.backends, &backends, &by_name);
        let partitions = self.partitions(&raw.partitions, &backends, &by_name, &clone_owner);
        let http = match &raw.http {
            Some(h) => self.http(h.get_ref()),
            None => HttpSettings::default(),
        };
        let health = match &raw.health {
            Some(h) => self.health(h.get_ref()),
            None => HealthSettings::default(),
        };
        for (i, v) in raw.vips.iter().enumerate() {
            if let Some(c) = v.get_ref().insert_cookie.as_ref().filter(|c| *c.get_ref() == http.cookie_name) {
                let why =
                    format!("`{}` is the session cookie (http.cookie_name): name the dispatcher's own", c.get_ref());
                self.report(c.span(), &format!("vip[{i}].insert_cookie"), why);
            }
        }
        let cluster = raw.cluster.as_ref().map(|c| self.cluster(c.get_ref()));
        let mut http = http;
        http.learn_wait = cluster.as_ref().map(|c| c.learn_wait).unwrap_or_default();
        let announce = raw.announce.as_ref().map(|a| self.announce(a.get_ref()));
        let access_log = raw.access_log.as_ref().map(|a| self.access_log(a.get_ref()));
        Config {
            interface: d.interface,
            instance: d.instance,
            bpffs: d.bpffs,
            xdp_mode: d.xdp_mode,
            flow_table_size: d.flow_table_size,
            affinity_table_size: d.affinity_table_size,
            log_level: d.log_level,
            admin_socket: d.admin_socket,
            admin_address: d.admin_address,
            backends,
            vips,
            partitions,
            http,
            health,
            cluster,
            announce,
            access_log,
        }
    }

    /// `[access_log]`.
    fn access_log(&self, a: &RawAccessLog) -> AccessLogSettings {
        let p = a.path.get_ref();
        let path = if p == "-" {
            None
        } else {
            if !p.starts_with('/') {
                self.report(a.path.span(), "access_log.path", "must be an absolute path, or \"-\" for standard output");
            } else if let Err(e) = check_log_path(std::path::Path::new(p)) {
                self.report(a.path.span(), "access_log.path", e);
            }
            Some(PathBuf::from(p))
        };
        let format = self.choice(
            &a.format,
            "access_log.format",
            AccessLogFormat::Json,
            &[("json", AccessLogFormat::Json), ("haproxy", AccessLogFormat::Haproxy)],
        );
        let buffer = match &a.buffer {
            Some(b) if !(16..=1 << 22).contains(b.get_ref()) => {
                self.report(b.span(), "access_log.buffer", "must be 16..=4194304 (lines waiting for the writer)");
                AccessLogSettings::DEFAULT_BUFFER
            }
            Some(b) => *b.get_ref(),
            None => AccessLogSettings::DEFAULT_BUFFER,
        };
        AccessLogSettings { path, format, buffer }
    }

    /// `[cluster]`.
    fn cluster(&self, c: &RawCluster) -> ClusterSettings {
        if let Err(e) = check_name(c.name.get_ref()) {
            self.report(c.name.span(), "cluster.name", e);
        }
        let mut endpoints = Vec::new();
        let mut schemes = HashSet::new();
        if c.endpoints.get_ref().is_empty() {
            self.report(c.endpoints.span(), "cluster.endpoints", "name at least one etcd member (https://host:port)");
        }
        for e in c.endpoints.get_ref() {
            match check_endpoint(e.get_ref()) {
                Ok(_) if endpoints.contains(e.get_ref()) => self.report(e.span(), "cluster.endpoints", "listed twice"),
                Ok(tls) => {
                    schemes.insert(tls);
                    endpoints.push(e.get_ref().clone());
                }
                Err(why) => self.report(e.span(), "cluster.endpoints", why),
            }
        }
        if schemes.len() > 1 {
            self.report(c.endpoints.span(), "cluster.endpoints", "all https:// or all http://, not both");
        }
        let security = self.store_security(c, schemes.contains(&false));
        let mut peers: Vec<String> = Vec::new();
        let mut peer_macs = std::collections::BTreeMap::new();
        match &c.peers {
            None => self.report(
                c.name.span(),
                "cluster.peers",
                "list every dispatcher of this cluster by name (this one too): a member key of any other name is not counted",
            ),
            Some(list) => {
                for p in list.get_ref() {
                    let (name, mac) = match p.get_ref().split_once('@') {
                        Some((n, m)) => (n, Some(m)),
                        None => (p.get_ref().as_str(), None),
                    };
                    if let Err(e) = check_name(name) {
                        self.report(p.span(), "cluster.peers", e);
                    } else if peers.iter().any(|x| x == name) {
                        self.report(p.span(), "cluster.peers", format!("`{name}` is listed twice"));
                    } else {
                        peers.push(name.to_string());
                    }
                    if let Some(m) = mac {
                        match parse_mac(m) {
                            Ok(mac) if crate::mac::is_unicast(&mac) => {
                                peer_macs.insert(name.to_string(), mac);
                            }
                            _ => self.report(
                                p.span(),
                                "cluster.peers",
                                format!("`{}`: write name or name@MAC with a unicast, non-zero MAC", p.get_ref()),
                            ),
                        }
                    }
                }
                if !peers.contains(c.name.get_ref()) {
                    self.report(
                        list.span(),
                        "cluster.peers",
                        format!("does not list this dispatcher (`{}`, cluster.name)", c.name.get_ref()),
                    );
                }
                if peers.len() > MAX_PEERS {
                    self.report(list.span(), "cluster.peers", format!("at most {MAX_PEERS} dispatchers"));
                }
            }
        }
        let key_prefix = match &c.key_prefix {
            None => ClusterSettings::DEFAULT_KEY_PREFIX.to_string(),
            Some(p) => {
                let v = p.get_ref();
                let ok = v.starts_with('/')
                    && v.len() > 1
                    && v.len() <= 128
                    && !v.ends_with('/')
                    && v.bytes().all(|b| b.is_ascii_graphic());
                if !ok {
                    self.report(
                        p.span(),
                        "cluster.key_prefix",
                        "must start with '/', not end with '/', and be 2 to 128 printable characters without spaces",
                    );
                }
                v.clone()
            }
        };
        let dur = |v: &Option<Spanned<String>>, field: &str, min: Duration, default: Duration| {
            v.as_ref().map_or(default, |v| self.duration(v, field, min).unwrap_or(default))
        };
        let lease_ttl =
            dur(&c.lease_ttl, "cluster.lease_ttl", Duration::from_secs(2), ClusterSettings::DEFAULT_LEASE_TTL);
        let request_timeout = dur(
            &c.request_timeout,
            "cluster.request_timeout",
            Duration::from_millis(100),
            ClusterSettings::DEFAULT_REQUEST_TIMEOUT,
        );
        let startup_wait = dur(
            &c.startup_wait,
            "cluster.startup_wait",
            Duration::from_millis(100),
            ClusterSettings::DEFAULT_STARTUP_WAIT,
        );
        if lease_ttl.as_secs() * 1000 != lease_ttl.as_millis() as u64 {
            if let Some(v) = &c.lease_ttl {
                self.report(v.span(), "cluster.lease_ttl", "etcd leases are in whole seconds");
            }
        }
        if request_timeout * 2 > lease_ttl {
            let span = c.request_timeout.as_ref().or(c.lease_ttl.as_ref()).map(|v| v.span()).unwrap_or(c.name.span());
            self.report(
                span,
                "cluster.request_timeout",
                "must be at most half of cluster.lease_ttl (a renewal must fit in the lease)",
            );
        }
        let second_chance = dur(
            &c.second_chance,
            "cluster.second_chance",
            Duration::from_secs(1),
            ClusterSettings::DEFAULT_SECOND_CHANCE,
        );
        let learn_wait = match &c.learn_wait {
            None => ClusterSettings::DEFAULT_LEARN_WAIT,
            // "0s": off.
            Some(v) if parse_duration(v.get_ref()).is_ok_and(|d| d.is_zero()) => Duration::ZERO,
            Some(v) => {
                let d = self
                    .duration(v, "cluster.learn_wait", Duration::from_millis(1))
                    .unwrap_or(ClusterSettings::DEFAULT_LEARN_WAIT);
                if d > Duration::from_secs(5) {
                    self.report(
                        v.span(),
                        "cluster.learn_wait",
                        "must be at most 5s (each request with an unknown clone ID may wait this long)",
                    );
                }
                d
            }
        };
        ClusterSettings {
            learn_wait,
            name: c.name.get_ref().clone(),
            endpoints,
            peers,
            peer_macs,
            security,
            key_prefix,
            lease_ttl,
            request_timeout,
            startup_wait,
            steering: c.steering.as_ref().is_none_or(|v| *v.get_ref()),
            second_chance,
        }
    }

    /// Two settings that go together (a certificate and its key, a user and its
    /// password file): both, or neither; one alone is reported at the missing one's field
    /// (`why`: what the first needs, what the second needs).
    fn pair<'a>(
        &self,
        (a, a_field): (&'a Option<Spanned<String>>, &str),
        (b, b_field): (&'a Option<Spanned<String>>, &str),
        (a_needs, b_needs): (&str, &str),
    ) -> Option<(&'a Spanned<String>, &'a Spanned<String>)> {
        match (a, b) {
            (Some(a), Some(b)) => Some((a, b)),
            (Some(a), None) => {
                self.report(a.span(), b_field, a_needs);
                None
            }
            (None, Some(b)) => {
                self.report(b.span(), a_field, b_needs);
                None
            }
            (None, None) => None,
        }
    }

    /// `[cluster]`'s TLS files and credentials; `plaintext`: the endpoints are `http://`.
    fn store_security(&self, c: &RawCluster, plaintext: bool) -> StoreSecurity {
        let insecure = c.insecure_plaintext.as_ref().is_some_and(|v| *v.get_ref());
        let tls_fields = [
            (c.ca_file.as_ref(), "cluster.ca_file"),
            (c.cert.as_ref(), "cluster.cert"),
            (c.key.as_ref(), "cluster.key"),
            (c.username.as_ref(), "cluster.username"),
            (c.password_file.as_ref(), "cluster.password_file"),
        ];
        if plaintext {
            if !insecure {
                self.report(
                    c.endpoints.span(),
                    "cluster.endpoints",
                    "http:// is plaintext without authentication: anyone who can reach etcd could join this cluster and \
                     take its traffic; use https:// with ca_file, cert/key or username/password_file (or, knowing that, \
                     set insecure_plaintext = true)",
                );
            }
            for (v, field) in tls_fields {
                if let Some(v) = v {
                    self.report(v.span(), field, "needs https:// endpoints (credentials never go over plaintext)");
                }
            }
            return StoreSecurity::Plaintext;
        }
        if let Some(v) = c.insecure_plaintext.as_ref().filter(|v| *v.get_ref()) {
            self.report(v.span(), "cluster.insecure_plaintext", "the endpoints are https://: remove it");
        }
        let client_cert = self
            .pair((&c.cert, "cluster.cert"), (&c.key, "cluster.key"), CERT_AND_KEY)
            .map(|(cert, key)| (self.path(cert, "cluster.cert"), self.path(key, "cluster.key")));
        let user = self
            .pair(
                (&c.username, "cluster.username"),
                (&c.password_file, "cluster.password_file"),
                ("an etcd user needs its password file", "a password file needs its etcd user"),
            )
            .map(|(u, p)| {
                let name = u.get_ref();
                if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                    self.report(u.span(), "cluster.username", "1 to 128 printable characters without spaces");
                }
                (name.clone(), self.path(p, "cluster.password_file"))
            });
        StoreSecurity::Tls { ca_file: c.ca_file.as_ref().map(|f| self.path(f, "cluster.ca_file")), client_cert, user }
    }

    /// `[announce]`.
    fn announce(&self, a: &RawAnnounce) -> AnnounceSettings {
        let iface = |v: &Option<Spanned<String>>, field: &str, default: &str, max: usize| -> Option<String> {
            let Some(v) = v else { return Some(default.to_string()) };
            let name = v.get_ref();
            if name.is_empty() {
                return None;
            }
            // IFNAMSIZ - 1 (less one for the L4 interface's veth peer, NAME + "p"), and
            // what `ip link` accepts.
            let ok = name.len() <= max && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !ok {
                self.report(
                    v.span(),
                    field,
                    format!("an interface name: 1 to {max} of [A-Za-z0-9._-] (\"\" for none)"),
                );
            }
            Some(name.clone())
        };
        let http_interface =
            iface(&a.http_interface, "announce.http_interface", AnnounceSettings::DEFAULT_HTTP_INTERFACE, 15);
        let l4_interface = iface(&a.l4_interface, "announce.l4_interface", AnnounceSettings::DEFAULT_L4_INTERFACE, 14);
        if http_interface.is_some() && http_interface == l4_interface {
            let span = a.l4_interface.as_ref().or(a.http_interface.as_ref()).map(|v| v.span()).unwrap_or(0..0);
            self.report(span, "announce.l4_interface", "must differ from announce.http_interface");
        }
        AnnounceSettings { http_interface, l4_interface }
    }

    /// `[dispatcher]`.
    fn dispatcher(&self, d: &RawDispatcher, section: Range<usize>) -> DispatcherSection {
        let interface = d.interface.get_ref().clone();
        if interface.is_empty() || interface.len() > 15 {
            self.report(d.interface.span(), "dispatcher.interface", "must be an interface name of 1 to 15 bytes");
        } else if interface == "."
            || interface == ".."
            || interface.bytes().any(|b| b == b'/' || b <= b' ' || b == 0x7f)
        {
            // What the kernel's dev_valid_name refuses: no interface can have this name.
            self.report(
                d.interface.span(),
                "dispatcher.interface",
                "is not an interface name (no '/', spaces, . or ..)",
            );
        }
        let instance = d.instance.as_ref().map(|s| s.get_ref().clone()).unwrap_or_else(|| "default".into());
        if instance.is_empty() || !instance.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            let span = d.instance.as_ref().map(|s| s.span()).unwrap_or(section.clone());
            self.report(span, "dispatcher.instance", "use letters, digits, '-' and '_' only");
        } else if instance.len() > 64 {
            // It names files (/run/dispatcher/<instance>.*) and the pin directory.
            let span = d.instance.as_ref().map(|s| s.span()).unwrap_or(section);
            self.report(span, "dispatcher.instance", "must be at most 64 characters");
        }
        let xdp_mode = self.choice(
            &d.xdp_mode,
            "dispatcher.xdp_mode",
            XdpAttachMode::Auto,
            &[("auto", XdpAttachMode::Auto), ("native", XdpAttachMode::Native), ("generic", XdpAttachMode::Generic)],
        );
        let table = |v: &Option<Spanned<u32>>, field: &str, default: u32| match v {
            None => default,
            Some(s) if (1024..=MAX_TABLE_SIZE).contains(s.get_ref()) => *s.get_ref(),
            Some(s) if *s.get_ref() < 1024 => {
                self.report(s.span(), field, "must be at least 1024");
                default
            }
            Some(s) => {
                self.report(s.span(), field, format!("must be at most {MAX_TABLE_SIZE} (about {MAX_TABLE_MEMORY} of kernel memory for FLOWS at that size)"));
                default
            }
        };
        let flow_table_size =
            table(&d.flow_table_size, "dispatcher.flow_table_size", dispatcher_common::DEFAULT_MAX_FLOWS);
        let affinity_table_size =
            table(&d.affinity_table_size, "dispatcher.affinity_table_size", dispatcher_common::DEFAULT_MAX_AFFINITY);
        let log_level = match &d.log_level {
            Some(l) => {
                if let Err(e) = check_log_level(l.get_ref()) {
                    self.report(l.span(), "dispatcher.log_level", e);
                }
                l.get_ref().clone()
            }
            None => "info".into(),
        };
        let admin_socket = match &d.admin_socket {
            Some(p) => match check_socket_path(std::path::Path::new(p.get_ref())) {
                Err(e) => {
                    self.report(p.span(), "dispatcher.admin_socket", e);
                    PathBuf::new()
                }
                Ok(()) => PathBuf::from(p.get_ref()),
            },
            None => PathBuf::from(format!("/run/dispatcher/{instance}.sock")),
        };
        let admin_address = d.admin_address.as_ref().and_then(|a| {
            let r = self.parsed::<SocketAddr>(a, "dispatcher.admin_address", "an address:port such as 127.0.0.1:9901");
            let addr = self.or(r.map(Some), None)?;
            if addr.port() == 0 {
                self.report(a.span(), "dispatcher.admin_address", "the port must be 1..=65535");
            } else if addr.ip().is_multicast() || matches!(addr.ip(), IpAddr::V4(v) if v.is_broadcast()) {
                self.report(
                    a.span(),
                    "dispatcher.admin_address",
                    "must be an address of this host (or 0.0.0.0 / [::])",
                );
            }
            Some(addr)
        });
        let bpffs = PathBuf::from(d.bpffs.as_ref().map(|s| s.get_ref().as_str()).unwrap_or("/sys/fs/bpf"));
        if let Some(b) = &d.bpffs {
            if let Err(e) = check_bpffs_path(&bpffs) {
                self.report(b.span(), "dispatcher.bpffs", e);
            }
        }
        DispatcherSection {
            interface,
            instance,
            bpffs,
            xdp_mode,
            flow_table_size,
            affinity_table_size,
            log_level,
            admin_socket,
            admin_address,
        }
    }

    /// `[[backend]]`: the backends, their ids by name, and which backend each configured
    /// clone ID belongs to.
    #[allow(clippy::type_complexity)]
    fn backends(&self, raw: &[Spanned<RawBackend>]) -> (Vec<Backend>, HashMap<String, usize>, HashMap<String, usize>) {
        if raw.len() > MAX_BACKENDS as usize {
            self.report(raw[MAX_BACKENDS as usize].span(), "backend", format!("at most {MAX_BACKENDS} backends"));
        }
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (i, b) in raw.iter().enumerate() {
            let name = b.get_ref().name.get_ref();
            if let Err(e) = check_name(name) {
                self.report(b.get_ref().name.span(), &format!("backend[{i}].name"), e);
            } else if by_name.contains_key(name) {
                self.report(
                    b.get_ref().name.span(),
                    &format!("backend[{i}].name"),
                    format!("`{name}` is defined twice"),
                );
            } else {
                by_name.insert(name.clone(), i);
            }
        }
        let mut clone_owner: HashMap<String, usize> = HashMap::new();
        let mut backends = Vec::new();
        for (i, b) in raw.iter().enumerate() {
            let b = b.get_ref();
            let f = |field: &str| format!("backend[{i}].{field}");
            let address: Ipv4Addr = match self.parsed::<Ipv4Addr>(&b.address, &f("address"), "an IPv4 address") {
                Ok(a) => {
                    self.host_address(IpAddr::V4(a), &b.address, &f("address"));
                    a
                }
                Err(e) => self.or(Err(e), Ipv4Addr::UNSPECIFIED),
            };
            let address6 =
                b.address6.as_ref().map(|a| match self.parsed::<Ipv6Addr>(a, &f("address6"), "an IPv6 address") {
                    Ok(ip) => {
                        self.host_address(IpAddr::V6(ip), a, &f("address6"));
                        ip
                    }
                    Err(e) => self.or(Err(e), Ipv6Addr::UNSPECIFIED),
                });
            // A bad MAC is reported here; the VIP checks then treat it as given.
            let mac = b.mac.as_ref().map(|m| {
                let mac = parse_mac(m.get_ref()).and_then(|mac| check_unicast_mac(&mac).map(|()| mac));
                self.or(mac.map_err(|e| self.err(m.span(), &f("mac"), e)), [2, 0, 0, 0, 0, 0])
            });
            let weight = match &b.weight {
                Some(w) if *w.get_ref() == 0 || *w.get_ref() > 10_000 => {
                    self.report(w.span(), &f("weight"), "must be 1..=10000 (drain a backend instead of weight 0)");
                    100
                }
                Some(w) => *w.get_ref(),
                None => 100,
            };
            let maxconn = b.maxconn.as_ref().and_then(|m| {
                if !(1..=1_000_000).contains(m.get_ref()) {
                    self.report(m.span(), &f("maxconn"), "must be 1..=1000000 (requests in flight at once)");
                    return None;
                }
                Some(*m.get_ref())
            });
            let maxqueue = match &b.maxqueue {
                Some(q) if maxconn.is_none() && b.maxconn.is_none() => {
                    self.report(q.span(), &f("maxqueue"), "applies with maxconn only (no limit, no queue)");
                    Backend::DEFAULT_MAXQUEUE
                }
                Some(q) if *q.get_ref() > 1_000_000 => {
                    self.report(q.span(), &f("maxqueue"), "must be 0..=1000000");
                    Backend::DEFAULT_MAXQUEUE
                }
                Some(q) => *q.get_ref(),
                None => Backend::DEFAULT_MAXQUEUE,
            };
            let replica = b.replica.as_ref().and_then(|r| match by_name.get(r.get_ref()) {
                None => {
                    self.report(r.span(), &f("replica"), format!("names no backend: `{}`", r.get_ref()));
                    None
                }
                Some(&ri) if ri == i => {
                    self.report(r.span(), &f("replica"), "a backend cannot be its own replica");
                    None
                }
                Some(&ri) => Some(ri),
            });
            let ids = b
                .clone_ids
                .iter()
                .map(|c| (c, "clone_ids", "clone ID"))
                .chain(b.logical_names.iter().map(|c| (c, "logical_names", "logical name")));
            for (c, field, what) in ids {
                let id = c.get_ref();
                let token = id.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if id.is_empty() || id.len() > 64 || !token {
                    let shown = id.escape_debug();
                    self.report(
                        c.span(),
                        &f(field),
                        format!("`{shown}`: 1 to 64 token characters (no ':', spaces, quotes or separators)"),
                    );
                } else if field == "logical_names" && dispatcher_common::sip::logical_name(id.as_bytes()).is_some() {
                    self.report(
                        c.span(),
                        &f(field),
                        format!("`{id}` looks like a whole session ID: give the logical name before its `.<digits>`"),
                    );
                } else if let Some(&prev) = clone_owner.get(id) {
                    self.report(
                        c.span(),
                        &f(field),
                        format!(
                            "{what} `{id}` is already a clone ID or logical name of backend `{}`",
                            raw[prev].get_ref().name.get_ref()
                        ),
                    );
                } else {
                    clone_owner.insert(id.clone(), i);
                }
            }
            backends.push(Backend {
                name: b.name.get_ref().clone(),
                address,
                address6,
                mac,
                weight,
                replica,
                clone_ids: b.clone_ids.iter().map(|c| c.get_ref().clone()).collect(),
                logical_names: b.logical_names.iter().map(|c| c.get_ref().clone()).collect(),
                maxconn,
                maxqueue,
                slow_start: b
                    .slow_start
                    .as_ref()
                    .and_then(|s| self.duration(s, &f("slow_start"), Duration::from_millis(100))),
                retired: false,
            });
        }
        (backends, by_name, clone_owner)
    }

    /// `[[vip]]`.
    fn vips(
        &self,
        raw: &[Spanned<RawVip>],
        raw_backends: &[Spanned<RawBackend>],
        backends: &[Backend],
        by_name: &HashMap<String, usize>,
    ) -> Vec<Vip> {
        if raw.len() > MAX_VIPS as usize {
            self.report(raw[MAX_VIPS as usize].span(), "vip", format!("at most {MAX_VIPS} VIPs"));
        }
        let mut groups: HashMap<String, u32> = HashMap::new();
        let mut seen: HashSet<(IpAddr, u16, Protocol)> = HashSet::new();
        let mut names: HashSet<String> = HashSet::new();
        let mut vips = Vec::new();
        let mut redirects = Vec::new();
        for (i, v) in raw.iter().enumerate() {
            let v = v.get_ref();
            let f = |field: &str| format!("vip[{i}].{field}");
            if let Err(e) = check_name(v.name.get_ref()) {
                self.report(v.name.span(), &f("name"), e);
            } else if !names.insert(v.name.get_ref().clone()) {
                self.report(v.name.span(), &f("name"), format!("`{}` is defined twice", v.name.get_ref()));
            }
            let address: IpAddr = match self.parsed::<IpAddr>(&v.address, &f("address"), "an IP address") {
                Ok(a) => {
                    self.host_address(a, &v.address, &f("address"));
                    a
                }
                Err(e) => self.or(Err(e), IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            };
            if *v.port.get_ref() == 0 {
                self.report(v.port.span(), &f("port"), "must be 1..=65535");
            }
            let mode = self.choice(
                &v.mode,
                &f("mode"),
                VipMode::L4,
                &[("l4", VipMode::L4), ("http", VipMode::Http), ("sip", VipMode::Sip)],
            );
            let protocol = self.choice(
                &v.protocol,
                &f("protocol"),
                if mode == VipMode::Sip { Protocol::Udp } else { Protocol::Tcp },
                &[("tcp", Protocol::Tcp), ("udp", Protocol::Udp)],
            );
            if !seen.insert((address, *v.port.get_ref(), protocol)) {
                self.report(v.port.span(), &f("port"), "another VIP has the same address, port and protocol");
            }
            if mode == VipMode::Http && protocol != Protocol::Tcp {
                self.report(v.mode.as_ref().unwrap().span(), &f("mode"), "http needs protocol tcp");
            }
            if mode == VipMode::Sip && protocol != Protocol::Udp {
                let span = v.protocol.as_ref().map(|p| p.span()).unwrap_or(v.mode.as_ref().unwrap().span());
                self.report(span, &f("protocol"), "sip VIPs are SIP over UDP (a TCP SIP service is an l4 VIP)");
            }
            let forwarding = self.choice(
                &v.forwarding,
                &f("forwarding"),
                Forwarding::Mac,
                &[("mac", Forwarding::Mac), ("ipip", Forwarding::Ipip)],
            );
            let encap_source = v.encap_source.as_ref().and_then(|a| {
                let ip = self.or(self.parsed::<IpAddr>(a, &f("encap_source"), "an IP address").map(Some), None)?;
                if ip.is_ipv4() != address.is_ipv4() {
                    self.report(a.span(), &f("encap_source"), "must be of the VIP's address family");
                } else {
                    self.host_address(ip, a, &f("encap_source"));
                }
                Some(ip)
            });
            let in_xdp = mode == VipMode::L4 || mode == VipMode::Sip;
            if in_xdp && forwarding == Forwarding::Ipip && v.encap_source.is_none() {
                let span = v.forwarding.as_ref().unwrap().span();
                self.report(span, &f("encap_source"), "required with forwarding = \"ipip\"");
            }
            let mut members: Vec<usize> = Vec::new();
            match &v.backends {
                Some(list) => {
                    for n in list.get_ref() {
                        match by_name.get(n.get_ref()) {
                            None => {
                                self.report(n.span(), &f("backends"), format!("names no backend: `{}`", n.get_ref()))
                            }
                            Some(bi) if members.contains(bi) => {
                                self.report(n.span(), &f("backends"), format!("`{}` listed twice", n.get_ref()))
                            }
                            Some(&bi) => members.push(bi),
                        }
                    }
                }
                None => members.extend(0..backends.len()),
            }
            if members.is_empty() && v.redirect_to.is_none() {
                let span = v.backends.as_ref().map(|l| l.span()).unwrap_or(v.name.span());
                self.report(
                    span,
                    &f("backends"),
                    "a VIP needs at least one backend (with none, an L4 VIP drops all its traffic and an HTTP VIP answers only 503)",
                );
            }
            if in_xdp {
                for &bi in &members {
                    let b = &backends[bi];
                    let span = raw_backends[bi].span();
                    if b.mac.is_none() {
                        self.report(
                            span.clone(),
                            &format!("backend[{bi}].mac"),
                            format!("required: backend `{}` serves L4 VIP `{}`", b.name, v.name.get_ref()),
                        );
                    }
                    if forwarding == Forwarding::Ipip && address.is_ipv6() && b.address6.is_none() {
                        self.report(
                            span,
                            &format!("backend[{bi}].address6"),
                            format!("required: backend `{}` serves IPv6 IPIP VIP `{}`", b.name, v.name.get_ref()),
                        );
                    }
                }
            }
            let ring_size = match &v.ring_size {
                Some(r) => {
                    let n = *r.get_ref();
                    if !is_prime(n) || n > MAX_RING_SIZE {
                        self.report(
                            r.span(),
                            &f("ring_size"),
                            format!("{n} must be a prime no larger than {MAX_RING_SIZE}"),
                        );
                    } else if (n as usize) < members.len() * 10 {
                        self.report(
                            r.span(),
                            &f("ring_size"),
                            format!("{n} is too small for {} backends (want at least 10 slots each)", members.len()),
                        );
                    }
                    n
                }
                None => dispatcher_common::DEFAULT_RING_SIZE,
            };
            let sticky_time = v.sticky_time.as_ref().and_then(|s| {
                let d = self.duration(s, &f("sticky_time"), Duration::from_secs(1))?;
                if d.as_secs() > u32::MAX as u64 {
                    self.report(s.span(), &f("sticky_time"), "is too long");
                }
                Some(d)
            });
            let next = groups.len() as u32 + MAX_VIPS;
            let port_group = match &v.port_group {
                Some(g) => *groups.entry(g.get_ref().clone()).or_insert(next),
                None => i as u32,
            };
            let balance = self.choice(
                &v.balance,
                &f("balance"),
                Balance::RoundRobin,
                &[("round_robin", Balance::RoundRobin), ("least_outstanding", Balance::LeastOutstanding)],
            );
            let session_format = self.choice(
                &v.session_format,
                &f("session_format"),
                SessionFormat::WebSphere,
                &[("websphere", SessionFormat::WebSphere), ("jvmroute", SessionFormat::JvmRoute)],
            );
            if session_format == SessionFormat::JvmRoute {
                // The route is what follows the last `.`: a clone ID with a `.` never matches.
                for &bi in &members {
                    for c in raw_backends[bi].get_ref().clone_ids.iter().filter(|c| c.get_ref().contains('.')) {
                        self.report(
                            c.span(),
                            &format!("backend[{bi}].clone_ids"),
                            format!(
                                "`{}` cannot be a jvmRoute of VIP `{}` (session_format = \"jvmroute\"): the route is what follows the last '.'",
                                c.get_ref(),
                                v.name.get_ref()
                            ),
                        );
                    }
                }
            }
            let max_connections = v.max_connections.as_ref().and_then(|m| {
                if !(1..=MAX_CLIENT_CONNECTIONS).contains(m.get_ref()) {
                    self.report(m.span(), &f("max_connections"), format!("must be 1..={MAX_CLIENT_CONNECTIONS}"));
                    return None;
                }
                if mode != VipMode::Http {
                    self.report(m.span(), &f("max_connections"), "applies to HTTP VIPs only");
                }
                Some(*m.get_ref())
            });
            let backend_port = match &v.backend_port {
                Some(p) if *p.get_ref() == 0 => {
                    self.report(p.span(), &f("backend_port"), "must be 1..=65535");
                    *v.port.get_ref()
                }
                Some(p) => *p.get_ref(),
                None => *v.port.get_ref(),
            };
            let tls = v.tls.as_ref().map(|t| self.vip_tls(t, &f("tls")));
            let backend_tls = v.backend_tls.as_ref().map(|t| self.backend_tls(t.get_ref(), &f("backend_tls")));
            for (set, field) in [
                (v.tls.as_ref().map(|t| t.span()), "tls"),
                (v.backend_tls.as_ref().map(|t| t.span()), "backend_tls"),
                (v.redirect_to.as_ref().map(|t| t.span()), "redirect_to"),
                (v.fail_back.as_ref().map(|t| t.span()), "fail_back"),
                (v.session_format.as_ref().map(|t| t.span()), "session_format"),
                (v.insert_cookie.as_ref().map(|t| t.span()), "insert_cookie"),
            ] {
                if let Some(span) = set {
                    if mode != VipMode::Http {
                        self.report(span, &f(field), "applies to HTTP VIPs only");
                    }
                }
            }
            if let (Some(r), Some(_)) = (&v.redirect_to, &v.tls) {
                self.report(r.span(), &f("redirect_to"), "a redirecting VIP is plain HTTP (no [vip.tls])");
            }
            if let (Some(h), None) = (&v.redirect_host, &v.redirect_to) {
                self.report(h.span(), &f("redirect_host"), "applies to a redirecting VIP only (with redirect_to)");
            }
            if let Some(h) = &v.redirect_host {
                if let Err(e) = check_authority(h.get_ref()) {
                    self.report(h.span(), &f("redirect_host"), e);
                }
            }
            if let Some(r) = &v.redirect_to {
                redirects.push((vips.len(), r, v.redirect_host.as_ref().map(|h| h.get_ref().clone())));
                // It forwards nothing: no members (no pools, no health checks for it).
                for (set, field) in [
                    (v.backends.as_ref().map(|b| b.span()), "backends"),
                    (v.backend_port.as_ref().map(|b| b.span()), "backend_port"),
                    (v.backend_tls.as_ref().map(|b| b.span()), "backend_tls"),
                    (v.balance.as_ref().map(|b| b.span()), "balance"),
                ] {
                    if let Some(span) = set {
                        self.report(span, &f(field), "a redirecting VIP forwards nothing (remove it or redirect_to)");
                    }
                }
                members.clear();
            }
            vips.push(Vip {
                name: v.name.get_ref().clone(),
                address,
                port: *v.port.get_ref(),
                protocol,
                mode,
                forwarding,
                encap_source,
                backends: members,
                ring_size,
                sticky_time,
                port_group,
                balance,
                backend_port,
                max_connections,
                tls,
                backend_tls,
                redirect_to: None,
                fail_back: v.fail_back.as_ref().is_none_or(|b| *b.get_ref()),
                session_format,
                slow_start: v
                    .slow_start
                    .as_ref()
                    .and_then(|s| self.duration(s, &f("slow_start"), Duration::from_millis(100))),
                insert_cookie: v.insert_cookie.as_ref().and_then(|c| {
                    let t = c.get_ref();
                    let token = t.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                    if t.is_empty() || t.len() > 64 || !token {
                        self.report(
                            c.span(),
                            &f("insert_cookie"),
                            format!("`{t}` is not a cookie name (1 to 64 token characters)"),
                        );
                        return None;
                    }
                    Some(t.clone())
                }),
                retired: false,
            });
        }
        for (i, name, host) in redirects {
            match vips.iter().find(|t| &t.name == name.get_ref()) {
                Some(t) if t.tls.is_some() => {
                    vips[i].redirect_to =
                        Some(Redirect { vip: t.name.clone(), address: t.address, port: t.port, host });
                }
                Some(_) => self.report(
                    name.span(),
                    &format!("vip[{i}].redirect_to"),
                    format!("`{}` is not an HTTPS VIP (it has no [vip.tls])", name.get_ref()),
                ),
                None => self.report(
                    name.span(),
                    &format!("vip[{i}].redirect_to"),
                    format!("names no VIP: `{}`", name.get_ref()),
                ),
            }
        }
        self.no_loops(raw, raw_backends, backends, &vips);
        vips
    }

    /// An HTTP VIP whose backend is one of the HTTP VIPs (itself or another: the
    /// address and port its pool connects to is where a VIP listens) forwards its
    /// requests back to the dispatcher: one request becomes hundreds until the
    /// descriptors run out. A VIP on a wildcard address listens on every local address:
    /// a loopback backend on its port is one too. (A loop through another local address
    /// or another proxy is caught at run time by the Via marker: 508.)
    fn no_loops(
        &self,
        raw: &[Spanned<RawVip>],
        raw_backends: &[Spanned<RawBackend>],
        backends: &[Backend],
        vips: &[Vip],
    ) {
        let listening: Vec<(IpAddr, u16, &str)> =
            vips.iter().filter(|v| v.serves_http()).map(|v| (v.address, v.port, v.name.as_str())).collect();
        for (i, v) in vips.iter().enumerate().filter(|(_, v)| v.serves_http()) {
            for &bi in &v.backends {
                let addr = IpAddr::V4(backends[bi].address);
                let hit = listening.iter().find(|(a, p, _)| {
                    *p == v.backend_port
                        && (*a == addr || (a.is_unspecified() && (addr.is_loopback() || addr.is_unspecified())))
                });
                if let Some((a, p, name)) = hit {
                    let span = raw[i].get_ref().backends.as_ref().map(|b| b.span()).unwrap_or(raw_backends[bi].span());
                    self.report(
                        span,
                        &format!("vip[{i}].backends"),
                        format!(
                            "backend `{}` ({addr}:{}) is HTTP VIP `{name}` ({}): its requests would come back to this dispatcher (a loop)",
                            backends[bi].name,
                            v.backend_port,
                            std::net::SocketAddr::new(*a, *p)
                        ),
                    );
                }
            }
        }
    }

    /// A path in the file, relative to the file's folder.
    fn path(&self, v: &Spanned<String>, field: &str) -> PathBuf {
        if v.get_ref().is_empty() {
            self.report(v.span(), field, "is empty");
        }
        let p = PathBuf::from(v.get_ref());
        match std::path::Path::new(self.file).parent() {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p,
        }
    }

    /// `[vip.tls]`. The files are read when the VIP starts (and by `dispatcher check`).
    fn vip_tls(&self, t: &Spanned<RawTls>, field: &str) -> VipTls {
        let raw = t.get_ref();
        if raw.certificates.is_empty() {
            self.report(t.span(), field, "needs at least one [[...tls.certificate]] (cert and key files)");
        }
        let certificates = raw
            .certificates
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let c = c.get_ref();
                let f = |x: &str| format!("{field}.certificate[{j}].{x}");
                let names = c
                    .names
                    .iter()
                    .flat_map(|n| n.get_ref())
                    .filter_map(|n| {
                        let name = n.get_ref().to_ascii_lowercase();
                        let bare = name.strip_prefix("*.").unwrap_or(&name);
                        let ok = !bare.is_empty()
                            && bare.len() <= 253
                            && bare
                                .split('.')
                                .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                        if !ok {
                            self.report(
                                n.span(),
                                &f("names"),
                                format!("`{}` is not a DNS name or *.wildcard", n.get_ref()),
                            );
                        }
                        ok.then_some(name)
                    })
                    .collect();
                CertFiles { cert: self.path(&c.cert, &f("cert")), key: self.path(&c.key, &f("key")), names }
            })
            .collect();
        let handshake_timeout = raw
            .handshake_timeout
            .as_ref()
            .and_then(|d| self.duration(d, &format!("{field}.handshake_timeout"), Duration::from_millis(100)))
            .unwrap_or(Duration::from_secs(5));
        let min_version = self.choice(
            &raw.min_version,
            &format!("{field}.min_version"),
            TlsVersion::Tls12,
            &[("1.2", TlsVersion::Tls12), ("1.3", TlsVersion::Tls13)],
        );
        VipTls {
            certificates,
            strict_sni: raw.strict_sni.as_ref().is_some_and(|b| *b.get_ref()),
            handshake_timeout,
            min_version,
        }
    }

    /// `[vip.backend_tls]`.
    fn backend_tls(&self, t: &RawBackendTls, field: &str) -> BackendTlsFiles {
        let f = |x: &str| format!("{field}.{x}");
        let client_cert = self
            .pair((&t.cert, &f("cert")), (&t.key, &f("key")), CERT_AND_KEY)
            .map(|(c, k)| (self.path(c, &f("cert")), self.path(k, &f("key"))));
        let server_name =
            t.server_name.as_ref().and_then(|n| match rustls::pki_types::ServerName::try_from(n.get_ref().as_str()) {
                Ok(_) => Some(n.get_ref().clone()),
                Err(_) => {
                    self.report(
                        n.span(),
                        &f("server_name"),
                        format!("`{}` is not a DNS name or IP address", n.get_ref()),
                    );
                    None
                }
            });
        BackendTlsFiles { ca_file: t.ca_file.as_ref().map(|c| self.path(c, &f("ca_file"))), server_name, client_cert }
    }

    /// `[[partition]]`.
    fn partitions(
        &self,
        raw: &[Spanned<RawPartition>],
        backends: &[Backend],
        by_name: &HashMap<String, usize>,
        clone_owner: &HashMap<String, usize>,
    ) -> Vec<Partition> {
        let mut partitions = Vec::new();
        let mut partition_ids = HashSet::new();
        for (i, p) in raw.iter().enumerate() {
            let p = p.get_ref();
            let f = |field: &str| format!("partition[{i}].{field}");
            let id = p.id.get_ref();
            if !is_partition(id.as_bytes()) {
                self.report(p.id.span(), &f("id"), format!("`{id}` is not a partition ID (a decimal number)"));
            } else if !partition_ids.insert(id.clone()) || clone_owner.contains_key(id) {
                self.report(p.id.span(), &f("id"), format!("`{id}` is defined twice"));
            }
            let lookup = |s: &Spanned<String>, field: &str| {
                let found = by_name.get(s.get_ref()).copied();
                if found.is_none() {
                    self.report(s.span(), &f(field), format!("names no backend: `{}`", s.get_ref()));
                }
                found
            };
            let primary = lookup(&p.primary, "primary");
            let replica = match &p.replica {
                Some(r) => {
                    let ri = lookup(r, "replica");
                    if ri.is_some() && ri == primary {
                        self.report(r.span(), &f("replica"), "the replica must differ from the primary");
                    }
                    ri
                }
                None => primary.and_then(|p| backends[p].replica),
            };
            if let Some(primary) = primary {
                partitions.push(Partition { id: id.clone(), primary, replica });
            }
        }
        partitions
    }

    fn health(&self, h: &RawHealth) -> HealthSettings {
        let kind = self.choice(
            &h.kind,
            "health.kind",
            CheckKind::Auto,
            &[("auto", CheckKind::Auto), ("http", CheckKind::Http), ("tcp", CheckKind::Tcp), ("sip", CheckKind::Sip)],
        );
        let mut s = HealthSettings { kind, ..HealthSettings::default() };
        if let Some(p) = &h.path {
            // A request target as the proxy's own parser accepts it (the check reads its
            // answer with that parser).
            if !p.get_ref().starts_with('/') || p.get_ref().bytes().any(|b| b <= b' ' || b == 0x7f || b == b'#') {
                self.report(p.span(), "health.path", "must start with / and contain no spaces, control bytes or '#'");
            } else {
                s.path = p.get_ref().clone();
            }
        }
        if let Some(e) = &h.expect_status {
            if !(100..=599).contains(e.get_ref()) {
                self.report(e.span(), "health.expect_status", "must be an HTTP status, 100..=599");
            } else {
                s.expect_status = *e.get_ref();
            }
        }
        if let Some(p) = &h.port {
            if *p.get_ref() == 0 {
                self.report(p.span(), "health.port", "must be 1..=65535");
            } else {
                s.port = Some(*p.get_ref());
            }
        }
        for (v, field, into) in [(&h.interval, "interval", &mut s.interval), (&h.timeout, "timeout", &mut s.timeout)] {
            if let Some(d) =
                v.as_ref().and_then(|v| self.duration(v, &format!("health.{field}"), Duration::from_millis(10)))
            {
                *into = d;
            }
        }
        for (v, field, into) in [(&h.rise, "rise", &mut s.rise), (&h.fall, "fall", &mut s.fall)] {
            if let Some(v) = v {
                if !(1..=100).contains(v.get_ref()) {
                    self.report(v.span(), &format!("health.{field}"), "must be 1..=100");
                } else {
                    *into = *v.get_ref();
                }
            }
        }
        if let Some(e) = &h.enabled {
            s.enabled = *e.get_ref();
        }
        if let Some(list) = &h.suspect_on_status {
            for st in list.get_ref() {
                if !(500..=599).contains(st.get_ref()) {
                    self.report(st.span(), "health.suspect_on_status", "only 5xx statuses can mark a backend suspect");
                } else {
                    s.suspect_on_status.push(*st.get_ref());
                }
            }
        }
        s
    }

    fn http(&self, h: &RawHttp) -> HttpSettings {
        let mut s = HttpSettings::default();
        // Each with a floor below which it cannot do its job: a client, a backend or a
        // network round trip needs milliseconds at the least.
        let dur = |v: &Option<Spanned<String>>, field: &str, min: Duration, into: &mut Duration| {
            if let Some(d) = v.as_ref().and_then(|v| self.duration(v, &format!("http.{field}"), min)) {
                *into = d;
            }
        };
        let ms = Duration::from_millis;
        dur(&h.header_timeout, "header_timeout", ms(100), &mut s.header_timeout);
        dur(&h.client_idle_timeout, "client_idle_timeout", ms(100), &mut s.client_idle_timeout);
        dur(&h.connect_timeout, "connect_timeout", ms(10), &mut s.connect_timeout);
        dur(&h.server_timeout, "server_timeout", ms(100), &mut s.server_timeout);
        dur(&h.pool_idle_timeout, "pool_idle_timeout", ms(100), &mut s.pool_idle_timeout);
        dur(&h.drain_timeout, "drain_timeout", ms(100), &mut s.drain_timeout);
        dur(&h.hold_time, "hold_time", ms(10), &mut s.hold_time);
        dur(&h.client_timeout, "client_timeout", ms(100), &mut s.client_timeout);
        dur(&h.body_timeout, "body_timeout", ms(100), &mut s.body_timeout);
        dur(&h.queue_timeout, "queue_timeout", ms(10), &mut s.queue_timeout);
        dur(&h.tunnel_timeout, "tunnel_timeout", ms(100), &mut s.tunnel_timeout);
        let num = |v: &Option<Spanned<usize>>, field: &str, lo: usize, hi: usize, into: &mut usize| {
            if let Some(v) = v {
                let n = *v.get_ref();
                if n < lo || n > hi {
                    self.report(v.span(), &format!("http.{field}"), format!("must be {lo}..={hi}"));
                } else {
                    *into = n;
                }
            }
        };
        num(&h.workers, "workers", 1, 256, &mut s.workers);
        num(&h.max_header_bytes, "max_header_bytes", 1024, 1 << 20, &mut s.max_header_bytes);
        num(&h.max_headers, "max_headers", 8, MAX_HEADERS, &mut s.max_headers);
        num(&h.pool_max_idle, "pool_max_idle", 0, 100_000, &mut s.pool_max_idle);
        num(
            &h.max_connections_per_backend,
            "max_connections_per_backend",
            1,
            1_000_000,
            &mut s.max_connections_per_backend,
        );
        num(&h.max_held, "max_held", 0, 1_000_000, &mut s.max_held);
        num(&h.retry_buffer, "retry_buffer", 0, 16 << 20, &mut s.retry_buffer);
        let mut rate = s.body_min_rate as usize;
        num(&h.body_min_rate, "body_min_rate", 1, 1 << 30, &mut rate);
        s.body_min_rate = rate as u64;
        let mut cap = 0;
        num(&h.max_client_connections, "max_client_connections", 1, MAX_CLIENT_CONNECTIONS, &mut cap);
        s.max_client_connections = (cap > 0).then_some(cap);
        if let Some(v) = &h.max_connections_per_source {
            let mut n = 0;
            num(&h.max_connections_per_source, "max_connections_per_source", 0, MAX_CLIENT_CONNECTIONS, &mut n);
            if let (Some(global), true) = (s.max_client_connections, n > 0) {
                if n > global {
                    self.report(
                        v.span(),
                        "http.max_connections_per_source",
                        format!("{n} is more than max_client_connections ({global}): one source could take every slot"),
                    );
                }
            }
            s.max_connections_per_source = Some(n);
        }
        num(
            &h.max_connection_rate_per_source,
            "max_connection_rate_per_source",
            0,
            1_000_000,
            &mut s.max_connection_rate_per_source,
        );
        num(&h.max_tls_handshakes, "max_tls_handshakes", 1, 1_000_000, &mut s.max_tls_handshakes);
        num(&h.tls_session_cache, "tls_session_cache", 0, 10_000_000, &mut s.tls_session_cache);
        let (mut retries, mut pct, mut min) =
            (s.retries as usize, s.retry_budget_percent as usize, s.retry_budget_min as usize);
        num(&h.retries, "retries", 0, 10, &mut retries);
        num(&h.retry_budget_percent, "retry_budget_percent", 0, 100, &mut pct);
        num(&h.retry_budget_min, "retry_budget_min", 0, 1_000_000, &mut min);
        (s.retries, s.retry_budget_percent, s.retry_budget_min) = (retries as u32, pct as u64, min as u64);
        let token = |v: &Option<Spanned<String>>, field: &str, into: &mut String| {
            if let Some(v) = v {
                let t = v.get_ref();
                if t.is_empty() || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
                    self.report(v.span(), &format!("http.{field}"), format!("`{t}` is not a cookie or parameter name"));
                } else {
                    *into = t.clone();
                }
            }
        };
        token(&h.cookie_name, "cookie_name", &mut s.cookie_name);
        token(&h.url_parameter, "url_parameter", &mut s.url_parameter);
        s
    }
}
