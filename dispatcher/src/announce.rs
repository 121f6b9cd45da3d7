//! What BIRD announces: the agent holds one interface per kind of VIP and keeps it up
//! while this dispatcher can serve those VIPs; BIRD's static protocol carries each VIP
//! `via` its interface, so a route exists exactly while the interface is up (BIRD
//! follows interface events at once, no scan interval). `dispatcher bird-config` prints
//! the stanza.
//!
//! - HTTP VIPs: a TUN device this process holds open. The kernel removes it when the
//!   process ends, however it ends, so the HTTP VIPs are withdrawn within BIRD's reaction
//!   to an interface event when the agent dies (the connections it terminated are gone).
//! - L4 VIPs: a veth pair that outlives the agent: XDP forwards them across a restart.
//!
//! Both go down on `dispatcher leave` and on `dispatcher stop`.

use std::{os::fd::OwnedFd, process::Command};

use anyhow::{bail, Context};

use crate::{
    config::{AnnounceSettings, Config, VipMode},
    netif::{exists, open_tun, set_up},
};

/// The persistent L4 interface: a veth pair (`name` and `name` + "p"), created if missing.
fn ensure_veth(name: &str) -> anyhow::Result<()> {
    let peer = format!("{name}p");
    if !exists(name) {
        let out = Command::new("ip")
            .args(["link", "add", name, "type", "veth", "peer", "name", &peer])
            .output()
            .context("running ip link add")?;
        if !out.status.success() {
            bail!("creating {name}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
    // The peer stays up: the pair has carrier as soon as `name` is up.
    set_up(&peer, true)
}

pub struct Announcer {
    settings: AnnounceSettings,
    /// The HTTP interface's TUN descriptor (the device lives as long as it).
    http: Option<OwnedFd>,
    joined: bool,
}

impl Announcer {
    /// Creates the interfaces, down; `set_joined(true)` announces.
    pub fn start(settings: &AnnounceSettings) -> anyhow::Result<Announcer> {
        let http = match &settings.http_interface {
            Some(n) => {
                let fd = open_tun(n)?;
                set_up(n, false)?;
                Some(fd)
            }
            None => None,
        };
        if let Some(n) = &settings.l4_interface {
            ensure_veth(n)?;
        }
        Ok(Announcer { settings: settings.clone(), http, joined: false })
    }

    pub fn joined(&self) -> bool {
        self.joined
    }

    /// Announces (up) or withdraws (down) every VIP.
    pub fn set_joined(&mut self, joined: bool) -> anyhow::Result<()> {
        for n in self.settings.http_interface.iter().chain(self.settings.l4_interface.iter()) {
            set_up(n, joined)?;
        }
        self.joined = joined;
        tracing::info!(announced = joined, http = ?self.settings.http_interface, l4 = ?self.settings.l4_interface, "VIP announcements");
        Ok(())
    }

    /// Withdraws everything: the L4 interface goes down, the HTTP one with the descriptor.
    pub fn stop(mut self) {
        if let Err(e) = self.set_joined(false) {
            tracing::warn!(error = %e, "withdrawing the VIPs");
        }
        self.http.take();
    }
}

/// BIRD's static protocol for this configuration: each VIP address via its kind's
/// interface. An address with HTTP and L4 VIPs goes with the HTTP interface (when the
/// agent dies, its HTTP connections are gone: the address must be withdrawn).
pub fn bird_config(cfg: &Config) -> anyhow::Result<String> {
    let Some(a) = &cfg.announce else { bail!("the configuration has no [announce] section") };
    let mut by_addr: std::collections::BTreeMap<std::net::IpAddr, (&String, Vec<&str>)> = Default::default();
    for v in &cfg.vips {
        let iface = match v.mode() {
            VipMode::Http => &a.http_interface,
            // Forwarded by XDP alone: announced as long as the data plane runs.
            VipMode::L4 | VipMode::Sip => &a.l4_interface,
        };
        let Some(iface) = iface else { continue };
        let e = by_addr.entry(v.address).or_insert((iface, Vec::new()));
        if v.mode() == VipMode::Http {
            e.0 = iface;
        }
        e.1.push(&v.name);
    }
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for (addr, (iface, names)) in by_addr {
        let line = |len| format!("    route {addr}/{len} via \"{iface}\";  # {}", names.join(", "));
        match addr {
            std::net::IpAddr::V4(_) => v4.push(line(32)),
            std::net::IpAddr::V6(_) => v6.push(line(128)),
        }
    }
    let mut out = String::from("# The VIPs of this dispatcher: each announced while its interface is up.\n");
    if !v4.is_empty() {
        out += &format!("protocol static dispatcher_vips {{\n    ipv4;\n{}\n}}\n", v4.join("\n"));
    }
    if !v6.is_empty() {
        out += &format!("protocol static dispatcher_vips6 {{\n    ipv6;\n{}\n}}\n", v6.join("\n"));
    }
    Ok(out)
}
