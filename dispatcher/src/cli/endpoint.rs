//! Commands that ask the running agent (through its admin socket): `metrics`, `reload`,
//! `stop`, `join`, `leave`, `clear-counters`.

use std::{path::Path, process::ExitCode, time::Duration};

use anyhow::Context as _;
use dispatcher::{config::Config, dataplane};

use dispatcher::{
    admin::client::{explain, refusal, request, AdminError},
    api::{ReloadReply, StopReply},
};

pub fn metrics(path: &Path) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let (code, body) =
        request(&cfg.admin_socket, "GET", "/metrics").map_err(|e| anyhow::anyhow!(explain(&e, &cfg.instance)))?;
    anyhow::ensure!(code == 200, "the agent answered {code}");
    print!("{body}");
    Ok(ExitCode::SUCCESS)
}

pub fn reload(path: &Path) -> anyhow::Result<ExitCode> {
    // A file that does not validate is refused here already; the agent, which validates
    // it again, keeps running its current configuration either way.
    let cfg = match Config::load(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("reload refused: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    let (code, body) =
        request(&cfg.admin_socket, "POST", "/reload").map_err(|e| anyhow::anyhow!(explain(&e, &cfg.instance)))?;
    if code == 200 {
        let v: ReloadReply = serde_json::from_str(&body).context("the agent's answer to reload")?;
        println!("reloaded: {}", v.reloaded);
        if v.changes.is_empty() {
            println!("  no changes");
        }
        for c in &v.changes {
            println!("  {c}");
        }
        Ok(ExitCode::SUCCESS)
    } else {
        let why = refusal(&body);
        eprintln!("reload refused: {why}");
        Ok(ExitCode::from(1))
    }
}

/// `leave` / `join`.
pub fn membership(path: &Path, join: bool, wait: Option<f64>) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let target = if join { "/join" } else { "/leave" };
    let (code, body) =
        request(&cfg.admin_socket, "POST", target).map_err(|e| anyhow::anyhow!(explain(&e, &cfg.instance)))?;
    if code != 200 {
        let why = refusal(&body);
        eprintln!("{} refused: {why}", &target[1..]);
        return Ok(ExitCode::from(1));
    }
    let v: dispatcher::api::MembershipReply =
        serde_json::from_str(&body).context("the agent's answer to join/leave")?;
    println!("{}", v.membership);
    let Some(secs) = wait else { return Ok(ExitCode::SUCCESS) };
    let started = std::time::Instant::now();
    let limit = Duration::from_secs_f64(secs.max(0.0));
    loop {
        let open = request(&cfg.admin_socket, "GET", "/status")
            .ok()
            .and_then(|(_, b)| serde_json::from_str::<dispatcher::api::AgentStatus>(&b).ok())
            .map(|s| s.vips.iter().map(|v| v.connections).sum::<u64>())
            .unwrap_or(0);
        if open == 0 {
            println!("no client connection left after {} ms", started.elapsed().as_millis());
            return Ok(ExitCode::SUCCESS);
        }
        if started.elapsed() >= limit {
            println!("{open} client connections still open after {secs} s");
            return Ok(ExitCode::from(2));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `stop`: the agent finishes its requests and exits; the XDP program stays attached
/// and the maps pinned, so L4 forwarding goes on and a later `run` adopts them.
/// `stop --detach`: the same, then the program is detached and the maps unpinned (also
/// when no agent runs).
pub fn stop(path: &Path, detach: bool) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let dir = cfg.pin_dir();
    let target = if detach { "/stop?detach=true" } else { "/stop" };
    let agent = match request(&cfg.admin_socket, "POST", target) {
        Ok((202, body)) => {
            let v: StopReply = serde_json::from_str(&body).context("the agent's answer to stop")?;
            Some(v.pid as i32)
        }
        Ok((code, body)) => anyhow::bail!("the agent refused to stop ({code}): {}", refusal(&body)),
        Err(AdminError::NotRunning(_)) if dispatcher::instance::holder(&cfg.instance).is_none() => None,
        // An agent holds the instance but cannot be asked: it is not stopped, and its
        // data plane is not removed behind it.
        Err(e) => anyhow::bail!("{}; nothing done", explain(&e, &cfg.instance)),
    };
    if let Some(pid) = agent {
        // In-flight requests may take the drain time; give it a margin.
        let limit = cfg.http.drain_timeout + Duration::from_secs(10);
        print!("agent (pid {pid}) stopping");
        let started = std::time::Instant::now();
        while alive(pid) {
            if started.elapsed() > limit {
                println!();
                anyhow::bail!("the agent (pid {pid}) has not exited after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!(": stopped after {} ms", started.elapsed().as_millis());
    }
    match (agent.is_some(), detach) {
        (_, true) => {
            // The agent removed them; with no agent, this does (the link's pin going
            // detaches the program).
            // Under the instance's lock: never behind an agent.
            let _lock = dispatcher::instance::acquire(&cfg.instance).map_err(|e| anyhow::anyhow!("{e}; nothing removed"))?;
            dataplane::unpin_all(&dir)?;
            dataplane::ids::remove(&cfg.instance);
            println!("data plane removed: program detached, maps unpinned under {}", dir.display());
            if let Some(root) = dataplane::release_bpffs(&dir) {
                println!("unmounted the bpffs the agent had mounted on {} (empty before)", root.display());
            }
        }
        // Said only if true: pins removed under the agent take the data plane with it.
        (true, false) if dir.join("link").exists() && dir.join("FLOWS").exists() => println!(
            "XDP forwarding goes on from the maps pinned under {}; `dispatcher run` adopts them, `dispatcher stop --detach` removes them",
            dir.display()
        ),
        (true, false) => {
            println!(
                "the pins under {} were gone when the agent exited: the program is detached and the flows are lost; `dispatcher run` starts afresh",
                dir.display()
            );
            return Ok(ExitCode::FAILURE);
        }
        (false, false) => println!(
            "no agent running for instance {}; the data plane under {} is left as it is (`--detach` removes it)",
            cfg.instance,
            dir.display()
        ),
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a process still runs (an exited one its parent has not reaped yet is a
/// zombie: it does not).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()) != Some('Z'),
        Err(_) => false,
    }
}

/// `clear-counters` (`--all`: the XDP counters too).
pub fn clear_counters(path: &Path, all: bool) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let target = if all { "/counters/clear?all=true" } else { "/counters/clear" };
    let (code, body) =
        request(&cfg.admin_socket, "POST", target).map_err(|e| anyhow::anyhow!(explain(&e, &cfg.instance)))?;
    if code != 200 {
        eprintln!("clear-counters refused: {}", refusal(&body));
        return Ok(ExitCode::from(1));
    }
    let v: dispatcher::api::ClearReply = serde_json::from_str(&body).context("the agent's answer to clear-counters")?;
    println!("cleared: {}", v.cleared);
    Ok(ExitCode::SUCCESS)
}
