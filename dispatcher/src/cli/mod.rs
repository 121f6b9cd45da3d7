//! The command line: one module per subcommand.

mod admin_client;
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
        Command::Status { config, json } => status::status(&config, json),
        Command::Drain { config, backend } => control::control(&config, &backend, control::Action::Drain),
        Command::Disable { config, backend } => control::control(&config, &backend, control::Action::Disable),
        Command::Enable { config, backend } => control::control(&config, &backend, control::Action::Enable),
        Command::Stop { config, detach: _ } => run::stop(&config),
        Command::Metrics { config } => status::metrics(&config),
        Command::Reload { config } => status::reload(&config),
    }
}

/// Tracing to stderr at the configured level (RUST_LOG overrides).
pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
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
