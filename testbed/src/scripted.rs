//! A backend whose answer depends on the request path: well-formed, malformed, cut off,
//! interim, upgraded. It records every request it receives, raw, so tests can see what
//! the proxy forwarded.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

#[derive(Default)]
pub struct Record {
    /// Every request received: head and body as they arrived.
    pub requests: Mutex<Vec<String>>,
    /// Connections accepted.
    pub connections: AtomicUsize,
    /// `/die-once`: set by the first request that took it (on any backend).
    pub died: std::sync::atomic::AtomicBool,
}

impl Record {
    pub fn last(&self) -> String {
        self.requests.lock().unwrap().last().cloned().unwrap_or_default()
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

pub fn serve(record: Arc<Record>, port: u16, stop: Arc<AtomicBool>) {
    let listener = TcpListener::bind(("0.0.0.0", port)).expect("bind");
    listener.set_nonblocking(true).unwrap();
    let mut conns: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                record.connections.fetch_add(1, Ordering::SeqCst);
                let (record, stop) = (record.clone(), stop.clone());
                conns.push(std::thread::spawn(move || {
                    let _ = connection(&record, s, &stop);
                }));
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

fn read_line(r: &mut BufReader<TcpStream>, stop: &AtomicBool) -> std::io::Result<Option<String>> {
    let mut line = String::new();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        match r.read_line(&mut line) {
            Ok(0) => return Ok(None),
            Ok(_) if line.ends_with('\n') => return Ok(Some(line)),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(e),
        }
    }
}

fn connection(record: &Record, s: TcpStream, stop: &AtomicBool) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_millis(50)))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    loop {
        let mut raw = String::new();
        let mut lines = Vec::new();
        loop {
            let Some(l) = read_line(&mut r, stop)? else { return Ok(()) };
            raw += &l;
            if l == "\r\n" {
                break;
            }
            lines.push(l.trim_end().to_string());
        }
        let path = lines.first().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("/").to_string();
        if path == "/health" {
            // The dispatcher's health check: answered, not recorded (nor its connection).
            record.connections.fetch_sub(1, Ordering::SeqCst);
            w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
            return Ok(());
        }
        let header = |name: &str| {
            lines.iter().skip(1).find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
        };
        if header("expect").is_some() && path == "/continue" {
            w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        if header("expect").is_some() && path == "/hints-continue" {
            // An interim response other than 100 first, then the go-ahead.
            w.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n")?;
            w.flush()?;
            std::thread::sleep(Duration::from_millis(50));
            w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")?;
        }
        if header("expect").is_some() && path == "/refuse-body" {
            w.write_all(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
            record.requests.lock().unwrap().push(raw);
            return Ok(());
        }
        // The body, by Content-Length or chunked.
        if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            let mut body = vec![0u8; n];
            r.get_ref().set_read_timeout(Some(Duration::from_secs(5)))?;
            r.read_exact(&mut body)?;
            r.get_ref().set_read_timeout(Some(Duration::from_millis(50)))?;
            raw += &String::from_utf8_lossy(&body);
        } else if header("transfer-encoding").is_some() {
            loop {
                let Some(size) = read_line(&mut r, stop)? else { return Ok(()) };
                raw += &size;
                let n = usize::from_str_radix(size.trim_end().split(';').next().unwrap_or(""), 16).unwrap_or(0);
                if n == 0 {
                    // Trailers until the empty line.
                    loop {
                        let Some(t) = read_line(&mut r, stop)? else { return Ok(()) };
                        raw += &t;
                        if t == "\r\n" {
                            break;
                        }
                    }
                    break;
                }
                let mut data = vec![0u8; n + 2];
                r.get_ref().set_read_timeout(Some(Duration::from_secs(5)))?;
                r.read_exact(&mut data)?;
                r.get_ref().set_read_timeout(Some(Duration::from_millis(50)))?;
                raw += &String::from_utf8_lossy(&data);
            }
        }
        record.requests.lock().unwrap().push(raw.clone());
        let reply: Vec<u8> = match path.as_str() {
            "/echo" | "/continue" | "/hints-continue" => {
                let body = raw.clone();
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
            }
            "/chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 11\r\n\r\n".to_vec(),
            "/both-te-cl" => b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec(),
            "/double-chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n".to_vec(),
            "/bad-chunk" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nSMUGGLED\r\n0\r\n\r\n".to_vec(),
            "/cut-head" => {
                w.write_all(b"HTTP/1.1 200 OK\r\nContent-Le")?;
                return Ok(());
            }
            "/cut-body" => {
                w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly part")?;
                w.flush()?;
                std::thread::sleep(Duration::from_millis(100));
                return Ok(());
            }
            "/no-length" => {
                w.write_all(b"HTTP/1.1 200 OK\r\n\r\nuntil close")?;
                return Ok(());
            }
            "/503" => b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy".to_vec(),
            // A response that asks the proxy to drop its own framing field.
            "/conn-cl" => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: content-length\r\n\r\nok".to_vec(),
            "/slow" => {
                std::thread::sleep(Duration::from_millis(1500));
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nslow".to_vec()
            }
            "/medium" => {
                let body = vec![b'm'; 8_000];
                let mut out = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
                out.extend_from_slice(&body);
                out
            }
            "/die-once" if !record.died.swap(true, Ordering::SeqCst) => {
                // The first such request, on whichever backend, finds the server dying.
                return Ok(());
            }
            "/die-after-body" => {
                // The request (body included) arrived; the server dies before answering.
                return Ok(());
            }
            "/big" => {
                // 16 MiB: more than socket buffers hold, for readers that stop reading.
                let body = vec![b'x'; 16 << 20];
                w.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes())?;
                r.get_ref().set_write_timeout(Some(Duration::from_secs(10)))?;
                w.write_all(&body)?;
                continue;
            }
            "/head-len" => b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n".to_vec(),
            "/upgrade" => {
                w.write_all(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")?;
                // Echo whatever comes, upper-cased, until the client closes.
                let mut buf = [0u8; 256];
                r.get_ref().set_read_timeout(Some(Duration::from_secs(5)))?;
                loop {
                    let n = r.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    w.write_all(&buf[..n].to_ascii_uppercase())?;
                }
            }
            "/close-idle" => {
                // Keep-alive promised, then the server drops the idle connection.
                w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")?;
                std::thread::sleep(Duration::from_millis(100));
                return Ok(());
            }
            _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        };
        w.write_all(&reply)?;
    }
}

/// A testbed of scripted backends behind one HTTP VIP (`VIP`:80, backends on
/// `BACKEND_PORT`) and one L4 VIP (`L4_VIP`:`BACKEND_PORT`, forwarded by XDP to the same
/// servers), with the helpers the protocol tests share.
pub struct Bed {
    pub tb: crate::netns::Testbed,
    pub record: Arc<Record>,
    pub addr: std::net::SocketAddr,
}

pub const VIP: &str = "10.99.100.9";
pub const L4_VIP: &str = "10.99.100.8";
pub const BACKEND_PORT: u16 = 8080;

impl Bed {
    /// `backends` scripted backends; `http` and `health` add lines to those sections.
    pub fn new(backends: usize, http: &str, health: &str) -> Bed {
        Bed::limited(backends, http, health, None)
    }

    /// As `new`, the agent run with the descriptor limit `nofile`.
    pub fn limited(backends: usize, http: &str, health: &str, nofile: Option<u64>) -> Bed {
        let mut tb = crate::netns::Testbed::new(backends, &[VIP, L4_VIP]);
        tb.add_local_vip(VIP);
        let record = Arc::new(Record::default());
        tb.start_scripted(&record, BACKEND_PORT);
        let text = format!(
            "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nserver_timeout = \"2s\"\nclient_timeout = \"2s\"\n{http}\n[health]\npath = \"/health\"\n{health}\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nring_size = 1009\n\n[[vip]]\nname = \"l4\"\naddress = \"{L4_VIP}\"\nport = {BACKEND_PORT}\nring_size = 1009\n",
            tb.instance(),
            tb.backend_config(&[])
        );
        let path = tb.write_config(&text);
        tb.start_dispatcher_limited(&path, &[], nofile);
        Bed { tb, record, addr: format!("{VIP}:80").parse().unwrap() }
    }

    pub fn connect(&self) -> (BufReader<TcpStream>, TcpStream) {
        let addr = self.addr;
        let s = self.tb.client.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let w = s.try_clone().unwrap();
        (BufReader::new(s), w)
    }

    /// Sends `req` in one write, reads everything until the proxy closes.
    pub fn all(&self, req: &[u8]) -> String {
        let (mut r, mut w) = self.connect();
        let _ = w.write_all(req);
        let mut out = Vec::new();
        let _ = r.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    pub fn one(&self, req: &[u8]) -> crate::websphere::Response {
        let (mut r, mut w) = self.connect();
        w.write_all(req).unwrap();
        crate::websphere::read_response(&mut r).expect("a response")
    }

    /// One request through the L4 VIP (XDP straight to a backend): its status.
    pub fn through_l4(&self) -> std::io::Result<u16> {
        let addr: std::net::SocketAddr = format!("{L4_VIP}:{BACKEND_PORT}").parse().unwrap();
        self.tb.client.run(move || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut w = s.try_clone()?;
            w.write_all(b"GET /echo HTTP/1.1\r\nHost: l4\r\nConnection: close\r\n\r\n")?;
            let r = crate::websphere::read_response(&mut BufReader::new(s))?;
            Ok(r.status)
        })
    }

    /// `dispatcher status --json`.
    pub fn status(&self) -> serde_json::Value {
        let cfg = self.tb.workdir.join("dispatcher.toml");
        serde_json::from_str(&self.tb.dispatcher_cmd(&["status", "--config", cfg.to_str().unwrap(), "--json"])).unwrap()
    }

    /// Requests the backends received (health checks are not recorded).
    pub fn seen(&self) -> Vec<String> {
        self.record.requests.lock().unwrap().clone()
    }
}
