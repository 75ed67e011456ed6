//! TLS and AUTH to upstream, as ElastiCache needs: a real redis-server with
//! `--tls-port` and a certificate for `localhost` signed by a test CA,
//! `--requirepass` and an ACL user.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use redis::AsyncCommands;
use support::{raw, Proxy, RedisServer};

struct Certs {
    dir: std::path::PathBuf,
}

impl Certs {
    fn new() -> Certs {
        // One directory per test: tests run in parallel and each removes its own.
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sidecache-tls-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "sidecache test CA");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.join("server.key"), key.serialize_pem()).unwrap();
        Certs { dir }
    }

    fn path(&self, f: &str) -> String {
        self.dir.join(f).to_str().unwrap().to_owned()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tls_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A redis-server with TLS on `port` (certificates from `certs`) plus `extra`
/// arguments; its plain port serves only the harness's readiness check.
fn tls_server(certs: &Certs, port: u16, extra: &[&str]) -> RedisServer {
    let p = port.to_string();
    let (cert, key, ca) = (
        certs.path("server.pem"),
        certs.path("server.key"),
        certs.path("ca.pem"),
    );
    let mut args = vec![
        "--tls-port",
        &p,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-ca-cert-file",
        &ca,
        "--tls-auth-clients",
        "no",
    ];
    args.extend_from_slice(extra);
    RedisServer::start(&args)
}

#[tokio::test]
async fn tls_with_password_and_acl_user() {
    let certs = Certs::new();
    let port = tls_port();
    let redis = tls_server(
        &certs,
        port,
        &[
            "--requirepass",
            "pw",
            "--user",
            "app",
            "on",
            ">apppass",
            "~*",
            "&*",
            "+@all",
        ],
    );
    let ca = certs.path("ca.pem");
    // Password (default user), certificate checked against "localhost".
    let proxy = Proxy::start(
        &format!("rediss://:pw@localhost:{port}"),
        &["--tls-ca-file", &ca],
    )
    .await;
    let mut c = proxy.conn().await;
    let _: () = c.set("tls-key", "secret-value").await.unwrap();
    let v: String = c.get("tls-key").await.unwrap();
    assert_eq!(v, "secret-value");
    // RESP3 connections authenticate through HELLO 3 AUTH.
    let out = raw(&proxy.addr.to_string(), b"HELLO 3\r\nGET tls-key\r\n", 2).await;
    assert!(out.ends_with(b"$12\r\nsecret-value\r\n"));
    proxy.stop().await;
    // ACL user and password.
    let proxy = Proxy::start(
        &format!("rediss://app:apppass@localhost:{port}"),
        &["--tls-ca-file", &ca],
    )
    .await;
    let mut c = proxy.conn().await;
    let v: String = c.get("tls-key").await.unwrap();
    assert_eq!(v, "secret-value");
    let who: String = redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(who, "app");
    proxy.stop().await;
    drop(redis);
}

#[tokio::test]
async fn bad_certificate_or_password_fails_at_start() {
    let certs = Certs::new();
    let port = tls_port();
    let _redis = tls_server(&certs, port, &["--requirepass", "pw"]);
    let start = |url: String, extra: Vec<String>| async move {
        let mut args = vec![
            "sidecache".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--upstream".into(),
            url,
        ];
        args.extend(extra);
        let cfg = sidecache::Config::from_options(
            <sidecache::Options as clap::Parser>::try_parse_from(args).unwrap(),
        )
        .unwrap();
        sidecache::prepare(cfg)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let ca = certs.path("ca.pem");
    // Unknown CA: the certificate is rejected.
    let e = start(format!("rediss://:pw@localhost:{port}"), vec![])
        .await
        .unwrap_err();
    assert!(e.contains("unreachable"), "{e}");
    // Host name not in the certificate: rejected.
    let e = start(
        format!("rediss://:pw@127.0.0.1:{port}"),
        vec!["--tls-ca-file".into(), ca.clone()],
    )
    .await
    .unwrap_err();
    assert!(e.contains("unreachable"), "{e}");
    // Wrong password: the handshake error names the server's reply.
    let e = start(
        format!("rediss://:wrong@localhost:{port}"),
        vec!["--tls-ca-file".into(), ca.clone()],
    )
    .await
    .unwrap_err();
    assert!(e.contains("WRONGPASS"), "{e}");
    // Right everything works.
    start(
        format!("rediss://:pw@localhost:{port}"),
        vec!["--tls-ca-file".into(), ca],
    )
    .await
    .unwrap();
}
