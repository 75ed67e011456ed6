//! Validating how sidecache authenticates upstream: the password of the
//! `--upstream` URL, `--upstream-iam` (an ElastiCache IAM token) or
//! `--upstream-password-file`, with `--upstream-auth-refresh` and
//! `--upstream-reauth-interval`. The rotating sources themselves are in
//! `crate::credentials`.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sidecache_pool::auth::{self, RotatingSecret};
use sidecache_pool::UpstreamConfig;

use super::{err, secs, ConfigError, Options};
use crate::credentials::file::PasswordFile;
use crate::credentials::iam::{IamToken, TokenRequest, TOKEN_LIFETIME};

/// ElastiCache closes an IAM-authenticated connection this long after its
/// last authentication.
const IAM_CONNECTION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// How upstream connections authenticate, as shown in the start-up line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum UpstreamAuth {
    /// The `--upstream` URL's password, if any.
    #[default]
    Url,
    /// `--upstream-iam`.
    Iam {
        /// The token's request: cache, user, serverless.
        req: TokenRequest,
        /// `--upstream-iam-region` (`None`: the AWS chain's).
        region: Option<String>,
    },
    /// `--upstream-password-file`.
    PasswordFile(PathBuf),
}

impl fmt::Display for UpstreamAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamAuth::Url => f.write_str("url"),
            UpstreamAuth::Iam { req, region } => write!(
                f,
                "iam(cache={} user={} serverless={} region={})",
                req.cache,
                req.user,
                req.serverless,
                region.as_deref().unwrap_or("<aws chain>")
            ),
            UpstreamAuth::PasswordFile(p) => write!(f, "password-file({})", p.display()),
        }
    }
}

/// The user and whether a password is given, for each `--upstream` URL.
fn url_users(o: &Options) -> Result<Vec<(Option<String>, bool)>, ConfigError> {
    o.upstream
        .iter()
        .map(|u| {
            let url = url::Url::parse(u.trim()).map_err(|e| err("--upstream", e.to_string()))?;
            let user = (!url.username().is_empty()).then(|| {
                url::form_urlencoded::parse(format!("x={}", url.username()).as_bytes())
                    .next()
                    .map(|(_, v)| v.into_owned())
                    .unwrap_or_default()
            });
            Ok((user, url.password().is_some()))
        })
        .collect()
}

/// Applies the authentication options to `upstream` (whose seeds are
/// parsed already) and says which one is in use.
pub(super) fn credentials(
    o: &Options,
    upstream: &mut UpstreamConfig,
) -> Result<UpstreamAuth, ConfigError> {
    let iam = o.upstream_iam.unwrap_or(false);
    if !iam {
        for (key, given) in [
            ("--upstream-iam-cache", o.upstream_iam_cache.is_some()),
            ("--upstream-iam-region", o.upstream_iam_region.is_some()),
            ("--upstream-iam-user", o.upstream_iam_user.is_some()),
            (
                "--upstream-iam-serverless",
                o.upstream_iam_serverless == Some(true),
            ),
        ] {
            if given {
                return Err(err(key, "needs --upstream-iam"));
            }
        }
    }
    let file = o.upstream_password_file.clone();
    if !iam && file.is_none() {
        for (key, given) in [
            ("--upstream-auth-refresh", o.upstream_auth_refresh.is_some()),
            (
                "--upstream-reauth-interval",
                o.upstream_reauth_interval.is_some(),
            ),
        ] {
            if given {
                return Err(err(key, "needs --upstream-iam or --upstream-password-file"));
            }
        }
        return Ok(UpstreamAuth::Url);
    }
    if iam && file.is_some() {
        return Err(err(
            "--upstream-password-file",
            "cannot be used with --upstream-iam (the IAM token is the password)",
        ));
    }
    let flag = if iam {
        "--upstream-iam"
    } else {
        "--upstream-password-file"
    };
    let users = url_users(o)?;
    if users.iter().any(|(_, password)| *password) {
        return Err(err(
            "--upstream",
            format!(
                "no password in the URL with {flag} (write the user alone: rediss://USER@host:6379)"
            ),
        ));
    }
    let url_user = users.into_iter().find_map(|(u, _)| u);
    // `redis://USER@host` parses as a legacy password: it is the user here.
    for seed in &mut upstream.seeds {
        seed.credentials = None;
    }
    let refresh = secs(
        "--upstream-auth-refresh",
        o.upstream_auth_refresh,
        auth::DEFAULT_REFRESH.as_secs_f64(),
    )?;
    let reauth = match o.upstream_reauth_interval {
        Some(0.0) => None,
        v => Some(secs(
            "--upstream-reauth-interval",
            v,
            auth::DEFAULT_REAUTH_INTERVAL.as_secs_f64(),
        )?),
    };
    let (source, username, shown): (Arc<dyn auth::SecretSource>, _, _) = if iam {
        let cache = o
            .upstream_iam_cache
            .clone()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                err(
                "--upstream-iam-cache",
                "required with --upstream-iam: the replication group id or serverless cache name",
            )
            })?;
        let user = o.upstream_iam_user.clone().or(url_user).ok_or_else(|| {
            err(
                "--upstream-iam-user",
                "required with --upstream-iam (or a user in the --upstream URL: rediss://USER@host:6379)",
            )
        })?;
        if upstream.seeds.iter().any(|s| !s.tls) {
            return Err(err(
                "--upstream",
                "--upstream-iam needs rediss:// (ElastiCache accepts IAM only with in-transit encryption)",
            ));
        }
        if refresh >= TOKEN_LIFETIME {
            return Err(err(
                "--upstream-auth-refresh",
                "must be under 900 seconds with --upstream-iam (a token lives 15 minutes)",
            ));
        }
        if reauth.is_some_and(|r| r >= IAM_CONNECTION_LIFETIME) {
            return Err(err(
                "--upstream-reauth-interval",
                "must be under 43200 seconds with --upstream-iam (ElastiCache closes a connection 12 hours after its last AUTH)",
            ));
        }
        let req = TokenRequest {
            cache,
            user: user.clone(),
            serverless: o.upstream_iam_serverless.unwrap_or(false),
        };
        let region = o.upstream_iam_region.clone();
        (
            Arc::new(IamToken::new(req.clone(), region.clone())),
            Some(user),
            UpstreamAuth::Iam { req, region },
        )
    } else {
        let path = file.unwrap_or_default();
        (
            Arc::new(PasswordFile::new(path.clone())),
            url_user,
            UpstreamAuth::PasswordFile(path),
        )
    };
    upstream.secret = Some(RotatingSecret {
        source,
        username,
        refresh,
    });
    upstream.reauth_interval = reauth;
    Ok(shown)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::{Config, Options};
    use clap::Parser;
    use std::time::Duration;

    fn opts(args: &[&str]) -> Options {
        Options::try_parse_from(std::iter::once("sidecache").chain(args.iter().copied()))
            .expect("valid flags")
    }

    #[test]
    fn upstream_iam_options() {
        let c = Config::from_options(opts(&[
            "--upstream",
            "rediss://app-user@master.my-cache.abc.use1.cache.amazonaws.com:6379",
            "--upstream-iam",
            "--upstream-iam-cache",
            "my-cache",
            "--upstream-iam-region",
            "us-east-1",
        ]))
        .expect("valid");
        let secret = c.upstream.secret.as_ref().expect("rotating");
        assert_eq!(secret.username.as_deref(), Some("app-user"));
        assert_eq!(secret.refresh, sidecache_pool::auth::DEFAULT_REFRESH);
        assert_eq!(
            c.upstream.reauth_interval,
            Some(sidecache_pool::auth::DEFAULT_REAUTH_INTERVAL)
        );
        // The URL's user is the IAM user, never sent as a password.
        assert!(c.upstream.seeds[0].credentials.is_none());
        let line = c.redacted();
        assert!(
            line.contains(
                "upstream_auth=iam(cache=my-cache user=app-user serverless=false region=us-east-1)"
            ),
            "{line}"
        );
        // The user flag wins; serverless as a switch; env-style values.
        let c = Config::from_options(opts(&[
            "--upstream",
            "rediss://cache.serverless.use1.cache.amazonaws.com:6379",
            "--upstream-iam=yes",
            "--upstream-iam-cache",
            "my-serverless",
            "--upstream-iam-user",
            "other",
            "--upstream-iam-serverless",
            "--upstream-reauth-interval",
            "0",
        ]))
        .expect("valid");
        assert_eq!(
            c.upstream
                .secret
                .as_ref()
                .and_then(|s| s.username.as_deref()),
            Some("other")
        );
        assert_eq!(c.upstream.reauth_interval, None);
        assert!(c.redacted().contains("serverless=true"));
    }

    #[test]
    fn upstream_iam_errors_name_the_flag() {
        let bad = |args: &[&str]| Config::from_options(opts(args)).expect_err("invalid").key;
        let url = "rediss://app@h:6379";
        assert_eq!(
            bad(&["--upstream", url, "--upstream-iam"]),
            "--upstream-iam-cache"
        );
        assert_eq!(
            bad(&[
                "--upstream",
                "rediss://h:6379",
                "--upstream-iam",
                "--upstream-iam-cache",
                "c"
            ]),
            "--upstream-iam-user"
        );
        assert_eq!(
            bad(&[
                "--upstream",
                "rediss://app:pw@h:6379",
                "--upstream-iam",
                "--upstream-iam-cache",
                "c"
            ]),
            "--upstream"
        );
        assert_eq!(
            bad(&[
                "--upstream",
                "redis://app@h",
                "--upstream-iam",
                "--upstream-iam-cache",
                "c"
            ]),
            "--upstream"
        );
        assert_eq!(
            bad(&["--upstream", url, "--upstream-iam-cache", "c"]),
            "--upstream-iam-cache"
        );
        assert_eq!(
            bad(&["--upstream", url, "--upstream-iam-serverless"]),
            "--upstream-iam-serverless"
        );
        let iam = [
            "--upstream",
            url,
            "--upstream-iam",
            "--upstream-iam-cache",
            "c",
        ];
        let with = |more: &[&'static str]| {
            let mut v = iam.to_vec();
            v.extend_from_slice(more);
            bad(&v)
        };
        assert_eq!(
            with(&["--upstream-auth-refresh", "900"]),
            "--upstream-auth-refresh"
        );
        assert_eq!(
            with(&["--upstream-reauth-interval", "43200"]),
            "--upstream-reauth-interval"
        );
        assert_eq!(
            with(&["--upstream-password-file", "/pw"]),
            "--upstream-password-file"
        );
        assert_eq!(
            bad(&["--upstream", url, "--upstream-reauth-interval", "60"]),
            "--upstream-reauth-interval"
        );
    }

    #[test]
    fn upstream_password_file() {
        let c = Config::from_options(opts(&[
            "--upstream",
            "redis://app@127.0.0.1:6379",
            "--upstream-password-file",
            "/run/secrets/redis",
            "--upstream-auth-refresh",
            "2",
            "--upstream-reauth-interval",
            "3",
        ]))
        .expect("valid");
        let secret = c.upstream.secret.as_ref().expect("rotating");
        assert_eq!(secret.username.as_deref(), Some("app"));
        assert_eq!(secret.refresh, Duration::from_secs(2));
        assert_eq!(c.upstream.reauth_interval, Some(Duration::from_secs(3)));
        assert!(c.redacted().contains("password-file(/run/secrets/redis)"));
        let e = Config::from_options(opts(&[
            "--upstream",
            "redis://:pw@127.0.0.1:6379",
            "--upstream-password-file",
            "/pw",
        ]))
        .expect_err("password twice");
        assert_eq!(e.key, "--upstream");
    }

    #[test]
    fn upstream_iam_from_a_file() {
        let o: Options = toml::from_str(
            "upstream = [\"rediss://app@h:6379\"]\nupstream_iam = true\nupstream_iam_cache = \"c\"\nupstream_iam_serverless = true\n",
        )
        .expect("toml");
        let c = Config::from_options(o).expect("valid");
        assert!(c
            .redacted()
            .contains("iam(cache=c user=app serverless=true"));
    }
}
