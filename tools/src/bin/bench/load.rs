//! An open-loop HTTP load generator: requests leave on a fixed schedule whatever the
//! server does, and each latency is measured from the request's scheduled time, so a
//! stalled server shows up in the percentiles instead of silently lowering the load
//! (no coordinated omission, as wrk2 measures).

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

pub struct Latencies {
    /// Microseconds, sorted.
    pub us: Vec<u64>,
    /// Each answered request: when it was due (microseconds after `start`) and its latency
    /// (microseconds), in no order.
    pub timeline: Vec<(u64, u64)>,
    /// When the schedule began.
    pub start: Instant,
    pub errors: u64,
    pub offered_rps: f64,
    pub achieved_rps: f64,
}

impl Latencies {
    pub fn pct_ms(&self, p: f64) -> f64 {
        if self.us.is_empty() {
            return f64::NAN;
        }
        let i = ((self.us.len() as f64 * p / 100.0).ceil() as usize).clamp(1, self.us.len()) - 1;
        self.us[i] as f64 / 1000.0
    }
}

/// Reads one response with a Content-Length body from `s`, using `buf` as the buffer.
async fn response(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).map_err(|_| std::io::ErrorKind::InvalidData)?;
            if !head.starts_with("HTTP/1.1 200") {
                return Err(std::io::ErrorKind::InvalidData.into());
            }
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.trim())
                })
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let want = end + 4 + len;
            while buf.len() < want {
                let n = s.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(());
        }
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Offers `rate` requests/s for `duration` over `conns` keep-alive connections; the
/// cookies name the four clones in turn. Must run inside the client's namespace.
pub fn open_loop(addr: SocketAddr, rate: f64, duration: Duration, conns: usize) -> Latencies {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async move {
        let interval = Duration::from_secs_f64(conns as f64 / rate);
        let start = Instant::now() + Duration::from_millis(200);
        let total_per_conn = (duration.as_secs_f64() / interval.as_secs_f64()).floor() as u64;
        let mut tasks = Vec::new();
        for c in 0..conns {
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(total_per_conn as usize);
                let mut errors = 0u64;
                let mut s: Option<TcpStream> = None;
                let mut buf = Vec::with_capacity(4096);
                // Spread the connections' schedules evenly over one interval.
                let offset = interval.mul_f64(c as f64 / conns as f64);
                for k in 0..total_per_conn {
                    let due = start + offset + interval.mul_f64(k as f64);
                    tokio::time::sleep_until(due.into()).await;
                    let req = format!(
                        "GET / HTTP/1.1\r\nHost: bench\r\nCookie: JSESSIONID=0000load{c}x{k}:clone{}x\r\n\r\n",
                        (c as u64 + k) % 4
                    );
                    let result = async {
                        if s.is_none() {
                            let st = TcpStream::connect(addr).await?;
                            st.set_nodelay(true)?;
                            s = Some(st);
                        }
                        let st = s.as_mut().unwrap();
                        st.write_all(req.as_bytes()).await?;
                        response(st, &mut buf).await
                    };
                    match tokio::time::timeout(Duration::from_secs(5), result).await {
                        Ok(Ok(())) => lat.push(((due - start).as_micros() as u64, due.elapsed().as_micros() as u64)),
                        _ => {
                            errors += 1;
                            s = None;
                        }
                    }
                }
                (lat, errors)
            }));
        }
        let mut timeline = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (l, e) = t.await.unwrap();
            timeline.extend(l);
            errors += e;
        }
        let mut us: Vec<u64> = timeline.iter().map(|(_, l)| *l).collect();
        let elapsed = start.elapsed().as_secs_f64().max(duration.as_secs_f64());
        us.sort_unstable();
        let achieved_rps = us.len() as f64 / elapsed;
        Latencies { us, timeline, start, errors, offered_rps: rate, achieved_rps }
    })
}
