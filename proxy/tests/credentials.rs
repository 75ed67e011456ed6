//! Rotating upstream credentials: `--upstream-password-file` (the same
//! refresh and re-authentication path `--upstream-iam` takes, without AWS)
//! rotated under load, with no client error; and the AWS credential chain
//! (environment, shared credentials file) feeding `sidecache iam-token`,
//! without network.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use support::{info_field, temp_dir, upstream_calls, Proxy, RedisServer};

/// Writes the password file as a Kubernetes Secret volume changes it: a
/// new file renamed over the old one, so a reader never sees half of it.
fn write_secret(path: &Path, password: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{password}\n")).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

async fn acl(d: &mut MultiplexedConnection, args: &[&str]) {
    let _: () = redis::cmd("ACL").arg(args).query_async(d).await.unwrap();
}

/// ACL LOG entries of refused authentications of `user`.
async fn auth_failures(d: &mut MultiplexedConnection, user: &str) -> usize {
    let log: Vec<Vec<redis::Value>> = redis::cmd("ACL")
        .arg(&["LOG", "1000"])
        .query_async(d)
        .await
        .unwrap();
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        _ => String::new(),
    };
    log.iter()
        .filter(|entry| {
            let field = |name: &str| {
                entry
                    .chunks(2)
                    .find(|kv| text(&kv[0]) == name)
                    .map(|kv| text(&kv[1]))
            };
            field("reason").as_deref() == Some("auth") && field("username").as_deref() == Some(user)
        })
        .count()
}

async fn coherence_info(c: &mut MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg("coherence")
        .query_async(c)
        .await
        .unwrap()
}

async fn proxy_info(c: &mut MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg("proxy")
        .query_async(c)
        .await
        .unwrap()
}

/// The load: write-behind SETs, GETs (L1 hits and fills on the tracking
/// connections), forwarded INCRs, and (`watch`) WATCH/MULTI/EXEC on held
/// connections, in database `db`; every error is kept.
fn load(
    proxy: &Proxy,
    db: u16,
    watch: bool,
    tag: &str,
    stop: Arc<AtomicBool>,
    ops: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    let url = format!("{}/{db}", proxy.url());
    let tag = tag.to_owned();
    tokio::spawn(async move {
        let client = redis::Client::open(url).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let mut i: u64 = 0;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("{tag}:{}", i % 50);
            let r: redis::RedisResult<()> = async {
                let _: () = redis::cmd("SET")
                    .arg(&key)
                    .arg(i)
                    .query_async(&mut c)
                    .await?;
                let v: u64 = redis::cmd("GET").arg(&key).query_async(&mut c).await?;
                assert_eq!(v, i, "read-your-writes");
                let _: i64 = redis::cmd("INCR")
                    .arg(format!("{tag}:n"))
                    .query_async(&mut c)
                    .await?;
                if watch && i.is_multiple_of(10) {
                    let _: () = redis::cmd("WATCH").arg(&key).query_async(&mut c).await?;
                    let _: () = redis::cmd("MULTI").query_async(&mut c).await?;
                    let _: () = redis::cmd("SET")
                        .arg(&key)
                        .arg(i)
                        .query_async(&mut c)
                        .await?;
                    let _: Vec<redis::Value> = redis::cmd("EXEC").query_async(&mut c).await?;
                }
                Ok(())
            }
            .await;
            if let Err(e) = r {
                errors.lock().unwrap().push(format!("{tag} #{i}: {e}"));
            }
            ops.fetch_add(1, Ordering::Relaxed);
            i += 1;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_file_rotates_under_load_without_client_errors() {
    let redis = RedisServer::start(&[]);
    let mut d = redis.conn().await;
    acl(
        &mut d,
        &["SETUSER", "app", "on", ">pw0", "~*", "&*", "+@all"],
    )
    .await;
    let dir = temp_dir("credentials");
    let secret = dir.join("password");
    write_secret(&secret, "pw0");
    let proxy = Proxy::start(
        &format!("redis://app@{}", redis.addr()),
        &[
            "--upstream-password-file",
            secret.to_str().unwrap(),
            "--upstream-auth-refresh",
            "0.2",
            "--upstream-reauth-interval",
            "0.5",
        ],
    )
    .await;
    let mut c = proxy.conn().await;
    let auth_before = upstream_calls(&redis, "auth").await;

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut tasks: Vec<_> = (0..3)
        .map(|t| {
            load(
                &proxy,
                0,
                true,
                &format!("a{t}"),
                Arc::clone(&stop),
                Arc::clone(&ops),
                Arc::clone(&errors),
            )
        })
        .collect();
    // Three rotations as a secret store does them: the new password is
    // added, the file changes, and once every connection had time to
    // re-authenticate the old password is removed.
    for n in 1..=3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (old, new) = (format!("pw{}", n - 1), format!("pw{n}"));
        acl(&mut d, &["SETUSER", "app", &format!(">{new}")]).await;
        write_secret(&secret, &new);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        acl(&mut d, &["SETUSER", "app", &format!("<{old}")]).await;
        if n == 1 {
            // Connections opened after the first swap (database 1 has
            // none yet: shared, tracking and write-behind ones are made
            // on first use) authenticate with the new secret only.
            tasks.push(load(
                &proxy,
                1,
                true,
                "b",
                Arc::clone(&stop),
                Arc::clone(&ops),
                Arc::clone(&errors),
            ));
        }
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    let ops = ops.load(Ordering::Relaxed);
    assert!(
        errors.is_empty(),
        "{} errors in {ops} rounds: {errors:?}",
        errors.len()
    );
    assert!(ops > 100, "too little load: {ops} rounds");

    let info = proxy_info(&mut c).await;
    assert!(info.contains("upstream_auth:password-file\r\n"), "{info}");
    let reauths = info_field(&info, "upstream_reauths");
    // Every connection re-authenticates every 0.5 s over ~7 s.
    assert!(reauths >= 20, "{info}");
    assert_eq!(info_field(&info, "upstream_reauth_failures"), 0, "{info}");
    assert!(info_field(&info, "upstream_auth_refreshes") >= 20, "{info}");
    assert_eq!(
        info_field(&info, "upstream_auth_refresh_failures"),
        0,
        "{info}"
    );
    // The server saw them (AUTH on live connections; handshakes of RESP2
    // connections count too).
    let auth_calls = upstream_calls(&redis, "auth").await - auth_before;
    assert!(
        auth_calls >= reauths,
        "{auth_calls} AUTH calls, {reauths} reauths"
    );
    // No connection ever tried an outdated password.
    assert_eq!(auth_failures(&mut d, "app").await, 0);

    // Every connection of `app` dropped: the new ones authenticate with
    // the current password (pw3), and the L1 is not served stale.
    let losses = |info: &str| info_field(info, "tracking_channel_losses");
    let lost_before = losses(&coherence_info(&mut c).await);
    let _: () = redis::cmd("SET")
        .arg("a0:1")
        .arg("direct")
        .query_async(&mut d)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("CLIENT")
        .arg(&["KILL", "USER", "app"])
        .query_async(&mut d)
        .await
        .unwrap();
    // Until sidecache has read the end of its tracking connection (or the
    // SET's invalidation), its L1 may still answer with the value read
    // before the SET (invalidations arrive asynchronously: "Measured
    // staleness" in docs/coherence.md). The loss is counted once the L1
    // is cleared; a channel already down had it cleared then.
    let seen = Instant::now() + Duration::from_secs(2);
    while losses(&coherence_info(&mut c).await) == lost_before && Instant::now() < seen {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let value = loop {
        match redis::cmd("GET")
            .arg("a0:1")
            .query_async::<String>(&mut c)
            .await
        {
            Ok(v) => break v,
            Err(e) => assert!(Instant::now() < deadline, "no reconnect: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(value, "direct");
    let _: i64 = redis::cmd("INCR")
        .arg("after-kill")
        .query_async(&mut c)
        .await
        .unwrap();
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut d)
        .await
        .unwrap();
    assert!(clients.contains(" user=app "), "{clients}");
    assert_eq!(auth_failures(&mut d, "app").await, 0);
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sidecache iam-token` with a controlled environment: nothing of the
/// test machine's own AWS set-up is read, the instance metadata service
/// is never asked (no network, no hang).
fn iam_token(env: &[(&str, &str)], args: &[&str]) -> (bool, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_sidecache"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("HOME", "/nonexistent")
        .arg("iam-token")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let out = cmd.output().expect("run sidecache iam-token");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the chain hung"
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).trim().to_owned(),
    )
}

#[test]
fn iam_token_from_environment_credentials() {
    let (ok, token, err) = iam_token(
        &[
            ("AWS_ACCESS_KEY_ID", "AKIDENVEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secretenv"),
            ("AWS_SESSION_TOKEN", "sessionenv"),
            ("AWS_REGION", "eu-central-1"),
        ],
        &["--cache", "my-cache", "--user", "app"],
    );
    assert!(ok, "{err}");
    assert!(token.starts_with("my-cache/?"), "{token}");
    assert!(token.contains("Action=connect"), "{token}");
    assert!(token.contains("User=app"), "{token}");
    assert!(
        token.contains("X-Amz-Credential=AKIDENVEXAMPLE%2F"),
        "{token}"
    );
    assert!(
        token.contains("%2Feu-central-1%2Felasticache%2Faws4_request"),
        "{token}"
    );
    assert!(token.contains("X-Amz-Security-Token=sessionenv"), "{token}");
    assert!(token.contains("X-Amz-Expires=900"), "{token}");
    assert!(!token.contains("ResourceType"), "{token}");
}

#[test]
fn iam_token_from_a_shared_credentials_file() {
    let dir = temp_dir("aws-profile");
    let creds = dir.join("credentials");
    std::fs::write(
        &creds,
        "[default]\naws_access_key_id = AKIDFILEEXAMPLE\naws_secret_access_key = secretfile\n\n[other]\naws_access_key_id = AKIDOTHER\naws_secret_access_key = secretother\n",
    )
    .unwrap();
    let config = dir.join("config");
    std::fs::write(&config, "[default]\nregion = ap-southeast-2\n").unwrap();
    let files = [
        ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
        ("AWS_CONFIG_FILE", config.to_str().unwrap()),
    ];
    // The region from the config file, the serverless resource type.
    let (ok, token, err) = iam_token(
        &files,
        &["--cache", "my-serverless", "--user", "app", "--serverless"],
    );
    assert!(ok, "{err}");
    assert!(
        token.contains("X-Amz-Credential=AKIDFILEEXAMPLE%2F"),
        "{token}"
    );
    assert!(token.contains("%2Fap-southeast-2%2F"), "{token}");
    assert!(token.contains("ResourceType=ServerlessCache"), "{token}");
    assert!(!token.contains("X-Amz-Security-Token"), "{token}");
    // AWS_PROFILE picks another profile; --region wins over the file.
    let mut with_profile = files.to_vec();
    with_profile.push(("AWS_PROFILE", "other"));
    let (ok, token, err) = iam_token(
        &with_profile,
        &["--cache", "c", "--user", "app", "--region", "us-west-2"],
    );
    assert!(ok, "{err}");
    assert!(token.contains("X-Amz-Credential=AKIDOTHER%2F"), "{token}");
    assert!(token.contains("%2Fus-west-2%2F"), "{token}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn iam_token_without_credentials_fails_and_says_why() {
    let (ok, _, err) = iam_token(
        &[("AWS_REGION", "us-east-1")],
        &["--cache", "c", "--user", "app"],
    );
    assert!(!ok);
    assert!(err.contains("AWS credentials"), "{err}");
    let (ok, _, err) = iam_token(
        &[
            ("AWS_ACCESS_KEY_ID", "AKID"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
        ],
        &["--cache", "c", "--user", "app"],
    );
    assert!(!ok);
    assert!(err.contains("no AWS region"), "{err}");
}

/// The secret rotates with no overlap (the old password is gone from the
/// server at once) and sidecache has not fetched it yet: each live
/// connection's next AUTH is refused, so the connection is replaced, and
/// its new handshake, refused too, fetches the secret and succeeds. No
/// request fails meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_reauth_replaces_connections_without_client_errors() {
    let redis = RedisServer::start(&[]);
    let mut d = redis.conn().await;
    acl(
        &mut d,
        &["SETUSER", "app", "on", ">pw0", "~*", "&*", "+@all"],
    )
    .await;
    let dir = temp_dir("credentials-refused");
    let secret = dir.join("password");
    write_secret(&secret, "pw0");
    let proxy = Proxy::start(
        &format!("redis://app@{}", redis.addr()),
        &[
            "--upstream-password-file",
            secret.to_str().unwrap(),
            // Not refreshed on schedule during the test: only refusals
            // make sidecache read the file again.
            "--upstream-auth-refresh",
            "600",
            "--upstream-reauth-interval",
            "0.5",
        ],
    )
    .await;
    let mut c = proxy.conn().await;
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..3)
        .map(|t| {
            // No held connections: a new connection refused after the
            // swap would fetch the secret before any re-authentication
            // could be refused.
            load(
                &proxy,
                0,
                false,
                &format!("r{t}"),
                Arc::clone(&stop),
                Arc::clone(&ops),
                Arc::clone(&errors),
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    write_secret(&secret, "pw1");
    acl(&mut d, &["SETUSER", "app", "resetpass", ">pw1"]).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let errors = errors.lock().unwrap().clone();
    let ops = ops.load(Ordering::Relaxed);
    assert!(
        errors.is_empty(),
        "{} errors in {ops} rounds: {errors:?}",
        errors.len()
    );
    assert!(ops > 50, "too little load: {ops} rounds");
    let info = proxy_info(&mut c).await;
    assert!(info_field(&info, "upstream_reauth_failures") >= 1, "{info}");
    // After the replacements, live connections re-authenticate again.
    let failures = info_field(&info, "upstream_reauth_failures");
    let reauths = info_field(&info, "upstream_reauths");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let info = proxy_info(&mut c).await;
    assert_eq!(
        info_field(&info, "upstream_reauth_failures"),
        failures,
        "{info}"
    );
    assert!(info_field(&info, "upstream_reauths") > reauths, "{info}");
    assert!(info_field(&info, "upstream_auth_refreshes") >= 2, "{info}");
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where the upstream refuses CLIENT TRACKING, the peer invalidation
/// channel (a subscribed RESP3 connection) re-authenticates too, and stays
/// up: no L1 clear for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_channel_reauthenticates_while_subscribed() {
    let redis = RedisServer::start(&[]);
    let mut d = redis.conn().await;
    acl(
        &mut d,
        &[
            "SETUSER",
            "app",
            "on",
            ">pw0",
            "~*",
            "&*",
            "+@all",
            "-client|tracking",
        ],
    )
    .await;
    let dir = temp_dir("credentials-peer");
    let secret = dir.join("password");
    write_secret(&secret, "pw0");
    let proxy = Proxy::start(
        &format!("redis://app@{}", redis.addr()),
        &[
            "--upstream-password-file",
            secret.to_str().unwrap(),
            "--upstream-auth-refresh",
            "0.2",
            "--upstream-reauth-interval",
            "0.3",
        ],
    )
    .await;
    let mut c = proxy.conn().await;
    let coherence = |c: &mut MultiplexedConnection| {
        let mut c = c.clone();
        async move {
            redis::cmd("INFO")
                .arg("coherence")
                .query_async::<String>(&mut c)
                .await
                .unwrap()
        }
    };
    let before = coherence(&mut c).await;
    assert_eq!(info_field(&before, "peer_channel_up"), 1, "{before}");
    acl(&mut d, &["SETUSER", "app", ">pw1"]).await;
    write_secret(&secret, "pw1");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    acl(&mut d, &["SETUSER", "app", "<pw0"]).await;
    // The subscribed connection's last command, as the server lists it,
    // is seen to be an AUTH (between its heartbeat PINGs).
    let mut seen_auth = false;
    let until = Instant::now() + Duration::from_millis(1500);
    while Instant::now() < until {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut d)
            .await
            .unwrap();
        seen_auth |= clients
            .lines()
            .any(|l| l.contains(" user=app ") && l.contains(" sub=1 ") && l.contains(" cmd=auth "));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen_auth, "the peer channel never re-authenticated");
    let after = coherence(&mut c).await;
    assert_eq!(info_field(&after, "peer_channel_up"), 1, "{after}");
    assert_eq!(
        info_field(&after, "tracking_channel_losses"),
        info_field(&before, "tracking_channel_losses"),
        "{after}"
    );
    let info = proxy_info(&mut c).await;
    assert!(info_field(&info, "upstream_reauths") >= 5, "{info}");
    assert_eq!(info_field(&info, "upstream_reauth_failures"), 0, "{info}");
    assert_eq!(auth_failures(&mut d, "app").await, 0);
    proxy.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}
