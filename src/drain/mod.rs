//! Taking nodes out of service: quarantine (cordon, taints, labels) with exact
//! undo ([`node`]), which pods a drain evicts and which PodDisruptionBudgets
//! cover them ([`pods`]), and the drain engine that evicts them through the
//! Eviction API ([`engine`]), woken when a refusing budget frees up
//! ([`budgets`]). A Plan's drain follows kubectl's rules instead
//! ([`kubectl`]). The NodeMaintenance controller is its one user;
//! a node replacement drains its old node through a NodeMaintenance.

pub mod budgets;
pub mod engine;
pub mod kubectl;
pub mod node;
pub mod pods;

pub use engine::{DrainEngine, DrainOptions, DrainOutcome, DrainProgress, DrainStatus};
