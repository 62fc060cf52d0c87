//! Whether a server listens at a loopback address yet, told apart from a TCP self-connection.
//!
//! The test beds give s3s-fs a port the kernel picked from the ephemeral range, then probe it
//! with connects until one succeeds. While nothing listens there yet, a probe whose own source
//! port happens to be that port connects to itself (TCP simultaneous open, legal on Linux), and
//! the probe took that for the server: seen in CI as a store bed whose first request was
//! refused, with an empty s3s-fs log (2026-12-07, `store_contract`).

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// True if a connect to `addr` within `timeout` reaches a listener: a connection whose two ends
/// are the same address is the probe connected to itself, and does not count.
pub fn accepts(addr: SocketAddr, timeout: Duration) -> bool {
    match TcpStream::connect_timeout(&addr, timeout) {
        Ok(stream) => !is_self_connection(&stream),
        Err(_) => false,
    }
}

/// True for a TCP connection whose local and peer addresses are the same.
pub fn is_self_connection(stream: &TcpStream) -> bool {
    matches!((stream.local_addr(), stream.peer_addr()), (Ok(l), Ok(p)) if l == p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use socket2::{Domain, Protocol, Socket, Type};

    #[test]
    fn a_listener_is_reached_and_a_closed_port_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(accepts(addr, Duration::from_secs(1)));
        drop(listener);
        assert!(!accepts(addr, Duration::from_secs(1)));
    }

    #[test]
    fn a_connection_to_itself_is_told_apart_from_one_to_a_listener() {
        // Bound to a port, then connected to that same port with nothing listening: the
        // kernel completes the handshake with itself, which is what a probe can hit by chance.
        let socket = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).unwrap();
        socket
            .bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into())
            .unwrap();
        let own = socket.local_addr().unwrap().as_socket().unwrap();
        socket.connect(&own.into()).expect("a self-connection");
        let stream: TcpStream = socket.into();
        assert_eq!(stream.peer_addr().unwrap(), own);
        assert!(is_self_connection(&stream));

        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to_listener = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(!is_self_connection(&to_listener));
    }
}
