//! The access log: one line per HTTP request, written off the request path.
//!
//! The request path fills an `Entry` (numbers and a few shared names; the request line
//! and the session's clone ID are the only copies) and hands it to a bounded channel
//! without waiting: when the writer is behind by `buffer` lines, the entry is dropped and
//! counted (`dispatcher_access_log_dropped_total`), never the request. One writer thread
//! formats (JSON lines, or HAProxy's HTTP log layout) into a buffered file or standard
//! output and flushes whenever it has caught up. Every reload opens the configured file
//! again (`reopen`, then `switch` once the reload succeeded), so that a rotated log
//! continues in a new file; the agent flushes it before it exits.

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
    config::{AccessLogFormat, AccessLogSettings},
    metrics::Counters,
};

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

/// One request as the log shows it. Times are microseconds from the request's start (its
/// head's first byte); `None`: the step was not reached.
pub struct Entry {
    pub at: SystemTime,
    pub vip: Arc<str>,
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
    /// 0: the client got no status (the connection ended first).
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Head read, holds and queues, connection obtained, response head, whole exchange.
    pub head_us: u64,
    pub wait_us: Option<u64>,
    pub connect_us: Option<u64>,
    pub response_us: Option<u64>,
    pub total_us: u64,
}

// `Line` is what the queue nearly always carries: boxing it (clippy's advice) would add an
// allocation per logged request to save the queue a few bytes per slot.
#[allow(clippy::large_enum_variant)]
enum Msg {
    Line(Entry),
    /// A new destination and format (reload); the old file is closed.
    Reopen(Option<File>, AccessLogFormat),
    /// Write out what came before, then answer (the agent stopping).
    Flush(SyncSender<()>),
}

/// A destination opened for a reload, taken into use by `AccessLog::switch` once the
/// reload has succeeded.
pub struct Reopened {
    file: Option<File>,
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
        let file = open(settings)?;
        let (tx, rx) = sync_channel(settings.buffer);
        let c = counters.clone();
        let format = settings.format;
        std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || writer(rx, file, format, &c))
            .context("starting the access log writer")?;
        Ok(Arc::new(AccessLog { tx, settings: Mutex::new(settings.clone()), counters }))
    }

    /// Hands an entry to the writer without waiting.
    pub fn log(&self, e: Entry) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(Msg::Line(e)) {
            self.counters.access_log_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Opens the file again (log rotation), or the one a reload configures, without using
    /// it yet: an error refuses the reload, and the old file stays in use. A changed
    /// `buffer` takes a new writer.
    pub fn reopen(settings: &AccessLogSettings) -> anyhow::Result<Reopened> {
        Ok(Reopened { file: open(settings)?, settings: settings.clone() })
    }

    /// Lines from here on go to the reopened destination (the reload succeeded).
    pub fn switch(&self, r: Reopened) {
        if self.tx.send(Msg::Reopen(r.file, r.settings.format)).is_err() {
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

fn open(settings: &AccessLogSettings) -> anyhow::Result<Option<File>> {
    match &settings.path {
        None => Ok(None),
        Some(p) => {
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
            Ok(Some(f))
        }
    }
}

/// How long the writer sleeps when it has caught up. It never blocks in the channel's
/// receive: a sender that finds the receiver waiting must wake it (a futex call, a
/// context switch per request at full load); waking on a clock instead costs the request
/// path nothing, and `buffer` lines cover far more than this at any rate seen.
const WRITER_NAP: Duration = Duration::from_millis(20);

/// Formats and writes until every handle is gone; flushes whenever it has caught up.
/// A line counts as written (`access_log_lines`) once it is out of the buffer, and as
/// dropped if it could not be taken (a write error with the buffer full).
fn writer(rx: Receiver<Msg>, file: Option<File>, format: AccessLogFormat, counters: &Counters) {
    let sink = |f: Option<File>| -> std::io::BufWriter<Box<dyn Write + Send>> {
        let w: Box<dyn Write + Send> = match f {
            Some(f) => Box::new(f),
            None => Box::new(std::io::stdout()),
        };
        std::io::BufWriter::with_capacity(64 * 1024, w)
    };
    let mut out = Sink { w: sink(file), buffered: 0, failing: false };
    let mut format = format;
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
                match format {
                    AccessLogFormat::Json => json(&mut line, &e),
                    AccessLogFormat::Haproxy => haproxy(&mut line, &e),
                }
                line.push('\n');
                // The buffer writes out what it holds when the line does not fit.
                let before = out.w.buffer().len();
                match out.w.write_all(line.as_bytes()) {
                    Ok(()) => {
                        if out.w.buffer().len() < before + line.len() {
                            // What was buffered went out: counted.
                            counters.access_log_lines.fetch_add(out.buffered, Ordering::Relaxed);
                            out.buffered = 0;
                        }
                        out.buffered += 1;
                    }
                    Err(e) => {
                        counters.access_log_dropped.fetch_add(1, Ordering::Relaxed);
                        out.failed(&e);
                    }
                }
            }
            Msg::Reopen(f, fmt) => {
                out.flush(counters);
                // What the old destination would not take is lost with it (discarded, not
                // flushed again on drop).
                counters.access_log_dropped.fetch_add(std::mem::take(&mut out.buffered), Ordering::Relaxed);
                drop(std::mem::replace(&mut out.w, sink(f)).into_parts());
                out.failing = false;
                format = fmt;
            }
            Msg::Flush(done) => {
                out.flush(counters);
                let _ = done.send(());
            }
        }
    }
    out.flush(counters);
}

/// The writer's output and the lines it holds that are not written out yet.
struct Sink {
    w: std::io::BufWriter<Box<dyn Write + Send>>,
    buffered: u64,
    failing: bool,
}

impl Sink {
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

/// HAProxy's HTTP log layout, with our decision added:
/// `client:port [date] vip backend/session Th/Tw/Tc/Tr/Ta status bytes_out bytes_in decision "request"`,
/// timers in milliseconds, `-1` for a step not reached, `-` for no backend or session;
/// a request routed by a configured route ends with ` farm/route` (the route's name).
/// Bytes outside printable ASCII in the request and the session are written `#XX`, as
/// HAProxy escapes them.
pub fn haproxy(o: &mut String, e: &Entry) {
    let _ = write!(o, "{} [", e.client);
    clf_date(o, e.at);
    let _ = write!(o, "] {} {}/", e.vip, e.backend.as_deref().unwrap_or("-"));
    match &e.session {
        Some(s) => escaped(o, s),
        None => o.push('-'),
    }
    let ms = |v: Option<u64>| v.map_or(-1, |v| (v / 1000) as i64);
    let _ = write!(
        o,
        " {}/{}/{}/{}/{} {} {} {} {}{}{}",
        e.head_us / 1000,
        ms(e.wait_us),
        ms(e.connect_us),
        ms(e.response_us),
        e.total_us / 1000,
        e.status,
        e.bytes_out,
        e.bytes_in,
        e.decision.name(),
        if e.held { ",held" } else { "" },
        if e.retries > 0 { ",retried:" } else { "" },
    );
    if e.retries > 0 {
        let _ = write!(o, "{}", e.retries);
    }
    o.push_str(" \"");
    escaped(o, &e.request);
    if e.protocol != "-" {
        o.push(' ');
        o.push_str(e.protocol);
    }
    o.push('"');
    if let (Some(farm), Some(route)) = (&e.farm, &e.route) {
        let _ = write!(o, " {farm}/{route}");
    }
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

/// (days since the epoch, seconds in the day, milliseconds), UTC.
fn split(t: SystemTime) -> (i64, u64, u32) {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let s = d.as_secs();
    ((s / 86_400) as i64, s % 86_400, d.subsec_millis())
}

/// `2026-12-01T05:30:00.123Z`.
pub fn rfc3339(o: &mut String, t: SystemTime) {
    let (days, secs, ms) = split(t);
    let (y, m, d) = civil(days);
    let _ = write!(o, "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z", secs / 3600, secs / 60 % 60, secs % 60);
}

/// HAProxy's `01/Dec/2026:05:30:00.123` (UTC).
fn clf_date(o: &mut String, t: SystemTime) {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let (days, secs, ms) = split(t);
    let (y, m, d) = civil(days);
    let _ = write!(
        o,
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02}.{ms:03}",
        MONTHS[m as usize - 1],
        secs / 3600,
        secs / 60 % 60,
        secs % 60
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
            status: 200,
            bytes_in: 120,
            bytes_out: 512,
            head_us: 40,
            wait_us: Some(1500),
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
    fn haproxy_lines_escape_what_would_break_them() {
        let mut s = String::new();
        haproxy(&mut s, &entry());
        assert_eq!(
            s,
            "10.99.0.2:40000 [01/Dec/2026:05:30:07.250] app b0/clone0x 0/1/-1/3/4 200 512 120 failed_over,held,retried:1 \"GET /app/x?q=#221#22#01 #FF HTTP/1.1\""
        );
        // An implicit farm's request (no route named) ends as before; a routed one names
        // its farm and route.
        s.clear();
        haproxy(&mut s, &Entry { farm: Some("app".into()), ..entry() });
        assert!(s.ends_with("#FF HTTP/1.1\""), "{s}");
        s.clear();
        haproxy(&mut s, &Entry { farm: Some("shop".into()), route: Some("2".into()), ..entry() });
        assert!(s.ends_with("#FF HTTP/1.1\" shop/2"), "{s}");
    }

    #[test]
    fn the_writer_writes_reopens_and_a_full_buffer_drops_instead_of_waiting() {
        let dir = std::env::temp_dir().join(format!("dispatcher-access-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.log"), dir.join("b.log"));
        let settings = AccessLogSettings { path: Some(a.clone()), format: AccessLogFormat::Json, buffer: 16 };
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
        let bad = AccessLogSettings { path: Some(dir.join("no/such/dir.log")), ..settings.clone() };
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
