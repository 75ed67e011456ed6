//! The driver's client connections, TCP (`TCP_NODELAY`) or a Unix socket:
//! async ones for the load and populating (one reply frame at a time off a
//! pipelined stream), blocking ones for `--staleness` (one command, one
//! reply). Owns connecting and RESP framing of replies; not what is sent.

use std::io::{Read, Write};

use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use sidecache_resp::frame::Scanner;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// A client connection of the load.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// `host:port`, or `unix:PATH`.
fn split_endpoint(target: &str, unix: Option<&str>) -> (Option<String>, String) {
    match unix {
        Some(p) => (Some(p.to_owned()), target.to_owned()),
        None => match target.strip_prefix("unix:") {
            Some(p) => (Some(p.to_owned()), target.to_owned()),
            None => (None, target.to_owned()),
        },
    }
}

/// Connects to `target` (`host:port` or `unix:PATH`), or to `unix` if set.
pub(crate) async fn connect(target: &str, unix: Option<&str>) -> Result<Box<dyn Io>> {
    match split_endpoint(target, unix) {
        (Some(p), _) => Ok(Box::new(
            tokio::net::UnixStream::connect(&p)
                .await
                .with_context(|| format!("connecting {p}"))?,
        )),
        (None, addr) => {
            let s = tokio::net::TcpStream::connect(&addr)
                .await
                .with_context(|| format!("connecting {addr}"))?;
            s.set_nodelay(true)?;
            Ok(Box::new(s))
        }
    }
}

/// The next reply frame on `s`.
pub(crate) async fn read_frame(
    s: &mut Box<dyn Io>,
    buf: &mut BytesMut,
    sc: &mut Scanner,
) -> Result<BytesMut> {
    loop {
        match sc.scan(buf) {
            Ok(Some(n)) => return Ok(buf.split_to(n)),
            Ok(None) => {}
            Err(e) => bail!("bad RESP from the server: {e}"),
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        if s.read_buf(buf).await? == 0 {
            bail!("connection closed");
        }
    }
}

/// A blocking client socket.
trait SyncIo: Read + Write + Send {}
impl SyncIo for std::net::TcpStream {}
impl SyncIo for std::os::unix::net::UnixStream {}

/// A blocking connection that sends one command and reads one reply.
pub(crate) struct Client {
    s: Box<dyn SyncIo>,
    buf: BytesMut,
    rd: Vec<u8>,
    sc: Scanner,
}

impl Client {
    /// Connects as [`connect`] does, blocking.
    pub(crate) fn connect(target: &str, unix: Option<&str>) -> Result<Client> {
        let s: Box<dyn SyncIo> = match split_endpoint(target, unix) {
            (Some(p), _) => Box::new(
                std::os::unix::net::UnixStream::connect(&p)
                    .with_context(|| format!("connecting {p}"))?,
            ),
            (None, addr) => {
                let s = std::net::TcpStream::connect(&addr)
                    .with_context(|| format!("connecting {addr}"))?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
        };
        Ok(Client {
            s,
            buf: BytesMut::with_capacity(16 * 1024),
            rd: vec![0; 16 * 1024],
            sc: Scanner::new(),
        })
    }

    /// Sends `cmd` (RESP) and returns its reply.
    pub(crate) fn call(&mut self, cmd: &[u8]) -> Result<BytesMut> {
        self.s.write_all(cmd)?;
        loop {
            match self.sc.scan(&self.buf) {
                Ok(Some(n)) => return Ok(self.buf.split_to(n)),
                Ok(None) => {}
                Err(e) => bail!("bad RESP from the server: {e}"),
            }
            let n = self.s.read(&mut self.rd)?;
            if n == 0 {
                bail!("connection closed");
            }
            self.buf.extend_from_slice(&self.rd[..n]);
        }
    }
}
