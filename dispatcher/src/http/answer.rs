//! The proxy's own answers (synthetic responses): what a request is told when it is not
//! forwarded, or when its attempt failed before any response byte reached the client.
//! Each carries its status, the short reason its plain-text body gives, and when to come
//! back (`Retry-After`); every one closes the connection. They are written in one place,
//! `http1::send_error`.

use crate::capacity::queue::Refused;
use crate::http1::body::RelayError;

/// An answer of the proxy's own; the connection is closed after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// The body's short explanation (after the status and its reason phrase).
    pub why: &'static str,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u32>,
}

impl Answer {
    pub const fn new(status: u16, why: &'static str) -> Answer {
        Answer { status, why, retry_after: None }
    }

    /// The same answer, with `Retry-After: seconds`.
    pub const fn retry_after(self, seconds: u32) -> Answer {
        Answer { retry_after: Some(seconds), ..self }
    }

    /// Writes it (bounded in time, `Connection: close`).
    pub async fn send<W: tokio::io::AsyncWrite + Unpin>(&self, w: &mut W) {
        crate::http1::send_error(w, self.status, self.why, self.retry_after).await;
    }

    /// A request that came back through a backend that leads here.
    pub const LOOP: Answer =
        Answer::new(508, "this request has already passed through this dispatcher (a forwarding loop)");
    /// The session's owner is suspect and the hold queue is full.
    pub const HOLD_FULL: Answer = Answer::new(503, "too many requests waiting for their server").retry_after(2);
    pub const SESSION_UNAVAILABLE: Answer =
        Answer::new(503, "the session's server and its replica are unavailable").retry_after(5);
    pub const NO_BACKEND: Answer = Answer::new(503, "no server available").retry_after(5);
    /// No route of the VIP matches the request's host and path.
    pub const NO_ROUTE: Answer = Answer::new(404, "no route for this host and path");
    /// A `101 Switching Protocols` to a request that asked for no upgrade.
    pub const UNSOLICITED_101: Answer = Answer::new(502, "unsolicited 101 from the server");
    pub const BODY_TIMEOUT: Answer = Answer::new(408, "request body not received in time");

    /// A request body that failed before it was all read: bad chunked framing (400), or
    /// too slow (408); a client that closed or failed gets no answer.
    pub fn body_failed(e: &RelayError) -> Option<Answer> {
        match e {
            RelayError::Chunk(why) => Some(Answer::new(400, why)),
            RelayError::Timeout => Some(Answer::BODY_TIMEOUT),
            _ => None,
        }
    }

    /// No slot on the chosen backend (`maxconn` and its queue).
    pub const fn queue_refused(why: Refused) -> Answer {
        let why = match why {
            Refused::QueueFull => "the server's queue is full",
            Refused::Timeout => "the server is busy",
            Refused::Left => "the server left while the request waited",
        };
        Answer::new(503, why).retry_after(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the client reads of an answer.
    async fn written(a: Answer) -> String {
        let (mut client, mut proxy) = tokio::io::duplex(4096);
        a.send(&mut proxy).await;
        drop(proxy);
        let mut got = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut client, &mut got).await.unwrap();
        String::from_utf8(got).unwrap()
    }

    #[tokio::test]
    async fn an_answer_is_a_whole_closing_response() {
        let text = written(Answer::NO_BACKEND).await;
        let body = "503 Service Unavailable: no server available\n";
        assert_eq!(
            text,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\
                 Retry-After: 5\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
        );
        let text = written(Answer::UNSOLICITED_101).await;
        assert!(text.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{text}");
        assert!(!text.contains("Retry-After"), "{text}");
        assert!(text.ends_with("\r\n\r\n502 Bad Gateway: unsolicited 101 from the server\n"), "{text}");
    }

    #[test]
    fn body_failures_and_queue_refusals() {
        assert_eq!(Answer::body_failed(&RelayError::Chunk("bad size")), Some(Answer::new(400, "bad size")));
        assert_eq!(Answer::body_failed(&RelayError::Timeout), Some(Answer::BODY_TIMEOUT));
        assert_eq!(Answer::body_failed(&RelayError::Eof), None);
        let refused = Answer::queue_refused(Refused::Left);
        assert_eq!((refused.status, refused.retry_after), (503, Some(1)));
        assert_eq!(refused.why, "the server left while the request waited");
        assert_eq!(Answer::queue_refused(Refused::Timeout).why, "the server is busy");
        assert_eq!(Answer::queue_refused(Refused::QueueFull).why, "the server's queue is full");
    }
}
