//! One controller per file; each splits pure decisions from thin IO.

pub mod autoscaling_strategy;
pub mod joining_node;
pub mod node_maintenance;
pub mod node_version;
pub mod pending_node;
pub mod rollout;
pub mod scaling_group;
