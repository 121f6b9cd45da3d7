//! Several dispatchers sharing state through a real 3-member etcd cluster, each etcd
//! member and each dispatcher in a namespace of its own, all on the testbed's switch; the
//! clones in replica pairs; one client namespace per dispatcher, each reaching the one
//! HTTP VIP (the same address on every dispatcher) through its own dispatcher.
//!
//! The etcd cluster runs as a deployment should: TLS between its members and to its
//! clients (client certificates required), authentication on, and the dispatchers' etcd
//! user limited by a role to the testbed's key prefix (`Multi::secure_store`).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};

use dispatcher::api::AgentStatus;

use crate::netns::{dispatcher_bin, Ns, Testbed};

pub const VIP: &str = "10.99.100.40";
pub const L4_VIP: &str = "10.99.100.41";
pub const PORT: u16 = 8080;
pub const ETCD_MEMBERS: usize = 3;
/// The dispatcher names every configuration lists as its peers (`[cluster] peers`).
pub const PEER_NAMES: usize = 8;
/// The etcd user the dispatchers log in as, and its role.
pub const ETCD_USER: &str = "dispatcher";

pub fn etcd_ip(i: usize) -> String {
    format!("10.99.0.{}", 200 + i)
}

pub fn dispatcher_ip(i: usize) -> String {
    format!("10.99.0.{}", 3 + i)
}

/// Dispatcher `i`'s MAC on the switch (pinned in every configuration's `peers`).
pub fn dispatcher_mac(i: usize) -> String {
    format!("02:99:00:00:01:{i:02x}")
}

pub fn client_ip(i: usize) -> String {
    format!("10.99.0.{}", 50 + i)
}

pub struct Dispatcher {
    pub ns: Ns,
    pub instance: String,
    pub name: String,
    pub config: PathBuf,
    pub client: Ns,
}

pub struct Multi {
    pub tb: Testbed,
    pub etcd: Vec<Ns>,
    pub dispatchers: Vec<Dispatcher>,
    pub clones: Arc<crate::websphere::Clones>,
    pub key_prefix: String,
    /// Lines added to every dispatcher's `[cluster]` section, and sections after the VIPs
    /// (set before `add_dispatcher`).
    pub cluster_extra: String,
    /// The `[health]` section.
    pub health: String,
    pub extra: String,
    /// The CA, the etcd members' and the clients' certificates.
    pub pki: crate::tls::Pki,
    /// The root user's password (etcdctl as the store's administrator).
    pub root_password: String,
    /// The file holding the dispatchers' etcd password.
    pub password_file: PathBuf,
}

impl Multi {
    /// `n` dispatchers, `clones` WebSphere-like clones (paired as replicas), 3 etcd
    /// members. Dispatchers are configured, not started.
    pub fn new(n: usize, clones: usize) -> Multi {
        Multi::with_prefix(crate::netns::fresh_prefix(), n, clones, true)
    }

    /// As `new`, named `prefix`; `serve`: run the clone emulator in the backends (a
    /// standing testbed leaves them empty for servers of one's own).
    pub fn with_prefix(prefix: String, n: usize, clones: usize, serve: bool) -> Multi {
        let mut tb = Testbed::with_prefix(prefix, clones, &[]);
        let mut etcd = Vec::new();
        for i in 0..ETCD_MEMBERS {
            etcd.push(tb.add_host(&format!("e{i}"), &etcd_ip(i), &format!("02:99:00:00:02:{i:02x}")));
        }
        let key_prefix = format!("/dispatcher/{}", tb.prefix);
        let pki = crate::tls::Pki::new(&tb.workdir);
        for i in 0..ETCD_MEMBERS {
            let ip = format!("IP:{}", etcd_ip(i));
            pki.leaf("ca", &format!("etcd{i}"), &format!("e{i}"), &[&ip], 30);
        }
        // The dispatchers' client certificate (its CN is their etcd user), the
        // administrator's, and one of a stranger the CA also signed.
        pki.leaf("ca", "client-dispatcher", ETCD_USER, &[ETCD_USER], 30);
        pki.leaf("ca", "client-root", "root", &["root"], 30);
        pki.leaf("ca", "client-stranger", "stranger", &["stranger"], 30);
        let password_file = tb.workdir.join("etcd-password");
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&password_file)
                .unwrap();
            writeln!(f, "pw-{}", tb.prefix).unwrap();
        }
        let root_password = format!("root-{}", tb.prefix);
        let mut m = Multi {
            tb,
            etcd,
            dispatchers: Vec::new(),
            clones: crate::websphere::Clones::new(clones),
            key_prefix,
            // Each client reaches its own dispatcher (no router here): nothing to steer.
            // `ecmp::Ecmp` puts them behind a router and turns steering on.
            cluster_extra: "steering = false\n".into(),
            extra: String::new(),
            health: "[health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"300ms\"\nrise = 2\nfall = 2\n"
                .into(),
            pki,
            root_password,
            password_file,
        };
        for i in 0..ETCD_MEMBERS {
            m.start_etcd(i);
        }
        m.wait_etcd_healthy(ETCD_MEMBERS);
        m.secure_store();
        if serve {
            let c = m.clones.clone();
            m.tb.start_websphere(&c, PORT);
        }
        for i in 0..n {
            m.add_dispatcher(i);
        }
        m
    }

    pub fn endpoints(&self) -> Vec<String> {
        (0..ETCD_MEMBERS).map(|i| format!("https://{}:2379", etcd_ip(i))).collect()
    }

    /// Authentication on: a root user, and the dispatchers' user with a role that may
    /// read and write the testbed's key prefix and nothing else.
    fn secure_store(&self) {
        let dir = format!("{}/", self.key_prefix);
        let pw = std::fs::read_to_string(&self.password_file).unwrap().trim().to_string();
        let root = format!("root:{}", self.root_password);
        let user = format!("{ETCD_USER}:{pw}");
        for args in [
            vec!["user", "add", root.as_str()],
            vec!["role", "add", ETCD_USER],
            vec!["role", "grant-permission", ETCD_USER, "--prefix=true", "readwrite", dir.as_str()],
            vec!["user", "add", user.as_str()],
            vec!["user", "grant-role", ETCD_USER, ETCD_USER],
            vec!["auth", "enable"],
        ] {
            let r = self.etcdctl_as(None, &args);
            assert!(r.ok, "etcdctl {args:?}: {}{}", r.stdout, r.stderr);
        }
    }

    /// `etcdctl ARGS` against member 0, as `who`: `Some(("client-root", Some("root:pw")))`
    /// is the administrator (certificate file stem, and a user); `None`: the root
    /// certificate without a user (before authentication is on).
    pub fn etcdctl_as(&self, who: Option<(&str, Option<&str>)>, args: &[&str]) -> crate::tls::Ran {
        let (cert, user) = who.unwrap_or(("client-root", None));
        let ca = self.pki.path("ca.pem");
        let certf = self.pki.path(&format!("{cert}.pem"));
        let keyf = self.pki.path(&format!("{cert}.key"));
        let ep = format!("https://{}:2379", etcd_ip(0));
        let mut all: Vec<String> = vec![
            "--endpoints".into(),
            ep,
            "--cacert".into(),
            ca.display().to_string(),
            "--cert".into(),
            certf.display().to_string(),
            "--key".into(),
            keyf.display().to_string(),
            "--dial-timeout".into(),
            "3s".into(),
            "--command-timeout".into(),
            "5s".into(),
        ];
        if let Some(u) = user {
            all.push(format!("--user={u}"));
        }
        all.extend(args.iter().map(|a| a.to_string()));
        let all: Vec<&str> = all.iter().map(|s| s.as_str()).collect();
        crate::tls::run(&self.etcd[0], "etcdctl", &all, None)
    }

    /// `etcdctl ARGS` as the store's administrator (root).
    pub fn etcdctl(&self, args: &[&str]) -> crate::tls::Ran {
        let root = format!("root:{}", self.root_password);
        let r = self.etcdctl_as(Some(("client-root", Some(&root))), args);
        assert!(r.ok, "etcdctl {args:?}: {}{}", r.stdout, r.stderr);
        r
    }

    /// Starts (or restarts, with its data kept) etcd member `i`.
    pub fn start_etcd(&mut self, i: usize) {
        let ip = etcd_ip(i);
        let initial: Vec<String> = (0..ETCD_MEMBERS).map(|j| format!("e{j}=https://{}:2380", etcd_ip(j))).collect();
        let file = |f: &str| self.pki.path(f).display().to_string();
        let data = self.tb.workdir.join(format!("etcd{i}"));
        let mut cmd = self.etcd[i].command("etcd");
        cmd.args(["--name", &format!("e{i}")])
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &format!("https://{ip}:2379")])
            .args(["--advertise-client-urls", &format!("https://{ip}:2379")])
            .args(["--listen-peer-urls", &format!("https://{ip}:2380")])
            .args(["--initial-advertise-peer-urls", &format!("https://{ip}:2380")])
            // Health without credentials, as monitoring reads it: /health on a port of its own.
            .args(["--listen-metrics-urls", &format!("http://{ip}:2381")])
            .args(["--cert-file", &file(&format!("etcd{i}.pem")), "--key-file", &file(&format!("etcd{i}.key"))])
            .args(["--trusted-ca-file", &file("ca.pem"), "--client-cert-auth"])
            .args([
                "--peer-cert-file",
                &file(&format!("etcd{i}.pem")),
                "--peer-key-file",
                &file(&format!("etcd{i}.key")),
            ])
            .args(["--peer-trusted-ca-file", &file("ca.pem"), "--peer-client-cert-auth"])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", &self.tb.prefix])
            .args(["--heartbeat-interval", "100", "--election-timeout", "1000"]);
        self.tb.start(&format!("etcd{i}"), cmd);
    }

    /// Leaves it standing when this process exits (`cargo xtask testbed up`): the etcd
    /// members' pids go to `<workdir>/etcd.pids` for `stop_persisted`.
    pub fn persist(self) {
        let pids: Vec<String> =
            (0..ETCD_MEMBERS).filter_map(|i| self.tb.pid_of(&format!("etcd{i}"))).map(|p| p.to_string()).collect();
        std::fs::write(self.tb.workdir.join("etcd.pids"), pids.join("\n")).unwrap();
        self.tb.persist();
    }

    /// Stops the etcd members a persisted testbed named `prefix` started (by their pids,
    /// checked to still be etcd); returns how many.
    pub fn stop_persisted(prefix: &str) -> usize {
        let file = std::env::temp_dir().join(prefix).join("etcd.pids");
        let pids = std::fs::read_to_string(file).unwrap_or_default();
        use nix::sys::signal::{kill, Signal};
        let is_etcd = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "etcd");
        let ours: Vec<i32> =
            pids.lines().filter_map(|l| l.trim().parse::<i32>().ok()).filter(|&p| is_etcd(p)).collect();
        for &pid in &ours {
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGTERM);
        }
        // Gone within 5 s, or killed (its peers' namespaces may be gone already).
        let deadline = Instant::now() + Duration::from_secs(5);
        while ours.iter().any(|&p| is_etcd(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for &pid in ours.iter().filter(|&&p| is_etcd(p)) {
            let _ = kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        }
        ours.len()
    }

    /// Kills etcd member `i` (SIGKILL: as a crash).
    pub fn kill_etcd(&mut self, i: usize) {
        self.tb.kill_hard(&format!("etcd{i}"));
    }

    /// Waits until `want` members answer `/health` true (a leader is elected).
    pub fn wait_etcd_healthy(&self, want: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let healthy = (0..ETCD_MEMBERS).filter(|&i| self.etcd_health(i)).count();
            if healthy >= want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd: {healthy} of {want} members healthy after 30 s:\n{}",
                self.tb.log("etcd0")
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn etcd_health(&self, i: usize) -> bool {
        let addr: SocketAddr = format!("{}:2381", etcd_ip(i)).parse().unwrap();
        let body = self.tb.client.run(move || -> std::io::Result<String> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"GET /health HTTP/1.0\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        });
        body.map(|b| b.contains("\"health\":\"true\"")).unwrap_or(false)
    }

    /// The `[cluster]` lines that secure the link to etcd: the CA, the dispatchers' client
    /// certificate and their etcd user.
    pub fn store_credentials(&self) -> String {
        format!(
            "ca_file = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\nusername = \"{ETCD_USER}\"\npassword_file = \"{}\"\n",
            self.pki.path("ca.pem").display(),
            self.pki.path("client-dispatcher.pem").display(),
            self.pki.path("client-dispatcher.key").display(),
            self.password_file.display()
        )
    }

    /// The configuration of dispatcher `i` (the same for all but the instance and name).
    pub fn config_text(&self, i: usize, instance: &str) -> String {
        let eps: Vec<String> = self.endpoints().iter().map(|e| format!("\"{e}\"")).collect();
        format!(
            "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{instance}\"\n\n[cluster]\nname = \"d{i}\"\npeers = [{}]\nendpoints = [{}]\n{}key_prefix = \"{}\"\nlease_ttl = \"3s\"\nrequest_timeout = \"1s\"\nstartup_wait = \"5s\"\n{}\n[http]\nhold_time = \"3s\"\nserver_timeout = \"1s\"\n\n{}\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {PORT}\nring_size = 1009\n\n[[vip]]\nname = \"tcp\"\naddress = \"{L4_VIP}\"\nport = 9000\nring_size = 1009\n{}",
            (0..PEER_NAMES).map(|p| format!("\"d{p}@{}\"", dispatcher_mac(p))).collect::<Vec<_>>().join(", "),
            eps.join(", "),
            self.store_credentials(),
            self.key_prefix,
            self.cluster_extra,
            self.health,
            self.tb.backend_config(&[]),
            self.extra
        )
    }

    /// Dispatcher `i` (its namespace, client namespace and configuration), not started.
    pub fn add_dispatcher(&mut self, i: usize) {
        let ns = self.tb.add_host(&format!("d{i}"), &dispatcher_ip(i), &dispatcher_mac(i));
        // Its XDP_TX frames (L4 forwarding, HTTP connections steered to their owner) go out
        // through its switch port.
        self.tb.enable_xdp_tx_from(&format!("d{i}"));
        ns.ip(&["addr", "add", &format!("{VIP}/32"), "dev", "lo"]);
        let client = self.tb.add_host(&format!("c{i}"), &client_ip(i), &format!("02:99:00:00:03:{i:02x}"));
        client.ip(&["route", "add", &format!("{VIP}/32"), "via", &dispatcher_ip(i)]);
        let instance = self.tb.add_instance(&format!("d{i}"));
        let config = self.tb.workdir.join(format!("d{i}.toml"));
        std::fs::write(&config, self.config_text(i, &instance)).unwrap();
        self.dispatchers.push(Dispatcher { ns, instance, name: format!("d{i}"), config, client });
    }

    /// Starts dispatcher `i` and waits until it serves.
    pub fn start_dispatcher(&mut self, i: usize) {
        self.start_dispatcher_with(i, &[]);
    }

    /// The same with more `dispatcher run` arguments (`--stay-out`).
    pub fn start_dispatcher_with(&mut self, i: usize, extra: &[&str]) {
        let d = &self.dispatchers[i];
        let what = format!("dispatcher-d{i}");
        let mut cmd = d.ns.command(dispatcher_bin());
        cmd.arg("run").arg("--config").arg(&d.config).args(extra);
        let _ = std::fs::rename(
            self.tb.workdir.join(format!("{what}.log")),
            self.tb.workdir.join(format!("{what}.previous.log")),
        );
        self.tb.start(&what, cmd);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.tb.log(&what).contains("dispatcher running") {
            if let Some(st) = self.tb.child_exited(&what) {
                panic!("{what} exited ({st}):\n{}", self.tb.log(&what));
            }
            assert!(Instant::now() < deadline, "{what} not running after 30 s:\n{}", self.tb.log(&what));
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log(&self, i: usize) -> String {
        self.tb.log(&format!("dispatcher-d{i}"))
    }

    pub fn kill_dispatcher(&mut self, i: usize) {
        self.tb.kill_hard(&format!("dispatcher-d{i}"));
    }

    pub fn stop_dispatcher(&mut self, i: usize) {
        self.tb.stop(&format!("dispatcher-d{i}"));
    }

    /// `dispatcher ARGS --config <its config>` in dispatcher `i`'s namespace.
    pub fn cmd(&self, i: usize, args: &[&str]) -> std::process::Output {
        let d = &self.dispatchers[i];
        let mut c: Command = d.ns.command(dispatcher_bin());
        c.args(args).arg("--config").arg(&d.config);
        c.output().expect("dispatcher command")
    }

    /// `dispatcher status --json` of dispatcher `i`, the agent's part.
    pub fn status(&self, i: usize) -> AgentStatus {
        let out = self.cmd(i, &["status", "--json"]);
        assert!(out.status.success(), "status of d{i}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
        serde_json::from_value(v["agent"].clone()).unwrap_or_else(|e| panic!("agent status of d{i}: {e}: {v}"))
    }

    /// A client with a cookie jar, in dispatcher `i`'s client namespace.
    pub fn client(&self, i: usize) -> crate::websphere::Client {
        crate::websphere::Client::new(&self.dispatchers[i].client, format!("{VIP}:80").parse().unwrap())
    }

    pub fn addr() -> SocketAddr {
        format!("{VIP}:80").parse().unwrap()
    }

    /// Waits until `f` holds for `what`, up to `limit`; returns how long it took.
    pub fn wait_for(&self, what: &str, limit: Duration, f: impl FnMut() -> bool) -> Duration {
        self.wait_for_or(what, limit, f, String::new)
    }

    /// As `wait_for`; on failure the message adds what `diagnose` reports then.
    pub fn wait_for_or(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut() -> bool,
        diagnose: impl FnOnce() -> String,
    ) -> Duration {
        let t = Instant::now();
        while !f() {
            if t.elapsed() >= limit {
                panic!("{what}: not within {limit:?}\n{}", diagnose());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        t.elapsed()
    }

    /// Rewrites dispatcher `i`'s configuration with (`true`) or without its `[cluster]`
    /// section (standalone); takes effect at its next start.
    pub fn set_clustered(&self, i: usize, clustered: bool) {
        let d = &self.dispatchers[i];
        let mut text = self.config_text(i, &d.instance);
        if !clustered {
            let start = text.find("[cluster]").unwrap();
            let end = start + text[start..].find("\n\n").unwrap() + 2;
            text.replace_range(start..end, "");
        }
        std::fs::write(&d.config, text).unwrap();
    }

    /// Each backend's (state, operator) bytes in dispatcher `i`'s pinned `BACKENDS`.
    pub fn backend_bytes(&self, i: usize) -> Vec<(u8, u8)> {
        use aya::maps::{Array, Map, MapData};
        let dir = PathBuf::from("/sys/fs/bpf/dispatcher").join(&self.dispatchers[i].instance);
        let Ok(map) = MapData::from_pin(dir.join("BACKENDS")) else { return Vec::new() };
        let backends: Array<_, dispatcher_common::BackendInfo> = Map::Array(map).try_into().expect("BACKENDS");
        (0..self.tb.backends.len() as u32)
            .filter_map(|b| backends.get(&b, 0).ok().map(|x| (x.state, x.admin)))
            .collect()
    }

    /// The pinned maps of dispatcher `i` that decide where traffic goes, in a comparable
    /// form: each VIP's ring, each backend's state bytes, and the clone table.
    pub fn decision_maps(&self, i: usize) -> Decisions {
        use aya::maps::{Array, HashMap, Map, MapData};
        let dir = PathBuf::from("/sys/fs/bpf/dispatcher").join(&self.dispatchers[i].instance);
        let open = |name: &str| MapData::from_pin(dir.join(name)).unwrap_or_else(|e| panic!("{name} of d{i}: {e}"));
        let rings: Array<_, u32> = Map::Array(open("RINGS")).try_into().expect("RINGS");
        let ring = |vip: u32| -> Vec<u32> {
            let base = vip * dispatcher_common::MAX_RING_SIZE;
            (0..1009).map(|s| rings.get(&(base + s), 0).expect("ring slot")).collect()
        };
        let backends: Array<_, dispatcher_common::BackendInfo> =
            Map::Array(open("BACKENDS")).try_into().expect("BACKENDS");
        let states = (0..self.tb.backends.len() as u32)
            .map(|b| backends.get(&b, 0).map(|x| (x.state, x.admin)).expect("backend entry"))
            .collect();
        let clones: HashMap<_, u64, dispatcher_common::CloneValue> =
            Map::HashMap(open("CLONES")).try_into().expect("CLONES");
        let mut c: Vec<(u64, (u32, u32, u32))> =
            clones.iter().filter_map(|r| r.ok()).map(|(k, v)| (k, (v.owner, v.replica, v.flags))).collect();
        c.sort();
        Decisions { rings: vec![ring(0), ring(1)], states, clones: c }
    }
}

/// What a dispatcher's maps decide (`Multi::decision_maps`).
#[derive(Debug, PartialEq, Eq)]
pub struct Decisions {
    pub rings: Vec<Vec<u32>>,
    pub states: Vec<(u8, u8)>,
    pub clones: Vec<(u64, (u32, u32, u32))>,
}
