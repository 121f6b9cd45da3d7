//! `cargo xtask setup|build|test|demo|bench|testbed|package`: everything around the code.

mod package;
mod setup;

use std::process::{Command, ExitCode};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what this machine lacks: rust-src, bpf-linker for the nightly's LLVM,
    /// Debian packages. Idempotent.
    Setup,
    /// Formatting (`cargo fmt --check`) and clippy with warnings as errors, on the host
    /// crates and on the XDP crate (nightly, for its BPF target), as CI runs them.
    Lint,
    /// Set up, then build the agent (with its embedded XDP programs).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Set up, build, and run every test: unit, XDP fixtures, namespace integration.
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build the Debian package (target/package/dispatcher_<version>_amd64.deb): the agent,
    /// systemd units, an example configuration, manual pages, shell completions.
    Package {
        /// Where the package goes (default: target/package).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// The guided tour: a testbed, L4 and HTTP traffic, a drain, a crash and a recovery, a live view.
    Demo {
        /// Seconds of traffic.
        #[arg(long, default_value_t = 24)]
        seconds: u64,
        /// The tour behind a BIRD router with ECMP: N dispatchers (2-4), one joining, one
        /// leaving, one dying.
        #[arg(long)]
        dispatchers: Option<usize>,
        /// The HTTP VIP as an HTTPS VIP: the agent terminates TLS, the clients speak HTTPS.
        #[arg(long)]
        tls: bool,
    },
    /// Benchmarks, each against its peers measured in the same run (a trivial XDP program,
    /// HAProxy, nginx, nftables, Kamailio). Flags: one per benchmark (`--xdp`, `--http`,
    /// `--tls`...; none: all of them) and `--quick` (fewer runs per case); `--list` names
    /// them all. The bench program holds their list (tools/src/bin/bench/main.rs).
    Bench {
        /// Flags for the bench program.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Copy each section of target/bench/report.md (from the last full `cargo xtask bench`)
    /// into docs/benchmarks.md, between that benchmark's markers.
    BenchDocs,
    /// Bring a namespace testbed up (and leave it) or take it down: `up`, `down`.
    Testbed {
        action: String,
        /// With `up`: N dispatchers sharing a 3-member etcd cluster (etcd started and left
        /// running; `down` stops it).
        #[arg(long)]
        dispatchers: Option<usize>,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Cmd::Setup => setup::setup(),
        Cmd::Lint => {
            setup::setup()?;
            step("cargo fmt --check");
            run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
            step("clippy: the host crates");
            run_cmd(cargo().args(["clippy", "--all-targets", "--", "-D", "warnings"]))?;
            step("clippy: the XDP programs (nightly, BPF target)");
            let target_dir = workspace_root().join("target/ebpf-clippy");
            let mut cmd = Command::new("rustup");
            cmd.args(["run", "nightly", "cargo", "clippy", "--package", "dispatcher-ebpf", "--bins", "--release"])
                .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core", "--target-dir"])
                .arg(&target_dir)
                .args(["--", "-D", "warnings", "--cfg", "bpf_target_arch=\"x86_64\""])
                .current_dir(workspace_root().join("dispatcher-ebpf"));
            for key in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER", "RUSTFLAGS", "CARGO_BUILD_RUSTFLAGS", "CARGO"] {
                cmd.env_remove(key);
            }
            run_cmd(&mut cmd)
        }
        Cmd::Build { release } => {
            setup::setup()?;
            build(release)
        }
        Cmd::Test { args } => {
            require_root("the tests load BPF programs and create network namespaces")?;
            setup::setup()?;
            build(false)?;
            step("running the tests");
            let mut cmd = cargo();
            cmd.arg("test").args(&args);
            let result = run_cmd(&mut cmd);
            remove_empty_shared_dirs();
            result
        }
        Cmd::Demo { seconds, dispatchers, tls } => {
            require_root("the demo loads BPF programs and creates network namespaces")?;
            setup::setup()?;
            build(false)?;
            let mut args = vec!["--seconds".to_string(), seconds.to_string()];
            if let Some(n) = dispatchers {
                anyhow::ensure!((2..=4).contains(&n), "--dispatchers: 2 to 4 (one more joins during the tour)");
                args.extend(["--dispatchers".to_string(), n.to_string()]);
                anyhow::ensure!(!tls, "--tls goes with the single-dispatcher tour");
            }
            if tls {
                args.push("--tls".to_string());
            }
            exec_built("demo", &args)
        }
        Cmd::Bench { args } => {
            require_root("the benchmarks load BPF programs and create network namespaces")?;
            setup::setup()?;
            build(true)?;
            // The peers the chosen benchmarks measure, as the bench program lists them.
            let out = Command::new(built_exe("bench", "release"))
                .arg("--packages")
                .args(&args)
                .output()
                .context("running the bench program")?;
            if !out.status.success() {
                bail!("{}", String::from_utf8_lossy(&out.stderr));
            }
            let packages = String::from_utf8(out.stdout)?;
            setup::ensure_packages(&packages.lines().collect::<Vec<_>>())?;
            exec_built_profile("bench", &args, "release")
        }
        Cmd::BenchDocs => bench_docs(),
        Cmd::Package { out } => {
            setup::setup()?;
            build(true)?;
            package::package(out).map(|_| ())
        }
        Cmd::Testbed { action, dispatchers } => {
            require_root("the testbed creates network namespaces")?;
            if !["up", "down"].contains(&action.as_str()) {
                bail!("testbed: expected `up` or `down`, got `{action}`");
            }
            if let Some(n) = dispatchers {
                if action != "up" || !(1..=4).contains(&n) {
                    bail!("testbed: --dispatchers N goes with `up`, N from 1 to 4");
                }
            }
            setup::setup()?;
            build(false)?;
            let mut args = vec![action];
            if let Some(n) = dispatchers {
                args.extend(["--dispatchers".to_string(), n.to_string()]);
            }
            exec_built("testbed", &args)
        }
    }
}

/// Runs one of the programs of the `tools` crate (demo, bench, testbed) from the build
/// just made. They are not part of xtask itself: xtask must compile on a fresh machine,
/// before `setup` has installed what the XDP programs need.
fn exec_built(program: &str, args: &[String]) -> anyhow::Result<()> {
    exec_built_profile(program, args, "debug")
}

fn exec_built_profile(program: &str, args: &[String], profile: &str) -> anyhow::Result<()> {
    let mut cmd = Command::new(built_exe(program, profile));
    cmd.args(args);
    let result = run_cmd(&mut cmd);
    remove_empty_shared_dirs();
    result
}

/// A program of the build just made (`profile`: debug or release).
fn built_exe(program: &str, profile: &str) -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    target.join(profile).join(program)
}

pub fn step(what: &str) {
    eprintln!("==> {what}");
}

pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace_root());
    // The agent's build script must build the XDP programs, never stub them.
    cmd.env("DISPATCHER_EBPF", "required");
    cmd
}

pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

pub fn run_cmd(cmd: &mut Command) -> anyhow::Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}

fn build(release: bool) -> anyhow::Result<()> {
    step(&format!("building the agent and its XDP programs ({})", if release { "release" } else { "debug" }));
    let mut cmd = cargo();
    cmd.args(["build", "--bins"]);
    if release {
        cmd.arg("--release");
    }
    run_cmd(&mut cmd)
}

fn require_root(why: &str) -> anyhow::Result<()> {
    if !nix_is_root() {
        bail!("run as root: {why}");
    }
    Ok(())
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// docs/benchmarks.md holds one block per benchmark, between `<!-- bench:start TITLE -->`
/// (TITLE: the section's title in report.md) and `<!-- bench:end -->`.
const BENCH_START: &str = "<!-- bench:start ";
const BENCH_END: &str = "<!-- bench:end -->";

/// Puts each `### TITLE` section of the last report into docs/benchmarks.md's block of
/// that title, so that every block shows the latest full run of its benchmark; the text
/// around the blocks is left as it is.
fn bench_docs() -> anyhow::Result<()> {
    let root = workspace_root();
    let report = std::fs::read_to_string(root.join("target/bench/report.md"))
        .context("target/bench/report.md: run `cargo xtask bench` first")?;
    let json = std::fs::read_to_string(root.join("target/bench/report.json")).unwrap_or_default();
    if json.contains("\"quick\":true") {
        bail!("the last report comes from a --quick run: run the full `cargo xtask bench` for docs/benchmarks.md");
    }
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_string()))
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let measured = format!("Measured by `cargo xtask bench` on {cpus} vCPU ({cpu}), kernel {}.", kernel.trim());
    let path = root.join("docs/benchmarks.md");
    let mut page = std::fs::read_to_string(&path)?;
    let mut updated = Vec::new();
    for (title, table) in report_sections(&report) {
        let start = format!("{BENCH_START}{title} -->");
        let Some(a) = page.find(&start) else {
            bail!("docs/benchmarks.md has no block for \"{title}\": add `{start}` ... `{BENCH_END}` where it belongs");
        };
        let body = a + start.len();
        let Some(b) = page[body..].find(BENCH_END).map(|b| body + b) else {
            bail!("docs/benchmarks.md: `{start}` has no `{BENCH_END}` after it");
        };
        page.replace_range(body..b, &format!("\n\n{measured}\n\n{}\n\n", table.trim()));
        updated.push(title);
    }
    std::fs::write(&path, page)?;
    step(&format!("docs/benchmarks.md updated from target/bench/report.md: {}", updated.join("; ")));
    Ok(())
}

/// The `### TITLE` sections of report.md: (title, what follows it up to the next one).
fn report_sections(report: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in report.lines() {
        if let Some(title) = line.strip_prefix("### ") {
            sections.push((title.trim().to_string(), String::new()));
        } else if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    sections
}

/// Each testbed removes its own pins and socket; the shared parents they were made in
/// go here, once no test, demo or bench runs any more (a testbed removing them could race another
/// agent creating its own). `remove_dir` keeps a directory something else still uses.
fn remove_empty_shared_dirs() {
    for dir in ["/sys/fs/bpf/dispatcher", "/run/dispatcher"] {
        let _ = std::fs::remove_dir(dir);
    }
}
