//! CLIENT TRACKING served to sidecache's own clients: the whole contract
//! in one place.
//!
//! # Where each part lives
//! - [`command`]: CLIENT TRACKING, CACHING, GETREDIR and TRACKINGINFO, a
//!   client's own state ([`Tracking`]: ON/OFF, BCAST and its prefixes,
//!   OPTIN/OPTOUT, NOLOOP, REDIRECT), with Redis's replies and errors.
//! - [`table`]: the tracking table ([`Tracked`]): registrations, BCAST
//!   prefixes, REDIRECT targets and a broken redirect's message, the told
//!   maps (one message per change), expiries, and the messages themselves,
//!   through the clients' outboxes.
//! - The connection's hooks (`crate::connection`'s `tracked`): a tracking
//!   client's reads are registered when dispatched ([`Tracked::register`]),
//!   reads of keys sidecache does not follow get their message after the
//!   batch's replies, a script's or a transaction's reads go on a fill
//!   lane (a transaction on a held connection has its reads sent again on
//!   one after EXEC, and keeps the keys whose replies matched). They only
//!   call into the table; the rules are here.
//! - Upstream, behind one call: the proxy's own writes are announced with
//!   `sidecache_pool::Upstream::expect_echoes` before they are sent, so
//!   Redis's report of a write this proxy made (its *echo*) is not passed
//!   on as another writer's change (the argument is in the pool's
//!   `conn::mux::echo`: a report right after our write's reply on the
//!   connection that carried it is ours; elsewhere, the next report of a
//!   key being written, unless a read of it is answered first). Everything
//!   else the pool tells the proxy arrives as invalidations
//!   (`crate::state::FollowInvalidations`) and is applied to the L1 and
//!   then to this table.
//!
//! sidecache does not forward a client's CLIENT TRACKING to Redis (its
//! upstream connections are shared by every client); it keeps a tracking
//! table of its own, as Redis does, and fills the clients' messages from
//! what it already learns of changes: Redis's invalidations of the keys it
//! follows upstream, every write made through it, write-behind failures,
//! FLUSHALL/FLUSHDB and a lost invalidation channel (a message with no
//! keys, "flush everything").
//!
//! # Why a client is never left with a stale value
//! A read is registered for its client when it is dispatched, before its
//! value is taken (from the L1 or upstream), so a change learned of after
//! that reaches the client. The message goes through the client's outbox,
//! which the connection drains only between batches, after the batch's
//! replies are written: a client never gets a key's invalidation before the
//! reply it applies to. What sidecache learns of is only what it follows:
//! a key is followed upstream while the L1 holds a value filled for it
//! (`sidecache_l1::L1::followed`; under BCAST upstream, every key the L1
//! admits), and its node's invalidation channel is up. That is decided
//! when the read is registered: a key followed only later may have changed
//! unheard in between. For a read of a key that was not followed then (and
//! was not read on a fill lane, which Redis follows from that read on), the
//! client gets an invalidation of it right after the reply
//! (`Client::end_tracked_reads`, in `crate::connection`'s `tracked`): it may use the value once, never cache it
//! past a change. The messages a client's own writes cause leave in the
//! same socket write as that batch's replies. A tracking client's GET of
//! a value this sidecache wrote (not followed under optin) is read on a
//! fill lane instead of from the L1, after the queued writes, so the key
//! becomes followed and no such message is needed.
//!
//! # One message per change, as Redis
//! A write made through sidecache is told at its acknowledgement; when
//! the L1 followed the key, Redis reports the same write back on the
//! invalidation channel. A BCAST client told of a key (or whose own NOLOOP
//! write it was) and that has read nothing since is not told again
//! ([`Tracked::invalidate_learned`]): it holds no value of the key, so the
//! message could only repeat itself. Its record is cleared when a read is
//! dispatched and again when the batch holding it is answered, so a value
//! read across the message is never left without a later one. Keys
//! written with a time to live are reported when they fall due
//! ([`Tracked::expire_at`]), as Redis reports an expiry. A read of a key
//! sidecache does not follow gets its own message after its reply
//! ([`Tracked::forget`]) only if the client was not sent one for that key
//! while the read was in flight (that one already reaches it after the
//! reply); and a BCAST client sent such a message is not sent the key's
//! expiry again until it reads it, as the message stood in for it.
//!
//! # Message shapes, as Redis's
//! A default-mode client gets one message per key, at once. A BCAST
//! client's keys are held and sent by [`Tracked::release`] as one message
//! per prefix, as Redis sends what changed in one event-loop turn: the keys
//! of an MSET or of one EXEC come together. Held keys are released at the
//! end of each client batch (`Client::flush`) and after each change learned
//! from upstream, before any reply that follows them is written, and a
//! "flush everything" message is sent after the keys held before it.

pub mod command;
pub mod table;

pub use crate::pubsub::Keys;
pub use command::Tracking;
pub use table::{Sink, Tracked, DEFAULT_MAX_KEYS};
