//! Answers of our own (not relayed from a server): the reason phrases, the one form of a
//! complete answer that closes the connection, and writes to a client that are bounded
//! in time.

use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// How long an answer of our own may take to leave (the client must read it).
pub const ERROR_WRITE_DEADLINE: Duration = Duration::from_secs(5);

/// The reason phrase of a status this process answers itself.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        508 => "Loop Detected",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// A whole answer after which the connection closes: the status line, `Content-Type`,
/// `Content-Length`, the `fields` given (complete `Name: value\r\n` lines, or empty),
/// `Connection: close`, then `body`.
pub fn closing_answer(status: u16, content_type: &str, fields: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{fields}Connection: close\r\n\r\n{body}",
        reason(status),
        body.len()
    )
}

/// Writes to the client within `timeout`; `false` when it failed or the client did not
/// take the bytes in time (a client that never reads cannot hold a request forever).
/// Flushed: over TLS a write may leave encrypted bytes inside the TLS layer when the
/// socket is full (a no-op on plain TCP).
pub async fn write_client<W: AsyncWrite + Unpin + ?Sized>(w: &mut W, bytes: &[u8], timeout: Duration) -> bool {
    let write = async {
        w.write_all(bytes).await?;
        w.flush().await
    };
    matches!(tokio::time::timeout(timeout, write).await, Ok(Ok(())))
}

/// An error answer of our own (`status`, its reason and `why` as a line of text, and
/// `Retry-After` when given), bounded in time; the connection is closed after it.
pub async fn send_error<W: AsyncWrite + Unpin>(w: &mut W, status: u16, why: &str, retry_after: Option<u32>) {
    let body = format!("{status} {}: {why}\n", reason(status));
    let retry = retry_after.map(|s| format!("Retry-After: {s}\r\n")).unwrap_or_default();
    let answer = closing_answer(status, "text/plain", &retry, &body);
    write_client(w, answer.as_bytes(), ERROR_WRITE_DEADLINE).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error answer's exact bytes: what clients and the protocol tests see.
    #[tokio::test]
    async fn an_error_answer_is_framed_and_closes() {
        let (mut ours, mut theirs) = tokio::io::duplex(4096);
        send_error(&mut ours, 503, "no server available", Some(5)).await;
        drop(ours);
        let mut got = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut theirs, &mut got).await.unwrap();
        let body = "503 Service Unavailable: no server available\n";
        assert_eq!(
            got,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nRetry-After: 5\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        );
    }

    #[test]
    fn a_closing_answer_counts_its_body() {
        let a = closing_answer(404, "application/json", "", "{}");
        assert_eq!(
            a,
            "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
        );
        assert_eq!(reason(599), "Error", "a status without a phrase of ours");
    }

    /// A client that does not read: the write gives up at its deadline.
    #[tokio::test]
    async fn a_client_that_never_reads_does_not_hold_the_write() {
        let (mut ours, _theirs) = tokio::io::duplex(16);
        let started = std::time::Instant::now();
        assert!(!write_client(&mut ours, &[0u8; 1024], Duration::from_millis(50)).await);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
