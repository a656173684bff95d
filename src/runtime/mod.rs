//! Hand-written watch, store, work-queue and leader-election machinery.

pub mod backoff;
pub mod controller;
pub mod leader;
pub mod rate_limiter;
pub mod reflector;
pub mod store;
pub mod workqueue;
