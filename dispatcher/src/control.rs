//! The control loop: health checks, failed requests and the operator's overrides decide
//! each backend's state; a change is written to `BACKENDS`, the rings of its VIPs are
//! rebuilt, and a backend that goes out of service hands its L4 flows and its `CLONES`
//! entries to its peer replica (given back when it returns).

use std::sync::{atomic::Ordering, Arc, Mutex};

use dispatcher_common::{stats, BackendState, FlowValue, Operator};
use std::time::Duration;
use tokio::sync::mpsc;

use crate::{
    config::Config,
    dataplane::tables::{backend_info, Tables},
    health::{self, Cause, Probe, Reason, Streak},
    state::{ramp_share, Change, Event, Servers},
};

const RAMP_STEP_MIN: std::time::Duration = std::time::Duration::from_millis(100);
const RAMP_STEP_MAX: std::time::Duration = std::time::Duration::from_secs(1);

struct Control {
    cfg: Config,
    servers: Arc<Servers>,
    tables: Arc<Mutex<Tables>>,
    /// What this loop last wrote to BACKENDS for each backend (the request path may have
    /// moved the mirror since: a passive failure).
    written: Vec<BackendState>,
}

impl Control {
    /// Applies a change of effective state to the maps; logged with why (`check`: what
    /// the deciding check took) and how many servers each VIP of the backend has up.
    fn apply(&mut self, b: usize, old: BackendState, new: BackendState, reason: Reason, check: Option<Duration>) {
        let be = &self.servers.backends[b];
        let at_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
        be.changes.lock().unwrap().record(Change { from: old, to: new, reason, check, at_unix });
        let states: Vec<BackendState> = self.servers.backends.iter().map(|x| x.state()).collect();
        tracing::info!(
            backend = %be.name,
            from = old.name(),
            to = new.name(),
            reason_kind = reason.kind(),
            "{}",
            change_line(&self.cfg, &states, b, &be.name, (old, new), reason, check)
        );
        self.servers.counters.transitions.fetch_add(1, Ordering::Relaxed);
        let mut t = self.tables.lock().unwrap();
        self.written[b] = new;
        self.write_backend(&mut t, b);
        drop(t);
        self.rebuild_rings_of(b);
        if new.is_out() && !old.is_out() {
            self.fail_over(b);
        } else if !new.is_out() && old.is_out() {
            self.give_back(b);
        }
    }

    /// Writes `b`'s BACKENDS entry: the state last written, its operator's state and
    /// its weight now.
    fn write_backend(&self, t: &mut Tables, b: usize) {
        let be = &self.servers.backends[b];
        let mut info = backend_info(&self.cfg.backends[b], self.written[b] as u8, be.operator() as u8);
        info.weight = be.weight();
        if let Err(e) = t.set_backend(b as u32, &info) {
            tracing::warn!(error = %e, "writing BACKENDS");
        }
    }

    /// Carries out an operator's order on `b` (`streak`: its checks' run); returns what
    /// a runtime setting changed, in words (logged too).
    fn order(&mut self, b: usize, order: Order, streak: &mut Streak) -> String {
        let servers = self.servers.clone();
        let (be, conf) = (&servers.backends[b], &self.cfg.backends[b]);
        let change = match order {
            Order::Operator(op) => {
                tracing::info!(backend = %be.name, operator = op.name(), "operator command");
                // Every dispatcher of a cluster takes the operator's word (news).
                if let Some((old, new)) = servers.operator_command(b, op) {
                    self.apply(b, old, new, Reason::Operator(op), None);
                }
                return String::new();
            }
            Order::Weight(w) => {
                let old = be.set_weight(w);
                self.write_backend(&mut self.tables.lock().unwrap(), b);
                self.rebuild_rings_of(b);
                format!("weight {old} -> {w} {}", until_reload(&w.to_string(), &conf.weight.to_string()))
            }
            Order::Maxconn(m) => {
                let old = be.slots.max();
                // Requests in flight keep their slots; waiters get the slots a raised
                // limit frees at once.
                be.slots.set_limits(m.map(u64::from), conf.maxqueue.into());
                let (now, configured) = (limit_name(m.map(u64::from)), limit_name(conf.maxconn.map(u64::from)));
                format!("maxconn {} -> {now} {}", limit_name(old), until_reload(&now, &configured))
            }
            Order::ChecksDisabled(off) => {
                let old = be.checks_disabled();
                // Enabled again: `rise`/`fall` count from the next check.
                *streak = Streak::default();
                if let Some((from, to)) = servers.set_checks_disabled(b, off) {
                    self.apply(b, from, to, Reason::Checks(off), None);
                }
                let now = checks_name(off);
                format!("health checks {} -> {now} {}", checks_name(old), until_reload(now, "enabled"))
            }
        };
        tracing::info!(backend = %be.name, "operator: {change}");
        change
    }

    fn rebuild_rings_of(&self, b: usize) {
        rebuild_rings_of(&self.cfg, &self.servers, &self.tables, b);
    }

    /// One step of every ramp-up in progress: the rings of the VIPs of a backend that
    /// came back are rebuilt with its grown share; a ramp that is complete everywhere
    /// ends (after a last rebuild at its full weight).
    fn ramp_step(&self) {
        let now = crate::metrics::mono_ns();
        for (b, be) in self.servers.backends.iter().enumerate() {
            let since = be.ramp_since.load(Ordering::SeqCst);
            if since == 0 {
                continue;
            }
            let slowest = self
                .cfg
                .vips
                .iter()
                .filter(|v| v.backends.contains(&b))
                .filter_map(|v| v.slow_start_of(&self.cfg, b))
                .max();
            let done = ramp_share(since, slowest, now) >= 1.0;
            if done {
                be.ramp_since.store(0, Ordering::SeqCst);
                if slowest.is_some() {
                    tracing::info!(backend = %be.name, "slow start done: full weight");
                }
            }
            if slowest.is_some() {
                self.rebuild_rings_of(b);
            }
        }
    }

    /// `b` is out: its clone IDs and pinned flows go to its replica when that one serves.
    fn fail_over(&self, b: usize) {
        let c = &self.servers;
        let replica = c.backends[b].replica.filter(|&r| c.backends[r].serves_sessions());
        c.counters.failovers.fetch_add(1, Ordering::Relaxed);
        let clones = if replica.is_some() { c.rewrite_clones_of(b) } else { 0 };
        c.counters.clone_rewrites.fetch_add(clones, Ordering::Relaxed);
        tracing::info!(
            backend = %c.backends[b].name,
            replica = replica.map(|r| c.backends[r].name.as_str()).unwrap_or("none"),
            clone_entries = clones,
            "failover"
        );
        self.rewrite_flows(b, replica);
    }

    /// `b` is back: the CLONES entries name it again (new sessions reach it; sessions its
    /// replica took over carry the replica's ID too and go by the cookie's order).
    fn give_back(&self, b: usize) {
        let c = &self.servers;
        let n = c.rewrite_clones_of(b);
        c.counters.clone_rewrites.fetch_add(n, Ordering::Relaxed);
    }

    /// Flows pinned to `b` move to `to`, or are removed (re-hashed by XDP) without one.
    /// FLOWS may hold millions of entries: the walk runs on a thread of its own, with a
    /// handle of its own, so that the control loop (admin requests, signals, health) and
    /// the tables stay free meanwhile. (XDP does not wait for it: a packet of a flow pinned
    /// to an out-of-service backend is re-pinned to the replica on arrival.)
    fn rewrite_flows(&self, b: usize, to: Option<usize>) {
        let flows = match self.tables.lock().unwrap().flows_handle() {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "opening FLOWS for the failover walk");
                return;
            }
        };
        let servers = self.servers.clone();
        let spawned = std::thread::Builder::new().name("flow-rewrite".into()).spawn(move || {
            let started = std::time::Instant::now();
            let n = move_flows(flows, b as u32, to.map(|r| r as u32), &servers.counters.flow_rewrites);
            tracing::info!(backend = %servers.backends[b].name, flows = n, took_ms = started.elapsed().as_millis() as u64, "pinned flows moved off the failed backend");
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "starting the failover walk");
        }
    }
}

/// Moves (or, without `to`, removes) the flows pinned to `from`, counting each as it goes
/// (so that `status` shows the progress of a long walk); returns how many.
fn move_flows(
    mut flows: aya::maps::HashMap<aya::maps::MapData, dispatcher_common::FlowKey, FlowValue>,
    from: u32,
    to: Option<u32>,
    counter: &std::sync::atomic::AtomicU64,
) -> u64 {
    // Keys first, then the writes: an LRU map walked while it is written may skip or
    // repeat entries.
    let pinned: Vec<_> = flows.iter().filter_map(|r| r.ok()).filter(|(_, v)| v.backend == from).collect();
    let mut n = 0;
    for chunk in pinned.chunks(4096) {
        let mut done = 0;
        for (k, _) in chunk {
            // As it is now: XDP may have re-pinned it meanwhile (a packet, a new SYN on the
            // same tuple) or evicted it; only a flow still on `from` is moved, with its
            // current value.
            let Ok(v) = flows.get(k, 0) else { continue };
            if v.backend != from {
                continue;
            }
            let ok = match to {
                Some(r) => flows.insert(k, FlowValue { backend: r, ..v }, 0).is_ok(),
                None => flows.remove(k).is_ok(),
            };
            done += ok as u64;
        }
        counter.fetch_add(done, Ordering::Relaxed);
        n += done;
    }
    n
}

/// The line a change of state is logged with, as HAProxy's:
/// `backend b1 up -> suspect: timeout after 2.0s (check took 2001 ms); 3 of 4 servers of VIP app up`
/// (each served VIP of the backend, by the states after the change).
pub fn change_line(
    cfg: &Config,
    states: &[BackendState],
    b: usize,
    name: &str,
    (old, new): (BackendState, BackendState),
    reason: Reason,
    check: Option<Duration>,
) -> String {
    use std::fmt::Write as _;
    let mut line = format!("backend {name} {} -> {}: {reason}", old.name(), new.name());
    if let Some(took) = check {
        let _ = write!(line, " (check took {} ms)", took.as_millis());
    }
    let mut sep = "; ";
    for v in cfg.vips.iter().filter(|v| !v.retired && v.backends.contains(&b)) {
        let up = v.backends.iter().filter(|&&m| states.get(m) == Some(&BackendState::Up)).count();
        let _ = write!(line, "{sep}{up} of {} servers of VIP {} up", v.backends.len(), v.name);
        sep = ", ";
    }
    line
}

/// One check's result: the backend, its verdict (`Err`: why it failed), when it began and
/// what it took.
type CheckResult = (usize, Result<(), Cause>, std::time::Instant, Duration);

async fn probe_loop(
    b: usize,
    probe: Probe,
    servers: Arc<Servers>,
    s: crate::config::HealthSettings,
    tx: mpsc::UnboundedSender<CheckResult>,
) {
    let mut tick = tokio::time::interval(s.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if servers.backends[b].checks_disabled() {
            continue;
        }
        let started = std::time::Instant::now();
        let (verdict, logical_name) = health::check(&probe, &s).await;
        let took = started.elapsed();
        servers.backends[b].last_check_us.store(took.as_micros() as u64 + 1, Ordering::Relaxed);
        if let Some(ln) = logical_name {
            // The container says which logical name it serves: its own answer, the one
            // place this is known for sure.
            servers.learn_logical_name(ln.as_bytes(), b);
        }
        let result = match verdict {
            // Says nothing about the backend: no streak, no state change.
            health::Verdict::Local => continue,
            health::Verdict::Pass => Ok(()),
            health::Verdict::Fail(cause) => Err(cause),
        };
        if tx.send((b, result, started, took)).is_err() {
            return;
        }
    }
}

/// Rebuilds the rings of the VIPs `b` serves, each backend weighing what its ramp-up
/// (`slow_start`) allows now.
fn rebuild_rings_of(cfg: &Config, servers: &Servers, tables: &Mutex<Tables>, b: usize) {
    let mut t = tables.lock().unwrap();
    let states: Vec<u8> = servers.backends.iter().map(|x| x.state() as u8).collect();
    let now = crate::metrics::mono_ns();
    for (i, v) in cfg.vips.iter().enumerate().filter(|(_, v)| v.backends.contains(&b)) {
        let weight = |m: usize| {
            let w = servers.backends[m].ramped_weight(servers.backends[m].weight(), v.slow_start_of(cfg, m), now);
            w.min(u32::MAX as u64) as u32
        };
        if let Err(e) = t.rebuild_ring_weighted(i as u32, v, cfg, &states, weight) {
            tracing::warn!(error = %e, vip = %v.name, "rebuilding the ring");
        }
    }
}

/// After a reload wrote the rings at full weights: those of the backends ramping up get
/// their current shares back at once.
pub fn rebuild_ramping_rings(cfg: &Config, servers: &Servers, tables: &Mutex<Tables>) {
    for (b, be) in servers.backends.iter().enumerate() {
        if be.ramp_since.load(Ordering::SeqCst) != 0 {
            rebuild_rings_of(cfg, servers, tables, b);
        }
    }
}

/// What an operator orders for one backend. The runtime settings (weight, maxconn,
/// checks) last until a reload, which returns the backend to its configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Drain, disable, enable (`Operator::None`).
    Operator(Operator),
    /// The weight its new sessions and L4 flows are balanced by (1..=10000).
    Weight(u32),
    /// Requests in flight to it at once (`None`: no limit).
    Maxconn(Option<u32>),
    /// Health checks disabled (`true`) or enabled again.
    ChecksDisabled(bool),
}

/// An operator's order through the admin endpoint; the reply is the backend's state
/// before and after, and for a runtime setting what changed, in words.
pub struct AdminCommand {
    pub backend: usize,
    pub order: Order,
    pub reply: tokio::sync::oneshot::Sender<Done>,
}

/// What an order did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub from: BackendState,
    pub to: BackendState,
    /// A runtime setting: `weight 100 -> 50 (until reload)`; empty for drain, disable
    /// and enable.
    pub change: String,
}

/// A runtime setting's value against the configuration's: said with the change.
fn until_reload(now: &str, configured: &str) -> String {
    if now == configured {
        "(the configuration's)".into()
    } else {
        format!("(until reload; configured {configured})")
    }
}

fn limit_name(m: Option<u64>) -> String {
    m.map_or_else(|| "none".into(), |m| m.to_string())
}

fn checks_name(disabled: bool) -> &'static str {
    if disabled {
        "disabled"
    } else {
        "enabled"
    }
}

/// Runs until the task is aborted.
pub async fn run(
    cfg: Config,
    servers: Arc<Servers>,
    tables: Arc<Mutex<Tables>>,
    mut commands: mpsc::UnboundedReceiver<AdminCommand>,
) {
    let mut events = servers.subscribe_events();
    let (tx, mut checks) = mpsc::unbounded_channel();
    let probes = health::probes(&cfg);
    // SIP containers: ACKs forwarded to them excuse checks that time out (`AckEvidence`).
    let mut acks: Vec<Option<health::sip::AckEvidence>> = probes
        .iter()
        .map(|p| p.as_ref().filter(|p| p.kind == health::ProbeKind::Sip).map(|_| Default::default()))
        .collect();
    for (b, p) in probes.into_iter().enumerate() {
        if let Some(p) = p {
            tokio::spawn(probe_loop(b, p, servers.clone(), cfg.health.clone(), tx.clone()));
        }
    }
    drop(tx);
    let written = servers.backends.iter().map(|b| b.state()).collect();
    let (rise, fall) = (cfg.health.rise, cfg.health.fall);
    let mut streaks = vec![Streak::default(); servers.backends.len()];
    // Ramp-ups move in steps of a tenth of the shortest `slow_start`, 100 ms to 1 s each
    // (ten steps for a slow start of 1 to 10 s, one a second for longer ones).
    let shortest = cfg.vips.iter().flat_map(|v| v.backends.iter().filter_map(|&b| v.slow_start_of(&cfg, b))).min();
    let step = shortest.map_or(std::time::Duration::from_secs(3600), |s| (s / 10).clamp(RAMP_STEP_MIN, RAMP_STEP_MAX));
    let mut ramp = tokio::time::interval(step);
    ramp.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut ctl = Control { cfg, servers: servers.clone(), tables, written };
    loop {
        tokio::select! {
            _ = ramp.tick() => ctl.ramp_step(),
            Some((b, result, started, took)) = checks.recv() => {
                if servers.backends[b].checks_disabled() {
                    // Began before the operator disabled the checks: ignored.
                    continue;
                }
                let ok = result.is_ok();
                if let Some(e) = acks.get_mut(b).and_then(Option::as_mut) {
                    let slot = stats::backend_slot(b as u32, stats::BACKEND_SIP_ACKS);
                    let n = ctl.tables.lock().unwrap().counter(slot).map_or(0, |c| c.packets);
                    let timed_out = matches!(result, Err(Cause::Timeout(_)));
                    if e.excuses(ok, timed_out, n, std::time::Instant::now()) {
                        servers.counters.sip_check_failures_excused.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(backend = %servers.backends[b].name, "SIP check timed out; ACKs forwarded to it since the last one: not counted");
                        continue;
                    }
                }
                if ok && servers.failed_since(b, started) {
                    // A check that began before a request saw the backend fail says
                    // nothing of it since: suspicion stands until a later one passes.
                    continue;
                }
                let before = servers.backends[b].health();
                let h = health::next(before, ok, &mut streaks[b], rise, fall);
                // To or from down, this dispatcher's verdict is news for the shared rule
                // (`[cluster]`).
                if let Some((old, new)) = servers.set_health(b, h) {
                    let reason = result.map_or_else(Reason::Check, |()| Reason::Passed);
                    ctl.apply(b, old, new, reason, Some(took));
                }
            }
            Some(event) = events.recv() => {
                let (b, reason) = match event {
                    // The request path already marked it suspect in the mirror; the maps
                    // follow, and the failure counts towards `fall`.
                    Event::PassiveFailure(b, cause) => {
                        streaks[b] = Streak::after_failure();
                        (b, Reason::Passive(cause))
                    }
                    // The shared store changed its operator's state or the majority's verdict.
                    Event::Shared(b) => {
                        let be = &servers.backends[b];
                        let (op, was) = (be.operator(), ctl.written[b]);
                        let operator = op != Operator::None
                            || matches!(was, BackendState::Drain | BackendState::Disabled);
                        (b, if operator { Reason::SharedOperator(op) } else { Reason::Peers(be.peers_out()) })
                    }
                };
                let now = servers.backends[b].state();
                if now != ctl.written[b] {
                    let old = ctl.written[b];
                    ctl.apply(b, old, now, reason, None);
                }
            }
            Some(cmd) = commands.recv() => {
                let b = cmd.backend;
                let before = servers.backends[b].state();
                let change = ctl.order(b, cmd.order, &mut streaks[b]);
                let _ = cmd.reply.send(Done { from: before, to: servers.backends[b].state(), change });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line says who, from what to what, why, what the check took, and per VIP of
    /// the backend how many of its servers are up after the change.
    #[test]
    fn a_change_is_logged_with_its_reason_and_the_servers_left() {
        let text = "[dispatcher]\ninterface = \"lo\"\n\
                    [[backend]]\nname = \"b1\"\naddress = \"10.0.0.1\"\n[[backend]]\nname = \"b2\"\naddress = \"10.0.0.2\"\n\
                    [[backend]]\nname = \"b3\"\naddress = \"10.0.0.3\"\n[[backend]]\nname = \"b4\"\naddress = \"10.0.0.4\"\n\
                    [[vip]]\nname = \"app\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\nbackends = [\"b1\", \"b2\", \"b3\", \"b4\"]\n\
                    [[vip]]\nname = \"tcp\"\naddress = \"10.0.100.2\"\nport = 9000\nmode = \"http\"\nbackends = [\"b1\", \"b2\"]\n\
                    [[vip]]\nname = \"other\"\naddress = \"10.0.100.3\"\nport = 81\nmode = \"http\"\nbackends = [\"b3\"]\n";
        let cfg = Config::parse(text, "t").unwrap();
        use BackendState::*;
        let states = [Suspect, Up, Down, Up];
        let line = change_line(
            &cfg,
            &states,
            0,
            "b1",
            (Up, Suspect),
            Reason::Check(Cause::timeout(Duration::from_secs(2))),
            Some(Duration::from_millis(2001)),
        );
        assert_eq!(
            line,
            "backend b1 up -> suspect: timeout after 2.0s (check took 2001 ms); 2 of 4 servers of VIP app up, \
             1 of 2 servers of VIP tcp up"
        );
        let line = change_line(&cfg, &states, 2, "b3", (Up, Down), Reason::Passive(Cause::Status(503)), None);
        assert_eq!(
            line,
            "backend b3 up -> down: passive: status 503; 2 of 4 servers of VIP app up, 0 of 1 servers of VIP other up"
        );
        let line = change_line(&cfg, &[Up; 4], 3, "b4", (Drain, Up), Reason::Operator(Operator::None), None);
        assert_eq!(line, "backend b4 drain -> up: operator enable; 4 of 4 servers of VIP app up");
    }
}
