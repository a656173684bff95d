//! etcd member removal before a control-plane node is retired: on a stacked
//! etcd (kubeadm's default) every control-plane node runs a member, and a
//! node deleted with its member still listed leaves a dead voter behind;
//! two of those and a three-member cluster has no failure left to spare.
//!
//! `rules` decides (pure: which member is the node's, whether removing it
//! keeps the rest healthy and in quorum); `placement` says which nodes run a
//! member; `access` finds etcd (by default on the control-plane nodes, as
//! Constellation does); `client` talks to etcd's v3 JSON gateway. The
//! NodeVersion controller calls them while it retires a node.

pub mod access;
pub mod client;
pub mod placement;
pub mod rules;

pub use access::{Discovery, EtcdSetup};
pub use client::{CATEGORY, EtcdClient, EtcdConfig, EtcdError, Removed};
pub use rules::{Blocked, Decision, Health, Member, decide, to_check};
