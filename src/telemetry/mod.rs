//! Logging, tracing and metrics setup.

pub mod logging;
pub mod metrics;

pub use logging::init_logging;
pub use metrics::Metrics;
pub mod trace;
