//! `tcp_has_room`: the readiness question the raw TCP baselines busy-poll
//! after a refused write. It must say "no room" while the peer reads
//! nothing (or the baseline's writer would spin on refused writes again)
//! and "room" once the peer has drained the stream (or it would wait for
//! ever), and count a connection the peer reset as room, so that the
//! write which follows reports the error.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use softrdma_engine::tcp_has_room;

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

/// Writes until the socket refuses; returns the octets written.
fn fill(s: &mut TcpStream) -> usize {
    s.set_nonblocking(true).unwrap();
    let chunk = vec![7u8; 64 << 10];
    let mut n = 0;
    loop {
        match s.write(&chunk) {
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return n,
            Err(e) => panic!("write: {e}"),
        }
    }
}

#[test]
fn a_full_socket_has_no_room_until_the_peer_reads() {
    let (mut a, mut b) = pair();
    assert!(tcp_has_room(&a), "a fresh connection has room");
    let written = fill(&mut a);
    assert!(written > 0);
    assert!(!tcp_has_room(&a), "the write was just refused: no room");
    // The peer drains everything; the acknowledgements free the buffer.
    b.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut read = 0;
    while read < written {
        read += b.read(&mut buf).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !tcp_has_room(&a) {
        assert!(
            Instant::now() < deadline,
            "no room 5 s after the peer drained"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(a.write(&[1]).is_ok(), "room means a write is taken");
}

#[test]
fn a_reset_connection_counts_as_room() {
    let (mut a, b) = pair();
    fill(&mut a);
    assert!(!tcp_has_room(&a));
    // Closing with unread data resets the connection.
    b.shutdown(Shutdown::Both).unwrap();
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !tcp_has_room(&a) {
        assert!(Instant::now() < deadline, "a reset still reads as full");
        std::thread::sleep(Duration::from_millis(1));
    }
}
