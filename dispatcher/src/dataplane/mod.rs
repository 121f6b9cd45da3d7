//! The agent's side of the XDP data plane: loading and pinning the program, attaching it,
//! and writing the maps (`tables`) from the configuration.

pub mod ids;
pub mod object;
pub mod pins;
pub mod tables;

use std::path::{Path, PathBuf};

use aya::{
    programs::{links::FdLink, Xdp, XdpMode},
    Ebpf, EbpfLoader,
};

use crate::config::XdpAttachMode;

#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("loading the XDP program: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("{what}: {source}")]
    Program { what: String, source: aya::programs::ProgramError },
    #[error("map {name}: {source}")]
    Map { name: &'static str, source: aya::maps::MapError },
    #[error("map {0} missing from the program object")]
    MissingMap(&'static str),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// `dispatcher.interface` names no interface of this host (or of this namespace).
    #[error("no interface named {0} (dispatcher.interface; `ip link` lists them)")]
    NoInterface(String),
    #[error("this binary was built without its XDP programs (bpf-linker was missing at build time): build it with `cargo xtask build`")]
    Stub,
}

/// The map names, as the design brief fixed them (docs/design.md, "Who owns what").
pub const MAP_NAMES: [&str; 10] =
    ["VIPS", "BACKENDS", "RINGS", "FLOWS", "AFFINITY", "CLONES", "STATS", "STEER", "STEER_CONF", "FRAGS"];

/// How the program was attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    Native,
    Generic,
}

pub struct LoadOptions<'a> {
    /// Pin (and adopt) the maps under this directory; `None` keeps them private.
    pub pin_dir: Option<&'a Path>,
    pub flow_table_size: u32,
    pub affinity_table_size: u32,
    /// Another build of the program (the XDP benchmark's baseline); `None`: this one's.
    pub object: Option<&'a [u8]>,
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        LoadOptions {
            pin_dir: None,
            flow_table_size: dispatcher_common::DEFAULT_MAX_FLOWS,
            affinity_table_size: dispatcher_common::DEFAULT_MAX_AFFINITY,
            object: None,
        }
    }
}

/// Runs this process in a mount namespace of its own (other than init's)? `ip netns exec`
/// does that, and remounts /sys: the bpffs this process sees is then private to it.
/// Told by comparing with init's mount namespace, or (where init's cannot be read, as in
/// some containers) with the parent's: `ip netns exec` execs into the command, so the
/// command's parent is the shell that ran `ip`, in the host's namespace.
pub fn private_mount_namespace() -> bool {
    let Ok(mine) = std::fs::read_link("/proc/self/ns/mnt") else { return false };
    let other = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    [1, std::os::unix::process::parent_id()].into_iter().filter_map(other).any(|theirs| theirs != mine)
}

/// What to tell an operator whose process cannot see the instance's pins.
pub const PRIVATE_BPFFS_HINT: &str = "this process runs in a mount namespace of its own (`ip netns exec` does that and hides the host's bpffs): enter only the network namespace, e.g. `nsenter --net=/run/netns/NAME dispatcher ...`";

pub use crate::config::is_bpffs;

/// Makes sure `dir` is a bpffs mount, mounting one there if not (systemd does this at
/// boot on most distributions; minimal systems and containers may lack it). Only on an
/// empty directory (or a new one): never over a directory that holds anything, nor on
/// anything but a directory. `Ok(true)`: this call mounted it.
pub fn ensure_bpffs(dir: &Path) -> Result<bool, DataplaneError> {
    let io = |what: String| move |e: nix::Error| DataplaneError::Io { what, source: std::io::Error::from(e) };
    let refuse = |why: String| DataplaneError::Io {
        what: format!("mounting a bpffs on {}", dir.display()),
        source: std::io::Error::other(why),
    };
    match std::fs::metadata(dir) {
        Ok(_) if is_bpffs(dir) => return Ok(false),
        Ok(m) if !m.is_dir() => return Err(refuse("it exists and is not a directory".into())),
        Ok(_) => {
            let mut entries = std::fs::read_dir(dir)
                .map_err(|source| DataplaneError::Io { what: format!("reading {}", dir.display()), source })?;
            if entries.next().is_some() {
                return Err(refuse(
                    "it is not a bpffs and not empty: refusing to mount over it (set dispatcher.bpffs to a bpffs or an empty directory)".into(),
                ));
            }
        }
        Err(_) => std::fs::create_dir_all(dir)
            .map_err(|source| DataplaneError::Io { what: format!("creating {}", dir.display()), source })?,
    }
    // Created inside a bpffs: already one.
    if is_bpffs(dir) {
        return Ok(false);
    }
    nix::mount::mount(Some("bpffs"), dir, Some("bpf"), nix::mount::MsFlags::empty(), None::<&str>)
        .map_err(io(format!("mounting bpffs on {}", dir.display())))?;
    tracing::info!(dir = %dir.display(), "mounted bpffs (on an empty directory; `stop --detach` unmounts it when nothing is pinned on it)");
    Ok(true)
}

/// Where an agent records the bpffs it mounted itself (for `release_bpffs`).
fn mounted_marker(instance: &std::ffi::OsStr) -> PathBuf {
    PathBuf::from("/run/dispatcher").join(format!("{}.bpffs-mounted", instance.to_string_lossy()))
}

/// After `unpin_all(pin_dir)`: unmounts the bpffs above it if the instance's agent
/// mounted it (on an empty directory) and nothing is pinned on it any more (another
/// instance's pins keep it). Returns the directory unmounted.
pub fn release_bpffs(pin_dir: &Path) -> Option<PathBuf> {
    let instance = pin_dir.file_name()?;
    let root = pin_dir.parent()?.parent()?;
    let marker = mounted_marker(instance);
    let recorded = std::fs::read_to_string(&marker).ok()?;
    if Path::new(recorded.trim_end_matches('\n')) != root {
        return None;
    }
    let _ = std::fs::remove_dir(root.join("dispatcher"));
    // A fresh bpffs holds the kernel's own iterators (bpf_preload): nothing of anyone's.
    let own = |e: &std::fs::DirEntry| matches!(e.file_name().to_str(), Some("maps.debug" | "progs.debug"));
    let empty = std::fs::read_dir(root).is_ok_and(|e| e.flatten().all(|e| own(&e)));
    if !is_bpffs(root) || !empty {
        let left: Vec<String> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        tracing::info!(dir = %root.display(), ?left, "the bpffs this instance mounted stays: other pins are on it");
        let _ = std::fs::remove_file(&marker);
        return None;
    }
    match nix::mount::umount(root) {
        Ok(()) => {
            let _ = std::fs::remove_file(&marker);
            Some(root.to_path_buf())
        }
        Err(e) => {
            tracing::warn!(dir = %root.display(), error = %e, "unmounting the bpffs this instance mounted");
            None
        }
    }
}

/// Loads the dispatcher program. With a pin directory, maps already pinned there by an
/// earlier run are adopted (their contents kept), missing ones are created and pinned.
pub fn load_dispatcher(opts: &LoadOptions) -> Result<Ebpf, DataplaneError> {
    let mut loader = EbpfLoader::new();
    loader.map_max_entries("FLOWS", opts.flow_table_size);
    loader.map_max_entries("AFFINITY", opts.affinity_table_size);
    let paths: Vec<(&str, PathBuf)> = match opts.pin_dir {
        Some(dir) => {
            if let Some(root) = dir.parent().and_then(|p| p.parent()) {
                // Mounting a bpffs of our own where the host's is hidden would pin
                // everything where no other process (CLI, next agent) can find it.
                if !is_bpffs(root) && private_mount_namespace() {
                    return Err(DataplaneError::Io {
                        what: format!("{} is not a bpffs here", root.display()),
                        source: std::io::Error::other(PRIVATE_BPFFS_HINT),
                    });
                }
                if ensure_bpffs(root)? {
                    if let Some(instance) = dir.file_name() {
                        let marker = mounted_marker(instance);
                        if let Some(run) = marker.parent() {
                            let _ = std::fs::create_dir_all(run);
                        }
                        if let Err(e) = std::fs::write(&marker, root.as_os_str().as_encoded_bytes()) {
                            tracing::warn!(error = %e, "recording the bpffs mounted here: `stop --detach` will leave it mounted");
                        }
                    }
                }
            }
            std::fs::create_dir_all(dir)
                .map_err(|source| DataplaneError::Io { what: format!("creating {}", dir.display()), source })?;
            MAP_NAMES.iter().map(|n| (*n, dir.join(n))).collect()
        }
        None => Vec::new(),
    };
    for (name, path) in &paths {
        check_pinned(name, path)?;
        loader.map_pin_path(name, path.as_path());
    }
    let object = opts.object.unwrap_or(object::DISPATCHER);
    if object.is_empty() {
        return Err(DataplaneError::Stub);
    }
    let mut ebpf = loader.load(object)?;
    program(&mut ebpf, "dispatcher")?
        .load()
        .map_err(|source| DataplaneError::Program { what: "verifying the dispatcher program".into(), source })?;
    Ok(ebpf)
}

/// Key size, value size and (where fixed) capacity of each map, as this version's program
/// declares them.
fn expected_shape(name: &str) -> Option<(u32, u32, Option<u32>)> {
    use dispatcher_common::*;
    use std::mem::size_of;
    let sz = |n: usize| n as u32;
    Some(match name {
        "VIPS" => (sz(size_of::<VipKey>()), sz(size_of::<VipInfo>()), Some(MAX_VIPS * 4)),
        "BACKENDS" => (4, sz(size_of::<BackendInfo>()), Some(MAX_BACKENDS)),
        "RINGS" => (4, 4, Some(MAX_VIPS * MAX_RING_SIZE)),
        // Sized by the configuration (`flow_table_size`, `affinity_table_size`).
        "FLOWS" => (sz(size_of::<FlowKey>()), sz(size_of::<FlowValue>()), None),
        "AFFINITY" => (sz(size_of::<AffinityKey>()), sz(size_of::<AffinityValue>()), None),
        "CLONES" => (8, sz(size_of::<CloneValue>()), Some(MAX_CLONES)),
        "STATS" => (4, sz(size_of::<Counter>()), Some(stats::TOTAL_SLOTS)),
        "STEER" => (4, sz(size_of::<SteerSlot>()), Some(STEER_TABLES * STEER_SIZE)),
        "STEER_CONF" => (4, sz(size_of::<SteerConf>()), Some(1)),
        "FRAGS" => (sz(size_of::<FragKey>()), sz(size_of::<FragValue>()), Some(FRAG_ENTRIES)),
        _ => return None,
    })
}

/// A map pinned by another version of the program (another layout or size) would be
/// adopted as it is by the loader, and read wrong: refused, with the way out.
fn check_pinned(name: &'static str, path: &Path) -> Result<(), DataplaneError> {
    if !path.exists() {
        return Ok(());
    }
    let (Ok(info), Some((key, value, entries))) = (aya::maps::MapInfo::from_pin(path), expected_shape(name)) else {
        return Ok(());
    };
    let found = (info.key_size(), info.value_size(), info.max_entries());
    if found.0 != key || found.1 != value || entries.is_some_and(|e| e != found.2) {
        return Err(DataplaneError::Io {
            what: format!("the map pinned at {}", path.display()),
            source: std::io::Error::other(format!(
                "made by another version of the program (key {} B, value {} B, {} entries; this version's: key {key} B, value {value} B{}): `dispatcher stop --detach --config FILE` removes the old data plane (its flows are lost), then start again",
                found.0,
                found.1,
                found.2,
                entries.map(|e| format!(", {e} entries")).unwrap_or_default()
            )),
        });
    }
    Ok(())
}

/// Loads the `decap` program (no maps).
pub fn load_decap() -> Result<Ebpf, DataplaneError> {
    load_simple(object::DECAP, "decap")
}

/// Loads `tx` (every frame sent back out: a packet generator under BPF_PROG_TEST_RUN).
pub fn load_tx() -> Result<Ebpf, DataplaneError> {
    load_simple(object::TX, "tx")
}

/// Loads the trivial `pass` program.
pub fn load_pass() -> Result<Ebpf, DataplaneError> {
    load_simple(object::PASS, "pass")
}

fn load_simple(object: &[u8], name: &str) -> Result<Ebpf, DataplaneError> {
    if object.is_empty() {
        return Err(DataplaneError::Stub);
    }
    let mut ebpf = Ebpf::load(object)?;
    program(&mut ebpf, name)?
        .load()
        .map_err(|source| DataplaneError::Program { what: format!("verifying the {name} program"), source })?;
    Ok(ebpf)
}

pub fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp, DataplaneError> {
    let p = ebpf.program_mut(name).ok_or_else(|| DataplaneError::Io {
        what: format!("program {name}"),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "not in the object"),
    })?;
    p.try_into().map_err(|source| DataplaneError::Program { what: format!("program {name} is not XDP"), source })
}

/// Attaches `prog` to `iface`. `Auto` tries native mode first and falls back to generic
/// (skb) mode, which works on every interface but runs later in the stack.
pub fn attach(
    ebpf: &mut Ebpf,
    prog: &str,
    iface: &str,
    mode: XdpAttachMode,
) -> Result<(FdLink, Attached), DataplaneError> {
    // Checked first: an attach to a missing interface fails in every mode, and "native
    // XDP not available" would send the operator after the driver.
    if nix::net::if_::if_nametoindex(iface).is_err() {
        return Err(DataplaneError::NoInterface(iface.to_string()));
    }
    let xdp = program(ebpf, prog)?;
    let try_mode = |xdp: &mut Xdp, m: XdpMode| -> Result<FdLink, aya::programs::ProgramError> {
        let id = xdp.attach(iface, m)?;
        let link = xdp.take_link(id)?;
        FdLink::try_from(link).map_err(|e| aya::programs::ProgramError::IOError(std::io::Error::other(e.to_string())))
    };
    let what = |m: &str| format!("attaching {prog} to {iface} in {m} mode");
    match mode {
        XdpAttachMode::Native => try_mode(xdp, XdpMode::Driver)
            .map(|l| (l, Attached::Native))
            .map_err(|source| DataplaneError::Program { what: what("native"), source }),
        XdpAttachMode::Generic => try_mode(xdp, XdpMode::Skb)
            .map(|l| (l, Attached::Generic))
            .map_err(|source| DataplaneError::Program { what: what("generic"), source }),
        XdpAttachMode::Auto => match try_mode(xdp, XdpMode::Driver) {
            Ok(l) => Ok((l, Attached::Native)),
            Err(e) => {
                tracing::warn!(interface = iface, error = %e, "native XDP not available, falling back to generic (skb) mode");
                try_mode(xdp, XdpMode::Skb)
                    .map(|l| (l, Attached::Generic))
                    .map_err(|source| DataplaneError::Program { what: what("generic"), source })
            }
        },
    }
}

/// The veth trap (`netif::veth`), in words, when the XDP program forwards anything (an
/// L4 or SIP VIP, or steering) out of `dispatcher.interface` and would lose it there.
pub fn veth_trap(cfg: &crate::config::Config, steering: bool) -> Option<String> {
    let forwards = steering || cfg.vips.iter().any(|v| v.mode() != crate::config::VipMode::Http);
    if !forwards {
        return None;
    }
    match crate::netif::veth::trap(&cfg.interface) {
        Ok(trap) => trap.map(|t| t.warning()),
        Err(e) => {
            tracing::debug!(interface = %cfg.interface, error = %e, "cannot tell whether the interface is a veth in the trap");
            None
        }
    }
}

/// Removes what `load_dispatcher` pinned under `dir` (and a pinned link), then the
/// directory itself. Missing files are fine: cleanup must be repeatable.
pub fn unpin_all(dir: &Path) -> Result<(), DataplaneError> {
    for name in MAP_NAMES.iter().copied().chain(["link", "prog"]) {
        let p = dir.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(DataplaneError::Io { what: format!("removing {}", p.display()), source }),
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataplaneError::Io { what: format!("removing {}", dir.display()), source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent built without bpf-linker (stub programs) says so instead of failing in
    /// the object parser.
    #[test]
    fn a_stub_program_is_refused_with_the_way_out() {
        let Err(e) = load_simple(&[], "pass") else { panic!("a stub program was loaded") };
        assert!(matches!(e, DataplaneError::Stub), "{e}");
        assert!(e.to_string().contains("cargo xtask build"));
    }
}
