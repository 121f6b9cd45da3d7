//! The client side of the admin endpoint (the CLI's commands, the tests, the demo).

use std::{
    io::{ErrorKind, Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

/// Why the agent did not answer, as the operator needs to tell the cases apart.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Nothing listens on the socket (or it does not exist).
    #[error("no agent answers on {0}")]
    NotRunning(String),
    #[error("permission denied on the admin socket {0} (run as root or as the agent's user)")]
    PermissionDenied(String),
    /// Connected, but closed unanswered or no answer in time: at its connection limit, or
    /// short of descriptors.
    #[error("the agent on {0} is busy: {1}")]
    Busy(String, &'static str),
    #[error("admin socket {0}: {1}")]
    Io(String, std::io::Error),
}

/// How long the agent has to answer one request.
const ANSWER_TIME: Duration = Duration::from_secs(10);

/// One request to the agent.
pub fn request(socket: &Path, method: &str, path: &str) -> Result<(u16, String), AdminError> {
    let name = socket.display().to_string();
    let mut s = UnixStream::connect(socket).map_err(|e| match e.kind() {
        ErrorKind::NotFound | ErrorKind::ConnectionRefused => AdminError::NotRunning(name.clone()),
        ErrorKind::PermissionDenied => AdminError::PermissionDenied(name.clone()),
        _ => AdminError::Io(name.clone(), e),
    })?;
    let io = |e: std::io::Error| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => AdminError::Busy(name.clone(), "no answer within 10 s"),
        ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            AdminError::Busy(name.clone(), "connection closed unanswered (too many admin connections at once?)")
        }
        _ => AdminError::Io(name.clone(), e),
    };
    s.set_read_timeout(Some(ANSWER_TIME)).map_err(io)?;
    s.write_all(format!("{method} {path} HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\n\r\n").as_bytes())
        .map_err(io)?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(io)?;
    if out.is_empty() {
        return Err(AdminError::Busy(name, "connection closed unanswered (too many admin connections at once?)"));
    }
    let text = String::from_utf8_lossy(&out);
    let malformed = |what| AdminError::Io(name.clone(), std::io::Error::other(what));
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| malformed("malformed admin response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed("malformed admin status"))?;
    Ok((status, body.to_string()))
}

/// What to say when the agent did not answer: whether an agent holds the instance (so
/// that the maps must not be written behind it).
pub fn explain(e: &AdminError, instance: &str) -> String {
    match (e, crate::instance::holder(instance)) {
        (AdminError::NotRunning(_), None) => "agent not running".to_string(),
        (_, Some(pid)) => format!("{e}; an agent (pid {pid}) holds instance {instance}"),
        (_, None) => e.to_string(),
    }
}

/// What the agent said when it refused: an `ErrorReply`'s words, never its JSON (a body
/// that is not one, as it is).
pub fn refusal(body: &str) -> String {
    match serde_json::from_str::<crate::api::ErrorReply>(body) {
        Ok(e) => e.error,
        Err(_) => body.trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_refusal_is_said_in_words() {
        assert_eq!(
            super::refusal("{\"error\":\"no backend or farm/server named \\\"nosuch\\\"; known: b0\"}\n"),
            "no backend or farm/server named \"nosuch\"; known: b0"
        );
        assert_eq!(super::refusal("not found\n"), "not found");
    }
}
