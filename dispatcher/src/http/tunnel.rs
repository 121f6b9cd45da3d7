//! After `101 Switching Protocols`: a tunnel, bytes both ways, closed by either side or by
//! silence both ways.

use std::{
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::pool::Upstream;
use crate::http1::{body::Inbound, io::WriteSide, write_client};

/// After `101 Switching Protocols`: bytes both ways until either side closes. Returns
/// how many bytes it read from the client (those it had buffered were read already).
pub async fn tunnel<R: AsyncRead + Unpin>(
    client: &mut Inbound<R>,
    w: &mut WriteSide,
    mut up: Upstream,
    t: TunnelTimeouts,
) -> u64 {
    if !client.buf.is_empty() && !write_client(&mut up.w, &client.buf, t.server_write).await {
        return 0;
    }
    client.buf.clear();
    if !up.r.buf.is_empty() && !write_client(w, &up.r.buf, t.client_write).await {
        return 0;
    }
    up.r.buf.clear();
    // Bytes both ways until either side closes, or neither side has sent anything for
    // `idle` (a tunnel holds a backend connection: it must not be kept by silence).
    let started = Instant::now();
    let last = std::sync::atomic::AtomicU64::new(0);
    let (from_client, _) = tokio::join!(
        pump(&mut client.io, &mut up.w, t.idle, t.server_write, started, &last),
        pump(&mut up.r.io, w, t.idle, t.client_write, started, &last)
    );
    from_client
}

/// A tunnel's deadlines: silence both ways (`idle`, `http.tunnel_timeout`), and each side
/// taking the bytes written to it (`client_timeout`, `server_timeout`): a peer that stops
/// reading does not hold the tunnel for the silence allowance.
#[derive(Clone, Copy, Debug)]
pub struct TunnelTimeouts {
    pub idle: Duration,
    pub client_write: Duration,
    pub server_write: Duration,
}

/// One way of a tunnel; `last`: when either way last carried a byte (ms after `started`).
/// Returns the bytes it carried.
async fn pump<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    from: &mut R,
    to: &mut W,
    idle: Duration,
    write: Duration,
    started: Instant,
    last: &std::sync::atomic::AtomicU64,
) -> u64 {
    let mut buf = vec![0u8; 16 * 1024];
    let mut carried = 0u64;
    let now = || started.elapsed().as_millis() as u64;
    loop {
        match tokio::time::timeout(idle, tokio::io::AsyncReadExt::read(from, &mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => {
                last.store(now(), Ordering::Relaxed);
                carried += n as u64;
                if !write_client(to, &buf[..n], write).await {
                    break;
                }
            }
            // Quiet this way: go on while the other way is busy.
            Err(_) if now().saturating_sub(last.load(Ordering::Relaxed)) < idle.as_millis() as u64 => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown().await;
    carried
}
