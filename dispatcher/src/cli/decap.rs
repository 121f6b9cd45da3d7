use std::process::ExitCode;

use anyhow::Context as _;
use dispatcher::{config::XdpAttachMode, dataplane};

pub fn decap(iface: &str, generic: bool) -> anyhow::Result<ExitCode> {
    super::init_logging("info");
    let mut ebpf = dataplane::load_decap()?;
    let mode = if generic { XdpAttachMode::Generic } else { XdpAttachMode::Auto };
    let (link, how) =
        dataplane::attach(&mut ebpf, "decap", iface, mode).with_context(|| format!("attaching decap to {iface}"))?;
    tracing::info!(interface = iface, mode = ?how, "decap attached");
    let why = dispatcher::agent::wait_for_shutdown()?;
    drop(link);
    tracing::info!(signal = why, "decap detached");
    Ok(ExitCode::SUCCESS)
}
