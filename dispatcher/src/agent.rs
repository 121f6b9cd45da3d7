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
    capacity::Capacity,
    config::Config,
    control::AdminCommand,
    dataplane::{self, tables::Tables, Attached, LoadOptions},
    http::listener::HttpServer,
    state::Servers,
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
/// `stay_out`: serve, but join the group only on `dispatcher join` (as after an operator's
/// `leave`, which a restart keeps: `instance::left_mark`).
pub fn run(path: &Path, keep_dataplane: bool, stay_out: bool) -> anyhow::Result<()> {
    let mut cfg = Config::load(path)?;
    // The plugin-cfg.xml as it was read: a change from here on is seen.
    let plugin_watch = PluginWatch::new(&cfg);
    crate::logging::init_logging(&cfg.log_level);
    // Before anything is touched: a second agent for the instance would swap the program,
    // rebind the admin socket and share the HTTP ports.
    let _lock = crate::instance::acquire(&cfg.instance)?;
    // Its name in the Via of forwarded requests (loop detection), before any request.
    crate::http1::rewrite::init_marker(&cfg.instance);
    // The admin socket's path: never another agent's live socket, nor a file that is not
    // a socket (refused before the data plane is touched; bound below).
    admin::claim_socket_path(&cfg.admin_socket)
        .with_context(|| format!("dispatcher.admin_socket {}", cfg.admin_socket.display()))?;
    raise_fd_limit();
    let mut dp = Dataplane::load(&mut cfg)?;
    // A start that fails before it serves removes what it pinned (the next start would
    // adopt it); maps an earlier agent left are left as they were.
    let mut fresh = FreshPins { dir: (!dp.adopted).then(|| dp.pin_dir.clone()), instance: cfg.instance.clone() };
    let (health, admin) = dp.initial_states(&cfg);
    // The request path's state (with CLONES written through); with `[cluster]`, the shared
    // state is taken before anything is written or served.
    let clones = dp.ebpf.take_map("CLONES").ok_or_else(|| anyhow::anyhow!("CLONES map missing"))?;
    let clones = aya::maps::HashMap::try_from(clones).context("CLONES map")?;
    let sip_learn = dp.ebpf.take_map("SIP_LEARN").ok_or_else(|| anyhow::anyhow!("SIP_LEARN map missing"))?;
    let sip_learn = aya::maps::RingBuf::try_from(sip_learn).context("SIP_LEARN map")?;
    let servers = Arc::new(Servers::new(&cfg, &health, &admin, Some(clones)));
    // The control runtime (signals, state, admin, the shared store); the request path has
    // its own event loops (`http::listener`).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let current: crate::shared::Current = Arc::new(std::sync::RwLock::new((Arc::new(cfg.clone()), servers.clone())));
    let store = Store::start(&cfg, &rt, &current)?;
    rt.spawn(crate::sip_learn::run(sip_learn, current.clone()));
    if store.shared.is_some() {
        servers.rewrite_all_clones();
    }
    dp.write(&cfg, &servers)?;
    let attached = dp.attach(&cfg, store.steer_mac.is_some())?;
    if let Some(trap) = dataplane::veth_trap(&cfg, store.steer_mac.is_some()) {
        tracing::warn!("{trap}");
    }
    let tables = Arc::new(std::sync::Mutex::new(dp.tables));
    let takeover_maps = takeover_maps(&mut dp.ebpf)?;
    let mut group = Group::start(&cfg, store, &tables, &rt, stay_out, takeover_maps)?;
    let access_log = cfg.access_log.as_ref().map(|s| AccessLog::start(s, servers.counters.clone())).transpose()?;
    let env = Env {
        tables: tables.clone(),
        rt: rt.handle().clone(),
        ownership: group.ownership.clone(),
        takeover: group.takeover.as_ref().map(|t| t.http()),
    };
    let capacity = Arc::new(Capacity::new(&cfg));
    let live = Running::start(Arc::new(cfg.clone()), servers, capacity, None, access_log, env)?;
    group.first_join(&rt)?;
    let (requests, request_rx) = tokio::sync::mpsc::unbounded_channel::<AgentRequest>();
    let admin = Arc::new(Admin {
        live: std::sync::RwLock::new(live.view()),
        pins_missing: std::sync::Mutex::new(Vec::new()),
        tables: tables.clone(),
        requests,
        started: std::time::Instant::now(),
        shared: group.shared.as_ref().map(|s| s.observer()),
        steering: group.steering.clone(),
        takeover: group.takeover.clone(),
        announced: std::sync::Mutex::new(group.announced()),
    });
    let admin_task = serve_admin(&cfg, &rt, admin.clone())?;
    let notifier = ready(&cfg, attached.how);
    fresh.serving();
    let mut agent = Agent { path, live, admin, current, group, notifier, ebpf: dp.ebpf, attached, plugin_watch };
    let (why, keep_dataplane) = rt.block_on(agent.serve(request_rx, keep_dataplane))?;
    agent.notifier.send(&format!("STOPPING=1\nSTATUS=stopping ({why})"));
    admin_task.abort();
    let _ = std::fs::remove_file(&cfg.admin_socket);
    agent.group.leave_at_stop(&rt);
    agent.live.stop(why);
    if keep_dataplane {
        tracing::info!(signal = why, dir = %dp.pin_dir.display(), "exiting; program stays attached and maps stay pinned");
        return Ok(());
    }
    let _ = std::fs::remove_file(&agent.attached.link_path);
    drop(agent);
    drop(rt);
    dataplane::unpin_all(&dp.pin_dir)?;
    dataplane::ids::remove(&cfg.instance);
    dataplane::release_bpffs(&dp.pin_dir);
    tracing::info!(signal = why, "detached and unpinned");
    Ok(())
}

/// Says the agent is serving: in the log (with the configuration's warnings) and to the
/// service manager (systemd, Type=notify), whose watchdog the agent's loop then pings.
fn ready(cfg: &Config, how: &str) -> crate::notify::Notifier {
    tracing::info!(interface = %cfg.interface, mode = how, vips = cfg.vips.len(), backends = cfg.backends.len(), admin = %cfg.admin_socket.display(), admin_address = ?cfg.admin_address, "dispatcher running");
    let notifier = crate::notify::Notifier::from_env();
    notifier.send(&format!(
        "READY=1\nMAINPID={}\nSTATUS=serving {} VIPs, {} backends",
        std::process::id(),
        cfg.vips.len(),
        cfg.backends.len()
    ));
    for w in &cfg.warnings {
        tracing::warn!("{w}");
    }
    notifier
}

/// Binds the admin socket (and `admin_address`) and serves them.
fn serve_admin(
    cfg: &Config,
    rt: &tokio::runtime::Runtime,
    admin: Arc<Admin>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let _guard = rt.enter();
    let unix = admin::bind(&cfg.admin_socket)
        .with_context(|| format!("binding the admin socket {}", cfg.admin_socket.display()))?;
    let tcp = match cfg.admin_address {
        Some(a) => Some(
            rt.block_on(tokio::net::TcpListener::bind(a)).with_context(|| format!("binding the admin address {a}"))?,
        ),
        None => None,
    };
    Ok(rt.spawn(admin::serve(admin, unix, tcp)))
}

/// What a start pinned afresh, removed if the start fails before it serves: the program
/// it attached goes with its link (dropped on the way out), the maps with their pins.
struct FreshPins {
    /// `None`: nothing to remove (adopted maps, or serving).
    dir: Option<std::path::PathBuf>,
    instance: String,
}

impl FreshPins {
    fn serving(&mut self) {
        self.dir = None;
    }
}

impl Drop for FreshPins {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        match dataplane::unpin_all(&dir) {
            Ok(()) => tracing::info!(dir = %dir.display(), "the start failed: removed the pins it made"),
            Err(e) => tracing::warn!(error = %e, "the start failed: removing the pins it made"),
        }
        dataplane::ids::remove(&self.instance);
        dataplane::release_bpffs(&dir);
    }
}

/// The data plane as the agent loads or adopts it.
struct Dataplane {
    ebpf: aya::Ebpf,
    tables: Tables,
    /// Its maps were pinned by an earlier agent.
    adopted: bool,
    pin_dir: std::path::PathBuf,
}

impl Dataplane {
    /// Loads the program with its maps, adopting the pinned ones; on adoption, `cfg` is
    /// placed at the ids the pinned maps know its backends and VIPs by.
    fn load(cfg: &mut Config) -> anyhow::Result<Dataplane> {
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
            if dataplane::ids::load(cfg).is_some() {
                *cfg = dataplane::ids::placed(cfg.clone())
                    .map_err(|e| anyhow::anyhow!("adopting the pinned maps: {e}"))?;
            } else {
                tracing::warn!("no id table for the pinned maps (left by an older agent?): backends and VIPs keep the ids of their positions");
            }
            for (i, v) in cfg.vips.iter().enumerate() {
                tables.adopt_ring(i as u32, v.ring_size())?;
            }
            tracing::info!(dir = %pin_dir.display(), flows = tables.flow_count(), "adopted pinned maps");
        }
        Ok(Dataplane { ebpf, tables, adopted, pin_dir })
    }

    /// Health and operator state per backend to start with: an operator's drain or
    /// disable, and a backend found down, survive an agent restart; a backend removed
    /// from the file keeps its slot, out of service (its flows and sessions go to its
    /// replica, as after a reload).
    fn initial_states(&self, cfg: &Config) -> (Vec<Health>, Vec<Operator>) {
        let n = cfg.backends.len();
        let (mut health, mut admin) = (vec![Health::Up; n], vec![Operator::None; n]);
        for i in (0..n).filter(|_| self.adopted) {
            if let Ok(info) = self.tables.backend(i as u32) {
                (health[i], admin[i]) = adopted_state(&info);
            }
        }
        for (i, _) in cfg.backends.iter().enumerate().filter(|(_, b)| b.retired) {
            admin[i] = Operator::Disabled;
        }
        (health, admin)
    }

    /// Writes the configuration and the backends' states into the maps.
    fn write(&mut self, cfg: &Config, servers: &Servers) -> anyhow::Result<()> {
        let states: Vec<u8> = servers.backends.iter().map(|b| b.state() as u8).collect();
        let ops: Vec<u8> = servers.backends.iter().map(|b| b.operator() as u8).collect();
        self.tables.apply(cfg, &states, &ops).context("writing the configuration into the maps")?;
        if self.adopted {
            let stale = self.tables.remove_stale_vips(cfg);
            if stale > 0 {
                tracing::info!(entries = stale, "removed VIPS entries of VIPs no longer configured");
            }
        }
        if let Err(e) = dataplane::ids::save(cfg) {
            tracing::warn!(error = %e, "recording the id table");
        }
        Ok(())
    }

    /// Pins the program and attaches it (or swaps it into the link a previous run left).
    /// `steering`: this dispatcher steers; otherwise whatever an earlier run left, nothing
    /// is steered.
    fn attach(&mut self, cfg: &Config, steering: bool) -> anyhow::Result<Attachment> {
        // The program too, so that bpftool and a later agent can find it by path.
        let prog_path = self.pin_dir.join("prog");
        let _ = std::fs::remove_file(&prog_path);
        dataplane::program(&mut self.ebpf, "dispatcher")?.pin(&prog_path).context("pinning the XDP program")?;
        let link_path = self.pin_dir.join("link");
        let pins = dataplane::pins::Pins::record(&self.pin_dir).context("reading back the pinned maps")?;
        let (link, how) = if link_path.exists() {
            // A previous run left the program attached: swap the new program in atomically.
            let fd: FdLink = PinnedLink::from_pin(&link_path).context("opening the pinned XDP link")?.into();
            let xdp_link = aya::programs::xdp::XdpLink::try_from(fd).context("pinned link is not an XDP link")?;
            let xdp = dataplane::program(&mut self.ebpf, "dispatcher")?;
            let id = xdp.attach_to_link(xdp_link).context("replacing the attached program")?;
            let link = FdLink::try_from(xdp.take_link(id)?).context("XDP link")?;
            (link, "replaced")
        } else {
            let (link, how) = dataplane::attach(&mut self.ebpf, "dispatcher", &cfg.interface, cfg.xdp_mode)
                .with_context(|| format!("attaching to {}", cfg.interface))?;
            let link: FdLink = link.pin(&link_path).context("pinning the XDP link")?.into();
            (link, if how == Attached::Native { "native" } else { "generic" })
        };
        // When a listener closes (reload), connections in its accept queue move to the new
        // one instead of being reset (SO_REUSEPORT group; Linux 5.14+).
        let _ = std::fs::write("/proc/sys/net/ipv4/tcp_migrate_req", "1");
        if !steering {
            self.tables.set_steer_conf(&Default::default()).context("clearing STEER_CONF")?;
        }
        Ok(Attachment { link: Some(link), how, prog_path, link_path, pins })
    }
}

/// The attached program and what keeps it pinned.
struct Attachment {
    link: Option<FdLink>,
    how: &'static str,
    prog_path: std::path::PathBuf,
    link_path: std::path::PathBuf,
    pins: dataplane::pins::Pins,
}

/// `TAKEOVER` and `TAKEOVER_EVENTS` (`takeover`).
type TakeoverMaps = (
    aya::maps::HashMap<aya::maps::MapData, dispatcher_common::FlowKey, dispatcher_common::TakeoverRec>,
    aya::maps::RingBuf<aya::maps::MapData>,
);

fn takeover_maps(ebpf: &mut aya::Ebpf) -> anyhow::Result<TakeoverMaps> {
    let map = ebpf.take_map("TAKEOVER").ok_or_else(|| anyhow::anyhow!("TAKEOVER map missing"))?;
    let ring = ebpf.take_map("TAKEOVER_EVENTS").ok_or_else(|| anyhow::anyhow!("TAKEOVER_EVENTS map missing"))?;
    Ok((
        aya::maps::HashMap::try_from(map).context("TAKEOVER map")?,
        aya::maps::RingBuf::try_from(ring).context("TAKEOVER_EVENTS map")?,
    ))
}

/// `[cluster]`: the link to the shared store, and this dispatcher's steering MAC.
struct Store {
    shared: Option<crate::shared::Shared>,
    /// The peer channel (with steering).
    liveness: Option<Arc<crate::peers::Liveness>>,
    steer_mac: Option<[u8; 6]>,
    /// It takes connections (published in its member key; `dispatcher leave` clears it).
    joined: Arc<std::sync::atomic::AtomicBool>,
}

impl Store {
    fn start(cfg: &Config, rt: &tokio::runtime::Runtime, current: &crate::shared::Current) -> anyhow::Result<Store> {
        // Steering: this dispatcher's MAC goes into its member key, for the others' tables.
        // Joined only once everything here serves (`Group::first_join`): the others steer
        // nothing here before this dispatcher's own table is in place.
        let joined = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let steer_mac = match &cfg.cluster {
            Some(c) if c.steering => Some(crate::netif::hardware_address(&cfg.interface)?),
            _ => None,
        };
        if let (Some(c), Some(mac)) = (&cfg.cluster, steer_mac) {
            Running::own_pin_matches(c, &cfg.interface, mac)?;
        }
        // Peer heartbeats on the segment steering uses (`peers`): started before the store's
        // link, which tells them whom to watch and publishes what they hear.
        let liveness = match (&cfg.cluster, steer_mac) {
            (Some(c), Some(_)) => {
                let ip = crate::netif::host_address(&cfg.interface)?;
                let local = std::net::SocketAddr::new(ip, c.heartbeat_port);
                let _rt = rt.enter();
                Some(
                    crate::peers::Liveness::start(&c.name, local, c.heartbeat_interval, c.heartbeat_misses)
                        .with_context(|| format!("binding the peer heartbeats to {local} (udp)"))?,
                )
            }
            _ => None,
        };
        let shared = cfg.cluster.clone().map(|s| {
            let me = crate::shared::Identity { mac: steer_mac, joined: joined.clone(), liveness: liveness.clone() };
            rt.block_on(crate::shared::Shared::start(s, current.clone(), me))
        });
        Ok(Store { shared, liveness, steer_mac, joined })
    }
}

/// This dispatcher in its group: announcements, the member key, steering, and whether a
/// connection stays after its response.
struct Group {
    joined: Arc<std::sync::atomic::AtomicBool>,
    ownership: Arc<crate::steering::Ownership>,
    announcer: Option<crate::announce::Announcer>,
    shared: Option<crate::shared::Shared>,
    steering: Option<Arc<crate::steering::Steering>>,
    /// Connection takeover (with steering and `[cluster] takeover`).
    takeover: Option<Arc<crate::takeover::Takeover>>,
    /// To join as soon as this dispatcher's own steering table is in place.
    join_pending: bool,
    /// When this dispatcher last left (`dispatcher leave`), for the grace at stop.
    left_at: Option<std::time::Instant>,
    /// `instance::left_mark`: written by an operator's leave, removed by a join.
    left_mark: std::path::PathBuf,
}

impl Group {
    fn start(
        cfg: &Config,
        store: Store,
        tables: &Arc<std::sync::Mutex<Tables>>,
        rt: &tokio::runtime::Runtime,
        stay_out: bool,
        (takeover_map, takeover_ring): TakeoverMaps,
    ) -> anyhow::Result<Group> {
        let ownership = Arc::new(crate::steering::Ownership::default());
        let steering = match (&store.shared, &cfg.cluster, store.steer_mac) {
            (Some(sh), Some(c), Some(mac)) => {
                let st = crate::steering::Steering::new(
                    tables.clone(),
                    c.name.clone(),
                    mac,
                    c.second_chance,
                    store.joined.clone(),
                    ownership.clone(),
                );
                rt.spawn(crate::steering::run(st.clone(), sh.peers()));
                Some(st)
            }
            _ => None,
        };
        let takeover = match (&steering, &store.shared, &cfg.cluster, &store.liveness) {
            (Some(st), Some(sh), Some(c), Some(l)) if c.takeover => {
                use crate::takeover::{inbox::Inbox, outbox::Outbox, Takeover};
                let st = st.clone();
                let armed = Box::new(move |on| st.set_takeover_armed(on));
                let t = Arc::new(Takeover {
                    outbox: Outbox::new(&c.name, ownership.clone()),
                    inbox: Inbox::new(takeover_map, armed, cfg.http.client_idle_timeout),
                    adoption: Default::default(),
                });
                l.set_cargo(t.clone());
                rt.spawn(crate::takeover::run(t.clone(), takeover_ring));
                rt.spawn(crate::takeover::follow_deaths(t.clone(), sh.alive()));
                Some(t)
            }
            _ => None,
        };
        // Announced once the VIPs are served (`first_join`).
        let announcer = match &cfg.announce {
            Some(a) => Some(crate::announce::Announcer::start(a).context("creating the announcement interfaces")?),
            None => None,
        };
        let in_a_group = announcer.is_some() || store.shared.is_some();
        let left_mark = crate::instance::left_mark(&cfg.instance);
        let left = left_mark.exists();
        if in_a_group && (stay_out || left) {
            let why = if left {
                format!("an operator's `dispatcher leave` ({}), kept until `dispatcher join`", left_mark.display())
            } else {
                "started with --stay-out".to_string()
            };
            tracing::warn!(
                "staying out of the group ({why}): serving, not announced, no slots; `dispatcher join` joins"
            );
        }
        let join_pending = in_a_group && !stay_out && !left;
        let joined = store.joined;
        Ok(Group {
            joined,
            ownership,
            announcer,
            shared: store.shared,
            steering,
            takeover,
            join_pending,
            left_at: None,
            left_mark,
        })
    }

    /// Steering off, or this dispatcher's own table in place.
    fn ready_to_join(&self) -> bool {
        self.steering.as_ref().is_none_or(|s| s.installed())
    }

    /// Joins once everything here serves. With steering, only once this dispatcher's own
    /// table is in place (the one without it, what the others use now: it becomes the
    /// previous table when this one joins); until then nothing is announced, since
    /// connections ECMP moved here would find no steering (`retry_join`, every second).
    fn first_join(&mut self, rt: &tokio::runtime::Runtime) -> anyhow::Result<()> {
        if let Some(st) = &self.steering {
            let t0 = std::time::Instant::now();
            while !st.installed() && t0.elapsed() < std::time::Duration::from_secs(2) {
                rt.block_on(async { tokio::time::sleep(std::time::Duration::from_millis(10)).await });
            }
        }
        if self.join_pending && self.ready_to_join() {
            self.membership(true).map_err(|e| anyhow::anyhow!("joining: {e}"))?;
            self.join_pending = false;
        } else if self.join_pending {
            tracing::warn!("not joining yet: no membership from the shared store to build the ownership table from (retried every second)");
        }
        Ok(())
    }

    fn retry_join(&mut self) {
        if self.join_pending && self.ready_to_join() {
            match self.membership(true) {
                Ok(_) => self.join_pending = false,
                Err(e) => crate::ratelimit::warn("joining", &e),
            }
        }
    }

    /// `[announce]`: announced now.
    fn announced(&self) -> Option<bool> {
        self.announcer.as_ref().map(|a| a.joined())
    }

    /// An operator's `join` or `leave`.
    fn operator(&mut self, join: bool) -> Result<String, String> {
        self.join_pending = false;
        let was_in = self.joined.load(std::sync::atomic::Ordering::Relaxed);
        let what = self.membership(join)?;
        if was_in && !join {
            self.left_at = Some(std::time::Instant::now());
        } else if join {
            self.left_at = None;
        }
        // Kept across a restart of the agent until the operator joins again.
        let mark = &self.left_mark;
        let marked = if join {
            std::fs::remove_file(mark)
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
        } else {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            std::fs::write(mark, format!("left at unix time {now}\n"))
        };
        Ok(match marked {
            Ok(()) if join => what,
            Ok(()) => format!("{what}; stays out across a restart of the agent until `dispatcher join`"),
            Err(e) => {
                format!("{what}; but {} could not be {}: {e}", mark.display(), if join { "removed" } else { "written" })
            }
        })
    }

    /// `dispatcher join` / `leave` (and stop): announcements, the member key, the local
    /// ownership table, the fate of keep-alive connections.
    fn membership(&mut self, join: bool) -> Result<String, String> {
        if self.announcer.is_none() && self.shared.is_none() {
            return Err("neither [announce] nor [cluster] is configured: there is no group to leave or join".into());
        }
        self.joined.store(join, std::sync::atomic::Ordering::Relaxed);
        self.ownership.set_leaving(!join);
        let mut done = Vec::new();
        if let Some(a) = &mut self.announcer {
            a.set_joined(join).map_err(|e| format!("{e:#}"))?;
            done.push(if join { "VIPs announced" } else { "VIPs withdrawn" });
        }
        if let Some(sh) = &self.shared {
            sh.publish_member();
        }
        if let Some(st) = &self.steering {
            st.refresh();
            done.push(if join { "in the ownership table" } else { "out of the ownership table" });
        }
        if !join {
            done.push("client connections close after their next response");
        }
        tracing::info!(joined = join, "{}", done.join("; "));
        Ok(format!("{}: {}", if join { "joined" } else { "left" }, done.join("; ")))
    }

    /// Out of the group first at stop: routes withdrawn, this dispatcher's slots to the
    /// others, connections closed after their next response while in-flight requests
    /// finish. The router follows a withdrawal within BGP's propagation, the others'
    /// tables within a watch event: until then packets may still come here, and this host
    /// must still steer them (its XDP program may be detached on exit). Counted from the
    /// leave.
    fn leave_at_stop(&mut self, rt: &tokio::runtime::Runtime) {
        if let Some(t) = &self.takeover {
            // A stop is not a death: the peers forget this dispatcher's connection records
            // before its lease goes (they drain here), rather than take them over.
            t.outbox.forget_all();
            rt.block_on(async {
                let until = std::time::Instant::now() + FORGET_WAIT;
                while !t.outbox.forgotten() && std::time::Instant::now() < until {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                // A few more batches say it again (one may be lost).
                tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            });
        }
        let was_in = self.joined.load(std::sync::atomic::Ordering::Relaxed);
        let announcer_configured = self.announcer.is_some();
        if self.announcer.is_some() || self.shared.is_some() {
            let _ = self.membership(false);
        }
        if let Some(a) = self.announcer.take() {
            a.stop();
        }
        if announcer_configured || self.steering.is_some() {
            let since = if was_in { None } else { self.left_at };
            let wait = LEAVE_GRACE.saturating_sub(since.map(|t| t.elapsed()).unwrap_or_default());
            if !wait.is_zero() {
                tracing::info!(
                    wait_ms = wait.as_millis() as u64,
                    "withdrawn; waiting for the router and the others to follow"
                );
                std::thread::sleep(wait);
            }
        }
        if let Some(shared) = self.shared.take() {
            // The others stop counting this dispatcher now, not when its lease runs out.
            rt.block_on(shared.leave());
        }
    }
}

/// How long a stopping agent waits for its peers to be told to forget its connections.
const FORGET_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// The running agent between start and stop: what its main loop works on.
struct Agent<'a> {
    path: &'a Path,
    live: Running,
    admin: Arc<Admin>,
    current: crate::shared::Current,
    group: Group,
    notifier: crate::notify::Notifier,
    ebpf: aya::Ebpf,
    attached: Attachment,
    /// `[http] plugin_config` as last seen.
    plugin_watch: PluginWatch,
}

impl Agent<'_> {
    /// Serves until a signal or `dispatcher stop`; returns why, and whether the data plane
    /// stays.
    async fn serve(
        &mut self,
        mut requests: tokio::sync::mpsc::UnboundedReceiver<AgentRequest>,
        keep_dataplane: bool,
    ) -> anyhow::Result<(&'static str, bool)> {
        let signal = shutdown_signal();
        tokio::pin!(signal);
        let mut pin_check = tokio::time::interval(PIN_CHECK);
        let watchdog_every = self.notifier.watchdog_every();
        let mut watchdog = tokio::time::interval(watchdog_every.unwrap_or(std::time::Duration::from_secs(3600)));
        // SIGHUP reloads, as for HAProxy and nginx (`systemctl kill -s HUP`, or a
        // terminal closing on an agent run by hand, which must not end it).
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        loop {
            tokio::select! {
                s = &mut signal => return s.map(|s| (s, keep_dataplane)),
                _ = watchdog.tick(), if watchdog_every.is_some() => self.notifier.send("WATCHDOG=1"),
                _ = hangup.recv() => {
                    tracing::info!("SIGHUP: reloading");
                    let (reply, _) = tokio::sync::oneshot::channel();
                    let _ = self.admin.requests.send(AgentRequest::Reload(reply));
                }
                _ = pin_check.tick() => self.every_second(),
                Some(request) = requests.recv() => match request {
                    AgentRequest::Reload(reply) => {
                        let _ = reply.send(self.reload());
                    }
                    AgentRequest::Stop { detach } => return Ok(("dispatcher stop", !detach)),
                    AgentRequest::Membership(join, reply) => {
                        let r = self.group.operator(join);
                        *self.admin.announced.lock().unwrap() = self.group.announced();
                        let _ = reply.send(r);
                    }
                },
            }
        }
    }

    /// The pins kept, a pending join tried again, and a changed plugin-cfg.xml reloaded.
    fn every_second(&mut self) {
        if let Some(path) = self.plugin_watch.changed(&self.live.cfg, std::time::Instant::now()) {
            // As SIGHUP: the whole configuration is read again, the file with it; one that
            // fails to parse or validate is refused and the running one stays.
            tracing::info!(file = %path.display(), "plugin_config changed: reloading");
            let (reply, _) = tokio::sync::oneshot::channel();
            let _ = self.admin.requests.send(AgentRequest::Reload(reply));
        }
        let a = &mut self.attached;
        let missing = keep_pins(&a.pins, &mut self.ebpf, &mut a.link, &a.prog_path, &a.link_path);
        *self.admin.pins_missing.lock().unwrap() = missing;
        if self.group.join_pending {
            self.group.retry_join();
            *self.admin.announced.lock().unwrap() = self.group.announced();
        }
    }

    /// `dispatcher reload` or SIGHUP.
    fn reload(&mut self) -> Result<(String, Vec<String>), String> {
        self.notifier.send("RELOADING=1");
        // The plugin-cfg.xml as it is before this reload reads it: what the watch compares
        // with from now on, whatever the outcome (a refused file is not tried again until
        // it changes; a change made while reloading is seen).
        let before = self.plugin_watch.stamp_now(&self.live.cfg);
        let r = self.live.reload(self.path);
        self.plugin_watch.reloaded(&self.live.cfg, before);
        match &r {
            Ok((what, changes)) => {
                *self.admin.live.write().unwrap() = self.live.view();
                *self.current.write().unwrap() = (self.live.cfg.clone(), self.live.servers.clone());
                // The shared state, on the new servers (and read again if the peers or
                // backends changed).
                if let Some(shared) = &self.group.shared {
                    shared.reloaded();
                }
                // A death from now on arms its records for the new idle timeout.
                if let Some(t) = &self.group.takeover {
                    t.inbox.set_lifetime(self.live.cfg.http.client_idle_timeout);
                }
                let listed = if changes.is_empty() { "no changes".to_string() } else { changes.join("; ") };
                tracing::info!(summary = %what, changes = %listed, "configuration reloaded");
                self.notifier.send(&format!("READY=1\nSTATUS=reloaded: {what}"));
            }
            Err(why) => {
                tracing::warn!(error = %why, "reload refused; the running configuration stays");
                let first = why.lines().next().unwrap_or_default();
                self.notifier.send(&format!("READY=1\nSTATUS=reload refused: {first}"));
            }
        }
        r
    }
}

/// What every configuration's `Running` is given: the maps, the control runtime, and
/// what the HTTP path asks before keeping a connection (the same across reloads).
#[derive(Clone)]
struct Env {
    tables: Arc<std::sync::Mutex<Tables>>,
    rt: tokio::runtime::Handle,
    ownership: Arc<crate::steering::Ownership>,
    /// Takeover's side of the HTTP path (registering connections, adopting rebuilt ones).
    takeover: Option<crate::takeover::Http>,
}

/// What runs for one configuration: the servers state, the request path's capacity, the
/// HTTP VIPs, the control loop.
struct Running {
    cfg: Arc<Config>,
    servers: Arc<Servers>,
    /// Handed to the next generation by a reload.
    capacity: Arc<Capacity>,
    server: Option<HttpServer>,
    /// The SIP VIPs over TCP and TLS.
    sip: Option<crate::sip::SipServer>,
    control: tokio::task::JoinHandle<()>,
    commands: tokio::sync::mpsc::UnboundedSender<AdminCommand>,
    /// `[access_log]`'s writer (kept across reloads, its file reopened by each).
    access_log: Option<Arc<AccessLog>>,
    env: Env,
}

impl Running {
    /// `predecessor`: the server of the configuration this one replaces, whose
    /// listening sockets are taken over.
    fn start(
        cfg: Arc<Config>,
        servers: Arc<Servers>,
        capacity: Arc<Capacity>,
        predecessor: Option<&HttpServer>,
        access_log: Option<Arc<AccessLog>>,
        env: Env,
    ) -> anyhow::Result<Running> {
        let server = if cfg.vips.iter().any(|v| v.serves_http()) {
            let (c, own) = (servers.clone(), env.ownership.clone());
            Some(
                HttpServer::start(
                    &cfg,
                    c,
                    capacity.clone(),
                    predecessor,
                    access_log.as_ref(),
                    own,
                    env.takeover.clone(),
                )
                .context("starting the HTTP VIPs")?,
            )
        } else {
            None
        };
        let sip = if cfg.vips.iter().any(|v| !v.retired && v.sip_stream().is_some()) {
            Some(
                crate::sip::SipServer::start(&cfg, servers.clone())
                    .context("starting the SIP VIPs over TCP and TLS")?,
            )
        } else {
            None
        };
        // Health checks, failed requests and operator commands decide the backends' states.
        let (commands, commands_rx) = tokio::sync::mpsc::unbounded_channel();
        let control =
            env.rt.spawn(crate::control::run((*cfg).clone(), servers.clone(), env.tables.clone(), commands_rx));
        Ok(Running { cfg, servers, capacity, server, sip, control, commands, access_log, env })
    }

    fn view(&self) -> Live {
        Live {
            cfg: self.cfg.clone(),
            servers: self.servers.clone(),
            capacity: self.capacity.clone(),
            commands: self.commands.clone(),
        }
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
    /// listener), in-flight requests finish on the old loops, backend states and learned
    /// clone IDs carried over.
    fn reload(&mut self, path: &Path) -> Result<(String, Vec<String>), String> {
        let new = Config::load(path).map_err(|e| e.to_string())?;
        let merged = self.cfg.merged_for_reload(new)?;
        // `peers` may change by reload: this dispatcher's own pin is checked as at start.
        if let Some(c) = merged.cluster.as_ref().filter(|c| c.steering) {
            let mac = crate::netif::hardware_address(&merged.interface).map_err(|e| crate::logging::error_text(&e))?;
            Self::own_pin_matches(c, &merged.interface, mac).map_err(|e| crate::logging::error_text(&e))?;
        }
        let (health, admin) = self.carried_states(&merged);
        let (states, ops) = map_bytes(&health, &admin);
        let (access_log, reopened) = self.access_log_for(&merged)?;
        // The learned clone table first: the new listeners route learned IDs from their
        // first request.
        let servers = Servers::successor_of(&merged, &health, &admin, &self.servers);
        let capacity = Arc::new(self.capacity.successor(&merged));
        let merged = Arc::new(merged);
        let next = Running::start(
            merged.clone(),
            servers.clone(),
            capacity.clone(),
            self.server.as_ref(),
            access_log,
            self.env.clone(),
        )
        .map_err(|e| crate::logging::error_text(&e))?;
        let tables = &self.env.tables;
        if let Err(e) = tables.lock().unwrap().apply(&merged, &states, &ops) {
            // Refused: the new loops stop (the old ones never did), and the old servers
            // passes nothing on to the one that will not serve.
            self.servers.forget_successor();
            let mut next = next;
            next.stop("reload refused");
            return Err(format!("writing the maps: {e}"));
        }
        // Nothing can refuse it from here on.
        crate::control::rebuild_ramping_rings(&merged, &servers, tables);
        if let Err(e) = dataplane::ids::save(&merged) {
            tracing::warn!(error = %e, "recording the id table");
        }
        servers.adopt_map(&self.servers);
        // Said before the configuration's limits replace a runtime maxconn on the shared slots.
        let ended = crate::admin::settings::ended(&self.cfg, &self.servers, &merged);
        servers.apply_limits(&merged);
        let (per_source, rate) = crate::http::listener::source_limits(&merged);
        capacity.sources.configure(per_source, rate);
        if let (Some(log), Some(r)) = (&next.access_log, reopened) {
            log.switch(r);
        }
        let summary = self.summary(&merged);
        let mut changes = merged.changes_from(&self.cfg);
        changes.extend(ended);
        let mut old = std::mem::replace(self, next);
        old.control.abort();
        if let Some(sip) = old.sip.take() {
            // Its callers reconnect to the new listeners (bound beside the old ones).
            std::thread::spawn(move || sip.shutdown());
        }
        if let Some(server) = old.server.take() {
            // The old loops finish their requests in the background.
            std::thread::spawn(move || {
                let left = server.shutdown();
                tracing::info!(unfinished = left, "previous HTTP listeners stopped");
            });
        }
        Ok((summary, changes))
    }

    /// Health and the operator's state per backend of `merged`: they go on; a removed
    /// backend is disabled, one configured again is back in service (ramping up, with
    /// `slow_start`).
    fn carried_states(&self, merged: &Config) -> (Vec<Health>, Vec<Operator>) {
        merged
            .backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let (h, a) = self.servers.health_and_admin(i).unwrap_or((Health::Up, Operator::None));
                let was_retired = self.cfg.backends.get(i).is_some_and(|o| o.retired);
                if b.retired {
                    (h, Operator::Disabled)
                } else if was_retired {
                    (h, Operator::None)
                } else {
                    (h, a)
                }
            })
            .unzip()
    }

    /// The access log for `merged`, and its file opened again (log rotation): one that
    /// cannot be opened refuses the reload, and the old one stays in use. It is switched
    /// to once the reload has succeeded, like the backends' limits: a refused reload
    /// changes nothing.
    #[allow(clippy::type_complexity)]
    fn access_log_for(
        &self,
        merged: &Config,
    ) -> Result<(Option<Arc<AccessLog>>, Option<crate::access_log::Reopened>), String> {
        match (&merged.access_log, &self.access_log) {
            (Some(s), Some(log)) if s.buffer == log.settings().buffer => {
                let reopened = AccessLog::reopen(s).map_err(|e| crate::logging::error_text(&e))?;
                Ok((Some(log.clone()), Some(reopened)))
            }
            (Some(s), _) => {
                let log =
                    AccessLog::start(s, self.servers.counters.clone()).map_err(|e| crate::logging::error_text(&e))?;
                Ok((Some(log), None))
            }
            (None, _) => Ok((None, None)),
        }
    }

    /// What a reload says it did.
    fn summary(&self, merged: &Config) -> String {
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
        summary
    }

    fn stop(&mut self, why: &str) {
        self.control.abort();
        if let Some(sip) = self.sip.take() {
            sip.shutdown();
        }
        if let Some(server) = self.server.take() {
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

/// What says a file changed: written in place (mtime, size) or replaced by a rename, as
/// deployment tools do (device and inode); `None`: not there.
type FileStamp = Option<(Option<std::time::SystemTime>, u64, u64, u64)>;

fn file_stamp(path: &Path) -> FileStamp {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.modified().ok(), m.dev(), m.ino(), m.len()))
}

/// `[http] plugin_config` watched: looked at every `plugin_refresh` (the plug-in's
/// `RefreshInterval`), a reload asked for when it changed since the last look.
struct PluginWatch {
    seen: Option<(std::path::PathBuf, FileStamp)>,
    next: std::time::Instant,
}

impl PluginWatch {
    /// As the file is now (just after `cfg` was read from it).
    fn new(cfg: &Config) -> PluginWatch {
        let seen = cfg.http.plugin_config.as_ref().map(|p| (p.clone(), file_stamp(p)));
        PluginWatch { seen, next: std::time::Instant::now() + cfg.http.plugin_refresh }
    }

    /// The running configuration's plugin_config and its stamp now.
    fn stamp_now(&self, cfg: &Config) -> Option<(std::path::PathBuf, FileStamp)> {
        cfg.http.plugin_config.as_ref().map(|p| (p.clone(), file_stamp(p)))
    }

    /// A reload was made with the file as `before` was stamped (the running
    /// configuration's file then); `cfg` is the configuration running now.
    fn reloaded(&mut self, cfg: &Config, before: Option<(std::path::PathBuf, FileStamp)>) {
        self.seen = match (before, &cfg.http.plugin_config) {
            (Some((p, stamp)), Some(now)) if p == *now => Some((p, stamp)),
            // Another file (or none) since the reload: as it is now.
            _ => self.stamp_now(cfg),
        };
    }

    /// The file, if it is time to look and it changed since the last look (the running
    /// configuration `cfg` says which file, and how often).
    fn changed(&mut self, cfg: &Config, now: std::time::Instant) -> Option<std::path::PathBuf> {
        let Some(path) = &cfg.http.plugin_config else {
            self.seen = None;
            return None;
        };
        if now < self.next && self.seen.as_ref().is_some_and(|(p, _)| p == path) {
            return None;
        }
        self.next = now + cfg.http.plugin_refresh;
        let stamp = file_stamp(path);
        let before = self.seen.replace((path.clone(), stamp));
        match before {
            // Another file since a reload: the reload read it.
            Some((p, old)) if p == *path && old != stamp => Some(path.clone()),
            _ => None,
        }
    }
}
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

    /// The watch asks for a reload when the file is written in place or replaced by a
    /// rename, once per change, not before `plugin_refresh` has passed, and not for a
    /// file a reload has just read.
    #[test]
    fn a_changed_plugin_config_is_reloaded_once_per_change() {
        let dir = std::env::temp_dir().join(format!("dispatcher-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let xml = dir.join("plugin-cfg.xml");
        std::fs::write(&xml, "<Config/>").unwrap();
        let mut cfg = Config::parse("[dispatcher]\ninterface = \"lo\"\n", "t").unwrap();
        cfg.http.plugin_config = Some(xml.clone());
        cfg.http.plugin_refresh = std::time::Duration::from_secs(5);
        let mut w = PluginWatch::new(&cfg);
        let t0 = std::time::Instant::now();
        let later = |s| t0 + std::time::Duration::from_secs(s);
        assert_eq!(w.changed(&cfg, later(6)), None, "unchanged");
        std::fs::write(&xml, "<Config RefreshInterval=\"5\"/>").unwrap();
        assert_eq!(w.changed(&cfg, later(7)), None, "not time to look yet");
        assert_eq!(w.changed(&cfg, later(11)), Some(xml.clone()), "written in place");
        assert_eq!(w.changed(&cfg, later(17)), None, "once per change");
        // Replaced by a rename, same size and (possibly) the same mtime: a new inode.
        let new = dir.join("plugin-cfg.xml.new");
        std::fs::write(&new, "<Config RefreshInterval=\"5\"/>").unwrap();
        std::fs::rename(&new, &xml).unwrap();
        assert_eq!(w.changed(&cfg, later(23)), Some(xml.clone()), "replaced by rename");
        // Removed: a change too (the reload will say the file cannot be read).
        std::fs::remove_file(&xml).unwrap();
        assert_eq!(w.changed(&cfg, later(29)), Some(xml.clone()));
        // Another file after a reload: the reload read it, no reload asked.
        cfg.http.plugin_config = Some(dir.join("other.xml"));
        assert_eq!(w.changed(&cfg, later(30)), None);
        cfg.http.plugin_config = None;
        assert_eq!(w.changed(&cfg, later(40)), None);

        // A reload made for another reason (SIGHUP) read the file: not reloaded again for
        // the change it already read; a change made after its stamp is.
        cfg.http.plugin_config = Some(xml.clone());
        std::fs::write(&xml, "<Config/>").unwrap();
        let mut w = PluginWatch::new(&cfg);
        std::fs::write(&xml, "<Config RefreshInterval=\"7\"/>").unwrap();
        let before = w.stamp_now(&cfg);
        w.reloaded(&cfg, before);
        assert_eq!(w.changed(&cfg, later(50)), None, "the reload read this change");
        let before = w.stamp_now(&cfg);
        std::fs::write(&xml, "<Config RefreshInterval=\"19\"/>").unwrap();
        w.reloaded(&cfg, before);
        // (Another size: two writes within a clock tick may share an mtime.)
        assert_eq!(w.changed(&cfg, later(60)), Some(xml.clone()), "written while the reload ran");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
