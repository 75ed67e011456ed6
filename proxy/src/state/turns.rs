//! Blocked clients served in the order they blocked.
//!
//! Redis serves the clients blocked on a key first come, first served. Two
//! clients of this proxy reach Redis on two held connections, and three
//! things could put the second one's command upstream first:
//! - the runtime reading the second client's socket first (its LIFO slot
//!   runs the task woken last; `crate::runtime` turns it off);
//! - the first command waiting longer for its node's queued writes to land;
//! - the first command waiting longer for a held connection.
//!
//! So a blocking command takes its node's turn before it waits for either,
//! and gives it back once Redis has read it: its `CLIENT ID`, sent in the
//! same write, has been answered. The next blocking command for that node
//! then goes. Turns are fair (`tokio::sync::Mutex` queues its waiters), so
//! commands reach a node in the order their clients reached this point,
//! which is the order they were read. The price is one round trip per
//! blocking command, paid only by blocking commands sent to one node at
//! the same moment.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sidecache_pool::NodeAddr;
use tokio::sync::OwnedMutexGuard;

/// Each node's turn for blocking commands.
#[derive(Debug, Default)]
pub struct Turns {
    nodes: Mutex<HashMap<NodeAddr, Arc<tokio::sync::Mutex<()>>>>,
}

impl Turns {
    /// Waits for `node`'s turn; the turn passes on when the guard drops.
    pub async fn take(&self, node: &NodeAddr) -> OwnedMutexGuard<()> {
        let turn = {
            let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(nodes.entry(node.clone()).or_default())
        };
        turn.lock_owned().await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn turns_pass_in_the_order_they_were_asked() {
        let turns = Arc::new(Turns::default());
        let node = NodeAddr::parse("127.0.0.1:1").unwrap();
        let first = turns.take(&node).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        for i in 0..5 {
            let (turns, node, order) = (Arc::clone(&turns), node.clone(), Arc::clone(&order));
            waiting.push(tokio::spawn(async move {
                let _turn = turns.take(&node).await;
                order.lock().unwrap().push(i);
            }));
            // Each waiter queued before the next is spawned.
            tokio::task::yield_now().await;
        }
        // Another node's turn is not held up.
        drop(turns.take(&NodeAddr::parse("127.0.0.1:2").unwrap()).await);
        assert!(order.lock().unwrap().is_empty());
        drop(first);
        for w in waiting {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    }
}
