//! Cutting a SIP byte stream (TCP or TLS) into messages (RFC 3261 18.3): the header
//! section up to the empty line, then exactly `Content-Length` (or compact `l`) bytes of
//! body. Keepalives (RFC 5626 3.5.1): a double CRLF between messages is a ping (answered
//! with one CRLF), a lone CRLF is ignored. Pure: the connection feeds it what it read.
//!
//! Bounded: the header section may take `max_header` bytes, the body `max_body`; past
//! them, or without `Content-Length` (mandatory on a stream: 18.3), the connection ends
//! with an answer the caller writes (`Fault::answer`).
//!
//! One framing only, as a proxy must: every connection to a container carries the
//! messages of many callers, so a message that a container could cut otherwise than we
//! do would let one caller's bytes become another's message. A header section's lines end
//! in CRLF (RFC 3261 7, 25.1): a bare LF in it ends the connection (`BareLineFeed`), as
//! does a folded (continued) `Content-Length` or a continuation line right after the
//! start line, which parsers read differently.

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
    /// Not a decimal, two that differ, or folded over two lines (400, close).
    BadLength,
    /// A line of the header section ends in a bare LF, or a continuation line follows
    /// the start line (400, close).
    BadLineEnd,
}

impl Fault {
    /// The status a request gets before the close, and its reason phrase.
    pub fn answer(self) -> (u16, &'static str) {
        match self {
            Fault::HeaderTooLarge | Fault::BodyTooLarge => (513, "Message Too Large"),
            Fault::NoLength => (400, "Missing Content-Length"),
            Fault::BadLength => (400, "Bad Content-Length"),
            Fault::BadLineEnd => (400, "Bad Request"),
        }
    }

    /// Its outcome counter (`metrics::SIP_STREAM_OUTCOMES`).
    pub fn outcome(self) -> &'static str {
        match self {
            Fault::HeaderTooLarge | Fault::BodyTooLarge => "too_large",
            Fault::NoLength | Fault::BadLength => "no_length",
            Fault::BadLineEnd => "invalid",
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
    let window = &buf[..buf.len().min(limits.max_header)];
    let end = header_end(window);
    if !line_ends_are_crlf(&window[..end.unwrap_or(window.len())]) {
        return Err(Fault::BadLineEnd);
    }
    let Some(head_len) = end else {
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

/// Length of the header section including its empty line (`CRLF CRLF`).
pub fn header_end(b: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(p) = b[i..].iter().position(|&c| c == b'\n') {
        let at = i + p;
        if at >= 3 && &b[at - 3..=at] == b"\r\n\r\n" {
            return Some(at + 1);
        }
        i = at + 1;
    }
    None
}

/// Whether every LF of `head` (a header section, or the start of one) ends a CRLF, and
/// no continuation line follows the start line.
fn line_ends_are_crlf(head: &[u8]) -> bool {
    let bare = head.iter().enumerate().any(|(i, &c)| c == b'\n' && (i == 0 || head[i - 1] != b'\r'));
    let first_end = head.windows(2).position(|w| w == b"\r\n");
    let folded_start = first_end.and_then(|e| head.get(e + 2)).is_some_and(|&c| c == b' ' || c == b'\t');
    !bare && !folded_start
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
    let mut lines = lines(head).peekable();
    while let Some(line) = lines.next() {
        let Some((name, value)) = split_header(line) else { continue };
        if !(name.eq_ignore_ascii_case(b"content-length") || name.eq_ignore_ascii_case(b"l")) {
            continue;
        }
        // Folded onto the next line: one parser reads `10`, another `10 0`.
        if lines.peek().is_some_and(|l| l.first().is_some_and(|c| *c == b' ' || *c == b'\t')) {
            return Err(Fault::BadLength);
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
        // Folded: `10` to us, `10 0` to a parser that unfolds.
        assert_eq!(next(&mut msg("", "Content-Length: 10\r\n 0"), L), Err(Fault::BadLength));
        // Bare LFs: a parser that wants CRLF would read on into the next message.
        for bad in [
            &b"INVITE sip:a@b SIP/2.0\nCall-ID: x\nContent-Length: 0\n\n"[..],
            b"INVITE sip:a@b SIP/2.0\r\nCall-ID: x\r\nContent-Length: 0\r\n\n",
            b"INVITE sip:a@b SIP/2.0\r\nCall-ID: x\nX: y\r\n",
            b"INVITE sip:a@b SIP/2.0\r\n Call-ID: x\r\nContent-Length: 0\r\n\r\n",
        ] {
            assert_eq!(next(&mut bad.to_vec(), L), Err(Fault::BadLineEnd), "{:?}", String::from_utf8_lossy(bad));
        }
        // Folding elsewhere is SIP (RFC 3261 7.3.1) and frames as one message.
        let mut folded = msg("", "Subject: a\r\n  b\r\nContent-Length: 0");
        assert!(matches!(next(&mut folded, L), Ok(Some(Frame::Message(_)))));
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
