//! Taking nodes out of service: quarantine (cordon, taints, labels) with exact
//! undo, and the drain engine (evictions honouring PodDisruptionBudgets).
//! Shared by node maintenance, node replacement and upgrade plans.

pub mod engine;
pub mod node;
pub mod pods;

pub use engine::{DrainEngine, DrainOptions, DrainOutcome, DrainProgress, DrainStatus};
