//! Connections to one node: opening one, the multiplexed pipelined
//! connection many clients share, what its replies say of the node's
//! health, the node's set of connections, and the connections one client
//! holds to itself (transactions, WATCH).

pub mod connect;
pub mod control;
pub mod health;
pub mod mux;
pub mod node;
pub mod session;
