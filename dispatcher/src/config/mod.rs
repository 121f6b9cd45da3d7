//! The TOML configuration: parsing, defaults and validation with errors that name the
//! file, the line and the field.

//!
//! `raw` is the file's shape, `validate` turns it into the model below (with every
//! error's line and field), `reload` places a configuration at the ids already in use.

mod changes;
mod raw;
mod reload;
mod shape;
mod validate;

use std::{
    cell::RefCell,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    time::Duration,
};

use validate::Ctx;
pub use validate::{
    check_bpffs_path, check_host_address, check_log_level, check_log_path, check_name, check_socket_path, is_bpffs,
    is_prime, parse_duration,
};

/// A partition ID is all digits (WebSphere prints it as a long, possibly negative).
pub fn is_partition(id: &[u8]) -> bool {
    let digits = id.strip_prefix(b"-").unwrap_or(id);
    !digits.is_empty() && digits.len() <= 20 && digits.iter().all(u8::is_ascii_digit)
}

/// The most header fields `http.max_headers` may allow: the codec's parse array
/// (`http1::head::MAX_HEADERS`).
pub const MAX_HEADERS: usize = crate::http1::head::MAX_HEADERS;

/// The longest duration any setting takes: every deadline computed from one stays far
/// from the clock's range.
pub const MAX_DURATION: Duration = Duration::from_secs(86_400);
/// The largest `flow_table_size` and `affinity_table_size`: the kernel preallocates an
/// LRU hash map whole at creation (a `FLOWS` entry takes about 120 bytes of kernel memory
/// with its share of the buckets), and refuses sizes whose bucket array passes 4 GiB.
pub const MAX_TABLE_SIZE: u32 = 1 << 24;
/// What `FLOWS` takes at `MAX_TABLE_SIZE` (measured: see docs/configuration.md).
pub const MAX_TABLE_MEMORY: &str = "2 GiB";
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
    /// SIP over UDP, routed in XDP by logical name or Call-ID.
    Sip,
}

/// `[[farm]]`: a named group of backends that serves applications together, with its own
/// clone IDs, replica pairs, balancing and timeouts — WebSphere's `ServerCluster` (the
/// word "cluster" belongs to `[cluster]`, the group of dispatchers). Requests reach a farm
/// by a `Route`; the session rules (affinity, learning, hold, replica, retry budget,
/// misroutes) hold within it: a session cookie naming a server of another farm is
/// balanced within the route's farm.
#[derive(Clone, Debug, PartialEq)]
pub struct Farm {
    pub name: String,
    /// Primary servers (indexes into `Config::backends`).
    pub servers: Vec<usize>,
    /// Backup servers: balanced to only while none of `servers` is up (the plug-in's
    /// `BackupServers`). A session owned by a backup stays with it while it serves.
    pub backup_servers: Vec<usize>,
    pub balance: Balance,
    /// Its servers' HTTP port (a backend's own `port` comes first; `None`: the VIP's
    /// `backend_port`).
    pub port: Option<u16>,
    pub fail_back: bool,
    pub session_format: SessionFormat,
    /// `slow_start` for its servers that set none.
    pub slow_start: Option<Duration>,
    /// `http.connect_timeout` for its servers (the plug-in's `ConnectTimeout`).
    pub connect_timeout: Option<Duration>,
    /// `http.server_timeout` for its servers (the plug-in's `ServerIOTimeout`).
    pub io_timeout: Option<Duration>,
    /// Made from an HTTP VIP that no route applies to, from the VIP's own `backends` and
    /// settings (its name is the VIP's): not in the file, not shown as a farm of its own.
    pub implicit: bool,
}

impl Farm {
    /// Every server of the farm, primaries first.
    pub fn members(&self) -> impl Iterator<Item = usize> + '_ {
        self.servers.iter().chain(&self.backup_servers).copied()
    }

    /// The port requests through this farm reach `backend` on: its own `port`, else the
    /// farm's, else `backend_port` (the routed VIP's). Pools and health checks use it.
    pub fn port_of(&self, backend: &Backend, backend_port: u16) -> u16 {
        backend.port.or(self.port).unwrap_or(backend_port)
    }
}

/// `[[route]]`: requests to these virtual hosts and URIs go to `farm` (the plug-in's
/// `Route` of a `VirtualHostGroup` and a `UriGroup` to a `ServerCluster`). Which route
/// wins among several: `routes` (the most specific URI, then host, then file order).
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// Its name in metrics, status and the access log, unique among the routes: the
    /// TOML's `name` (default `route<i>`), a plugin-cfg.xml Route's UriGroup name (with
    /// `.<VirtualHostGroup>` when another Route has the group, `.<cookie>` when the group
    /// has several cookie names), an implicit catch-all's VIP name. Stable across a
    /// regenerated file that inserts routes, unlike an index.
    pub name: String,
    /// The HTTP VIPs it applies to (indexes into `Config::vips`; every HTTP VIP when the
    /// file names none).
    pub vips: Vec<usize>,
    /// `host[:port]` patterns (`routes::HostPattern`).
    pub hosts: Vec<String>,
    /// URI patterns (`routes::UriPattern`).
    pub uris: Vec<String>,
    /// Index into `Config::farms`.
    pub farm: usize,
    /// The session cookie's name (the plug-in's `AffinityCookie`; default `JSESSIONID`).
    pub cookie: String,
    /// The URL's session parameter (`;jsessionid=...`; the plug-in's
    /// `AffinityURLIdentifier`; default `jsessionid`).
    pub url_parameter: String,
}

/// The session cookie's and URL parameter's names when a route says none.
pub const DEFAULT_SESSION_COOKIE: &str = "JSESSIONID";
pub const DEFAULT_URL_PARAMETER: &str = "jsessionid";

/// How requests without a usable session are spread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Balance {
    /// Smooth weighted round robin (nginx's).
    RoundRobin,
    /// Fewest requests in flight, weighted.
    LeastOutstanding,
    /// Weighted random (the plug-in's `LoadBalance="Random"`).
    Random,
}

/// How the application servers write the server's name into JSESSIONID (`vip.session_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionFormat {
    /// WebSphere and Liberty: `<cache ID><session ID>:<clone ID>[:<clone ID>...]`, or a
    /// partition ID after the `:`.
    WebSphere,
    /// Tomcat, JBoss/WildFly: `<session ID>.<jvmRoute>`, the route after the last `.`
    /// (as mod_jk and mod_proxy_balancer read it).
    JvmRoute,
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
    /// `[[farm]]`, then the `[http] plugin_config` file's `ServerCluster`s, then one made
    /// for each HTTP VIP that no route applies to (from its own `backends` and settings:
    /// `Farm::implicit`).
    pub farms: Vec<Farm>,
    /// `[[route]]`, then the plugin_config file's `Route`s (one per cookie and URL
    /// parameter of its URI group), then a catch-all for each implicit farm's VIP. Every
    /// HTTP VIP that forwards has at least one; one a route applies to has its farms'
    /// members as `backends`.
    pub routes: Vec<Route>,
    pub partitions: Vec<Partition>,
    pub http: HttpSettings,
    pub health: HealthSettings,
    /// `[cluster]`: several dispatchers sharing state through etcd; `None`: standalone.
    pub cluster: Option<ClusterSettings>,
    /// `[announce]`: the interfaces BIRD announces the VIPs from (see `announce`).
    pub announce: Option<AnnounceSettings>,
    /// `[access_log]`: one line per HTTP request (see `access_log`); `None`: off.
    pub access_log: Option<AccessLogSettings>,
    /// What `dispatcher check` prints as warnings (each `file:line: message`): routes
    /// that can never win, what the plugin-cfg.xml says that is not used. Never a reason
    /// to refuse the file.
    pub warnings: Vec<String>,
}

/// `[access_log]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessLogSettings {
    /// `path`: a file or standard output; `None`: to syslog only.
    pub output: Option<AccessLogOutput>,
    /// `syslog`: to syslog (too, with `path`).
    pub syslog: Option<SyslogTarget>,
    pub format: AccessLogFormat,
    /// Lines waiting for the writer; beyond, lines are dropped and counted (the request
    /// path never waits for the disk).
    pub buffer: usize,
    /// The program name the lines carry: syslog's APP-NAME, and the `haproxy` format's
    /// syslog header in a file (`tag[pid]:`).
    pub tag: String,
    /// The syslog facility's code (`local0`: 16); the severity is always informational.
    pub facility: u8,
    /// The longest syslog message sent, in bytes (header included); longer ones are cut.
    pub max_message: usize,
    /// The syslog header's form.
    pub syslog_format: SyslogFormat,
}

/// `[access_log] syslog_format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyslogFormat {
    /// `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID - MSG`.
    Rfc5424,
    /// `<PRI>Mmm dd hh:mm:ss TAG[PID]: MSG`: the local form glibc's `syslog()` sends, the
    /// one journald reads on /dev/log.
    Rfc3164,
}

/// Where `path` writes the access log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessLogOutput {
    Stdout,
    /// Appended to, reopened on every reload.
    File(PathBuf),
}

/// RFC 5424 messages, one datagram per line, to a Unix datagram socket (`/dev/log`) or a
/// UDP address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyslogTarget {
    Unix(PathBuf),
    Udp(SocketAddr),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One JSON object per line.
    Json,
    /// HAProxy's HTTP log layout (client, date, frontend, backend/server, timers...).
    Haproxy,
}

impl AccessLogSettings {
    pub const DEFAULT_BUFFER: usize = 65_536;
    pub const DEFAULT_TAG: &'static str = "dispatcher";
    /// `local0`.
    pub const DEFAULT_FACILITY: u8 = 16;
    /// What RFC 5424 says every receiver should take.
    pub const DEFAULT_MAX_MESSAGE: usize = 2048;
    /// The syslog facilities by name, with their codes (RFC 5424 6.2.1).
    pub const FACILITIES: [(&'static str, u8); 20] = [
        ("kern", 0),
        ("user", 1),
        ("mail", 2),
        ("daemon", 3),
        ("auth", 4),
        ("syslog", 5),
        ("lpr", 6),
        ("news", 7),
        ("uucp", 8),
        ("cron", 9),
        ("authpriv", 10),
        ("ftp", 11),
        ("local0", 16),
        ("local1", 17),
        ("local2", 18),
        ("local3", 19),
        ("local4", 20),
        ("local5", 21),
        ("local6", 22),
        ("local7", 23),
    ];
}

/// `[cluster]`: the shared store and this dispatcher's place in it (see `shared`).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    /// This dispatcher's name, unique among the dispatchers sharing `key_prefix`.
    pub name: String,
    /// etcd client URLs (`https://host:port`; `http://` only with `insecure_plaintext`).
    pub endpoints: Vec<String>,
    /// The dispatchers of this cluster by name (this one included): a member key of any
    /// other name is not counted, whatever the store says.
    pub peers: Vec<String>,
    /// Peers written `name@MAC`: the only MAC such a dispatcher's member key may publish
    /// (its address on the segment the dispatchers share).
    pub peer_macs: std::collections::BTreeMap<String, [u8; 6]>,
    /// How this dispatcher proves who it is to the store, and checks the store's identity.
    pub security: StoreSecurity,
    /// Every key this cluster of dispatchers writes starts with it (no trailing '/').
    pub key_prefix: String,
    /// The membership lease: a dispatcher that stops renewing it for this long is gone,
    /// and its health verdicts with it.
    pub lease_ttl: Duration,
    /// The longest any one request to the store may take.
    pub request_timeout: Duration,
    /// How long a starting agent waits for the shared state before it serves without it.
    pub startup_wait: Duration,
    /// Steer each HTTP VIP connection to the dispatcher that owns it (XDP, `steer`).
    pub steering: bool,
    /// How long the previous ownership table is kept after a membership change, for the
    /// connections opened before it (second chance).
    pub second_chance: Duration,
    /// How long a request whose clone IDs no one here knows waits for the shared table.
    pub learn_wait: Duration,
    /// Peer liveness (`peers`): a heartbeat to every other steering dispatcher this often,
    /// over UDP on the segment steering uses.
    pub heartbeat_interval: Duration,
    /// Heartbeats missed in a row before a peer is published unreachable.
    pub heartbeat_misses: u32,
    /// The UDP port the heartbeats are sent from and to (the same on every dispatcher).
    pub heartbeat_port: u16,
    /// With steering: idle plain HTTP/1.x connections of a dispatcher that dies are
    /// continued by the one that takes their slot (`takeover`).
    pub takeover: bool,
}

/// How the link to etcd is secured (`[cluster]` `ca_file`, `cert`/`key`, `username` +
/// `password_file`, `insecure_plaintext`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreSecurity {
    /// `http://` endpoints, said explicitly (`insecure_plaintext = true`): anyone who can
    /// reach the store reads and writes what the dispatchers share.
    Plaintext,
    Tls {
        /// The CA that signed the etcd members' certificates; `None`: the system's roots.
        ca_file: Option<PathBuf>,
        /// A client certificate and its key (etcd `--client-cert-auth`; with auth enabled
        /// and no username, its common name is the etcd user).
        client_cert: Option<(PathBuf, PathBuf)>,
        /// An etcd user and the file holding its password (read at each session's start).
        user: Option<(String, PathBuf)>,
    },
}

impl StoreSecurity {
    /// What `status` and `check` say about it.
    pub fn describe(&self) -> String {
        match self {
            StoreSecurity::Plaintext => "INSECURE: plaintext, no authentication (insecure_plaintext = true)".into(),
            StoreSecurity::Tls { client_cert, user, .. } => match (user, client_cert) {
                (Some((u, _)), Some(_)) => format!("TLS, client certificate, etcd user {u} (password)"),
                (Some((u, _)), None) => format!("TLS, etcd user {u} (password)"),
                (None, Some(_)) => "TLS, client certificate (its common name is the etcd user)".into(),
                (None, None) => {
                    "TLS without credentials: the store must not accept writes from anyone who can reach it".into()
                }
            },
        }
    }

    /// Anyone who can reach the store can write to it, as far as this side can tell.
    pub fn insecure(&self) -> bool {
        matches!(self, StoreSecurity::Plaintext | StoreSecurity::Tls { client_cert: None, user: None, .. })
    }
}

/// `[announce]`: the agent holds one interface per kind of VIP; BIRD's static protocol
/// announces a VIP while its interface is up (`route VIP/32 via "IFACE"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnnounceSettings {
    /// Exists while the agent runs and this dispatcher is joined (a TUN device the agent
    /// holds open): HTTP VIPs are withdrawn when the agent dies.
    pub http_interface: Option<String>,
    /// Persistent; up while this dispatcher is joined: L4 VIPs stay announced across an
    /// agent restart (XDP keeps forwarding them).
    pub l4_interface: Option<String>,
}

impl AnnounceSettings {
    pub const DEFAULT_HTTP_INTERFACE: &'static str = "dsp-http";
    pub const DEFAULT_L4_INTERFACE: &'static str = "dsp-l4";
}

impl ClusterSettings {
    pub const DEFAULT_KEY_PREFIX: &'static str = "/dispatcher/default";
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);
    pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
    pub const DEFAULT_STARTUP_WAIT: Duration = Duration::from_secs(10);
    pub const DEFAULT_SECOND_CHANCE: Duration = Duration::from_secs(300);
    /// Well above the time a learned ID takes to reach the others (tens of ms measured).
    pub const DEFAULT_LEARN_WAIT: Duration = Duration::from_millis(250);
    /// With `DEFAULT_HEARTBEAT_MISSES`: a dead peer is published unreachable 300-400 ms
    /// after its death, within the router's BFD time (500 ms).
    pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
    pub const DEFAULT_HEARTBEAT_MISSES: u32 = 3;
    pub const DEFAULT_HEARTBEAT_PORT: u16 = 7405;
    /// Bounds of `heartbeat_interval` and `heartbeat_misses`.
    pub const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(10);
    pub const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);
    pub const MAX_HEARTBEAT_MISSES: u32 = 50;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckKind {
    /// HTTP for backends of HTTP VIPs, TCP for the others.
    Auto,
    /// `GET path`, expecting `expect_status`.
    Http,
    /// A TCP connect.
    Tcp,
    /// A SIP `OPTIONS` over UDP (as IBM's SIP advisor): any final answer is alive; the
    /// logical name in the answer's To tag is learned.
    Sip,
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
    /// `[cluster] learn_wait`: how long a request whose clone IDs no one here knows waits
    /// for the shared table (another dispatcher may have just learned them); zero: off.
    pub learn_wait: Duration,
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
    /// How long an upgraded connection (WebSocket) may stay silent both ways.
    pub tunnel_timeout: Duration,
    /// Client connections open at once over all HTTP VIPs; `None`: derived from the
    /// descriptor limit at start (see `http::limits`).
    pub max_client_connections: Option<usize>,
    /// Client connections one source (an IPv4 address, an IPv6 /64) may hold at once;
    /// `None`: a tenth of the global cap, at least 256 (`http::sources`); `Some(0)`: off.
    pub max_connections_per_source: Option<usize>,
    /// New client connections per second from one source (a burst of one second's
    /// worth); 0: off.
    pub max_connection_rate_per_source: usize,
    /// TLS handshakes in progress at once over all TLS VIPs; one more is closed at once.
    pub max_tls_handshakes: usize,
    /// TLS sessions kept for resumption by session ID (tickets need no state here).
    pub tls_session_cache: usize,
    /// `plugin_config`: WebSphere's plugin-cfg.xml, whose servers, clusters and routes
    /// are read as backends, farms and routes (relative to the TOML file's folder).
    pub plugin_config: Option<PathBuf>,
    /// `plugin_refresh`: how often the agent looks for a change of `plugin_config`
    /// (default: the file's `RefreshInterval`, else 60 s; 1 s to 1 h).
    pub plugin_refresh: Duration,
    /// HTTP/2 clients' bounds (`h2_*`).
    pub h2: H2Settings,
}

/// `[http] h2_*`: what one HTTP/2 client connection may ask of the dispatcher.
#[derive(Clone, Debug, PartialEq)]
pub struct H2Settings {
    /// Streams open at once (SETTINGS_MAX_CONCURRENT_STREAMS).
    pub max_concurrent_streams: u32,
    /// Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE), bytes: what a client
    /// may send of a request body before the dispatcher has passed it on.
    pub initial_window_size: u32,
    /// Streams the client may reset per second (CVE-2023-44487, "rapid reset"); a burst
    /// of twice that, then GOAWAY.
    pub max_resets_per_second: u32,
    /// SETTINGS, PING, PRIORITY, RST_STREAM, empty DATA and needless WINDOW_UPDATE frames
    /// per second; a burst of twice that, then GOAWAY.
    pub max_control_frames_per_second: u32,
}

impl Default for H2Settings {
    fn default() -> Self {
        H2Settings {
            max_concurrent_streams: 100,
            initial_window_size: 65_535,
            max_resets_per_second: 100,
            max_control_frames_per_second: 200,
        }
    }
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
            learn_wait: Duration::ZERO,
            max_held: 1000,
            retries: 1,
            retry_budget_percent: 20,
            retry_budget_min: 3,
            retry_buffer: 64 * 1024,
            client_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            body_min_rate: 1024,
            queue_timeout: Duration::from_secs(5),
            tunnel_timeout: Duration::from_secs(3600),
            max_client_connections: None,
            max_connections_per_source: None,
            max_connection_rate_per_source: 500,
            max_tls_handshakes: 1024,
            tls_session_cache: 20_000,
            plugin_config: None,
            plugin_refresh: Duration::from_secs(60),
            h2: H2Settings::default(),
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
    /// Its HTTP port when it differs from its farm's (several cluster members on one
    /// host: 9080, 9081).
    pub port: Option<u16>,
    /// Index into `Config::backends`.
    pub replica: Option<usize>,
    pub clone_ids: Vec<String>,
    /// SIP logical names this container owns (WebSphere's LN: SIP dialogs, and HTTP
    /// requests carrying `ibmappid`, of these names go to it, or to its replica).
    pub logical_names: Vec<String>,
    /// `maxconn`: requests in flight to it at once, over all workers (HAProxy's server
    /// `maxconn`); `None`: no limit.
    pub maxconn: Option<u32>,
    /// `maxqueue`: requests that may wait for one of its slots (with `maxconn`); more are
    /// answered 503 at once.
    pub maxqueue: u32,
    /// `slow_start`: after it comes back (health up, enabled, added by a reload) its
    /// share of new sessions and new L4 flows ramps up over this time (overrides the
    /// VIP's).
    pub slow_start: Option<Duration>,
    /// Removed by a reload: kept in its slot (its id stays reserved) but out of service.
    pub retired: bool,
}

/// A VIP: what every kind has (its address, its backends); what only one kind means is
/// in `kind`. The file's `[[vip]]` is flat (`raw::RawVip`); validation reports a setting
/// given to a kind it does not apply to where it always did, and keeps each kind's own.
#[derive(Clone, Debug, PartialEq)]
pub struct Vip {
    pub name: String,
    pub address: IpAddr,
    pub port: u16,
    pub protocol: Protocol,
    pub kind: VipKind,
    /// Indexes into `Config::backends`.
    pub backends: Vec<usize>,
    /// `slow_start` for the VIP's backends that set none (new sessions, and new flows on
    /// the Maglev ring).
    pub slow_start: Option<Duration>,
    /// Removed by a reload: its id stays reserved, it is served no more.
    pub retired: bool,
}

/// What a VIP is (`vip.mode`), with the settings that mean something for that kind only.
#[derive(Clone, Debug, PartialEq)]
pub enum VipKind {
    /// Forwarded by XDP alone, flow by flow on a Maglev ring.
    L4(L4Settings),
    /// SIP over UDP, routed in XDP by logical name or Call-ID; a new call takes the ring
    /// as an L4 flow does.
    Sip(L4Settings),
    /// SIP over TCP or TLS (`transport`), terminated by the agent (`sip/`): each
    /// message routed by the same rules and table as in XDP.
    SipStream(Box<SipStreamVip>),
    /// Served by the HTTP proxy (XDP passes it, or steers it to its owner). Boxed: it
    /// is several times the size of the others.
    Http(Box<HttpVip>),
}

/// A SIP VIP over a stream transport (`transport = "tcp"` or `"tls"`).
#[derive(Clone, Debug, PartialEq)]
pub struct SipStreamVip {
    pub transport: SipTransport,
    /// `[vip.tls]`, required with `transport = "tls"`.
    pub tls: Option<VipTls>,
    /// The containers' port (`backend_port`; default: the VIP's).
    pub backend_port: u16,
    /// Client connections open at once (`max_connections`; default 10,000).
    pub max_connections: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SipTransport {
    Tcp,
    Tls,
}

impl SipTransport {
    /// As in a `Via` (`SIP/2.0/TCP`) and in the configuration (lowercase).
    pub fn name(self) -> &'static str {
        match self {
            SipTransport::Tcp => "TCP",
            SipTransport::Tls => "TLS",
        }
    }
}

/// Client connections a stream SIP VIP keeps open at once unless `max_connections` says.
pub const SIP_STREAM_MAX_CONNECTIONS: usize = 10_000;

/// What XDP forwards a flow of an L4 or SIP VIP with (`VIPS`, `RINGS`, `AFFINITY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L4Settings {
    pub forwarding: Forwarding,
    pub encap_source: Option<IpAddr>,
    pub ring_size: u32,
    pub sticky_time: Option<Duration>,
    /// VIPs with the same group share source-IP affinity (cross-port affinity).
    pub port_group: u32,
}

impl Default for L4Settings {
    fn default() -> Self {
        L4Settings {
            forwarding: Forwarding::Mac,
            encap_source: None,
            ring_size: dispatcher_common::DEFAULT_RING_SIZE,
            sticky_time: None,
            port_group: 0,
        }
    }
}

/// An HTTP VIP's own settings (the proxy's are `[http]`, `HttpSettings`).
#[derive(Clone, Debug, PartialEq)]
pub struct HttpVip {
    pub balance: Balance,
    /// Port of the backends' HTTP servers; default: the VIP's port.
    pub backend_port: u16,
    /// Client connections open at once on this VIP; `None`: only the global cap applies.
    pub max_connections: Option<usize>,
    /// TLS termination (an HTTPS VIP).
    pub tls: Option<VipTls>,
    /// TLS to the backends.
    pub backend_tls: Option<BackendTlsFiles>,
    /// Answers every request with `308` to an HTTPS VIP instead of forwarding it.
    pub redirect_to: Option<Redirect>,
    /// After a failed clone returns, its sessions go back to it (true, the WebSphere
    /// plug-in's order) or stay with the clone that took them over (false: the newest
    /// clone ID in the cookie first).
    pub fail_back: bool,
    /// How the clone ID (or route) is read from JSESSIONID, in requests and `Set-Cookie`.
    pub session_format: SessionFormat,
    /// HAProxy's `cookie NAME insert`: requests without a session are kept on one backend
    /// by a cookie of this name the dispatcher sets (its value: the backend's name).
    pub insert_cookie: Option<String>,
    /// An HTTPS VIP offers `h2` by ALPN (preferred to `http/1.1`).
    pub http2: bool,
    /// A plain VIP serves a connection that opens with the HTTP/2 preface as HTTP/2
    /// (prior knowledge, RFC 9113 3.3).
    pub h2c: bool,
}

/// `[vip.tls]`: the certificates an HTTPS VIP presents and its handshake rules.
#[derive(Clone, Debug, PartialEq)]
pub struct VipTls {
    /// The first is the default (for a client without SNI, or with a name no certificate
    /// has) unless `strict_sni`.
    pub certificates: Vec<CertFiles>,
    /// No default certificate: an unknown or missing SNI gets an alert (HAProxy's
    /// `strict-sni`).
    pub strict_sni: bool,
    /// From the accept to the end of the handshake.
    pub handshake_timeout: Duration,
    /// TLS 1.2 and 1.3, or 1.3 only.
    pub min_version: TlsVersion,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// A certificate chain and its key (PEM files), and the SNI names it answers (empty:
/// the names in the certificate).
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub names: Vec<String>,
    /// The lines of its `cert =` and `key =` in the file (what an error reading them
    /// points at; 0: not from a file). Not part of what the entry is: a reload that only
    /// moves it is no change.
    pub lines: [usize; 2],
}

impl PartialEq for CertFiles {
    fn eq(&self, o: &Self) -> bool {
        (&self.cert, &self.key, &self.names) == (&o.cert, &o.key, &o.names)
    }
}

/// Where a redirecting VIP sends its clients: `https://<host>:<port><target>`.
#[derive(Clone, Debug, PartialEq)]
pub struct Redirect {
    /// The HTTPS VIP's name.
    pub vip: String,
    /// Its address: the host of a request that names none.
    pub address: IpAddr,
    pub port: u16,
    /// `redirect_host`: the `host[:port]` every Location names, whatever the request's
    /// Host says; `None`: the request's host (an open redirect for a client that can be
    /// made to send a Host of the attacker's choice).
    pub host: Option<String>,
}

/// `[vip.backend_tls]`: how the dispatcher speaks TLS to the VIP's backends.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendTlsFiles {
    /// CAs that sign the backends' certificates; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The name every backend's certificate must carry; `None`: the backend's address.
    pub server_name: Option<String>,
    /// A client certificate and key, for backends that ask for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

impl Backend {
    /// `maxqueue` when it is not configured.
    pub const DEFAULT_MAXQUEUE: u32 = 1024;
}

impl Vip {
    /// How long backend `b` (of `cfg`) ramps up on this VIP after it comes back.
    pub fn slow_start_of(&self, cfg: &Config, b: usize) -> Option<Duration> {
        cfg.backends.get(b).and_then(|be| be.slow_start).or(self.slow_start)
    }

    pub fn mode(&self) -> VipMode {
        match self.kind {
            VipKind::L4(_) => VipMode::L4,
            VipKind::Sip(_) | VipKind::SipStream(_) => VipMode::Sip,
            VipKind::Http(_) => VipMode::Http,
        }
    }

    /// A UDP VIP forwarded in XDP (L4 or SIP): its datagrams' IP fragments follow their
    /// first fragment (`FRAGS`), and it has fragment counters.
    pub fn takes_fragments(&self) -> bool {
        self.l4().is_some() && self.protocol == Protocol::Udp
    }

    /// An L4 or SIP VIP's forwarding settings.
    pub fn l4(&self) -> Option<&L4Settings> {
        match &self.kind {
            VipKind::L4(s) | VipKind::Sip(s) => Some(s),
            VipKind::Http(_) | VipKind::SipStream(_) => None,
        }
    }

    /// A SIP VIP over TCP or TLS (the agent serves it; XDP never sees it): its settings.
    pub fn sip_stream(&self) -> Option<&SipStreamVip> {
        match &self.kind {
            VipKind::SipStream(s) => Some(s),
            _ => None,
        }
    }

    /// Forwarded by XDP (an L4 or SIP-over-UDP VIP): in `VIPS`, with rings.
    pub fn in_xdp(&self) -> bool {
        self.l4().is_some()
    }

    /// An HTTP VIP's own settings.
    pub fn http(&self) -> Option<&HttpVip> {
        match &self.kind {
            VipKind::Http(h) => Some(h),
            _ => None,
        }
    }

    /// An HTTP VIP the agent serves (not one a reload removed): its settings.
    pub fn served_http(&self) -> Option<&HttpVip> {
        self.http().filter(|_| !self.retired)
    }

    /// An HTTP VIP the agent serves (not one a reload removed).
    pub fn serves_http(&self) -> bool {
        self.served_http().is_some()
    }

    /// The size of the VIP's Maglev ring (an HTTP VIP's is never read by XDP, which
    /// passes or steers its packets: the default).
    pub fn ring_size(&self) -> u32 {
        self.l4().map_or(dispatcher_common::DEFAULT_RING_SIZE, |s| s.ring_size)
    }
}

impl Config {
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
        let ctx = Ctx { text, file, errors: RefCell::new(Vec::new()), warnings: RefCell::new(Vec::new()) };
        let raw: raw::RawConfig = toml::from_str(text).map_err(|e| {
            let (line, message) = shape::explain(text, e.span(), e.message());
            ConfigError::Invalid { file: file.to_string(), line, message }
        })?;
        let cfg = ctx.build(raw);
        let mut errors = ctx.errors.into_inner();
        // This file's first, then the plugin-cfg.xml's, each in line order.
        errors.sort_by_key(|e| match e {
            ConfigError::Invalid { file: f, line, .. } => (f != file, *line),
            _ => (false, 0),
        });
        match errors.len() {
            0 => Ok(cfg),
            1 => Err(errors.remove(0)),
            _ => Err(ConfigError::Many(errors)),
        }
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

    /// A SIP VIP's port defaults to SIP's own (5060; 5061 over TLS, RFC 3261 19.1.2);
    /// every other VIP must say its port.
    #[test]
    fn a_sip_vips_port_defaults_to_sips_own() {
        let base = GOOD.split("[[vip]]").next().unwrap();
        let sip = format!("{base}[[vip]]\nname = \"s\"\naddress = \"10.0.100.3\"\nmode = \"sip\"\n");
        assert_eq!(Config::parse(&sip, "x.toml").unwrap().vips[0].port, 5060);
        let tcp = format!("{sip}transport = \"tcp\"\n");
        let c = Config::parse(&tcp, "x.toml").unwrap();
        assert_eq!((c.vips[0].port, c.vips[0].protocol), (5060, Protocol::Tcp));
        let http = format!("{base}[[vip]]\nname = \"h\"\naddress = \"10.0.100.3\"\nmode = \"http\"\n");
        let e = err_of(&http);
        assert!(e.contains("vip[0].port: required"), "{e}");
        // Two SIP VIPs over UDP on one address, both on the default: a clash, said so.
        let twice = format!("{sip}[[vip]]\nname = \"s2\"\naddress = \"10.0.100.3\"\nmode = \"sip\"\n");
        let e = err_of(&twice);
        assert!(e.contains("same address, port and protocol (10.0.100.3 port 5060 udp)"), "{e}");
    }

    #[test]
    fn parses_a_complete_file() {
        let c = Config::parse(GOOD, "x.toml").unwrap();
        assert_eq!(c.backends.len(), 2);
        assert_eq!(c.backends[0].replica, Some(1));
        assert_eq!(c.backends[1].weight, 200);
        assert_eq!(c.vips[0].backends, vec![0, 1]);
        assert_eq!(c.vips[0].l4().unwrap().sticky_time, Some(Duration::from_secs(30)));
        assert_eq!(c.vips[0].l4().unwrap().port_group, c.vips[1].l4().unwrap().port_group);
        assert_eq!(c.vips[1].l4().unwrap().forwarding, Forwarding::Ipip);
        assert_eq!(c.pin_dir(), PathBuf::from("/sys/fs/bpf/dispatcher/t1"));
    }

    /// An HTTP VIP that no route applies to is served as before routes existed: a farm
    /// of its own backends and settings, and a catch-all route; a reload that moves the
    /// backends in the file keeps the farm naming them at their slots.
    #[test]
    fn an_http_vip_without_routes_gets_its_own_farm_and_a_catch_all_route() {
        let text = GOOD.replace(
            "ring_size = 251\nsticky_time = \"30s\"\nport_group = \"g\"",
            "mode = \"http\"\nbackends = [\"b\"]\nbalance = \"least_outstanding\"\nbackend_port = 9080",
        );
        let c = Config::parse(&text, "x.toml").unwrap();
        assert_eq!(c.farms.len(), 1);
        let f = &c.farms[0];
        assert!(f.implicit);
        assert_eq!(
            (f.name.as_str(), f.servers.clone(), f.balance, f.port),
            ("web", vec![1], Balance::LeastOutstanding, Some(9080))
        );
        assert_eq!(c.routes.len(), 1);
        let r = &c.routes[0];
        assert_eq!(
            (r.vips.clone(), r.farm, r.hosts.clone(), r.uris.clone()),
            (vec![0], 0, vec!["*:*".to_string()], vec!["/*".to_string()])
        );
        assert_eq!((r.cookie.as_str(), r.url_parameter.as_str()), (DEFAULT_SESSION_COOKIE, DEFAULT_URL_PARAMETER));
        // A backend added first in the file: the farm names b at the slot the running
        // configuration gave it, not at its new position.
        let moved = text.replacen("[[backend]]\nname = \"a\"", "[[backend]]\nname = \"zz\"\naddress = \"10.0.0.19\"\nmac = \"02:00:00:00:00:19\"\n\n[[backend]]\nname = \"a\"", 1);
        let merged = c.merged_for_reload(Config::parse(&moved, "x.toml").unwrap()).unwrap();
        assert_eq!(merged.backends[1].name, "b");
        assert_eq!(merged.farms[0].servers, vec![1], "b keeps its slot");
        assert_eq!(merged.routes[0].vips, vec![0]);
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
        assert_eq!(e, "x.toml:17: backend[1].wieght: unknown field; did you mean `weight`?");
        let e = err_of(&GOOD.replace("sticky_time = \"30s\"", "sticky_time = \"30 parsecs\""));
        assert!(e.starts_with("x.toml:25: vip[0].sticky_time:"), "{e}");
        let e = err_of(&GOOD.replace("mac = \"02:00:00:00:00:12\"", "mac = \"02:00:00:00:12\""));
        assert!(e.starts_with("x.toml:16: backend[1].mac:"), "{e}");
        let e = err_of(&GOOD.replace("encap_source = \"10.0.0.1\"\n", ""));
        assert!(e.contains("vip[1].encap_source: required"), "{e}");
        let e =
            err_of(&format!("{GOOD}\n[[backend]]\nname = \"c\"\naddress = \"10.0.0.13\"\nclone_ids = [\"cloneA\"]\n"));
        assert!(
            e.contains("backend[2].clone_ids: clone ID `cloneA` is already a clone ID or logical name of backend `a`"),
            "{e}"
        );
    }

    #[test]
    fn session_format_per_http_vip() {
        let http = format!("{GOOD}\n[[vip]]\nname = \"app\"\naddress = \"10.0.100.2\"\nport = 80\nmode = \"http\"\n");
        let c = Config::parse(&http, "x.toml").unwrap();
        assert_eq!(c.vips[2].http().unwrap().session_format, SessionFormat::WebSphere, "the default");
        let tomcat = format!("{http}session_format = \"jvmroute\"\n");
        assert_eq!(
            Config::parse(&tomcat, "x.toml").unwrap().vips[2].http().unwrap().session_format,
            SessionFormat::JvmRoute
        );
        // A route is what follows the last '.': a configured clone ID with one never matches.
        let e = err_of(&tomcat.replace("clone_ids = [\"cloneA\"]", "clone_ids = [\"node.A\"]"));
        assert!(e.contains("x.toml:11: backend[0].clone_ids: `node.A` cannot be a jvmRoute of VIP `app`"), "{e}");
        let e = err_of(&format!("{http}session_format = \"tomcat\"\n"));
        assert!(e.contains("vip[2].session_format: `tomcat` is not one of websphere, jvmroute"), "{e}");
        let e =
            err_of(&GOOD.replace("port_group = \"g\"\n\n", "port_group = \"g\"\nsession_format = \"jvmroute\"\n\n"));
        assert!(e.contains("vip[0].session_format: applies to HTTP VIPs only"), "{e}");
    }

    /// An L4 VIP on an HTTP VIP's address goes with the HTTP interface (issue 31): said.
    #[test]
    fn an_l4_vip_on_an_http_vips_address_is_warned_about_when_announced() {
        let http = "\n[[vip]]\nname = \"app\"\naddress = \"10.0.100.1\"\nport = 8080\nmode = \"http\"\n";
        let c = Config::parse(&format!("{GOOD}{http}"), "x.toml").unwrap();
        assert!(!c.warnings.iter().any(|w| w.contains("shares address")), "nothing announced: {:?}", c.warnings);
        let c = Config::parse(&format!("{GOOD}{http}\n[announce]\n"), "x.toml").unwrap();
        let w: Vec<_> = c.warnings.iter().filter(|w| w.contains("shares address")).collect();
        assert_eq!(w.len(), 2, "web and tls: {w:?}");
        assert!(w[0].starts_with("VIP `web` shares address 10.0.100.1 with HTTP VIP `app`"), "{}", w[0]);
        assert!(w[0].contains("give it an address of its own"), "{}", w[0]);
        let own = http.replace("10.0.100.1", "10.0.100.9");
        let c = Config::parse(&format!("{GOOD}{own}\n[announce]\n"), "x.toml").unwrap();
        assert!(!c.warnings.iter().any(|w| w.contains("shares address")), "{:?}", c.warnings);
    }

    /// Each mode's settings are on its kind: an L4 VIP's forwarding, an HTTP VIP's backend
    /// port, TLS and redirect; the XDP keys of an HTTP VIP are checked, not kept.
    #[test]
    fn each_mode_carries_its_own_settings() {
        let text = format!(
            "{GOOD}\n[[vip]]\nname = \"app\"\naddress = \"10.0.100.2\"\nport = 80\nmode = \"http\"\nbackend_port = 9080\nring_size = 1009\nbalance = \"least_outstanding\"\n\
             \n[[vip]]\nname = \"sip\"\naddress = \"10.0.100.3\"\nport = 5060\nmode = \"sip\"\nsticky_time = \"5s\"\n"
        );
        let c = Config::parse(&text, "x.toml").unwrap();
        let (l4, http, sip) = (&c.vips[1], &c.vips[2], &c.vips[3]);
        assert_eq!(l4.mode(), VipMode::L4);
        assert_eq!(
            l4.l4().map(|s| (s.forwarding, s.encap_source)),
            Some((Forwarding::Ipip, Some("10.0.0.1".parse().unwrap())))
        );
        assert!(l4.http().is_none() && !l4.serves_http());
        assert_eq!(http.mode(), VipMode::Http);
        assert!(http.l4().is_none(), "an HTTP VIP has no XDP forwarding settings");
        assert_eq!(http.ring_size(), dispatcher_common::DEFAULT_RING_SIZE, "its ring is never read");
        let h = http.served_http().expect("served");
        assert_eq!((h.backend_port, h.balance, h.fail_back), (9080, Balance::LeastOutstanding, true));
        assert_eq!(sip.mode(), VipMode::Sip);
        assert_eq!(sip.protocol, Protocol::Udp, "SIP's default protocol");
        assert_eq!(sip.l4().and_then(|s| s.sticky_time), Some(Duration::from_secs(5)));
        let e = err_of(&text.replace("ring_size = 1009", "ring_size = 250"));
        assert!(e.contains("vip[2].ring_size: 250 must be a prime"), "checked on an HTTP VIP too: {e}");
        // A SIP VIP is called a SIP VIP (issue 30): only it needs b's MAC here.
        let sip_only = text
            .replacen("port = 80\nring_size = 251", "port = 80\nmode = \"http\"\nring_size = 251", 1)
            .replacen("forwarding = \"ipip\"\nencap_source = \"10.0.0.1\"\n", "mode = \"http\"\n", 1);
        let e = err_of(&sip_only.replace("mac = \"02:00:00:00:00:12\"\n", ""));
        assert!(
            e.contains(
                "backend[1].mac: required: backend `b` serves SIP VIP `sip` (XDP forwards to the backend's MAC)"
            ),
            "{e}"
        );
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
