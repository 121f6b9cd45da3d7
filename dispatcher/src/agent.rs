//! The agent's lifecycle: what `dispatcher run` does, as a library so that a test or
//! another front end can start an agent without the command line. It loads or adopts the
//! data plane (`dataplane`), starts the request path (`http::listener`), the control loop
//! (`control`) and the admin endpoint (`admin`), keeps its pins, reloads, and stops.

use std::{path::Path, sync::Arc};

use anyhow::Context as _;
use aya::programs::links::{FdLink, PinnedLink};
use dispatcher_common::{effective_state, Health, Operator};

use crate::{
    access_log::AccessLog,
    admin::{self, Admin, AgentRequest, Live},
    config::Config,
    control::AdminCommand,
    dataplane::{self, tables::Tables, Attached, LoadOptions},
    http::listener::HttpServer,
    state::Cluster,
};

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

/// Runs the agent for the configuration at `path` until SIGTERM/SIGINT or `POST /stop`:
/// loads (or adopts) the data plane, serves the HTTP VIPs, the control loop and the admin
/// endpoint. `keep_dataplane`: on a signal, leave the program attached and the maps pinned.
pub fn run(path: &Path, keep_dataplane: bool) -> anyhow::Result<()> {
    let mut cfg = Config::load(path)?;
    crate::logging::init_logging(&cfg.log_level);
    // Before anything is touched: a second agent for the instance would swap the program,
    // rebind the admin socket and share the HTTP ports.
    let _lock = crate::instance::acquire(&cfg.instance)?;
    // Its name in the Via of forwarded requests (loop detection), before any request.
    crate::http::rewrite::init_marker(&cfg.instance);
    // The admin socket's path: never another agent's live socket, nor a file that is not
    // a socket (refused before the data plane is touched; bound below).
    admin::claim_socket_path(&cfg.admin_socket)
        .with_context(|| format!("dispatcher.admin_socket {}", cfg.admin_socket.display()))?;
    raise_fd_limit();
    let pin_dir = cfg.pin_dir();
    let adopted = pin_dir.join("VIPS").exists();
    let mut ebpf = dataplane::load_dispatcher(&LoadOptions {
        pin_dir: Some(&pin_dir),
        flow_table_size: cfg.flow_table_size,
        affinity_table_size: cfg.affinity_table_size,
        object: None,
    })
    .with_context(|| format!("loading the data plane pinned under {}", pin_dir.display()))?;
    let mut tables = Tables::from_ebpf(&mut ebpf)?;
    if adopted {
        // Every backend and VIP at the id the pinned maps know it by (its name), not at
        // its position in a file that may have changed since.
        if dataplane::ids::load(&cfg).is_some() {
            cfg = dataplane::ids::placed(cfg).map_err(|e| anyhow::anyhow!("adopting the pinned maps: {e}"))?;
        } else {
            tracing::warn!("no id table for the pinned maps (left by an older agent?): backends and VIPs keep the ids of their positions");
        }
        for (i, v) in cfg.vips.iter().enumerate() {
            tables.adopt_ring(i as u32, v.ring_size())?;
        }
        tracing::info!(dir = %pin_dir.display(), flows = tables.flow_count(), "adopted pinned maps");
    }
    let n = cfg.backends.len();
    let (mut health, mut admin) = (vec![Health::Up; n], vec![Operator::None; n]);
    if adopted {
        // An operator's drain or disable, and a backend found down, survive an agent
        // restart.
        for i in 0..n {
            if let Ok(info) = tables.backend(i as u32) {
                (health[i], admin[i]) = adopted_state(&info);
            }
        }
    }
    // A backend removed from the file keeps its slot, out of service (its flows and
    // sessions go to its replica, as after a reload).
    for (i, b) in cfg.backends.iter().enumerate() {
        if b.retired {
            admin[i] = Operator::Disabled;
        }
    }
    // The request path's state (with CLONES written through); with `[cluster]`, the shared
    // state is taken before anything is written or served.
    let clones = ebpf.take_map("CLONES").ok_or_else(|| anyhow::anyhow!("CLONES map missing"))?;
    let clones = aya::maps::HashMap::try_from(clones).context("CLONES map")?;
    let cluster = Arc::new(Cluster::new(&cfg, &health, &admin, Some(clones)));
    // The control runtime (signals, state, admin, the shared store); the request path has
    // its own event loops (`http::listener`).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let current: crate::shared::Current = Arc::new(std::sync::RwLock::new((Arc::new(cfg.clone()), cluster.clone())));
    // Steering: this dispatcher's MAC goes into its member key, for the others' tables.
    // Joined only once everything here serves (below): the others steer nothing here
    // before this dispatcher's own table is in place.
    let joined = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let steer_mac = match &cfg.cluster {
        Some(c) if c.steering => Some(crate::netif::hardware_address(&cfg.interface)?),
        _ => None,
    };
    if let (Some(c), Some(mac)) = (&cfg.cluster, steer_mac) {
        Running::own_pin_matches(c, &cfg.interface, mac)?;
    }
    let shared = cfg.cluster.clone().map(|s| {
        let me = crate::shared::Identity { mac: steer_mac, joined: joined.clone() };
        rt.block_on(crate::shared::Shared::start(s, current.clone(), me))
    });
    if shared.is_some() {
        cluster.rewrite_all_clones();
    }
    let states: Vec<u8> = cluster.backends.iter().map(|b| b.state() as u8).collect();
    let ops: Vec<u8> = cluster.backends.iter().map(|b| b.operator() as u8).collect();
    tables.apply(&cfg, &states, &ops).context("writing the configuration into the maps")?;
    if adopted {
        let stale = tables.remove_stale_vips(&cfg);
        if stale > 0 {
            tracing::info!(entries = stale, "removed VIPS entries of VIPs no longer configured");
        }
    }
    if let Err(e) = dataplane::ids::save(&cfg) {
        tracing::warn!(error = %e, "recording the id table");
    }

    // The program too, so that bpftool and a later agent can find it by path.
    let prog_path = pin_dir.join("prog");
    let _ = std::fs::remove_file(&prog_path);
    dataplane::program(&mut ebpf, "dispatcher")?.pin(&prog_path).context("pinning the XDP program")?;

    let link_path = pin_dir.join("link");
    let pins = dataplane::pins::Pins::record(&pin_dir).context("reading back the pinned maps")?;
    let (link, how) = if link_path.exists() {
        // A previous run left the program attached: swap the new program in atomically.
        let fd: FdLink = PinnedLink::from_pin(&link_path).context("opening the pinned XDP link")?.into();
        let xdp_link = aya::programs::xdp::XdpLink::try_from(fd).context("pinned link is not an XDP link")?;
        let xdp = dataplane::program(&mut ebpf, "dispatcher")?;
        let id = xdp.attach_to_link(xdp_link).context("replacing the attached program")?;
        let link = FdLink::try_from(xdp.take_link(id)?).context("XDP link")?;
        (link, "replaced")
    } else {
        let (link, how) = dataplane::attach(&mut ebpf, "dispatcher", &cfg.interface, cfg.xdp_mode)
            .with_context(|| format!("attaching to {}", cfg.interface))?;
        let link: FdLink = link.pin(&link_path).context("pinning the XDP link")?.into();
        (link, if how == Attached::Native { "native" } else { "generic" })
    };
    // When a listener closes (reload), connections in its accept queue move to the new
    // one instead of being reset (SO_REUSEPORT group; Linux 5.14+).
    let _ = std::fs::write("/proc/sys/net/ipv4/tcp_migrate_req", "1");
    if steer_mac.is_none() {
        // Standalone (or steering off): whatever an earlier run left, nothing is steered.
        tables.set_steer_conf(&Default::default()).context("clearing STEER_CONF")?;
    }
    let tables = Arc::new(std::sync::Mutex::new(tables));
    // Whether a connection stays after its response: the ownership table, and leaving.
    let ownership = Arc::new(crate::steering::Ownership::default());
    let steering = match (&shared, &cfg.cluster, steer_mac) {
        (Some(sh), Some(c), Some(mac)) => {
            let st = crate::steering::Steering::new(
                tables.clone(),
                c.name.clone(),
                mac,
                c.second_chance,
                joined.clone(),
                ownership.clone(),
            );
            rt.spawn(crate::steering::run(st.clone(), sh.peers()));
            Some(st)
        }
        _ => None,
    };
    let access_log = cfg.access_log.as_ref().map(|s| AccessLog::start(s, cluster.counters.clone())).transpose()?;
    let mut live = Running::start(Arc::new(cfg.clone()), cluster, &tables, &rt, None, access_log, ownership.clone())?;
    // Announced once the VIPs are served.
    let mut announcer = match &cfg.announce {
        Some(a) => Some(crate::announce::Announcer::start(a).context("creating the announcement interfaces")?),
        None => None,
    };
    // Join once everything here serves. With steering, only once this dispatcher's own
    // table is in place (the one without it, what the others use now: it becomes the
    // previous table when this one joins); until then nothing is announced, since
    // connections ECMP moved here would find no steering. Checked again every second.
    let mut join_pending = announcer.is_some() || shared.is_some();
    let announcer_configured = announcer.is_some();
    // When this dispatcher last left (`dispatcher leave`), for the grace at stop.
    let mut left_at: Option<std::time::Instant> = None;
    if let Some(st) = &steering {
        let t0 = std::time::Instant::now();
        while !st.installed() && t0.elapsed() < std::time::Duration::from_secs(2) {
            rt.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(10)).await });
        }
    }
    let ready_to_join =
        |steering: &Option<Arc<crate::steering::Steering>>| steering.as_ref().is_none_or(|s| s.installed());
    if join_pending && ready_to_join(&steering) {
        membership(true, &joined, &ownership, announcer.as_mut(), shared.as_ref(), steering.as_deref())
            .map_err(|e| anyhow::anyhow!("joining: {e}"))?;
        join_pending = false;
    } else if join_pending {
        tracing::warn!("not joining yet: no membership from the shared store to build the ownership table from (retried every second)");
    }
    let (requests, mut request_rx) = tokio::sync::mpsc::unbounded_channel::<AgentRequest>();
    let admin = Arc::new(Admin {
        live: std::sync::RwLock::new(live.view()),
        pins_missing: std::sync::Mutex::new(Vec::new()),
        tables: tables.clone(),
        requests,
        started: std::time::Instant::now(),
        shared: shared.as_ref().map(|s| s.observer()),
        steering: steering.clone(),
        announced: std::sync::Mutex::new(announcer.as_ref().map(|a| a.joined())),
    });
    let (listener, tcp) = {
        let _guard = rt.enter();
        let unix = admin::bind(&cfg.admin_socket)
            .with_context(|| format!("binding the admin socket {}", cfg.admin_socket.display()))?;
        let tcp = match cfg.admin_address {
            Some(a) => Some(
                rt.block_on(tokio::net::TcpListener::bind(a))
                    .with_context(|| format!("binding the admin address {a}"))?,
            ),
            None => None,
        };
        (unix, tcp)
    };
    let admin_task = rt.spawn(admin::serve(admin.clone(), listener, tcp));
    tracing::info!(interface = %cfg.interface, mode = how, vips = cfg.vips.len(), backends = cfg.backends.len(), admin = %cfg.admin_socket.display(), admin_address = ?cfg.admin_address, "dispatcher running");
    // The service manager (systemd, Type=notify): serving now; the control loop below
    // pings its watchdog.
    let notifier = crate::notify::Notifier::from_env();
    notifier.send(&format!(
        "READY=1\nMAINPID={}\nSTATUS=serving {} VIPs, {} backends",
        std::process::id(),
        cfg.vips.len(),
        cfg.backends.len()
    ));

    let mut link = Some(link);
    let (why, keep_dataplane) = rt.block_on(async {
        let signal = shutdown_signal();
        tokio::pin!(signal);
        let mut pin_check = tokio::time::interval(PIN_CHECK);
        let watchdog_every = notifier.watchdog_every();
        let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(std::time::Duration::from_secs(3600)));
        // SIGHUP reloads, as for HAProxy and nginx (`systemctl kill -s HUP`, or a
        // terminal closing on an agent run by hand, which must not end it).
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        loop {
            tokio::select! {
                s = &mut signal => return s.map(|s| (s, keep_dataplane)),
                _ = watchdog.tick(), if watchdog_every.is_some() => notifier.send("WATCHDOG=1"),
                _ = hangup.recv() => {
                    tracing::info!("SIGHUP: reloading");
                    let (reply, _) = tokio::sync::oneshot::channel();
                    let _ = admin.requests.send(AgentRequest::Reload(reply));
                }
                _ = pin_check.tick() => {
                    let missing = keep_pins(&pins, &mut ebpf, &mut link, &prog_path, &link_path);
                    *admin.pins_missing.lock().unwrap() = missing;
                    if join_pending && ready_to_join(&steering) {
                        match membership(true, &joined, &ownership, announcer.as_mut(), shared.as_ref(), steering.as_deref()) {
                            Ok(_) => join_pending = false,
                            Err(e) => crate::ratelimit::warn("joining", &e),
                        }
                        *admin.announced.lock().unwrap() = announcer.as_ref().map(|a| a.joined());
                    }
                }
                Some(request) = request_rx.recv() => match request {
                    AgentRequest::Reload(reply) => {
                        notifier.send("RELOADING=1");
                        let r = live.reload(path, &tables, &rt);
                        match &r {
                            Ok(what) => {
                                *admin.live.write().unwrap() = live.view();
                                *current.write().unwrap() = (live.cfg.clone(), live.cluster.clone());
                                // The shared state, on the new cluster (and read again if
                                // the peers or backends changed).
                                live.cluster.publish(crate::shared::Publish::Reloaded);
                                tracing::info!(changes = %what, "configuration reloaded");
                                notifier.send(&format!("READY=1\nSTATUS=reloaded: {what}"));
                            }
                            Err(why) => {
                                tracing::warn!(error = %why, "reload refused; the running configuration stays");
                                let first = why.lines().next().unwrap_or_default();
                                notifier.send(&format!("READY=1\nSTATUS=reload refused: {first}"));
                            }
                        }
                        let _ = reply.send(r);
                    }
                    AgentRequest::Stop { detach } => return Ok(("dispatcher stop", !detach)),
                    AgentRequest::Membership(join, reply) => {
                        join_pending = false;
                        let was_in = joined.load(std::sync::atomic::Ordering::Relaxed);
                        let r = membership(join, &joined, &ownership, announcer.as_mut(), shared.as_ref(), steering.as_deref());
                        if r.is_ok() && was_in && !join {
                            left_at = Some(std::time::Instant::now());
                        } else if r.is_ok() && join {
                            left_at = None;
                        }
                        *admin.announced.lock().unwrap() = announcer.as_ref().map(|a| a.joined());
                        let _ = reply.send(r);
                    }
                },
            }
        }
    })?;
    notifier.send(&format!("STOPPING=1\nSTATUS=stopping ({why})"));
    admin_task.abort();
    let _ = std::fs::remove_file(&cfg.admin_socket);
    // Out of the group first: routes withdrawn, this dispatcher's slots to the others,
    // connections closed after their next response while in-flight requests finish.
    let was_in = joined.load(std::sync::atomic::Ordering::Relaxed);
    let _ = membership(false, &joined, &ownership, announcer.as_mut(), shared.as_ref(), steering.as_deref());
    if let Some(a) = announcer.take() {
        a.stop();
    }
    // The router follows a withdrawal within BGP's propagation, the others' tables within a
    // watch event: until then packets may still come here, and this host must still
    // steer them (its XDP program may be detached on exit). Counted from the leave.
    if announcer_configured || steering.is_some() {
        let since = if was_in { None } else { left_at };
        let wait = LEAVE_GRACE.saturating_sub(since.map(|t| t.elapsed()).unwrap_or_default());
        if !wait.is_zero() {
            tracing::info!(
                wait_ms = wait.as_millis() as u64,
                "withdrawn; waiting for the router and the others to follow"
            );
            std::thread::sleep(wait);
        }
    }
    if let Some(shared) = shared {
        // The others stop counting this dispatcher now, not when its lease runs out.
        rt.block_on(shared.leave());
    }
    live.stop(why);
    if keep_dataplane {
        tracing::info!(signal = why, dir = %pin_dir.display(), "exiting; program stays attached and maps stay pinned");
    } else {
        let _ = std::fs::remove_file(&link_path);
        drop(link);
        drop(rt);
        drop(admin);
        drop(tables);
        dataplane::unpin_all(&pin_dir)?;
        dataplane::ids::remove(&cfg.instance);
        dataplane::release_bpffs(&pin_dir);
        tracing::info!(signal = why, "detached and unpinned");
    }
    Ok(())
}

/// `dispatcher join` / `leave` (and stop): announcements, the member key, the local
/// ownership table, the fate of keep-alive connections.
fn membership(
    join: bool,
    joined: &std::sync::atomic::AtomicBool,
    ownership: &crate::steering::Ownership,
    announcer: Option<&mut crate::announce::Announcer>,
    shared: Option<&crate::shared::Shared>,
    steering: Option<&crate::steering::Steering>,
) -> Result<String, String> {
    if announcer.is_none() && shared.is_none() {
        return Err("neither [announce] nor [cluster] is configured: there is no group to leave or join".into());
    }
    joined.store(join, std::sync::atomic::Ordering::Relaxed);
    ownership.set_leaving(!join);
    let mut done = Vec::new();
    if let Some(a) = announcer {
        a.set_joined(join).map_err(|e| format!("{e:#}"))?;
        done.push(if join { "VIPs announced" } else { "VIPs withdrawn" });
    }
    if let Some(sh) = shared {
        sh.publish_member();
    }
    if let Some(st) = steering {
        st.refresh();
        done.push(if join { "in the ownership table" } else { "out of the ownership table" });
    }
    if !join {
        done.push("client connections close after their next response");
    }
    tracing::info!(joined = join, "{}", done.join("; "));
    Ok(format!("{}: {}", if join { "joined" } else { "left" }, done.join("; ")))
}

/// What runs for one configuration: the cluster state, the HTTP VIPs, the control loop.
struct Running {
    cfg: Arc<Config>,
    cluster: Arc<Cluster>,
    server: Option<HttpServer>,
    control: tokio::task::JoinHandle<()>,
    commands: tokio::sync::mpsc::UnboundedSender<AdminCommand>,
    /// `[access_log]`'s writer (kept across reloads, its file reopened by each).
    access_log: Option<Arc<AccessLog>>,
    /// What the HTTP path asks before keeping a connection (the same across reloads).
    ownership: Arc<crate::steering::Ownership>,
}

impl Running {
    /// `predecessor`: the server of the configuration this one replaces, whose
    /// listening sockets are taken over.
    fn start(
        cfg: Arc<Config>,
        cluster: Arc<Cluster>,
        tables: &Arc<std::sync::Mutex<Tables>>,
        rt: &tokio::runtime::Runtime,
        predecessor: Option<&HttpServer>,
        access_log: Option<Arc<AccessLog>>,
        ownership: Arc<crate::steering::Ownership>,
    ) -> anyhow::Result<Running> {
        let server = if cfg.vips.iter().any(|v| v.serves_http()) {
            Some(
                HttpServer::start(&cfg, cluster.clone(), predecessor, access_log.as_ref(), ownership.clone())
                    .context("starting the HTTP VIPs")?,
            )
        } else {
            None
        };
        // Health checks, failed requests and operator commands decide the backends' states.
        let (commands, commands_rx) = tokio::sync::mpsc::unbounded_channel();
        let control = rt.spawn(crate::control::run((*cfg).clone(), cluster.clone(), tables.clone(), commands_rx));
        Ok(Running { cfg, cluster, server, control, commands, access_log, ownership })
    }

    fn view(&self) -> Live {
        Live { cfg: self.cfg.clone(), cluster: self.cluster.clone(), commands: self.commands.clone() }
    }

    /// This dispatcher's MAC pinned in `[cluster] peers` (`name@MAC`) is the one `interface`
    /// has: otherwise every other dispatcher would refuse its member key.
    fn own_pin_matches(c: &crate::config::ClusterSettings, interface: &str, mac: [u8; 6]) -> anyhow::Result<()> {
        if let Some(pinned) = c.peer_macs.get(&c.name).filter(|p| **p != mac) {
            anyhow::bail!(
                "[cluster] peers pins {} to {}, but {interface} has {}: the others would refuse its member key",
                c.name,
                crate::mac::format_mac(pinned),
                crate::mac::format_mac(&mac)
            );
        }
        Ok(())
    }

    /// Re-reads the file and swaps in what it says: ids kept by name, the listening
    /// sockets taken over by the new loops (no SYN or queued connection meets a closed
    /// listener), in-flight requests
    /// finish on the old loops, backend states and learned clone IDs carried over.
    fn reload(
        &mut self,
        path: &Path,
        tables: &Arc<std::sync::Mutex<Tables>>,
        rt: &tokio::runtime::Runtime,
    ) -> Result<String, String> {
        let new = Config::load(path).map_err(|e| e.to_string())?;
        let merged = self.cfg.merged_for_reload(new)?;
        // `peers` may change by reload: this dispatcher's own pin is checked as at start.
        if let Some(c) = merged.cluster.as_ref().filter(|c| c.steering) {
            let mac = crate::netif::hardware_address(&merged.interface).map_err(|e| format!("{e:#}"))?;
            Self::own_pin_matches(c, &merged.interface, mac).map_err(|e| format!("{e:#}"))?;
        }
        // Health and the operator's state go on; a removed backend is disabled.
        let (health, admin): (Vec<Health>, Vec<Operator>) = merged
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (h, a) = self.cluster.health_and_admin(i).unwrap_or((Health::Up, Operator::None));
                let was_retired = self.cfg.backends.get(i).is_some_and(|o| o.retired);
                if b.retired {
                    (h, Operator::Disabled)
                } else if was_retired {
                    // Configured again: back in service (ramping up, with `slow_start`).
                    (h, Operator::None)
                } else {
                    (h, a)
                }
            })
            .unzip();
        let (states, ops) = map_bytes(&health, &admin);
        // The learned clone table first: the new listeners route learned IDs from their
        // first request.
        // The access log's file is opened again (log rotation): one that cannot be opened
        // refuses the reload, and the old one stays in use. It is switched to once the
        // reload has succeeded, like the backends' limits: a refused reload changes nothing.
        let mut reopened = None;
        let access_log = match (&merged.access_log, &self.access_log) {
            (Some(s), Some(log)) if s.buffer == log.settings().buffer => {
                reopened = Some(AccessLog::reopen(s).map_err(|e| format!("{e:#}"))?);
                Some(log.clone())
            }
            (Some(s), _) => Some(AccessLog::start(s, self.cluster.counters.clone()).map_err(|e| format!("{e:#}"))?),
            (None, _) => None,
        };
        let cluster = Cluster::successor_of(&merged, &health, &admin, &self.cluster);
        let merged = Arc::new(merged);
        let next = Running::start(
            merged.clone(),
            cluster.clone(),
            tables,
            rt,
            self.server.as_ref(),
            access_log,
            self.ownership.clone(),
        )
        .map_err(|e| format!("{e:#}"))?;
        if let Err(e) = tables.lock().unwrap().apply(&merged, &states, &ops) {
            // Refused: the new loops stop (the old ones never did), and the old cluster
            // passes nothing on to the one that will not serve.
            self.cluster.forget_successor();
            next.stop("reload refused");
            return Err(format!("writing the maps: {e}"));
        }
        crate::control::rebuild_ramping_rings(&merged, &cluster, tables);
        if let Err(e) = dataplane::ids::save(&merged) {
            tracing::warn!(error = %e, "recording the id table");
        }
        cluster.adopt_map(&self.cluster);
        cluster.apply_limits(&merged);
        let (per_source, rate) = crate::http::listener::source_limits(&merged);
        cluster.sources.configure(per_source, rate);
        if let (Some(log), Some(r)) = (&next.access_log, reopened) {
            log.switch(r);
        }
        let mut summary = format!(
            "{} backends ({} retired), {} VIPs ({} retired)",
            merged.backends.len(),
            merged.backends.iter().filter(|b| b.retired).count(),
            merged.vips.len(),
            merged.vips.iter().filter(|v| v.retired).count()
        );
        if merged.log_level != self.cfg.log_level {
            if crate::logging::set_log_level(&merged.log_level) {
                summary += &format!(", log level {}", merged.log_level);
            } else {
                summary += ", log level unchanged (RUST_LOG decides)";
            }
        }
        let old = std::mem::replace(self, next);
        old.control.abort();
        if let Some(server) = old.server {
            // The old loops finish their requests in the background.
            std::thread::spawn(move || {
                let left = server.shutdown();
                tracing::info!(unfinished = left, "previous HTTP listeners stopped");
            });
        }
        Ok(summary)
    }

    fn stop(self, why: &str) {
        self.control.abort();
        if let Some(server) = self.server {
            let left = server.shutdown();
            tracing::info!(signal = why, unfinished = left, "HTTP VIPs stopped");
        }
        // The last requests' lines are written before the agent exits.
        if let Some(log) = &self.access_log {
            log.flush(std::time::Duration::from_secs(2));
        }
    }
}

/// How often the agent checks that its pins are still there.
const PIN_CHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// After leaving (or at stop), how long a dispatcher behind a router keeps steering what
/// still arrives before it exits: the router's BGP update and the others' table change
/// take milliseconds (measured); this is generous.
const LEAVE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Pins again whatever of the data plane's pins was removed under the running agent
/// (maps from the ids it recorded, the program and the link from the objects it holds);
/// returns what is still missing (and says so in the log and in `status`).
fn keep_pins(
    pins: &dataplane::pins::Pins,
    ebpf: &mut aya::Ebpf,
    link: &mut Option<FdLink>,
    prog_path: &Path,
    link_path: &Path,
) -> Vec<&'static str> {
    let maps = pins.missing_maps();
    // Gone means known to be gone (not "could not look", e.g. out of descriptors).
    let gone = |p: &Path| matches!(std::fs::symlink_metadata(p), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    let (prog_gone, link_gone) = (gone(prog_path), gone(link_path));
    if maps.is_empty() && !prog_gone && !link_gone {
        return Vec::new();
    }
    tracing::warn!(dir = %pins.dir().display(), ?maps, program = prog_gone, link = link_gone, "pins removed under the running agent: pinning them again");
    let mut missing = Vec::new();
    let _ = std::fs::create_dir_all(pins.dir());
    // Pinning the link consumes our handle on it, and a failed pin would detach the
    // program: only on a bpffs directory, where it cannot fail for want of a place.
    if !dataplane::is_bpffs(pins.dir()) {
        tracing::error!(dir = %pins.dir().display(), "the pin directory is not on bpffs any more: the data plane will go with this agent");
        return maps.into_iter().chain(["prog", "link"]).collect();
    }
    if let Err(e) = pins.repin_maps(&maps) {
        tracing::error!(error = %e, "pinning the maps again");
        missing.extend(maps);
    }
    if prog_gone {
        if let Err(e) = dataplane::program(ebpf, "dispatcher").and_then(|p| {
            p.pin(prog_path).map_err(|e| dataplane::DataplaneError::Io {
                what: "pinning the program".into(),
                source: std::io::Error::other(e.to_string()),
            })
        }) {
            tracing::error!(error = %e, "pinning the program again");
            missing.push("prog");
        }
    }
    if link_gone {
        match link.take().map(|l| l.pin(link_path)) {
            Some(Ok(pinned)) => *link = Some(pinned.into()),
            Some(Err(e)) => {
                tracing::error!(error = %e, "pinning the XDP link again failed: the program is detached");
                missing.push("link");
            }
            // Lost at an earlier attempt: still missing, and said so every time.
            None => missing.push("link"),
        }
    }
    if missing.is_empty() {
        tracing::info!(dir = %pins.dir().display(), "data plane pinned again");
    }
    missing
}

/// Health and operator state from a `BACKENDS` entry a previous agent left. (An agent
/// before the `admin` field existed kept only one state: drain or disabled there is the
/// operator's.)
fn adopted_state(info: &dispatcher_common::BackendInfo) -> (Health, Operator) {
    let op = match Operator::from_u8(info.admin) {
        Operator::None => Operator::from_u8(info.state),
        op => op,
    };
    (Health::from_u8(info.state), op)
}

/// The `BACKENDS` bytes (effective state, operator's state) of each backend.
fn map_bytes(health: &[Health], ops: &[Operator]) -> (Vec<u8>, Vec<u8>) {
    health.iter().zip(ops).map(|(&h, &op)| (effective_state(op, h) as u8, op as u8)).unzip()
}

/// A proxy holds two descriptors per connection: take the hard limit, not the default
/// soft 1024.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dispatcher pinned in `peers` to a MAC its interface does not have refuses to
    /// start or reload (the others would refuse its member key); unpinned or pinned
    /// right, it goes on.
    #[test]
    fn its_own_pinned_mac_must_be_its_interfaces() {
        let text = |peers: &str| {
            format!("[dispatcher]\ninterface = \"lo\"\n\n[cluster]\nname = \"d0\"\npeers = [{peers}]\nendpoints = [\"http://127.0.0.1:2379\"]\ninsecure_plaintext = true\n")
        };
        let mac = [2, 0, 0, 0, 0, 1];
        let cluster = |peers: &str| Config::parse(&text(peers), "t").unwrap().cluster.unwrap();
        assert!(Running::own_pin_matches(&cluster("\"d0\", \"d1@02:00:00:00:00:09\""), "eth0", mac).is_ok());
        assert!(Running::own_pin_matches(&cluster("\"d0@02:00:00:00:00:01\""), "eth0", mac).is_ok());
        let e = Running::own_pin_matches(&cluster("\"d0@02:00:00:00:00:02\""), "eth0", mac).unwrap_err();
        assert!(e.to_string().contains("pins d0 to 02:00:00:00:00:02, but eth0 has 02:00:00:00:00:01"), "{e}");
    }
}
