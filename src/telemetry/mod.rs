//! Logging, tracing and metrics setup, and the rollout timeline drawn from traces.

pub mod logging;
pub mod metrics;
pub mod timeline;

pub use logging::init_logging;
pub use metrics::Metrics;
pub mod trace;
