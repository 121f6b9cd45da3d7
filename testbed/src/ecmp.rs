//! Dispatchers behind a router, as Katran, GLB and Maglev run: every dispatcher host runs
//! BIRD and announces the VIPs (`[announce]`, `dispatcher bird-config`), the router's BIRD
//! installs one multipath route per VIP (ECMP, `fib_multipath_hash_policy = 1`), clients
//! sit behind the router. Built on `cluster::Multi` (etcd, clones in replica pairs).
//!
//! Addresses: the switch segment 10.99.0.0/24 (router .254, dispatchers .3.., etcd
//! .200..), the clients' network 10.98.0.0/24 (router .1, clients .10..) on the same
//! switch, reaching the VIPs only through the router.

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    cluster::{dispatcher_ip, Multi, L4_VIP, VIP},
    netns::{dispatcher_bin, Ns},
};

pub const ROUTER_IP: &str = "10.99.0.254";
pub const ROUTER_CLIENT_IP: &str = "10.98.0.1";
pub const CLIENTS_NET: &str = "10.98.0.0/24";
/// The client namespace's addresses (requests go out from several).
pub const CLIENT_IPS: [&str; 3] = ["10.98.0.10", "10.98.0.11", "10.98.0.12"];
/// The L4 VIP's UDP port (beside TCP 9000).
pub const UDP_PORT: u16 = 9001;
pub const ROUTER_AS: u32 = 65000;
pub const DISPATCHER_AS: u32 = 65001;

pub struct Ecmp {
    pub m: Multi,
    pub router: Ns,
    pub clients: Ns,
    pub steering: bool,
}

impl Ecmp {
    /// The router (BIRD started), etcd, clones; dispatchers 0..n configured (not started).
    pub fn new(n: usize, clones: usize, steering: bool) -> Ecmp {
        let mut m = Multi::with_prefix(crate::netns::fresh_prefix(), 0, clones, true);
        m.cluster_extra = format!("steering = {steering}\nsecond_chance = \"60s\"\n");
        // No backend dies in these tests, and a check that times out on a starved VM (the
        // hypervisor takes vCPUs away for up to seconds here) would take a backend out on
        // one dispatcher only, whose ring then differs: L4 flows ECMP moves there would
        // change backend for a reason that is not the one under test.
        m.health = "[health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"1s\"\nrise = 2\nfall = 10\n".into();
        m.extra = format!(
            "\n[[vip]]\nname = \"udp\"\naddress = \"{L4_VIP}\"\nport = {UDP_PORT}\nprotocol = \"udp\"\nring_size = 1009\n\n[announce]\n"
        );
        let router = m.tb.add_host("r", ROUTER_IP, "02:99:00:00:04:00");
        router.ip(&["addr", "add", &format!("{ROUTER_CLIENT_IP}/24"), "dev", "eth0"]);
        router.sysctl("net.ipv4.ip_forward=1");
        router.sysctl("net.ipv4.fib_multipath_hash_policy=1");
        // Clients and dispatchers share the switch: no redirects past the router.
        router.sysctl("net.ipv4.conf.all.send_redirects=0");
        router.sysctl("net.ipv4.conf.eth0.send_redirects=0");
        let clients = m.tb.add_host("k", CLIENT_IPS[0], "02:99:00:00:05:00");
        clients.ip(&["addr", "flush", "dev", "eth0"]);
        for ip in CLIENT_IPS {
            clients.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        }
        clients.ip(&["route", "add", "default", "via", ROUTER_CLIENT_IP]);
        // A socket's random hash must not re-roll on a retransmission timeout (the
        // router's multipath choice follows it on veth).
        let _ = std::process::Command::new("ip")
            .args(["netns", "exec", &clients.name, "sysctl", "-q", "-w", "net.core.txrehash=0"])
            .status();
        for b in &m.tb.backends {
            b.ip(&["addr", "add", &format!("{L4_VIP}/32"), "dev", "lo"]);
            b.ip(&["route", "add", CLIENTS_NET, "via", ROUTER_IP]);
        }
        m.tb.start_servers(&[9000], &[(L4_VIP, UDP_PORT)]);
        let conf = m.tb.workdir.join("bird-r.conf");
        std::fs::write(&conf, router_bird(n.max(4))).unwrap();
        let mut cmd = router.command("bird");
        cmd.arg("-f").arg("-c").arg(&conf).arg("-s").arg(m.tb.workdir.join("bird-r.ctl"));
        m.tb.start("bird-r", cmd);
        let mut e = Ecmp { m, router, clients, steering };
        for i in 0..n {
            e.add(i);
        }
        e
    }

    /// Dispatcher `i` on the switch: configured, routed to the clients through the router,
    /// its BIRD configuration written.
    pub fn add(&mut self, i: usize) {
        self.m.add_dispatcher(i);
        let d = &self.m.dispatchers[i];
        d.ns.ip(&["route", "add", CLIENTS_NET, "via", ROUTER_IP]);
        let out = std::process::Command::new(dispatcher_bin())
            .args(["bird-config", "--config"])
            .arg(&d.config)
            .output()
            .expect("dispatcher bird-config");
        assert!(out.status.success(), "bird-config: {}", String::from_utf8_lossy(&out.stderr));
        let conf = format!(
            "log stderr all;\nrouter id {ip};\nprotocol device {{ scan time 10; }}\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            dispatcher_bird_uplink(&dispatcher_ip(i)),
            ip = dispatcher_ip(i),
        );
        std::fs::write(self.m.tb.workdir.join(format!("bird-d{i}.conf")), conf).unwrap();
    }

    /// Starts dispatchers 0..n and waits until the router routes to all of them and (with
    /// steering) each holds the table of all.
    pub fn up(&mut self, n: usize) {
        for i in 0..n {
            self.start(i);
        }
        self.wait_next_hops(&(0..n).collect::<Vec<_>>(), Duration::from_secs(30));
        if self.steering {
            let names: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
            let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
            for i in 0..n {
                self.wait_table(i, &names, Duration::from_secs(10));
            }
        }
    }

    /// Client connections dispatcher `i` terminates now.
    pub fn held(&self, i: usize) -> u64 {
        self.m.status(i).vips.iter().map(|v| v.connections).sum()
    }

    /// Starts dispatcher `i`'s agent and its BIRD.
    pub fn start(&mut self, i: usize) {
        self.m.start_dispatcher(i);
        self.start_bird(i);
    }

    pub fn start_bird(&mut self, i: usize) {
        let w = &self.m.tb.workdir;
        let mut cmd = self.m.dispatchers[i].ns.command("bird");
        cmd.arg("-f").arg("-c").arg(w.join(format!("bird-d{i}.conf"))).arg("-s").arg(w.join(format!("bird-d{i}.ctl")));
        self.m.tb.start(&format!("bird-d{i}"), cmd);
    }

    /// The next hops of the router's route to the HTTP VIP (dispatcher addresses).
    pub fn next_hops(&self) -> Vec<String> {
        let out = self.router.ip(&["route", "show", &format!("{VIP}/32")]);
        let mut hops: Vec<String> = out
            .split_whitespace()
            .collect::<Vec<_>>()
            .windows(2)
            .filter(|w| w[0] == "via")
            .map(|w| w[1].to_string())
            .collect();
        hops.sort();
        hops
    }

    /// Waits until the router's route names exactly dispatchers `want`; returns how long.
    pub fn wait_next_hops(&self, want: &[usize], limit: Duration) -> Duration {
        let mut want: Vec<String> = want.iter().map(|&i| dispatcher_ip(i)).collect();
        want.sort();
        self.m.wait_for_or(
            &format!("router next hops {want:?}"),
            limit,
            || self.next_hops() == want,
            || self.bgp_diagnosis(),
        )
    }

    /// What BIRD says on the router and on every dispatcher started, with the
    /// announcement interfaces: for a failed wait.
    pub fn bgp_diagnosis(&self) -> String {
        let birdc = |ns: &Ns, ctl: &str| {
            let out = ns
                .command("birdc")
                .arg("-s")
                .arg(self.m.tb.workdir.join(ctl))
                .args(["show", "protocols", "all"])
                .output();
            match out {
                Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr),
                Err(e) => format!("birdc: {e}"),
            }
        };
        let mut s = format!(
            "router route: {}\nrouter BIRD:\n{}",
            self.router.ip(&["route"]),
            birdc(&self.router, "bird-r.ctl")
        );
        for (i, d) in self.m.dispatchers.iter().enumerate() {
            s += &format!(
                "--- d{i}: links\n{}\nBIRD:\n{}\nBIRD log:\n{}\n",
                d.ns.ip(&["-br", "link"]),
                birdc(&d.ns, &format!("bird-d{i}.ctl")),
                self.m.tb.log(&format!("bird-d{i}"))
            );
        }
        s + "router BIRD log:\n" + &self.m.tb.log("bird-r")
    }

    /// Waits until dispatcher `i`'s ownership table holds exactly `names`.
    pub fn wait_table(&self, i: usize, names: &[&str], limit: Duration) -> Duration {
        self.m.wait_for(&format!("d{i}'s ownership table {names:?}"), limit, || {
            self.m.status(i).steering.map(|s| s.dispatchers) == Some(names.iter().map(|n| n.to_string()).collect())
        })
    }

    /// Every dispatcher's logged backend state changes (for a failed L4 assertion: a
    /// backend out on one dispatcher only changes its ring).
    pub fn state_changes(&self) -> String {
        (0..self.m.dispatchers.len())
            .flat_map(|i| {
                let log = self.m.log(i);
                log.lines().filter(|l| l.contains("reason_kind=")).map(|l| format!("d{i}: {l}")).collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The host of dispatcher `i` dies: its link goes down without a word to anyone.
    pub fn cut_host(&self, i: usize) {
        self.m.tb.switch.ip(&["link", "set", &format!("d{i}"), "down"]);
    }
}

/// The router: passive BGP from any dispatcher on the segment, one multipath route per
/// VIP into the kernel, BFD to notice a dead dispatcher in half a second.
pub fn router_bird(max_paths: usize) -> String {
    format!(
        "log stderr all;\nrouter id {ROUTER_IP};\nprotocol device {{ scan time 10; }}\nprotocol kernel {{ ipv4 {{ import none; export all; }}; merge paths on limit {max_paths}; }}\nprotocol bfd {{ debug {{ states, events }}; interface \"eth0\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 5; }}; }}\nprotocol bgp dispatchers {{ local {ROUTER_IP} as {ROUTER_AS}; neighbor range 10.99.0.0/24 as {DISPATCHER_AS}; passive on; bfd on; hold time 3; error wait time 1, 5; ipv4 {{ import all; export none; }}; }}\n"
    )
}

/// A dispatcher host's session to the router: exports the static VIP routes only.
pub fn dispatcher_bird_uplink(me: &str) -> String {
    format!(
        "protocol bfd {{ interface \"eth0\" {{ min rx interval 100 ms; min tx interval 100 ms; multiplier 5; }}; }}\nprotocol bgp uplink {{ local {me} as {DISPATCHER_AS}; neighbor {ROUTER_IP} as {ROUTER_AS}; bfd on; hold time 3; connect delay time 1; connect retry time 1; error wait time 1, 5; ipv4 {{ import none; export where source = RTS_STATIC; }}; }}\n"
    )
}

/// What a load saw.
#[derive(Default, Debug)]
pub struct Counts {
    /// HTTP requests sent and not answered yet (now).
    pub in_flight: AtomicU64,
    pub requests: AtomicU64,
    /// Answers other than 200 (the proxy's own 502/503 included).
    pub failed: AtomicU64,
    /// Connections that ended without being asked to (reset, or closed mid-request), and
    /// connection attempts that failed.
    pub broken: AtomicU64,
    /// Of those, attempts refused (a reset answering the SYN: nobody listens where the
    /// SYN went).
    pub refused: AtomicU64,
    /// Connections closed after a `Connection: close` answer (moved, not broken).
    pub moved: AtomicU64,
    /// L4 TCP flows: lines answered, flows broken, answers from another backend than the
    /// flow's first.
    pub l4_lines: AtomicU64,
    pub l4_broken: AtomicU64,
    pub l4_switched: AtomicU64,
    /// UDP flows (one source port each): answers, datagrams without an answer within 1 s,
    /// answers from another backend than the flow's first.
    pub udp_answers: AtomicU64,
    pub udp_lost: AtomicU64,
    pub udp_switched: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub requests: u64,
    pub failed: u64,
    pub broken: u64,
    pub refused: u64,
    pub moved: u64,
    pub l4_lines: u64,
    pub l4_broken: u64,
    pub l4_switched: u64,
    pub udp_answers: u64,
    pub udp_lost: u64,
    pub udp_switched: u64,
}

impl std::ops::Sub for Snapshot {
    type Output = Snapshot;
    fn sub(self, o: Snapshot) -> Snapshot {
        Snapshot {
            requests: self.requests - o.requests,
            failed: self.failed - o.failed,
            broken: self.broken - o.broken,
            refused: self.refused - o.refused,
            moved: self.moved - o.moved,
            l4_lines: self.l4_lines - o.l4_lines,
            l4_broken: self.l4_broken - o.l4_broken,
            l4_switched: self.l4_switched - o.l4_switched,
            udp_answers: self.udp_answers - o.udp_answers,
            udp_lost: self.udp_lost - o.udp_lost,
            udp_switched: self.udp_switched - o.udp_switched,
        }
    }
}

/// Long-lived keep-alive HTTP clients with sessions, long-lived L4 TCP flows and as many
/// UDP flows, from the clients' namespace, each pacing itself (bounded by `stop`).
pub struct Load {
    pub counts: Arc<Counts>,
    /// When each HTTP client was last served (ms since `started`).
    last_served: Arc<Vec<AtomicU64>>,
    started: Instant,
    pub errors: Arc<Mutex<Vec<String>>>,
    /// When each refused attempt began (before its SYN left).
    refused_at: Arc<Mutex<Vec<Instant>>>,
    /// When each request that had to open a new connection and failed began (refused,
    /// timed out connecting, or reset before its answer).
    failed_new_at: Arc<Mutex<Vec<Instant>>>,
    /// When each request on an open connection failed (the moment its error came).
    broken_at: Arc<Mutex<Vec<Instant>>>,
    /// How long the short-lived clients give a connection to open, in ms.
    new_connect_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Load {
    pub fn start(clients: &Ns, http_conns: usize, l4_flows: usize, pace: Duration) -> Load {
        Load::start_with_new(clients, http_conns, 0, l4_flows, pace)
    }

    /// The same, and `new_conns` more HTTP clients with sessions that open a new
    /// connection for every request (at a quarter of the pace): new connections all the
    /// time, as many short-lived clients make them.
    pub fn start_with_new(clients: &Ns, http_conns: usize, new_conns: usize, l4_flows: usize, pace: Duration) -> Load {
        let counts = Arc::new(Counts::default());
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        let started = Instant::now();
        let last_served: Arc<Vec<AtomicU64>> =
            Arc::new((0..http_conns + new_conns).map(|_| AtomicU64::new(0)).collect());
        let refused_at = Arc::new(Mutex::new(Vec::new()));
        let failed_new_at = Arc::new(Mutex::new(Vec::new()));
        let broken_at = Arc::new(Mutex::new(Vec::new()));
        let new_connect_ms = Arc::new(AtomicU64::new(3000));
        let http: SocketAddr = format!("{VIP}:80").parse().unwrap();
        for n in 0..http_conns + new_conns {
            let (counts, errors, stop, ns) = (counts.clone(), errors.clone(), stop.clone(), clients.clone());
            let short_lived = n >= http_conns;
            let new_connect_ms = new_connect_ms.clone();
            let (last, refused_at, failed_new_at) = (last_served.clone(), refused_at.clone(), failed_new_at.clone());
            let broken_at = broken_at.clone();
            threads.push(std::thread::spawn(move || {
                let src = CLIENT_IPS[n % CLIENT_IPS.len()];
                let mut c = crate::websphere::Client::new(&ns, http).bound_to(src.parse().unwrap());

                let mut first = true;
                while !stop.load(Ordering::Relaxed) {
                    let path = if first { "/app/new" } else { "/app/again" };
                    if short_lived {
                        c.reconnect();
                        c = c.with_connect_timeout(Duration::from_millis(new_connect_ms.load(Ordering::Relaxed)));
                    }
                    let asked = Instant::now();
                    let fresh = !c.connected();
                    counts.in_flight.fetch_add(1, Ordering::Relaxed);
                    let answer = c.get(path);
                    counts.in_flight.fetch_sub(1, Ordering::Relaxed);
                    match answer {
                        Ok(r) => {
                            counts.requests.fetch_add(1, Ordering::Relaxed);
                            last[n].store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
                            first = false;
                            if r.status != 200 {
                                counts.failed.fetch_add(1, Ordering::Relaxed);
                                errors.lock().unwrap().push(format!(
                                    "client {n}: status {} {}",
                                    r.status,
                                    r.body.trim()
                                ));
                            }
                            if r.header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close")) {
                                counts.moved.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            counts.broken.fetch_add(1, Ordering::Relaxed);
                            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                                counts.refused.fetch_add(1, Ordering::Relaxed);
                                refused_at.lock().unwrap().push(asked);
                            }
                            if fresh {
                                failed_new_at.lock().unwrap().push(asked);
                            } else {
                                broken_at.lock().unwrap().push(Instant::now());
                            }
                            counts.failed.fetch_add(1, Ordering::Relaxed);
                            errors.lock().unwrap().push(format!("client {n}: {e}"));
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                    std::thread::sleep(if short_lived { pace * 4 } else { pace });
                }
            }));
        }
        let l4: SocketAddr = format!("{L4_VIP}:9000").parse().unwrap();
        for n in 0..l4_flows {
            let (counts, errors, stop, ns) = (counts.clone(), errors.clone(), stop.clone(), clients.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(s) = ns.run(move || TcpStream::connect_timeout(&l4, Duration::from_secs(3))) else {
                        std::thread::sleep(Duration::from_millis(200));
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut w = s.try_clone().unwrap();
                    let mut r = BufReader::new(s);
                    let mut first: Option<String> = None;
                    let mut line = String::new();
                    let ok = loop {
                        if stop.load(Ordering::Relaxed) {
                            break true;
                        }
                        line.clear();
                        if w.write_all(b"ping\n").is_err() || r.read_line(&mut line).map(|k| k == 0).unwrap_or(true) {
                            break false;
                        }
                        counts.l4_lines.fetch_add(1, Ordering::Relaxed);
                        let who = line.trim().to_string();
                        match &first {
                            None => first = Some(who),
                            Some(f) if *f != who => {
                                counts.l4_switched.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {}
                        }
                        std::thread::sleep(pace);
                    };
                    if !ok {
                        counts.l4_broken.fetch_add(1, Ordering::Relaxed);
                        errors.lock().unwrap().push(format!("l4 flow {n} broken"));
                    }
                }
            }));
        }
        for n in 0..l4_flows {
            let (counts, stop, ns) = (counts.clone(), stop.clone(), clients.clone());
            threads.push(std::thread::spawn(move || {
                let src = CLIENT_IPS[n % CLIENT_IPS.len()];
                let to: SocketAddr = format!("{L4_VIP}:{UDP_PORT}").parse().unwrap();
                let sock = ns.run(move || {
                    let s = std::net::UdpSocket::bind((src, 0))?;
                    s.connect(to)?;
                    s.set_read_timeout(Some(Duration::from_secs(1)))?;
                    Ok::<_, std::io::Error>(s)
                });
                let Ok(sock) = sock else { return };
                let mut first: Option<Vec<u8>> = None;
                let mut buf = [0u8; 64];
                while !stop.load(Ordering::Relaxed) {
                    if sock.send(b"ping").is_err() {
                        counts.udp_lost.fetch_add(1, Ordering::Relaxed);
                    } else {
                        match sock.recv(&mut buf) {
                            Ok(k) => {
                                counts.udp_answers.fetch_add(1, Ordering::Relaxed);
                                let who = buf[..k].to_vec();
                                match &first {
                                    None => first = Some(who),
                                    Some(f) if *f != who => {
                                        counts.udp_switched.fetch_add(1, Ordering::Relaxed);
                                    }
                                    _ => {}
                                }
                            }
                            Err(_) => {
                                counts.udp_lost.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    std::thread::sleep(pace);
                }
            }));
        }
        Load {
            counts,
            last_served,
            started,
            errors,
            refused_at,
            failed_new_at,
            broken_at,
            new_connect_ms,
            stop,
            threads,
        }
    }

    /// When requests on open connections failed after `t`, as offsets from `t`.
    pub fn broken_after(&self, t: Instant) -> Vec<Duration> {
        self.broken_at.lock().unwrap().iter().filter(|a| **a > t).map(|a| *a - t).collect()
    }

    /// When the refused attempts began that began after `t`, as offsets from `t`.
    pub fn refused_after(&self, t: Instant) -> Vec<Duration> {
        self.refused_at.lock().unwrap().iter().filter(|a| **a > t).map(|a| *a - t).collect()
    }

    /// How long the short-lived clients give a new connection to open (3 s at first).
    /// Under TCP's first SYN retransmission (1 s), a SYN lost is a failed attempt rather
    /// than a slow one, and a client is not stuck for long on one attempt: what a death
    /// test wants to count.
    pub fn set_new_connect_timeout(&self, t: Duration) {
        self.new_connect_ms.store(t.as_millis() as u64, Ordering::Relaxed);
    }

    /// When the failed attempts on new connections began that began after `t`, as
    /// offsets from `t` (an attempt is recorded when it fails: up to the 3 s connect
    /// timeout later).
    pub fn failed_new_after(&self, t: Instant) -> Vec<Duration> {
        self.failed_new_at.lock().unwrap().iter().filter(|a| **a > t).map(|a| *a - t).collect()
    }

    pub fn snapshot(&self) -> Snapshot {
        let c = &self.counts;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            requests: l(&c.requests),
            failed: l(&c.failed),
            broken: l(&c.broken),
            refused: l(&c.refused),
            moved: l(&c.moved),
            l4_lines: l(&c.l4_lines),
            l4_broken: l(&c.l4_broken),
            l4_switched: l(&c.l4_switched),
            udp_answers: l(&c.udp_answers),
            udp_lost: l(&c.udp_lost),
            udp_switched: l(&c.udp_switched),
        }
    }

    /// The HTTP clients (by number, as their errors name them) served within the last `d`.
    pub fn served_within(&self, d: Duration) -> Vec<usize> {
        let now = self.started.elapsed().as_millis() as u64;
        let d = d.as_millis() as u64;
        (0..self.last_served.len())
            .filter(|&n| now.saturating_sub(self.last_served[n].load(Ordering::Relaxed)) <= d)
            .collect()
    }

    /// HTTP clients not served within the last `d`.
    pub fn idle_clients(&self, d: Duration) -> usize {
        let now = self.started.elapsed().as_millis() as u64;
        let d = d.as_millis() as u64;
        self.last_served.iter().filter(|t| now.saturating_sub(t.load(Ordering::Relaxed)) > d).count()
    }

    /// After a dispatcher's host died: waits (bounded by `limit`) until every HTTP client
    /// was served again since; a request in flight on a dead host's connection fails only
    /// at the client's read timeout (10 s). Whether they all were.
    pub fn wait_recovered(&self, before: Snapshot, limit: Duration) -> bool {
        let t = Instant::now();
        while t.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(100));
            let d = self.snapshot() - before;
            if d.requests > 0
                && self.idle_clients(Duration::from_millis(500)) == 0
                && t.elapsed() > Duration::from_secs(1)
            {
                return true;
            }
        }
        false
    }

    /// Runs for `d` and returns what happened meanwhile.
    pub fn during(&self, d: Duration) -> Snapshot {
        let before = self.snapshot();
        std::thread::sleep(d);
        self.snapshot() - before
    }

    pub fn stop(mut self) -> Snapshot {
        self.halt();
        self.snapshot()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    pub fn take_errors(&self) -> Vec<String> {
        std::mem::take(&mut *self.errors.lock().unwrap())
    }
}

/// A test that fails midway stops its load before the namespaces go.
impl Drop for Load {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Elapsed since `t`, in ms (for messages).
pub fn ms(t: Instant) -> u128 {
    t.elapsed().as_millis()
}
