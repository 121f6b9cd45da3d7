//! The admin endpoint's answers as types: one definition for the agent that writes them
//! and for the CLI, the demo and the benchmarks that read them (`GET /status` and the
//! replies to commands). The JSON they serialise to is the endpoint's documented form.
//! A leaf: the modules that fill a part of the status (`shared`, `steering`) depend on it,
//! not on the admin endpoint.

use serde::{Deserialize, Serialize};

/// `GET /status`: the agent's own view.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentStatus {
    pub pid: u32,
    pub uptime_s: u64,
    /// The agent's version (`CARGO_PKG_VERSION`).
    #[serde(default)]
    pub version: String,
    /// Entries in the clone table (configured and learned).
    pub clones: usize,
    /// Pins removed under the agent that it could not restore (empty: all there).
    #[serde(default)]
    pub pins_missing: Vec<String>,
    /// What the agent finds wrong with its setup right now, in words (the veth trap).
    #[serde(default)]
    pub warnings: Vec<String>,
    pub backends: Vec<BackendStatus>,
    /// HTTP VIPs.
    pub vips: Vec<VipStatus>,
    /// L4 and SIP VIPs: what XDP forwarded (the pinned maps' counters).
    #[serde(default)]
    pub xdp_vips: Vec<XdpVipStatus>,
    /// Farms (an implicit farm is its VIP's own backends, under the VIP's name).
    #[serde(default)]
    pub farms: Vec<FarmStatus>,
    /// Configured routes (a VIP's implicit catch-all is counted by its farm).
    #[serde(default)]
    pub routes: Vec<RouteStatus>,
    pub counters: CounterStatus,
    /// `[cluster]` only: the shared store and the other dispatchers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// `[cluster]` with steering: who owns which HTTP connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering: Option<SteeringStatus>,
    /// `[announce]`: whether this dispatcher announces its VIPs now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announced: Option<bool>,
}

/// Connection steering for HTTP VIPs behind ECMP, as this dispatcher runs it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SteeringStatus {
    /// An ownership table is installed (the XDP program steers).
    pub active: bool,
    /// This dispatcher takes connections (not after `dispatcher leave`).
    pub joined: bool,
    /// Generation of the current table (one more per membership change here).
    pub generation: u32,
    /// The dispatchers in the current table.
    pub dispatchers: Vec<String>,
    /// The dispatchers of the previous table, while it serves second chances.
    pub previous: Vec<String>,
    pub second_chance_left_s: Option<f64>,
    pub changed_s_ago: Option<f64>,
    /// What the last change did: `+d3`, `-d2` (why a dispatcher went: `cluster`'s
    /// `out_unreachable`, or its lease, or its `leave`).
    #[serde(default)]
    pub last_change: Option<String>,
    /// Packets sent on to their owner, by second chance, kept here against the table
    /// (a connection from before the change), and not sent for want of TTL.
    pub steered: u64,
    pub second_chances: u64,
    pub kept_local: u64,
    pub ttl_expired: u64,
    /// Connection takeover (`[cluster] takeover`), when on.
    #[serde(default)]
    pub takeover: Option<TakeoverStatus>,
}

/// Connection takeover, both sides.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TakeoverStatus {
    /// This dispatcher's connections registered now, and in all; not registered (over the
    /// cap, or unreadable options); records and bytes sent to the peers.
    pub tracked: u64,
    pub registered: u64,
    pub untracked: u64,
    pub records_sent: u64,
    pub bytes_sent: u64,
    /// CPU time spent registering connections and building batches (ns).
    #[serde(default)]
    pub busy_ns: u64,
    /// Other dispatchers' connections held here (not armed), and armed (their dispatcher
    /// died).
    pub held: u64,
    pub armed_now: u64,
    /// Batches taken and refused (not newer than the last), records refused (the cap).
    pub batches: u64,
    pub batches_refused: u64,
    pub records_refused: u64,
    /// Records armed in all; connections rebuilt and adopted, reset (busy when their
    /// dispatcher died), failed to rebuild; reports refused.
    pub armed: u64,
    pub rebuilt: u64,
    pub reset: u64,
    pub failed: u64,
    pub reports_refused: u64,
    /// Bare acknowledgements of quiet armed connections (their request awaited).
    pub waited: u64,
    /// Busy connections' clients probed at their dispatcher's death (to be reset at once).
    #[serde(default)]
    pub probed: u64,
    /// Reports whose timestamp echo the dead dispatcher could not have sent (refused).
    #[serde(default)]
    pub implausible: u64,
    /// Rebuilt connections given their client's segment with the report (it needed no
    /// retransmission).
    #[serde(default)]
    pub given: u64,
    /// XDP: segments reported, and dropped without a report.
    pub segments_reported: u64,
    pub segments_dropped: u64,
}

/// The shared store as this dispatcher sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// This dispatcher's name.
    pub name: String,
    /// "connected" or "unreachable".
    pub store: String,
    /// Seconds in that state.
    pub store_for_s: u64,
    pub last_error: Option<String>,
    pub endpoints: Vec<String>,
    /// The etcd member this dispatcher's session talks to (one at a time).
    #[serde(default)]
    pub via: String,
    /// etcd members, as the member this dispatcher talks to lists them.
    pub store_members: usize,
    /// The etcd leader's id (hex).
    pub leader: String,
    /// The store revision last seen.
    pub revision: i64,
    /// The live dispatchers (those holding a lease), this one included.
    pub members: Vec<MemberStatus>,
    /// Backends the dispatchers' own checks disagree on.
    pub differing: Vec<String>,
    /// Operator states in the store, `backend=drain|disabled`.
    pub operators: Vec<String>,
    /// Clone and partition IDs in the store.
    pub shared_clones: usize,
    /// Writes waiting for the store.
    pub pending_writes: usize,
    pub writes: u64,
    pub renewals: u64,
    pub sessions: u64,
    pub dropped_writes: u64,
    /// Keys under the prefix not taken (the sum of `refused_keys`).
    pub ignored_keys: u64,
    /// Keys not taken, by reason (`shared::view::Refusal`).
    #[serde(default)]
    pub refused_keys: Vec<(String, u64)>,
    /// How the link to the store is secured, in words.
    #[serde(default)]
    pub security: String,
    /// Anyone who can reach the store can write to it, as far as this side can tell.
    #[serde(default)]
    pub insecure: bool,
    /// `[cluster] peers`: the only names a member key may have.
    #[serde(default)]
    pub peers: Vec<String>,
    /// Where this dispatcher takes peer heartbeats (none: it does not steer).
    #[serde(default)]
    pub heartbeat_address: Option<String>,
    /// The peers whose heartbeats this dispatcher watches, as it hears them.
    #[serde(default)]
    pub heartbeats: Vec<PeerStatus>,
    /// Heartbeats sent, taken, and datagrams refused by reason (`peers::tracker::Refusal`).
    #[serde(default)]
    pub heartbeats_sent: u64,
    #[serde(default)]
    pub heartbeats_received: u64,
    #[serde(default)]
    pub heartbeats_refused: Vec<(String, u64)>,
    /// Dispatchers out of every ownership table because most others cannot reach them,
    /// each with who says so: `d2 (unreachable for d0,d3)`.
    #[serde(default)]
    pub out_unreachable: Vec<String>,
}

/// A peer's heartbeats, as this dispatcher hears them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    /// Its published heartbeat address.
    pub address: String,
    pub reachable: bool,
    /// Since its last heartbeat (none: not heard yet).
    pub last_heard_ms: Option<u64>,
    pub received: u64,
    /// Since it last went unreachable or came back.
    pub changed_s_ago: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub name: String,
    pub pid: u32,
    /// Seconds since the epoch when its agent started.
    pub started: u64,
    pub version: String,
    /// Backends its own checks see down.
    pub down: Vec<String>,
    /// Its MAC for steering (none: it does not steer).
    #[serde(default)]
    pub mac: Option<String>,
    /// It takes connections (false after `dispatcher leave`).
    #[serde(default)]
    pub joined: bool,
    /// The peers its heartbeats do not reach.
    #[serde(default)]
    pub unreachable: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    pub name: String,
    /// What routing obeys.
    pub state: String,
    pub health: String,
    /// The operator's state: "none", "drain" or "disabled".
    pub admin: String,
    /// Requests in flight.
    pub active: u64,
    /// Open upstream connections.
    pub connections: u64,
    pub requests: u64,
    pub errors: u64,
    /// A backend with `maxconn`: its slots and queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    /// Its last change of state and why (none since the agent started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_change: Option<ChangeStatus>,
    /// How long its last health check took, in milliseconds (none: not checked yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_check_ms: Option<f64>,
    /// Final statuses it returned, by class (1xx .. 5xx, other).
    #[serde(default)]
    pub responses: std::collections::BTreeMap<String, u64>,
    /// The weight it is balanced by, and the configuration's (they differ after
    /// `dispatcher weight`, until a reload).
    #[serde(default)]
    pub weight: u32,
    #[serde(default)]
    pub configured_weight: u32,
    /// The configuration's `maxconn` (`queue.maxconn` is the one in force).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured_maxconn: Option<u64>,
    /// Its health checks are disabled by the operator (until a reload).
    #[serde(default)]
    pub checks_disabled: bool,
}

/// A backend's change of state: from, to, why, what the deciding check took, when.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChangeStatus {
    pub from: String,
    pub to: String,
    /// In words: `timeout after 2.0s`, `status 503`, `passive: refused`, `operator drain`.
    pub reason: String,
    /// Its bounded kind, as the metrics label it (`timeout`, `status_5xx`, ...).
    pub reason_kind: String,
    /// What the check that decided it took (none: not a check's verdict).
    pub check_ms: Option<u64>,
    /// When, in seconds since the epoch.
    pub at_unix: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStatus {
    pub maxconn: u64,
    /// Requests holding a slot now (both generations across a reload).
    pub in_flight: u64,
    pub maxqueue: u64,
    /// Requests waiting for a slot now.
    pub queued: u64,
    /// Requests that had to wait, since the start.
    pub queued_total: u64,
    /// Answered 503 because the queue was full / because no slot came in time.
    pub refused_full: u64,
    pub refused_timeout: u64,
    /// Answered 503 because the server left while they waited, and rerouting was used up.
    #[serde(default)]
    pub refused_left: u64,
    /// Mean wait of the requests that queued, in milliseconds.
    pub wait_mean_ms: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VipStatus {
    pub name: String,
    /// Where clients reach it, and how: `http` or `https`.
    #[serde(default)]
    pub address: String,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub mode: String,
    pub requests: u64,
    /// Open client connections.
    pub connections: u64,
    /// HTTPS VIPs: handshakes and certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsStatus>,
    /// Requests no route of the VIP matched (answered 404).
    #[serde(default)]
    pub no_route: u64,
    /// Final statuses clients got, by class (the dispatcher's own answers included).
    #[serde(default)]
    pub responses: std::collections::BTreeMap<String, u64>,
}

/// What the request path counts per farm and per route.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PathCounts {
    /// Requests routed to it.
    pub requests: u64,
    /// Decisions that sent a request to the owner its session names.
    pub affinity_hits: u64,
    /// Decisions that sent a session's request to its owner's replica (owner out).
    pub failovers: u64,
    /// Decisions left to the balancer.
    pub balanced: u64,
    /// Session requests sent to neither the owner nor its replica (must stay 0).
    pub misroutes: u64,
}

/// A farm: its servers and what it served.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FarmStatus {
    pub name: String,
    /// Made from an HTTP VIP's own backends (named after the VIP).
    #[serde(default)]
    pub implicit: bool,
    pub servers: Vec<String>,
    #[serde(default)]
    pub backup_servers: Vec<String>,
    #[serde(flatten)]
    pub counts: PathCounts,
}

/// A configured route: what it matches, where it sends, what it served.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteStatus {
    /// Its name (`config::Route::name`: metrics and the access log name it so).
    pub name: String,
    /// Its index among the routes.
    pub index: usize,
    pub vips: Vec<String>,
    pub hosts: Vec<String>,
    pub uris: Vec<String>,
    pub farm: String,
    pub cookie: String,
    #[serde(flatten)]
    pub counts: PathCounts,
}

/// An L4 or SIP VIP as XDP counts it (summed over CPUs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct XdpVipStatus {
    pub name: String,
    pub address: String,
    pub port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// `l4` or `sip`.
    pub mode: String,
    /// Packets and bytes forwarded (new flows and pinned ones).
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub drops: u64,
    /// SIP VIPs: messages by outcome (forwarded by affinity source, held, unknown_ln,
    /// invalid).
    pub sip: std::collections::BTreeMap<String, u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TlsStatus {
    pub handshakes_full: u64,
    pub handshakes_resumed: u64,
    /// Failed handshakes by reason (timeout, closed, plain_http, not_tls, unknown_sni,
    /// cap, protocol).
    pub failures: std::collections::BTreeMap<String, u64>,
    pub certificates: Vec<CertificateStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CertificateStatus {
    pub file: String,
    pub subject: String,
    pub names: Vec<String>,
    /// End of validity, seconds since the epoch.
    pub not_after: i64,
    /// Seconds left (negative: expired).
    pub expires_in_s: i64,
}

/// The agent's own counters, by status key: made from their one declaration
/// (`metrics::Counters`), as the `/metrics` exposition is.
pub use crate::metrics::CounterStatus;

/// `POST /backends/NAME/ACTION`: the backend's state before and after.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandReply {
    pub backend: String,
    pub from: String,
    pub to: String,
    /// A runtime setting (weight, maxconn, checks): what changed, in words.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub change: String,
}

/// `POST /counters/clear`: which counters were cleared.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClearReply {
    pub cleared: String,
}

/// `POST /reload` that took effect: what changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReloadReply {
    pub reloaded: String,
    /// What changed, one line each (`backend b2 added`, `VIP web: port 80 -> 8080`);
    /// empty: nothing.
    #[serde(default)]
    pub changes: Vec<String>,
}

/// `POST /join` or `POST /leave` that took effect: what it did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MembershipReply {
    pub membership: String,
}

/// `POST /stop`: the agent is on its way out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StopReply {
    pub stopping: bool,
    pub detach: bool,
    pub pid: u32,
}

/// Any refusal or failure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: String,
}

/// The JSON of a reply (these types cannot fail to serialise).
pub fn to_json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented JSON shape, read back into the same types.
    #[test]
    fn status_round_trips_with_its_documented_keys() {
        let s = AgentStatus {
            pid: 7,
            backends: vec![BackendStatus { name: "b0".into(), state: "up".into(), ..Default::default() }],
            vips: vec![VipStatus {
                name: "web".into(),
                address: "10.0.0.1".into(),
                port: 443,
                mode: "https".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let json: serde_json::Value = serde_json::from_str(&to_json(&s)).unwrap();
        for key in
            ["pid", "uptime_s", "version", "clones", "pins_missing", "backends", "vips", "farms", "routes", "counters"]
        {
            assert!(json.get(key).is_some(), "{key} in {json}");
        }
        assert_eq!(json["backends"][0]["state"], "up");
        assert_eq!(
            (&json["vips"][0]["address"], &json["vips"][0]["port"], &json["vips"][0]["mode"]),
            (&"10.0.0.1".into(), &443.into(), &"https".into())
        );
        assert_eq!(json["counters"]["misroutes"], 0);
        assert_eq!(serde_json::from_value::<AgentStatus>(json).unwrap(), s);
    }
}

/// `GET /errors`: the last requests the dispatcher refused as malformed or hostile,
/// oldest first (`refusals`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorsReply {
    /// Refusals since the agent started.
    pub total: u64,
    /// How many the agent keeps.
    pub kept: usize,
    pub errors: Vec<RefusedRequest>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RefusedRequest {
    /// When, RFC 3339 UTC.
    pub at: String,
    pub vip: String,
    /// The client's address:port.
    pub client: String,
    /// `h1` or `h2`.
    pub protocol: String,
    /// The status it was answered with.
    pub status: u16,
    /// Why, in words.
    pub reason: String,
    /// The offset in `bytes` (before escaping) of the first byte no head may hold, when
    /// there is one.
    pub position: Option<usize>,
    /// How many bytes had arrived, and how many of them are kept (the first 1 KiB).
    pub received: usize,
    pub captured: usize,
    /// What arrived, printable ASCII as it is, every other byte (and `\`) as `\xNN`.
    pub bytes: String,
}

/// `GET /clones[?table=sip&offset=N&limit=N]`: a page of the clone table (clone and
/// partition IDs) or of the SIP logical-name table, sorted by ID.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClonesReply {
    /// `clones` or `sip`.
    pub table: String,
    /// Entries in that table, and where this page starts.
    pub total: usize,
    pub offset: usize,
    pub entries: Vec<CloneStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CloneStatus {
    /// The ID, or `#` and its hash in hex (an entry an earlier agent left: only the hash).
    pub id: String,
    pub backend: String,
    pub replica: Option<String>,
    /// `configured` or `learned`.
    pub kind: String,
    /// Where from: `clone_ids`, `logical_names`, `partition`; `local (Set-Cookie)`,
    /// `local (SIP check)`, `store`, `pinned (earlier agent)`.
    pub from: String,
    /// Seconds since it was configured or learned (none: not known).
    pub age_s: Option<u64>,
}

/// `POST /clones/delete?id=ID`: the entry forgotten.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CloneDeleted {
    pub deleted: CloneStatus,
}
