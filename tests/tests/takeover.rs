//! Connection takeover's mechanism on this kernel (issue 31 part 1; needs root for
//! TCP_REPAIR): an idle keep-alive connection whose server side vanished without a word
//! (as when its host dies) goes on, for the client, on a socket rebuilt from the
//! handshake's options and what the client's next segment says. Without the rebuild the
//! same client gets a reset.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream},
    os::fd::OwnedFd,
    time::Duration,
};

use dispatcher::takeover::{rebuild, vanish, Handshake};

/// A connection over loopback, with one exchange done: (client, server side, the
/// listener, still listening: the rebuilt socket binds beside it, as beside a VIP's).
fn idle_connection() -> (TcpStream, TcpStream, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
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

    let mut rebuilt = rebuild(local, peer, &handshake, &resume).expect("TCP_REPAIR rebuild");
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
