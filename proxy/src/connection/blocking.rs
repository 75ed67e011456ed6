//! Blocking commands (BLPOP, BRPOP, BLMOVE, BRPOPLPUSH, BLMPOP, BZPOPMIN,
//! BZPOPMAX, BZMPOP, XREAD/XREADGROUP BLOCK, WAIT, WAITAOF) on a held
//! connection of their own.
//!
//! ```text
//!  client ─BLPOP─▶ earlier replies written ─▶ queued writes for the node land
//!         ─▶ held connection (bounded pool) ─BLPOP─▶ Redis … blocks …
//!            meanwhile: the client socket is watched; later pipelined
//!            commands wait in its buffer, in order
//!         ◀─ reply ─ connection back to the pool (clean)
//!  client gone while blocked ─▶ CLIENT UNBLOCK <id> on the node's control
//!            connection ─▶ held connection closed
//! ```
//!
//! No proxy timeout applies: the command's own timeout is the only one
//! (0 blocks for ever, as on Redis).
//!
//! # Race window
//! A client that disconnects while blocked is unblocked with
//! `CLIENT UNBLOCK` (timeout semantics: nothing is popped by it). An element
//! Redis pops for the command after the client left and before the unblock
//! lands is lost with the connection, exactly as it is when a client
//! connected to Redis directly dies at that moment; the window is one
//! control round trip.

use bytes::{Bytes, BytesMut};
use sidecache_pool::cluster::redirect::{self, Action};
use sidecache_pool::Slot;
use sidecache_resp::encode;
use sidecache_resp::frame;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::{Client, Flow, Inval};

/// A blocking command waiting to run, set by dispatch.
pub(super) struct Blocked {
    raw: Bytes,
    node: usize,
    slot: Option<Slot>,
    /// WAIT/WAITAOF: first make this connection's replication offset cover
    /// every write flushed so far.
    wait: bool,
    inval: Option<Inval>,
}

impl Client {
    /// Sets up `raw` to run as a blocking command (see [`Client::run_blocking`]).
    pub(super) fn block(
        &mut self,
        raw: Bytes,
        lname: &[u8],
        node: usize,
        slot: Option<Slot>,
        inval: Option<Inval>,
    ) {
        self.blocked = Some(Blocked {
            raw,
            node,
            slot,
            wait: lname == b"wait" || lname == b"waitaof",
            inval,
        });
    }

    /// Runs the blocking command set by dispatch, watching the client
    /// socket meanwhile: more requests are buffered in `rbuf` (answered
    /// after it), an end of stream unblocks it upstream.
    pub(super) async fn run_blocking<S: AsyncRead + Unpin>(
        &mut self,
        stream: &mut S,
        rbuf: &mut BytesMut,
        query_limit: usize,
    ) -> Flow {
        let Some(b) = self.blocked.take() else {
            return Flow::Continue;
        };
        self.run_blocked(b, stream, rbuf, query_limit).await
    }

    async fn run_blocked<S: AsyncRead + Unpin>(
        &mut self,
        b: Blocked,
        stream: &mut S,
        rbuf: &mut BytesMut,
        query_limit: usize,
    ) -> Flow {
        let up = self.shared.upstream.clone();
        let mut node = b.node;
        let mut asking = false;
        for attempt in 0..=redirect::MAX_REDIRECTS {
            let Some(n) = self.topo.nodes().get(node).cloned() else {
                self.blocking_error(&sidecache_pool::Error::SlotUnassigned(0));
                return Flow::Continue;
            };
            // Taken before anything this command waits for, given back
            // once Redis has read it (`crate::state::turns`).
            let turn = self.shared.turns.take(n.addr()).await;
            if let Err(e) = self.wait_writes(&n).await {
                self.blocking_error(&e);
                return Flow::Continue;
            }
            let wait = up.write_behind().config().queue_timeout;
            // CLIENT ID (for CLIENT UNBLOCK) travels in the same write as
            // the command: the command reaches Redis a round trip sooner.
            let mut payload = BytesMut::new();
            encode::encode_command(&mut payload, &[b"CLIENT".as_slice(), b"ID"]);
            let mut count = 1;
            if b.wait {
                // WAIT counts replicas that have this connection's last
                // write; the writes it must cover went on other
                // connections, so first make one here: a PUBLISH is
                // replicated and moves the connection's offset past them.
                encode::encode_command(
                    &mut payload,
                    &[b"PUBLISH".as_slice(), b"__sidecache__:wait", b""],
                );
                count += 1;
            }
            if asking {
                encode::encode_command(&mut payload, &[b"ASKING"]);
                count += 1;
            }
            payload.extend_from_slice(&b.raw);
            let (mut conn, ids) = match self
                .sessions()
                .hold(
                    n.addr(),
                    self.session(),
                    wait,
                    &payload,
                    1,
                    up.command_timeout(),
                )
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    self.blocking_error(&e);
                    return Flow::Continue;
                }
            };
            // CLIENT ID answered: Redis has read the command after it.
            drop(turn);
            let id = ids
                .first()
                .and_then(|f| frame::Value::decode(f).ok())
                .and_then(|v| v.as_int());
            let me = self.st.id;
            if let Some(id) = id {
                self.shared
                    .blocked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(me, (std::sync::Arc::clone(&n), id));
            }
            // Counted once it can be unblocked (CLIENT UNBLOCK finds it).
            let blocked = &self.shared.stats.blocking.blocked;
            blocked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let kill = self.st.entry.kill.clone();
            let outcome = {
                // The replies after CLIENT ID's, the command's last.
                let call = conn.call(&[], count, None);
                tokio::pin!(call);
                loop {
                    tokio::select! {
                        r = &mut call => break Some(r),
                        // CLIENT KILL, or shutdown: as if the client left.
                        () = kill.cancelled() => break None,
                        r = stream.read_buf(rbuf) => match r {
                            Ok(0) | Err(_) => break None,
                            Ok(_) if rbuf.len() > query_limit => break None,
                            Ok(_) => {}
                        },
                    }
                }
            };
            self.shared
                .stats
                .blocking
                .blocked
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            self.shared
                .blocked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&me);
            let Some(result) = outcome else {
                // The client left while blocked: unblock its command
                // upstream (nothing is popped by the unblock) and close.
                if let Some(id) = id {
                    let mut unblock = BytesMut::new();
                    let mut ib = itoa::Buffer::new();
                    encode::encode_command(
                        &mut unblock,
                        &[b"CLIENT".as_slice(), b"UNBLOCK", ib.format(id).as_bytes()],
                    );
                    let _ = n.control_call(unblock.freeze()).await;
                }
                self.shared
                    .stats
                    .blocking
                    .unblocked_gone
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                drop(conn);
                return Flow::Close;
            };
            let frame = match result {
                Ok(mut frames) => frames.pop().unwrap_or_default(),
                Err(e) => {
                    self.blocking_error(&e);
                    return Flow::Continue;
                }
            };
            self.sessions().release(conn, true);
            // Cluster: a slot that moved, or a master that became a
            // replica while the command was blocked, is followed.
            if self.topo.is_cluster() && attempt < redirect::MAX_REDIRECTS {
                match redirect::decide(&frame, attempt) {
                    Action::Moved { slot, addr } => {
                        let nd = up.redirect_node(&addr, Some(slot), true);
                        self.topo = up.topology();
                        node = self.topo.index_of(nd.addr()).unwrap_or(node);
                        asking = false;
                        continue;
                    }
                    Action::Ask { addr } => {
                        let nd = up.redirect_node(&addr, b.slot, false);
                        self.topo = up.topology();
                        if let Some(i) = self.topo.index_of(nd.addr()) {
                            node = i;
                            asking = true;
                            continue;
                        }
                    }
                    Action::Retry(_) | Action::Done | Action::GiveUp => {}
                }
                // A master demoted while the command blocked (not a
                // CLIENT UNBLOCK, whose reply goes to the client).
                if frame.starts_with(b"-UNBLOCKED")
                    && memchr::memmem::find(&frame, b"instance state changed").is_some()
                {
                    up.request_refresh();
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    self.topo = up.topology();
                    if let Some(s) = b.slot {
                        if let Ok(i) = self.topo.node_index(s) {
                            node = i;
                        }
                    }
                    asking = false;
                    continue;
                }
            }
            self.wbuf.extend_from_slice(&frame);
            if let Some(inval) = &b.inval {
                // Again now that upstream answered: a fill that raced the
                // pop is discarded.
                self.apply(inval);
            }
            return Flow::Continue;
        }
        Flow::Continue
    }

    /// `CLIENT UNBLOCK id [TIMEOUT|ERROR]` for a client of this sidecache:
    /// sent for the held connection its command blocks on, on the node's
    /// control connection; `:0` when that client is not blocked.
    pub(super) async fn client_unblock(&mut self, args: &[Bytes]) {
        let start = self.scratch.len();
        let target = args
            .get(2)
            .and_then(|a| std::str::from_utf8(a).ok())
            .and_then(|a| a.parse::<u64>().ok());
        let mode = args.get(3);
        let bad_mode = mode.is_some_and(|m| {
            !m.eq_ignore_ascii_case(b"timeout") && !m.eq_ignore_ascii_case(b"error")
        });
        let reply: Bytes = match (target, args.len()) {
            (_, n) if !(3..=4).contains(&n) => Bytes::from_static(
                b"-ERR wrong number of arguments for 'client|unblock' command\r\n",
            ),
            (None, _) => Bytes::from_static(b"-ERR value is not an integer or out of range\r\n"),
            _ if bad_mode => {
                Bytes::from_static(b"-ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR\r\n")
            }
            (Some(t), _) => {
                let found = self
                    .shared
                    .blocked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&t)
                    .cloned();
                match found {
                    None => Bytes::from_static(b":0\r\n"),
                    Some((node, id)) => {
                        let mut cmd = BytesMut::new();
                        let mut ib = itoa::Buffer::new();
                        let mut parts: Vec<&[u8]> =
                            vec![b"CLIENT".as_slice(), b"UNBLOCK", ib.format(id).as_bytes()];
                        if let Some(m) = mode {
                            parts.push(m);
                        }
                        encode::encode_command(&mut cmd, &parts);
                        node.control_reply(cmd.freeze()).await
                    }
                }
            }
        };
        self.scratch.extend_from_slice(&reply);
        self.pending
            .push(super::Pending::Local(start..self.scratch.len()));
    }

    fn blocking_error(&mut self, e: &sidecache_pool::Error) {
        e.write_reply(&mut self.wbuf);
    }
}

/// Whether a command with `Handling::MaybeBlocking` blocks (XREAD and
/// XREADGROUP with a BLOCK option, before STREAMS: what follows STREAMS
/// are keys and IDs, and a key may be named BLOCK).
pub(super) fn has_block_arg(args: &[Bytes]) -> bool {
    args.iter()
        .skip(1)
        .take_while(|a| !a.eq_ignore_ascii_case(b"STREAMS"))
        .any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
}
