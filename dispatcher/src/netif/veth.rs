//! The veth trap. A frame that an XDP program in native mode sends back out of a veth
//! (`XDP_TX`: L4 and SIP VIPs, steering) is handed to the peer's NAPI instance, which
//! exists only while the peer itself runs an XDP program in native mode; without one the
//! kernel drops the frame and counts it nowhere the dispatcher can see. `trap` finds that
//! case so the agent can say so at start and in `status`; `dispatcher xdp-pass` (the CLI)
//! attaches the trivial `pass` program to the peer.

use std::io;
use std::os::fd::AsFd;

use super::rtnl::{self, XdpAttached};

/// A veth in native mode whose peer runs no native XDP program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trap {
    pub iface: String,
    pub peer: String,
    pub peer_index: u32,
    /// The peer's namespace: its name under /run/netns if it has one there, else the id
    /// this namespace gives it; None: this namespace.
    pub peer_netns: Option<String>,
}

impl Trap {
    /// What the operator reads: the symptom, and the two ways out. The peer's names come
    /// from whoever runs its namespace: printed escaped (no terminal control bytes).
    pub fn warning(&self) -> String {
        let peer = self.peer.escape_debug().to_string();
        let (where_, netns_flag) = match &self.peer_netns {
            None => ("in this network namespace".to_string(), String::new()),
            Some(ns) if ns.starts_with("id ") => (
                format!("in the network namespace with {ns} (`ip netns list-id`)"),
                " (run in that namespace)".to_string(),
            ),
            Some(ns) => {
                let ns = ns.escape_debug();
                (format!("in network namespace {ns}"), format!(" --netns {ns}"))
            }
        };
        format!(
            "{} is a veth running the XDP program in native mode, and its peer {} ({where_}) runs no XDP program in native mode: \
             the kernel drops every frame the dispatcher forwards out of {} (L4 and SIP VIPs, steering) without counting it. \
             Attach the pass program to the peer: `dispatcher xdp-pass{netns_flag} {}`, or set dispatcher.xdp_mode = \"generic\"",
            self.iface, peer, self.iface, peer
        )
    }
}

/// Whether `iface` (of this namespace) is caught in the trap.
pub fn trap(iface: &str) -> io::Result<Option<Trap>> {
    let me = rtnl::link_named(iface)?;
    let native = matches!(me.xdp, XdpAttached::Driver | XdpAttached::Multi);
    let (true, Some("veth"), Some(peer_index)) = (native, me.kind.as_deref(), me.link) else {
        return Ok(None);
    };
    let peer = rtnl::link(peer_index, me.link_netnsid)?;
    if matches!(peer.xdp, XdpAttached::Driver | XdpAttached::Multi) {
        return Ok(None);
    }
    let peer_netns = me.link_netnsid.map(|id| netns_name(id).unwrap_or_else(|| format!("id {id}")));
    Ok(Some(Trap { iface: iface.to_string(), peer: peer.name, peer_index, peer_netns }))
}

/// The name under /run/netns (`ip netns`) of the namespace this one knows by `id`.
fn netns_name(id: i32) -> Option<String> {
    std::fs::read_dir("/run/netns").ok()?.flatten().find_map(|e| {
        let f = std::fs::File::open(e.path()).ok()?;
        (rtnl::netnsid_of(f.as_fd()).ok()?? == id).then(|| e.file_name().to_string_lossy().into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_names_the_peer_and_both_ways_out() {
        let t = Trap { iface: "eth0".into(), peer: "lb".into(), peer_index: 4, peer_netns: Some("sw".into()) };
        let w = t.warning();
        assert!(w.contains("peer lb (in network namespace sw)"), "{w}");
        assert!(w.contains("`dispatcher xdp-pass --netns sw lb`") && w.contains("xdp_mode = \"generic\""), "{w}");
        let anon = Trap { peer_netns: Some("id 3".into()), ..t.clone() };
        assert!(anon.warning().contains("with id 3 (`ip netns list-id`)"), "{}", anon.warning());
        let here = Trap { peer_netns: None, ..t };
        assert!(here.warning().contains("`dispatcher xdp-pass lb`"), "{}", here.warning());
        let hostile = Trap { peer: "x\u{1b}[2J".into(), peer_netns: Some("n\u{7}".into()), ..here };
        let w = hostile.warning();
        assert!(!w.chars().any(|c| c.is_control()) && w.contains("peer x\\u{1b}[2J"), "{w}");
    }

    #[test]
    fn loopback_is_no_trap() {
        assert_eq!(trap("lo").unwrap(), None);
    }
}
