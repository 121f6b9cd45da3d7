//! The client side of the admin endpoint (the CLI's commands, the tests, the demo).

use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

/// One request to the agent; `Err` when no agent listens there.
pub fn request(socket: &Path, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\n\r\n").as_bytes())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| std::io::Error::other("malformed admin response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("malformed admin status"))?;
    Ok((status, body.to_string()))
}
