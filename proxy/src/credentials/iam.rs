//! `--upstream-iam`: ElastiCache (Redis OSS 7+, Valkey) IAM authentication.
//!
//! The password is a token: the SigV4-presigned URL of
//! `GET http://{cache}/?Action=connect&User={user}` (plus
//! `&ResourceType=ServerlessCache` for a serverless cache), service
//! `elasticache`, valid 900 seconds, without its `http://`. Credentials come
//! from the standard AWS chain (`aws-config`: environment, web identity
//! token for EKS IRSA, EKS Pod Identity and ECS container credentials,
//! profiles, EC2 instance metadata); signing is `aws-sigv4`'s.
//!
//! A token only needs to be valid when a connection authenticates with
//! it; the pool fetches a new one every `--upstream-auth-refresh` (under
//! the 900 seconds) and sends it on live connections every
//! `--upstream-reauth-interval` (ElastiCache closes an IAM connection 12
//! hours after its last authentication).

use std::time::{Duration, SystemTime};

use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    sign, SignableBody, SignableRequest, SignatureLocation, SigningSettings,
};
use aws_sigv4::sign::v4;
use sidecache_pool::auth::{SecretFuture, SecretSource};
use tokio::sync::OnceCell;

/// How long a token is valid (the most ElastiCache accepts).
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(900);
/// The SigV4 service name.
const SERVICE: &str = "elasticache";

/// What a token is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    /// The replication group or serverless cache name (lower case).
    pub cache: String,
    /// The ElastiCache user id (the user has `authentication-mode iam`).
    pub user: String,
    /// A serverless cache (`ResourceType=ServerlessCache`).
    pub serverless: bool,
}

/// Signs the token for `req` in `region` with `creds` at `at`.
///
/// # Errors
/// The signer's error, as text.
pub fn presign(
    req: &TokenRequest,
    creds: &Credentials,
    region: &str,
    at: SystemTime,
) -> Result<String, String> {
    let mut url = url_for(req);
    let identity = creds.clone().into();
    let mut settings = SigningSettings::default();
    settings.signature_location = SignatureLocation::QueryParams;
    settings.expires_in = Some(TOKEN_LIFETIME);
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(SERVICE)
        .time(at)
        .settings(settings)
        .build()
        .map_err(|e| format!("IAM token: {e}"))?
        .into();
    let signable = SignableRequest::new("GET", &url, std::iter::empty(), SignableBody::Bytes(&[]))
        .map_err(|e| format!("IAM token: {e}"))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| format!("IAM token: {e}"))?
        .into_parts();
    let mut request = http::Request::builder()
        .method("GET")
        .uri(&url)
        .body(())
        .map_err(|e| format!("IAM token: {e}"))?;
    instructions.apply_to_request_http1x(&mut request);
    url = request.uri().to_string();
    Ok(url
        .strip_prefix("http://")
        .map_or(url.as_str(), |u| u)
        .to_owned())
}

/// The URL that is presigned.
fn url_for(req: &TokenRequest) -> String {
    let mut query = url_form(&[("Action", "connect"), ("User", &req.user)]);
    if req.serverless {
        query.push_str("&ResourceType=ServerlessCache");
    }
    format!("http://{}/?{query}", req.cache)
}

/// `k=v&k=v` with each value percent-encoded as SigV4 wants (unreserved
/// characters kept).
fn url_form(pairs: &[(&str, &str)]) -> String {
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        for b in v.bytes() {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                out.push(char::from(b));
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    out
}

/// Credentials that expire are asked for again when this close to it.
const CREDENTIALS_MARGIN: Duration = Duration::from_secs(300);

/// A [`SecretSource`] of IAM tokens from the AWS credential chain.
#[derive(Debug)]
pub struct IamToken {
    req: TokenRequest,
    region: Option<String>,
    chain: OnceCell<(SharedCredentialsProvider, String)>,
    /// The last credentials, while not near expiry: refreshes that come
    /// together (several connections refused at once) ask the chain (an
    /// STS call for IRSA) once. The lock also makes them wait for it.
    last: tokio::sync::Mutex<Option<Credentials>>,
}

impl IamToken {
    /// Tokens for `req`, in `region` (`None`: the chain's, e.g. `AWS_REGION`).
    pub fn new(req: TokenRequest, region: Option<String>) -> IamToken {
        IamToken {
            req,
            region,
            chain: OnceCell::new(),
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// The credential provider and region, loaded once.
    async fn chain(&self) -> Result<&(SharedCredentialsProvider, String), String> {
        self.chain
            .get_or_try_init(|| async {
                // The chain's HTTP client (STS for web identity, the
                // container and instance metadata endpoints) on rustls +
                // ring, as every other TLS connection of sidecache.
                let http = aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https();
                let mut loader =
                    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
                if let Some(r) = &self.region {
                    loader = loader.region(aws_config::Region::new(r.clone()));
                }
                let sdk = loader.load().await;
                let region = sdk.region().map(ToString::to_string).ok_or_else(|| {
                    "--upstream-iam: no AWS region (set --upstream-iam-region or AWS_REGION)"
                        .to_owned()
                })?;
                let provider = sdk
                    .credentials_provider()
                    .ok_or_else(|| "--upstream-iam: no AWS credential provider".to_owned())?;
                Ok((provider, region))
            })
            .await
    }

    /// A token signed now.
    ///
    /// # Errors
    /// No region, no credentials from the chain, or a signing error.
    pub async fn token(&self) -> Result<String, String> {
        let (provider, region) = self.chain().await?;
        let mut last = self.last.lock().await;
        let now = SystemTime::now();
        let fresh = last
            .as_ref()
            .filter(|c| c.expiry().is_some_and(|at| at > now + CREDENTIALS_MARGIN));
        let creds = match fresh {
            Some(c) => c.clone(),
            None => {
                let c = provider
                    .provide_credentials()
                    .await
                    .map_err(|e| format!("--upstream-iam: AWS credentials: {}", error_chain(&e)))?;
                *last = Some(c.clone());
                c
            }
        };
        drop(last);
        presign(&self.req, &creds, region, now)
    }
}

impl SecretSource for IamToken {
    fn fetch(&self) -> SecretFuture<'_> {
        Box::pin(self.token())
    }
}

/// `sidecache iam-token`: one token, signed now.
///
/// # Errors
/// As [`IamToken::token`], or when the chain does not answer in 30 seconds.
pub fn cli(request: TokenRequest, region: Option<String>) -> Result<String, String> {
    let source = IamToken::new(request, region);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), source.token())
            .await
            .map_err(|_| "the AWS credential chain did not answer in 30 seconds".to_owned())?
    })
}

/// An error with its sources, on one line.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// 2026-12-03T14:00:00Z.
    fn fixed_time() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_306_400)
    }

    /// The query parameters of a token, sorted (the order of parameters
    /// in a presigned URL is free; the signature covers their sorted set).
    fn parts(token: &str) -> (String, Vec<String>) {
        let (base, query) = token.split_once('?').unwrap();
        let mut q: Vec<String> = query.split('&').map(str::to_owned).collect();
        q.sort();
        (base.to_owned(), q)
    }

    // The known-good tokens below were made by botocore 1.43.11, an
    // independent SigV4 implementation (the one the AWS documentation's
    // Python sample for ElastiCache IAM uses), with `pip install botocore`
    // and this script:
    //
    //   import datetime
    //   from unittest import mock
    //   import botocore.auth, botocore.session
    //   from botocore.model import ServiceId
    //   from botocore.signers import RequestSigner
    //   from botocore.credentials import Credentials
    //   def token(cache, user, region, serverless, key, secret, session_token):
    //       creds = Credentials(key, secret, session_token)
    //       signer = RequestSigner(ServiceId("elasticache"), region, "elasticache", "v4",
    //           creds, botocore.session.get_session().get_component("event_emitter"))
    //       q = f"Action=connect&User={user}" + ("&ResourceType=ServerlessCache" if serverless else "")
    //       req = {"method": "GET", "url": f"http://{cache}/?{q}", "body": {}, "headers": {}, "context": {}}
    //       fixed = datetime.datetime(2026, 12, 3, 14, 0, 0, tzinfo=datetime.timezone.utc)
    //       with mock.patch("botocore.auth.get_current_datetime", return_value=fixed):
    //           url = signer.generate_presigned_url(req, operation_name="connect",
    //               expires_in=900, region_name=region)
    //       return url.removeprefix("http://")
    //   print(token("my-cache", "app-user", "us-east-1", False, "AKIDEXAMPLE",
    //       "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None))
    //   print(token("my-serverless", "app-user", "eu-west-2", True, "ASIAEXAMPLE",
    //       "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "FwoGZXIvYXdzEXAMPLE//token+with/slashes="))
    const BOTOCORE_REPLICATION_GROUP: &str = "my-cache/?Action=connect&User=app-user&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20261203%2Fus-east-1%2Felasticache%2Faws4_request&X-Amz-Date=20261203T140000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Signature=ab6bf5eac8589dec505c19a7c9f0442b05bd232cd74c4f5fe77ec4af327b733e";
    const BOTOCORE_SERVERLESS: &str = "my-serverless/?Action=connect&User=app-user&ResourceType=ServerlessCache&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=ASIAEXAMPLE%2F20261203%2Feu-west-2%2Felasticache%2Faws4_request&X-Amz-Date=20261203T140000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Security-Token=FwoGZXIvYXdzEXAMPLE%2F%2Ftoken%2Bwith%2Fslashes%3D&X-Amz-Signature=9360f256d1213608b0a3674a1b8f70e4d9e27ffc6fcc352338b2f0cfc47f8161";

    #[test]
    fn signs_as_botocore_for_a_replication_group() {
        let creds = Credentials::new(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
            None,
            "test",
        );
        let req = TokenRequest {
            cache: "my-cache".into(),
            user: "app-user".into(),
            serverless: false,
        };
        let token = presign(&req, &creds, "us-east-1", fixed_time()).unwrap();
        assert!(!token.starts_with("http"), "{token}");
        assert_eq!(parts(&token), parts(BOTOCORE_REPLICATION_GROUP), "{token}");
    }

    #[test]
    fn signs_as_botocore_for_a_serverless_cache_with_a_session_token() {
        let creds = Credentials::new(
            "ASIAEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            Some("FwoGZXIvYXdzEXAMPLE//token+with/slashes=".into()),
            None,
            "test",
        );
        let req = TokenRequest {
            cache: "my-serverless".into(),
            user: "app-user".into(),
            serverless: true,
        };
        let token = presign(&req, &creds, "eu-west-2", fixed_time()).unwrap();
        assert_eq!(parts(&token), parts(BOTOCORE_SERVERLESS), "{token}");
    }

    #[test]
    fn user_ids_are_percent_encoded() {
        let req = TokenRequest {
            cache: "c".into(),
            user: "a b/c".into(),
            serverless: false,
        };
        assert_eq!(url_for(&req), "http://c/?Action=connect&User=a%20b%2Fc");
    }
}
