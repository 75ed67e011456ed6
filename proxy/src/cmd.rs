//! Commands: the table loaded from upstream, how each command is handled,
//! and the commands the proxy answers itself.

pub mod flags;
pub mod handling;
pub mod local;
pub mod merge;
pub mod pause;
pub mod reads;
pub mod route;
pub mod script;
pub mod table;
pub mod write;
