//! One controller per file; each splits pure decisions from thin IO.

pub mod node_maintenance;
pub mod rollout;
