//! `[dispatcher]`, `[announce]` and `[access_log]`: where the agent runs and what it writes.

use std::{
    net::{IpAddr, SocketAddr},
    ops::Range,
};

use super::*;

/// What `[dispatcher]` says.
pub(super) struct DispatcherSection {
    pub(super) interface: String,
    pub(super) instance: String,
    pub(super) bpffs: PathBuf,
    pub(super) xdp_mode: XdpAttachMode,
    pub(super) flow_table_size: u32,
    pub(super) affinity_table_size: u32,
    pub(super) log_level: String,
    pub(super) admin_socket: PathBuf,
    pub(super) admin_address: Option<SocketAddr>,
}

impl Ctx<'_> {
    /// `[dispatcher]`.
    pub(super) fn dispatcher(&self, d: &RawDispatcher, section: Range<usize>) -> DispatcherSection {
        let (interface, instance) = self.names(d, section);
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
        let (admin_socket, admin_address) = self.admin(d, &instance);
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

    /// `interface` and `instance`.
    fn names(&self, d: &RawDispatcher, section: Range<usize>) -> (String, String) {
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
        (interface, instance)
    }

    /// `admin_socket` (by default named after the instance) and `admin_address`.
    fn admin(&self, d: &RawDispatcher, instance: &str) -> (PathBuf, Option<SocketAddr>) {
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
        (admin_socket, admin_address)
    }

    /// `[announce]`.
    pub(super) fn announce(&self, a: &RawAnnounce) -> AnnounceSettings {
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

    /// `[access_log]`: a file or standard output (`path`), syslog (`syslog`), or both.
    pub(super) fn access_log(&self, a: &RawAccessLog, section: Range<usize>) -> AccessLogSettings {
        if a.path.is_none() && a.syslog.is_none() {
            self.report(
                section,
                "access_log.path",
                "required: a file (\"-\" for standard output), unless `syslog` is set",
            );
        }
        let output = a.path.as_ref().map(|p| self.access_log_path(p));
        let syslog = a.syslog.as_ref().map(|s| self.syslog_target(s));
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
        let tag = match &a.tag {
            Some(t)
                if t.get_ref().is_empty()
                    || t.get_ref().len() > 48
                    || !t.get_ref().bytes().all(|b| b.is_ascii_graphic() && b != b'[' && b != b']' && b != b':') =>
            {
                self.report(
                    t.span(),
                    "access_log.tag",
                    "must be 1 to 48 printable ASCII characters without spaces, `[`, `]` or `:` (syslog's APP-NAME)",
                );
                AccessLogSettings::DEFAULT_TAG.to_string()
            }
            Some(t) => t.get_ref().clone(),
            None => AccessLogSettings::DEFAULT_TAG.to_string(),
        };
        let facility = self.choice(
            &a.facility,
            "access_log.facility",
            AccessLogSettings::DEFAULT_FACILITY,
            &AccessLogSettings::FACILITIES,
        );
        let max_message = match &a.max_message {
            Some(m) if !(480..=65_000).contains(m.get_ref()) => {
                self.report(
                    m.span(),
                    "access_log.max_message",
                    "must be 480..=65000 (bytes of a syslog message, its header included)",
                );
                AccessLogSettings::DEFAULT_MAX_MESSAGE
            }
            Some(m) => *m.get_ref(),
            None => AccessLogSettings::DEFAULT_MAX_MESSAGE,
        };
        let syslog_format = self.choice(
            &a.syslog_format,
            "access_log.syslog_format",
            SyslogFormat::Rfc5424,
            &[("rfc5424", SyslogFormat::Rfc5424), ("rfc3164", SyslogFormat::Rfc3164)],
        );
        if a.syslog.is_none() {
            for (v, field) in [
                (a.facility.as_ref().map(|v| v.span()), "facility"),
                (a.max_message.as_ref().map(|v| v.span()), "max_message"),
                (a.syslog_format.as_ref().map(|v| v.span()), "syslog_format"),
            ] {
                if let Some(span) = v {
                    self.report(span, &format!("access_log.{field}"), "applies to `syslog` only, which is not set");
                }
            }
        }
        AccessLogSettings { output, syslog, format, buffer, tag, facility, max_message, syslog_format }
    }

    /// `path`: an absolute file path, or `-` for standard output.
    fn access_log_path(&self, p: &Spanned<String>) -> AccessLogOutput {
        let path = p.get_ref();
        if path == "-" {
            return AccessLogOutput::Stdout;
        }
        if !path.starts_with('/') {
            self.report(p.span(), "access_log.path", "must be an absolute path, or \"-\" for standard output");
        } else if let Err(e) = check_log_path(std::path::Path::new(path)) {
            self.report(p.span(), "access_log.path", e);
        }
        AccessLogOutput::File(PathBuf::from(path))
    }

    /// `syslog`: a Unix datagram socket's absolute path (`/dev/log`), or a UDP
    /// `address:port` (an IP address: no name is looked up).
    fn syslog_target(&self, s: &Spanned<String>) -> SyslogTarget {
        let v = s.get_ref();
        if v.starts_with('/') {
            let path = std::path::Path::new(v);
            if v.len() > 107 {
                self.report(s.span(), "access_log.syslog", "a socket path is at most 107 bytes long");
            } else if path
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::CurDir))
            {
                self.report(s.span(), "access_log.syslog", "must not contain `.` or `..` components");
            }
            SyslogTarget::Unix(path.to_path_buf())
        } else {
            match v.parse::<SocketAddr>() {
                Ok(a) if a.port() != 0 && !a.ip().is_unspecified() && !a.ip().is_multicast() => SyslogTarget::Udp(a),
                Ok(_) => {
                    self.report(s.span(), "access_log.syslog", format!("`{v}`: needs a port and a unicast address"));
                    SyslogTarget::Udp(SocketAddr::from(([127, 0, 0, 1], 514)))
                }
                Err(_) => {
                    self.report(s.span(), "access_log.syslog", format!("`{}` is neither a socket path (`/dev/log`) nor a UDP address:port (`127.0.0.1:514`, `[::1]:514`)", v.escape_debug()));
                    SyslogTarget::Udp(SocketAddr::from(([127, 0, 0, 1], 514)))
                }
            }
        }
    }
}
