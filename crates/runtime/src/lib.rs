//! Hand-written watch, store, work-queue and leader-election machinery, and
//! the Manager that puts them together. Nothing here imports the rest of
//! nodewarden: the application reaches in through traits
//! ([`error::Categorized`], [`metrics::RuntimeMetrics`]).

pub mod backoff;
pub mod controller;
pub mod error;
pub mod fence;
pub mod leader;
pub mod lease;
pub mod manager;
pub mod metrics;
pub mod owner;
pub mod rate_limiter;
pub mod reflector;
pub mod store;
pub mod sync;
pub mod workqueue;
