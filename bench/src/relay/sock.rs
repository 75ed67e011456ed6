//! Where a route connects (TCP, or a Unix socket on the same host), and
//! the connection made there.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Where a route's connections go.
///
/// A Unix socket leaves the relay's upstream hop out of the TCP stack: on
/// one machine, the relay's second TCP hop cost as much CPU as the network
/// it stands in for, which the application's host would not pay (see
/// `bench/results/relay-selftest.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// `host:port`.
    Tcp(SocketAddr),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl FromStr for Upstream {
    type Err = std::net::AddrParseError;

    fn from_str(s: &str) -> Result<Upstream, Self::Err> {
        match s.strip_prefix("unix:") {
            Some(path) => Ok(Upstream::Unix(PathBuf::from(path))),
            None => s.parse().map(Upstream::Tcp),
        }
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Upstream::Tcp(a) => write!(f, "{a}"),
            Upstream::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl From<SocketAddr> for Upstream {
    fn from(a: SocketAddr) -> Upstream {
        Upstream::Tcp(a)
    }
}

/// A non-blocking connection to `to`, under way (its completion shows as
/// writability; a Unix socket's completes at once, or fails with
/// `WouldBlock` while the listener's backlog is full). Both kinds are one
/// [`Socket`]: the relay reads, writes and shuts them down alike.
pub(super) fn connect_nonblocking(to: &Upstream) -> io::Result<Socket> {
    let (domain, protocol, addr) = match to {
        Upstream::Tcp(a) => (
            Domain::for_address(*a),
            Some(Protocol::TCP),
            SockAddr::from(*a),
        ),
        Upstream::Unix(p) => (Domain::UNIX, None, SockAddr::unix(p)?),
    };
    let s = Socket::new(domain, Type::STREAM, protocol)?;
    s.set_nonblocking(true)?;
    if protocol.is_some() {
        s.set_tcp_nodelay(true)?;
    }
    match s.connect(&addr) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(115) => {} // EINPROGRESS
        Err(e) => return Err(e),
    }
    Ok(s)
}
