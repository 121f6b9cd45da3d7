use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dispatcher",
    version,
    about = "XDP-assisted L4+L7 dispatcher for replicated application server clusters"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load and attach the XDP program, fill the maps from FILE, run until SIGTERM.
    Run {
        #[arg(long, short)]
        config: PathBuf,
        /// On exit, leave the program attached and the maps pinned (L4 forwarding goes on).
        #[arg(long)]
        keep_dataplane: bool,
    },
    /// Validate a configuration file; errors name the line and the field.
    Check { file: PathBuf },
    /// Print WebSphere's plugin-cfg.xml as this dispatcher's TOML (farms, backends,
    /// routes), names and patterns kept; warnings and errors name the file's line.
    Import { file: PathBuf },
    /// Attach the IPIP decapsulation program to a backend's interface until SIGTERM.
    Decap {
        #[arg(long)]
        iface: String,
        /// Attach in generic (skb) mode.
        #[arg(long)]
        generic: bool,
    },
    /// Show VIPs, backends and XDP counters from the pinned maps.
    Status {
        #[arg(long, short)]
        config: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Refresh every SECS seconds (on a terminal, in place) until interrupted.
        #[arg(long, short, value_name = "SECS")]
        watch: Option<f64>,
        /// With --watch: stop after N frames.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
    },
    /// Let a backend finish its flows but take no new ones.
    Drain {
        #[arg(long, short)]
        config: PathBuf,
        backend: String,
    },
    /// Take a backend out now: its flows move to its peer replica.
    Disable {
        #[arg(long, short)]
        config: PathBuf,
        backend: String,
    },
    /// Put a drained or disabled backend back in service.
    Enable {
        #[arg(long, short)]
        config: PathBuf,
        backend: String,
    },
    /// Make the running agent re-read its configuration file and apply the difference.
    Reload {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print the agent's Prometheus metrics (from its admin socket).
    Metrics {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Take this dispatcher out of a group behind ECMP: withdraw its VIPs, give its place
    /// in the ownership table to the others, and close each client connection after its
    /// next response; connections opened before go on meanwhile. `--wait SECS`: wait until
    /// no client connection is left (or SECS pass), then report.
    Leave {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long, value_name = "SECS")]
        wait: Option<f64>,
    },
    /// Put this dispatcher back: announce its VIPs and take its place in the ownership table.
    Join {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print BIRD's static protocol that announces this configuration's VIPs ([announce]).
    BirdConfig {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Write the manual pages (section 8, one per subcommand) and the shell completions
    /// (bash, zsh, fish) generated from this command line, for packaging.
    #[command(hide = true)]
    GenerateDocs {
        /// Pages go to DIR/man8, completions to DIR/completions.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Stop the running agent; the XDP program stays attached and the maps pinned (L4
    /// forwarding goes on). `--detach`: also detach the program and remove the maps.
    Stop {
        #[arg(long, short)]
        config: PathBuf,
        #[arg(long)]
        detach: bool,
    },
}
