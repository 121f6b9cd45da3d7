//! Builds the XDP programs (`dispatcher-ebpf`) with nightly and bpf-linker, so that every
//! build of the agent embeds current kernel code. `cargo xtask setup` installs the tools.

use std::{env, path::PathBuf};

use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    // bpf-linker is installed per LLVM version under the user's cache by `cargo xtask
    // setup`; put every such directory on PATH for the nested eBPF build.
    let home = env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    let tools = home.join(".cache/dispatcher");
    let mut paths: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&tools) {
        for e in entries.flatten() {
            let bin = e.path().join("bin");
            if bin.join("bpf-linker").exists() {
                paths.push(bin);
            }
        }
    }
    paths.extend(env::split_paths(&env::var_os("PATH").unwrap_or_default()));
    if !paths.iter().any(|p| p.join("bpf-linker").exists()) {
        return Err(anyhow!("bpf-linker not found: run `cargo xtask setup` first"));
    }
    // SAFETY: build scripts are single-threaded.
    unsafe { env::set_var("PATH", env::join_paths(paths)?) };

    let meta = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = meta
        .packages
        .iter()
        .find(|p| p.name == "dispatcher-ebpf")
        .ok_or_else(|| anyhow!("dispatcher-ebpf package not in the workspace"))?;
    let root = ebpf.manifest_path.parent().ok_or_else(|| anyhow!("manifest without a parent"))?;
    let common = meta
        .packages
        .iter()
        .find(|p| p.name == "dispatcher-common")
        .and_then(|p| p.manifest_path.parent().map(|d| d.to_string()));
    if let Some(common) = common {
        println!("cargo:rerun-if-changed={common}");
    }
    aya_build::build_ebpf(
        [aya_build::Package { name: "dispatcher-ebpf", root_dir: root.as_str(), ..Default::default() }],
        aya_build::Toolchain::default(),
    )
}
