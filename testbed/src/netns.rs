//! The namespace testbed: a client, a dispatcher and backends on one L2 segment (a bridge
//! in a switch namespace), as MAC forwarding needs. Every name carries a unique prefix;
//! `Drop` stops the processes the testbed started (by pid), deletes its namespaces and
//! removes its pinned maps, also when the test fails.

use std::{
    fs::File,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::sched::{setns, CloneFlags};

/// Prefix of everything the testbeds create: `dt<pid>-<n>`.
pub const NAME_PREFIX: &str = "dt";
static COUNTER: AtomicUsize = AtomicUsize::new(0);

pub const SUBNET: &str = "10.99.0";
pub const LB_IP: &str = "10.99.0.1";
pub const CLIENT_IP: &str = "10.99.0.2";
pub const LB_MAC: &str = "02:99:00:00:00:01";
pub const CLIENT_MAC: &str = "02:99:00:00:00:02";

pub fn backend_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, 10 + i as u8)
}

/// The testbed's IPv6 subnet (`Testbed::add_ipv6`): fd99::/64, the same host numbers.
pub const LB_IP6: &str = "fd99::1";
pub const CLIENT_IP6: &str = "fd99::2";

pub fn backend_ip6(i: usize) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 0x10 + i as u16)
}

pub fn backend_mac(i: usize) -> String {
    format!("02:99:00:00:00:{:02x}", 0x10 + i)
}

/// Runs a command, panicking with its output when it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    if !out.status.success() {
        panic!("{args:?} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command, ignoring failure (cleanup paths).
fn sh_quiet(args: &[&str]) {
    let _ = Command::new(args[0]).args(&args[1..]).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// A network namespace by name.
#[derive(Clone, Debug)]
pub struct Ns {
    pub name: String,
}

impl Ns {
    pub fn ip(&self, args: &[&str]) -> String {
        let mut v = vec!["ip", "-n", &self.name];
        v.extend_from_slice(args);
        sh(&v)
    }

    pub fn exec(&self, args: &[&str]) -> String {
        let mut v = vec!["ip", "netns", "exec", &self.name];
        v.extend_from_slice(args);
        sh(&v)
    }

    pub fn sysctl(&self, kv: &str) {
        self.exec(&["sysctl", "-qw", kv]);
    }

    fn handle(&self) -> File {
        File::open(format!("/run/netns/{}", self.name)).unwrap_or_else(|e| panic!("netns {}: {e}", self.name))
    }

    /// Runs `f` on a new thread that has entered this namespace; sockets it creates
    /// belong to the namespace and can be used from any thread afterwards.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        self.spawn(f).join().expect("thread in namespace panicked")
    }

    /// Runs `f` with a borrowed value inside this namespace (on a scoped thread).
    pub fn run_with<A: Send, T: Send>(&self, a: &mut A, f: impl FnOnce(&mut A) -> T + Send) -> T {
        let fd = self.handle();
        std::thread::scope(|s| {
            s.spawn(move || {
                setns(&fd, CloneFlags::CLONE_NEWNET).expect("setns");
                f(a)
            })
            .join()
            .expect("thread in namespace panicked")
        })
    }

    pub fn spawn<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        let fd = self.handle();
        std::thread::spawn(move || {
            setns(&fd, CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
    }

    /// A command started inside this namespace (network namespace only, so that bpffs
    /// and /sys stay the host's, unlike `ip netns exec`).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        use std::os::unix::process::CommandExt;
        let fd = self.handle();
        let mut cmd = Command::new(program);
        unsafe {
            cmd.pre_exec(move || {
                setns(&fd, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        cmd
    }
}

/// A background task the testbed stops on drop.
struct Stoppable {
    backend: usize,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

pub struct Testbed {
    pub prefix: String,
    pub switch: Ns,
    pub client: Ns,
    pub lb: Ns,
    pub backends: Vec<Ns>,
    children: Vec<(String, Child)>,
    tasks: Vec<Stoppable>,
    pin_dirs: Vec<PathBuf>,
    pass: Option<(aya::Ebpf, aya::programs::links::FdLink)>,
    /// `pass` on more switch ports (`enable_xdp_tx_from`).
    extra_pass: Vec<(aya::Ebpf, aya::programs::links::FdLink)>,
    pub workdir: PathBuf,
    /// Hosts added after the build (`add_host`), and agent instances besides `prefix`
    /// (`add_instance`): taken down on drop too.
    extra_hosts: Vec<Ns>,
    extra_instances: Vec<String>,
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes what testbeds of dead test processes left behind (a killed test run cannot
/// clean up after itself; the next run does).
pub fn cleanup_stale() {
    let owner_dead = |name: &str| -> bool {
        let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
            return false;
        };
        let pid: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        match pid.parse::<u32>() {
            Ok(pid) => rest[pid.to_string().len()..].starts_with('-') && !pid_alive(pid),
            Err(_) => false,
        }
    };
    if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if owner_dead(name) {
                sh_quiet(&["ip", "netns", "del", name]);
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/sys/fs/bpf/dispatcher") {
        for e in entries.flatten() {
            if owner_dead(&e.file_name().to_string_lossy()) {
                let _ = dispatcher::dataplane::unpin_all(&e.path());
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir("/run/dispatcher") {
        for e in entries.flatten() {
            let file = e.file_name().to_string_lossy().into_owned();
            if owner_dead(run_file_instance(&file)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The instance a file of /run/dispatcher belongs to (`<instance>.sock`, `.lock`,
/// `.ids.json`, `.left`).
fn run_file_instance(file: &str) -> &str {
    [".sock", ".lock", ".ids.json", ".left"].iter().find_map(|s| file.strip_suffix(s)).unwrap_or(file)
}

/// A name prefix no other testbed uses (`dt<pid>-<n>`), after removing what testbeds of
/// dead test processes left.
pub fn fresh_prefix() -> String {
    cleanup_stale();
    format!("{NAME_PREFIX}{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst))
}

impl Testbed {
    /// Client, dispatcher and `n` backends, all on one bridge. Backends have the given
    /// VIP addresses on `lo`.
    pub fn new(n: usize, vips: &[&str]) -> Testbed {
        Testbed::with_prefix(fresh_prefix(), n, vips)
    }

    /// A testbed with a chosen name prefix (for `cargo xtask testbed up`).
    pub fn with_prefix(prefix: String, n: usize, vips: &[&str]) -> Testbed {
        let ns = |s: &str| Ns { name: format!("{prefix}-{s}") };
        let workdir = std::env::temp_dir().join(&prefix);
        std::fs::create_dir_all(&workdir).unwrap();
        let mut tb = Testbed {
            switch: ns("sw"),
            client: ns("cl"),
            lb: ns("lb"),
            backends: (0..n).map(|i| ns(&format!("b{i}"))).collect(),
            prefix,
            children: Vec::new(),
            tasks: Vec::new(),
            pin_dirs: Vec::new(),
            pass: None,
            extra_pass: Vec::new(),
            workdir,
            extra_hosts: Vec::new(),
            extra_instances: Vec::new(),
        };
        // From here on Drop cleans up whatever was created.
        tb.pin_dirs.push(PathBuf::from("/sys/fs/bpf/dispatcher").join(&tb.prefix));
        tb.build(vips);
        tb
    }

    fn hosts(&self) -> Vec<(Ns, String, String, String)> {
        let mut v = vec![
            (self.client.clone(), "c".to_string(), CLIENT_IP.to_string(), CLIENT_MAC.to_string()),
            (self.lb.clone(), "lb".to_string(), LB_IP.to_string(), LB_MAC.to_string()),
        ];
        for (i, b) in self.backends.iter().enumerate() {
            v.push((b.clone(), format!("b{i}"), backend_ip(i).to_string(), backend_mac(i)));
        }
        v
    }

    /// One more host on the switch (`short` names it within the testbed): its own
    /// namespace with `ip`/24 and `mac` on eth0. Taken down with the testbed.
    pub fn add_host(&mut self, short: &str, ip: &str, mac: &str) -> Ns {
        let ns = Ns { name: format!("{}-{short}", self.prefix) };
        sh(&["ip", "netns", "add", &ns.name]);
        self.extra_hosts.push(ns.clone());
        ns.ip(&["link", "set", "lo", "up"]);
        self.switch.ip(&["link", "add", short, "type", "veth", "peer", "name", "eth0", "netns", &ns.name]);
        self.switch.ip(&["link", "set", short, "master", "br0", "up"]);
        ns.ip(&["link", "set", "eth0", "address", mac]);
        ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        ns.ip(&["link", "set", "eth0", "up"]);
        ns.exec(&["ethtool", "-K", "eth0", "tx", "off"]);
        ns.sysctl("net.ipv4.conf.all.rp_filter=0");
        ns.sysctl("net.ipv4.conf.eth0.rp_filter=0");
        ns
    }

    /// Another agent instance (`<prefix>-<short>`): its pins, socket, lock and id table
    /// are removed with the testbed.
    pub fn add_instance(&mut self, short: &str) -> String {
        let name = format!("{}-{short}", self.prefix);
        self.pin_dirs.push(PathBuf::from("/sys/fs/bpf/dispatcher").join(&name));
        self.extra_instances.push(name.clone());
        name
    }

    fn build(&mut self, vips: &[&str]) {
        for n in std::iter::once(&self.switch).chain([&self.client, &self.lb]).chain(self.backends.iter()) {
            sh(&["ip", "netns", "add", &n.name]);
            n.ip(&["link", "set", "lo", "up"]);
        }
        self.switch.ip(&["link", "add", "br0", "type", "bridge"]);
        self.switch.ip(&["link", "set", "br0", "up"]);
        for (ns, port, ip, mac) in self.hosts() {
            self.switch.ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name]);
            self.switch.ip(&["link", "set", &port, "master", "br0", "up"]);
            ns.ip(&["link", "set", "eth0", "address", &mac]);
            ns.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
            ns.ip(&["link", "set", "eth0", "up"]);
            // A frame that XDP forwards loses the skb's checksum-offload state: the
            // sender must put real checksums on the wire, as a physical NIC does.
            ns.exec(&["ethtool", "-K", "eth0", "tx", "off"]);
            ns.sysctl("net.ipv4.conf.all.rp_filter=0");
            ns.sysctl("net.ipv4.conf.eth0.rp_filter=0");
        }
        // Frames sent by XDP_TX arrive on the switch side of the dispatcher's veth; a veth
        // drops them unless that side runs NAPI, which an XDP program turns on.
        let mut pass = dispatcher::dataplane::load_pass().expect("load the pass program");
        let link = self.switch.run_with(&mut pass, |pass| {
            dispatcher::dataplane::attach(pass, "pass", "lb", dispatcher::config::XdpAttachMode::Native).map(|(l, _)| l)
        });
        self.pass = Some((pass, link.expect("attach pass to the switch port")));
        // The client reaches the VIPs through the dispatcher, as a router would send it.
        for v in vips {
            self.client.ip(&["route", "add", &format!("{v}/32"), "via", LB_IP]);
        }
        for b in &self.backends {
            for v in vips {
                b.ip(&["addr", "add", &format!("{v}/32"), "dev", "lo"]);
            }
            // The VIP lives on lo: never answer ARP for it (IBM Dispatcher's loopback alias).
            b.sysctl("net.ipv4.conf.all.arp_ignore=1");
            b.sysctl("net.ipv4.conf.all.arp_announce=2");
            b.sysctl("net.ipv4.conf.lo.rp_filter=0");
        }
    }

    /// Leaves the testbed in place when this process exits: the switch port's XDP program
    /// is pinned, nothing is torn down. `Testbed::remove` takes it down later.
    pub fn persist(mut self) {
        if let Some((_, link)) = self.pass.take() {
            let root = PathBuf::from("/sys/fs/bpf/dispatcher");
            std::fs::create_dir_all(&root).expect("create /sys/fs/bpf/dispatcher");
            let pin = root.join(format!("{}-pass", self.prefix));
            link.pin(&pin).expect("pin the switch port's XDP link");
        }
        self.children.clear();
        std::mem::forget(self);
    }

    /// Takes down a persisted testbed by its prefix.
    pub fn remove(prefix: &str) -> usize {
        let mut removed = 0;
        if let Ok(out) = Command::new("ip").args(["netns", "list"]).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                let name = line.split_whitespace().next().unwrap_or("");
                if name.strip_prefix(prefix).is_some_and(|r| r.starts_with('-')) {
                    sh_quiet(&["ip", "netns", "del", name]);
                    removed += 1;
                }
            }
        }
        let root = PathBuf::from("/sys/fs/bpf/dispatcher");
        let _ = std::fs::remove_file(root.join(format!("{prefix}-pass")));
        let _ = dispatcher::dataplane::unpin_all(&root.join(prefix));
        // Instances of its own (`add_instance`): `<prefix>-<short>`.
        let ours = |name: &str| name.strip_prefix(prefix).is_some_and(|r| r.starts_with('-'));
        if let Ok(entries) = std::fs::read_dir(&root) {
            for e in entries.flatten() {
                if ours(&e.file_name().to_string_lossy()) && e.path().is_dir() {
                    let _ = dispatcher::dataplane::unpin_all(&e.path());
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir("/run/dispatcher") {
            for e in entries.flatten() {
                let file = e.file_name().to_string_lossy().into_owned();
                if ours(run_file_instance(&file)) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        let _ = std::fs::remove_dir_all(std::env::temp_dir().join(prefix));
        removed
    }

    pub fn instance(&self) -> &str {
        &self.prefix
    }

    pub fn pin_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/bpf/dispatcher").join(&self.prefix)
    }

    /// Writes a configuration file into the testbed's work directory.
    pub fn write_config(&self, text: &str) -> PathBuf {
        let path = self.workdir.join("dispatcher.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// `[[backend]]` entries for every backend, pairing 0-1, 2-3, ... as replicas.
    pub fn backend_config(&self, weights: &[u32]) -> String {
        self.backend_config_with_clones(weights, &[])
    }

    /// As `backend_config`, backend `i` owning the configured clone ID `clone_ids[i]`.
    pub fn backend_config_with_clones(&self, weights: &[u32], clone_ids: &[String]) -> String {
        self.backend_config_with(weights, |i| {
            clone_ids.get(i).map(|id| format!("clone_ids = [\"{id}\"]\n")).unwrap_or_default()
        })
    }

    /// As `backend_config`, with `extra(i)`'s lines in backend `i`'s section.
    pub fn backend_config_with(&self, weights: &[u32], extra: impl Fn(usize) -> String) -> String {
        let mut s = String::new();
        for i in 0..self.backends.len() {
            let replica = i ^ 1;
            s += &format!(
                "[[backend]]\nname = \"b{i}\"\naddress = \"{}\"\nmac = \"{}\"\nweight = {}\n{}\n",
                backend_ip(i),
                backend_mac(i),
                weights.get(i).copied().unwrap_or(100),
                if replica < self.backends.len() { format!("replica = \"b{replica}\"\n") } else { String::new() }
            );
            s += &extra(i);
        }
        s
    }

    /// Starts a process in a namespace; the testbed stops it on drop.
    pub fn start(&mut self, what: &str, mut cmd: Command) -> u32 {
        // A process of the same name that has exited (e.g. after `dispatcher stop`) is forgotten.
        self.children.retain_mut(|(w, c)| w != what || !matches!(c.try_wait(), Ok(Some(_))));
        let log = File::create(self.workdir.join(format!("{what}.log"))).unwrap();
        cmd.stdout(log.try_clone().unwrap()).stderr(log).stdin(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let pid = child.id();
        self.children.push((what.to_string(), child));
        pid
    }

    /// The pid of a process the testbed started.
    pub fn pid_of(&self, what: &str) -> Option<u32> {
        self.children.iter().find(|(w, _)| w == what).map(|(_, c)| c.id())
    }

    pub fn log(&self, what: &str) -> String {
        std::fs::read_to_string(self.workdir.join(format!("{what}.log"))).unwrap_or_default()
    }

    /// Starts `dispatcher run` in the dispatcher namespace and waits until the program is
    /// attached (its link pinned).
    pub fn start_dispatcher(&mut self, config: &Path) {
        self.start_dispatcher_with(config, &[]);
    }

    pub fn start_dispatcher_with(&mut self, config: &Path, extra: &[&str]) {
        self.start_dispatcher_limited(config, extra, None);
    }

    /// As `start_dispatcher_with`; `nofile`: the agent's descriptor limit (soft and hard).
    pub fn start_dispatcher_limited(&mut self, config: &Path, extra: &[&str], nofile: Option<u64>) {
        let mut cmd = self.lb.command(dispatcher_bin());
        cmd.arg("run").arg("--config").arg(config).args(extra);
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            unsafe {
                cmd.pre_exec(move || {
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, n, n)
                        .map_err(std::io::Error::from)
                });
            }
        }
        // A restarted agent writes a new log; keep the old one readable.
        let _ = std::fs::rename(self.workdir.join("dispatcher.log"), self.workdir.join("dispatcher.previous.log"));
        self.start_dispatcher_command(cmd);
    }

    /// Starts the agent as `cmd` (a `dispatcher run` of the caller's making: other
    /// environment, capabilities) and waits until the program is attached.
    pub fn start_dispatcher_command(&mut self, cmd: Command) {
        self.start("dispatcher", cmd);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.log("dispatcher").contains("dispatcher running") {
            if let Some(status) = self.child_exited("dispatcher") {
                panic!("dispatcher exited ({status}):\n{}", self.log("dispatcher"));
            }
            assert!(Instant::now() < deadline, "dispatcher not attached after 30s:\n{}", self.log("dispatcher"));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (at most `limit`) until the agent's clone table holds `n` entries (clone IDs
    /// and logical names, configured or learned, e.g. from SIP health checks' answers).
    pub fn wait_for_clone_table(&self, n: u64, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let status = self.admin("GET", "/status");
            let have = status
                .as_ref()
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(body).ok())
                .and_then(|st| st["clones"].as_u64())
                .unwrap_or(0);
            if have >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "clone table: {have} of {n} entries\n{status:?}\n{}",
                self.log("dispatcher")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs a dispatcher CLI command (status, drain, ...) and returns its stdout.
    pub fn dispatcher_cmd(&self, args: &[&str]) -> String {
        let out = self.lb.command(dispatcher_bin()).args(args).output().expect("dispatcher command");
        assert!(out.status.success(), "dispatcher {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The exit status of a started process that has exited (and is reaped), if it has.
    pub fn child_exited(&mut self, what: &str) -> Option<std::process::ExitStatus> {
        self.children.iter_mut().find(|(w, _)| w == what).and_then(|(_, c)| c.try_wait().ok().flatten())
    }

    /// Stops a started process with SIGTERM (then SIGKILL after 5 s) and waits for it.
    pub fn stop(&mut self, what: &str) {
        if let Some(pos) = self.children.iter().position(|(w, _)| w == what) {
            let (_, child) = self.children.remove(pos);
            stop_child(child);
        }
    }

    /// Kills a started process with SIGKILL (no chance to clean up) and waits for it.
    pub fn kill_hard(&mut self, what: &str) {
        if let Some(pos) = self.children.iter().position(|(w, _)| w == what) {
            let (_, mut child) = self.children.remove(pos);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Attaches the `decap` program to every backend's eth0 (`dispatcher decap`).
    pub fn start_decap(&mut self) {
        for i in 0..self.backends.len() {
            let mut cmd = self.backends[i].command(dispatcher_bin());
            cmd.args(["decap", "--iface", "eth0"]);
            let what = format!("decap-b{i}");
            self.start(&what, cmd);
            let ns = self.backends[i].clone();
            let deadline = Instant::now() + Duration::from_secs(20);
            while !ns.ip(&["link", "show", "eth0"]).contains("xdp") {
                assert!(self.child_exited(&what).is_none(), "decap exited: {}", self.log(&what));
                assert!(Instant::now() < deadline, "decap not attached: {}", self.log(&what));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Each backend answers every line on a TCP connection, and every UDP datagram, with
    /// its own name (`b<i>\n`).
    /// UDP services are given as (VIP, port): a reply must come from the VIP.
    pub fn start_servers(&mut self, tcp_ports: &[u16], udp: &[(&str, u16)]) {
        for i in 0..self.backends.len() {
            self.start_servers_on(i, tcp_ports, udp);
        }
    }

    /// The same servers on backend `i` only (again, after `kill_servers_of`).
    pub fn start_servers_on(&mut self, i: usize, tcp_ports: &[u16], udp: &[(&str, u16)]) {
        for &port in tcp_ports {
            self.spawn_task(i, move |stop| serve_tcp(i, port, stop));
        }
        for &(vip, port) in udp {
            let vip: Ipv4Addr = vip.parse().expect("VIP address");
            self.spawn_task(i, move |stop| serve_udp(i, vip, port, stop));
        }
        // Listeners bind synchronously in their thread before it loops; give them a moment.
        std::thread::sleep(Duration::from_millis(100));
    }

    /// One request to the agent's admin socket: (status, body), `None` if no agent answers.
    pub fn admin(&self, method: &str, path: &str) -> Option<(u16, String)> {
        let sock = PathBuf::from(format!("/run/dispatcher/{}.sock", self.instance()));
        dispatcher::admin::client::request(&sock, method, path).ok()
    }

    /// Every backend runs a WebSphere-like clone (`websphere::serve`) on `port`.
    pub fn start_websphere(&mut self, cluster: &Arc<crate::websphere::Clones>, port: u16) {
        for i in 0..self.backends.len() {
            self.start_websphere_on(cluster, i, port);
        }
    }

    /// Backend `i` runs its clone (again, after `kill_servers_of`).
    pub fn start_websphere_on(&mut self, cluster: &Arc<crate::websphere::Clones>, i: usize, port: u16) {
        let c = cluster.clone();
        self.spawn_task(i, move |stop| crate::websphere::serve(c, i, port, stop));
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Backend `backend` runs clone `me` of `cluster` on `port` (several applications of a
    /// cell, each its own `Clones`, on the testbed's backends; `kill_servers_of(backend)`
    /// stops it).
    pub fn start_clone(&mut self, cluster: &Arc<crate::websphere::Clones>, me: usize, backend: usize, port: u16) {
        let c = cluster.clone();
        self.spawn_task(backend, move |stop| crate::websphere::serve(c, me, port, stop));
        std::thread::sleep(Duration::from_millis(50));
    }

    /// Every backend runs a WebSphere-like SIP container (`sipcontainer::serve`) on
    /// `vip`:`port` (where MAC-forwarded frames arrive) and on its own address (health
    /// checks).
    pub fn start_sip(&mut self, cluster: &Arc<crate::sipcontainer::SipCluster>, vip: &str, port: u16) {
        for i in 0..self.backends.len() {
            self.start_sip_on(cluster, vip, i, port);
        }
    }

    /// Backend `i` runs its SIP container (again, after `kill_servers_of`).
    pub fn start_sip_on(&mut self, cluster: &Arc<crate::sipcontainer::SipCluster>, vip: &str, i: usize, port: u16) {
        for addr in [vip.parse().expect("VIP address"), std::net::IpAddr::V4(backend_ip(i))] {
            let c = cluster.clone();
            self.spawn_task(i, move |stop| crate::sipcontainer::serve(c, i, addr, port, stop));
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Every backend runs its SIP container over TCP on its own address at `port` (what a
    /// stream SIP VIP connects to), and over UDP there for the health checks.
    pub fn start_sip_tcp(&mut self, cluster: &Arc<crate::sipcontainer::SipCluster>, port: u16) {
        for i in 0..self.backends.len() {
            self.start_sip_tcp_on(cluster, i, port);
        }
    }

    /// Backend `i` runs its SIP container over TCP and UDP (again, after `kill_servers_of`).
    pub fn start_sip_tcp_on(&mut self, cluster: &Arc<crate::sipcontainer::SipCluster>, i: usize, port: u16) {
        let addr = backend_ip(i);
        let c = cluster.clone();
        self.spawn_task(i, move |stop| crate::sipcontainer::serve(c, i, addr.into(), port, stop));
        let c = cluster.clone();
        self.spawn_task(i, move |stop| crate::sipcontainer::serve_tcp(c, i, addr, port, stop));
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Every backend runs the scripted backend (`scripted::serve`) on `port`.
    pub fn start_scripted(&mut self, record: &Arc<crate::scripted::Record>, port: u16) {
        for i in 0..self.backends.len() {
            let r = record.clone();
            self.spawn_task(i, move |stop| crate::scripted::serve(r, port, stop));
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    /// Takes the `pass` program off the switch side of the dispatcher's veth: the veth
    /// trap, as an operator without the testbed meets it.
    pub fn remove_switch_pass(&mut self) {
        self.pass = None;
    }

    /// Lets frames sent by XDP_TX from the client's interface through the switch (the
    /// benchmark's in-kernel packet generator): `pass` on the client's switch port.
    pub fn enable_xdp_tx_from_client(&mut self) {
        self.enable_xdp_tx_from("c");
    }

    /// The same for the host on switch port `port` (an `add_host` short name).
    pub fn enable_xdp_tx_from(&mut self, port: &str) {
        let mut pass = dispatcher::dataplane::load_pass().expect("load the pass program");
        let port_ = port.to_string();
        let link = self.switch.run_with(&mut pass, move |p| {
            dispatcher::dataplane::attach(p, "pass", &port_, dispatcher::config::XdpAttachMode::Native).map(|(l, _)| l)
        });
        self.extra_pass.push((pass, link.unwrap_or_else(|e| panic!("attach pass to switch port {port}: {e}"))));
    }

    /// IPv6 beside IPv4: every host gets its fd99::/64 address on eth0 (no duplicate
    /// address detection: usable at once), the client routes each of `vips` (IPv6) through
    /// the dispatcher, and the backends hold them on `lo`.
    pub fn add_ipv6(&self, vips: &[&str]) {
        let mut hosts = vec![(self.client.clone(), CLIENT_IP6.to_string()), (self.lb.clone(), LB_IP6.to_string())];
        hosts.extend(self.backends.iter().enumerate().map(|(i, b)| (b.clone(), backend_ip6(i).to_string())));
        for (ns, ip) in &hosts {
            ns.ip(&["-6", "addr", "add", &format!("{ip}/64"), "dev", "eth0", "nodad"]);
        }
        for v in vips {
            self.client.ip(&["-6", "route", "add", &format!("{v}/128"), "via", LB_IP6]);
            for b in &self.backends {
                b.ip(&["-6", "addr", "add", &format!("{v}/128"), "dev", "lo", "nodad"]);
            }
        }
    }

    /// Every backend's SIP container also serves `addr`:`port` (another VIP, e.g. an
    /// IPv6 one), with the same state.
    pub fn start_sip_also_on(&mut self, cluster: &Arc<crate::sipcontainer::SipCluster>, addr: &str, port: u16) {
        let addr: std::net::IpAddr = addr.parse().expect("VIP address");
        for i in 0..self.backends.len() {
            let c = cluster.clone();
            self.spawn_task(i, move |stop| crate::sipcontainer::serve(c, i, addr, port, stop));
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    /// An HTTP VIP terminates on the dispatcher: its address must be local there.
    pub fn add_local_vip(&self, vip: &str) {
        self.lb.ip(&["addr", "add", &format!("{vip}/32"), "dev", "lo"]);
    }

    /// A helper thread of the test (not a backend's) that ends when `stop` is set: the
    /// testbed sets it and joins the thread on drop.
    pub fn on_drop(&mut self, stop: Arc<AtomicBool>, thread: JoinHandle<()>) {
        self.tasks.push(Stoppable { backend: usize::MAX, stop, thread: Some(thread) });
    }

    fn spawn_task(&mut self, backend: usize, f: impl FnOnce(Arc<AtomicBool>) + Send + 'static) {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let thread = self.backends[backend].spawn(move || f(s2));
        self.tasks.push(Stoppable { backend, stop, thread: Some(thread) });
    }

    /// Stops every server of backend `i` (the namespace stays): the backend has failed.
    pub fn kill_servers_of(&mut self, i: usize) {
        for t in self.tasks.iter_mut().filter(|t| t.backend == i) {
            t.stop.store(true, Ordering::SeqCst);
            if let Some(h) = t.thread.take() {
                let _ = h.join();
            }
        }
    }
}

fn stop_child(mut child: Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for (_, child) in self.children.drain(..) {
            stop_child(child);
        }
        for t in &mut self.tasks {
            t.stop.store(true, Ordering::SeqCst);
        }
        for t in &mut self.tasks {
            if let Some(h) = t.thread.take() {
                let _ = h.join();
            }
        }
        self.pass = None;
        self.extra_pass.clear();
        for n in std::iter::once(&self.switch)
            .chain([&self.client, &self.lb])
            .chain(self.backends.iter())
            .chain(self.extra_hosts.iter())
        {
            sh_quiet(&["ip", "netns", "del", &n.name]);
        }
        for d in &self.pin_dirs {
            let _ = dispatcher::dataplane::unpin_all(d);
        }
        // An agent killed hard leaves its admin socket and its (unlocked) lock file behind.
        for inst in std::iter::once(&self.prefix).chain(self.extra_instances.iter()) {
            let _ = std::fs::remove_file(format!("/run/dispatcher/{inst}.sock"));
            let _ = std::fs::remove_file(dispatcher::instance::lock_path(inst));
            let _ = std::fs::remove_file(dispatcher::instance::left_mark(inst));
            dispatcher::dataplane::ids::remove(inst);
        }
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

/// A process's resident memory (VmRSS), KiB.
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches(" kB").parse().unwrap()
}

/// The agent binary of the same build as the running executable: next to it (xtask) or
/// one level up (test executables live in `deps/`). `cargo xtask test` builds it first.
pub fn dispatcher_bin() -> PathBuf {
    built_bin("dispatcher", &[])
}

/// A binary of the workspace (the agent, or the tools crate's `demo`) from the same build
/// as the running executable; refused when older than the agent's sources or than
/// `also` (its own source files and folders, and the harness it uses).
pub fn built_bin(name: &str, also: &[&str]) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap();
    let candidates = [dir.join(name), dir.parent().unwrap().join(name)];
    let bin = candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| {
        panic!(
            "{} is missing: build it first (`cargo build --bins`, which `cargo xtask test` does)",
            candidates[1].display()
        )
    });
    // `cargo test` alone does not rebuild another package's binary: refuse to test a
    // stale agent rather than pass or fail on old code.
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).unwrap();
    // The workspace root: this crate (testbed/) is one level below it.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    // The agent's command line (cli/, main.rs) is in the agent binary only: a tool that
    // uses the library is not relinked when it changes.
    for src in ["dispatcher/src", "dispatcher-ebpf/src", "dispatcher-common/src"].iter().chain(also) {
        let skip: &[&str] = if name != "dispatcher" && *src == "dispatcher/src" { &["cli", "main.rs"] } else { &[] };
        // A path that moved would make the check pass on anything: refuse it.
        assert!(root.join(src).exists(), "{}: no such source path to compare {name} with", root.join(src).display());
        if let Some((_, newer)) = newest(&root.join(src), skip).filter(|(t, _)| *t > built) {
            panic!(
                "{} is older than {}: run `cargo build --bins` (or `cargo xtask test`)",
                bin.display(),
                newer.display()
            );
        }
    }
    bin
}

/// The most recently modified file below `dir`, leaving out entries named in `skip` (at
/// the top level).
fn newest(dir: &Path, skip: &[&str]) -> Option<(std::time::SystemTime, PathBuf)> {
    if dir.is_file() {
        return std::fs::metadata(dir).and_then(|m| m.modified()).ok().map(|t| (t, dir.to_path_buf()));
    }
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        if skip.iter().any(|s| e.file_name() == *s) {
            continue;
        }
        let p = e.path();
        let cand = if p.is_dir() {
            newest(&p, &[])
        } else {
            e.metadata().ok().and_then(|m| m.modified().ok()).map(|t| (t, p))
        };
        if let Some(c) = cand {
            if best.as_ref().is_none_or(|b| c.0 > b.0) {
                best = Some(c);
            }
        }
    }
    best
}

const POLL: Duration = Duration::from_millis(50);

fn serve_tcp(i: usize, port: u16, stop: Arc<AtomicBool>) {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind(("0.0.0.0", port)).expect("bind tcp");
    listener.set_nonblocking(true).unwrap();
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                let stop = stop.clone();
                conns.push(std::thread::spawn(move || {
                    s.set_nonblocking(false).unwrap();
                    s.set_read_timeout(Some(POLL)).unwrap();
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    while !stop.load(Ordering::SeqCst) {
                        match r.read_line(&mut line) {
                            Ok(0) => return,
                            Ok(_) => {
                                if w.write_all(format!("b{i}\n").as_bytes()).is_err() {
                                    return;
                                }
                                line.clear();
                            }
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) => {}
                            Err(_) => return,
                        }
                    }
                }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => std::thread::sleep(POLL),
        }
    }
    for c in conns {
        let _ = c.join();
    }
}

fn serve_udp(i: usize, vip: Ipv4Addr, port: u16, stop: Arc<AtomicBool>) {
    let sock = std::net::UdpSocket::bind((vip, port)).expect("bind udp");
    sock.set_read_timeout(Some(POLL)).unwrap();
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) {
        if let Ok((_, from)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(format!("b{i}\n").as_bytes(), from);
        }
    }
}
