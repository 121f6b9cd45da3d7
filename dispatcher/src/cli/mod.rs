//! The command line: one module per subcommand.

mod agent;
pub mod args;
mod check;
mod control;
mod decap;
mod run;
mod status;

use std::process::ExitCode;

use args::{Cli, Command};

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config, keep_dataplane } => run::run(&config, keep_dataplane),
        Command::Check { file } => check::check(&file),
        Command::Decap { iface, generic } => decap::decap(&iface, generic),
        Command::Status { config, json, watch, count } => status::status(&config, json, watch, count),
        Command::Drain { config, backend } => control::control(&config, &backend, control::Action::Drain),
        Command::Disable { config, backend } => control::control(&config, &backend, control::Action::Disable),
        Command::Enable { config, backend } => control::control(&config, &backend, control::Action::Enable),
        Command::Stop { config, detach } => agent::stop(&config, detach),
        Command::Metrics { config } => agent::metrics(&config),
        Command::Reload { config } => agent::reload(&config),
    }
}

type FilterHandle = tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Set when the configured level decides (no RUST_LOG): a reload may change it.
static LOG_FILTER: std::sync::OnceLock<FilterHandle> = std::sync::OnceLock::new();

/// Tracing to stderr at the configured level (RUST_LOG overrides).
pub fn init_logging(level: &str) {
    use tracing_subscriber::{layer::SubscriberExt as _, util::SubscriberInitExt as _, EnvFilter};
    let from_env = std::env::var("RUST_LOG").ok().and_then(|v| EnvFilter::try_new(v).ok());
    let env_decides = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(level));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .try_init()
        .is_ok();
    if installed && !env_decides {
        let _ = LOG_FILTER.set(handle);
    }
}

/// Applies a reloaded `dispatcher.log_level`; false when RUST_LOG decides the level.
pub fn set_log_level(level: &str) -> bool {
    let Some(handle) = LOG_FILTER.get() else { return false };
    handle.reload(tracing_subscriber::EnvFilter::new(level)).is_ok()
}

/// Blocks until SIGTERM or SIGINT.
pub fn wait_for_shutdown() -> anyhow::Result<&'static str> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(shutdown_signal())
}

/// Resolves on SIGTERM or SIGINT, naming it.
pub async fn shutdown_signal() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => Ok("SIGTERM"),
        _ = int.recv() => Ok("SIGINT"),
    }
}
