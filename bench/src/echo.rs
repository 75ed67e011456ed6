//! Echo servers for the relay's self-test and tests: what they read, they
//! write back, a thread per connection, until the peer closes.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// An echo server on a free loopback port.
///
/// # Errors
/// When no port can be bound.
pub fn tcp() -> io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || echo(s));
        }
    });
    Ok(addr)
}

/// An echo server on the Unix socket `dir/echo.sock` (`dir` is created; a
/// stale socket there is replaced).
///
/// # Errors
/// When `dir` cannot be created or the socket bound.
pub fn unix(dir: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("echo.sock");
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path)?;
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            std::thread::spawn(move || echo(s));
        }
    });
    Ok(path)
}

fn echo(mut s: impl Read + Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}
