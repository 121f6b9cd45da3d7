use std::{path::Path, process::ExitCode};

use anyhow::Context as _;
use aya::programs::links::{FdLink, PinnedLink};
use std::sync::Arc;

use dispatcher::{
    admin::{self, Admin},
    config::{Config, VipMode},
    dataplane::{
        self,
        tables::{initial_states, Tables},
        Attached, LoadOptions,
    },
    http::listener::HttpServer,
    state::Cluster,
};

pub fn run(path: &Path, keep_dataplane: bool) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    super::init_logging(&cfg.log_level);
    raise_fd_limit();
    let pin_dir = cfg.pin_dir();
    let adopted = pin_dir.join("VIPS").exists();
    let mut ebpf = dataplane::load_dispatcher(&LoadOptions {
        pin_dir: Some(&pin_dir),
        flow_table_size: cfg.flow_table_size,
        affinity_table_size: cfg.affinity_table_size,
    })
    .with_context(|| format!("loading the data plane pinned under {}", pin_dir.display()))?;
    let mut tables = Tables::from_ebpf(&mut ebpf)?;
    if adopted {
        for (i, v) in cfg.vips.iter().enumerate() {
            tables.adopt_ring(i as u32, v.ring_size)?;
        }
        tracing::info!(dir = %pin_dir.display(), flows = tables.flow_count(), "adopted pinned maps");
    }
    let mut states = initial_states(&cfg);
    if adopted {
        // An operator's drain or disable survives an agent restart.
        for (i, s) in states.iter_mut().enumerate() {
            if let Ok(info) = tables.backend(i as u32) {
                if info.state != dispatcher_common::STATE_UNUSED {
                    *s = info.state;
                }
            }
        }
    }
    tables.apply(&cfg, &states).context("writing the configuration into the maps")?;

    // The program too, so that bpftool and a later agent can find it by path.
    let prog_path = pin_dir.join("prog");
    let _ = std::fs::remove_file(&prog_path);
    dataplane::program(&mut ebpf, "dispatcher")?.pin(&prog_path).context("pinning the XDP program")?;

    let link_path = pin_dir.join("link");
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
    // The request path: the cluster state (with CLONES written through) and the HTTP VIPs.
    let clones = ebpf.take_map("CLONES").ok_or_else(|| anyhow::anyhow!("CLONES map missing"))?;
    let clones = aya::maps::HashMap::try_from(clones).context("CLONES map")?;
    let cluster = Arc::new(Cluster::new(&cfg, &states, Some(clones)));
    // The control runtime (signals, state following); the request path has its own
    // event loops (`http::listener`).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the runtime")?;
    let server = if cfg.vips.iter().any(|v| v.mode == VipMode::Http) {
        Some(HttpServer::start(&cfg, cluster.clone()).context("starting the HTTP VIPs")?)
    } else {
        None
    };
    // Health checks, failed requests and operator commands (admin endpoint, or read from
    // BACKENDS) decide the backends' states.
    let tables = Arc::new(std::sync::Mutex::new(tables));
    let (commands, commands_rx) = tokio::sync::mpsc::unbounded_channel();
    let follower = rt.spawn(dispatcher::control::run(cfg.clone(), cluster.clone(), tables.clone(), commands_rx));
    let admin = Arc::new(Admin {
        cfg: cfg.clone(),
        cluster: cluster.clone(),
        tables: tables.clone(),
        commands,
        started: std::time::Instant::now(),
    });
    let listener = {
        let _guard = rt.enter();
        admin::bind(&cfg.admin_socket)
            .with_context(|| format!("binding the admin socket {}", cfg.admin_socket.display()))?
    };
    let admin_task = rt.spawn(admin::serve(admin, listener));
    tracing::info!(interface = %cfg.interface, mode = how, vips = cfg.vips.len(), backends = cfg.backends.len(), admin = %cfg.admin_socket.display(), "dispatcher running");

    let why = rt.block_on(super::shutdown_signal())?;
    follower.abort();
    admin_task.abort();
    let _ = std::fs::remove_file(&cfg.admin_socket);
    if let Some(server) = server {
        let left = server.shutdown();
        tracing::info!(signal = why, unfinished = left, "HTTP VIPs stopped");
    }
    if keep_dataplane {
        tracing::info!(signal = why, dir = %pin_dir.display(), "exiting; program stays attached and maps stay pinned");
    } else {
        let _ = std::fs::remove_file(&link_path);
        drop(link);
        drop(rt);
        drop(tables);
        dataplane::unpin_all(&pin_dir)?;
        tracing::info!(signal = why, "detached and unpinned");
    }
    Ok(ExitCode::SUCCESS)
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

pub fn stop(path: &Path) -> anyhow::Result<ExitCode> {
    let cfg = Config::load(path)?;
    let dir = cfg.pin_dir();
    // Removing the link's pin detaches the program once no agent holds the link.
    dataplane::unpin_all(&dir)?;
    println!("removed {}", dir.display());
    Ok(ExitCode::SUCCESS)
}
