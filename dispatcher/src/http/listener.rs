//! Accepting on the HTTP VIPs, and stopping: on shutdown the listeners close, idle
//! keep-alive connections end, requests in flight finish (bounded by the drain timeout).

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use tokio::{net::TcpSocket, sync::watch, task::JoinHandle};

use super::{
    head::HeadLimits,
    pool::Pool,
    proxy::{serve, VipCtx},
    route::VipRoute,
};
use crate::{
    config::{Config, VipMode},
    state::Cluster,
};

pub struct HttpServer {
    stop: watch::Sender<bool>,
    accepts: Vec<JoinHandle<()>>,
    active: Arc<AtomicUsize>,
    pub addrs: Vec<SocketAddr>,
}

/// Decrements the count of open client connections when a connection task ends.
struct Active(Arc<AtomicUsize>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl HttpServer {
    /// Binds every HTTP VIP of `cfg` (the VIP address must be local, e.g. on `lo`) and
    /// starts accepting.
    pub async fn start(cfg: &Config, cluster: Arc<Cluster>) -> std::io::Result<HttpServer> {
        let (stop, _) = watch::channel(false);
        let active = Arc::new(AtomicUsize::new(0));
        let mut accepts = Vec::new();
        let mut addrs = Vec::new();
        for v in cfg.vips.iter().filter(|v| v.mode == VipMode::Http) {
            let addr = SocketAddr::new(v.address, v.port);
            let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            socket.set_reuseaddr(true)?;
            socket
                .bind(addr)
                .map_err(|e| std::io::Error::new(e.kind(), format!("binding HTTP VIP {} on {addr}: {e}", v.name)))?;
            let listener = socket.listen(1024)?;
            let pools = (0..cfg.backends.len())
                .map(|b| {
                    v.backends.contains(&b).then(|| {
                        Pool::new(b, SocketAddr::new(cfg.backends[b].address.into(), v.backend_port), &cfg.http)
                    })
                })
                .collect();
            let ctx = Arc::new(VipCtx {
                name: v.address.to_string(),
                route: VipRoute::new(v.backends.clone(), v.balance),
                pools,
                cluster: cluster.clone(),
                settings: cfg.http.clone(),
                limits: HeadLimits { max_bytes: cfg.http.max_header_bytes, max_headers: cfg.http.max_headers },
            });
            let mut stop_rx = stop.subscribe();
            let active = active.clone();
            addrs.push(addr);
            tracing::info!(vip = %v.name, %addr, "HTTP VIP listening");
            accepts.push(tokio::spawn(async move {
                loop {
                    tokio::select! {
                        r = listener.accept() => match r {
                            Ok((stream, peer)) => {
                                active.fetch_add(1, Ordering::SeqCst);
                                let guard = Active(active.clone());
                                let (ctx, stop) = (ctx.clone(), stop_rx.clone());
                                tokio::spawn(async move {
                                    let _guard = guard;
                                    serve(ctx, stream, peer, stop).await;
                                });
                            }
                            Err(e) => {
                                // Out of descriptors and the like: back off, keep serving.
                                tracing::warn!(error = %e, "accept failed");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        },
                        _ = stop_rx.changed() => return,
                    }
                }
            }));
        }
        Ok(HttpServer { stop, accepts, active, addrs })
    }

    pub fn active_connections(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Stops accepting, lets requests in flight finish for at most `drain`.
    pub async fn shutdown(self, drain: Duration) -> usize {
        let _ = self.stop.send(true);
        for a in self.accepts {
            let _ = a.await;
        }
        let deadline = Instant::now() + drain;
        while self.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.active.load(Ordering::SeqCst)
    }
}
