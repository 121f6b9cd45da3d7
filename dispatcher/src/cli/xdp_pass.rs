//! `dispatcher xdp-pass IFACE`: the way out of the veth trap (`netif::veth`). The pass
//! program is attached the netlink way, so that it stays with the link after this
//! command exits (as `ip link set dev IFACE xdp obj ...` would), without a pin to clean.

use std::os::fd::{AsFd, AsRawFd};
use std::process::ExitCode;

use anyhow::{bail, Context as _};
use dispatcher::{
    dataplane,
    netif::rtnl::{self, XdpAttached, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, XDP_FLAGS_UPDATE_IF_NOEXIST},
};

pub fn xdp_pass(iface: &str, netns: Option<&str>, detach: bool) -> anyhow::Result<ExitCode> {
    if let Some(ns) = netns {
        enter_netns(ns)?;
    }
    let link = rtnl::link_named(iface).map_err(|e| match e.raw_os_error() {
        Some(libc::ENODEV) | Some(libc::ENXIO) => {
            anyhow::anyhow!("no interface named {iface}{} (`ip link` lists them)", in_ns(netns))
        }
        _ => anyhow::Error::from(e).context(format!("reading interface {iface}")),
    })?;
    let mut ebpf = dataplane::load_pass()?;
    let pass = dataplane::program(&mut ebpf, "pass")?;
    let ours = pass.info().context("reading the pass program's tag")?.tag();
    let running = link.xdp_prog_id.and_then(|id| {
        aya::programs::loaded_programs()
            .flatten()
            .find(|p| p.id() == id)
            .map(|p| (id, p.tag(), p.name_as_str().map(str::to_string)))
    });
    // The tag hashes the instructions only (any program that returns XDP_PASS has it):
    // the name too.
    let is_ours = running.as_ref().is_some_and(|(_, tag, name)| *tag == ours && name.as_deref() == Some("pass"));
    let describe = |r: &Option<(u32, u64, Option<String>)>| match r {
        Some((id, _, name)) => format!("program id {id}, {}", name.as_deref().unwrap_or("no name")),
        None => "a program".to_string(),
    };
    if detach {
        return match link.xdp {
            XdpAttached::None => {
                println!("{iface}: no XDP program attached; nothing to do");
                Ok(ExitCode::SUCCESS)
            }
            XdpAttached::Driver | XdpAttached::Generic if is_ours => {
                let flags = if link.xdp == XdpAttached::Driver { XDP_FLAGS_DRV_MODE } else { XDP_FLAGS_SKB_MODE };
                rtnl::set_xdp(link.index, None, flags).with_context(|| format!("removing the pass program from {iface}"))?;
                println!("{iface}: pass program removed");
                Ok(ExitCode::SUCCESS)
            }
            _ => bail!(
                "{iface} runs {} that is not dispatcher's pass program: left alone (`ip link set dev {iface} xdp off` removes it)",
                describe(&running)
            ),
        };
    }
    match link.xdp {
        XdpAttached::Driver | XdpAttached::Multi => {
            let whose = if is_ours { "the pass program".to_string() } else { describe(&running) };
            println!("{iface} already runs {whose} in native mode: frames sent to it with XDP_TX are received; nothing to do");
            return Ok(ExitCode::SUCCESS);
        }
        XdpAttached::Generic | XdpAttached::Offloaded => bail!(
            "{iface} runs {} in {} mode, and a link runs XDP in one mode at a time: remove it first (`ip link set dev {iface} xdp off`)",
            describe(&running),
            if link.xdp == XdpAttached::Generic { "generic" } else { "offloaded" }
        ),
        XdpAttached::None => {}
    }
    let fd = pass.fd().context("the pass program's descriptor")?.as_fd().as_raw_fd();
    rtnl::set_xdp(link.index, Some(fd), XDP_FLAGS_DRV_MODE | XDP_FLAGS_UPDATE_IF_NOEXIST).map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => {
                format!("{iface} has no native XDP support (its driver); nothing to do on a real NIC")
            }
            Some(libc::EBUSY) | Some(libc::EEXIST) => format!("{iface} got another XDP program meanwhile"),
            _ => format!("attaching the pass program to {iface} in native mode: {e}"),
        };
        anyhow::anyhow!(why)
    })?;
    println!(
        "{iface}{}: pass program attached in native mode; it stays until `dispatcher xdp-pass --detach {iface}` or the link goes away",
        in_ns(netns)
    );
    Ok(ExitCode::SUCCESS)
}

fn in_ns(netns: Option<&str>) -> String {
    netns.map(|n| format!(" in network namespace {n}")).unwrap_or_default()
}

/// Moves this (single-threaded) process into a network namespace: a name under
/// /run/netns, or a path (/proc/PID/ns/net). Only the network namespace: the mounts, and
/// so bpffs, stay the host's.
fn enter_netns(ns: &str) -> anyhow::Result<()> {
    let path =
        if ns.contains('/') { std::path::PathBuf::from(ns) } else { std::path::Path::new("/run/netns").join(ns) };
    let f = std::fs::File::open(&path).with_context(|| {
        format!("network namespace {ns}: cannot open {} (`ip netns list` names them)", path.display())
    })?;
    nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering network namespace {ns} ({} is not one?)", path.display()))?;
    Ok(())
}
