//! Clients authenticated as an ACL user other than the `--upstream` one
//! (issue #32): the registry of those users' connection pools, shared by
//! every connection, and the rule deciding which credentials only the
//! upstream can check.
//!
//! Owns: which (user, password) has a pool, the bounds (`--acl-max-users`
//! users at once, `--acl-user-connections` connections each), the pool's
//! life (made at a user's first AUTH, dropped with its last client, so
//! its idle connections close then), and the counters. Not: sending
//! commands on those connections (`sidecache_pool::Upstream::submit_as`,
//! used by `connection/flush.rs`), nor the AUTH and HELLO replies
//! (`answer.rs`).
//!
//! A pool is per user *and password*: each AUTH is checked upstream on a
//! fresh connection of that pool (so a password removed since, or a user
//! disabled, is refused as Redis would), and the connection is kept for
//! the client's first command.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sidecache_pool::{Credentials, SessionPool, Upstream};

/// Pools by (user, password), with their clients' logins.
type Map = HashMap<(String, String), (Arc<SessionPool>, usize)>;

/// The pools, and the counts of the pools already dropped.
#[derive(Debug, Default)]
struct Registry {
    map: Mutex<Map>,
    /// Connections opened by pools dropped since.
    opened: AtomicU64,
    /// Checkouts refused (pool full) by pools dropped since.
    refusals: AtomicU64,
}

/// Counters of ACL-user logins.
#[derive(Debug, Default)]
pub struct UserStats {
    /// AUTH / HELLO AUTH checked upstream and accepted.
    pub logins: AtomicU64,
    /// AUTH / HELLO AUTH refused (by upstream: `WRONGPASS …`, or by the
    /// `--acl-max-users` bound).
    pub auth_failures: AtomicU64,
    /// Logins refused because `--acl-max-users` users had pools already.
    pub user_refusals: AtomicU64,
}

/// The pools of the ACL users clients authenticated as.
#[derive(Debug)]
pub struct Users {
    max_users: usize,
    per_user: usize,
    reg: Arc<Registry>,
    /// Counters.
    pub stats: UserStats,
}

/// One client's login as an ACL user: its pool, released when the client
/// logs out (RESET, AUTH again, disconnect). The last login of a pool
/// removes it from the registry.
pub struct Login {
    key: (String, String),
    pool: Arc<SessionPool>,
    reg: Arc<Registry>,
}

impl std::fmt::Debug for Login {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Login").field("user", &self.key.0).finish()
    }
}

impl Login {
    /// The user's connections.
    pub fn pool(&self) -> &Arc<SessionPool> {
        &self.pool
    }

    /// The user's name.
    pub fn user(&self) -> &str {
        &self.key.0
    }
}

impl Drop for Login {
    fn drop(&mut self) {
        let mut map = self.reg.map.lock().unwrap_or_else(|p| p.into_inner());
        // Logins are counted under the lock: the last one removes the
        // pool (pipelines in flight keep it alive until they end), and
        // its idle connections close.
        if let Some((_, n)) = map.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                let st = &self.pool.stats;
                let reg = &self.reg;
                reg.opened
                    .fetch_add(st.opened.load(Ordering::Relaxed), Ordering::Relaxed);
                reg.refusals
                    .fetch_add(st.refusals.load(Ordering::Relaxed), Ordering::Relaxed);
                map.remove(&self.key);
            }
        }
    }
}

/// Where AUTH's credentials are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Checked here: `--requirepass`, as Redis's `default` user (or, with
    /// the feature off, today's answer).
    Local(Result<(), &'static str>),
    /// Only the upstream can tell: a handshake as that user.
    Upstream,
}

/// `-ERR AUTH <password> called without …` (no `--requirepass`).
pub const NOPASS: &str = "ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?";
/// Redis's refusal of a user and password.
pub const WRONGPASS: &str = "WRONGPASS invalid username-password pair or user is disabled.";

/// Decides where credentials are checked (pure): `AUTH pass` and `AUTH
/// default pass` against `--requirepass` (`requirepass`) as today; with
/// per-user connections on (`acl`), any other user, and `default` when
/// there is no `--requirepass`, upstream.
pub fn check(user: Option<&[u8]>, pass: &[u8], requirepass: Option<&str>, acl: bool) -> Check {
    match (requirepass, user) {
        (None, None) if acl => Check::Upstream,
        (None, None) => Check::Local(Err(NOPASS)),
        (Some(p), None) | (Some(p), Some(b"default")) => Check::Local(if p.as_bytes() == pass {
            Ok(())
        } else {
            Err(WRONGPASS)
        }),
        (_, Some(_)) if acl => Check::Upstream,
        (None, Some(b"default")) => Check::Local(Ok(())),
        (_, Some(_)) => Check::Local(Err(WRONGPASS)),
    }
}

impl Users {
    /// A registry of at most `max_users` users (0: per-user connections
    /// off), each with at most `per_user` connections.
    pub fn new(max_users: usize, per_user: usize) -> Users {
        Users {
            max_users,
            per_user: per_user.max(1),
            reg: Arc::default(),
            stats: UserStats::default(),
        }
    }

    /// Whether clients may authenticate as other ACL users.
    pub fn enabled(&self) -> bool {
        self.max_users > 0
    }

    /// The `--acl-user-connections` bound.
    pub fn per_user(&self) -> usize {
        self.per_user
    }

    /// The `--acl-max-users` bound.
    pub fn max_users(&self) -> usize {
        self.max_users
    }

    /// Users with a pool now, and their connections held by clients now.
    pub fn usage(&self) -> (usize, usize) {
        let map = self.reg.map.lock().unwrap_or_else(|p| p.into_inner());
        let held = map
            .values()
            .map(|(p, _)| p.stats.in_use.load(Ordering::Relaxed))
            .sum();
        (map.len(), held)
    }

    /// Connections opened and checkouts refused (a user's pool full),
    /// since start.
    pub fn pool_counts(&self) -> (u64, u64) {
        let map = self.reg.map.lock().unwrap_or_else(|p| p.into_inner());
        let gone = (
            self.reg.opened.load(Ordering::Relaxed),
            self.reg.refusals.load(Ordering::Relaxed),
        );
        map.values().fold(gone, |(o, r), (p, _)| {
            (
                o + p.stats.opened.load(Ordering::Relaxed),
                r + p.stats.refusals.load(Ordering::Relaxed),
            )
        })
    }

    /// Checks `user`/`pass` upstream (a handshake on a fresh connection)
    /// and, when accepted, logs the client in: `Ok(Some(login))` for a user
    /// other than `upstream`'s own, `Ok(None)` for that one (the client
    /// stays on the shared connections, which are that user already).
    ///
    /// # Errors
    /// The error reply's text without its `-`: the server's own
    /// (`WRONGPASS …`), `ERR max number of ACL users reached …`, or a
    /// connection error as `ERR …`.
    pub async fn login(
        &self,
        upstream: &Upstream,
        user: Option<&[u8]>,
        pass: &[u8],
    ) -> Result<Option<Login>, String> {
        let r = self.login_inner(upstream, user, pass).await;
        match &r {
            Ok(_) => self.stats.logins.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.stats.auth_failures.fetch_add(1, Ordering::Relaxed),
        };
        r
    }

    async fn login_inner(
        &self,
        upstream: &Upstream,
        user: Option<&[u8]>,
        pass: &[u8],
    ) -> Result<Option<Login>, String> {
        // Redis takes any bytes; a name or password that is not UTF-8
        // cannot be a Credentials here, and is refused as a wrong one.
        let (Ok(name), Ok(password)) = (
            std::str::from_utf8(user.unwrap_or(b"default")),
            std::str::from_utf8(pass),
        ) else {
            return Err(WRONGPASS.into());
        };
        let own = upstream.auth().username().unwrap_or("default") == name;
        let key = (name.to_owned(), password.to_owned());
        // `AUTH password` is checked as it was given (Redis answers it
        // apart: `-ERR AUTH <password> called without …` when the default
        // user needs none).
        let credentials = Credentials {
            username: user.map(|_| key.0.clone()),
            password: key.1.clone(),
        };
        let (pool, login) = if own {
            // Checked only: that user's clients use the shared connections.
            (upstream.user_pool(credentials, 1), None)
        } else {
            let mut map = self.reg.map.lock().unwrap_or_else(|p| p.into_inner());
            if !map.contains_key(&key) && map.len() >= self.max_users {
                self.stats.user_refusals.fetch_add(1, Ordering::Relaxed);
                return Err(format!(
                    "ERR max number of ACL users reached ({}, --acl-max-users)",
                    self.max_users
                ));
            }
            let (pool, n) = map
                .entry(key.clone())
                .or_insert_with(|| (upstream.user_pool(credentials, self.per_user), 0));
            *n += 1;
            let pool = Arc::clone(pool);
            let login = Login {
                key,
                pool: Arc::clone(&pool),
                reg: Arc::clone(&self.reg),
            };
            (pool, Some(login))
        };
        // Dropped on failure: a pool no client uses leaves the registry.
        match upstream.authenticate(&pool).await {
            Ok(()) => Ok(login),
            Err(sidecache_pool::Error::Handshake { reply, .. }) => Err(reply),
            Err(e) => Err(format!("ERR {}", e.to_string().replace(['\r', '\n'], " "))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn where_credentials_are_checked() {
        let up = Check::Upstream;
        // --requirepass is the default user's password, as today.
        assert_eq!(check(None, b"pw", Some("pw"), true), Check::Local(Ok(())));
        assert_eq!(
            check(None, b"x", Some("pw"), true),
            Check::Local(Err(WRONGPASS))
        );
        assert_eq!(
            check(Some(b"default"), b"pw", Some("pw"), true),
            Check::Local(Ok(()))
        );
        assert_eq!(
            check(Some(b"default"), b"x", Some("pw"), true),
            Check::Local(Err(WRONGPASS))
        );
        // Other users, and default without --requirepass: upstream.
        assert_eq!(check(None, b"x", None, true), up);
        assert_eq!(check(Some(b"bob"), b"x", Some("pw"), true), up);
        assert_eq!(check(Some(b"bob"), b"x", None, true), up);
        assert_eq!(check(Some(b"default"), b"x", None, true), up);
        // Per-user connections off (--acl-max-users 0): as before.
        assert_eq!(
            check(Some(b"bob"), b"x", None, false),
            Check::Local(Err(WRONGPASS))
        );
        assert_eq!(
            check(Some(b"default"), b"x", None, false),
            Check::Local(Ok(()))
        );
    }
}
