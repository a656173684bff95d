//! The rolling replacement of outdated nodes — decisions only (pure, table
//! tested). The NodeVersion controller gathers [`Facts`] from its stores and
//! the cloud, calls [`plan`], and carries out the [`Step`]s.
//!
//! A node is *outdated* when its version (image and Kubernetes components)
//! differs from the rollout's target. Each outdated node (the *donor*) is
//! replaced by a fresh node (the *heir*) of the same scaling group:
//!
//! 1. create an instance (a PendingNode with goal Join tracks it);
//! 2. once it joined and is Ready (a *mint*), pair it with an outdated node of
//!    its group that has no heir, and copy the donor's labels to it;
//! 3. drain the donor (a NodeMaintenance);
//! 4. when the drain succeeded, delete the donor's Node and its instance.
//!
//! Budgets (invariant 1): `max_surge` bounds the extra nodes in flight
//! (instances joining, mints, heirs whose donor still exists); `max_unavailable`
//! bounds outdated nodes drained before their heir is Ready. A donor is only
//! deleted once its heir is Ready and its drain succeeded (invariant 2).
//! Control-plane groups go first: no worker instance is created while a
//! control-plane node is outdated (a kubelet must never be newer than the API
//! server). With a topologyKey, one failure domain at a time ([`domains`]).

pub mod domains;
mod facts;
pub mod halt;
mod plan;
pub mod waves;

pub use facts::{DrainState, Facts, GroupFacts, JoinFacts, NodeFacts, Role};
pub use plan::{Counts, Step, counts, plan, workers_wait_for_control_plane};
