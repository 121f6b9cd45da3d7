//! Idempotent installation of what building and testing need. Each step checks first and
//! says when there is nothing to do.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, bail, Context as _};

use crate::{run_cmd, step};

/// bpf-linker release known to build against the nightly compiler's own libLLVM.
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian packages the tests and the demo use: ip (iproute2), ethtool, tcpdump for
/// debugging a testbed, ping, and promtool (package prometheus; its service is not
/// started here) to check the metrics exposition.
const PACKAGES: &[&str] = &[
    "iproute2",
    "ethtool",
    "iputils-ping",
    "tcpdump",
    "bpftool",
    "prometheus",
    "etcd-server",
    "etcd-client",
    // protoc and the well-known .proto files (google/protobuf/*.proto, in the -dev
    // package, a mere recommendation of protobuf-compiler) for etcd-client's build.
    "protobuf-compiler",
    "libprotobuf-dev",
    // BIRD 2: BGP on the dispatcher hosts and the router of the scale-out testbed.
    "bird2",
    // SIPp: the SIP caller of the SIP VIP tests and demo.
    "sip-tester",
    // The TLS tests' certificates (openssl) and clients (curl, openssl s_client, Python's
    // ssl), and the system roots backend TLS verifies against by default.
    "openssl",
    "curl",
    "python3",
    "ca-certificates",
    // HTTP/2: h2load and nghttp (nghttp2-client), and Python's h2 library (python3-h2, for
    // /usr/bin/python3, with hpack) for the scripted clients and attacks of the HTTP/2
    // namespace tests (tests/fixtures/h2_clients.py) and the idle connections of
    // `cargo xtask bench --h2`.
    "nghttp2-client",
    "python3-h2",
    // The package: dpkg-deb builds it, lintian checks it, systemd-analyze verifies its
    // units offline (systemd need not run), strip (binutils) shrinks its binary, and the
    // package test reads the binary's libraries with objdump (binutils) and ldd.
    "lintian",
    "systemd",
    "binutils",
    // dpkg-shlibdeps: the package's Depends, from the libraries the loader would load
    // for its binary (by their real, this architecture's path) and their packages'
    // symbols files. Lintian pulls it in today; named here since the package needs it.
    "dpkg-dev",
    // The capability test records the agent's system calls against its unit's filter.
    "strace",
    // halog (in the haproxy package) reads the access log's `haproxy` format in the
    // access-log test; the benchmarks also measure haproxy itself.
    "haproxy",
    // nft: the takeover test loses a client's segment on purpose; the L4 benchmark's
    // nftables DNAT row.
    "nftables",
    // Headless Chromium: the status page's test loads it in a real browser.
    "chromium",
];

pub fn setup() -> anyhow::Result<()> {
    let mut did = Vec::new();
    if ensure_nightly_rust_src()? {
        did.push("rust-src");
    }
    if ensure_lint_components()? {
        did.push("rustfmt and clippy");
    }
    if ensure_bpf_linker()? {
        did.push("bpf-linker");
    }
    if ensure_packages(PACKAGES)? {
        did.push("Debian packages");
    }
    if did.is_empty() {
        step("setup: everything already installed, nothing to do");
    } else {
        step(&format!("setup: installed {}", did.join(", ")));
    }
    Ok(())
}

pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    let s = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("a nightly toolchain is needed to build the XDP programs (rustup toolchain install nightly)")?;
    Ok(PathBuf::from(s.trim()))
}

fn ensure_nightly_rust_src() -> anyhow::Result<bool> {
    let core = nightly_sysroot()?.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if core.exists() {
        return Ok(false);
    }
    step("installing rust-src for the nightly toolchain (needed for -Z build-std=core)");
    run_cmd(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))?;
    Ok(true)
}

/// rustfmt and clippy for the host toolchain, clippy for the nightly one (`cargo xtask
/// lint`, which CI runs).
fn ensure_lint_components() -> anyhow::Result<bool> {
    let has = |toolchain: &str, tool: &str| {
        Command::new("rustup").args(["run", toolchain, tool, "--version"]).output().is_ok_and(|o| o.status.success())
    };
    let mut did = false;
    for (toolchain, component, tool) in
        [("stable", "rustfmt", "rustfmt"), ("stable", "clippy", "cargo-clippy"), ("nightly", "clippy", "cargo-clippy")]
    {
        if !has(toolchain, tool) {
            step(&format!("installing {component} for the {toolchain} toolchain"));
            run_cmd(Command::new("rustup").args(["component", "add", component, "--toolchain", toolchain]))?;
            did = true;
        }
    }
    Ok(did)
}

/// The LLVM major version of the nightly compiler (`LLVM version: 22.1.4` -> 22).
fn nightly_llvm_major() -> anyhow::Result<u32> {
    let vv = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let line = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .ok_or_else(|| anyhow!("no LLVM version in rustc -vV"))?;
    line.split('.').next().unwrap_or("").trim().parse().with_context(|| format!("LLVM version `{line}`"))
}

/// Where bpf-linker for LLVM `major` lives; the agent's build script looks here too.
pub fn tools_dir(major: u32) -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
    home.join(".cache/dispatcher").join(format!("llvm-{major}"))
}

fn ensure_bpf_linker() -> anyhow::Result<bool> {
    let major = nightly_llvm_major()?;
    let dir = tools_dir(major);
    let bin = dir.join("bin/bpf-linker");
    if bin.exists() && Command::new(&bin).arg("--version").output().map(|o| o.status.success()).unwrap_or(false) {
        return Ok(false);
    }
    step(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against the nightly compiler's LLVM {major} (about a minute)"
    ));
    // bpf-linker links against libLLVM; the nightly toolchain ships one. Present it under
    // the names the link step (libLLVM.so) and the loader (its soname) look for.
    let sysroot = nightly_sysroot()?;
    let libllvm = std::fs::read_dir(sysroot.join("lib"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libLLVM.so.")))
        .ok_or_else(|| anyhow!("no libLLVM.so.* in {}/lib", sysroot.display()))?;
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib)?;
    for name in [Path::new("libLLVM.so"), Path::new(libllvm.file_name().unwrap())] {
        let link = lib.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&libllvm, &link).with_context(|| format!("symlink {}", link.display()))?;
    }
    run_cmd(
        Command::new("cargo")
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--no-default-features"])
            .args(["--features", &format!("llvm-{major}"), "--root"])
            .arg(&dir)
            .env("LLVM_PREFIX", &dir)
            // Not from inside the workspace: its toolchain settings must not apply.
            .current_dir(std::env::temp_dir()),
    )?;
    Ok(true)
}

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Installs the Debian packages that are missing; returns whether it installed any.
pub fn ensure_packages(pkgs: &[&str]) -> anyhow::Result<bool> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(false);
    }
    step(&format!("installing Debian packages: {}", missing.join(" ")));
    run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
    run_cmd(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    Ok(true)
}
