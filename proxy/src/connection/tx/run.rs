//! Running what a transaction collected: the block on a shared connection
//! (answered in the reply pass) or on the held connection, WATCH and
//! UNWATCH there, the replies in the client's order (with the answers
//! sidecache gives itself put in place), and the re-run of a block a
//! cluster redirected before it ran. The collecting is in the parent.

use std::sync::atomic::Ordering;

use bytes::{BufMut, Bytes, BytesMut};
use sidecache_pool::cluster::redirect::{self, Action};
use sidecache_pool::Slot;
use sidecache_resp::encode;
use sidecache_resp::request::Request;

use super::{End, Held, TxBlock, TxPending, EXECABORT};
use crate::connection::{Client, Pending};

impl Client {
    /// EXEC or DISCARD closes the block: on a shared connection when
    /// nothing is held (answered in the reply pass), on the held one
    /// otherwise.
    pub(super) async fn finish_tx(&mut self, req: &Request, end: End) {
        let Some(mut tx) = self.tx.take() else { return };
        // A locally refused command: run nothing (DISCARD), answer
        // EXECABORT as Redis would.
        if end == End::Exec && tx.dirty {
            let mut discard = BytesMut::new();
            encode::encode_command(&mut discard, &[b"DISCARD"]);
            tx.buf.extend_from_slice(&discard);
        } else {
            tx.buf.extend_from_slice(&req.raw);
        }
        tx.count += 1;
        tx.order.push(None);
        let inval = tx.inval.take();
        let mut on_fill = false;
        if tx.lost {
            let start = self.scratch.len();
            let last = tx.order.len() - 1;
            for (i, o) in tx.order.iter().enumerate() {
                match o {
                    None if i == last && end == End::Exec => self.scratch.put_slice(EXECABORT),
                    None if i == last => self.scratch.put_slice(b"+OK\r\n"),
                    None => self.scratch.put_slice(b"+QUEUED\r\n"),
                    Some(b) => self.scratch.put_slice(b),
                }
            }
            self.pending.push(Pending::Local(start..self.scratch.len()));
            self.count_tx(end, true, EXECABORT);
            if let Some(inval) = inval {
                self.apply_l1(&inval);
            }
            return;
        }
        if self.held.is_some() || tx.on_held || tx.switch {
            // What this flush answers comes before EXEC's reply, so the
            // transaction's reads (and any before them) are decided after
            // EXEC's (`Client::end_tracked_reads`), never before it.
            let reads = std::mem::take(&mut self.tracked_reads);
            self.flush().await;
            self.tracked_reads.splice(0..0, reads);
            if end == End::Exec {
                self.exec_sent(&tx, inval.as_ref());
            }
            let replies = self.held_send(&mut tx).await;
            let start = self.scratch.len();
            if !tx.selects.is_empty() || tx.switch {
                if let Some(h) = self.held.as_mut() {
                    h.session_changed = true;
                }
            }
            let replies = match replies {
                Ok(f) => Ok(self.run_deferred(f, end, &tx.deferred, &tx.selects).await),
                Err(e) => Err(e),
            };
            // (Reads on either side of a SELECT inside the block are not
            // read again: they ran in two databases.)
            let exec = match &replies {
                Ok(f) if end == End::Exec && !tx.dirty && tx.selects.is_empty() => {
                    f.last().cloned()
                }
                _ => None,
            };
            let ok = self.write_tx_replies(&tx.order, replies, end, tx.dirty, true);
            self.pending.push(Pending::Local(start..self.scratch.len()));
            let reads = std::mem::take(&mut tx.reads);
            if let (Some(exec), Some(h)) = (exec, self.held.as_ref()) {
                if let Some(p) = self.tx_follow(h.node, reads, &exec) {
                    self.pending.push(p);
                    on_fill = true;
                }
            }
            // EXEC and DISCARD both unwatch: the connection is clean again.
            if let Some(h) = self.held.as_mut() {
                h.watching = false;
            }
            self.end_session(ok);
        } else {
            let node = match self.tx_node(tx.slot) {
                Ok(n) => n,
                Err(e) => {
                    self.slot_error(&e);
                    return;
                }
            };
            // A SELECT, or a sidecache-answered command (CLIENT SETNAME …)
            // that runs at EXEC: later commands of this batch must see
            // what EXEC changed, so the block is answered at once.
            let answer_now = !tx.selects.is_empty() || !tx.deferred.is_empty();
            on_fill =
                end == End::Exec && !tx.dirty && tx.selects.is_empty() && self.tx_reads_tracked();
            if on_fill && !self.pending.is_empty() {
                // In a batch of its own: what came before is answered
                // first (its reads decided after EXEC's reply).
                let reads = std::mem::take(&mut self.tracked_reads);
                self.flush().await;
                self.tracked_reads.splice(0..0, reads);
            }
            on_fill = on_fill && self.fills_on_fill_conn(node);
            let selects = !tx.selects.is_empty();
            // The shared connection goes back to its own database after
            // the block (its reply is dropped in the reply pass).
            let mut restore = false;
            if selects {
                let mut b = itoa::Buffer::new();
                encode::encode_command(
                    &mut tx.buf,
                    &[b"SELECT".as_slice(), b.format(self.st.db).as_bytes()],
                );
                tx.count += 1;
                restore = true;
            }
            if end == End::Exec {
                self.exec_sent(&tx, inval.as_ref());
            }
            let block = tx.buf.split().freeze();
            let (node, idx) = if on_fill {
                self.tx_on_fill_lane(node, &block, tx.count)
            } else {
                self.enqueue_block(node, &block, tx.count)
            };
            self.pending.push(Pending::Tx(Box::new(TxPending {
                node,
                idx,
                count: tx.count,
                order: tx.order,
                slot: tx.slot,
                block,
                end,
                dirty: tx.dirty,
                deferred: tx.deferred,
                selects: tx.selects,
                restore,
                fill: on_fill,
            })));
            if answer_now {
                self.flush().await;
            }
        }
        if end == End::Exec {
            if let Some(inval) = inval {
                let reread = std::mem::take(&mut tx.reread);
                self.pending.push(if on_fill && !reread.is_empty() {
                    Pending::TxInvalidate(Box::new((inval, reread)))
                } else {
                    Pending::Invalidate(inval)
                });
            }
        }
        // Nothing after it overtakes it on another connection.
        if on_fill {
            self.flush().await;
        }
    }

    /// EXEC is about to be sent: the transaction's reads and the expiries
    /// its writes set run from now (`Client::renew_tracked_reads`), and
    /// what it may write leaves the L1 again (and tracking clients count
    /// it as told before Redis can report it back). A key the transaction
    /// reads after its write gets no expiry message of sidecache's own:
    /// Redis follows it for sidecache from that read (a fill lane's, or
    /// [`Client::tx_follow`]'s) and reports its expiry, or its reader is
    /// told to drop it after EXEC's reply.
    fn exec_sent(&mut self, tx: &TxBlock, inval: Option<&super::Inval>) {
        self.renew_tracked_reads();
        self.start_tx_expiries(
            tx.expiries
                .iter()
                .filter(|(k, _)| !tx.reread.iter().any(|(r, _)| r == k)),
        );
        if let Some(inval) = inval {
            self.apply_l1(inval);
        }
    }

    /// WATCH outside MULTI with nothing held: take a held connection on the
    /// keys' node, after the writes queued for it have landed (so this
    /// client's own earlier writes cannot fail its WATCH later).
    pub(super) async fn watch(&mut self, req: &Request) {
        self.flush().await;
        let slot = if self.topo.is_cluster() {
            let shared = std::sync::Arc::clone(&self.shared);
            shared.table.lookup(&req.args).and_then(|info| {
                self.keys.clear();
                info.keys(&req.args, &mut self.keys).ok()?;
                self.keys.first().map(|&i| Slot::for_key(&req.args[i]))
            })
        } else {
            None
        };
        let node = match self.tx_node(slot) {
            Ok(n) => n,
            Err(e) => {
                self.slot_error(&e);
                return;
            }
        };
        let Some(n) = self.topo.nodes().get(node).cloned() else {
            return self.tx_local_error("ERR upstream topology changed, retry");
        };
        if let Err(e) = self.wait_writes(&n).await {
            return self.tx_upstream_error(&e);
        }
        let up = &self.shared.upstream;
        let wait = self.shared.upstream.write_behind().config().queue_timeout;
        let pool = self.sessions();
        match pool
            .hold(
                n.addr(),
                self.session(),
                wait,
                &req.raw,
                1,
                up.command_timeout(),
            )
            .await
        {
            Ok((conn, mut replies)) => {
                let frame = replies.pop().unwrap_or_default();
                let ok = frame.first() == Some(&b'+');
                let start = self.scratch.len();
                self.scratch.put_slice(&frame);
                self.pending.push(Pending::Local(start..self.scratch.len()));
                let held = Held {
                    conn,
                    pool,
                    node,
                    watching: ok,
                    slot,
                    session_changed: false,
                };
                if ok {
                    self.held = Some(held);
                } else {
                    held.pool.release(held.conn, true);
                }
            }
            Err(e) => self.tx_upstream_error(&e),
        }
    }

    /// WATCH, UNWATCH (or a stray EXEC/DISCARD) on the held connection.
    pub(super) async fn held_call(&mut self, req: &Request) {
        self.flush().await;
        let timeout = self.shared.upstream.command_timeout();
        let Some(h) = self.held.as_mut() else { return };
        let r = h.conn.call(&req.raw, 1, timeout).await;
        match r {
            Ok(mut replies) => {
                let frame = replies.pop().unwrap_or_default();
                let start = self.scratch.len();
                self.scratch.put_slice(&frame);
                self.pending.push(Pending::Local(start..self.scratch.len()));
                // UNWATCH ends the watches; a stray EXEC or DISCARD (no
                // MULTI) is an error that leaves them in place.
                if req.args[0].eq_ignore_ascii_case(b"unwatch") && frame.first() == Some(&b'+') {
                    if let Some(h) = self.held.as_mut() {
                        h.watching = false;
                    }
                    self.end_session(true);
                }
            }
            Err(e) => {
                self.tx_upstream_error(&e);
                self.end_session(false);
            }
        }
    }

    /// Sends what the open transaction has collected on the held
    /// connection (taking one first if needed); its replies, or the error
    /// for every one of them.
    async fn held_send(&mut self, tx: &mut TxBlock) -> Result<Vec<Bytes>, sidecache_pool::Error> {
        let mut payload = tx.buf.split().freeze();
        let mut n = std::mem::take(&mut tx.count);
        if n == 0 {
            return Ok(Vec::new());
        }
        // Opened before a key bound its slot (on the first master), and now
        // bound to another master's: the transaction moves there. What was
        // sent before (MULTI and keyless commands, whose replies the client
        // has) is sent again first, and those replies are dropped.
        let mut replayed = 0;
        let moved = match (&self.held, tx.slot) {
            (Some(h), Some(slot)) if !h.watching && h.slot.is_none() => {
                self.topo.node_index(slot).is_ok_and(|node| node != h.node)
            }
            _ => false,
        };
        let mut session_changed = false;
        if moved {
            if let Some(h) = self.held.take() {
                session_changed = h.session_changed;
                h.pool.release(h.conn, false);
            }
            let mut all = std::mem::take(&mut tx.sent);
            all.extend_from_slice(&payload);
            payload = all.freeze();
            replayed = std::mem::take(&mut tx.sent_count);
            n += replayed;
        } else if tx.slot.is_none() && self.topo.is_cluster() {
            // Not bound yet: kept, in case a key binds it elsewhere.
            tx.sent.extend_from_slice(&payload);
            tx.sent_count += n;
        } else {
            tx.sent = BytesMut::new();
            tx.sent_count = 0;
        }
        let up = self.shared.upstream.clone();
        let timeout = up.command_timeout();
        if self.held.is_none() {
            let node = self.tx_node(tx.slot)?;
            let Some(nd) = self.topo.nodes().get(node).cloned() else {
                return Err(sidecache_pool::Error::SlotUnassigned(0));
            };
            self.wait_writes(&nd).await?;
            let wait = up.write_behind().config().queue_timeout;
            let pool = self.sessions();
            let (conn, mut replies) = pool
                .hold(nd.addr(), self.session(), wait, &payload, n, timeout)
                .await?;
            self.held = Some(Held {
                conn,
                pool,
                node,
                watching: false,
                slot: tx.slot,
                session_changed,
            });
            tx.on_held = true;
            replies.drain(..replayed.min(replies.len()));
            return Ok(replies);
        }
        let node = self.held.as_ref().map_or(0, |h| h.node);
        if let Some(nd) = self.topo.nodes().get(node).cloned() {
            self.wait_writes(&nd).await?;
        }
        let Some(h) = self.held.as_mut() else {
            return Err(sidecache_pool::Error::Closed);
        };
        tx.on_held = true;
        h.conn.call(&payload, n, timeout).await
    }

    /// At the end of a batch with a MULTI still open: what it collected goes
    /// to a held connection now (its client waits for those replies), and
    /// the rest of the transaction follows there.
    pub(in crate::connection) async fn flush_open_tx(&mut self) {
        let Some(mut tx) = self.tx.take() else { return };
        if tx.order.is_empty() {
            self.tx = Some(tx);
            return;
        }
        if tx.lost {
            // Answered here to the end: the EXEC aborts.
            let order = std::mem::take(&mut tx.order);
            tx.buf.clear();
            tx.count = 0;
            for o in &order {
                match o {
                    None => self.wbuf.put_slice(b"+QUEUED\r\n"),
                    Some(b) => self.wbuf.put_slice(b),
                }
            }
            self.tx = Some(tx);
            return;
        }
        let opened = tx.on_held;
        let replies = self.held_send(&mut tx).await;
        let order = std::mem::take(&mut tx.order);
        match replies {
            Ok(frames) => {
                // Straight to the client buffer: this is the batch's tail.
                let mut it = frames.into_iter();
                for o in &order {
                    match o {
                        None => self.wbuf.put_slice(&it.next().unwrap_or_default()),
                        Some(b) => self.wbuf.put_slice(b),
                    }
                }
            }
            Err(e) => {
                // No connection could take the transaction (the handshake
                // of a new one refused, e.g. BUSY), or it broke: what Redis
                // would have queued gets the error, a MULTI of this block
                // its +OK, and the transaction goes on here until its EXEC
                // aborts, as after any queue-time error.
                let mut err = BytesMut::new();
                e.write_reply(&mut err);
                let mut first = !opened;
                for o in &order {
                    match o {
                        None if first => {
                            first = false;
                            self.wbuf.put_slice(b"+OK\r\n");
                        }
                        None => self.wbuf.put_slice(&err),
                        Some(b) => self.wbuf.put_slice(b),
                    }
                }
                tx.lost = true;
                tx.dirty = true;
                tx.buf.clear();
                tx.count = 0;
                if let Some(h) = self.held.take() {
                    h.pool.release(h.conn, false);
                }
            }
        }
        self.tx = Some(tx);
    }

    /// Writes a finished block's replies (into `scratch` when `local`, else
    /// the client buffer); returns whether it ended cleanly (the held
    /// connection may be reused).
    fn write_tx_replies(
        &mut self,
        order: &[Option<Bytes>],
        replies: Result<Vec<Bytes>, sidecache_pool::Error>,
        end: End,
        dirty: bool,
        local: bool,
    ) -> bool {
        let n_up = order.iter().filter(|o| o.is_none()).count();
        let (frames, ok) = match replies {
            Ok(f) if f.len() == n_up => (f, true),
            Ok(_) => (
                vec![Bytes::from_static(b"-ERR upstream reply missing\r\n"); n_up],
                false,
            ),
            Err(e) => {
                let mut b = BytesMut::new();
                e.write_reply(&mut b);
                (vec![b.freeze(); n_up], false)
            }
        };
        if let Some(last) = frames.last() {
            self.count_tx(end, dirty, last);
        }
        let mut out = BytesMut::new();
        let mut up = 0usize;
        for o in order {
            match o {
                None => {
                    up += 1;
                    if up == n_up && end == End::Exec && dirty && ok {
                        out.put_slice(EXECABORT);
                    } else {
                        out.put_slice(&frames[up - 1]);
                    }
                }
                Some(b) => out.put_slice(b),
            }
        }
        if local {
            self.scratch.put_slice(&out);
        } else {
            self.wbuf.put_slice(&out);
        }
        ok
    }

    fn count_tx(&self, end: End, dirty: bool, last: &[u8]) {
        let t = &self.shared.stats.tx;
        let c = match end {
            End::Discard => &t.discarded,
            End::Exec if dirty || last.starts_with(b"-EXECABORT") => &t.aborted,
            End::Exec if last == b"*-1\r\n" || last == b"_\r\n" => &t.watch_failed,
            End::Exec if last.first() == Some(&b'*') => &t.executed,
            End::Exec => &t.aborted,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Answers a shared-connection block in the reply pass: Redis's replies
    /// in order, re-run whole on the slot's new owner when the cluster
    /// redirected it before anything ran (no WATCH is involved here).
    pub(in crate::connection) async fn reply_tx(&mut self, t: TxPending) {
        let mut frames = Vec::with_capacity(t.count);
        let mut failed = None;
        for k in 0..t.count {
            match self.take_lane_frame(t.fill, t.node, t.idx + k as u32) {
                Ok(f) => frames.push(f),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if t.fill && failed.is_some() {
            // Not followed after all: its reads get their messages.
            self.fill_reads.clear();
        }
        let mut replies = match failed {
            Some(e) => Err(e),
            None => Ok(frames),
        };
        if self.topo.is_cluster() && t.end == End::Exec && !t.dirty {
            for attempt in 0..redirect::MAX_REDIRECTS {
                let Ok(frames) = &replies else { break };
                let Some(action) = frames
                    .iter()
                    .map(|f| redirect::decide(f, attempt))
                    .find(|a| matches!(a, Action::Moved { .. } | Action::Ask { .. }))
                else {
                    break;
                };
                self.shared.metrics.note_redirect(match &action {
                    Action::Moved { .. } => b"-MOVED ",
                    _ => b"-ASK ",
                });
                replies = self.rerun_block(&action, &t.block, t.count, t.slot).await;
                // It ran on another connection, which Redis follows
                // nothing on for sidecache.
                self.fill_reads.clear();
            }
        }
        let replies = match replies {
            Ok(mut f) => {
                if t.restore {
                    f.pop();
                }
                Ok(self.run_deferred(f, t.end, &t.deferred, &t.selects).await)
            }
            Err(e) => Err(e),
        };
        self.write_tx_replies(&t.order, replies, t.end, t.dirty, false);
    }

    async fn rerun_block(
        &mut self,
        action: &Action,
        block: &Bytes,
        count: usize,
        slot: Option<Slot>,
    ) -> Result<Vec<Bytes>, sidecache_pool::Error> {
        let up = self.shared.upstream.clone();
        let (addr, asking) = match action {
            Action::Moved { addr, .. } => (addr.clone(), false),
            Action::Ask { addr } => (addr.clone(), true),
            _ => return Err(sidecache_pool::Error::Closed),
        };
        if !asking {
            up.request_refresh();
        }
        let node = up.redirect_node(&addr, slot, !asking);
        let mut payload = BytesMut::with_capacity(block.len() + 20);
        if asking {
            encode::encode_command(&mut payload, &[b"ASKING"]);
        }
        payload.extend_from_slice(block);
        let n = count + usize::from(asking);
        let deadline = up
            .command_timeout()
            .map(|t| tokio::time::Instant::now() + t);
        let sent = self.submit_one(&node, payload.freeze(), n, deadline).await;
        let replies = match sent.replies {
            Ok(rx) => rx.replies().await,
            Err(e) => Err(e),
        };
        let mut r = replies.inspect_err(|e| up.note_failure(e))?;
        if asking && !r.is_empty() {
            r.remove(0);
        }
        Ok(r)
    }
}

impl Client {
    /// One pipeline to `node` on the client's connections (its ACL user's,
    /// or the shared ones), outside a batch (a transaction re-run after a
    /// redirect).
    pub(super) async fn submit_one(
        &mut self,
        node: &std::sync::Arc<sidecache_pool::Node>,
        payload: Bytes,
        count: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> sidecache_pool::Submitted {
        let up = &self.shared.upstream;
        match &self.st.user {
            Some(login) => {
                up.submit_as(login.pool(), node, self.session(), payload, count, deadline)
                    .await
            }
            None => {
                let lane = sidecache_pool::Lane::Client {
                    session: self.session(),
                    hint: self.hint(),
                };
                up.submit(node, lane, payload, count, deadline).await
            }
        }
    }
}
