//! A WebSphere-like cluster member for the tests: issues `JSESSIONID=0000<id>:<clone>`
//! (or the cookie name its application is configured with, `Clones::app`),
//! keeps a counter per session, replicates every write synchronously to its peer
//! replica, takes over a session it holds as replica by appending its own clone ID, and
//! marks a request that found no session (`session lost`). Every request is logged, so
//! tests can prove where each session's requests went.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

#[derive(Default)]
struct Store {
    /// Sessions this clone owns: session id -> counter.
    own: HashMap<String, u64>,
    /// Copies replicated from its peer.
    replica: HashMap<String, u64>,
}

/// One request as a clone saw it.
#[derive(Clone, Debug)]
pub struct Hit {
    pub backend: usize,
    /// The session the request was served in (after any takeover or creation).
    pub session: String,
    /// The cookie named a session this clone did not have (neither owned nor replicated).
    pub lost: bool,
    /// The clone IDs the request's cookie carried.
    pub cookie_clones: Vec<String>,
    /// The request's target as the clone received it.
    pub path: String,
    /// A converged application's request: the container (`ln<i>`, as
    /// `sipcontainer::SipCluster::logical_name`) whose logical name its `ibmappid` names.
    pub app_owner: Option<usize>,
}

/// How the clones write their name into JSESSIONID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdStyle {
    /// WebSphere and Liberty: `0000<id>:<clone>[:<clone>...]`; a clone taking a session
    /// over appends its clone ID.
    WebSphere,
    /// Tomcat and JBoss/WildFly: `<id>.<jvmRoute>`; a clone taking a session over rewrites
    /// the route to its own (Tomcat's JvmRouteBinderValve).
    JvmRoute,
}

pub struct Clones {
    pub clone_ids: Vec<String>,
    style: IdStyle,
    /// The application's name (`Clones::app`): its answers say `app=<name>`; empty for
    /// the clones of `new`/`with_ids`, whose answers stay as they were.
    pub app: String,
    /// The session cookie's name (WebSphere's per-application session cookie; default
    /// `JSESSIONID`), and the URL's session parameter (`;jsessionid=`: the cookie's name
    /// in lower case, as the plug-in's `AffinityURLIdentifier` defaults).
    pub cookie: String,
    pub url_parameter: String,
    peers: Vec<Option<usize>>,
    stores: Vec<Mutex<Store>>,
    /// A clone that is down (killed) neither serves nor receives replication.
    alive: Vec<AtomicBool>,
    /// A frozen clone (as under SIGSTOP) accepts connections but answers nothing.
    frozen: Vec<AtomicBool>,
    /// Requests a clone read while frozen.
    pub received_frozen: Vec<AtomicU64>,
    pub log: Mutex<Vec<Hit>>,
    next_session: AtomicU64,
    /// Requests a clone is serving now, and the most it served at once (`/slow/<ms>`
    /// requests take that long).
    pub busy: Vec<AtomicU64>,
    pub busy_max: Vec<AtomicU64>,
    /// The clone that served each `/plain` request, in order.
    pub plain: Mutex<Vec<usize>>,
}

impl Clones {
    /// `n` clones, paired 0-1, 2-3, ... as peer replicas.
    pub fn new(n: usize) -> Arc<Clones> {
        Clones::with_ids((0..n).map(|i| format!("clone{i}x")).collect(), IdStyle::WebSphere)
    }

    /// One clone per ID (its clone ID or jvmRoute), paired as `new`'s.
    pub fn with_ids(clone_ids: Vec<String>, style: IdStyle) -> Arc<Clones> {
        Clones::build(String::new(), clone_ids, style, "JSESSIONID")
    }

    /// The clones of one application of a cell (one farm): named `app` (each answer says
    /// `app=<app> path=<target>`), WebSphere-style session IDs in cookie `cookie` (and URL
    /// parameter `cookie` in lower case), paired as `new`'s. Several applications, each
    /// its own `Clones`, can run side by side in one testbed (`Testbed::start_clone`).
    pub fn app(app: &str, clone_ids: &[&str], cookie: &str) -> Arc<Clones> {
        Clones::build(app.to_string(), clone_ids.iter().map(|s| s.to_string()).collect(), IdStyle::WebSphere, cookie)
    }

    fn build(app: String, clone_ids: Vec<String>, style: IdStyle, cookie: &str) -> Arc<Clones> {
        let n = clone_ids.len();
        Arc::new(Clones {
            clone_ids,
            style,
            app,
            cookie: cookie.to_string(),
            url_parameter: cookie.to_ascii_lowercase(),
            peers: (0..n).map(|i| if i ^ 1 < n { Some(i ^ 1) } else { None }).collect(),
            stores: (0..n).map(|_| Mutex::new(Store::default())).collect(),
            alive: (0..n).map(|_| AtomicBool::new(true)).collect(),
            frozen: (0..n).map(|_| AtomicBool::new(false)).collect(),
            received_frozen: (0..n).map(|_| AtomicU64::new(0)).collect(),
            log: Mutex::new(Vec::new()),
            next_session: AtomicU64::new(1),
            busy: (0..n).map(|_| AtomicU64::new(0)).collect(),
            busy_max: (0..n).map(|_| AtomicU64::new(0)).collect(),
            plain: Mutex::new(Vec::new()),
        })
    }

    pub fn hits(&self) -> Vec<Hit> {
        self.log.lock().unwrap().clone()
    }

    /// Requests, from the clones' own logs, served by a clone that is neither the first
    /// owner of their session nor that owner's peer: "session S of clone O served by
    /// clone B". Must stay empty.
    pub fn misroutes(&self) -> Vec<String> {
        let mut owner: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        let mut out = Vec::new();
        for h in self.hits() {
            if h.lost {
                // Its cookie named a session this clone has no copy of.
                out.push(format!("a session of {:?} reached clone {}, which had no copy", h.cookie_clones, h.backend));
                continue;
            }
            let o = *owner.entry(h.session.clone()).or_insert(h.backend);
            if h.backend != o && Some(h.backend) != self.peers[o] {
                out.push(format!("session {} of clone {o} served by clone {}", h.session, h.backend));
            }
        }
        out
    }

    /// Converged requests (`ibmappid=ln<i>...`) served by a clone that is neither
    /// container `i` nor its peer replica. Must stay empty.
    pub fn app_misroutes(&self) -> Vec<String> {
        self.hits()
            .iter()
            .filter_map(|h| {
                let o = h.app_owner?;
                (h.backend != o && Some(h.backend) != self.peers[o])
                    .then(|| format!("a request for ln{o} served by clone {}", h.backend))
            })
            .collect()
    }

    /// Serves one request; returns status line extras, headers and body.
    fn handle(&self, me: usize, cookie: Option<&str>, app_owner: Option<usize>, path: &str) -> (Vec<String>, String) {
        let parsed = cookie.and_then(|v| {
            let v = v.trim_matches('"');
            match self.style {
                IdStyle::WebSphere => {
                    let colon = v.find(':')?;
                    (colon > 4).then(|| {
                        (
                            v[4..colon].to_string(),
                            v[colon + 1..].split(':').map(str::to_string).collect::<Vec<_>>(),
                            v.to_string(),
                        )
                    })
                }
                IdStyle::JvmRoute => {
                    let (sid, route) = v.rsplit_once('.')?;
                    Some((sid.to_string(), vec![route.to_string()], v.to_string()))
                }
            }
        });
        let mut headers = Vec::new();
        let mut lost = false;
        let (sid, count, clones) = match parsed {
            Some((sid, clones, value)) => {
                let mut store = self.stores[me].lock().unwrap();
                // A copy replicated from the peer that is newer than ours (the peer served
                // the session meanwhile) wins: sessions are versioned, as DRS's are.
                let newer = match (store.own.get(&sid), store.replica.get(&sid)) {
                    (Some(o), Some(r)) => r > o,
                    _ => false,
                };
                if newer {
                    store.own.remove(&sid);
                }
                if let Some(c) = store.own.get_mut(&sid) {
                    *c += 1;
                    (sid, *c, clones)
                } else if let Some(c) = store.replica.remove(&sid) {
                    // Take over the replicated session: it is ours now, and the cookie
                    // says so by our clone ID appended.
                    store.own.insert(sid.clone(), c + 1);
                    let (me_id, name) = (&self.clone_ids[me], &self.cookie);
                    headers.push(match self.style {
                        IdStyle::WebSphere => format!("Set-Cookie: {name}={value}:{me_id}; Path=/"),
                        IdStyle::JvmRoute => format!("Set-Cookie: {name}={sid}.{me_id}; Path=/"),
                    });
                    (sid, c + 1, clones)
                } else {
                    lost = true;
                    drop(store);
                    let (sid, c) = self.create(me, &mut headers);
                    (sid, c, clones)
                }
            }
            None => {
                let (sid, c) = self.create(me, &mut headers);
                (sid, c, Vec::new())
            }
        };
        // Synchronous replication of the write to the peer. Versioned, as DRS's copies
        // are: two requests of a session served at once replicate in either order, and
        // the older write must not replace the newer one (the replica would then resume
        // the session from a stale count).
        if let Some(p) = self.peers[me].filter(|&p| self.alive[p].load(Ordering::SeqCst)) {
            let mut peer = self.stores[p].lock().unwrap();
            let kept = peer.replica.entry(sid.clone()).or_insert(count);
            *kept = (*kept).max(count);
        }
        if lost {
            headers.push("X-Session-Lost: 1".into());
        }
        self.log.lock().unwrap().push(Hit {
            backend: me,
            session: sid.clone(),
            lost,
            cookie_clones: clones,
            path: path.to_string(),
            app_owner,
        });
        (headers, format!("clone={} session={sid} count={count} lost={}\n", self.clone_ids[me], lost as u8))
    }

    /// The process dies (kill -9): its memory is gone. The caller stops its servers.
    pub fn kill(&self, me: usize) {
        self.alive[me].store(false, Ordering::SeqCst);
        *self.stores[me].lock().unwrap() = Store::default();
    }

    /// It starts again and, as a replication domain member does, gets its sessions' copies
    /// back from its peer (and gives the peer copies of the peer's).
    pub fn revive(&self, me: usize) {
        if let Some(p) = self.peers[me] {
            let peer = self.stores[p].lock().unwrap();
            let mut mine = self.stores[me].lock().unwrap();
            mine.own = peer.replica.clone();
            mine.replica = peer.own.clone();
        }
        self.alive[me].store(true, Ordering::SeqCst);
    }

    pub fn freeze(&self, me: usize, on: bool) {
        self.frozen[me].store(on, Ordering::SeqCst);
    }

    fn create(&self, me: usize, headers: &mut Vec<String>) -> (String, u64) {
        let sid = format!("S{:08}ABCDEFGHIJ", self.next_session.fetch_add(1, Ordering::SeqCst));
        self.stores[me].lock().unwrap().own.insert(sid.clone(), 1);
        let (me_id, name) = (&self.clone_ids[me], &self.cookie);
        headers.push(match self.style {
            IdStyle::WebSphere => format!("Set-Cookie: {name}=0000{sid}:{me_id}; Path=/; HttpOnly"),
            IdStyle::JvmRoute => format!("Set-Cookie: {name}={sid}.{me_id}; Path=/; HttpOnly"),
        });
        (sid, 1)
    }
}

/// Serves HTTP/1.1 with keep-alive on `port` as clone `me` until `stop`.
pub fn serve(cluster: Arc<Clones>, me: usize, port: u16, stop: Arc<AtomicBool>) {
    let listener = TcpListener::bind(("0.0.0.0", port)).expect("bind the clone's port");
    listener.set_nonblocking(true).unwrap();
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                let (cluster, stop) = (cluster.clone(), stop.clone());
                conns.push(std::thread::spawn(move || connection(&cluster, me, s, &stop)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
        conns.retain(|c| !c.is_finished());
    }
    for c in conns {
        let _ = c.join();
    }
}

fn connection(cluster: &Clones, me: usize, s: TcpStream, stop: &AtomicBool) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let _ = s.set_nodelay(true);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    loop {
        // Request head, line by line.
        let mut lines: Vec<String> = Vec::new();
        let mut line = String::new();
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            match r.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if line == "\r\n" {
                        break;
                    }
                    lines.push(line.trim_end().to_string());
                    line.clear();
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return,
            }
        }
        let header = |name: &str| {
            lines.iter().skip(1).find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let is_health = lines.first().is_some_and(|l| l.starts_with("GET /health "));
        if cluster.frozen[me].load(Ordering::SeqCst) {
            // Stopped: the request sits unread by the application until it is thawed.
            if !is_health {
                cluster.received_frozen[me].fetch_add(1, Ordering::SeqCst);
            }
            while cluster.frozen[me].load(Ordering::SeqCst) {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if is_health {
            // The dispatcher's health check: no session, not logged.
            let resp = if close {
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            } else {
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
            };
            if w.write_all(resp.as_bytes()).is_err() || close {
                return;
            }
            continue;
        }
        if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            let mut body = vec![0u8; n];
            r.get_ref().set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            if r.read_exact(&mut body).is_err() {
                return;
            }
            r.get_ref().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        }
        // The session ID from the cookie, else from URL rewriting (`;jsessionid=`).
        let target = lines.first().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("");
        let from_url = target
            .split(['?', '#'])
            .next()
            .unwrap_or("")
            .split_once(format!(";{}=", cluster.url_parameter).as_str())
            .map(|(_, v)| v.split([';', '/']).next().unwrap_or("").to_string());
        let cookie = header("cookie")
            .and_then(|c| {
                c.split(';').find_map(|p| {
                    let (n, v) = p.trim().split_once('=')?;
                    (n == cluster.cookie).then(|| v.to_string())
                })
            })
            .or(from_url);
        // A converged application's logical name (`ibmappid=ln<i>.<digits>...`).
        let app_owner = target.split(['?', ';', '&']).find_map(|p| {
            let ln = p.strip_prefix("ibmappid=")?.split('.').next()?;
            ln.strip_prefix("ln")?.parse::<usize>().ok()
        });
        // `/slow/<ms>`: the application takes that long (concurrency is recorded).
        let slow = target.strip_prefix("/slow/").and_then(|ms| ms.split(['?', ';', '/']).next()?.parse::<u64>().ok());
        if let Some(ms) = slow {
            let now = cluster.busy[me].fetch_add(1, Ordering::SeqCst) + 1;
            cluster.busy_max[me].fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(ms.min(10_000)));
        }
        // `/plain...`: an application without sessions (no JSESSIONID, nothing kept).
        let (headers, mut body) = if target.starts_with("/plain") {
            cluster.plain.lock().unwrap().push(me);
            (Vec::new(), format!("clone={}\n", cluster.clone_ids[me]))
        } else {
            cluster.handle(me, cookie.as_deref(), app_owner, target)
        };
        if slow.is_some() {
            cluster.busy[me].fetch_sub(1, Ordering::SeqCst);
        }
        // What the dispatcher said of the client's connection (HTTP or HTTPS, and port).
        let proto = header("x-forwarded-proto").unwrap_or_default();
        body += &format!("forwarded={proto}:{}\n", header("x-forwarded-port").unwrap_or_default());
        // What a WebSphere web container makes of the plug-in's private headers: the
        // scheme, isSecure() and getRemoteAddr() the application sees.
        body += &format!(
            "websphere={}:{}:{}\n",
            header("$wssc").unwrap_or_default(),
            header("$wsis").unwrap_or_default(),
            header("$wsra").unwrap_or_default()
        );
        if !cluster.app.is_empty() {
            // Which application (farm) served it, and the path it was asked for.
            body += &format!("app={} path={target}\n", cluster.app);
        }
        let mut resp = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n", body.len());
        for h in headers {
            resp += &h;
            resp += "\r\n";
        }
        if close {
            resp += "Connection: close\r\n";
        }
        resp += "\r\n";
        resp += &body;
        if w.write_all(resp.as_bytes()).is_err() || close {
            return;
        }
    }
}

/// A client with a cookie jar over keep-alive connections.
pub struct Client {
    pub addr: std::net::SocketAddr,
    pub jar: Option<String>,
    conn: Option<BufReader<Conn>>,
    ns: crate::netns::Ns,
    /// Source address of its connections (`bound_to`); the kernel's choice otherwise.
    source: Option<std::net::Ipv4Addr>,
    /// HTTPS (`over_tls`): the client configuration and the name to ask for (SNI).
    tls: Option<(std::sync::Arc<rustls::ClientConfig>, rustls::pki_types::ServerName<'static>)>,
    /// The Host header (`with_host`); the address connected to otherwise.
    host: Option<String>,
    /// The session cookie `jar` holds (`with_cookie`; default `JSESSIONID`).
    pub cookie: String,
    /// How long opening a connection may take (`with_connect_timeout`; default 3 s).
    connect_timeout: Duration,
}

/// A client connection, plain or TLS (rustls, verifying the server's certificate).
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// A TLS client configuration that trusts the CA certificates in `ca_file` (PEM), offers
/// ALPN `http/1.1` and resumes sessions.
pub fn tls_client_config(ca_file: &std::path::Path) -> std::sync::Arc<rustls::ClientConfig> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).expect("the CA file") {
        roots.add(cert.expect("a CA certificate")).expect("a usable CA certificate");
    }
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    std::sync::Arc::new(config)
}

/// A TCP connection from `src` (any port) to `to`, within 3 s.
pub fn connect_from(src: std::net::Ipv4Addr, to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    connect_from_within(src, to, Duration::from_secs(3))
}

/// The same, giving up after `within`.
pub fn connect_from_within(
    src: std::net::Ipv4Addr,
    to: std::net::SocketAddr,
    within: Duration,
) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    bind(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(std::net::SocketAddrV4::new(src, 0)))?;
    // connect(2) gives up after the send timeout.
    let within = nix::sys::time::TimeVal::new(within.as_secs() as _, within.subsec_micros() as _);
    setsockopt(&fd, sockopt::SendTimeout, &within)?;
    let std::net::SocketAddr::V4(to) = to else { return Err(std::io::ErrorKind::InvalidInput.into()) };
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(to))?;
    setsockopt(&fd, sockopt::SendTimeout, &nix::sys::time::TimeVal::new(10, 0))?;
    Ok(TcpStream::from(fd))
}

/// One response as the client read it.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// `key=value` from the emulator's body.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.body.split_whitespace().find_map(|kv| kv.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
    }
}

impl Client {
    pub fn new(ns: &crate::netns::Ns, addr: std::net::SocketAddr) -> Client {
        Client {
            addr,
            jar: None,
            conn: None,
            ns: ns.clone(),
            source: None,
            tls: None,
            host: None,
            cookie: "JSESSIONID".to_string(),
            connect_timeout: Duration::from_secs(3),
        }
    }

    /// Opening a connection fails after `t` (under the 1 s of TCP's first SYN
    /// retransmission: a SYN lost is a failed connection, not a slow one).
    pub fn with_connect_timeout(mut self, t: Duration) -> Client {
        self.connect_timeout = t;
        self
    }

    /// Requests say `Host: <host>` (a virtual host of the cell, `name[:port]`).
    pub fn with_host(mut self, host: &str) -> Client {
        self.host = Some(host.to_string());
        self
    }

    /// The jar keeps (and sends) the session cookie `name` instead of JSESSIONID.
    pub fn with_cookie(mut self, name: &str) -> Client {
        self.cookie = name.to_string();
        self
    }

    /// HTTPS: TLS with `config`, asking for `name`.
    pub fn over_tls(mut self, config: std::sync::Arc<rustls::ClientConfig>, name: &str) -> Client {
        self.tls = Some((config, rustls::pki_types::ServerName::try_from(name.to_string()).expect("a DNS name")));
        self
    }

    /// Connections from `src` (an address of its namespace).
    pub fn bound_to(mut self, src: std::net::Ipv4Addr) -> Client {
        self.source = Some(src);
        self
    }

    /// It holds an open connection (the next request does not open one).
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Drops the connection; the next request opens a new one.
    pub fn reconnect(&mut self) {
        self.conn = None;
    }

    pub fn get(&mut self, path: &str) -> std::io::Result<Response> {
        if self.conn.is_none() {
            let (addr, source, within) = (self.addr, self.source, self.connect_timeout);
            let s = self.ns.run(move || match source {
                Some(src) => connect_from_within(src, addr, within),
                None => TcpStream::connect_timeout(&addr, within),
            })?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            let conn = match &self.tls {
                None => Conn::Plain(s),
                Some((config, name)) => {
                    let c =
                        rustls::ClientConnection::new(config.clone(), name.clone()).map_err(std::io::Error::other)?;
                    Conn::Tls(Box::new(rustls::StreamOwned::new(c, s)))
                }
            };
            self.conn = Some(BufReader::new(conn));
        }
        let r = self.conn.as_mut().unwrap();
        let cookie = self.jar.as_ref().map(|c| format!("Cookie: {}={c}\r\n", self.cookie)).unwrap_or_default();
        let host = self.host.clone().unwrap_or_else(|| self.addr.to_string());
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{cookie}\r\n");
        let result = (|| {
            let w = r.get_mut();
            w.write_all(req.as_bytes())?;
            w.flush()?;
            read_response(r)
        })();
        match result {
            Ok(resp) => {
                for (n, v) in &resp.headers {
                    if n.eq_ignore_ascii_case("set-cookie") {
                        if let Some(rest) = v.strip_prefix(self.cookie.as_str()).and_then(|r| r.strip_prefix('=')) {
                            self.jar = Some(rest.split(';').next().unwrap_or("").to_string());
                        }
                    }
                }
                if resp.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
                    self.conn = None;
                }
                Ok(resp)
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }
}

/// One answer (or failure) a load client saw.
#[derive(Clone, Debug)]
pub struct Seen {
    /// 0: no answer (the connection failed).
    pub status: u16,
    /// The session's counter, as the clone answered it.
    pub count: u64,
    pub lost: bool,
    pub clone: String,
    /// The application that answered (`Clones::app`; empty for unnamed clones).
    pub app: String,
    pub took: Duration,
    pub retry_after: bool,
}

/// Clients with cookie jars asking, each for its own path, again and again until
/// `finish`: 10 ms apart, a new connection every 7th request and after a failure (a 5xx
/// closes the connection), 50 ms more after a failure.
pub struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    seen: Vec<Arc<Mutex<Vec<Seen>>>>,
}

impl Load {
    pub fn start(clients: Vec<(Client, String)>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (mut threads, mut seen) = (Vec::new(), Vec::new());
        for (mut c, path) in clients {
            let log = Arc::new(Mutex::new(Vec::new()));
            seen.push(log.clone());
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    if n.is_multiple_of(7) {
                        c.reconnect();
                    }
                    let t = std::time::Instant::now();
                    let r = c.get(&path);
                    let s = Seen {
                        status: r.as_ref().map_or(0, |r| r.status),
                        count: r.as_ref().ok().and_then(|r| r.field("count")?.parse().ok()).unwrap_or(0),
                        lost: r.as_ref().is_ok_and(|r| r.field("lost") == Some("1")),
                        clone: r.as_ref().ok().and_then(|r| r.field("clone")).unwrap_or("").to_string(),
                        app: r.as_ref().ok().and_then(|r| r.field("app")).unwrap_or("").to_string(),
                        took: t.elapsed(),
                        retry_after: r.as_ref().is_ok_and(|r| r.header("retry-after").is_some()),
                    };
                    let failed = s.status != 200;
                    log.lock().unwrap().push(s);
                    if failed {
                        c.reconnect();
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }));
        }
        Load { stop, threads, seen }
    }

    /// Stops the clients: what each saw, in the order of `start`'s clients.
    pub fn finish(self) -> Vec<Vec<Seen>> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        self.seen.iter().map(|s| s.lock().unwrap().clone()).collect()
    }
}

/// Reads a response with a Content-Length body (or none).
pub fn read_response<R: BufRead>(r: &mut R) -> std::io::Result<Response> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).ok_or(std::io::ErrorKind::InvalidData)?;
    let mut headers = Vec::new();
    loop {
        let mut l = String::new();
        if r.read_line(&mut l)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if l == "\r\n" {
            break;
        }
        if let Some((n, v)) = l.trim_end().split_once(':') {
            headers.push((n.trim().to_string(), v.trim().to_string()));
        }
    }
    let len = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok(Response { status, headers, body: String::from_utf8_lossy(&body).into_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clone of `cluster` serving on a free loopback port; (port, stop).
    fn running(cluster: &Arc<Clones>, me: usize) -> (u16, Arc<AtomicBool>, JoinHandle<()>) {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (cluster.clone(), stop.clone());
        let t = std::thread::spawn(move || serve(c, me, port, s));
        std::thread::sleep(Duration::from_millis(100));
        (port, stop, t)
    }

    fn get(port: u16, target: &str, cookie: Option<&str>) -> Response {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut w = s.try_clone().unwrap();
        let cookie = cookie.map(|c| format!("Cookie: {c}\r\n")).unwrap_or_default();
        write!(w, "GET {target} HTTP/1.1\r\nHost: x\r\n{cookie}Connection: close\r\n\r\n").unwrap();
        read_response(&mut BufReader::new(s)).unwrap()
    }

    fn set_cookie(r: &Response, name: &str) -> Option<String> {
        r.headers.iter().find_map(|(n, v)| {
            let rest = v.strip_prefix(name)?.strip_prefix('=')?;
            n.eq_ignore_ascii_case("set-cookie").then(|| rest.split(';').next().unwrap().to_string())
        })
    }

    #[test]
    fn an_application_sets_and_reads_its_own_cookie_name() {
        let admin = Clones::app("admin", &["adm1", "adm2"], "ADMINSESSIONID");
        let (port, stop, t) = running(&admin, 0);
        let first = get(port, "/admin/x", None);
        let value = set_cookie(&first, "ADMINSESSIONID").expect("an ADMINSESSIONID cookie");
        assert!(value.starts_with("0000") && value.ends_with(":adm1"), "{value}");
        assert!(set_cookie(&first, "JSESSIONID").is_none(), "{first:?}");
        assert_eq!(
            (first.field("app"), first.field("path"), first.field("count")),
            (Some("admin"), Some("/admin/x"), Some("1"))
        );
        // Its own cookie continues the session; another application's cookie is not its.
        let again = get(port, "/admin/y", Some(&format!("ADMINSESSIONID={value}")));
        assert_eq!((again.field("count"), again.field("lost")), (Some("2"), Some("0")), "{again:?}");
        let other = get(port, "/admin/z", Some(&format!("JSESSIONID={value}")));
        assert_eq!(other.field("count"), Some("1"), "JSESSIONID is not this application's cookie: {other:?}");
        // The URL parameter is the cookie's name in lower case.
        let url = get(port, &format!("/admin/u;adminsessionid={value}"), None);
        assert_eq!(url.field("count"), Some("3"), "{url:?}");
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
        let hits = admin.hits();
        assert_eq!(hits.iter().map(|h| h.path.as_str()).collect::<Vec<_>>()[..2], ["/admin/x", "/admin/y"]);
        assert!(admin.misroutes().is_empty(), "{:?}", admin.misroutes());
    }

    #[test]
    fn the_default_clones_keep_jsessionid_and_their_answers() {
        let c = Clones::new(2);
        let (port, stop, t) = running(&c, 1);
        let r = get(port, "/", None);
        let value = set_cookie(&r, "JSESSIONID").expect("a JSESSIONID cookie");
        assert!(value.ends_with(":clone1x"), "{value}");
        assert!(r.field("app").is_none() && r.field("path").is_none(), "unnamed clones answer as before: {r:?}");
        let r = get(port, "/;jsessionid=x", Some(&format!("JSESSIONID={value}")));
        assert_eq!(r.field("count"), Some("2"));
        stop.store(true, Ordering::SeqCst);
        t.join().unwrap();
    }

    /// A replica takes over under the application's cookie name.
    #[test]
    fn a_replica_takes_over_under_the_applications_cookie() {
        let shop = Clones::app("shop", &["s1", "s2"], "SHOPSESSION");
        let (p0, stop0, t0) = running(&shop, 0);
        let (p1, stop1, t1) = running(&shop, 1);
        let value = set_cookie(&get(p0, "/shop/a", None), "SHOPSESSION").unwrap();
        stop0.store(true, Ordering::SeqCst);
        t0.join().unwrap();
        shop.kill(0);
        let r = get(p1, "/shop/b", Some(&format!("SHOPSESSION={value}")));
        assert_eq!((r.field("clone"), r.field("count"), r.field("lost")), (Some("s2"), Some("2"), Some("0")), "{r:?}");
        assert_eq!(set_cookie(&r, "SHOPSESSION"), Some(format!("{value}:s2")));
        stop1.store(true, Ordering::SeqCst);
        t1.join().unwrap();
        assert!(shop.misroutes().is_empty());
    }
}
