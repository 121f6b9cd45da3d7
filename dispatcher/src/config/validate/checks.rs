//! Checks of single values, shared with the CLI and the agent (`check`, `run`).

use std::{net::IpAddr, time::Duration};

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

/// The most dispatchers one `[cluster]` may list.
pub const MAX_PEERS: usize = 64;

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
