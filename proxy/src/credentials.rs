//! Where a rotating upstream secret comes from: an ElastiCache IAM token
//! signed with the AWS credential chain ([`iam`], `--upstream-iam`), or a
//! file read again on every refresh ([`file`], `--upstream-password-file`).
//!
//! Both implement the pool's [`sidecache_pool::SecretSource`]; the pool
//! caches the secret, refreshes it every `--upstream-auth-refresh` and
//! re-authenticates live connections (`pool/src/auth.rs`). This module
//! does not own any connection.

pub mod file;
pub mod iam;
