//! The relay's sockets: where a route connects (TCP, or a Unix socket on
//! the same host), and a connected stream of either kind.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::str::FromStr;

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

/// A connected stream, non-blocking.
#[derive(Debug)]
pub(super) enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Sock {
    pub(super) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => (&*s).read(buf),
            Sock::Unix(s) => (&*s).read(buf),
        }
    }

    pub(super) fn write(&self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Tcp(s) => (&*s).write(buf),
            Sock::Unix(s) => (&*s).write(buf),
        }
    }

    pub(super) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Sock::Tcp(s) => s.shutdown(how),
            Sock::Unix(s) => s.shutdown(how),
        }
    }
}

impl AsFd for Sock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Sock::Tcp(s) => s.as_fd(),
            Sock::Unix(s) => s.as_fd(),
        }
    }
}

/// A non-blocking connection to `to`: under way for TCP (its completion
/// shows as writability); made at once for a Unix socket, with a blocking
/// local connect, which waits only while the listener's backlog is full
/// (Redis's is 511; a benchmark opens a few dozen connections).
pub(super) fn connect_nonblocking(to: &Upstream) -> io::Result<Sock> {
    match to {
        Upstream::Tcp(addr) => {
            let s = socket2::Socket::new(
                socket2::Domain::for_address(*addr),
                socket2::Type::STREAM,
                Some(socket2::Protocol::TCP),
            )?;
            s.set_nonblocking(true)?;
            s.set_tcp_nodelay(true)?;
            match s.connect(&(*addr).into()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(115) => {} // EINPROGRESS
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            Ok(Sock::Tcp(s.into()))
        }
        Upstream::Unix(path) => {
            let s = UnixStream::connect(path)?;
            s.set_nonblocking(true)?;
            Ok(Sock::Unix(s))
        }
    }
}
