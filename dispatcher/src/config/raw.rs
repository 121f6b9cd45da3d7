//! The file's shape as serde reads it: every field a validation message must point at is
//! `Spanned` (its line), every section refuses unknown fields.

use serde::Deserialize;
use toml::Spanned;

/// Raw file shape. Every field a validation message must point at is `Spanned`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) dispatcher: Spanned<RawDispatcher>,
    #[serde(default, rename = "backend")]
    pub(super) backends: Vec<Spanned<RawBackend>>,
    #[serde(default, rename = "vip")]
    pub(super) vips: Vec<Spanned<RawVip>>,
    #[serde(default, rename = "partition")]
    pub(super) partitions: Vec<Spanned<RawPartition>>,
    #[serde(default, rename = "farm")]
    pub(super) farms: Vec<Spanned<RawFarm>>,
    #[serde(default, rename = "route")]
    pub(super) routes: Vec<Spanned<RawRoute>>,
    pub(super) http: Option<Spanned<RawHttp>>,
    pub(super) health: Option<Spanned<RawHealth>>,
    pub(super) cluster: Option<Spanned<RawCluster>>,
    pub(super) announce: Option<Spanned<RawAnnounce>>,
    pub(super) access_log: Option<Spanned<RawAccessLog>>,
}

/// `[[farm]]`: WebSphere's `ServerCluster`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFarm {
    pub(super) name: Spanned<String>,
    pub(super) servers: Spanned<Vec<Spanned<String>>>,
    pub(super) backup_servers: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) balance: Option<Spanned<String>>,
    pub(super) port: Option<Spanned<u16>>,
    pub(super) fail_back: Option<Spanned<bool>>,
    pub(super) session_format: Option<Spanned<String>>,
    pub(super) slow_start: Option<Spanned<String>>,
    pub(super) connect_timeout: Option<Spanned<String>>,
    pub(super) io_timeout: Option<Spanned<String>>,
}

/// `[[route]]`: virtual hosts and URIs to a farm.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoute {
    pub(super) name: Option<Spanned<String>>,
    pub(super) vips: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) hosts: Spanned<Vec<Spanned<String>>>,
    pub(super) uris: Spanned<Vec<Spanned<String>>>,
    pub(super) farm: Spanned<String>,
    pub(super) cookie: Option<Spanned<String>>,
    pub(super) url_parameter: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccessLog {
    pub(super) path: Option<Spanned<String>>,
    pub(super) syslog: Option<Spanned<String>>,
    pub(super) format: Option<Spanned<String>>,
    pub(super) buffer: Option<Spanned<usize>>,
    pub(super) tag: Option<Spanned<String>>,
    pub(super) facility: Option<Spanned<String>>,
    pub(super) max_message: Option<Spanned<usize>>,
    pub(super) syslog_format: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCluster {
    pub(super) name: Spanned<String>,
    pub(super) endpoints: Spanned<Vec<Spanned<String>>>,
    pub(super) key_prefix: Option<Spanned<String>>,
    pub(super) lease_ttl: Option<Spanned<String>>,
    pub(super) request_timeout: Option<Spanned<String>>,
    pub(super) startup_wait: Option<Spanned<String>>,
    pub(super) steering: Option<Spanned<bool>>,
    pub(super) second_chance: Option<Spanned<String>>,
    pub(super) learn_wait: Option<Spanned<String>>,
    pub(super) heartbeat_interval: Option<Spanned<String>>,
    pub(super) heartbeat_misses: Option<Spanned<i64>>,
    pub(super) heartbeat_port: Option<Spanned<i64>>,
    pub(super) takeover: Option<Spanned<bool>>,
    pub(super) peers: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) ca_file: Option<Spanned<String>>,
    pub(super) cert: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
    pub(super) username: Option<Spanned<String>>,
    pub(super) password_file: Option<Spanned<String>>,
    pub(super) insecure_plaintext: Option<Spanned<bool>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAnnounce {
    pub(super) http_interface: Option<Spanned<String>>,
    pub(super) l4_interface: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHealth {
    pub(super) kind: Option<Spanned<String>>,
    pub(super) path: Option<Spanned<String>>,
    pub(super) expect_status: Option<Spanned<u16>>,
    pub(super) port: Option<Spanned<u16>>,
    pub(super) interval: Option<Spanned<String>>,
    pub(super) timeout: Option<Spanned<String>>,
    pub(super) rise: Option<Spanned<u32>>,
    pub(super) fall: Option<Spanned<u32>>,
    pub(super) enabled: Option<Spanned<bool>>,
    pub(super) suspect_on_status: Option<Spanned<Vec<Spanned<u16>>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPartition {
    pub(super) id: Spanned<String>,
    pub(super) primary: Spanned<String>,
    pub(super) replica: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub(super) workers: Option<Spanned<usize>>,
    pub(super) cookie_name: Option<Spanned<String>>,
    pub(super) url_parameter: Option<Spanned<String>>,
    pub(super) max_header_bytes: Option<Spanned<usize>>,
    pub(super) max_headers: Option<Spanned<usize>>,
    pub(super) header_timeout: Option<Spanned<String>>,
    pub(super) client_idle_timeout: Option<Spanned<String>>,
    pub(super) connect_timeout: Option<Spanned<String>>,
    pub(super) server_timeout: Option<Spanned<String>>,
    pub(super) pool_max_idle: Option<Spanned<usize>>,
    pub(super) pool_idle_timeout: Option<Spanned<String>>,
    pub(super) max_connections_per_backend: Option<Spanned<usize>>,
    pub(super) drain_timeout: Option<Spanned<String>>,
    pub(super) hold_time: Option<Spanned<String>>,
    pub(super) max_held: Option<Spanned<usize>>,
    pub(super) retries: Option<Spanned<usize>>,
    pub(super) retry_budget_percent: Option<Spanned<usize>>,
    pub(super) retry_budget_min: Option<Spanned<usize>>,
    pub(super) retry_buffer: Option<Spanned<usize>>,
    pub(super) client_timeout: Option<Spanned<String>>,
    pub(super) body_timeout: Option<Spanned<String>>,
    pub(super) body_min_rate: Option<Spanned<usize>>,
    pub(super) queue_timeout: Option<Spanned<String>>,
    pub(super) tunnel_timeout: Option<Spanned<String>>,
    pub(super) max_client_connections: Option<Spanned<usize>>,
    pub(super) max_connections_per_source: Option<Spanned<usize>>,
    pub(super) max_connection_rate_per_source: Option<Spanned<usize>>,
    pub(super) max_tls_handshakes: Option<Spanned<usize>>,
    pub(super) tls_session_cache: Option<Spanned<usize>>,
    pub(super) plugin_config: Option<Spanned<String>>,
    pub(super) plugin_refresh: Option<Spanned<String>>,
    pub(super) plugin_vips: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) h2_max_concurrent_streams: Option<Spanned<usize>>,
    pub(super) h2_initial_window_size: Option<Spanned<usize>>,
    pub(super) h2_max_resets_per_second: Option<Spanned<usize>>,
    pub(super) h2_max_control_frames_per_second: Option<Spanned<usize>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDispatcher {
    pub(super) interface: Spanned<String>,
    pub(super) instance: Option<Spanned<String>>,
    pub(super) bpffs: Option<Spanned<String>>,
    pub(super) xdp_mode: Option<Spanned<String>>,
    pub(super) flow_table_size: Option<Spanned<u32>>,
    pub(super) affinity_table_size: Option<Spanned<u32>>,
    pub(super) log_level: Option<Spanned<String>>,
    pub(super) admin_socket: Option<Spanned<String>>,
    pub(super) admin_address: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackend {
    pub(super) name: Spanned<String>,
    pub(super) address: Spanned<String>,
    pub(super) address6: Option<Spanned<String>>,
    pub(super) mac: Option<Spanned<String>>,
    pub(super) weight: Option<Spanned<u32>>,
    pub(super) port: Option<Spanned<u16>>,
    pub(super) replica: Option<Spanned<String>>,
    #[serde(default)]
    pub(super) clone_ids: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) logical_names: Vec<Spanned<String>>,
    pub(super) maxconn: Option<Spanned<u32>>,
    pub(super) maxqueue: Option<Spanned<u32>>,
    pub(super) slow_start: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVip {
    pub(super) name: Spanned<String>,
    pub(super) address: Spanned<String>,
    /// Required but on SIP VIPs (5060; 5061 over TLS).
    pub(super) port: Option<Spanned<u16>>,
    pub(super) protocol: Option<Spanned<String>>,
    pub(super) mode: Option<Spanned<String>>,
    pub(super) transport: Option<Spanned<String>>,
    pub(super) forwarding: Option<Spanned<String>>,
    pub(super) encap_source: Option<Spanned<String>>,
    pub(super) backends: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) ring_size: Option<Spanned<u32>>,
    pub(super) sticky_time: Option<Spanned<String>>,
    pub(super) port_group: Option<Spanned<String>>,
    pub(super) balance: Option<Spanned<String>>,
    pub(super) backend_port: Option<Spanned<u16>>,
    pub(super) max_connections: Option<Spanned<usize>>,
    pub(super) tls: Option<Spanned<RawTls>>,
    pub(super) backend_tls: Option<Spanned<RawBackendTls>>,
    pub(super) redirect_to: Option<Spanned<String>>,
    pub(super) redirect_host: Option<Spanned<String>>,
    pub(super) fail_back: Option<Spanned<bool>>,
    pub(super) session_format: Option<Spanned<String>>,
    pub(super) insert_cookie: Option<Spanned<String>>,
    pub(super) http2: Option<Spanned<bool>>,
    pub(super) h2c: Option<Spanned<bool>>,
    pub(super) slow_start: Option<Spanned<String>>,
}

/// `[vip.tls]`: TLS on an HTTP VIP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    #[serde(default, rename = "certificate")]
    pub(super) certificates: Vec<Spanned<RawCertificate>>,
    pub(super) strict_sni: Option<Spanned<bool>>,
    pub(super) handshake_timeout: Option<Spanned<String>>,
    pub(super) min_version: Option<Spanned<String>>,
}

/// `[[vip.tls.certificate]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCertificate {
    pub(super) cert: Spanned<String>,
    pub(super) key: Spanned<String>,
    pub(super) names: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[vip.backend_tls]`: TLS from the dispatcher to the VIP's backends.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBackendTls {
    pub(super) ca_file: Option<Spanned<String>>,
    pub(super) server_name: Option<Spanned<String>>,
    pub(super) cert: Option<Spanned<String>>,
    pub(super) key: Option<Spanned<String>>,
}
