//! HTTPS on an HTTP VIP: the handshake between `accept` and the proxy.
//!
//! - Certificates are chosen by SNI (exact names, then `*.` wildcards), else the VIP's
//!   first certificate, unless `strict_sni` (then an alert).
//! - TLS 1.2 and 1.3, no 0-RTT. ALPN: `h2` then `http/1.1`, the server's order winning
//!   whatever the client's (rustls picks the first of ours the client offers), or
//!   `http/1.1` only with `http2 = false` (then a client offering only `h2` gets the
//!   `no_application_protocol` alert). A client offering no ALPN speaks HTTP/1.1.
//! - Resumption: tickets whose keys rotate (rustls' ticketer: a new key every 6 hours,
//!   the previous one still accepted), and a session-ID cache; both process-wide, so a
//!   session resumes on any worker and across `reload`.
//! - Limits: a deadline from accept to the end of the handshake, and a cap on handshakes
//!   in progress over all VIPs (one more is closed at once). A first byte that cannot
//!   start a TLS record ends the connection: if it looks like plain HTTP, with a plain
//!   `400` saying so. Nothing of such a connection is forwarded.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use rustls::{
    server::{
        ClientHello, NoServerSessionStorage, ProducesTickets, ResolvesServerCert, ServerConfig,
        ServerSessionMemoryCache, StoresServerSessions,
    },
    sign::CertifiedKey,
    HandshakeKind,
};
use tokio::{io::AsyncWriteExt, net::TcpStream, sync::Semaphore};
use tokio_rustls::LazyConfigAcceptor;

use super::certs::{self, CertInfo};
use crate::{
    config::{HttpSettings, TlsVersion, VipTls},
    http1::io::TlsConn,
};

/// Why a handshake did not complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Not done within the handshake deadline (a client that stopped mid-handshake).
    Timeout,
    /// The client closed or reset the connection before the end.
    Closed,
    /// Plain HTTP sent to the TLS port (answered with a plain 400).
    PlainHttp,
    /// The first bytes are not a TLS record.
    NotTls,
    /// A name no certificate answers, on a VIP without a default (`strict_sni`).
    UnknownSni,
    /// Over `http.max_tls_handshakes`.
    Cap,
    /// Anything else rustls refused: a malformed or oversized ClientHello, no common
    /// version, cipher or application protocol.
    Protocol,
}

impl Failure {
    pub const ALL: [Failure; 7] = [
        Failure::Timeout,
        Failure::Closed,
        Failure::PlainHttp,
        Failure::NotTls,
        Failure::UnknownSni,
        Failure::Cap,
        Failure::Protocol,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Closed => "closed",
            Failure::PlainHttp => "plain_http",
            Failure::NotTls => "not_tls",
            Failure::UnknownSni => "unknown_sni",
            Failure::Cap => "cap",
            Failure::Protocol => "protocol",
        }
    }
}

/// One VIP's handshake counters (kept across reloads).
#[derive(Default)]
pub struct TlsStats {
    pub full: AtomicU64,
    pub resumed: AtomicU64,
    pub failures: [AtomicU64; Failure::ALL.len()],
    /// The certificates the VIP presents now.
    pub certs: std::sync::RwLock<Vec<CertInfo>>,
}

impl TlsStats {
    fn fail(&self, f: Failure) {
        self.failures[f as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn failures(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        Failure::ALL.iter().map(|f| (f.name(), self.failures[*f as usize].load(Ordering::Relaxed)))
    }
}

/// Certificates by SNI name.
#[derive(Debug)]
struct Certificates {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By the part after `*.`.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
}

impl Certificates {
    fn lookup(&self, sni: Option<&str>) -> Option<Arc<CertifiedKey>> {
        let found = sni.and_then(|name| {
            let name = name.to_ascii_lowercase();
            self.exact.get(&name).or_else(|| name.split_once('.').and_then(|(_, parent)| self.wildcard.get(parent)))
        });
        found.or(self.default.as_ref()).cloned()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.lookup(hello.server_name())
    }
}

/// The process's ticket keys (rotating) and session-ID cache, shared by every VIP and
/// every configuration a reload brings.
/// `cache_size` 0: no session-ID cache (tickets only). The size is the first
/// configuration's; a reload that changes it is told it takes a restart.
fn resumption(cache_size: usize) -> anyhow::Result<(Arc<dyn ProducesTickets>, Arc<dyn StoresServerSessions>)> {
    type State = (Arc<dyn ProducesTickets>, Arc<dyn StoresServerSessions>, usize);
    static STATE: OnceLock<State> = OnceLock::new();
    let state = match STATE.get() {
        Some(s) => s,
        None => {
            let ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
            let cache: Arc<dyn StoresServerSessions> = match cache_size {
                0 => Arc::new(NoServerSessionStorage {}),
                n => ServerSessionMemoryCache::new(n),
            };
            STATE.get_or_init(|| (ticketer, cache, cache_size))
        }
    };
    if state.2 != cache_size {
        tracing::warn!(
            configured = cache_size,
            in_use = state.2,
            "http.tls_session_cache changes at the next restart (the cache is kept across reloads)"
        );
    }
    Ok((state.0.clone(), state.1.clone()))
}

/// An HTTPS VIP's TLS side, shared by the workers.
pub struct ServerTls {
    config: Arc<ServerConfig>,
    certs: Arc<Certificates>,
    /// What status shows of the certificates, once they are served (`publish`).
    infos: Vec<CertInfo>,
    timeout: Duration,
    /// Handshakes in progress, over all VIPs.
    in_flight: Arc<Semaphore>,
    pub stats: Arc<TlsStats>,
}

const PLAIN_HTTP_BODY: &str = "This port speaks HTTPS: the request was sent as plain HTTP\n";

fn plain_http_answer() -> String {
    crate::http1::closing_answer(400, "text/plain", "", PLAIN_HTTP_BODY)
}

/// Closes after an answer without resetting it away: the write side first, then what
/// the client still sends is read and dropped (at most 64 KiB, within the caller's
/// deadline), so that unread request bytes do not turn the close into a reset that
/// could destroy the answer in flight.
pub async fn close_gently(stream: &mut TcpStream) {
    use tokio::io::AsyncReadExt;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let mut left: usize = 64 * 1024;
    while left > 0 {
        match stream.read(&mut sink).await {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

impl ServerTls {
    /// Reads the VIP's certificates and builds its configuration; an error names the
    /// file and what is wrong with it.
    pub fn load(
        t: &VipTls,
        http2: bool,
        http: &HttpSettings,
        in_flight: Arc<Semaphore>,
        stats: Arc<TlsStats>,
    ) -> anyhow::Result<ServerTls> {
        let mut certs = Certificates { exact: HashMap::new(), wildcard: HashMap::new(), default: None };
        let mut infos = Vec::new();
        for files in &t.certificates {
            let loaded = certs::load(files)?;
            for name in &loaded.info.names {
                match name.strip_prefix("*.") {
                    Some(parent) => certs.wildcard.entry(parent.to_string()).or_insert_with(|| loaded.key.clone()),
                    None => certs.exact.entry(name.clone()).or_insert_with(|| loaded.key.clone()),
                };
            }
            if !t.strict_sni && certs.default.is_none() {
                certs.default = Some(loaded.key.clone());
            }
            infos.push(loaded.info);
        }
        let versions: &[&rustls::SupportedProtocolVersion] = match t.min_version {
            TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let certs = Arc::new(certs);
        let mut config = ServerConfig::builder_with_provider(super::provider())
            .with_protocol_versions(versions)?
            .with_no_client_auth()
            .with_cert_resolver(certs.clone());
        config.alpn_protocols =
            if http2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
        let (ticketer, cache) = resumption(http.tls_session_cache)?;
        config.ticketer = ticketer;
        config.session_storage = cache;
        config.max_early_data_size = 0;
        Ok(ServerTls { config: Arc::new(config), certs, infos, timeout: t.handshake_timeout, in_flight, stats })
    }

    /// Shows these certificates in status and metrics: called once the listeners serve
    /// them (a reload that fails later leaves the previous ones shown, as they are the
    /// ones served).
    pub fn publish(&self) {
        *self.stats.certs.write().unwrap() = self.infos.clone();
    }

    /// The handshake on an accepted connection, within the deadline and the cap; `None`
    /// when it failed (counted by reason, the connection closed).
    pub async fn accept(&self, mut stream: TcpStream) -> Option<TlsConn> {
        let handshake = async move {
            let mut first = [0u8; 1];
            match stream.peek(&mut first).await {
                Ok(0) | Err(_) => return Err(Failure::Closed),
                Ok(_) => {}
            }
            // The cap counts handshakes under way: a connection that has sent nothing
            // yet holds no slot (its wait is bounded by the deadline alone).
            let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
                crate::ratelimit::warn("TLS handshake refused at the cap", &"http.max_tls_handshakes");
                return Err(Failure::Cap);
            };
            // 22: a handshake record. Anything else is closed before rustls sees it.
            if first[0] != 22 {
                if first[0].is_ascii_uppercase() {
                    if stream.write_all(plain_http_answer().as_bytes()).await.is_ok() {
                        close_gently(&mut stream).await;
                    }
                    return Err(Failure::PlainHttp);
                }
                return Err(Failure::NotTls);
            }
            let start =
                LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream).await.map_err(|e| classify(&e))?;
            let unknown = self.certs.lookup(start.client_hello().server_name()).is_none();
            match start.into_stream(self.config.clone()).await {
                Ok(s) => Ok(s),
                Err(_) if unknown => Err(Failure::UnknownSni),
                Err(e) => Err(classify(&e)),
            }
        };
        match tokio::time::timeout(self.timeout, handshake).await {
            Err(_) => {
                self.stats.fail(Failure::Timeout);
                None
            }
            Ok(Err(f)) => {
                self.stats.fail(f);
                None
            }
            Ok(Ok(conn)) => {
                let kind = conn.get_ref().1.handshake_kind();
                let counter = if kind == Some(HandshakeKind::Resumed) { &self.stats.resumed } else { &self.stats.full };
                counter.fetch_add(1, Ordering::Relaxed);
                Some(tokio_rustls::TlsStream::Server(conn))
            }
        }
    }
}

fn classify(e: &std::io::Error) -> Failure {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe => Failure::Closed,
        _ => Failure::Protocol,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain HTTP on the TLS port gets this 400, byte for byte (the codec's closing
    /// answer).
    #[test]
    fn plain_http_gets_a_plain_400() {
        assert_eq!(
            plain_http_answer(),
            format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{PLAIN_HTTP_BODY}",
                PLAIN_HTTP_BODY.len()
            )
        );
    }
}
