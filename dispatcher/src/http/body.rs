//! Message bodies, streamed (never buffered whole): Content-Length, chunked (validated
//! and re-emitted, trailers filtered) and read-until-close.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Where a relay failed: the reading side, the writing side, or the message itself.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("reading: {0}")]
    Read(std::io::Error),
    #[error("writing: {0}")]
    Write(std::io::Error),
    #[error("timed out reading")]
    Timeout,
    #[error("peer closed before the end of the message")]
    Eof,
    #[error("bad chunked encoding: {0}")]
    Chunk(&'static str),
}

/// A connection's read side with its buffer: bytes read past one message stay here for
/// the next (pipelining, keep-alive).
pub struct Inbound<R> {
    pub io: R,
    pub buf: BytesMut,
    /// How much room each read makes when the buffer is (nearly) full.
    chunk: usize,
}

const READ_CHUNK: usize = 16 * 1024;

impl<R: AsyncRead + Unpin> Inbound<R> {
    pub fn new(io: R) -> Self {
        Inbound::with_chunk(io, READ_CHUNK)
    }

    /// A reader that allocates `chunk` bytes at a time, and nothing before its first read
    /// (an idle client connection costs no buffer).
    pub fn with_chunk(io: R, chunk: usize) -> Self {
        Inbound { io, buf: BytesMut::new(), chunk }
    }

    /// Reads more bytes into the buffer; `Ok(0)` at end of stream.
    pub async fn fill(&mut self, timeout: Duration) -> Result<usize, RelayError> {
        if self.buf.capacity() - self.buf.len() < 1024 {
            self.buf.reserve(self.chunk);
        }
        match tokio::time::timeout(timeout, self.io.read_buf(&mut self.buf)).await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(e)) => Err(RelayError::Read(e)),
            Err(_) => Err(RelayError::Timeout),
        }
    }

    /// Makes sure at least one byte is buffered.
    async fn need(&mut self, timeout: Duration) -> Result<(), RelayError> {
        if self.buf.is_empty() && self.fill(timeout).await? == 0 {
            return Err(RelayError::Eof);
        }
        Ok(())
    }

    /// A CRLF-terminated line (without the CRLF), at most `max` bytes.
    async fn line(&mut self, timeout: Duration, max: usize) -> Result<BytesMut, RelayError> {
        let mut scanned = 0;
        loop {
            if let Some(pos) = self.buf[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + pos;
                if end == 0 || self.buf[end - 1] != b'\r' {
                    return Err(RelayError::Chunk("bare LF"));
                }
                let mut line = self.buf.split_to(end + 1);
                line.truncate(end - 1);
                if line.contains(&b'\r') {
                    return Err(RelayError::Chunk("bare CR"));
                }
                return Ok(line);
            }
            scanned = self.buf.len();
            if scanned > max {
                return Err(RelayError::Chunk("line too long"));
            }
            if self.fill(timeout).await? == 0 {
                return Err(RelayError::Eof);
            }
        }
    }
}

/// Writes with a deadline: a peer that stops reading cannot hold the relay (and the
/// connection on the other side) forever.
async fn write<W: AsyncWrite + Unpin>(dst: &mut W, bytes: &[u8], timeout: Duration) -> Result<(), RelayError> {
    match tokio::time::timeout(timeout, dst.write_all(bytes)).await {
        Ok(r) => r.map_err(RelayError::Write),
        Err(_) => Err(RelayError::Write(std::io::ErrorKind::TimedOut.into())),
    }
}

/// Copies exactly `n` body bytes.
pub async fn relay_length<R, W>(
    src: &mut Inbound<R>,
    dst: &mut W,
    mut n: u64,
    timeout: Duration,
) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while n > 0 {
        src.need(timeout).await?;
        let take = (src.buf.len() as u64).min(n) as usize;
        write(dst, &src.buf[..take], timeout).await?;
        src.buf.advance(take);
        n -= take as u64;
    }
    Ok(())
}

/// Copies everything until the source closes.
pub async fn relay_until_close<R, W>(src: &mut Inbound<R>, dst: &mut W, timeout: Duration) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        if !src.buf.is_empty() {
            write(dst, &src.buf, timeout).await?;
            src.buf.clear();
        }
        if src.fill(timeout).await? == 0 {
            return Ok(());
        }
    }
}

const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// The size of a chunk-size line: 1*HEXDIG, then optional extensions after `;` (dropped
/// on the way through). Anything else — a sign, `0x`, spaces, underscores — is refused.
pub fn chunk_size(line: &[u8]) -> Result<u64, RelayError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(RelayError::Chunk("chunk size is not hex"));
    }
    if digits > 15 {
        return Err(RelayError::Chunk("chunk size too large"));
    }
    let rest = &line[digits..];
    let rest_ok = rest.is_empty() || {
        let ext = rest.iter().position(|&b| b != b' ' && b != b'\t').map(|i| &rest[i..]).unwrap_or(&[]);
        ext.first() == Some(&b';') && ext.iter().all(|&b| b >= 0x20 && b != 0x7f || b == b'\t')
    };
    if !rest_ok {
        return Err(RelayError::Chunk("junk after the chunk size"));
    }
    let s = std::str::from_utf8(&line[..digits]).map_err(|_| RelayError::Chunk("chunk size is not hex"))?;
    u64::from_str_radix(s, 16).map_err(|_| RelayError::Chunk("chunk size is not hex"))
}

/// Trailer fields that must never be merged into the message (RFC 9110 6.5.1).
fn forbidden_trailer(name: &[u8]) -> bool {
    [&b"content-length"[..], b"transfer-encoding", b"host", b"connection", b"trailer", b"te"]
        .iter()
        .any(|f| name.eq_ignore_ascii_case(f))
}

/// Validates a chunked body and re-emits it: sizes normalised, extensions dropped,
/// framing-relevant trailer fields dropped. With `dechunk`, only the data goes out (for
/// an HTTP/1.0 recipient, which cannot read chunked).
pub async fn relay_chunked<R, W>(
    src: &mut Inbound<R>,
    dst: &mut W,
    timeout: Duration,
    dechunk: bool,
) -> Result<(), RelayError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    loop {
        let line = src.line(timeout, MAX_CHUNK_LINE).await?;
        let size = chunk_size(&line)?;
        if size == 0 {
            break;
        }
        if !dechunk {
            write(dst, format!("{size:x}\r\n").as_bytes(), timeout).await?;
        }
        relay_length(src, dst, size, timeout).await?;
        let end = src.line(timeout, 2).await?;
        if !end.is_empty() {
            return Err(RelayError::Chunk("chunk data longer than its size"));
        }
        if !dechunk {
            write(dst, b"\r\n", timeout).await?;
        }
    }
    let mut out = Vec::from(&b"0\r\n"[..]);
    let mut total = 0;
    loop {
        let line = src.line(timeout, MAX_TRAILER_BYTES).await?;
        if line.is_empty() {
            break;
        }
        total += line.len();
        if total > MAX_TRAILER_BYTES {
            return Err(RelayError::Chunk("trailer section too large"));
        }
        let colon = line.iter().position(|&b| b == b':').ok_or(RelayError::Chunk("trailer line without a colon"))?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
            return Err(RelayError::Chunk("bad trailer field name"));
        }
        if !forbidden_trailer(name) {
            out.extend_from_slice(&line);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
    if dechunk {
        return Ok(());
    }
    write(dst, &out, timeout).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the chunked relay over `input` delivered in pieces of `step` bytes.
    async fn chunked(input: &[u8], step: usize) -> Result<Vec<u8>, RelayError> {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let data = input.to_vec();
        let feeder = tokio::spawn(async move {
            for piece in data.chunks(step.max(1)) {
                if a.write_all(piece).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        });
        let mut src = Inbound::new(b);
        let mut out = Vec::new();
        let r = relay_chunked(&mut src, &mut out, Duration::from_secs(2), false).await;
        feeder.abort();
        r.map(|_| out)
    }

    #[tokio::test]
    async fn chunked_at_every_split() {
        let input = b"5;ext=1\r\nhello\r\nA\r\n0123456789\r\n0\r\nX-Sum: 1\r\nContent-Length: 9\r\nHost: evil\r\n\r\n";
        let expect = b"5\r\nhello\r\na\r\n0123456789\r\n0\r\nX-Sum: 1\r\n\r\n";
        for step in 1..input.len() {
            assert_eq!(chunked(input, step).await.unwrap(), expect, "step {step}");
        }
    }

    #[tokio::test]
    async fn bad_chunks_are_refused() {
        for bad in [
            &b"0x1\r\na\r\n0\r\n\r\n"[..],
            b"+1\r\na\r\n0\r\n\r\n",
            b" 0\r\n\r\n",
            b"-0\r\n\r\n",
            b"0_2\r\n\r\n",
            b"Z\r\n\r\n",
            b"\r\n\r\n",
            b"1\na\r\n0\r\n\r\n",
            b"1\r\nab\r\n0\r\n\r\n",
            b"1\r\na\n0\r\n\r\n",
            b"1\rx\r\na\r\n0\r\n\r\n",
            b"ffffffffffffffffff\r\n",
        ] {
            assert!(matches!(chunked(bad, 3).await, Err(RelayError::Chunk(_))), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(matches!(chunked(b"5\r\nhel", 3).await, Err(RelayError::Eof | RelayError::Timeout)));
    }

    #[tokio::test]
    async fn length_relays_exactly_and_keeps_the_rest() {
        let (mut a, b) = tokio::io::duplex(1024);
        a.write_all(b"abcdefNEXT").await.unwrap();
        let mut src = Inbound::new(b);
        let mut out = Vec::new();
        relay_length(&mut src, &mut out, 6, Duration::from_secs(1)).await.unwrap();
        assert_eq!(out, b"abcdef");
        assert_eq!(&src.buf[..], b"NEXT");
    }
}
