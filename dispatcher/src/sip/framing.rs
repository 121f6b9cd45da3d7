//! Cutting a SIP byte stream (TCP or TLS) into messages (RFC 3261 18.3): the header
//! section up to the empty line, then exactly `Content-Length` (or compact `l`) bytes of
//! body. Keepalives (RFC 5626 3.5.1): a double CRLF between messages is a ping (answered
//! with one CRLF), a lone CRLF is ignored. Pure: the connection feeds it what it read.
//!
//! Bounded: the header section may take `max_header` bytes, the body `max_body`; past
//! them, or without `Content-Length` (mandatory on a stream: 18.3), the connection ends
//! with an answer the caller writes (`Fault::answer`).

/// What the buffer holds next.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// `CRLF CRLF`: answer `CRLF`.
    Ping,
    /// One whole message (header section and body), its bytes taken out of the buffer.
    Message(Vec<u8>),
}

/// Why the stream cannot go on: each ends the connection.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum Fault {
    /// The header section did not end within `max_header` bytes (513, close).
    HeaderTooLarge,
    /// `Content-Length` past `max_body` (513, close).
    BodyTooLarge,
    /// No `Content-Length` (400 to a request, close).
    NoLength,
    /// Not a decimal, or two that differ (400, close).
    BadLength,
}

impl Fault {
    /// The status a request gets before the close, and its reason phrase.
    pub fn answer(self) -> (u16, &'static str) {
        match self {
            Fault::HeaderTooLarge | Fault::BodyTooLarge => (513, "Message Too Large"),
            Fault::NoLength => (400, "Missing Content-Length"),
            Fault::BadLength => (400, "Bad Content-Length"),
        }
    }

    /// Its outcome counter (`metrics::SIP_STREAM_OUTCOMES`).
    pub fn outcome(self) -> &'static str {
        match self {
            Fault::HeaderTooLarge | Fault::BodyTooLarge => "too_large",
            Fault::NoLength | Fault::BadLength => "no_length",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_header: usize,
    pub max_body: usize,
}

/// The next frame at the front of `buf`, taken out of it; `Ok(None)`: more bytes are
/// needed (the buffer never needs to hold more than `max_header + max_body`).
pub fn next(buf: &mut Vec<u8>, limits: Limits) -> Result<Option<Frame>, Fault> {
    // Keepalives and stray line ends before a message, walked by offset and taken out
    // in one drain (a read full of line ends costs one copy, not one per line end). A
    // run of pings is answered once: one pong tells the caller the flow is alive.
    let (mut at, mut ping) = (0, false);
    loop {
        let rest = &buf[at..];
        if rest.starts_with(b"\r\n\r\n") {
            at += 4;
            ping = true;
        } else if rest.starts_with(b"\r\n") {
            if rest.len() < 4 && b"\r\n\r\n".starts_with(rest) && !ping {
                // Maybe the start of a ping: wait for the rest.
                buf.drain(..at);
                return Ok(None);
            }
            at += 2;
        } else if rest.first() == Some(&b'\n') {
            at += 1;
        } else {
            break;
        }
    }
    if at > 0 {
        buf.drain(..at);
    }
    if ping {
        return Ok(Some(Frame::Ping));
    }
    if buf.is_empty() {
        return Ok(None);
    }
    let Some(head_len) = header_end(&buf[..buf.len().min(limits.max_header)]) else {
        if buf.len() >= limits.max_header {
            return Err(Fault::HeaderTooLarge);
        }
        return Ok(None);
    };
    let body = content_length(&buf[..head_len])?;
    if body > limits.max_body {
        return Err(Fault::BodyTooLarge);
    }
    if buf.len() < head_len + body {
        return Ok(None);
    }
    let rest = buf.split_off(head_len + body);
    Ok(Some(Frame::Message(std::mem::replace(buf, rest))))
}

/// Length of the header section including its empty line (`CRLF CRLF`, or bare LFs).
pub fn header_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(p) = b[i..].iter().position(|&c| c == b'\n') {
        let at = i + p + 1;
        match b.get(at) {
            Some(b'\n') => return Some(at + 1),
            Some(b'\r') if b.get(at + 1) == Some(&b'\n') => return Some(at + 2),
            _ => i = at,
        }
        if i >= b.len() {
            break;
        }
    }
    None
}

/// The header lines of a header section (the start line excluded), folded lines
/// joined to their header as separate entries are not needed here: each item is one
/// physical line without its line end.
pub fn lines(head: &[u8]) -> impl Iterator<Item = &[u8]> {
    head.split(|&c| c == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l)).skip(1).take_while(|l| !l.is_empty())
}

/// A header line's name (trimmed) and value, if it is `name: value`.
pub fn split_header(line: &[u8]) -> Option<(&[u8], &[u8])> {
    if line.first().is_some_and(|c| *c == b' ' || *c == b'\t') {
        return None;
    }
    let colon = line.iter().position(|&c| c == b':')?;
    Some((line[..colon].trim_ascii(), line[colon + 1..].trim_ascii()))
}

/// `Content-Length` or `l` (case-insensitive): every occurrence must agree.
fn content_length(head: &[u8]) -> Result<usize, Fault> {
    let mut found: Option<usize> = None;
    for (name, value) in lines(head).filter_map(split_header) {
        if !(name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"l")) {
            continue;
        }
        if value.is_empty() || value.len() > 9 || !value.iter().all(u8::is_ascii_digit) {
            return Err(Fault::BadLength);
        }
        let n: usize =
            std::str::from_utf8(value).map_err(|_| Fault::BadLength)?.parse().map_err(|_| Fault::BadLength)?;
        if found.is_some_and(|f| f != n) {
            return Err(Fault::BadLength);
        }
        found = Some(n);
    }
    found.ok_or(Fault::NoLength)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits { max_header: 1024, max_body: 4096 };

    fn msg(body: &str, len_header: &str) -> Vec<u8> {
        format!("INVITE sip:a@b SIP/2.0\r\nCall-ID: x\r\n{len_header}\r\n\r\n{body}").into_bytes()
    }

    fn all(stream: &[u8], cut: usize) -> Result<Vec<Frame>, Fault> {
        let mut buf = Vec::new();
        let mut out = Vec::new();
        for part in [&stream[..cut], &stream[cut..]] {
            buf.extend_from_slice(part);
            while let Some(f) = next(&mut buf, L)? {
                out.push(f);
            }
        }
        assert!(buf.is_empty(), "nothing left over: {:?}", String::from_utf8_lossy(&buf));
        Ok(out)
    }

    /// Two messages, a ping and stray line ends, cut at every byte: the same frames.
    #[test]
    fn a_stream_cut_anywhere_gives_the_same_messages() {
        let a = msg("v=0\r\n", "Content-Length: 5");
        let b = msg("", "l: 0");
        let mut stream = a.clone();
        stream.extend_from_slice(b"\r\n\r\n\r\n");
        stream.extend_from_slice(&b);
        let want = vec![Frame::Message(a), Frame::Ping, Frame::Message(b)];
        for cut in 0..=stream.len() {
            assert_eq!(all(&stream, cut).unwrap(), want, "cut at {cut}");
        }
    }

    #[test]
    fn compact_l_and_case_frame_the_body() {
        let m = msg("hello", "L :5");
        let mut buf = m.clone();
        buf.extend_from_slice(b"INV");
        assert_eq!(next(&mut buf, L).unwrap(), Some(Frame::Message(m)));
        assert_eq!(buf, b"INV");
        assert_eq!(next(&mut buf, L).unwrap(), None);
    }

    #[test]
    fn a_body_shorter_than_its_length_waits() {
        let mut buf = msg("abc", "Content-Length: 10");
        assert_eq!(next(&mut buf, L).unwrap(), None);
    }

    #[test]
    fn hostile_framing_is_refused() {
        let mut no_len = b"INVITE sip:a@b SIP/2.0\r\nCall-ID: x\r\n\r\n".to_vec();
        assert_eq!(next(&mut no_len, L), Err(Fault::NoLength));
        for bad in ["Content-Length: +1", "Content-Length: 0x1", "Content-Length:", "Content-Length: 1\r\nl: 2"] {
            assert_eq!(next(&mut msg("", bad), L), Err(Fault::BadLength), "{bad}");
        }
        assert_eq!(next(&mut msg("", "Content-Length: 4097"), L), Err(Fault::BodyTooLarge));
        let mut endless = b"INVITE sip:a@b SIP/2.0\r\n".to_vec();
        endless.extend(std::iter::repeat_n(b"X-A: b\r\n".as_slice(), 200).flatten());
        assert_eq!(next(&mut endless, L), Err(Fault::HeaderTooLarge));
    }

    /// A lone CRLF is not a ping; CRLF CRLF is; a run of them read at once is one ping
    /// (answered once); stray line ends before a message are skipped.
    #[test]
    fn keepalives() {
        let mut buf = b"\r\n".to_vec();
        assert_eq!(next(&mut buf, L).unwrap(), None);
        buf.extend_from_slice(b"\r\n");
        assert_eq!(next(&mut buf, L).unwrap(), Some(Frame::Ping));
        assert_eq!(next(&mut buf, L).unwrap(), None);
        assert!(buf.is_empty());
        buf.extend_from_slice(b"\r\n\r\n\r\n\r\n\r\n\r\n");
        assert_eq!(next(&mut buf, L).unwrap(), Some(Frame::Ping));
        assert_eq!(next(&mut buf, L).unwrap(), None);
        assert!(buf.is_empty());
        // Thousands of line ends in one read: taken out at once, nothing left over.
        let mut flood: Vec<u8> = std::iter::repeat_n(b"\n".as_slice(), 8000).flatten().copied().collect();
        flood.extend_from_slice(b"OPTIONS sip:a SIP/2.0\r\nContent-Length: 0\r\n\r\n");
        assert!(matches!(next(&mut flood, L).unwrap(), Some(Frame::Message(_))));
        assert!(flood.is_empty());
    }
}
