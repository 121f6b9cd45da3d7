//! Builds the XDP programs (`dispatcher-ebpf`) with nightly and bpf-linker, so that every
//! build of the agent embeds current kernel code. `cargo xtask setup` installs the tools.
//!
//! Without bpf-linker (a plain `cargo check` or clippy on a machine that never ran the
//! setup) the programs are empty stubs, with a warning, and an agent built so refuses to
//! load them and says why. `DISPATCHER_EBPF=required` (every `cargo xtask` build sets it)
//! makes a missing tool an error instead.

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
    println!("cargo:rerun-if-env-changed=DISPATCHER_EBPF");
    let required = env::var("DISPATCHER_EBPF").is_ok_and(|v| v == "required");
    let meta = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = meta
        .packages
        .iter()
        .find(|p| p.name == "dispatcher-ebpf")
        .ok_or_else(|| anyhow!("dispatcher-ebpf package not in the workspace"))?;
    // The programs are the crate's binaries (src/bin or [[bin]]), not a list of our own.
    let bins: Vec<String> = ebpf.targets.iter().filter(|t| t.is_bin()).map(|t| t.name.clone()).collect();
    if !paths.iter().any(|p| p.join("bpf-linker").exists()) {
        if required {
            return Err(anyhow!("bpf-linker not found: run `cargo xtask setup` first"));
        }
        println!("cargo:warning=bpf-linker not found: the XDP programs are empty stubs (an agent built so cannot run); `cargo xtask build` installs the tools and builds them");
        let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
        for bin in &bins {
            std::fs::write(out_dir.join(bin), b"").with_context(|| format!("writing the stub of {bin}"))?;
        }
        return Ok(());
    }
    // SAFETY: build scripts are single-threaded.
    unsafe { env::set_var("PATH", env::join_paths(paths)?) };

    let root = ebpf.manifest_path.parent().ok_or_else(|| anyhow!("manifest without a parent"))?;
    let common = meta
        .packages
        .iter()
        .find(|p| p.name == "dispatcher-common")
        .and_then(|p| p.manifest_path.parent().map(|d| d.to_string()));
    if let Some(common) = common {
        println!("cargo:rerun-if-changed={common}");
    }
    build_ebpf(root.as_str(), &bins)
}

/// The programs of `dispatcher-ebpf`, built as aya-build 0.2 builds them (nightly,
/// `build-std=core`, BTF, `bpf_target_arch` set) plus one code-generation flag it cannot
/// be given: `allows-misaligned-mem-access`. Packet headers have no alignment guarantee,
/// so without it LLVM splits every multi-byte header access into single bytes; the
/// kernel takes unaligned packet and map-value accesses on x86-64 and arm64 (the verifier
/// is strict only where the CPU is), so with it a 4-byte field is one load. The stack is
/// always accessed aligned (LLVM knows its alignment).
fn build_ebpf(root: &str, bins: &[String]) -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed={root}");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").ok_or_else(|| anyhow!("OUT_DIR not set"))?);
    let endian = env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN")?;
    let target = if endian == "big" { "bpfeb-unknown-none" } else { "bpfel-unknown-none" };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH")?;
    let target_dir = out_dir.join("ebpf-target");
    let flags = [
        format!("--cfg=bpf_target_arch=\"{arch}\""),
        "-Cdebuginfo=2".into(),
        "-Clink-arg=--btf".into(),
        "-Ctarget-feature=+allows-misaligned-mem-access".into(),
    ];
    let mut cmd = std::process::Command::new("rustup");
    cmd.args(["run", "nightly", "cargo", "build", "--package", "dispatcher-ebpf", "--bins", "--release"])
        .args(["--target", target, "-Z", "build-std=core", "--target-dir"])
        .arg(&target_dir)
        .current_dir(root)
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    // The host build's compiler settings must not leak into the nightly one.
    for key in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS"] {
        cmd.env_remove(key);
    }
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        // Progress and warnings show with `-vv`; errors are printed below as well.
        println!("cargo:warning={line}");
    }
    if !out.status.success() {
        return Err(anyhow!("building the XDP programs failed: {cmd:?}: {}", out.status));
    }
    for bin in bins {
        let built = target_dir.join(target).join("release").join(bin);
        std::fs::copy(&built, out_dir.join(bin)).with_context(|| format!("copying {}", built.display()))?;
    }
    Ok(())
}
