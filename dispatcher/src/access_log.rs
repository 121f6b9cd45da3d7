//! The access log: one line per HTTP request, written off the request path.
//!
//! The request path fills an `Entry` (numbers and a few shared names; the request line
//! and the session's clone ID are the only copies) and hands it to a bounded channel
//! without waiting: when the writer is behind by `buffer` lines, the entry is dropped and
//! counted (`dispatcher_access_log_dropped_total`), never the request. One writer thread
//! formats (JSON lines, or HAProxy's HTTP log layout) into a buffered file or standard
//! output and flushes whenever it has caught up, or sends each line to syslog as an RFC
//! 5424 datagram (`syslog`). Every reload opens the configured file again (`reopen`,
//! then `switch` once the reload succeeded), so that a rotated log continues in a new
//! file; the agent flushes it before it exits.

use std::{
    fmt::Write as _,
    fs::{File, OpenOptions},
    io::Write,
    net::SocketAddr,
    sync::{
        atomic::Ordering,
        mpsc::{sync_channel, Receiver, SyncSender, TryRecvError, TrySendError},
        Arc, Mutex,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::Context as _;

use crate::{
    config::{AccessLogFormat, AccessLogOutput, AccessLogSettings},
    metrics::Counters,
};

mod syslog;

/// The longest request line kept (method, space, target); longer ones end in `...`.
pub const MAX_REQUEST_LINE: usize = 1024;

/// How the request was routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No backend was chosen (the dispatcher answered: refused, 503...).
    None,
    /// To an owner of its session.
    Affinity,
    /// No usable session: by the VIP's balance.
    Balanced,
    /// Its session's owner is out: to the replica.
    FailedOver,
}

impl Decision {
    pub fn name(self) -> &'static str {
        match self {
            Decision::None => "none",
            Decision::Affinity => "affinity",
            Decision::Balanced => "balanced",
            Decision::FailedOver => "failed_over",
        }
    }
}

/// HAProxy's termination states (the first two characters): who or what ended the
/// request (`C` the client, `S` the server, `P` the dispatcher refused it, `R` a resource
/// of this host ran out, `L` answered here; lower case: a timeout), and in which phase
/// (`R` the request, `Q` queued or held, `C` connecting, `H` the response head, `D` the
/// body). `--`: it ended normally.
pub mod term {
    pub const NORMAL: [u8; 2] = *b"--";
    /// The client closed inside its request head.
    pub const CLIENT_REQUEST: [u8; 2] = *b"CR";
    /// The request head did not come in time.
    pub const CLIENT_REQUEST_TIMEOUT: [u8; 2] = *b"cR";
    /// Refused here: a bad head, no route, a forwarding loop.
    pub const PROXY_REQUEST: [u8; 2] = *b"PR";
    /// Answered here (a redirect).
    pub const LOCAL: [u8; 2] = *b"LR";
    /// The client left while its request was held or queued.
    pub const CLIENT_QUEUE: [u8; 2] = *b"CQ";
    /// A queue or the held requests were full.
    pub const PROXY_QUEUE: [u8; 2] = *b"PQ";
    /// Its server left while it waited for it.
    pub const SERVER_QUEUE: [u8; 2] = *b"SQ";
    /// It waited for a slot (`maxconn`) or a connection for the whole queue timeout.
    pub const QUEUE_TIMEOUT: [u8; 2] = *b"sQ";
    /// No server to take it, or its server could not be reached (refused, TLS).
    pub const SERVER_CONNECT: [u8; 2] = *b"SC";
    /// This host ran out of descriptors, ports or buffers while connecting.
    pub const RESOURCE_CONNECT: [u8; 2] = *b"RC";
    /// The server closed before its response head.
    pub const SERVER_HEADERS: [u8; 2] = *b"SH";
    /// No response head in time.
    pub const SERVER_HEADERS_TIMEOUT: [u8; 2] = *b"sH";
    /// A response head refused here (malformed, an unsolicited upgrade).
    pub const PROXY_HEADERS: [u8; 2] = *b"PH";
    /// The client left (or stopped reading) during a body.
    pub const CLIENT_DATA: [u8; 2] = *b"CD";
    /// The request body did not come in time.
    pub const CLIENT_DATA_TIMEOUT: [u8; 2] = *b"cD";
    /// The server closed inside its response body.
    pub const SERVER_DATA: [u8; 2] = *b"SD";
    /// The response body stalled.
    pub const SERVER_DATA_TIMEOUT: [u8; 2] = *b"sD";
    /// A response body refused here (bad chunked encoding).
    pub const PROXY_DATA: [u8; 2] = *b"PD";
}

/// HAProxy's `actconn/feconn/beconn/srv_conn` and `srv_queue/backend_queue` when the
/// request is logged: the agent's client connections, its VIP's, the requests in flight
/// on its farm's servers and on its server, and the requests queued (`maxconn`) for its
/// server and its farm.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conns {
    pub active: u64,
    pub frontend: u64,
    pub backend: u64,
    pub server: u64,
    pub server_queue: u64,
    pub backend_queue: u64,
}

/// One request as the log shows it. Times are microseconds from the request's start (its
/// head's first byte); `None`: the step was not reached.
pub struct Entry {
    pub at: SystemTime,
    pub vip: Arc<str>,
    /// The VIP terminates TLS (HAProxy's `~` after the frontend's name).
    pub tls: bool,
    pub client: SocketAddr,
    /// Method, space, target (raw bytes, at most `MAX_REQUEST_LINE`).
    pub request: Box<[u8]>,
    /// `HTTP/1.0`, `HTTP/1.1`, `HTTP/2.0`; `-` for a head that was refused.
    pub protocol: &'static str,
    pub backend: Option<Arc<str>>,
    /// The clone ID, route or logical name the request was routed by.
    pub session: Option<Box<[u8]>>,
    pub decision: Decision,
    /// The farm it was routed to (an implicit farm's name is its VIP's).
    pub farm: Option<Arc<str>>,
    /// The route it matched, by its name (`None`: the implicit
    /// catch-all of a VIP's own farm, or not routed).
    pub route: Option<Arc<str>>,
    /// It was held (owner suspect, or waiting for the shared table) or queued (maxconn).
    pub held: bool,
    /// Extra attempts it took.
    pub retries: u32,
    /// A retry went to another server (HAProxy's `+` before the retries).
    pub redispatched: bool,
    /// How it ended (`term`).
    pub term: [u8; 2],
    pub conns: Conns,
    /// 0: the client got no status (the connection ended first).
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Head read, holds and queues, connection obtained, response head, whole exchange.
    pub head_us: u64,
    pub wait_us: Option<u64>,
    /// When its last attempt asked for a server connection.
    pub connecting_us: Option<u64>,
    pub connect_us: Option<u64>,
    pub response_us: Option<u64>,
    pub total_us: u64,
}

// `Line` is what the queue nearly always carries: boxing it (clippy's advice) would add an
// allocation per logged request to save the queue a few bytes per slot.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Line(Entry),
    /// A new destination and its settings (reload); the old one is closed.
    Reopen(Dest, AccessLogSettings),
    /// Write out what came before, then answer (the agent stopping).
    Flush(SyncSender<()>),
}

/// The opened destinations: `path`'s, syslog, or both.
struct Dest {
    stream: Option<Stream>,
    syslog: Option<syslog::Syslog>,
}

enum Stream {
    Stdout,
    File(File),
}

/// A destination opened for a reload, taken into use by `AccessLog::switch` once the
/// reload has succeeded.
pub struct Reopened {
    dest: Dest,
    settings: AccessLogSettings,
}

/// The request path's handle: cheap to clone into every VIP.
pub struct AccessLog {
    tx: SyncSender<Msg>,
    settings: Mutex<AccessLogSettings>,
    /// `access_log_lines` (written by the writer) and `access_log_dropped`.
    counters: Arc<Counters>,
}

impl AccessLog {
    /// Opens the destination (an error names the file) and starts the writer.
    pub fn start(settings: &AccessLogSettings, counters: Arc<Counters>) -> anyhow::Result<Arc<AccessLog>> {
        let dest = open(settings)?;
        let (tx, rx) = sync_channel(settings.buffer);
        let c = counters.clone();
        let s = settings.clone();
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(rx, dest, &s, &c))
            .context("starting the access log writer")?;
        Ok(Arc::new(AccessLog { tx, settings: Mutex::new(settings.clone()), counters }))
    }

    /// Hands an entry to the writer without waiting.
    pub fn log(&self, e: Entry) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(Msg::Line(e)) {
            self.counters.access_log_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Opens the file again (log rotation), or the destination a reload configures,
    /// without using it yet: an error refuses the reload, and the old one stays in use.
    /// A changed `buffer` takes a new writer.
    pub fn reopen(settings: &AccessLogSettings) -> anyhow::Result<Reopened> {
        Ok(Reopened { dest: open(settings)?, settings: settings.clone() })
    }

    /// Lines from here on go to the reopened destination (the reload succeeded).
    pub fn switch(&self, r: Reopened) {
        if self.tx.send(Msg::Reopen(r.dest, r.settings.clone())).is_err() {
            tracing::warn!("the access log writer has stopped");
        }
        *self.settings.lock().unwrap() = r.settings;
    }

    /// Waits (at most `timeout`) until every line handed over so far is written out: the
    /// agent's last requests are not lost when it exits.
    pub fn flush(&self, timeout: Duration) {
        let (tx, rx) = sync_channel(1);
        let deadline = std::time::Instant::now() + timeout;
        // The channel may be full: the writer is draining it.
        let mut msg = Msg::Flush(tx);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if std::time::Instant::now() < deadline => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(_) => return,
            }
        }
        let _ = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
    }

    pub fn settings(&self) -> AccessLogSettings {
        self.settings.lock().unwrap().clone()
    }
}

fn open(settings: &AccessLogSettings) -> anyhow::Result<Dest> {
    let syslog = settings.syslog.as_ref().map(|t| syslog::Syslog::new(t, settings, host_name())).transpose()?;
    let stream = settings.output.as_ref().map(open_output).transpose()?;
    Ok(Dest { stream, syslog })
}

fn open_output(output: &AccessLogOutput) -> anyhow::Result<Stream> {
    match output {
        AccessLogOutput::Stdout => Ok(Stream::Stdout),
        AccessLogOutput::File(p) => {
            use std::os::unix::fs::OpenOptionsExt as _;
            // Never through a symbolic link put there since `check` looked (the agent
            // runs as root), and only a regular file.
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .mode(0o640)
                .open(p)
                .with_context(|| format!("opening the access log {}", p.display()))?;
            let meta = f.metadata().with_context(|| format!("the access log {}", p.display()))?;
            if !meta.is_file() {
                anyhow::bail!("the access log {} is not a regular file", p.display());
            }
            Ok(Stream::File(f))
        }
    }
}

/// This host's name as syslog headers carry it: printable ASCII without spaces (others
/// as `-`), `-` when it has none.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is passed.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let name = if ok { &buf[..buf.iter().position(|&b| b == 0).unwrap_or(buf.len())] } else { &[][..] };
    if name.is_empty() {
        return "-".into();
    }
    name.iter().map(|&b| if b.is_ascii_graphic() { b as char } else { '-' }).collect()
}

/// How long the writer sleeps when it has caught up. It never blocks in the channel's
/// receive: a sender that finds the receiver waiting must wake it (a futex call, a
/// context switch per request at full load); waking on a clock instead costs the request
/// path nothing, and `buffer` lines cover far more than this at any rate seen.
const WRITER_NAP: Duration = Duration::from_millis(20);

/// Formats and writes until every handle is gone; flushes whenever it has caught up.
/// A line counts as written (`access_log_lines`) once it is out of the buffer (or sent),
/// and as dropped if it could not be taken (a write error with the buffer full, a syslog
/// receiver missing or full).
fn writer(rx: Receiver<Msg>, dest: Dest, settings: &AccessLogSettings, counters: &Counters) {
    let mut out = Out::new(dest, settings);
    let mut line = String::with_capacity(512);
    loop {
        let msg = match rx.try_recv() {
            Ok(m) => m,
            Err(TryRecvError::Empty) => {
                out.flush(counters);
                std::thread::sleep(WRITER_NAP);
                continue;
            }
            Err(TryRecvError::Disconnected) => break,
        };
        match msg {
            Msg::Line(e) => {
                line.clear();
                out.write(&mut line, &e, counters);
            }
            Msg::Reopen(dest, settings) => {
                out.close(counters);
                out = Out::new(dest, &settings);
            }
            Msg::Flush(done) => {
                out.flush(counters);
                let _ = done.send(());
            }
        }
    }
    out.flush(counters);
}

/// The writer's destinations, with how its lines are formatted.
struct Out {
    format: AccessLogFormat,
    /// `host tag[pid]:`, the syslog header that begins a `haproxy` line in a file.
    ident: String,
    sink: Option<Sink>,
    syslog: Option<syslog::Syslog>,
}

impl Out {
    fn new(dest: Dest, settings: &AccessLogSettings) -> Out {
        let sink = dest.stream.map(|s| {
            let w: Box<dyn Write + Send> = match s {
                Stream::File(f) => Box::new(f),
                Stream::Stdout => Box::new(std::io::stdout()),
            };
            Sink { w: std::io::BufWriter::with_capacity(64 * 1024, w), buffered: 0, failing: false }
        });
        let ident = format!("{} {}[{}]:", host_name(), settings.tag, std::process::id());
        Out { format: settings.format, ident, sink, syslog: dest.syslog }
    }

    /// Formats `e` into `line` and writes it, and sends it to syslog (each destination
    /// counts the lines it took).
    fn write(&mut self, line: &mut String, e: &Entry, counters: &Counters) {
        if let Some(sink) = &mut self.sink {
            match self.format {
                AccessLogFormat::Json => json(line, e),
                AccessLogFormat::Haproxy => {
                    legacy_header(line, SystemTime::now(), &self.ident);
                    haproxy(line, e);
                }
            }
            line.push('\n');
            sink.write(line, counters);
        }
        if let Some(s) = &mut self.syslog {
            line.clear();
            s.send(line, e, self.format, counters);
        }
    }

    fn flush(&mut self, counters: &Counters) {
        if let Some(sink) = &mut self.sink {
            sink.flush(counters);
        }
    }

    /// Writes out what it can; what the destination would not take is lost with it
    /// (discarded, not flushed again on drop).
    fn close(mut self, counters: &Counters) {
        self.flush(counters);
        if let Some(sink) = self.sink {
            counters.access_log_dropped.fetch_add(sink.buffered, Ordering::Relaxed);
            drop(sink.w.into_parts());
        }
    }
}

/// The writer's buffered output and the lines it holds that are not written out yet.
struct Sink {
    w: std::io::BufWriter<Box<dyn Write + Send>>,
    buffered: u64,
    failing: bool,
}

impl Sink {
    fn write(&mut self, line: &str, counters: &Counters) {
        // The buffer writes out what it holds when the line does not fit.
        let before = self.w.buffer().len();
        match self.w.write_all(line.as_bytes()) {
            Ok(()) => {
                if self.w.buffer().len() < before + line.len() {
                    // What was buffered went out: counted.
                    counters.access_log_lines.fetch_add(self.buffered, Ordering::Relaxed);
                    self.buffered = 0;
                }
                self.buffered += 1;
            }
            Err(e) => {
                counters.access_log_dropped.fetch_add(1, Ordering::Relaxed);
                self.failed(&e);
            }
        }
    }

    fn flush(&mut self, counters: &Counters) {
        if self.buffered == 0 && self.w.buffer().is_empty() {
            return;
        }
        match self.w.flush() {
            Ok(()) => {
                counters.access_log_lines.fetch_add(self.buffered, Ordering::Relaxed);
                self.buffered = 0;
                self.failing = false;
            }
            // The lines stay buffered and go out with a later flush.
            Err(e) => self.failed(&e),
        }
    }

    fn failed(&mut self, e: &std::io::Error) {
        if !self.failing {
            // Once per failure streak: a full disk must not flood the log.
            self.failing = true;
            tracing::warn!(error = %e, "writing the access log");
        }
    }
}

/// `{"time":...,"vip":...}`: strings escaped as JSON wants (bytes that are not UTF-8 as
/// U+FFFD), times in microseconds, `null` for a step not reached.
pub fn json(o: &mut String, e: &Entry) {
    o.push_str("{\"time\":\"");
    rfc3339(o, e.at);
    o.push_str("\",\"vip\":");
    json_str(o, e.vip.as_bytes());
    let _ = write!(o, ",\"client\":\"{}\",\"request\":", e.client);
    json_str(o, &e.request);
    let _ = write!(o, ",\"protocol\":\"{}\"", e.protocol);
    o.push_str(",\"backend\":");
    match &e.backend {
        Some(b) => json_str(o, b.as_bytes()),
        None => o.push_str("null"),
    }
    o.push_str(",\"session\":");
    match &e.session {
        Some(s) => json_str(o, s),
        None => o.push_str("null"),
    }
    for (key, v) in [(",\"farm\":", &e.farm), (",\"route\":", &e.route)] {
        o.push_str(key);
        match v {
            Some(v) => json_str(o, v.as_bytes()),
            None => o.push_str("null"),
        }
    }
    let _ = write!(
        o,
        ",\"decision\":\"{}\",\"held\":{},\"retries\":{},\"status\":{},\"bytes_in\":{},\"bytes_out\":{},\"head_us\":{},\"wait_us\":{},\"connect_us\":{},\"response_us\":{},\"total_us\":{}}}",
        e.decision.name(),
        e.held,
        e.retries,
        e.status,
        e.bytes_in,
        e.bytes_out,
        e.head_us,
        Opt(e.wait_us),
        Opt(e.connect_us),
        Opt(e.response_us),
        e.total_us
    );
}

/// A number, or `null`.
struct Opt(Option<u64>);

impl std::fmt::Display for Opt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(v) => write!(f, "{v}"),
            None => f.write_str("null"),
        }
    }
}

fn json_str(o: &mut String, b: &[u8]) {
    o.push('"');
    for c in String::from_utf8_lossy(b).chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
}

/// `Dec  3 05:30:07 host tag[pid]: `: the header syslog puts before HAProxy's lines in a
/// file, which halog counts its fields after (UTC, like the rest of the line).
pub(super) fn legacy_header(o: &mut String, t: SystemTime, ident: &str) {
    let c = Clock::of(t);
    let _ = write!(o, "{} {:>2} {:02}:{:02}:{:02} {ident} ", c.month_name(), c.day, c.hour, c.minute, c.second);
}

/// HAProxy's HTTP log layout (its `option httplog`):
/// `client:port [accept_date] frontend farm/server TR/Tw/Tc/Tr/Ta status bytes_read
/// request_cookie - termination_state actconn/feconn/beconn/srv_conn/retries
/// srv_queue/backend_queue {decision|route} "request"`.
///
/// The frontend is the VIP (`~` after it when it terminates TLS); `<NOSRV>` when no
/// server was chosen. Timers in milliseconds: TR the request head, Tw the waits (held,
/// queued), Tc the connection to the server, Tr the server's response head from there, Ta
/// the whole; `-1` for a phase not reached. The status is `-1` when the client got none.
/// The request cookie is the clone ID (route, logical name) it was routed by. The
/// termination state's third character says how its session routed it: `V` to its
/// owner, `D` its owner out (failed over), `I` a session no server owns (balanced), `N`
/// no session (balanced), `-` not routed; the fourth is always `-`. The retries have a
/// `+` before them when a retry went to another server. The captured-header block holds
/// the routing decision and the route's name (`-`: the VIP's own farm, or not routed).
/// Bytes outside printable ASCII in the request and the cookie are written `#XX`, as
/// HAProxy escapes them.
pub fn haproxy(o: &mut String, e: &Entry) {
    let _ = write!(o, "{} [", e.client);
    clf_date(o, e.at);
    let farm = e.farm.as_deref().unwrap_or(&e.vip);
    let _ =
        write!(o, "] {}{} {farm}/{} ", e.vip, if e.tls { "~" } else { "" }, e.backend.as_deref().unwrap_or("<NOSRV>"));
    let ms = |v: u64| (v / 1000) as i64;
    let between = |from: Option<u64>, to: Option<u64>| match (from, to) {
        (Some(f), Some(t)) => ms(t.saturating_sub(f)),
        _ => -1,
    };
    // Queued or held: that wait; it got to a server without waiting: 0.
    let wait = match (e.wait_us, &e.backend) {
        (Some(w), _) => ms(w),
        (None, Some(_)) => 0,
        (None, None) => -1,
    };
    let status = if e.status == 0 { -1 } else { i32::from(e.status) };
    let _ = write!(
        o,
        "{}/{wait}/{}/{}/{} {status} {} ",
        ms(e.head_us),
        between(e.connecting_us, e.connect_us),
        between(e.connect_us, e.response_us),
        ms(e.total_us),
        e.bytes_out,
    );
    match &e.session {
        Some(s) => escaped(o, s),
        None => o.push('-'),
    }
    let cookie = match e.decision {
        Decision::None => '-',
        Decision::Affinity => 'V',
        Decision::FailedOver => 'D',
        Decision::Balanced if e.session.is_some() => 'I',
        Decision::Balanced => 'N',
    };
    let n = &e.conns;
    let _ = write!(
        o,
        " - {}{}{cookie}- {}/{}/{}/{}/{}{} {}/{} {{{}|{}}} \"",
        e.term[0] as char,
        e.term[1] as char,
        n.active,
        n.frontend,
        n.backend,
        n.server,
        if e.redispatched { "+" } else { "" },
        e.retries,
        n.server_queue,
        n.backend_queue,
        e.decision.name(),
        e.route.as_deref().unwrap_or("-"),
    );
    escaped(o, &e.request);
    if e.protocol != "-" {
        o.push(' ');
        o.push_str(e.protocol);
    }
    o.push('"');
}

fn escaped(o: &mut String, b: &[u8]) {
    for &c in b {
        if c.is_ascii_graphic() && c != b'"' && c != b'#' || c == b' ' {
            o.push(c as char);
        } else {
            let _ = write!(o, "#{c:02X}");
        }
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (the
/// era-based conversion: 400-year eras of 146097 days).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// A time as the calendar and the clock show it, UTC.
struct Clock {
    year: i64,
    month: u32,
    day: u32,
    hour: u64,
    minute: u64,
    second: u64,
    ms: u32,
}

impl Clock {
    fn of(t: SystemTime) -> Clock {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
        let s = d.as_secs();
        let (year, month, day) = civil((s / 86_400) as i64);
        let secs = s % 86_400;
        Clock { year, month, day, hour: secs / 3600, minute: secs / 60 % 60, second: secs % 60, ms: d.subsec_millis() }
    }

    fn month_name(&self) -> &'static str {
        const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
        MONTHS[self.month as usize - 1]
    }
}

/// `2026-12-01T05:30:00.123Z`.
pub fn rfc3339(o: &mut String, t: SystemTime) {
    let c = Clock::of(t);
    let _ = write!(
        o,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second, c.ms
    );
}

/// HAProxy's `01/Dec/2026:05:30:00.123` (UTC).
fn clf_date(o: &mut String, t: SystemTime) {
    let c = Clock::of(t);
    let _ = write!(
        o,
        "{:02}/{}/{:04}:{:02}:{:02}:{:02}.{:03}",
        c.day,
        c.month_name(),
        c.year,
        c.hour,
        c.minute,
        c.second,
        c.ms
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Entry {
        Entry {
            // 2026-12-01T05:30:07.250Z
            at: UNIX_EPOCH + Duration::from_millis(1_796_103_007_250),
            vip: "app".into(),
            tls: false,
            client: "10.99.0.2:40000".parse().unwrap(),
            request: b"GET /app/x?q=\"1\"\x01 \xff".to_vec().into(),
            protocol: "HTTP/1.1",
            backend: Some("b0".into()),
            session: Some(b"clone0x".to_vec().into()),
            decision: Decision::FailedOver,
            farm: None,
            route: None,
            held: true,
            retries: 1,
            redispatched: true,
            term: term::NORMAL,
            conns: Conns { active: 7, frontend: 5, backend: 3, server: 2, server_queue: 1, backend_queue: 4 },
            status: 200,
            bytes_in: 120,
            bytes_out: 512,
            head_us: 40,
            wait_us: Some(1500),
            connecting_us: Some(1700),
            connect_us: None,
            response_us: Some(3200),
            total_us: 4100,
        }
    }

    #[test]
    fn dates_match_the_calendar() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(19_782), (2024, 2, 29), "a leap day");
        assert_eq!(civil(-1), (1969, 12, 31));
        let mut s = String::new();
        rfc3339(&mut s, entry().at);
        assert_eq!(s, "2026-12-01T05:30:07.250Z");
        s.clear();
        clf_date(&mut s, entry().at);
        assert_eq!(s, "01/Dec/2026:05:30:07.250");
    }

    #[test]
    fn json_lines_are_json_with_every_field() {
        let mut s = String::new();
        json(&mut s, &entry());
        let v: serde_json::Value = serde_json::from_str(&s).expect(&s);
        assert_eq!(v["request"], "GET /app/x?q=\"1\"\u{1} \u{fffd}");
        assert_eq!(v["decision"], "failed_over");
        assert_eq!(v["connect_us"], serde_json::Value::Null);
        assert_eq!(
            (v["wait_us"].as_u64(), v["total_us"].as_u64(), v["status"].as_u64()),
            (Some(1500), Some(4100), Some(200))
        );
        assert_eq!(
            (v["backend"].as_str(), v["session"].as_str(), v["held"].as_bool()),
            (Some("b0"), Some("clone0x"), Some(true))
        );
        assert!(!s.contains('\n'));
        assert_eq!((v["farm"].as_str(), v["route"].as_str()), (None, None));
        let routed = Entry { farm: Some("shop".into()), route: Some("2".into()), ..entry() };
        s.clear();
        json(&mut s, &routed);
        let v: serde_json::Value = serde_json::from_str(&s).expect(&s);
        assert_eq!((v["farm"].as_str(), v["route"].as_str()), (Some("shop"), Some("2")));
    }

    #[test]
    fn haproxy_lines_are_httplog_lines_that_escape_what_would_break_them() {
        let mut s = String::new();
        haproxy(&mut s, &entry());
        assert_eq!(
            s,
            "10.99.0.2:40000 [01/Dec/2026:05:30:07.250] app app/b0 0/1/-1/-1/4 200 512 clone0x - --D- 7/5/3/2/+1 1/4 {failed_over|-} \"GET /app/x?q=#221#22#01 #FF HTTP/1.1\""
        );
        // Connected and answered: the connect time runs from the attempt's start, the
        // response time from the connection; a routed request names its farm and route;
        // TLS marks the frontend.
        let served = Entry {
            connecting_us: Some(2_000),
            connect_us: Some(5_000),
            response_us: Some(12_000),
            total_us: 20_000,
            wait_us: None,
            farm: Some("shop".into()),
            route: Some("2".into()),
            tls: true,
            redispatched: false,
            retries: 0,
            decision: Decision::Affinity,
            ..entry()
        };
        s.clear();
        haproxy(&mut s, &served);
        assert!(s.contains("] app~ shop/b0 0/0/3/7/20 200 512 clone0x - --V- 7/5/3/2/0 1/4 {affinity|2} \"GET"), "{s}");
        // Refused before any routing: no server, no status when the client got none,
        // the termination state says who ended it.
        let refused = Entry {
            backend: None,
            session: None,
            decision: Decision::None,
            wait_us: None,
            connecting_us: None,
            response_us: None,
            status: 0,
            term: term::CLIENT_REQUEST,
            request: b"<BADREQ>"[..].into(),
            protocol: "-",
            ..entry()
        };
        s.clear();
        haproxy(&mut s, &refused);
        assert!(
            s.ends_with("] app app/<NOSRV> 0/-1/-1/-1/4 -1 512 - - CR-- 7/5/3/2/+1 1/4 {none|-} \"<BADREQ>\""),
            "{s}"
        );
    }

    #[test]
    fn a_haproxy_line_in_a_file_has_the_syslog_header_halog_skips() {
        let mut s = String::new();
        legacy_header(&mut s, entry().at, "h dispatcher[42]:");
        assert_eq!(s, "Dec  1 05:30:07 h dispatcher[42]: ");
        haproxy(&mut s, &entry());
        // halog's fields: the client is the 6th, the accept date the 7th, the server the
        // 9th, the timers the 10th, the status the 11th, the termination state the 15th.
        let f: Vec<&str> = s.split_whitespace().collect();
        assert_eq!((f[5], f[6].as_bytes()[0], f[8], f[10], f[14]), ("10.99.0.2:40000", b'[', "app/b0", "200", "--D-"));
        assert_eq!(f[9].split('/').count(), 5);
    }

    #[test]
    fn the_writer_writes_reopens_and_a_full_buffer_drops_instead_of_waiting() {
        let dir = std::env::temp_dir().join(format!("dispatcher-access-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.log"), dir.join("b.log"));
        let settings = AccessLogSettings {
            output: Some(AccessLogOutput::File(a.clone())),
            syslog: None,
            format: AccessLogFormat::Json,
            buffer: 16,
            tag: "dispatcher".into(),
            facility: 16,
            max_message: 2048,
            syslog_format: crate::config::SyslogFormat::Rfc5424,
        };
        let counters = Arc::new(Counters::default());
        let log = AccessLog::start(&settings, counters.clone()).unwrap();
        log.log(entry());
        let wait = |n: u64| {
            let t = std::time::Instant::now();
            while counters.access_log_lines.load(Ordering::Relaxed) < n && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait(1);
        // Rotation: the file is moved away, a reload reopens the path.
        std::fs::rename(&a, &b).unwrap();
        let reopened = AccessLog::reopen(&settings).unwrap();
        log.log(entry());
        log.switch(reopened);
        log.log(entry());
        log.flush(Duration::from_secs(5));
        assert_eq!(counters.access_log_lines.load(Ordering::Relaxed), 3, "flushed: every line out");
        let (old, new) = (std::fs::read_to_string(&b).unwrap(), std::fs::read_to_string(&a).unwrap());
        assert_eq!((old.lines().count(), new.lines().count()), (2, 1), "the old file until the switch\n{old}\n{new}");
        // A reopen that fails says which file failed (and the old one stays in use).
        let bad =
            AccessLogSettings { output: Some(AccessLogOutput::File(dir.join("no/such/dir.log"))), ..settings.clone() };
        assert!(format!("{:#}", AccessLog::reopen(&bad).err().unwrap()).contains("no/such/dir.log"));
        // Bursts beyond the buffer are dropped and counted, never waited for.
        let t = std::time::Instant::now();
        for _ in 0..100_000 {
            log.log(entry());
        }
        assert!(t.elapsed() < Duration::from_secs(2));
        log.flush(Duration::from_secs(10));
        let lines = counters.access_log_lines.load(Ordering::Relaxed);
        assert_eq!(lines + counters.access_log_dropped.load(Ordering::Relaxed), 100_003);
        assert_eq!(
            std::fs::read_to_string(&a).unwrap().lines().count() as u64,
            lines - 2,
            "counted as written = in the file"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
