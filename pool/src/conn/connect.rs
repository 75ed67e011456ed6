//! Opening one upstream connection: TCP or TLS (rustls, SNI, certificates
//! checked against the host name), then the handshake (HELLO/AUTH, SELECT).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use sidecache_resp::encode;
use sidecache_resp::frame::{self, Scanner, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::Auth;
use crate::config::{Credentials, NodeAddr, Proto, Seed, Session, UpstreamConfig};
use crate::error::{Error, Result};

/// Read half of an upstream connection.
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// Write half of an upstream connection.
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Knows how to reach and authenticate to any node of the upstream.
pub struct Connector {
    tls: Option<tokio_rustls::TlsConnector>,
    auth: Arc<Auth>,
    /// An ACL user's connector: the upstream's own credentials, which
    /// select a database other than 0 before `auth` takes over (as a
    /// client that SELECTed, then AUTHed, is in Redis: the user itself
    /// may lack `+select`).
    selector: Option<Arc<Auth>>,
    connect_timeout: Duration,
    keepalive: Option<Duration>,
    /// Cluster replica reads: every connection sends `READONLY` (a
    /// replica then serves reads of its master's slots; a master ignores it).
    readonly: std::sync::atomic::AtomicBool,
}

/// Turns on TCP keepalive: probes after `idle` without traffic, then every
/// `idle / 3` (as Redis's `tcp-keepalive` does), so a peer that vanished
/// (host gone, half-open connection) is noticed.
///
/// # Errors
/// The socket option's error.
pub fn set_keepalive(tcp: &TcpStream, idle: Duration) -> std::io::Result<()> {
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval((idle / 3).max(Duration::from_secs(1)));
    socket2::SockRef::from(tcp).set_tcp_keepalive(&ka)
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("tls", &self.tls.is_some())
            .field("auth", &self.auth)
            .finish()
    }
}

impl Connector {
    /// Builds a connector from the first seed's scheme and credentials (all
    /// nodes of one deployment share them), or the rotating secret.
    ///
    /// # Errors
    /// [`Error::Config`] / [`Error::Tls`] for unusable settings.
    pub fn new(cfg: &UpstreamConfig) -> Result<Connector> {
        let first: &Seed = cfg
            .seeds
            .first()
            .ok_or_else(|| Error::Config("at least one --upstream is required".into()))?;
        if cfg.seeds.iter().any(|s| s.tls != first.tls) {
            return Err(Error::Config(
                "mixing redis:// and rediss:// upstreams".into(),
            ));
        }
        let tls = if first.tls {
            Some(tls_connector(cfg)?)
        } else {
            None
        };
        let auth = match &cfg.secret {
            Some(_) if first.credentials.is_some() => {
                return Err(Error::Config(
                    "a password in the upstream URL and a rotating secret".into(),
                ))
            }
            Some(secret) => Auth::rotating(secret, cfg.reauth_interval),
            None => Auth::fixed(first.credentials.clone()),
        };
        Ok(Connector {
            tls,
            selector: None,
            auth: Arc::new(auth),
            connect_timeout: cfg.connect_timeout,
            keepalive: cfg.tcp_keepalive,
            readonly: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The same connector (TLS, timeouts, keepalive) authenticating as
    /// `credentials`, fixed: the connections of one client's ACL user.
    /// They never send `READONLY` (they carry no replica reads, and the
    /// user may not be allowed it).
    pub fn with_credentials(&self, credentials: Credentials) -> Connector {
        Connector {
            tls: self.tls.clone(),
            selector: Some(Arc::clone(&self.auth)),
            auth: Arc::new(Auth::fixed(Some(credentials))),
            connect_timeout: self.connect_timeout,
            keepalive: self.keepalive,
            readonly: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on every connection's handshake sends `READONLY` (cluster
    /// replica reads; set before any node's connection opens).
    pub(crate) fn set_readonly(&self) {
        self.readonly
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// What connections authenticate with.
    pub fn auth(&self) -> &Arc<Auth> {
        &self.auth
    }

    /// How long a connect (and its handshake) may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Connects and performs the handshake for `session`. With a rotating
    /// secret, a handshake refused for its credentials fetches the secret
    /// at once and tries once more (the secret rotated since the last
    /// refresh), within the same timeout.
    ///
    /// # Errors
    /// [`Error::Connect`], [`Error::Handshake`] or [`Error::Timeout`].
    pub async fn connect(
        &self,
        addr: &NodeAddr,
        session: Session,
    ) -> Result<(ReadHalf, WriteHalf)> {
        let attempt = async {
            match self.connect_inner(addr, session).await {
                Err(Error::Handshake { reply, .. })
                    if self.auth.is_rotating() && refuses_credentials(reply.as_bytes()) =>
                {
                    self.auth.refresh().await?;
                    self.connect_inner(addr, session).await
                }
                r => r,
            }
        };
        tokio::time::timeout(self.connect_timeout, attempt)
            .await
            .map_err(|_| Error::Connect {
                addr: addr.to_string(),
                reason: "connect timed out".into(),
            })?
    }

    async fn connect_inner(
        &self,
        addr: &NodeAddr,
        session: Session,
    ) -> Result<(ReadHalf, WriteHalf)> {
        let cerr = |e: std::io::Error| Error::Connect {
            addr: addr.to_string(),
            reason: e.to_string(),
        };
        let tcp = TcpStream::connect((addr.host.as_str(), addr.port))
            .await
            .map_err(cerr)?;
        tcp.set_nodelay(true).map_err(cerr)?;
        if let Some(idle) = self.keepalive {
            set_keepalive(&tcp, idle).map_err(cerr)?;
        }
        let (mut rd, mut wr): (ReadHalf, WriteHalf) = match &self.tls {
            None => {
                let (r, w) = tcp.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(addr.host.clone())
                    .map_err(|e| Error::Tls(format!("server name {}: {e}", addr.host).into()))?;
                let stream = tls.connect(name, tcp).await.map_err(cerr)?;
                let (r, w) = tokio::io::split(stream);
                (Box::new(r), Box::new(w))
            }
        };
        let mut out = BytesMut::new();
        let mut n = 0;
        // An ACL user's connection to a database other than 0: the
        // upstream's own user selects it, then AUTH switches to the user.
        let (first, then) = match &self.selector {
            Some(sel) if session.db != 0 => (sel.current(), self.auth.current()),
            _ => (self.auth.current(), None),
        };
        let creds = first.as_deref();
        if session.proto == Proto::Resp3 {
            let mut args: Vec<&[u8]> = vec![b"HELLO", b"3"];
            if let Some(c) = creds {
                args.push(b"AUTH");
                args.push(c.username.as_deref().unwrap_or("default").as_bytes());
                args.push(c.password.as_bytes());
            }
            encode::encode_command(&mut out, &args);
            n += 1;
        } else if let Some(c) = creds {
            match &c.username {
                Some(u) => encode::encode_command(
                    &mut out,
                    &[b"AUTH", u.as_bytes(), c.password.as_bytes()],
                ),
                None => encode::encode_command(&mut out, &[b"AUTH", c.password.as_bytes()]),
            }
            n += 1;
        }
        if session.db != 0 {
            let mut b = itoa::Buffer::new();
            encode::encode_command(
                &mut out,
                &[b"SELECT".as_slice(), b.format(session.db).as_bytes()],
            );
            n += 1;
        }
        if self.readonly.load(std::sync::atomic::Ordering::Relaxed) {
            encode::encode_command(&mut out, &[b"READONLY".as_slice()]);
            n += 1;
        }
        if let Some(c) = then.as_deref() {
            let user = c.username.as_deref().unwrap_or("default");
            encode::encode_command(&mut out, &[b"AUTH", user.as_bytes(), c.password.as_bytes()]);
            n += 1;
        }
        if n > 0 {
            let replies =
                roundtrip(&mut rd, &mut wr, &out, n)
                    .await
                    .map_err(|e| Error::Connect {
                        addr: addr.to_string(),
                        reason: e.to_string(),
                    })?;
            for r in replies {
                if let Some(text) = frame::error_text(&r) {
                    return Err(Error::Handshake {
                        addr: addr.to_string(),
                        reply: String::from_utf8_lossy(text).into_owned(),
                    });
                }
            }
        }
        Ok((rd, wr))
    }

    /// Runs a few commands on a fresh connection and closes it; used for
    /// probing (INFO, CLUSTER SLOTS, COMMAND) outside the multiplexed pools.
    ///
    /// # Errors
    /// Any connection error.
    pub async fn oneshot(
        &self,
        addr: &NodeAddr,
        session: Session,
        cmds: &[&[&[u8]]],
    ) -> Result<Vec<Bytes>> {
        let (mut rd, mut wr) = self.connect(addr, session).await?;
        let mut out = BytesMut::new();
        for c in cmds {
            encode::encode_command(&mut out, c);
        }
        let fut = roundtrip(&mut rd, &mut wr, &out, cmds.len());
        tokio::time::timeout(self.connect_timeout * 4, fut)
            .await
            .map_err(|_| Error::Timeout {
                addr: addr.to_string(),
            })?
            .map_err(|e| Error::ConnectionLost {
                addr: addr.to_string(),
                reason: e.to_string(),
            })
    }
}

/// Whether a handshake error says the credentials were wrong.
fn refuses_credentials(text: &[u8]) -> bool {
    text.starts_with(b"WRONGPASS")
        || text.starts_with(b"NOAUTH")
        || text.starts_with(b"ERR invalid password")
}

async fn roundtrip(
    rd: &mut ReadHalf,
    wr: &mut WriteHalf,
    out: &[u8],
    n: usize,
) -> std::io::Result<Vec<Bytes>> {
    wr.write_all(out).await?;
    wr.flush().await?;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut replies = Vec::with_capacity(n);
    let mut sc = Scanner::new();
    while replies.len() < n {
        match sc.scan(&buf) {
            Ok(Some(len)) => {
                let f = buf.split_to(len).freeze();
                if f.first() != Some(&b'>') {
                    replies.push(f);
                }
                continue;
            }
            Ok(None) => {}
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
        }
        if rd.read_buf(&mut buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    Ok(replies)
}

fn tls_connector(cfg: &UpstreamConfig) -> Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(path) = &cfg.tls_ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| Error::Tls(format!("reading CA file {}: {e}", path.display()).into()))?;
        let mut n = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert =
                cert.map_err(|e| Error::Tls(format!("CA file {}: {e}", path.display()).into()))?;
            roots
                .add(cert)
                .map_err(|e| Error::Tls(format!("CA file {}: {e}", path.display()).into()))?;
            n += 1;
        }
        if n == 0 {
            return Err(Error::Tls(
                format!("CA file {} holds no certificate", path.display()).into(),
            ));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string().into()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Decodes a reply that must not be an error.
///
/// # Errors
/// [`Error::Topology`] with the server's error text.
pub fn expect_ok(frame: &Bytes) -> Result<Value> {
    if let Some(t) = frame::error_text(frame) {
        return Err(Error::Topology(String::from_utf8_lossy(t).into_owned()));
    }
    Ok(Value::decode(frame)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keepalive_is_set_as_asked() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        set_keepalive(&tcp, Duration::from_secs(120)).unwrap();
        let s = socket2::SockRef::from(&tcp);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(120));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(40));
    }
}
