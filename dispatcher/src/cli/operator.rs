//! `drain`, `disable`, `enable`: through the agent's admin endpoint; with no agent
//! running, directly on the pinned maps (state and rings), which the XDP program reads on
//! every packet and a starting agent adopts. `weight`, `maxconn`, `checks`: the running
//! agent's only (they last until its next reload).

use std::{path::Path, process::ExitCode};

use anyhow::{anyhow, Context as _};
use dispatcher::{config::Config, dataplane::tables::Tables};
use dispatcher_common::{effective_state, BackendState, Health, Operator};

#[derive(Clone, Copy, Debug)]
pub enum Action {
    Drain,
    Disable,
    Enable,
}

pub fn control(path: &Path, backend: &str, action: Action) -> anyhow::Result<ExitCode> {
    // Ids as the pinned maps know them (by name), not file positions.
    let cfg = dispatcher::dataplane::ids::placed(Config::load(path)?).map_err(|e| anyhow::anyhow!(e))?;
    let verb = match action {
        Action::Drain => "drain",
        Action::Disable => "disable",
        Action::Enable => "enable",
    };
    // The running agent applies it (and answers with the resulting state).
    match dispatcher::admin::client::request(&cfg.admin_socket, "POST", &format!("/backends/{backend}/{verb}")) {
        Ok((200, body)) => {
            let v: dispatcher::api::CommandReply = serde_json::from_str(&body)?;
            println!("{backend}: {} -> {}", v.from, v.to);
            return Ok(ExitCode::SUCCESS);
        }
        Ok((_, body)) => {
            eprintln!("{verb} {backend}: {}", dispatcher::admin::client::refusal(&body));
            return Ok(ExitCode::from(1));
        }
        Err(dispatcher::admin::client::AdminError::NotRunning(_)) => {}
        Err(e) => anyhow::bail!(
            "{}; nothing changed (the maps are not written while an agent holds the instance)",
            dispatcher::admin::client::explain(&e, &cfg.instance)
        ),
    }
    // Only with no agent at all are the maps written directly, and under the instance's
    // lock: never behind a running agent, and no agent starts in the middle.
    let _lock = dispatcher::instance::acquire(&cfg.instance)
        .map_err(|e| anyhow!("{e}; nothing changed (the maps are not written while an agent holds the instance)"))?;
    println!("(agent not running: writing the pinned maps directly)");
    let id = dispatcher::admin::server_named(&cfg, backend).map_err(|e| anyhow!("{e} in {}", path.display()))?;
    let mut tables = Tables::from_pinned(&cfg.pin_dir())
        .with_context(|| format!("opening the maps of instance {} (is the dispatcher running?)", cfg.instance))?;
    let mut states = Vec::with_capacity(cfg.backends.len());
    for i in 0..cfg.backends.len() {
        states.push(tables.backend(i as u32)?.state);
    }
    let op = match action {
        Action::Drain => Operator::Drain,
        Action::Disable => Operator::Disabled,
        Action::Enable => Operator::None,
    };
    let old = BackendState::from_u8(states[id]);
    let mut info = tables.backend(id as u32)?;
    // The health the last agent saw stays; the operator's state changes beside it.
    let state = effective_state(op, Health::from_u8(info.state));
    states[id] = state as u8;
    info.state = state as u8;
    info.admin = op as u8;
    // Ring first when the backend leaves (no new flow picks it), state first when it
    // joins (a flow picking it finds it up).
    if state == BackendState::Up {
        tables.set_backend(id as u32, &info)?;
    }
    for (vi, v) in cfg.vips.iter().enumerate() {
        if v.backends.contains(&id) {
            tables.adopt_ring(vi as u32, v.ring_size())?;
            tables.rebuild_ring(vi as u32, v, &cfg, &states)?;
        }
    }
    if state != BackendState::Up {
        tables.set_backend(id as u32, &info)?;
    }
    println!("{backend}: {} -> {}", old.name(), state.name());
    Ok(ExitCode::SUCCESS)
}

/// What the operator typed, as a query value: passed on when it is plain (the agent
/// checks the range), else replaced by a mark the agent refuses in words.
pub fn query_value(v: &str) -> String {
    if !v.is_empty()
        && v.len() <= 24
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'+' || b == b'.')
    {
        v.to_string()
    } else {
        "(unreadable)".into()
    }
}

/// `weight`, `maxconn`, `checks`: `action` (with its query) on the running agent.
pub fn setting(path: &Path, backend: &str, action: &str) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let verb = action.split('?').next().unwrap_or(action);
    match dispatcher::admin::client::request(&cfg.admin_socket, "POST", &format!("/backends/{backend}/{action}")) {
        Ok((200, body)) => {
            let v: dispatcher::api::CommandReply = serde_json::from_str(&body)?;
            println!("backend {backend}: {}", v.change);
            if v.from != v.to {
                println!("backend {backend}: {} -> {}", v.from, v.to);
            }
            Ok(ExitCode::SUCCESS)
        }
        Ok((_, body)) => {
            eprintln!("{verb} {backend}: {}", dispatcher::admin::client::refusal(&body));
            Ok(ExitCode::from(1))
        }
        Err(e) => anyhow::bail!(
            "{}; nothing changed (a runtime {verb} is the running agent's, until its next reload)",
            dispatcher::admin::client::explain(&e, &cfg.instance)
        ),
    }
}
