use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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

/// The configuration a command reads: `-c FILE`, or `-i NAME` for
/// /etc/dispatcher/NAME.toml (the file the unit dispatcher@NAME runs), else
/// /etc/dispatcher/default.toml (`cli::config_file`).
#[derive(Debug, Clone, Args)]
pub struct ConfigFile {
    /// The configuration file [default: /etc/dispatcher/default.toml].
    #[arg(long, short, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The configuration of instance NAME: /etc/dispatcher/NAME.toml, the file the unit
    /// dispatcher@NAME runs.
    #[arg(long, short, value_name = "NAME", conflicts_with = "config", value_parser = instance_name)]
    pub instance: Option<String>,
}

/// An instance name as `dispatcher.instance` takes it (it names a file here).
fn instance_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 64 || !s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err("1 to 64 letters, digits, '-' and '_' (the NAME of /etc/dispatcher/NAME.toml)".into());
    }
    Ok(s.to_string())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load and attach the XDP program, fill the maps from the configuration, serve until
    /// SIGTERM, SIGINT or `dispatcher stop` (SIGHUP reloads).
    Run {
        #[command(flatten)]
        config: ConfigFile,
        /// On exit, leave the program attached and the maps pinned (L4 forwarding goes on).
        #[arg(long)]
        keep_dataplane: bool,
        /// Serve, but do not join the group ([announce], [cluster]) until `dispatcher
        /// join`: a staged dispatcher.
        #[arg(long)]
        stay_out: bool,
    },
    /// Validate a configuration file; errors name the line and the field.
    Check {
        /// The file to check (the same as -c FILE).
        #[arg(value_name = "FILE", conflicts_with = "instance")]
        file: Option<PathBuf>,
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Print WebSphere's plugin-cfg.xml as this dispatcher's TOML (farms, backends,
    /// routes), names and patterns kept; warnings and errors name the file's line.
    Import {
        /// WebSphere's plugin-cfg.xml.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Attach the IPIP decapsulation program to a backend's interface until SIGTERM.
    Decap {
        /// The interface the tunnelled packets arrive on.
        #[arg(long, value_name = "IFACE")]
        iface: String,
        /// Attach in generic (skb) mode.
        #[arg(long)]
        generic: bool,
    },
    /// Attach the trivial pass program to a veth peer in native mode, so that the frames
    /// a dispatcher on the other end forwards with XDP are not dropped (the veth trap). It
    /// stays attached after the command exits, until --detach or the link goes away.
    XdpPass {
        /// The interface: the peer of the dispatcher's veth.
        #[arg(value_name = "IFACE")]
        iface: String,
        /// Act in network namespace NAME (/run/netns/NAME, as `ip netns` names it) or the
        /// one a path names.
        #[arg(long, value_name = "NAME")]
        netns: Option<String>,
        /// Remove the pass program instead (only the project's own).
        #[arg(long)]
        detach: bool,
    },
    /// Show VIPs, backends and XDP counters from the pinned maps.
    Status {
        #[command(flatten)]
        config: ConfigFile,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// The table as CSV (RFC 4180): a header line, one row per VIP and per backend.
        #[arg(long, conflicts_with = "json")]
        csv: bool,
        /// Refresh every SECS seconds (on a terminal, in place) until interrupted.
        #[arg(long, short, value_name = "SECS")]
        watch: Option<f64>,
        /// With --watch: stop after N frames.
        #[arg(long, requires = "watch", value_name = "N")]
        count: Option<u64>,
    },
    /// Let a backend finish its flows but take no new ones.
    Drain {
        #[command(flatten)]
        config: ConfigFile,
        /// A backend's name, or FARM/SERVER when several farms have a server of that name.
        backend: String,
    },
    /// Take a backend out now: its flows move to its peer replica.
    Disable {
        #[command(flatten)]
        config: ConfigFile,
        /// A backend's name, or FARM/SERVER when several farms have a server of that name.
        backend: String,
    },
    /// Put a drained or disabled backend back in service.
    Enable {
        #[command(flatten)]
        config: ConfigFile,
        /// A backend's name, or FARM/SERVER when several farms have a server of that name.
        backend: String,
    },
    /// Set a backend's weight (1..=10000) in the running agent, for new sessions and L4
    /// flows, until the next reload restores the configuration's.
    Weight {
        #[command(flatten)]
        config: ConfigFile,
        /// A backend's name, or FARM/SERVER when several farms have a server of that name.
        backend: String,
        /// The weight, 1..=10000 (to take no new sessions, drain the backend).
        weight: String,
    },
    /// Set a backend's maxconn (requests in flight at once, 1..=1000000, or none) in the
    /// running agent, until the next reload restores the configuration's.
    Maxconn {
        #[command(flatten)]
        config: ConfigFile,
        /// A backend's name, or FARM/SERVER when several farms have a server of that name.
        backend: String,
        /// Requests in flight at once, 1..=1000000, or none for no limit.
        maxconn: String,
    },
    /// Disable a backend's health checks (it counts as healthy; none are sent, failed
    /// requests are ignored) or enable them again, until the next reload.
    Checks {
        #[command(flatten)]
        config: ConfigFile,
        /// disable or enable.
        action: ChecksAction,
        /// A backend's name, or FARM/SERVER when several farms have a server of that name.
        backend: String,
    },
    /// Set the running agent's counters to zero (requests, errors, responses, failovers,
    /// retries, holds, queues); gauges stay.
    ClearCounters {
        #[command(flatten)]
        config: ConfigFile,
        /// The XDP counters in the maps too (packets, bytes, flows, drops).
        #[arg(long)]
        all: bool,
    },
    /// Make the running agent re-read its configuration file and apply the difference.
    Reload {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Print the agent's Prometheus metrics (from its admin socket).
    Metrics {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// List the clone table (clone and partition IDs -> backends: configured, learned
    /// here, taken from the store), or the SIP logical-name table; `delete ID` forgets a
    /// learned entry.
    Clones {
        #[command(flatten)]
        config: ConfigFile,
        /// `delete`: forget the learned entry ID (a configured one is refused).
        #[arg(value_name = "ACTION", value_parser = ["delete"], requires = "id")]
        action: Option<String>,
        /// The clone ID or logical name to delete (`#HASH` for an entry listed so).
        #[arg(value_name = "ID", requires = "action")]
        id: Option<String>,
        /// The SIP logical-name table instead of the clone table.
        #[arg(long)]
        sip: bool,
        /// Skip the first N entries (sorted by ID).
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: usize,
        /// Show at most N entries (1 to 10000).
        #[arg(long, value_name = "N", default_value_t = 100)]
        limit: usize,
        /// `delete`: also when its owner or the owner's replica can still serve its
        /// sessions (they are then balanced to servers that do not hold them).
        #[arg(long, requires = "action")]
        force: bool,
    },
    /// Print the last requests the agent refused as malformed (HAProxy's `show errors`):
    /// when, VIP, client, status, why, and what arrived, escaped.
    Errors {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Take this dispatcher out of a group behind ECMP: withdraw its VIPs, give its place
    /// in the ownership table to the others, and close each client connection after its
    /// next response; connections opened before go on meanwhile.
    Leave {
        #[command(flatten)]
        config: ConfigFile,
        /// Then wait until no client connection is left, or SECS pass (exit status 2).
        #[arg(long, value_name = "SECS")]
        wait: Option<f64>,
    },
    /// Put this dispatcher back: announce its VIPs and take its place in the ownership table.
    Join {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Print BIRD's static protocol that announces this configuration's VIPs ([announce]).
    BirdConfig {
        #[command(flatten)]
        config: ConfigFile,
    },
    /// Write the shell completions (bash, zsh, fish) generated from this command line,
    /// for packaging (the manual pages are written: man/).
    #[command(hide = true)]
    GenerateCompletions {
        /// The directory they go to.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Stop the running agent; the XDP program stays attached and the maps pinned (L4
    /// forwarding goes on).
    Stop {
        #[command(flatten)]
        config: ConfigFile,
        /// Also detach the program and remove the pinned maps (with no agent running too).
        #[arg(long)]
        detach: bool,
    },
}

/// `dispatcher checks disable|enable`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ChecksAction {
    Disable,
    Enable,
}
