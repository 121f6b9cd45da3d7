//! `dispatcher check`: every validation message, with the file, the line and the field,
//! and all errors of a file in one run.

use std::process::Command;

use dispatcher_testbed::{netns::dispatcher_bin, tls::Pki};

/// A file that uses every field once.
const FULL: &str = r#"[dispatcher]
interface = "eth0"
instance = "t"
bpffs = "/sys/fs/bpf"
xdp_mode = "auto"
flow_table_size = 65536
affinity_table_size = 65536
log_level = "info,dispatcher::http=debug"
admin_socket = "/run/dispatcher/t.sock"
admin_address = "127.0.0.1:9901"

[[backend]]
name = "a"
address = "10.0.0.11"
address6 = "fd00::11"
mac = "02:00:00:00:00:11"
weight = 100
replica = "b"
clone_ids = ["cloneA"]
maxconn = 100
maxqueue = 50
slow_start = "30s"

[[backend]]
name = "b"
address = "10.0.0.12"
mac = "02:00:00:00:00:12"
replica = "a"
clone_ids = ["cloneB"]

[[vip]]
name = "l4"
address = "10.0.100.1"
port = 80
protocol = "tcp"
mode = "l4"
forwarding = "ipip"
encap_source = "10.0.0.1"
backends = ["a", "b"]
ring_size = 251
sticky_time = "30s"
balance = "round_robin"
port_group = "g"

[[vip]]
name = "web"
address = "10.0.100.2"
port = 8080
mode = "http"
backend_port = 9080
max_connections = 1000
session_format = "websphere"
insert_cookie = "SRV"
slow_start = "1m"

[[partition]]
id = "123"
primary = "a"
replica = "b"

[health]
kind = "http"
path = "/health"
expect_status = 200
port = 9080
interval = "1s"
timeout = "500ms"
rise = 2
fall = 3
suspect_on_status = [503]

[http]
workers = 1
cookie_name = "JSESSIONID"
url_parameter = "jsessionid"
header_timeout = "10s"
hold_time = "2s"
max_held = 100
retries = 1
retry_budget_percent = 20
client_timeout = "30s"
body_timeout = "60s"
body_min_rate = 1024
queue_timeout = "5s"
tunnel_timeout = "1h"
max_client_connections = 5000
max_connections_per_source = 500
max_connection_rate_per_source = 200

[cluster]
name = "lb1"
peers = ["lb1", "lb2@02:00:00:00:00:02"]
endpoints = ["http://10.0.0.21:2379"]
insecure_plaintext = true
steering = true
second_chance = "300s"
learn_wait = "250ms"
heartbeat_interval = "100ms"
heartbeat_misses = 3
heartbeat_port = 7405

[announce]
http_interface = "dsp-http"
l4_interface = "dsp-l4"

[access_log]
path = "/var/log/dispatcher/access.log"
format = "json"
buffer = 65536
"#;

static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Runs `dispatcher check` on `text`: (exit code, stdout, stderr).
fn check(text: &str) -> (i32, String, String) {
    check_with(text, |_| {})
}

/// As `check`; `setup` first writes what the file refers to into its folder.
fn check_with(text: &str, setup: impl FnOnce(&std::path::Path)) -> (i32, String, String) {
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("dispatcher-check-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    setup(&dir);
    let file = dir.join("d.toml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(dispatcher_bin()).arg("check").arg(&file).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The 1-based line of the first occurrence of `needle` in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text.find(needle).unwrap_or_else(|| panic!("`{needle}` not in the file"));
    text[..at].matches('\n').count() + 1
}

/// Replaces the `nth` (0-based) occurrence of `from`: the new text and the line where
/// the replacement starts.
fn replace_nth(text: &str, from: &str, to: &str, nth: usize) -> (String, usize) {
    let (at, _) = text.match_indices(from).nth(nth).unwrap_or_else(|| panic!("`{from}` #{nth} not in the file"));
    (format!("{}{to}{}", &text[..at], &text[at + from.len()..]), text[..at].matches('\n').count() + 1)
}

#[test]
fn the_full_example_is_valid() {
    let (code, out, err) = check(FULL);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (2 VIPs, 2 backends)"), "{out}");
    // Plaintext to etcd passes only when said, and check says what it means.
    assert!(err.contains("warning: [cluster]: INSECURE: plaintext, no authentication"), "{err}");
}

/// `[cluster]` over TLS: check reads the CA, the client certificate and the password file
/// as a session does, and refuses what a session could not use.
#[test]
fn the_store_credentials_are_checked() {
    let dir = std::env::temp_dir().join(format!("dsp-check-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pki = dispatcher_testbed::tls::Pki::new(&dir);
    pki.leaf("ca", "client", "dispatcher", &["dispatcher"], 30);
    let pw = dir.join("pw");
    std::fs::write(&pw, "secret\n").unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let tls = |extra: &str| {
        FULL.replace(
            "endpoints = [\"http://10.0.0.21:2379\"]\ninsecure_plaintext = true",
            &format!(
                "endpoints = [\"https://10.0.0.21:2379\"]\nca_file = \"{}\"\n{extra}",
                pki.path("ca.pem").display()
            ),
        )
    };
    let creds = format!(
        "cert = \"{}\"\nkey = \"{}\"\nusername = \"dispatcher\"\npassword_file = \"{}\"",
        pki.path("client.pem").display(),
        pki.path("client.key").display(),
        pw.display()
    );
    let (code, out, err) = check(&tls(&creds));
    assert_eq!(code, 0, "{out}{err}");
    assert!(!err.contains("warning: [cluster]"), "{err}");
    // TLS without credentials: valid, with a warning.
    let (code, _, err) = check(&tls(""));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning: [cluster]: TLS without credentials"), "{err}");
    // A password file every user may read, a key that is not a key, a missing CA.
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, _, err) = check(&tls(&creds));
    assert_eq!(code, 1);
    assert!(err.contains("readable by every user"), "{err}");
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let bad_key = creds.replace("client.key", "client.pem");
    let (code, _, err) = check(&tls(&bad_key));
    assert_eq!(code, 1, "{err}");
    let (code, _, err) = check(&tls(&creds).replace("ca.pem", "nope.pem"));
    assert_eq!(code, 1);
    assert!(err.contains("nope.pem"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each case: (text to replace, its occurrence, replacement, the expected message after
/// `d.toml:LINE: `). LINE is where the replacement lands unless the message points at a
/// different place (then the case gives the text whose line is expected: an L4 VIP's
/// requirement on a backend points at that backend's table).
#[test]
fn every_validation_message_names_line_and_field() {
    type Case = (&'static str, usize, &'static str, &'static str, Option<&'static str>);
    let cases: &[Case] = &[
        // [dispatcher]
        ("interface = \"eth0\"", 0, "interface = \"a-very-long-ifname\"", "dispatcher.interface: must be an interface name of 1 to 15 bytes", None),
        ("instance = \"t\"", 0, "instance = \"t/1\"", "dispatcher.instance: use letters, digits, '-' and '_' only", None),
        ("xdp_mode = \"auto\"", 0, "xdp_mode = \"fast\"", "dispatcher.xdp_mode: `fast` is not one of auto, native, generic", None),
        ("flow_table_size = 65536", 0, "flow_table_size = 100", "dispatcher.flow_table_size: must be at least 1024", None),
        ("affinity_table_size = 65536", 0, "affinity_table_size = 1", "dispatcher.affinity_table_size: must be at least 1024", None),
        ("log_level = \"info,dispatcher::http=debug\"", 0, "log_level = \"info,dispatcher=loud\"", "dispatcher.log_level: `info,dispatcher=loud` is not a log filter (a level such as info, or info,dispatcher::http=debug)", None),
        ("admin_socket = \"/run/dispatcher/t.sock\"", 0, "admin_socket = \"t.sock\"", "dispatcher.admin_socket: must be an absolute path", None),
        ("admin_address = \"127.0.0.1:9901\"", 0, "admin_address = \"localhost\"", "dispatcher.admin_address: `localhost` is not an address:port such as 127.0.0.1:9901", None),
        // Values `run` cannot use (security issue 26): map sizes the kernel refuses or
        // that take gigabytes, names and paths nothing can have.
        ("flow_table_size = 65536", 0, "flow_table_size = 4294967295", "dispatcher.flow_table_size: must be at most 16777216", None),
        ("affinity_table_size = 65536", 0, "affinity_table_size = 16777217", "dispatcher.affinity_table_size: must be at most 16777216", None),
        ("interface = \"eth0\"", 0, "interface = \"../eth0\"", "dispatcher.interface: is not an interface name (no '/', spaces, . or ..)", None),
        ("instance = \"t\"", 0, "instance = \"tttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt\"", "dispatcher.instance: must be at most 64 characters", None),
        ("bpffs = \"/sys/fs/bpf\"", 0, "bpffs = \"/etc\"", "dispatcher.bpffs: /etc is not a bpffs and not empty: the agent mounts a bpffs only on an empty directory", None),
        ("bpffs = \"/sys/fs/bpf\"", 0, "bpffs = \"sys/fs/bpf\"", "dispatcher.bpffs: must be an absolute path", None),
        ("bpffs = \"/sys/fs/bpf\"", 0, "bpffs = \"/etc/hostname\"", "dispatcher.bpffs: exists and is not a directory", None),
        ("admin_socket = \"/run/dispatcher/t.sock\"", 0, "admin_socket = \"/etc/hostname\"", "dispatcher.admin_socket: exists and is not a socket", None),
        ("admin_socket = \"/run/dispatcher/t.sock\"", 0, "admin_socket = \"/run/dispatcher/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.sock\"", "dispatcher.admin_socket: must be at most 107 bytes (a Unix socket address)", None),
        ("admin_address = \"127.0.0.1:9901\"", 0, "admin_address = \"127.0.0.1:0\"", "dispatcher.admin_address: the port must be 1..=65535", None),
        ("admin_address = \"127.0.0.1:9901\"", 0, "admin_address = \"255.255.255.255:9901\"", "dispatcher.admin_address: must be an address of this host", None),
        ("mac = \"02:00:00:00:00:11\"", 0, "mac = \"ff:ff:ff:ff:ff:ff\"", "backend[0].mac: is a group (multicast or broadcast) address, not one station's", None),
        ("mac = \"02:00:00:00:00:11\"", 0, "mac = \"01:00:5e:00:00:01\"", "backend[0].mac: is a group (multicast or broadcast) address, not one station's", None),
        ("mac = \"02:00:00:00:00:12\"", 0, "mac = \"00:00:00:00:00:00\"", "backend[1].mac: 00:00:00:00:00:00 is no station's address", None),
        ("address = \"10.0.0.12\"", 0, "address = \"0.0.0.0\"", "backend[1].address: 0.0.0.0 is the unspecified address: name one host's address", None),
        ("address = \"10.0.0.12\"", 0, "address = \"255.255.255.255\"", "backend[1].address: 255.255.255.255 is the broadcast address", None),
        ("address = \"10.0.0.12\"", 0, "address = \"239.1.2.3\"", "backend[1].address: 239.1.2.3 is a multicast address (224.0.0.0/4)", None),
        ("address6 = \"fd00::11\"", 0, "address6 = \"::\"", "backend[0].address6: :: is the unspecified address", None),
        ("address6 = \"fd00::11\"", 0, "address6 = \"ff02::1\"", "backend[0].address6: ff02::1 is a multicast address (ff00::/8)", None),
        ("address = \"10.0.100.1\"", 0, "address = \"255.255.255.255\"", "vip[0].address: 255.255.255.255 is the broadcast address", None),
        ("address = \"10.0.100.2\"", 0, "address = \"0.0.0.0\"", "vip[1].address: 0.0.0.0 is the unspecified address", None),
        ("address = \"10.0.100.2\"", 0, "address = \"::\"", "vip[1].address: :: is the unspecified address", None),
        ("address = \"10.0.100.2\"", 0, "address = \"ff05::2\"", "vip[1].address: ff05::2 is a multicast address (ff00::/8)", None),
        ("encap_source = \"10.0.0.1\"", 0, "encap_source = \"0.0.0.0\"", "vip[0].encap_source: 0.0.0.0 is the unspecified address", None),
        ("header_timeout = \"10s\"", 0, "header_timeout = \"1ns\"", "http.header_timeout: must be at least 100ms", None),
        ("header_timeout = \"10s\"", 0, "header_timeout = \"10s\"\nclient_idle_timeout = \"99ms\"", "http.client_idle_timeout: must be at least 100ms", Some("client_idle_timeout")),
        ("header_timeout = \"10s\"", 0, "header_timeout = \"10s\"\nconnect_timeout = \"1us\"", "http.connect_timeout: must be at least 10ms", Some("connect_timeout")),
        ("header_timeout = \"10s\"", 0, "header_timeout = \"10s\"\nserver_timeout = \"1ms\"", "http.server_timeout: must be at least 100ms", Some("server_timeout")),
        ("header_timeout = \"10s\"", 0, "header_timeout = \"10s\"\npool_idle_timeout = \"1ms\"", "http.pool_idle_timeout: must be at least 100ms", Some("pool_idle_timeout")),
        ("header_timeout = \"10s\"", 0, "header_timeout = \"10s\"\ndrain_timeout = \"1ns\"", "http.drain_timeout: must be at least 100ms", Some("drain_timeout")),
        ("hold_time = \"2s\"", 0, "hold_time = \"1ms\"", "http.hold_time: must be at least 10ms", None),
        ("client_timeout = \"30s\"", 0, "client_timeout = \"1ns\"", "http.client_timeout: must be at least 100ms", None),
        ("body_timeout = \"60s\"", 0, "body_timeout = \"1ms\"", "http.body_timeout: must be at least 100ms", None),
        ("queue_timeout = \"5s\"", 0, "queue_timeout = \"1ns\"", "http.queue_timeout: must be at least 10ms", None),
        ("tunnel_timeout = \"1h\"", 0, "tunnel_timeout = \"1ms\"", "http.tunnel_timeout: must be at least 100ms", None),
        ("learn_wait = \"250ms\"", 0, "learn_wait = \"1ns\"", "cluster.learn_wait: must be at least 1ms", None),
        ("path = \"/var/log/dispatcher/access.log\"", 0, "path = \"/etc/passwd\"", "access_log.path: is under /etc, a system directory (refused: /etc, /usr, /bin, /sbin, /boot, /proc, /sys, /dev, /lib*); write logs under /var/log", None),
        ("path = \"/var/log/dispatcher/access.log\"", 0, "path = \"/lib64/ld-linux-x86-64.so.2\"", "access_log.path: is under /lib64, a system directory", None),
        ("path = \"/var/log/dispatcher/access.log\"", 0, "path = \"/dev/sda\"", "access_log.path: is under /dev, a system directory", None),
        ("path = \"/var/log/dispatcher/access.log\"", 0, "path = \"/var/log/../../etc/shadow\"", "access_log.path: must not contain `.` or `..` components", None),
        ("path = \"/var/log/dispatcher/access.log\"", 0, "path = \"/tmp\"", "access_log.path: exists and is not a regular file", None),
        // [[backend]]
        ("name = \"b\"", 0, "name = \"\"", "backend[1].name: must be 1 to 64 characters", None),
        ("name = \"b\"", 0, "name = \"b\\\"x\"", "backend[1].name: `b\\\"x`: use letters, digits, '.', '_' and '-' only", None),
        ("name = \"web\"", 0, "name = \"we b\"", "vip[1].name: `we b`: use letters, digits, '.', '_' and '-' only", None),
        ("name = \"b\"", 0, "name = \"a\"", "backend[1].name: `a` is defined twice", None),
        ("address = \"10.0.0.12\"", 0, "address = \"10.0.0.300\"", "backend[1].address: `10.0.0.300` is not an IPv4 address", None),
        ("address6 = \"fd00::11\"", 0, "address6 = \"fd00::g\"", "backend[0].address6: `fd00::g` is not an IPv6 address", None),
        ("mac = \"02:00:00:00:00:11\"", 0, "mac = \"02:00:00:00:11\"", "backend[0].mac: `02:00:00:00:11` is not a MAC address (expected 6 hex pairs like 02:00:00:00:00:01)", None),
        ("mac = \"02:00:00:00:00:11\"", 0, "mac = \"02:00:00:00:00:zz\"", "backend[0].mac: `02:00:00:00:00:zz` is not a MAC address", None),
        ("weight = 100", 0, "weight = 0", "backend[0].weight: must be 1..=10000 (drain a backend instead of weight 0)", None),
        ("replica = \"b\"", 0, "replica = \"c\"", "backend[0].replica: names no backend: `c`", None),
        ("replica = \"b\"", 0, "replica = \"a\"", "backend[0].replica: a backend cannot be its own replica", None),
        ("clone_ids = [\"cloneA\"]", 0, "clone_ids = [\"clone:A\"]", "backend[0].clone_ids: `clone:A`: 1 to 64 token characters (no ':', spaces, quotes or separators)", None),
        ("clone_ids = [\"cloneA\"]", 0, "clone_ids = [\"clone A\"]", "backend[0].clone_ids: `clone A`: 1 to 64 token characters (no ':', spaces, quotes or separators)", None),
        ("clone_ids = [\"cloneB\"]", 0, "clone_ids = [\"cloneA\"]", "backend[1].clone_ids: clone ID `cloneA` is already a clone ID or logical name of backend `a`", None),
        ("clone_ids = [\"cloneB\"]", 0, "clone_ids = [\"cloneB\"]\nlogical_names = [\"cloneA\"]", "backend[1].logical_names: logical name `cloneA` is already a clone ID or logical name of backend `a`", Some("logical_names")),
        ("clone_ids = [\"cloneB\"]", 0, "clone_ids = [\"cloneB\"]\nlogical_names = [\"sip1.1153242645968.4_2_2\"]", "backend[1].logical_names: `sip1.1153242645968.4_2_2` looks like a whole session ID", Some("logical_names")),
        ("maxconn = 100", 0, "maxconn = 0", "backend[0].maxconn: must be 1..=1000000 (requests in flight at once)", None),
        ("maxqueue = 50", 0, "maxqueue = 2000000", "backend[0].maxqueue: must be 0..=1000000", None),
        ("slow_start = \"30s\"", 0, "slow_start = \"10ms\"", "backend[0].slow_start: must be at least 100ms", None),
        ("slow_start = \"1m\"", 0, "slow_start = \"soon\"", "vip[1].slow_start: `soon` is not a duration", None),
        ("maxconn = 100\n", 0, "", "backend[0].maxqueue: applies with maxconn only (no limit, no queue)", Some("maxqueue = 50")),
        ("mode = \"http\"", 0, "protocol = \"tcp\"\nmode = \"sip\"", "vip[1].protocol: SIP over UDP is protocol udp (for SIP over TCP or TLS, set transport", None),
        ("mode = \"http\"", 0, "transport = \"tls\"\nmode = \"sip\"", "vip[1].tls: transport = \"tls\" needs [vip.tls]", None),
        ("mode = \"http\"", 0, "transport = \"sctp\"\nmode = \"sip\"", "vip[1].transport: `sctp` is not one of udp, tcp, tls", None),
        ("mode = \"http\"", 0, "transport = \"tcp\"\nmode = \"http\"", "vip[1].transport: applies to SIP VIPs only", None),
        ("mode = \"http\"", 0, "protocol = \"udp\"\nmode = \"sip\"\ntransport = \"tcp\"", "vip[1].protocol: SIP over TCP or TLS (transport) is protocol tcp", None),
        ("mac = \"02:00:00:00:00:12\"\n", 0, "", "backend[1].mac: required: backend `b` serves L4 VIP `l4` (XDP forwards to the backend's MAC)", Some("[[backend]]\nname = \"b\"")),
        // [[vip]]
        ("name = \"web\"", 0, "name = \"l4\"", "vip[1].name: `l4` is defined twice", None),
        ("address = \"10.0.100.1\"", 0, "address = \"10.0.100\"", "vip[0].address: `10.0.100` is not an IP address", None),
        ("port = 80\n", 0, "port = 0\n", "vip[0].port: must be 1..=65535", None),
        ("protocol = \"tcp\"", 0, "protocol = \"sctp\"", "vip[0].protocol: `sctp` is not one of tcp, udp", None),
        ("address = \"10.0.100.2\"\nport = 8080", 0, "address = \"10.0.100.1\"\nport = 80", "vip[1].port: VIP `l4` (line 34) has the same address, port and protocol (10.0.100.1 port 80 tcp)", Some("port = 80\nmode = \"http\"")),
        ("mode = \"l4\"", 0, "mode = \"l7\"", "vip[0].mode: `l7` is not one of l4, http", None),
        ("mode = \"http\"", 0, "mode = \"http\"\nprotocol = \"udp\"", "vip[1].mode: http needs protocol tcp", None),
        ("forwarding = \"ipip\"", 0, "forwarding = \"gre\"", "vip[0].forwarding: `gre` is not one of mac, ipip", None),
        ("encap_source = \"10.0.0.1\"", 0, "encap_source = \"10.0.0.1.1\"", "vip[0].encap_source: `10.0.0.1.1` is not an IP address", None),
        ("encap_source = \"10.0.0.1\"", 0, "encap_source = \"fd00::1\"", "vip[0].encap_source: must be of the VIP's address family", None),
        ("encap_source = \"10.0.0.1\"\n", 0, "", "vip[0].encap_source: required with forwarding = \"ipip\"", Some("forwarding = \"ipip\"")),
        ("backends = [\"a\", \"b\"]", 0, "backends = [\"a\", \"c\"]", "vip[0].backends: names no backend: `c`", None),
        ("backends = [\"a\", \"b\"]", 0, "backends = [\"a\", \"a\"]", "vip[0].backends: `a` listed twice", None),
        ("backends = [\"a\", \"b\"]", 0, "backends = []", "vip[0].backends: a VIP needs at least one backend (with none, an L4 VIP drops all its traffic and an HTTP VIP answers only 503)", None),
        ("max_connections = 1000", 0, "max_connections = 0", "vip[1].max_connections: must be 1..=10000000", None),
        ("address = \"10.0.100.1\"\nport = 80\nprotocol = \"tcp\"\nmode = \"l4\"\nforwarding = \"ipip\"\nencap_source = \"10.0.0.1\"", 0,
         "address = \"fd00::100:1\"\nport = 80\nprotocol = \"tcp\"\nmode = \"l4\"\nforwarding = \"ipip\"\nencap_source = \"fd00::1\"",
         "backend[1].address6: required: backend `b` serves IPv6 IPIP VIP `l4`", Some("[[backend]]\nname = \"b\"")),
        ("ring_size = 251", 0, "ring_size = 250", "vip[0].ring_size: 250 must be a prime no larger than 65537", None),
        ("ring_size = 251", 0, "ring_size = 11", "vip[0].ring_size: 11 is too small for 2 backends (want at least 10 slots each)", None),
        ("sticky_time = \"30s\"", 0, "sticky_time = \"30 parsecs\"", "vip[0].sticky_time: `30 parsecs` is not a duration (e.g. \"2s\", \"500ms\", \"1m 30s\"): unknown time unit \"parsecs\"", None),
        ("sticky_time = \"30s\"", 0, "sticky_time = \"500ms\"", "vip[0].sticky_time: must be at least 1s", None),
        ("sticky_time = \"30s\"", 0, "sticky_time = \"s\"", "vip[0].sticky_time: `s` is not a duration (e.g. \"2s\", \"500ms\", \"1m 30s\"): expected number", None),
        ("balance = \"round_robin\"", 0, "balance = \"fastest\"", "vip[0].balance: `fastest` is not one of round_robin, least_outstanding, random", None),
        ("backend_port = 9080", 0, "backend_port = 0", "vip[1].backend_port: must be 1..=65535", None),
        ("insert_cookie = \"SRV\"", 0, "insert_cookie = \"S R\"", "vip[1].insert_cookie: `S R` is not a cookie name (1 to 64 token characters)", None),
        ("insert_cookie = \"SRV\"", 0, "insert_cookie = \"JSESSIONID\"", "vip[1].insert_cookie: `JSESSIONID` is the session cookie (http.cookie_name): name the dispatcher's own", None),
        ("session_format = \"websphere\"", 0, "session_format = \"tomcat\"", "vip[1].session_format: `tomcat` is not one of websphere, jvmroute", None),
        // [[partition]]
        ("id = \"123\"", 0, "id = \"12a\"", "partition[0].id: `12a` is not a partition ID (a decimal number)", None),
        ("[health]", 0, "[[partition]]\nid = \"123\"\nprimary = \"b\"\n\n[health]", "partition[1].id: `123` is defined twice", Some("id = \"123\"\nprimary = \"b\"")),
        ("primary = \"a\"", 0, "primary = \"c\"", "partition[0].primary: names no backend: `c`", None),
        ("replica = \"b\"", 1, "replica = \"a\"", "partition[0].replica: the replica must differ from the primary", None),
        // [health]
        ("kind = \"http\"", 0, "kind = \"icmp\"", "health.kind: `icmp` is not one of auto, http, tcp", None),
        ("path = \"/health\"", 0, "path = \"health\"", "health.path: must start with / and contain no spaces, control bytes or '#'", None),
        ("path = \"/health\"", 0, "path = \"/health#x\"", "health.path: must start with / and contain no spaces, control bytes or '#'", None),
        ("expect_status = 200", 0, "expect_status = 700", "health.expect_status: must be an HTTP status, 100..=599", None),
        ("port = 9080\ninterval", 0, "port = 0\ninterval", "health.port: must be 1..=65535", None),
        ("interval = \"1s\"", 0, "interval = \"5ms\"", "health.interval: must be at least 10ms", None),
        ("timeout = \"500ms\"", 0, "timeout = \"5 parsecs\"", "health.timeout: `5 parsecs` is not a duration", None),
        ("rise = 2", 0, "rise = 0", "health.rise: must be 1..=100", None),
        ("fall = 3", 0, "fall = 101", "health.fall: must be 1..=100", None),
        ("suspect_on_status = [503]", 0, "suspect_on_status = [503, 404]", "health.suspect_on_status: only 5xx statuses can mark a backend suspect", None),
        // [http]
        ("workers = 1", 0, "workers = 0", "http.workers: must be 1..=256", None),
        ("cookie_name = \"JSESSIONID\"", 0, "cookie_name = \"J SESSION\"", "http.cookie_name: `J SESSION` is not a cookie or parameter name", None),
        ("url_parameter = \"jsessionid\"", 0, "url_parameter = \"\"", "http.url_parameter: `` is not a cookie or parameter name", None),
        ("header_timeout = \"10s\"", 0, "header_timeout = \"0s\"", "http.header_timeout: must be more than zero", None),
        ("hold_time = \"2s\"", 0, "hold_time = \"99999999999999999999s\"", "http.hold_time: `99999999999999999999s` is not a duration (e.g. \"2s\", \"500ms\", \"1m 30s\"): number is too large", None),
        ("hold_time = \"2s\"", 0, "hold_time = \"18446744073709551615s\"", "http.hold_time: must be at most 1 day (86400s)", None),
        ("client_timeout = \"30s\"", 0, "client_timeout = \"25h\"", "http.client_timeout: must be at most 1 day (86400s)", None),
        ("max_client_connections = 5000", 0, "max_client_connections = 0", "http.max_client_connections: must be 1..=10000000", None),
        ("max_connections_per_source = 500", 0, "max_connections_per_source = 6000", "http.max_connections_per_source: 6000 is more than max_client_connections (5000): one source could take every slot", None),
        ("max_connections_per_source = 500", 0, "max_connections_per_source = 20000000", "http.max_connections_per_source: must be 0..=10000000", None),
        ("max_connection_rate_per_source = 200", 0, "max_connection_rate_per_source = 2000000", "http.max_connection_rate_per_source: must be 0..=1000000", None),
        // An HTTP VIP whose backend is itself: every request would come back (a loop).
        ("address = \"10.0.100.2\"\nport = 8080", 0, "address = \"10.0.0.11\"\nport = 9080", "vip[1].backends: backend `a` (10.0.0.11:9080) is HTTP VIP `web` (10.0.0.11:9080): its requests would come back to this dispatcher (a loop)", Some("[[backend]]\nname = \"a\"")),
        ("body_min_rate = 1024", 0, "body_min_rate = 0", "http.body_min_rate: must be 1..=1073741824", None),
        ("max_held = 100", 0, "max_held = 2000000", "http.max_held: must be 0..=1000000", None),
        ("retries = 1", 0, "retries = 11", "http.retries: must be 0..=10", None),
        ("retry_budget_percent = 20", 0, "retry_budget_percent = 101", "http.retry_budget_percent: must be 0..=100", None),
        // [cluster] (security, peers, steering) and [announce]
        ("insecure_plaintext = true\n", 0, "", "cluster.endpoints: http:// is plaintext without authentication: anyone who can reach etcd could join this cluster and take its traffic", Some("endpoints = [\"http:")),
        ("endpoints = [\"http://10.0.0.21:2379\"]", 0, "endpoints = [\"http://10.0.0.21:2379\", \"https://10.0.0.22:2379\"]", "cluster.endpoints: all https:// or all http://, not both", None),
        ("endpoints = [\"http://10.0.0.21:2379\"]", 0, "endpoints = [\"etcd://10.0.0.21:2379\"]", "cluster.endpoints: `etcd://10.0.0.21:2379`: write it as https://host:port", None),
        ("insecure_plaintext = true", 0, "insecure_plaintext = true\nusername = \"d\"\npassword_file = \"/etc/pw\"", "cluster.username: needs https:// endpoints (credentials never go over plaintext)", Some("username")),
        ("endpoints = [\"http://10.0.0.21:2379\"]", 0, "endpoints = [\"https://10.0.0.21:2379\"]", "cluster.insecure_plaintext: the endpoints are https://: remove it", Some("insecure_plaintext")),
        ("endpoints = [\"http://10.0.0.21:2379\"]\ninsecure_plaintext = true", 0, "endpoints = [\"https://10.0.0.21:2379\"]\nusername = \"d\"", "cluster.password_file: an etcd user needs its password file", Some("username")),
        ("endpoints = [\"http://10.0.0.21:2379\"]\ninsecure_plaintext = true", 0, "endpoints = [\"https://10.0.0.21:2379\"]\ncert = \"/etc/c.pem\"", "cluster.key: a client certificate needs its key", Some("cert =")),
        ("peers = [\"lb1\", \"lb2@02:00:00:00:00:02\"]\n", 0, "", "cluster.peers: list every dispatcher of this cluster by name (this one too)", Some("name = \"lb1\"")),
        ("peers = [\"lb1\", \"lb2@02:00:00:00:00:02\"]", 0, "peers = [\"lb2\", \"lb3\"]", "cluster.peers: does not list this dispatcher (`lb1`, cluster.name)", None),
        ("peers = [\"lb1\", \"lb2@02:00:00:00:00:02\"]", 0, "peers = [\"lb1\", \"lb1\"]", "cluster.peers: `lb1` is listed twice", None),
        ("peers = [\"lb1\", \"lb2@02:00:00:00:00:02\"]", 0, "peers = [\"lb1\", \"l b\"]", "cluster.peers: ", None),
        ("peers = [\"lb1\", \"lb2@02:00:00:00:00:02\"]", 0, "peers = [\"lb1\", \"lb2@ff:ff:ff:ff:ff:ff\"]", "cluster.peers: `lb2@ff:ff:ff:ff:ff:ff`: write name or name@MAC with a unicast, non-zero MAC", None),
        ("second_chance = \"300s\"", 0, "second_chance = \"10ms\"", "cluster.second_chance: must be at least 1s", None),
        ("learn_wait = \"250ms\"", 0, "learn_wait = \"10s\"", "cluster.learn_wait: must be at most 5s", None),
        ("heartbeat_interval = \"100ms\"", 0, "heartbeat_interval = \"5ms\"", "cluster.heartbeat_interval: must be at least 10ms", None),
        ("heartbeat_interval = \"100ms\"", 0, "heartbeat_interval = \"2s\"", "cluster.heartbeat_interval: must be at most 1s (a dead peer is noticed after heartbeat_misses of them)", None),
        ("heartbeat_misses = 3", 0, "heartbeat_misses = 0", "cluster.heartbeat_misses: must be from 1 to 50", None),
        ("heartbeat_interval = \"100ms\"\nheartbeat_misses = 3", 0, "heartbeat_interval = \"1s\"\nheartbeat_misses = 20", "cluster.heartbeat_interval: heartbeat_interval x heartbeat_misses must be at most 10s", None),
        ("heartbeat_port = 7405", 0, "heartbeat_port = 70000", "cluster.heartbeat_port: must be a UDP port from 1 to 65535", None),
        ("steering = true", 0, "steering = \"yes\"", "cluster.steering: expected true or false, got the text \"yes\" (write true without quotes)", None),
        ("http_interface = \"dsp-http\"", 0, "http_interface = \"a-very-long-ifname\"", "announce.http_interface: an interface name: 1 to 15 of [A-Za-z0-9._-]", None),
        ("l4_interface = \"dsp-l4\"", 0, "l4_interface = \"fifteen-chars-x\"", "announce.l4_interface: an interface name: 1 to 14 of [A-Za-z0-9._-]", None),
        ("l4_interface = \"dsp-l4\"", 0, "l4_interface = \"dsp-http\"", "announce.l4_interface: must differ from announce.http_interface", None),
        // [access_log]
        ("path = \"/var/log/dispatcher/access.log\"", 0, "path = \"access.log\"", "access_log.path: must be an absolute path, or \"-\" for standard output", None),
        ("format = \"json\"", 0, "format = \"clf\"", "access_log.format: `clf` is not one of json, haproxy", None),
        ("buffer = 65536", 0, "buffer = 1", "access_log.buffer: must be 16..=4194304 (lines waiting for the writer)", None),
        ("buffer = 65536", 0, "buffer = 65536\nsyslog = \"/dev/log\"\nmax_message = 100", "access_log.max_message: must be 480..=65000 (bytes of a syslog message, its header included)", Some("max_message")),
        ("buffer = 65536", 0, "buffer = 65536\nsyslog = \"/dev/log\"\nfacility = \"local9\"", "access_log.facility: `local9` is not one of kern, user, mail, daemon, auth, syslog, lpr, news, uucp, cron, authpriv, ftp, local0,", Some("facility")),
        ("buffer = 65536", 0, "buffer = 65536\nsyslog = \"loghost:514\"", "access_log.syslog: `loghost:514` is neither a socket path (`/dev/log`) nor a UDP address:port (`127.0.0.1:514`, `[::1]:514`)", Some("syslog")),
        ("buffer = 65536", 0, "buffer = 65536\nsyslog = \"127.0.0.1:0\"", "access_log.syslog: `127.0.0.1:0`: needs a port and a unicast address", Some("syslog")),
        ("buffer = 65536", 0, "buffer = 65536\nsyslog = \"/run/../dev/log\"", "access_log.syslog: must not contain `.` or `..` components", Some("syslog")),
        ("buffer = 65536", 0, "buffer = 65536\nfacility = \"local0\"", "access_log.facility: applies to `syslog` only, which is not set", Some("facility")),
        ("buffer = 65536", 0, "buffer = 65536\nsyslog = \"/dev/log\"\nsyslog_format = \"bsd\"", "access_log.syslog_format: `bsd` is not one of rfc5424, rfc3164", Some("syslog_format")),
        ("buffer = 65536", 0, "buffer = 65536\nsyslog_format = \"rfc3164\"", "access_log.syslog_format: applies to `syslog` only, which is not set", Some("syslog_format")),
        ("buffer = 65536", 0, "buffer = 65536\ntag = \"my app\"", "access_log.tag: must be 1 to 48 printable ASCII characters without spaces, `[`, `]` or `:` (syslog's APP-NAME)", Some("tag")),
        ("path = \"/var/log/dispatcher/access.log\"\n", 0, "", "access_log.path: required: a file (\"-\" for standard output), unless `syslog` is set", Some("[access_log]")),
        // The file's shape (from the TOML parser).
        // Each in words, with the section and the field, and the fix when it is obvious.
        ("weight = 100", 0, "wieght = 100", "backend[0].wieght: unknown field; did you mean `weight`?", None),
        ("backend_port = 9080", 0, "backendport = 9080", "vip[1].backendport: unknown field; did you mean `backend_port`?", None),
        ("max_connections = 1000", 0, "max_conections = 1000", "vip[1].max_conections: unknown field; did you mean `max_connections`?", None),
        ("weight = 100", 0, "colour = 1", "backend[0].colour: unknown field (the fields of [[backend]] are name, address, address6, mac, weight, port,", None),
        ("[[vip]]", 0, "[[vips]]", "[[vips]]: unknown section; did you mean [[vip]]?", None),
        ("[health]", 0, "[heath]", "[heath]: unknown section; did you mean [health]?", None),
        ("interface = \"eth0\"\n", 0, "", "dispatcher.interface: required, and missing from this [dispatcher]", Some("[dispatcher]")),
        ("name = \"l4\"\n", 0, "", "vip[0].name: required, and missing from this [[vip]]", Some("[[vip]]\naddress")),
        ("port = 8080", 0, "port = \"8080\"", "vip[1].port: expected a port number 1-65535, got the text \"8080\" (write 8080 without quotes)", None),
        ("port = 80\n", 0, "port = 70000\n", "vip[0].port: expected a port number 1-65535, got 70000", None),
        ("weight = 100", 0, "weight = -1", "backend[0].weight: expected a whole number 0-4294967295, got -1 (no negative numbers)", None),
        ("rise = 2", 0, "rise = 2.5", "health.rise: expected a whole number 0-4294967295, got 2.5", None),
        ("expect_status = 200", 0, "expect_status = \"200\"", "health.expect_status: expected a whole number 0-65535, got the text \"200\" (write 200 without quotes)", None),
        ("clone_ids = [\"cloneA\"]", 0, "clone_ids = \"cloneA\"", "backend[0].clone_ids: expected a list [..], got the text \"cloneA\" (write [\"cloneA\"])", None),
        ("sticky_time = \"30s\"", 0, "sticky_time = 30", "vip[0].sticky_time: expected a duration in quotes (such as \"30s\"), got 30 (write \"30s\" for seconds)", None),
        ("name = \"l4\"", 0, "name = 4", "vip[0].name: expected text in quotes, got 4 (write \"4\" in quotes)", None),
        ("suspect_on_status = [503]", 0, "suspect_on_status = [\n  503,\n  \"504\",\n]", "health.suspect_on_status: expected a whole number 0-65535, got the text \"504\" (write 504 without quotes)", Some("\"504\"")),
        ("rise = 2", 0, "rise = 2\nrise = 3", "health.rise: set twice in this [health]: keep one", Some("rise = 3")),
        ("[http]", 0, "[http", "", Some("[http")),
    ];
    let mut failures = Vec::new();
    for &(from, nth, to, want, at) in cases {
        let (text, landed) = replace_nth(FULL, from, to, nth);
        let line = at.map(|needle| line_of(&text, needle)).unwrap_or(landed);
        let (code, out, err) = check(&text);
        let expect = format!("/d.toml:{line}: {want}");
        if code != 1 || !err.lines().any(|l| l.contains(&expect)) || !out.is_empty() {
            failures.push(format!("{from:?} -> {to:?}: want exit 1 and `{expect}`, got exit {code}: {err}{out}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// What clashes names the other party, with its line: a VIP name or address, port and
/// protocol taken twice, a backend name defined twice; a file without `[dispatcher]`.
#[test]
fn a_clash_names_what_it_clashes_with() {
    let (text, line) = replace_nth(FULL, "name = \"web\"", "name = \"l4\"", 0);
    let (code, _, err) = check(&text);
    assert_eq!(code, 1, "{err}");
    let want = format!(
        "d.toml:{line}: vip[1].name: `l4` is defined twice (first at line {})",
        line_of(&text, "name = \"l4\"")
    );
    assert!(err.contains(&want), "want `{want}`: {err}");
    let (text, _) =
        replace_nth(FULL, "address = \"10.0.100.2\"\nport = 8080", "address = \"10.0.100.1\"\nport = 80", 0);
    let (code, _, err) = check(&text);
    assert_eq!(code, 1, "{err}");
    let want = format!(
        "vip[1].port: VIP `l4` (line {}) has the same address, port and protocol (10.0.100.1 port 80 tcp)",
        line_of(&text, "port = 80\n")
    );
    assert!(err.contains(&want), "want `{want}`: {err}");
    let (text, line) = replace_nth(FULL, "name = \"b\"", "name = \"a\"", 0);
    let (code, _, err) = check(&text);
    assert_eq!(code, 1, "{err}");
    let want = format!(
        "d.toml:{line}: backend[1].name: `a` is defined twice (first at line {}, backend[0])",
        line_of(&text, "name = \"a\"")
    );
    assert!(err.contains(&want), "want `{want}`: {err}");
    let (code, _, err) = check(&FULL.replace("[dispatcher]\n", "[dispatchr]\n"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("d.toml:1: [dispatchr]: unknown section; did you mean [dispatcher]?"), "{err}");
    let (code, _, err) = check(&FULL[FULL.find("[[backend]]").unwrap()..]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("d.toml:1: the [dispatcher] section is missing (it is required)"), "{err}");
}

/// One run lists every error, in line order, and nothing is half-applied: the exit
/// code says the file was refused.
#[test]
fn all_errors_of_a_file_are_reported_at_once() {
    let text = FULL
        .replace("xdp_mode = \"auto\"", "xdp_mode = \"fast\"")
        .replace("weight = 100", "weight = 0")
        .replace("ring_size = 251", "ring_size = 250")
        .replace("workers = 1", "workers = 0");
    let (code, out, err) = check(&text);
    assert_eq!(code, 1, "{out}{err}");
    let lines: Vec<&str> = err.lines().collect();
    let want = [
        format!("/d.toml:{}: dispatcher.xdp_mode:", line_of(&text, "xdp_mode")),
        format!("/d.toml:{}: backend[0].weight:", line_of(&text, "weight = 0")),
        format!("/d.toml:{}: vip[0].ring_size:", line_of(&text, "ring_size")),
        format!("/d.toml:{}: http.workers:", line_of(&text, "workers")),
    ];
    assert_eq!(lines.len(), want.len(), "{err}");
    for (l, w) in lines.iter().zip(&want) {
        assert!(l.contains(w.as_str()), "`{l}` should contain `{w}`\n{err}");
    }
}

/// What is on disk at the paths `run` would write or replace: the admin socket's path
/// holding a regular file, an access log that is a symbolic link (to a system file).
#[test]
fn paths_over_files_that_are_not_ours_are_refused() {
    let dir = std::env::temp_dir().join(format!("dispatcher-check-paths-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    struct Gone(std::path::PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _gone = Gone(dir.clone());
    let file = dir.join("precious");
    std::fs::write(&file, "keep me").unwrap();
    let link = dir.join("access.log");
    std::os::unix::fs::symlink("/etc/passwd", &link).unwrap();
    let socket = dir.join("live.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();

    let text = FULL.replace("/run/dispatcher/t.sock", file.to_str().unwrap());
    let (code, _, err) = check(&text);
    assert_eq!(code, 1, "{err}");
    let want = format!(":{}: dispatcher.admin_socket: exists and is not a socket", line_of(&text, "admin_socket"));
    assert!(err.contains(&want), "want `{want}`: {err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");

    let text = FULL.replace("/var/log/dispatcher/access.log", link.to_str().unwrap());
    let (code, _, err) = check(&text);
    assert_eq!(code, 1, "{err}");
    let want = format!(":{}: access_log.path: is a symbolic link: name the file itself", line_of(&text, "access.log"));
    assert!(err.contains(&want), "want `{want}`: {err}");

    // A socket is what `check` cannot judge alone (live or stale): `run` tells them apart.
    let text = FULL.replace("/run/dispatcher/t.sock", socket.to_str().unwrap());
    let (code, _, err) = check(&text);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn a_missing_file_or_one_that_is_not_toml_is_refused() {
    let out = Command::new(dispatcher_bin()).args(["check", "/nonexistent/d.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/d.toml: cannot read"));
    let (code, _, err) = check("this is not toml");
    assert_eq!(code, 1);
    assert!(err.contains("/d.toml:1: "), "{err}");
}

/// The fenced ```toml blocks of a Markdown page, in order.
fn toml_blocks(page: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = page;
    while let Some(at) = rest.find("```toml\n") {
        let start = at + "```toml\n".len();
        let end = start + rest[start..].find("```").expect("a closed toml block");
        blocks.push(&rest[start..end]);
        rest = &rest[end + 3..];
    }
    blocks
}

/// A page of the repository (`README.md`, `docs/...`).
fn page(path: &str) -> String {
    std::fs::read_to_string(format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// Every table of the file, with the fields the parser knows for it (its own list, from
/// its "unknown field" message about a field added to FULL).
fn known_fields() -> Vec<(&'static str, Vec<String>)> {
    let mut tables = Vec::new();
    for (anchor, table) in [
        ("instance = \"t\"", "dispatcher"),
        ("name = \"a\"", "backend"),
        ("name = \"l4\"", "vip"),
        ("id = \"123\"", "partition"),
        ("kind = \"http\"", "health"),
        ("workers = 1", "http"),
        ("max_connections = 1000", "vip.tls"),
        ("max_connections = 1000", "vip.tls.certificate"),
        ("max_connections = 1000", "vip.backend_tls"),
        ("learn_wait = \"250ms\"", "cluster"),
        ("l4_interface = \"dsp-l4\"", "announce"),
        ("format = \"json\"", "access_log"),
        ("buffer = 65536", "farm"),
        ("buffer = 65536", "route"),
    ] {
        // A sub-table of the `web` VIP holding the unknown field.
        let anchor_text = match table {
            "vip.tls" => format!("{anchor}\n[vip.tls]"),
            "vip.tls.certificate" => format!("{anchor}\n[vip.tls]\n[[vip.tls.certificate]]\ncert = \"c\"\nkey = \"k\""),
            "vip.backend_tls" => format!("{anchor}\n[vip.backend_tls]"),
            // New tables after the file's last line.
            "farm" => format!("{anchor}\n[[farm]]\nname = \"f\"\nservers = [\"a\"]"),
            "route" => format!("{anchor}\n[[route]]\nhosts = [\"*\"]\nuris = [\"/*\"]\nfarm = \"f\""),
            _ => anchor.to_string(),
        };
        let (code, _, err) = check(&FULL.replacen(anchor, &format!("{anchor_text}\nno_such_field = 1"), 1));
        assert_eq!(code, 1);
        // "unknown field (the fields of [t] are a, b, c)": no close match, so the list.
        let list = err.split(" are ").nth(1).unwrap_or_else(|| panic!("[{table}]: {err}"));
        let list = list.split(')').next().unwrap_or("");
        let fields =
            list.split(',').map(|f| f.trim().trim_matches('`').to_string()).filter(|f| !f.is_empty()).collect();
        tables.push((table, fields));
    }
    tables
}

/// docs/configuration.md's annotated example: it validates, and it shows every field the
/// parser knows, of every table, so the documentation cannot fall behind the code.
#[test]
fn the_configuration_example_validates_and_documents_every_field() {
    let reference = page("docs/configuration.md");
    let example = toml_blocks(&reference)[0];
    // The TLS files it names, made by openssl, relative to the file's folder.
    let (code, out, err) = check_with(example, |dir| {
        let tls = dir.join("tls");
        std::fs::create_dir_all(&tls).unwrap();
        let pki = Pki { dir: tls };
        pki.ca("ca");
        pki.leaf("ca", "shop", "shop.example", &["shop.example"], 90);
        pki.leaf("ca", "client", "dispatcher", &["dispatcher.example"], 90);
        // Its [cluster] credentials: the etcd members' CA, a client certificate, a password.
        let etcd = dir.join("etcd");
        std::fs::create_dir_all(&etcd).unwrap();
        let pki = Pki { dir: etcd.clone() };
        pki.ca("ca");
        pki.leaf("ca", "lb1", "dispatcher", &["lb1.example"], 90);
        std::fs::write(etcd.join("password"), "secret\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(etcd.join("password"), std::fs::Permissions::from_mode(0o600)).unwrap();
        // Its [http] plugin_config: WebSphere's file, here with nothing in it.
        std::fs::write(dir.join("plugin-cfg.xml"), "<Config RefreshInterval=\"60\"/>\n").unwrap();
    });
    assert_eq!(code, 0, "the example of docs/configuration.md must validate:\n{err}");
    assert!(out.contains("ok ("), "{out}");

    // Fields (`key =`) and sub-tables (`[vip.tls]`, `[[vip.tls.certificate]]`).
    let documented: std::collections::HashSet<&str> = example
        .lines()
        .filter_map(|l| {
            let header = l.trim().strip_prefix('[').map(|h| h.trim_start_matches('[').split(']').next().unwrap_or(""));
            match header {
                Some(h) => h.rsplit('.').next(),
                None => l.split_once(" =").map(|(k, _)| k.trim()),
            }
        })
        .filter(|k| !k.is_empty() && !k.starts_with('#'))
        .collect();
    for (table, fields) in known_fields() {
        for field in fields {
            assert!(
                documented.contains(field.as_str()),
                "[{table}] field `{field}` is not in the example of docs/configuration.md"
            );
        }
    }
}

/// Every field that a TOML example of the README or of docs/ sets is one the parser knows
/// for its table: no page shows a field that does not exist (or sits in the wrong table).
#[test]
fn every_documented_field_exists() {
    let known = known_fields();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let mut pages = vec!["README.md".to_string()];
    for e in std::fs::read_dir(format!("{root}/docs")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            pages.push(format!("docs/{name}"));
        }
    }
    let mut unknown = Vec::new();
    let mut seen = 0;
    for name in &pages {
        for block in toml_blocks(&page(name)) {
            let mut table = String::new();
            for line in block.lines() {
                let code = line.split(" #").next().unwrap().trim();
                if code.is_empty() || code.starts_with('#') {
                    continue;
                }
                if code.starts_with('[') {
                    table = code.trim_matches(['[', ']']).trim().to_string();
                    continue;
                }
                let Some((key, _)) = code.split_once('=') else { continue };
                let key = key.trim();
                seen += 1;
                let fields = known.iter().find(|(t, _)| *t == table).map(|(_, f)| f);
                if !fields.is_some_and(|f| f.iter().any(|f| f == key)) {
                    unknown.push(format!("{name}: [{table}] {key}"));
                }
            }
        }
    }
    assert!(seen > 200, "only {seen} fields found in the pages' TOML examples");
    assert!(unknown.is_empty(), "fields the parser does not know:\n{}", unknown.join("\n"));
}

/// The README's minimal configuration passes `dispatcher check` as it stands.
#[test]
fn the_readmes_minimal_configuration_validates() {
    let readme = page("README.md");
    let section = &readme[readme.find("\n## A minimal configuration").expect("a minimal configuration")..];
    let minimal = toml_blocks(section)[0];
    assert!(minimal.contains("mode = \"http\""), "the minimal configuration has an HTTP VIP:\n{minimal}");
    let (code, out, err) = check(minimal);
    assert_eq!(code, 0, "the README's minimal configuration must validate:\n{err}");
    assert!(out.contains("ok (1 VIPs, 2 backends)"), "{out}");
}

/// An HTTPS VIP whose certificate entry is `cert`/`key` (relative to the file).
fn https_file(cert: &str, key: &str) -> String {
    format!(
        "[dispatcher]\ninterface = \"eth0\"\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.11\"\n[[vip]]\nname = \"shop\"\naddress = \"10.0.100.4\"\nport = 443\nmode = \"http\"\n[vip.tls]\n[[vip.tls.certificate]]\ncert = \"{cert}\"\nkey = \"{key}\"\n"
    )
}

#[test]
fn check_loads_the_tls_files() {
    let pki = |dir: &std::path::Path| {
        let pki = Pki { dir: dir.to_path_buf() };
        pki.ca("ca");
        pki.ca("other");
        pki.leaf("ca", "good", "shop.example", &["shop.example"], 90);
        pki.leaf("ca", "soon", "soon.example", &["soon.example"], 10);
        pki.leaf("other", "stranger", "stranger.example", &["stranger.example"], 90);
        // A chain in the wrong order: the CA first, then the leaf.
        let ca = std::fs::read_to_string(dir.join("ca.pem")).unwrap();
        let leaf = std::fs::read_to_string(dir.join("good.pem")).unwrap();
        std::fs::write(dir.join("upside-down.pem"), format!("{ca}{leaf}")).unwrap();
        std::fs::write(dir.join("chain.pem"), format!("{leaf}{ca}")).unwrap();
        std::fs::write(
            dir.join("garbage.pem"),
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(dir.join("empty.pem"), "").unwrap();
    };
    let (code, out, err) = check_with(&https_file("good.pem", "good.key"), pki);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok ("), "{out}");
    let (code, _, err) = check_with(&https_file("chain.pem", "good.key"), pki);
    assert_eq!(code, 0, "a leaf followed by its CA: {err}");
    let (code, _, err) = check_with(&https_file("soon.pem", "soon.key"), pki);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("warning") && (err.contains("expires in 9 days") || err.contains("expires in 10 days")),
        "{err}"
    );
    for (cert, key, says) in [
        ("good.pem", "stranger.key", "does not belong to the certificate"),
        ("upside-down.pem", "good.key", "did not issue certificate"),
        ("garbage.pem", "good.key", "not a PEM certificate chain"),
        ("empty.pem", "good.key", "no CERTIFICATE block"),
        ("missing.pem", "good.key", "missing.pem: no such file"),
        ("good.pem", "missing.key", "missing.key: no such file"),
        ("good.pem", "good.pem", "no usable PEM private key"),
    ] {
        let (code, out, err) = check_with(&https_file(cert, key), pki);
        assert_eq!(code, 1, "{cert} {key}: {out}");
        assert!(err.contains("VIP shop") && err.contains(says), "{cert} {key}: {err}");
    }
    // A missing file: its name, the VIP and the line that names it.
    let text = https_file("missing.pem", "good.key");
    let (code, _, err) = check_with(&text, pki);
    assert_eq!(code, 1);
    let want = format!("d.toml:{}: vip[0].tls.certificate[0].cert: VIP shop: ", line_of(&text, "cert ="));
    assert!(err.contains(&want) && err.contains("/missing.pem: no such file"), "want `{want}`: {err}");
    let text = https_file("good.pem", "missing.key");
    let (_, _, err) = check_with(&text, pki);
    let want = format!("d.toml:{}: vip[0].tls.certificate[0].key: VIP shop: ", line_of(&text, "key ="));
    assert!(err.contains(&want) && err.contains("/missing.key: no such file"), "want `{want}`: {err}");
    // A shape error in a nested table names it.
    let text = https_file("good.pem", "good.key").replace("cert = \"good.pem\"", "cert = 4");
    let (_, _, err) = check(&text);
    assert!(err.contains("vip[0].tls.certificate[0].cert: expected text in quotes, got 4"), "{err}");
    // Shape errors point at their line.
    let text = https_file("good.pem", "good.key").replace("[vip.tls]\n", "[vip.tls]\nmin_version = \"1.1\"\n");
    let (code, _, err) = check(&text);
    assert_eq!(code, 1);
    assert!(err.contains("vip[0].tls.min_version: `1.1` is not one of 1.2, 1.3"), "{err}");
    let text = https_file("good.pem", "good.key").replace("mode = \"http\"\n", "mode = \"l4\"\n");
    let (_, _, err) = check(&text);
    assert!(err.contains("vip[0].tls: applies to HTTP VIPs only"), "{err}");
    let redirect = format!("{}[[vip]]\nname = \"plain\"\naddress = \"10.0.100.4\"\nport = 80\nmode = \"http\"\nredirect_to = \"nowhere\"\n", https_file("good.pem", "good.key"));
    let (_, _, err) = check(&redirect);
    assert!(err.contains("vip[1].redirect_to: names no VIP: `nowhere`"), "{err}");
}

/// Two HTTP VIPs, each the other's backend (or one on a wildcard address with a loopback
/// backend on its port): refused, with the loop named.
#[test]
fn a_vip_that_leads_back_to_a_vip_is_refused() {
    let two = "[dispatcher]\ninterface = \"eth0\"\n[[backend]]\nname = \"x\"\naddress = \"10.0.100.7\"\n[[backend]]\nname = \"y\"\naddress = \"10.0.100.9\"\n[[vip]]\nname = \"a\"\naddress = \"10.0.100.9\"\nport = 80\nmode = \"http\"\nbackends = [\"x\"]\nbackend_port = 81\n[[vip]]\nname = \"b\"\naddress = \"10.0.100.7\"\nport = 81\nmode = \"http\"\nbackends = [\"y\"]\nbackend_port = 80\n";
    let (code, _, err) = check(two);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("vip[0].backends: backend `x` (10.0.100.7:81) is HTTP VIP `b` (10.0.100.7:81)"), "{err}");
    assert!(err.contains("vip[1].backends: backend `y` (10.0.100.9:80) is HTTP VIP `a` (10.0.100.9:80)"), "{err}");
    // Another port of the same address is not a loop.
    let (code, _, err) = check(
        &two.replace("backend_port = 80\n", "backend_port = 8080\n")
            .replace("backend_port = 81\n", "backend_port = 8081\n"),
    );
    assert_eq!(code, 0, "{err}");
    let wildcard = "[dispatcher]\ninterface = \"eth0\"\n[[backend]]\nname = \"me\"\naddress = \"127.0.0.1\"\n[[vip]]\nname = \"any\"\naddress = \"0.0.0.0\"\nport = 8080\nmode = \"http\"\n";
    let (code, _, err) = check(wildcard);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("vip[0].backends: backend `me` (127.0.0.1:8080) is HTTP VIP `any` (0.0.0.0:8080)"), "{err}");
}

/// `redirect_host`: a host[:port] only (nothing that would make the Location another
/// scheme, path or header), on a redirecting VIP only.
#[test]
fn redirect_host_is_a_host_and_port() {
    let pki = |dir: &std::path::Path| {
        let pki = Pki { dir: dir.to_path_buf() };
        pki.ca("ca");
        pki.leaf("ca", "good", "shop.example", &["shop.example"], 90);
    };
    let with = |host: &str| {
        format!(
            "{}[[vip]]\nname = \"plain\"\naddress = \"10.0.100.4\"\nport = 80\nmode = \"http\"\nredirect_to = \"shop\"\nredirect_host = \"{host}\"\n",
            https_file("good.pem", "good.key")
        )
    };
    for good in ["shop.example.com", "shop.example.com:8443", "10.0.0.1", "[fd00::1]:443", "[fd00::1]", "localhost."] {
        let (code, _, err) = check_with(&with(good), pki);
        assert_eq!(code, 0, "{good}: {err}");
    }
    for bad in [
        "https://shop.example.com",
        "shop.example.com/path",
        "evil.example@shop.example.com",
        "shop example",
        "shop.example.com:0",
        "shop.example.com:99999",
        "shop.example.com:",
        "-shop.example",
        "",
        "[fd00::1",
        "shop.example.com\\r\\nSet-Cookie: a=b",
    ] {
        let (code, _, err) = check_with(&with(bad), pki);
        assert_eq!(code, 1, "{bad}");
        let line = line_of(&with(bad), "redirect_host");
        assert!(err.contains(&format!("/d.toml:{line}: vip[1].redirect_host: `")), "{bad}: {err}");
        assert!(err.contains("is not a host[:port]"), "{bad}: {err}");
    }
    // Without redirect_to it means nothing.
    let text = https_file("good.pem", "good.key")
        .replace("mode = \"http\"\n", "mode = \"http\"\nredirect_host = \"a.example\"\n");
    let (code, _, err) = check_with(&text, pki);
    assert_eq!(code, 1);
    assert!(err.contains("vip[0].redirect_host: applies to a redirecting VIP only (with redirect_to)"), "{err}");
}

/// `[http] plugin_config` and `[[route]]`: what cannot take effect or is not used is a
/// warning by name and line (exit 0); a file that does not parse is an error at its line.
#[test]
fn check_warns_about_unused_plugin_settings_and_routes_that_can_never_win() {
    let xml = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../dispatcher/src/routes/testdata/plugin-cfg.xml"))
        .unwrap();
    let text = "[dispatcher]\ninterface = \"eth0\"\n\n[http]\nplugin_config = \"plugin-cfg.xml\"\n\n\
                [[backend]]\nname = \"portalNode_portal1\"\naddress = \"10.0.3.31\"\n\n\
                [[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n\n\
                [[route]]\nhosts = [\"*:8080\"]\nuris = [\"/x/*\"]\nfarm = \"admin_cluster\"\n\n\
                [[route]]\nhosts = [\"*:8080\"]\nuris = [\"/x/*\"]\nfarm = \"shop_cluster\"\n";
    let (code, out, err) = check_with(text, |dir| std::fs::write(dir.join("plugin-cfg.xml"), &xml).unwrap());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (1 VIPs, 8 backends)"), "{out}");
    let second = text.rfind("[[route]]").map(|at| text[..at].matches('\n').count() + 1).unwrap();
    let first = line_of(text, "[[route]]");
    let want = format!("/d.toml:{second}: route[1]: can never win (VIP web): each of its virtual hosts and URIs is matched first by route[0] (");
    assert!(
        err.lines()
            .any(|l| l.starts_with("warning: ") && l.contains(&want) && l.ends_with(&format!("/d.toml:{first})"))),
        "{err}"
    );
    assert!(
        err.contains("/plugin-cfg.xml:20: <ServerCluster> \"shop_cluster\" RetryInterval=\"60\" is not implemented: health checks decide"),
        "{err}"
    );
    // A broken file: refused, at its line.
    let (code, _, err) =
        check_with(text, |dir| std::fs::write(dir.join("plugin-cfg.xml"), "<Config>\n<Route/>\n</Config>\n").unwrap());
    assert_eq!(code, 1);
    assert!(err.contains("/plugin-cfg.xml:2: "), "{err}");
}

/// The fenced block of `lang` at or after `from` in `text`.
fn fenced<'a>(text: &'a str, lang: &str, from: &str) -> &'a str {
    let text = &text[text.find(from).unwrap_or_else(|| panic!("{from:?}"))..];
    let open = format!("```{lang}\n");
    let start = text.find(&open).unwrap_or_else(|| panic!("a {lang} block")) + open.len();
    &text[start..start + text[start..].find("```").unwrap()]
}

/// docs/websphere-plugin.md: its plugin-cfg.xml and TOML pass `dispatcher check` with
/// exactly the warnings the page announces (the RetryIntervals), and every row of its
/// "where each request goes" table is what the agent's route table says; so the page
/// cannot drift from the code.
#[test]
fn the_websphere_page_example_checks_and_routes_as_it_says() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/websphere-plugin.md")).unwrap();
    let xml = fenced(&page, "xml", "## A worked cell");
    let toml = fenced(&page, "toml", "## A worked cell");
    // As WebSphere writes it: ISO-8859-1 bytes (the example is ASCII, so the same).
    let (code, out, err) = check_with(toml, |dir| std::fs::write(dir.join("plugin-cfg.xml"), xml).unwrap());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (1 VIPs, 9 backends)"), "{out}");
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning:")).collect();
    assert_eq!(warnings.len(), 3, "{err}");
    assert!(warnings.iter().all(|w| w.contains("RetryInterval=\"60\" is not implemented")), "{err}");

    // The route table as the agent builds it from the two files.
    let dir = std::env::temp_dir().join(format!("dispatcher-wsdoc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("plugin-cfg.xml"), xml).unwrap();
    std::fs::write(dir.join("d.toml"), toml).unwrap();
    let cfg = dispatcher::config::Config::load(&dir.join("d.toml"));
    let _ = std::fs::remove_dir_all(&dir);
    let cfg = cfg.unwrap_or_else(|e| panic!("{e}"));
    let routes: Vec<dispatcher::routes::Route> = (cfg.routes.iter())
        .map(|r| dispatcher::routes::Route { hosts: r.hosts.clone(), uris: r.uris.clone(), target: r.farm })
        .collect();
    let table = dispatcher::routes::Table::new(&routes).unwrap();
    let section = &page[page.find("### Where each request goes").unwrap()..page.find("### Sessions").unwrap()];
    let rows: Vec<Vec<&str>> = section
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| Host"))
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    assert!(rows.len() >= 10, "{rows:?}");
    for row in rows {
        let [host, path, want] = row[..] else { panic!("{row:?}") };
        let got = table.find(Some(host), cfg.vips[0].port, path).map(|m| cfg.farms[m.target].name.as_str());
        let want = (!want.starts_with("(none")).then_some(want);
        assert_eq!(got, want, "{host} {path}");
    }
}

/// A folder of a test's, removed when the test ends (even when it fails).
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("dispatcher-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// Writes `text` as NAME in the folder; its path.
    fn file(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `dispatcher ARGS`, with DISPATCHER_CONFIG_DIR set to `dir` when given (else unset):
/// (exit code, stdout, stderr).
fn dispatcher_in(dir: Option<&std::path::Path>, args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let mut cmd = Command::new(dispatcher_bin());
    cmd.args(args).env_remove("DISPATCHER_CONFIG_DIR");
    if let Some(d) = dir {
        cmd.env("DISPATCHER_CONFIG_DIR", d);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// `dispatcher ARGS` (strings), no DISPATCHER_CONFIG_DIR.
fn dispatcher(args: &[&str]) -> (i32, String, String) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    dispatcher_in(None, &args)
}

/// A valid file of instance `instance` (none: the line left out).
fn instance_file(instance: Option<&str>) -> String {
    let line = instance.map(|i| format!("instance = \"{i}\"\n")).unwrap_or_default();
    format!(
        "[dispatcher]\ninterface = \"eth0\"\n{line}\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.11\"\n\n\
         [[vip]]\nname = \"web\"\naddress = \"10.0.100.2\"\nport = 80\nmode = \"http\"\n"
    )
}

/// `check FILE` as before, `check -c FILE` / `--config FILE` as every other command;
/// both naming one file is fine, two different files a usage error.
#[test]
fn check_takes_the_file_as_argument_or_by_c() {
    let dir = Scratch::new("check-c");
    let file = dir.file("shop.toml", &instance_file(Some("shop")));
    let other = dir.file("other.toml", &instance_file(Some("other")));
    let f = file.to_str().unwrap();
    for args in [&["check", f][..], &["check", "-c", f], &["check", "--config", f], &["check", f, "-c", f]] {
        let (code, out, err) = dispatcher(args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.contains(&format!("{f}: ok (1 VIPs, 1 backends)")), "{args:?}: {out}");
    }
    let (code, _, err) = dispatcher(&["check", f, "-c", other.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("are different files") && err.contains(f) && err.contains("other.toml"), "{err}");
    // -c and -i together: a usage error, whatever the command.
    for cmd in ["check", "status", "reload"] {
        let (code, _, err) = dispatcher(&[cmd, "-c", f, "-i", "shop"]);
        assert_eq!(code, 2, "{cmd}: {err}");
        assert!(err.contains("cannot be used with"), "{cmd}: {err}");
    }
}

/// `-i NAME` is /etc/dispatcher/NAME.toml for every command that reads a configuration,
/// and with neither -c nor -i the file is /etc/dispatcher/default.toml; a missing one
/// is an error that names the path tried and how to choose another.
#[test]
fn i_and_the_default_name_a_file_under_etc_dispatcher() {
    let name = format!("no-such-instance-{}", std::process::id());
    let tried = format!("/etc/dispatcher/{name}.toml");
    for cmd in [
        &["check", "-i"][..],
        &["run", "-i"],
        &["status", "-i"],
        &["reload", "-i"],
        &["metrics", "-i"],
        &["stop", "--instance"],
        &["leave", "-i"],
        &["join", "-i"],
        &["bird-config", "-i"],
        &["drain", "a", "-i"],
        &["disable", "a", "-i"],
        &["enable", "a", "-i"],
    ] {
        let mut args = cmd.to_vec();
        args.push(&name);
        let (code, _, err) = dispatcher(&args);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(&tried) && err.contains("-c FILE"), "{args:?}: {err}");
    }
    // Not a name that could be a file there.
    let (code, _, err) = dispatcher(&["check", "-i", "../passwd"]);
    assert_eq!(code, 2, "{err}");
    if !std::path::Path::new("/etc/dispatcher/default.toml").exists() {
        let (code, _, err) = dispatcher(&["check"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("/etc/dispatcher/default.toml") && err.contains("-i NAME"), "{err}");
    }

    // The same rule in another directory (DISPATCHER_CONFIG_DIR).
    let dir = Scratch::new("config-dir");
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let (code, _, err) = dispatcher_in(Some(&dir.0), &[os("status")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("{}/default.toml", dir.0.display())), "{err}");
    let shop = dir.file("shop.toml", &instance_file(Some("shop")));
    let (code, out, err) = dispatcher_in(Some(&dir.0), &[os("check"), os("-i"), os("shop")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with(&format!("{}: ok", shop.display())), "{out}");
    let default = dir.file("default.toml", &instance_file(None));
    let (code, out, err) = dispatcher_in(Some(&dir.0), &[os("check")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with(&format!("{}: ok", default.display())), "{out}");
    assert!(!err.contains("warning"), "{err}");
}

/// The unit dispatcher@NAME runs /etc/dispatcher/NAME.toml: a file there whose instance
/// is another name is a warning that says what the unit would run; elsewhere a file's
/// name means nothing.
#[test]
fn check_warns_when_the_instance_is_not_the_name_the_unit_runs_the_file_by() {
    let dir = Scratch::new("instance-name");
    let os = std::ffi::OsStr::new;
    let shop = dir.file("shop.toml", &instance_file(Some("example")));
    let (code, _, err) = dispatcher_in(Some(&dir.0), &[os("check"), shop.as_os_str()]);
    assert_eq!(code, 0, "{err}");
    let warning = err.lines().find(|l| l.starts_with("warning: ")).unwrap_or_else(|| panic!("no warning: {err}"));
    for says in [
        "the file is shop.toml but its instance is \"example\"",
        "dispatcher@shop runs it as instance example",
        "/run/dispatcher/example.sock",
        "set instance = \"shop\"",
    ] {
        assert!(warning.contains(says), "`{says}` not in: {warning}");
    }
    // By -i, the same.
    let (code, _, err) = dispatcher_in(Some(&dir.0), &[os("check"), os("-i"), os("shop")]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("dispatcher@shop runs it as instance example"), "{err}");
    // No instance: the default's name.
    dir.file("shop.toml", &instance_file(None));
    let (_, _, err) = dispatcher_in(Some(&dir.0), &[os("check"), os("-i"), os("shop")]);
    assert!(err.contains("its instance is \"default\" (the default)"), "{err}");
    // The right name: no warning.
    dir.file("shop.toml", &instance_file(Some("shop")));
    let (code, _, err) = dispatcher_in(Some(&dir.0), &[os("check"), os("-i"), os("shop")]);
    assert!(code == 0 && err.is_empty(), "{err}");
    // Outside the units' directory, the name is no unit's.
    let elsewhere = Scratch::new("instance-elsewhere");
    let f = elsewhere.file("shop.toml", &instance_file(Some("example")));
    let (code, _, err) = dispatcher_in(Some(&dir.0), &[os("check"), f.as_os_str()]);
    assert!(code == 0 && err.is_empty(), "{err}");
}

/// A file with no [[vip]] is valid (nothing to forward yet) but serves nothing: said.
#[test]
fn a_configuration_without_vip_passes_with_a_warning() {
    let text = "[dispatcher]\ninterface = \"eth0\"\n\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.11\"\n";
    let (code, out, err) = check(text);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("ok (0 VIPs, 1 backends)"), "{out}");
    assert!(
        err.lines().any(|l| l.starts_with("warning: ") && l.ends_with("d.toml: no [[vip]]: the dispatcher will serve nothing")),
        "{err}"
    );
    let (code, _, err) = check(&instance_file(None));
    assert!(code == 0 && !err.contains("no [[vip]]"), "{err}");
}

/// packaging/example.toml and the README's `cp` line: the file it is copied to is the
/// file of the example's instance, so `check -i` on it says nothing.
#[test]
fn the_example_and_the_readmes_cp_line_agree() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let cp = readme
        .lines()
        .find(|l| l.starts_with("cp /etc/dispatcher/example.toml "))
        .expect("the README copies the example");
    let target = cp.split_whitespace().nth(2).unwrap();
    let name = target.strip_prefix("/etc/dispatcher/").and_then(|t| t.strip_suffix(".toml")).expect(target);
    let example = std::fs::read_to_string(format!("{root}/packaging/example.toml")).unwrap();
    assert!(
        example.contains(&format!("copy it to {target}")),
        "example.toml's header names another file than {target}"
    );
    let dir = Scratch::new("example");
    dir.file(&format!("{name}.toml"), &example);
    let os = std::ffi::OsStr::new;
    let (code, out, err) = dispatcher_in(Some(&dir.0), &[os("check"), os("-i"), os(name)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(": ok ("), "{out}");
    assert!(err.is_empty(), "the example, copied as the README says, warns:\n{err}");
    // And with no -i, the README's next steps (`dispatcher check`, dispatcher@<name>).
    if name == "default" {
        let (code, _, err) = dispatcher_in(Some(&dir.0), &[os("check")]);
        assert!(code == 0 && err.is_empty(), "{err}");
    }
}
