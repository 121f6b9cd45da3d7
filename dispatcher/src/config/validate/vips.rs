//! `[[vip]]`: what every VIP has (name, address, port, protocol, backends), its kind
//! (`mode`), and the settings of the kinds XDP forwards (L4, SIP). An HTTP VIP's own
//! settings are `http.rs`'s.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr},
};

use dispatcher_common::{MAX_RING_SIZE, MAX_VIPS};

use super::*;

/// The backends as the VIPs name them.
pub(super) struct Members<'a> {
    pub(super) raw: &'a [Spanned<RawBackend>],
    pub(super) backends: &'a [Backend],
    pub(super) by_name: &'a HashMap<String, usize>,
    /// The VIPs routes apply to (an HTTP VIP among them takes its farms' servers).
    pub(super) routed: &'a super::farms::Routed,
}

/// What the VIPs before this one took: names, address-port-protocol triples, and port
/// groups by name.
#[derive(Default)]
struct Taken {
    /// Each VIP's name and the line of its `name =`.
    names: HashMap<String, usize>,
    /// Who has each address, port and protocol: its name and the line of its `port =`.
    addrs: HashMap<(IpAddr, u16, Protocol), (String, usize)>,
    groups: HashMap<String, u32>,
}

impl Ctx<'_> {
    /// `[[vip]]`.
    pub(super) fn vips(&self, raw: &[Spanned<RawVip>], m: &Members) -> Vec<Vip> {
        if raw.len() > MAX_VIPS as usize {
            self.report(raw[MAX_VIPS as usize].span(), "vip", format!("at most {MAX_VIPS} VIPs"));
        }
        if raw.is_empty() {
            // Valid (nothing to forward yet), but rarely meant.
            self.warn(format!("{}: no [[vip]]: the dispatcher will serve nothing", self.file));
        }
        let mut taken = Taken::default();
        let mut vips: Vec<Vip> = raw.iter().enumerate().map(|(i, v)| self.vip(i, v.get_ref(), m, &mut taken)).collect();
        self.redirects(raw, &mut vips);
        self.no_loops(raw, m, &vips);
        vips
    }

    /// `vip[i]`.
    fn vip(&self, i: usize, v: &RawVip, m: &Members, taken: &mut Taken) -> Vip {
        let f = |field: &str| format!("vip[{i}].{field}");
        if let Err(e) = check_name(v.name.get_ref()) {
            self.report(v.name.span(), &f("name"), e);
        } else if let Some(line) = taken.names.get(v.name.get_ref()) {
            self.report(
                v.name.span(),
                &f("name"),
                format!("`{}` is defined twice (first at line {line})", v.name.get_ref()),
            );
        } else {
            taken.names.insert(v.name.get_ref().clone(), self.line(v.name.span().start));
        }
        let address: IpAddr = match self.parsed::<IpAddr>(&v.address, &f("address"), "an IP address") {
            Ok(a) => {
                self.host_address(a, &v.address, &f("address"));
                a
            }
            Err(e) => self.or(Err(e), IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
        };
        let (mode, protocol, transport) = self.mode(i, v);
        // Where a port error points: the port, or the VIP's name when it has none.
        let port_span = v.port.as_ref().map_or_else(|| v.name.span(), |p| p.span());
        let port = match (&v.port, mode, transport) {
            (Some(p), ..) => *p.get_ref(),
            // SIP's own ports (RFC 3261 19.1.2): 5060, 5061 for SIP over TLS.
            (None, VipMode::Sip, Some(SipTransport::Tls)) => 5061,
            (None, VipMode::Sip, _) => 5060,
            (None, ..) => {
                self.report(
                    port_span.clone(),
                    &f("port"),
                    "required, and missing from this [[vip]] (only a SIP VIP has a default: 5060, or 5061 with transport = \"tls\")",
                );
                0
            }
        };
        if port == 0 && v.port.is_some() {
            self.report(port_span.clone(), &f("port"), "must be 1..=65535");
        }
        match taken.addrs.get(&(address, port, protocol)) {
            Some((other, line)) => self.report(
                port_span.clone(),
                &f("port"),
                format!(
                    "VIP `{other}` (line {line}) has the same address, port and protocol ({address} port {port} {})",
                    if protocol == Protocol::Tcp { "tcp" } else { "udp" }
                ),
            ),
            None if port != 0 => {
                let at = (v.name.get_ref().clone(), self.line(port_span.start));
                taken.addrs.insert((address, port, protocol), at);
            }
            None => {}
        }
        let mut members = self.members(i, v, mode, m);
        // Every kind's settings are checked whatever the kind (an error is an error); the
        // VIP keeps its own kind's.
        // A stream SIP VIP is the agent's: XDP needs nothing of its members.
        let xdp_mode = if transport.is_some() { VipMode::Http } else { mode };
        let l4 = self.l4_settings(i, v, address, xdp_mode, &members, m, &mut taken.groups);
        let http = self.http_vip(i, v, port, mode, transport.is_some(), &mut members, m.raw);
        Vip {
            name: v.name.get_ref().clone(),
            address,
            port,
            protocol,
            kind: match mode {
                VipMode::L4 => VipKind::L4(l4),
                VipMode::Sip => match transport {
                    None => VipKind::Sip(l4),
                    Some(t) => VipKind::SipStream(Box::new(self.sip_stream(i, v, t, http))),
                },
                VipMode::Http => VipKind::Http(Box::new(http)),
            },
            backends: members,
            slow_start: v
                .slow_start
                .as_ref()
                .and_then(|s| self.duration(s, &f("slow_start"), Duration::from_millis(100))),
            retired: false,
        }
    }

    /// `mode`, `protocol` and a SIP VIP's `transport`: HTTP over TCP, SIP over UDP (the
    /// default) or over TCP or TLS (`Some`: the agent terminates it).
    fn mode(&self, i: usize, v: &RawVip) -> (VipMode, Protocol, Option<SipTransport>) {
        let f = |field: &str| format!("vip[{i}].{field}");
        let mode = self.choice(
            &v.mode,
            &f("mode"),
            VipMode::L4,
            &[("l4", VipMode::L4), ("http", VipMode::Http), ("sip", VipMode::Sip)],
        );
        let transport = self.choice(
            &v.transport,
            &f("transport"),
            None,
            &[("udp", None), ("tcp", Some(SipTransport::Tcp)), ("tls", Some(SipTransport::Tls))],
        );
        if let (Some(t), true) = (&v.transport, mode != VipMode::Sip) {
            self.report(t.span(), &f("transport"), "applies to SIP VIPs only (mode = \"sip\")");
        }
        let protocol = self.choice(
            &v.protocol,
            &f("protocol"),
            if mode == VipMode::Sip && transport.is_none() { Protocol::Udp } else { Protocol::Tcp },
            &[("tcp", Protocol::Tcp), ("udp", Protocol::Udp)],
        );
        if mode == VipMode::Http && protocol != Protocol::Tcp {
            self.report(v.mode.as_ref().unwrap().span(), &f("mode"), "http needs protocol tcp");
        }
        if mode == VipMode::Sip && (protocol == Protocol::Udp) != transport.is_none() {
            let span = v.protocol.as_ref().map(|p| p.span()).unwrap_or(v.mode.as_ref().unwrap().span());
            let why = if transport.is_none() {
                "SIP over UDP is protocol udp (for SIP over TCP or TLS, set transport = \"tcp\" or \"tls\")"
            } else {
                "SIP over TCP or TLS (transport) is protocol tcp"
            };
            self.report(span, &f("protocol"), why);
        }
        (mode, protocol, transport.filter(|_| mode == VipMode::Sip))
    }

    /// A stream SIP VIP's own settings, from what `http_vip` read of the same keys
    /// (`tls`, `backend_port`, `max_connections`).
    fn sip_stream(&self, i: usize, v: &RawVip, transport: SipTransport, http: HttpVip) -> SipStreamVip {
        let f = |field: &str| format!("vip[{i}].{field}");
        match (transport, &v.tls) {
            (SipTransport::Tls, None) => self.report(
                v.transport.as_ref().unwrap().span(),
                &f("tls"),
                "transport = \"tls\" needs [vip.tls] with at least one [[vip.tls.certificate]] (cert and key files)",
            ),
            (SipTransport::Tcp, Some(t)) => {
                self.report(t.span(), &f("tls"), "applies with transport = \"tls\" (this VIP is SIP over TCP)")
            }
            _ => {}
        }
        SipStreamVip {
            transport,
            tls: http.tls.filter(|_| transport == SipTransport::Tls),
            backend_port: http.backend_port,
            max_connections: http.max_connections.unwrap_or(SIP_STREAM_MAX_CONNECTIONS),
        }
    }

    /// `backends`: the members by name (all the backends when not given), at least one
    /// unless the VIP redirects or routes apply to it.
    fn members(&self, i: usize, v: &RawVip, mode: VipMode, m: &Members) -> Vec<usize> {
        let field = format!("vip[{i}].backends");
        if mode == VipMode::Http && v.redirect_to.is_none() && m.routed.applies(v.name.get_ref()) {
            // Its farms' servers, once the farms are read (`farms::routed_vips`).
            return Vec::new();
        }
        let mut members: Vec<usize> = Vec::new();
        match &v.backends {
            Some(list) => {
                for n in list.get_ref() {
                    match m.by_name.get(n.get_ref()) {
                        None => self.report(n.span(), &field, format!("names no backend: `{}`", n.get_ref())),
                        Some(bi) if members.contains(bi) => {
                            self.report(n.span(), &field, format!("`{}` listed twice", n.get_ref()))
                        }
                        Some(&bi) => members.push(bi),
                    }
                }
            }
            None => members.extend(0..m.backends.len()),
        }
        if members.is_empty() && v.redirect_to.is_none() {
            let span = v.backends.as_ref().map(|l| l.span()).unwrap_or(v.name.span());
            self.report(
                span,
                &field,
                "a VIP needs at least one backend (with none, an L4 VIP drops all its traffic and an HTTP VIP answers only 503)",
            );
        }
        members
    }

    /// `forwarding`, `encap_source`, `ring_size`, `sticky_time`, `port_group`, and what
    /// XDP needs of the members of an L4 or SIP VIP.
    #[allow(clippy::too_many_arguments)]
    fn l4_settings(
        &self,
        i: usize,
        v: &RawVip,
        address: IpAddr,
        mode: VipMode,
        members: &[usize],
        m: &Members,
        groups: &mut HashMap<String, u32>,
    ) -> L4Settings {
        let f = |field: &str| format!("vip[{i}].{field}");
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
        if mode != VipMode::Http {
            if forwarding == Forwarding::Ipip && v.encap_source.is_none() {
                let span = v.forwarding.as_ref().unwrap().span();
                self.report(span, &f("encap_source"), "required with forwarding = \"ipip\"");
            }
            let kind = if mode == VipMode::Sip { "SIP" } else { "L4" };
            self.xdp_members(v, kind, address.is_ipv6() && forwarding == Forwarding::Ipip, members, m);
        }
        let sticky_time = v.sticky_time.as_ref().and_then(|s| {
            let d = self.duration(s, &f("sticky_time"), Duration::from_secs(1))?;
            if d.as_secs() > u32::MAX as u64 {
                self.report(s.span(), &f("sticky_time"), "is too long");
            }
            Some(d)
        });
        // Numbered past the VIP ids, in the order of first use (whatever the kind).
        let next = groups.len() as u32 + MAX_VIPS;
        let port_group = match &v.port_group {
            Some(g) => *groups.entry(g.get_ref().clone()).or_insert(next),
            None => i as u32,
        };
        L4Settings { forwarding, encap_source, ring_size: self.ring_size(i, v, members.len()), sticky_time, port_group }
    }

    /// XDP writes each member's MAC (and its IPv6 address, to encapsulate IPv6).
    /// `kind`: "L4" or "SIP", as the operator wrote the VIP.
    fn xdp_members(&self, v: &RawVip, kind: &str, ipip6: bool, members: &[usize], m: &Members) {
        for &bi in members {
            let b = &m.backends[bi];
            let span = m.raw[bi].span();
            if b.mac.is_none() {
                self.report(
                    span.clone(),
                    &format!("backend[{bi}].mac"),
                    format!(
                        "required: backend `{}` serves {kind} VIP `{}` (XDP forwards to the backend's MAC)",
                        b.name,
                        v.name.get_ref()
                    ),
                );
            }
            if ipip6 && b.address6.is_none() {
                self.report(
                    span,
                    &format!("backend[{bi}].address6"),
                    format!("required: backend `{}` serves IPv6 IPIP VIP `{}`", b.name, v.name.get_ref()),
                );
            }
        }
    }

    /// `ring_size`: a prime, with room for the members.
    fn ring_size(&self, i: usize, v: &RawVip, members: usize) -> u32 {
        let Some(r) = &v.ring_size else { return dispatcher_common::DEFAULT_RING_SIZE };
        let n = *r.get_ref();
        let field = format!("vip[{i}].ring_size");
        if !is_prime(n) || n > MAX_RING_SIZE {
            self.report(r.span(), &field, format!("{n} must be a prime no larger than {MAX_RING_SIZE}"));
        } else if (n as usize) < members * 10 {
            self.report(
                r.span(),
                &field,
                format!("{n} is too small for {members} backends (want at least 10 slots each)"),
            );
        }
        n
    }

    /// An HTTP VIP whose backend is one of the HTTP VIPs (itself or another: the
    /// address and port its pool connects to is where a VIP listens) forwards its
    /// requests back to the dispatcher: one request becomes hundreds until the
    /// descriptors run out. A VIP on a wildcard address listens on every local address:
    /// a loopback backend on its port is one too. (A loop through another local address
    /// or another proxy is caught at run time by the Via marker: 508.)
    fn no_loops(&self, raw: &[Spanned<RawVip>], m: &Members, vips: &[Vip]) {
        let listening: Vec<(IpAddr, u16, &str)> =
            vips.iter().filter(|v| v.serves_http()).map(|v| (v.address, v.port, v.name.as_str())).collect();
        for (i, v, h) in vips.iter().enumerate().filter_map(|(i, v)| Some((i, v, v.served_http()?))) {
            for &bi in &v.backends {
                let addr = IpAddr::V4(m.backends[bi].address);
                let hit = listening.iter().find(|(a, p, _)| {
                    *p == h.backend_port
                        && (*a == addr || (a.is_unspecified() && (addr.is_loopback() || addr.is_unspecified())))
                });
                if let Some((a, p, name)) = hit {
                    let span = raw[i].get_ref().backends.as_ref().map(|b| b.span()).unwrap_or(m.raw[bi].span());
                    self.report(
                        span,
                        &format!("vip[{i}].backends"),
                        format!(
                            "backend `{}` ({addr}:{}) is HTTP VIP `{name}` ({}): its requests would come back to this dispatcher (a loop)",
                            m.backends[bi].name,
                            h.backend_port,
                            std::net::SocketAddr::new(*a, *p)
                        ),
                    );
                }
            }
        }
    }

    /// An address with an HTTP VIP is announced through the HTTP interface, which goes
    /// when the agent dies (its connections die with it): L4 and SIP VIPs sharing that
    /// address are withdrawn with it, though XDP would go on forwarding them.
    pub(super) fn shared_address_warnings(&self, a: &AnnounceSettings, vips: &[Vip]) {
        if a.http_interface.is_none() || a.l4_interface.is_none() {
            return;
        }
        for v in vips.iter().filter(|v| v.mode() != VipMode::Http) {
            if let Some(h) = vips.iter().find(|h| h.mode() == VipMode::Http && h.address == v.address) {
                self.warn(format!(
                    "VIP `{}` shares address {} with HTTP VIP `{}`: the address is announced through announce.http_interface, withdrawn when the agent stops or dies, and `{}` with it (XDP would go on forwarding it); give it an address of its own to keep it announced across an agent crash",
                    v.name, v.address, h.name, v.name
                ));
            }
        }
    }
}
