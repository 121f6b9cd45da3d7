//! The TOML configuration: parsing, defaults and validation with errors that name the
//! file, the line and the field.

use std::{
    cell::RefCell,
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::Range,
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use serde::Deserialize;
use toml::Spanned;

use dispatcher_common::{MAX_BACKENDS, MAX_RING_SIZE, MAX_VIPS};

/// The longest duration any setting takes: every deadline computed from one stays far
/// from the clock's range.
pub const MAX_DURATION: Duration = Duration::from_secs(86_400);
/// The most client connections a cap may allow (the kernel's file limit is far below).
pub const MAX_CLIENT_CONNECTIONS: usize = 10_000_000;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}:{line}: {message}")]
    Invalid { file: String, line: usize, message: String },
    /// Several errors, in line order, one per line.
    #[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n"))]
    Many(Vec<ConfigError>),
}

/// Raw file shape. Every field a validation message must point at is `Spanned`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    dispatcher: Spanned<RawDispatcher>,
    #[serde(default, rename = "backend")]
    backends: Vec<Spanned<RawBackend>>,
    #[serde(default, rename = "vip")]
    vips: Vec<Spanned<RawVip>>,
    #[serde(default, rename = "partition")]
    partitions: Vec<Spanned<RawPartition>>,
    http: Option<Spanned<RawHttp>>,
    health: Option<Spanned<RawHealth>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    kind: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
    expect_status: Option<Spanned<u16>>,
    port: Option<Spanned<u16>>,
    interval: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
    rise: Option<Spanned<u32>>,
    fall: Option<Spanned<u32>>,
    enabled: Option<Spanned<bool>>,
    suspect_on_status: Option<Spanned<Vec<Spanned<u16>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPartition {
    id: Spanned<String>,
    primary: Spanned<String>,
    replica: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    workers: Option<Spanned<usize>>,
    cookie_name: Option<Spanned<String>>,
    url_parameter: Option<Spanned<String>>,
    max_header_bytes: Option<Spanned<usize>>,
    max_headers: Option<Spanned<usize>>,
    header_timeout: Option<Spanned<String>>,
    client_idle_timeout: Option<Spanned<String>>,
    connect_timeout: Option<Spanned<String>>,
    server_timeout: Option<Spanned<String>>,
    pool_max_idle: Option<Spanned<usize>>,
    pool_idle_timeout: Option<Spanned<String>>,
    max_connections_per_backend: Option<Spanned<usize>>,
    drain_timeout: Option<Spanned<String>>,
    hold_time: Option<Spanned<String>>,
    max_held: Option<Spanned<usize>>,
    retries: Option<Spanned<usize>>,
    retry_budget_percent: Option<Spanned<usize>>,
    retry_budget_min: Option<Spanned<usize>>,
    retry_buffer: Option<Spanned<usize>>,
    client_timeout: Option<Spanned<String>>,
    body_timeout: Option<Spanned<String>>,
    body_min_rate: Option<Spanned<usize>>,
    queue_timeout: Option<Spanned<String>>,
    max_client_connections: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDispatcher {
    interface: Spanned<String>,
    instance: Option<Spanned<String>>,
    bpffs: Option<Spanned<String>>,
    xdp_mode: Option<Spanned<String>>,
    flow_table_size: Option<Spanned<u32>>,
    affinity_table_size: Option<Spanned<u32>>,
    log_level: Option<Spanned<String>>,
    admin_socket: Option<Spanned<String>>,
    admin_address: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    name: Spanned<String>,
    address: Spanned<String>,
    address6: Option<Spanned<String>>,
    mac: Option<Spanned<String>>,
    weight: Option<Spanned<u32>>,
    replica: Option<Spanned<String>>,
    #[serde(default)]
    clone_ids: Vec<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVip {
    name: Spanned<String>,
    address: Spanned<String>,
    port: Spanned<u16>,
    protocol: Option<Spanned<String>>,
    mode: Option<Spanned<String>>,
    forwarding: Option<Spanned<String>>,
    encap_source: Option<Spanned<String>>,
    backends: Option<Spanned<Vec<Spanned<String>>>>,
    ring_size: Option<Spanned<u32>>,
    sticky_time: Option<Spanned<String>>,
    port_group: Option<Spanned<String>>,
    balance: Option<Spanned<String>>,
    backend_port: Option<Spanned<u16>>,
    max_connections: Option<Spanned<usize>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttachMode {
    /// Native (driver) mode, falling back to generic with a message.
    Auto,
    Native,
    Generic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VipMode {
    L4,
    Http,
}

/// How requests without a usable session are spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balance {
    /// Smooth weighted round robin (nginx's).
    RoundRobin,
    /// Fewest requests in flight, weighted.
    LeastOutstanding,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forwarding {
    Mac,
    Ipip,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub interface: String,
    pub instance: String,
    pub bpffs: PathBuf,
    pub xdp_mode: XdpAttachMode,
    pub flow_table_size: u32,
    pub affinity_table_size: u32,
    pub log_level: String,
    /// The admin endpoint (a Unix socket: never reachable from the network).
    pub admin_socket: PathBuf,
    /// Optional: the admin endpoint over TCP as well (for Prometheus). Peers that are not
    /// on loopback may only `GET /metrics`.
    pub admin_address: Option<SocketAddr>,
    pub backends: Vec<Backend>,
    pub vips: Vec<Vip>,
    pub partitions: Vec<Partition>,
    pub http: HttpSettings,
    pub health: HealthSettings,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// HTTP for backends of HTTP VIPs, TCP for the others.
    Auto,
    /// `GET path`, expecting `expect_status`.
    Http,
    /// A TCP connect.
    Tcp,
}

/// Active health checks (`[health]`).
#[derive(Clone, Debug, PartialEq)]
pub struct HealthSettings {
    pub enabled: bool,
    pub kind: CheckKind,
    pub path: String,
    pub expect_status: u16,
    /// Port to check; default: the backend port of its first HTTP VIP, else its first
    /// VIP's port.
    pub port: Option<u16>,
    pub interval: Duration,
    pub timeout: Duration,
    /// Consecutive successes that bring a down backend up.
    pub rise: u32,
    /// Consecutive failures that take a backend down (the first makes it suspect).
    pub fall: u32,
    /// Response statuses that count as a failure of the backend (passive 5xx policy),
    /// e.g. `[502, 503, 504]`; empty by default (a 5xx is the application's answer).
    pub suspect_on_status: Vec<u16>,
}

impl Default for HealthSettings {
    fn default() -> Self {
        HealthSettings {
            enabled: true,
            kind: CheckKind::Auto,
            path: "/".into(),
            expect_status: 200,
            port: None,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            rise: 2,
            fall: 2,
            suspect_on_status: Vec::new(),
        }
    }
}

/// A partition of WebSphere memory-to-memory replication: its primary and replica.
#[derive(Clone, Debug, PartialEq)]
pub struct Partition {
    pub id: String,
    pub primary: usize,
    pub replica: Option<usize>,
}

/// The HTTP proxy's settings (`[http]`).
#[derive(Clone, Debug, PartialEq)]
pub struct HttpSettings {
    /// Worker threads of the request path.
    pub workers: usize,
    pub cookie_name: String,
    pub url_parameter: String,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    /// From the first byte of a request head to its end (slow-loris bound).
    pub header_timeout: Duration,
    /// How long a keep-alive client connection may sit idle between requests.
    pub client_idle_timeout: Duration,
    pub connect_timeout: Duration,
    /// Longest wait for a backend's bytes (response head or body).
    pub server_timeout: Duration,
    pub pool_max_idle: usize,
    pub pool_idle_timeout: Duration,
    pub max_connections_per_backend: usize,
    /// On SIGTERM, how long in-flight requests may take to finish.
    pub drain_timeout: Duration,
    /// How long a request waits while its session's owner is suspect.
    pub hold_time: Duration,
    /// Requests held at once; beyond, 503 at once.
    pub max_held: usize,
    /// Extra attempts per request (idempotent, bodiless, before any response byte).
    pub retries: u32,
    /// Retries in flight may be at most this share of the requests in flight...
    pub retry_budget_percent: u64,
    /// ...or this many, whichever is more.
    pub retry_budget_min: u64,
    /// Bodies up to this size (Content-Length) of idempotent requests are read ahead so
    /// that the request can be retried.
    pub retry_buffer: usize,
    /// Longest wait for a client's next bytes of a request body, and for a client to take
    /// the bytes of a response.
    pub client_timeout: Duration,
    /// How long a request body may take to arrive before its rate is judged...
    pub body_timeout: Duration,
    /// ...then it must have averaged at least this many bytes per second since it began
    /// (a large upload goes on; a trickle is cut off).
    pub body_min_rate: u64,
    /// How long a request waits for a connection to a backend that is at its connection
    /// limit; then 503 "busy" (the backend's health is not touched).
    pub queue_timeout: Duration,
    /// Client connections open at once over all HTTP VIPs; `None`: derived from the
    /// descriptor limit at start (see `http::limits`).
    pub max_client_connections: Option<usize>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            workers: 2,
            cookie_name: "JSESSIONID".into(),
            url_parameter: "jsessionid".into(),
            max_header_bytes: 16 * 1024,
            max_headers: 100,
            header_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(60),
            connect_timeout: Duration::from_secs(3),
            server_timeout: Duration::from_secs(30),
            pool_max_idle: 1024,
            pool_idle_timeout: Duration::from_secs(30),
            max_connections_per_backend: 1024,
            drain_timeout: Duration::from_secs(10),
            hold_time: Duration::from_secs(5),
            max_held: 1000,
            retries: 1,
            retry_budget_percent: 20,
            retry_budget_min: 3,
            retry_buffer: 64 * 1024,
            client_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            body_min_rate: 1024,
            queue_timeout: Duration::from_secs(5),
            max_client_connections: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Backend {
    pub name: String,
    pub address: Ipv4Addr,
    pub address6: Option<Ipv6Addr>,
    pub mac: Option<[u8; 6]>,
    pub weight: u32,
    /// Index into `Config::backends`.
    pub replica: Option<usize>,
    pub clone_ids: Vec<String>,
    /// Removed by a reload: kept in its slot (its id stays reserved) but out of service.
    pub retired: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Vip {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub mode: VipMode,
    pub forwarding: Forwarding,
    pub encap_source: Option<IpAddr>,
    /// Indexes into `Config::backends`.
    pub backends: Vec<usize>,
    pub ring_size: u32,
    pub sticky_time: Option<Duration>,
    /// VIPs with the same group share source-IP affinity (cross-port affinity).
    pub port_group: u32,
    pub balance: Balance,
    /// Port of the backends' HTTP servers (HTTP VIPs); default: the VIP's port.
    pub backend_port: u16,
    /// Client connections open at once on this VIP (HTTP VIPs); `None`: only the global
    /// cap applies.
    pub max_connections: Option<usize>,
    /// Removed by a reload: its id stays reserved, it is served no more.
    pub retired: bool,
}

impl Vip {
    /// An HTTP VIP the agent serves (not one a reload removed).
    pub fn serves_http(&self) -> bool {
        self.mode == VipMode::Http && !self.retired
    }
}

impl Config {
    /// `new` re-indexed for a reload of `self`: every backend and VIP keeps the id (the
    /// position) it has now, so that pinned flows, rings and the clone table stay right;
    /// removed ones stay in their slots as `retired`, added ones get new slots.
    pub fn merged_for_reload(&self, new: Config) -> Result<Config, String> {
        let restart = |what: &str| {
            Err(format!("{what} changed: this needs a restart (`dispatcher run` adopts the pinned maps; L4 forwarding goes on meanwhile)"))
        };
        if new.interface != self.interface {
            return restart("dispatcher.interface");
        }
        if new.instance != self.instance
            || new.bpffs != self.bpffs
            || new.admin_socket != self.admin_socket
            || new.admin_address != self.admin_address
        {
            return restart("the instance, bpffs or admin socket/address");
        }
        if new.flow_table_size != self.flow_table_size || new.affinity_table_size != self.affinity_table_size {
            return restart("a table size");
        }
        // Backends by name.
        let mut backend_slot = vec![0usize; new.backends.len()];
        let mut backends: Vec<Backend> = Vec::new();
        for old in &self.backends {
            match new.backends.iter().position(|b| b.name == old.name) {
                Some(j) => {
                    backend_slot[j] = backends.len();
                    backends.push(new.backends[j].clone());
                }
                // Its sessions go to its replica (same slot id as before) until they end.
                None => backends.push(Backend { retired: true, ..old.clone() }),
            }
        }
        for (j, b) in new.backends.iter().enumerate() {
            if !self.backends.iter().any(|o| o.name == b.name) {
                backend_slot[j] = backends.len();
                backends.push(b.clone());
            }
        }
        if backends.len() > MAX_BACKENDS as usize {
            return Err(format!(
                "more than {MAX_BACKENDS} backend slots (removed backends keep theirs until a restart)"
            ));
        }
        // New definitions name replicas by their position in `new`: map them to slots.
        // (Retired ones keep the slot ids they had.)
        for b in backends.iter_mut().filter(|b| !b.retired) {
            b.replica = b.replica.map(|j| backend_slot[j]);
        }
        // VIPs by name.
        let remap = |v: &Vip| Vip { backends: v.backends.iter().map(|&j| backend_slot[j]).collect(), ..v.clone() };
        let mut vips: Vec<Vip> = Vec::new();
        for old in &self.vips {
            match new.vips.iter().find(|v| v.name == old.name) {
                Some(v) => vips.push(remap(v)),
                None => vips.push(Vip { retired: true, backends: Vec::new(), ..old.clone() }),
            }
        }
        for v in &new.vips {
            if !self.vips.iter().any(|o| o.name == v.name) {
                vips.push(remap(v));
            }
        }
        if vips.len() > MAX_VIPS as usize {
            return Err(format!("more than {MAX_VIPS} VIP slots (removed VIPs keep theirs until a restart)"));
        }
        let partitions = new
            .partitions
            .iter()
            .map(|p| Partition {
                primary: backend_slot[p.primary],
                replica: p.replica.map(|r| backend_slot[r]),
                ..p.clone()
            })
            .collect();
        Ok(Config { backends, vips, partitions, ..new })
    }

    /// `self` re-indexed so that the backends and VIPs named in `backends` and `vips` (by
    /// id) keep those ids: the placement a restart that adopts pinned maps must use.
    /// Names no longer configured keep their slots as retired placeholders.
    pub fn placed_by_names(self, backends: &[String], vips: &[String]) -> Result<Config, String> {
        let skeleton = Config {
            backends: backends
                .iter()
                .map(|name| Backend {
                    name: name.clone(),
                    address: Ipv4Addr::UNSPECIFIED,
                    address6: None,
                    mac: None,
                    weight: 1,
                    replica: None,
                    clone_ids: Vec::new(),
                    retired: false,
                })
                .collect(),
            vips: vips
                .iter()
                .map(|name| Vip {
                    name: name.clone(),
                    address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    port: 0,
                    protocol: Protocol::Tcp,
                    mode: VipMode::L4,
                    forwarding: Forwarding::Mac,
                    encap_source: None,
                    backends: Vec::new(),
                    ring_size: dispatcher_common::DEFAULT_RING_SIZE,
                    sticky_time: None,
                    port_group: 0,
                    balance: Balance::RoundRobin,
                    backend_port: 0,
                    max_connections: None,
                    retired: false,
                })
                .collect(),
            partitions: Vec::new(),
            ..self.clone()
        };
        skeleton.merged_for_reload(self)
    }

    /// The bpffs directory this instance pins its maps, program and link under.
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.join("dispatcher").join(&self.instance)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { file: file.clone(), source })?;
        Config::parse(&text, &file)
    }

    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let ctx = Ctx { text, file, errors: RefCell::new(Vec::new()) };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| ctx.line(s.start)).unwrap_or(1);
            ConfigError::Invalid { file: file.to_string(), line, message: e.message().trim().to_string() }
        })?;
        let cfg = ctx.build(raw);
        let mut errors = ctx.errors.into_inner();
        errors.sort_by_key(|e| match e {
            ConfigError::Invalid { line, .. } => *line,
            _ => 0,
        });
        match errors.len() {
            0 => Ok(cfg),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Many(errors)),
        }
    }
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
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(format!("`{}`: use letters, digits, '.', '_' and '-' only", name.escape_debug()));
    }
    Ok(())
}

pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return Err(format!("`{s}` is not a MAC address (expected 6 hex pairs like 02:00:00:00:00:01)"));
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return Err(format!("`{s}` is not a MAC address"));
        }
        mac[i] = u8::from_str_radix(p, 16).map_err(|_| format!("`{s}` is not a MAC address"))?;
    }
    Ok(mac)
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

struct Ctx<'a> {
    text: &'a str,
    file: &'a str,
    /// Every error found so far: validation goes on after one, so that a single
    /// `dispatcher check` lists all of them.
    errors: RefCell<Vec<ConfigError>>,
}

impl Ctx<'_> {
    fn line(&self, offset: usize) -> usize {
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

    fn build(&self, raw: RawConfig) -> Config {
        let d = raw.dispatcher.get_ref();
        let interface = d.interface.get_ref().clone();
        if interface.is_empty() || interface.len() > 15 {
            self.report(d.interface.span(), "dispatcher.interface", "must be an interface name of 1 to 15 bytes");
        }
        let instance = d.instance.as_ref().map(|s| s.get_ref().clone()).unwrap_or_else(|| "default".into());
        if instance.is_empty() || !instance.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            let span = d.instance.as_ref().map(|s| s.span()).unwrap_or(raw.dispatcher.span());
            self.report(span, "dispatcher.instance", "use letters, digits, '-' and '_' only");
        }
        let xdp_mode = self.choice(
            &d.xdp_mode,
            "dispatcher.xdp_mode",
            XdpAttachMode::Auto,
            &[("auto", XdpAttachMode::Auto), ("native", XdpAttachMode::Native), ("generic", XdpAttachMode::Generic)],
        );
        let table = |v: &Option<Spanned<u32>>, field: &str, default: u32| match v {
            None => default,
            Some(s) if *s.get_ref() >= 1024 => *s.get_ref(),
            Some(s) => {
                self.report(s.span(), field, "must be at least 1024");
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
            Some(p) if !p.get_ref().starts_with('/') => {
                self.report(p.span(), "dispatcher.admin_socket", "must be an absolute path");
                PathBuf::new()
            }
            Some(p) => PathBuf::from(p.get_ref()),
            None => PathBuf::from(format!("/run/dispatcher/{instance}.sock")),
        };
        let admin_address = d.admin_address.as_ref().and_then(|a| {
            let r = self.parsed::<SocketAddr>(a, "dispatcher.admin_address", "an address:port such as 127.0.0.1:9901");
            self.or(r.map(Some), None)
        });

        if raw.backends.len() > MAX_BACKENDS as usize {
            self.report(
                raw.backends[MAX_BACKENDS as usize].span(),
                "backend",
                format!("at most {MAX_BACKENDS} backends"),
            );
        }
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (i, b) in raw.backends.iter().enumerate() {
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
        for (i, b) in raw.backends.iter().enumerate() {
            let b = b.get_ref();
            let f = |field: &str| format!("backend[{i}].{field}");
            let address: Ipv4Addr =
                self.or(self.parsed(&b.address, &f("address"), "an IPv4 address"), Ipv4Addr::UNSPECIFIED);
            let address6 = b
                .address6
                .as_ref()
                .map(|a| self.or(self.parsed::<Ipv6Addr>(a, &f("address6"), "an IPv6 address"), Ipv6Addr::UNSPECIFIED));
            // A bad MAC is reported here; the VIP checks then treat it as given.
            let mac = b
                .mac
                .as_ref()
                .map(|m| self.or(parse_mac(m.get_ref()).map_err(|e| self.err(m.span(), &f("mac"), e)), [0; 6]));
            let weight = match &b.weight {
                Some(w) if *w.get_ref() == 0 || *w.get_ref() > 10_000 => {
                    self.report(w.span(), &f("weight"), "must be 1..=10000 (drain a backend instead of weight 0)");
                    100
                }
                Some(w) => *w.get_ref(),
                None => 100,
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
            for c in &b.clone_ids {
                let id = c.get_ref();
                let token = id.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
                if id.is_empty() || id.len() > 64 || !token {
                    let shown = id.escape_debug();
                    self.report(
                        c.span(),
                        &f("clone_ids"),
                        format!("`{shown}`: 1 to 64 token characters (no ':', spaces, quotes or separators)"),
                    );
                } else if let Some(&prev) = clone_owner.get(id) {
                    self.report(
                        c.span(),
                        &f("clone_ids"),
                        format!(
                            "clone ID `{id}` already belongs to backend `{}`",
                            raw.backends[prev].get_ref().name.get_ref()
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
                retired: false,
            });
        }

        if raw.vips.len() > MAX_VIPS as usize {
            self.report(raw.vips[MAX_VIPS as usize].span(), "vip", format!("at most {MAX_VIPS} VIPs"));
        }
        let mut groups: HashMap<String, u32> = HashMap::new();
        let mut seen: HashSet<(IpAddr, u16, Protocol)> = HashSet::new();
        let mut names: HashSet<String> = HashSet::new();
        let mut vips = Vec::new();
        for (i, v) in raw.vips.iter().enumerate() {
            let v = v.get_ref();
            let f = |field: &str| format!("vip[{i}].{field}");
            if let Err(e) = check_name(v.name.get_ref()) {
                self.report(v.name.span(), &f("name"), e);
            } else if !names.insert(v.name.get_ref().clone()) {
                self.report(v.name.span(), &f("name"), format!("`{}` is defined twice", v.name.get_ref()));
            }
            let address: IpAddr =
                self.or(self.parsed(&v.address, &f("address"), "an IP address"), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
            if *v.port.get_ref() == 0 {
                self.report(v.port.span(), &f("port"), "must be 1..=65535");
            }
            let protocol = self.choice(
                &v.protocol,
                &f("protocol"),
                Protocol::Tcp,
                &[("tcp", Protocol::Tcp), ("udp", Protocol::Udp)],
            );
            if !seen.insert((address, *v.port.get_ref(), protocol)) {
                self.report(v.port.span(), &f("port"), "another VIP has the same address, port and protocol");
            }
            let mode = self.choice(&v.mode, &f("mode"), VipMode::L4, &[("l4", VipMode::L4), ("http", VipMode::Http)]);
            if mode == VipMode::Http && protocol != Protocol::Tcp {
                self.report(v.mode.as_ref().unwrap().span(), &f("mode"), "http needs protocol tcp");
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
                }
                Some(ip)
            });
            if mode == VipMode::L4 && forwarding == Forwarding::Ipip && v.encap_source.is_none() {
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
            if members.is_empty() {
                let span = v.backends.as_ref().map(|l| l.span()).unwrap_or(v.name.span());
                self.report(
                    span,
                    &f("backends"),
                    "a VIP needs at least one backend (with none, an L4 VIP drops all its traffic and an HTTP VIP answers only 503)",
                );
            }
            if mode == VipMode::L4 {
                for &bi in &members {
                    let b = &backends[bi];
                    let span = raw.backends[bi].span();
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
                retired: false,
            });
        }
        let mut partitions = Vec::new();
        let mut partition_ids = HashSet::new();
        for (i, p) in raw.partitions.iter().enumerate() {
            let p = p.get_ref();
            let f = |field: &str| format!("partition[{i}].{field}");
            let id = p.id.get_ref();
            if !crate::http::session::is_partition(id.as_bytes()) {
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
        let http = match &raw.http {
            Some(h) => self.http(h.get_ref()),
            None => HttpSettings::default(),
        };
        let health = match &raw.health {
            Some(h) => self.health(h.get_ref()),
            None => HealthSettings::default(),
        };
        let bpffs = PathBuf::from(d.bpffs.as_ref().map(|s| s.get_ref().as_str()).unwrap_or("/sys/fs/bpf"));
        Config {
            interface,
            instance,
            bpffs,
            xdp_mode,
            flow_table_size,
            affinity_table_size,
            log_level,
            admin_socket,
            admin_address,
            backends,
            vips,
            partitions,
            http,
            health,
        }
    }

    fn health(&self, h: &RawHealth) -> HealthSettings {
        let kind = self.choice(
            &h.kind,
            "health.kind",
            CheckKind::Auto,
            &[("auto", CheckKind::Auto), ("http", CheckKind::Http), ("tcp", CheckKind::Tcp)],
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
        let dur = |v: &Option<Spanned<String>>, field: &str, into: &mut Duration| {
            if let Some(d) = v.as_ref().and_then(|v| self.duration(v, &format!("http.{field}"), Duration::ZERO)) {
                *into = d;
            }
        };
        dur(&h.header_timeout, "header_timeout", &mut s.header_timeout);
        dur(&h.client_idle_timeout, "client_idle_timeout", &mut s.client_idle_timeout);
        dur(&h.connect_timeout, "connect_timeout", &mut s.connect_timeout);
        dur(&h.server_timeout, "server_timeout", &mut s.server_timeout);
        dur(&h.pool_idle_timeout, "pool_idle_timeout", &mut s.pool_idle_timeout);
        dur(&h.drain_timeout, "drain_timeout", &mut s.drain_timeout);
        dur(&h.hold_time, "hold_time", &mut s.hold_time);
        dur(&h.client_timeout, "client_timeout", &mut s.client_timeout);
        dur(&h.body_timeout, "body_timeout", &mut s.body_timeout);
        dur(&h.queue_timeout, "queue_timeout", &mut s.queue_timeout);
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
        num(&h.max_headers, "max_headers", 8, crate::http::head::MAX_HEADERS, &mut s.max_headers);
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

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[dispatcher]
interface = "eth0"
instance = "t1"

[[backend]]
name = "a"
address = "10.0.0.11"
mac = "02:00:00:00:00:11"
replica = "b"
clone_ids = ["cloneA"]

[[backend]]
name = "b"
address = "10.0.0.12"
mac = "02:00:00:00:00:12"
weight = 200
replica = "a"

[[vip]]
name = "web"
address = "10.0.100.1"
port = 80
ring_size = 251
sticky_time = "30s"
port_group = "g"

[[vip]]
name = "tls"
address = "10.0.100.1"
port = 443
forwarding = "ipip"
encap_source = "10.0.0.1"
port_group = "g"
"#;

    fn err_of(text: &str) -> String {
        Config::parse(text, "x.toml").expect_err("must be rejected").to_string()
    }

    #[test]
    fn parses_a_complete_file() {
        let c = Config::parse(GOOD, "x.toml").unwrap();
        assert_eq!(c.backends.len(), 2);
        assert_eq!(c.backends[0].replica, Some(1));
        assert_eq!(c.backends[1].weight, 200);
        assert_eq!(c.vips[0].backends, vec![0, 1]);
        assert_eq!(c.vips[0].sticky_time, Some(Duration::from_secs(30)));
        assert_eq!(c.vips[0].port_group, c.vips[1].port_group);
        assert_eq!(c.vips[1].forwarding, Forwarding::Ipip);
        assert_eq!(c.pin_dir(), PathBuf::from("/sys/fs/bpf/dispatcher/t1"));
    }

    #[test]
    fn errors_name_line_and_field() {
        let e = err_of(&GOOD.replace("replica = \"b\"", "replica = \"nope\""));
        assert_eq!(e, "x.toml:10: backend[0].replica: names no backend: `nope`");
        let e = err_of(&GOOD.replace("replica = \"b\"", "replica = \"a\""));
        assert!(e.contains("x.toml:10: backend[0].replica: a backend cannot be its own replica"), "{e}");
        let e = err_of(&GOOD.replace("ring_size = 251", "ring_size = 250"));
        assert!(e.starts_with("x.toml:24: vip[0].ring_size: 250 must be a prime"), "{e}");
        let e = err_of(&GOOD.replace("address = \"10.0.0.12\"", "address = \"10.0.0.300\""));
        assert!(e.starts_with("x.toml:15: backend[1].address: `10.0.0.300` is not an IPv4 address"), "{e}");
        let e = err_of(&GOOD.replace("weight = 200", "wieght = 200"));
        assert!(e.starts_with("x.toml:17: unknown field `wieght`"), "{e}");
        let e = err_of(&GOOD.replace("sticky_time = \"30s\"", "sticky_time = \"30 parsecs\""));
        assert!(e.starts_with("x.toml:25: vip[0].sticky_time:"), "{e}");
        let e = err_of(&GOOD.replace("mac = \"02:00:00:00:00:12\"", "mac = \"02:00:00:00:12\""));
        assert!(e.starts_with("x.toml:16: backend[1].mac:"), "{e}");
        let e = err_of(&GOOD.replace("encap_source = \"10.0.0.1\"\n", ""));
        assert!(e.contains("vip[1].encap_source: required"), "{e}");
        let e =
            err_of(&format!("{GOOD}\n[[backend]]\nname = \"c\"\naddress = \"10.0.0.13\"\nclone_ids = [\"cloneA\"]\n"));
        assert!(e.contains("backend[2].clone_ids: clone ID `cloneA` already belongs to backend `a`"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("30 parsecs").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
    }

    #[test]
    fn primes() {
        assert!(is_prime(65537) && is_prime(251) && is_prime(2));
        assert!(!is_prime(65536) && !is_prime(1) && !is_prime(0) && !is_prime(9));
    }

    /// Ids by name: a backend keeps the id the pinned maps know it by whatever its place
    /// in the file; one that is gone keeps its slot, retired; a new one gets a new slot;
    /// replicas and VIP members follow.
    #[test]
    fn placement_by_names() {
        let c = Config::parse(GOOD, "x.toml").unwrap();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let placed = c.clone().placed_by_names(&names(&["gone", "b", "a"]), &names(&["tls", "web"])).unwrap();
        let got: Vec<(&str, bool)> = placed.backends.iter().map(|b| (b.name.as_str(), b.retired)).collect();
        assert_eq!(got, [("gone", true), ("b", false), ("a", false)]);
        assert_eq!(placed.backends[2].replica, Some(1), "a's replica b, at b's id");
        assert_eq!(placed.vips[0].name, "tls");
        assert_eq!(placed.vips[1].name, "web");
        assert_eq!(placed.vips[1].backends, vec![2, 1], "members by their placed ids");
        let fresh = c.clone().placed_by_names(&names(&["a"]), &[]).unwrap();
        assert_eq!(fresh.backends.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }
}
