//! Connection takeover's mechanism on this kernel (issue 31 part 1; needs root for
//! TCP_REPAIR): an idle keep-alive connection whose server side vanished without a word
//! (as when its host dies) goes on, for the client, on a socket rebuilt from the
//! handshake's options and what the client's next segment says. Without the rebuild the
//! same client gets a reset. A segment lost to the vanished side is given to the rebuilt
//! socket (as the XDP program's report carries it) and needs no retransmission.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::fd::OwnedFd,
    time::Duration,
};

use dispatcher::takeover::{rebuild, vanish, Handshake};
use dispatcher_testbed::netns::{fresh_prefix, sh, Ns, Testbed};

/// A connection over loopback, with one exchange done: (client, server side, the
/// listener, still listening: the rebuilt socket binds beside it, as beside a VIP's).
fn idle_connection() -> (TcpStream, TcpStream, TcpListener) {
    idle_connection_on("127.0.0.1:0")
}

fn idle_connection_on(addr: &str) -> (TcpStream, TcpStream, TcpListener) {
    let listener = TcpListener::bind(addr).unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (mut server, _) = listener.accept().unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    server.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    client.write_all(b"GET /1 HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = server.read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"GET /1 HTTP/1.1\r\n\r\n");
    server.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").unwrap();
    let mut answer = [0u8; 40];
    client.read_exact(&mut answer).unwrap();
    (client, server, listener)
}

#[test]
fn an_idle_connection_goes_on_on_a_rebuilt_socket() {
    let (mut client, server, _listener) = idle_connection();
    let (local, peer) = (server.local_addr().unwrap(), server.peer_addr().unwrap());
    let handshake = Handshake::of(std::os::fd::AsRawFd::as_raw_fd(&server)).unwrap();
    assert!(handshake.timestamps && handshake.sack && handshake.wscale, "loopback agrees all options: {handshake:?}");
    let resume = vanish(OwnedFd::from(server)).unwrap();

    let mut rebuilt = rebuild(local, peer, &handshake, &resume, &[]).expect("TCP_REPAIR rebuild");
    rebuilt.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    client.write_all(b"GET /2 HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = rebuilt.read(&mut buf).expect("the client's next request reaches the rebuilt socket");
    assert_eq!(&buf[..n], b"GET /2 HTTP/1.1\r\n\r\n");
    // A large answer: the windows and their scales were rebuilt right.
    let body = vec![b'x'; 4 << 20];
    let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len());
    let writer = std::thread::spawn(move || {
        rebuilt.write_all(head.as_bytes()).unwrap();
        rebuilt.write_all(&body).unwrap();
        rebuilt
    });
    let mut got = Vec::new();
    let want = 4 << 20;
    while got.len() < want + 38 {
        let mut chunk = [0u8; 65536];
        let n = client.read(&mut chunk).expect("the answer arrives");
        assert!(n > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&chunk[..n]);
    }
    let rebuilt = writer.join().unwrap();
    assert!(got.starts_with(b"HTTP/1.1 200 OK\r\ncontent-length: 4194304\r\n\r\n"));
    assert!(got[got.len() - want..].iter().all(|&b| b == b'x'));
    drop(rebuilt);
}

#[test]
fn without_the_rebuild_the_client_is_reset() {
    let (mut client, server, _listener) = idle_connection();
    vanish(OwnedFd::from(server)).unwrap();
    client.write_all(b"GET /2 HTTP/1.1\r\n\r\n").unwrap();
    let mut buf = [0u8; 64];
    let e = client.read(&mut buf).expect_err("nothing holds the connection");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
}

/// A namespace of the test's own (its loopback only), removed when dropped.
struct OwnNs {
    prefix: String,
    ns: Ns,
}

impl OwnNs {
    fn new() -> OwnNs {
        let prefix = fresh_prefix();
        let ns = Ns { name: format!("{prefix}-tk") };
        let own = OwnNs { prefix, ns };
        sh(&["ip", "netns", "add", &own.ns.name]);
        own.ns.ip(&["link", "set", "lo", "up"]);
        own
    }
}

impl Drop for OwnNs {
    fn drop(&mut self) {
        Testbed::remove(&self.prefix);
    }
}

/// The client's TCP_INFO: (retransmissions so far, its retransmission timeout).
fn retransmissions_and_rto(s: &TcpStream) -> (u32, Duration) {
    use std::os::fd::AsRawFd;
    // SAFETY: `tcp_info` is plain data; the kernel writes at most `len` bytes of it.
    let mut info: nix::libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<nix::libc::tcp_info>() as nix::libc::socklen_t;
    let rc = unsafe {
        nix::libc::getsockopt(
            s.as_raw_fd(),
            nix::libc::IPPROTO_TCP,
            nix::libc::TCP_INFO,
            (&mut info as *mut nix::libc::tcp_info).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "TCP_INFO: {}", std::io::Error::last_os_error());
    (info.tcpi_total_retrans, Duration::from_micros(info.tcpi_rto as u64))
}

/// The client's next request is lost (the vanished side would have taken it; here a
/// firewall rule drops it), then the socket is rebuilt with that segment's data, as the
/// XDP program's report carries it: the request is there to read at once, and that read
/// acknowledges it, so the client never retransmits it, even when the answer takes
/// longer than the client's retransmission timeout; the answer then reaches it.
#[test]
fn a_lost_segment_given_to_the_rebuilt_socket_is_not_retransmitted() {
    let own = OwnNs::new();
    let ns = own.ns.clone();
    let rules = |cmd: &[&str]| {
        let mut v = vec!["nft"];
        v.extend_from_slice(cmd);
        ns.exec(&v)
    };
    let (mut client, server, listener) = own.ns.run(|| idle_connection_on("127.0.0.1:18080"));
    let (local, peer) = (server.local_addr().unwrap(), server.peer_addr().unwrap());
    let handshake = Handshake::of(std::os::fd::AsRawFd::as_raw_fd(&server)).unwrap();
    let resume = vanish(OwnedFd::from(server)).unwrap();

    // The client's request is lost on the way.
    rules(&["add", "table", "inet", "takeover_test"]);
    // (On input: dropped on output, the segment would count as never sent.)
    rules(&["add", "chain", "inet", "takeover_test", "in", "{ type filter hook input priority 0; }"]);
    let rule =
        ["add", "rule", "inet", "takeover_test", "in", "tcp", "dport", "18080", "tcp", "flags", "&", "syn", "==", "0"];
    rules(&[&rule[..], &["counter", "drop"]].concat());
    let request = b"GET /2 HTTP/1.1\r\nHost: t\r\n\r\n";
    client.write_all(request).unwrap();
    let dropped = || rules(&["list", "chain", "inet", "takeover_test", "in"]);
    let t = std::time::Instant::now();
    let count = |list: String| -> u64 {
        let at = list.find("packets ").map(|i| i + 8).unwrap_or(list.len());
        list[at..].split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    while count(dropped()) == 0 {
        assert!(t.elapsed() < Duration::from_secs(2), "the request was not dropped: {}", dropped());
        std::thread::sleep(Duration::from_millis(2));
    }

    // Rebuilt with the lost segment's data (in the namespace: the socket's address is
    // there), then the rule lifted (as the XDP program lets segments through once the
    // socket exists). Retransmissions counted from here: a loaded machine may have sent
    // one before.
    let (before, rto) = retransmissions_and_rto(&client);
    let mut rebuilt =
        own.ns.run(move || rebuild(local, peer, &handshake, &resume, request).expect("TCP_REPAIR rebuild with data"));
    rules(&["delete", "table", "inet", "takeover_test"]);
    rebuilt.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    let n = rebuilt.read(&mut buf).expect("the request is in the rebuilt socket");
    assert_eq!(&buf[..n], request);
    // A slow answer: longer than the client's retransmission timeout (and its backoff).
    std::thread::sleep((rto * 3).clamp(Duration::from_millis(700), Duration::from_secs(3)));
    rebuilt.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").unwrap();
    let mut answer = [0u8; 40];
    client.read_exact(&mut answer).expect("the answer arrives");
    assert!(answer.ends_with(b"ok"));
    // Acknowledged by the rebuilt socket at the read: never sent again.
    let (after, _) = retransmissions_and_rto(&client);
    assert_eq!(after - before, 0, "the client retransmitted its request (its RTO {rto:?})");
    // Read once: nothing more came (a retransmission would have been a duplicate anyway).
    rebuilt.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let more = rebuilt.read(&mut buf);
    assert!(more.is_err(), "nothing after the request: {more:?}");
    drop(listener);
}
