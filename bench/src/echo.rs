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
    serve(move || {
        let (s, _) = l.accept()?;
        let _ = s.set_nodelay(true);
        Ok(s)
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
    serve(move || l.accept().map(|(s, _)| s));
    Ok(path)
}

/// Accepts with `accept` on a thread of its own, forever, and echoes each
/// connection on a thread of its own.
fn serve<S: Read + Write + Send + 'static>(accept: impl Fn() -> io::Result<S> + Send + 'static) {
    std::thread::spawn(move || loop {
        if let Ok(s) = accept() {
            std::thread::spawn(move || echo(s));
        }
    });
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
