//! Coalescing of L1 misses: concurrent GETs of one uncached key share one
//! upstream fetch (a *flight*).
//!
//! # Race window
//! A flight may only be joined by a reader for whom its fetch is fresh
//! enough: it must have been registered after the last invalidation of the
//! key. Every invalidation therefore [`Flights::forget`]s the key's flight,
//! so later readers start a new one; readers that joined before the write
//! get the older value, which is a correct answer to a read that preceded
//! it. A client with an unflushed write in its own batch never joins (its
//! fetch must travel behind its write, on its own connection).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;

/// Lock shards (a power of two); a shard is held only to look up, insert
/// or remove, never across an await.
const SHARDS: usize = 64;

/// What a fetch produced, independent of the reader's protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// A value, or `None` for nil.
    Value(Option<Bytes>),
    /// An error reply frame (e.g. WRONGTYPE), or our own upstream error.
    Error(Bytes),
}

/// One fetch in flight.
#[derive(Debug)]
pub struct Flight {
    tx: watch::Sender<Option<Fetched>>,
}

impl Flight {
    /// Publishes the result to every reader that joined.
    pub fn publish(&self, result: Fetched) {
        self.tx.send_replace(Some(result));
    }
}

/// A joined flight's result, awaited in request order.
pub type Joined = watch::Receiver<Option<Fetched>>;

/// One lock shard: flights by (database, key).
type Shard = Mutex<HashMap<(u16, Bytes), Arc<Flight>>>;

/// The registry of flights.
#[derive(Debug)]
pub struct Flights {
    shards: Box<[Shard]>,
    /// Flights registered: every write calls [`Flights::forget`], which
    /// skips the lock when there are none (the common case between misses).
    active: std::sync::atomic::AtomicUsize,
}

impl Default for Flights {
    fn default() -> Self {
        Flights {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            active: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

/// Either lead a new flight or join an existing one.
#[derive(Debug)]
pub enum Role {
    /// Fetch, then [`Flight::publish`] and [`Flights::land`].
    Lead(Arc<Flight>),
    /// Wait for the leader's result.
    Join(Joined),
}

impl Flights {
    fn shard(&self, db: u16, key: &[u8]) -> &Shard {
        let mut h: u32 = 2_166_136_261 ^ u32::from(db);
        for &b in key {
            h = (h ^ u32::from(b)).wrapping_mul(16_777_619);
        }
        &self.shards[h as usize & (SHARDS - 1)]
    }

    /// Joins the key's flight if there is one (and `may_join`), else
    /// registers a new one led by the caller.
    pub fn lead_or_join(&self, db: u16, key: &Bytes, may_join: bool) -> Role {
        let mut map = self
            .shard(db, key)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if may_join {
            if let Some(f) = map.get(&(db, key.clone())) {
                return Role::Join(f.tx.subscribe());
            }
        }
        let (tx, _) = watch::channel(None);
        let f = Arc::new(Flight { tx });
        if map.insert((db, key.clone()), Arc::clone(&f)).is_none() {
            self.active
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        Role::Lead(f)
    }

    /// Removes the flight after its result was published (only if it is
    /// still the registered one).
    pub fn land(&self, db: u16, key: &Bytes, flight: &Arc<Flight>) {
        let mut map = self
            .shard(db, key)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if map
            .get(&(db, key.clone()))
            .is_some_and(|f| Arc::ptr_eq(f, flight))
        {
            map.remove(&(db, key.clone()));
            self.active
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// Forgets the key's flight: later readers start a fresh fetch.
    pub fn forget(&self, db: u16, key: &Bytes) {
        // None registered: nothing to forget (a flight registered after this
        // check began after the invalidation that called us).
        if self.active.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return;
        }
        let mut map = self
            .shard(db, key)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if map.remove(&(db, key.clone())).is_some() {
            self.active
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }

    /// Forgets every flight (FLUSHALL and friends).
    pub fn forget_all(&self) {
        for s in self.shards.iter() {
            let mut map = s.lock().unwrap_or_else(|p| p.into_inner());
            self.active
                .fetch_sub(map.len(), std::sync::atomic::Ordering::AcqRel);
            map.clear();
        }
    }
}

/// Waits for a joined flight's result.
pub async fn wait(mut rx: Joined) -> Option<Fetched> {
    match rx.wait_for(Option::is_some).await {
        Ok(v) => v.clone(),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn second_reader_joins_until_forgotten() {
        let f = Flights::default();
        let k = Bytes::from_static(b"k");
        let Role::Lead(lead) = f.lead_or_join(0, &k, true) else {
            panic!("first leads")
        };
        let Role::Join(rx) = f.lead_or_join(0, &k, true) else {
            panic!("second joins")
        };
        assert!(
            matches!(f.lead_or_join(1, &k, true), Role::Lead(_)),
            "other db"
        );
        assert!(matches!(
            f.lead_or_join(0, &Bytes::from_static(b"z"), false),
            Role::Lead(_)
        ));
        lead.publish(Fetched::Value(Some(Bytes::from_static(b"v"))));
        assert_eq!(
            wait(rx).await,
            Some(Fetched::Value(Some(Bytes::from_static(b"v"))))
        );
        f.forget(0, &k);
        assert!(
            matches!(f.lead_or_join(0, &k, true), Role::Lead(_)),
            "forgotten: a new flight"
        );
    }

    #[tokio::test]
    async fn abandoned_flight_wakes_joiners() {
        let f = Flights::default();
        let k = Bytes::from_static(b"k");
        let Role::Lead(lead) = f.lead_or_join(0, &k, true) else {
            panic!("leads")
        };
        let Role::Join(rx) = f.lead_or_join(0, &k, true) else {
            panic!("joins")
        };
        f.forget(0, &k);
        drop(lead);
        assert_eq!(wait(rx).await, None);
    }
}
