//! Logging setup.

use std::io::IsTerminal;

use opentelemetry_sdk::trace::SdkTracer;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Installs the global tracing subscriber: human-readable logs to stderr
/// (coloured only when stderr is a terminal: CI logs and files get plain
/// text), or JSON lines when `json` is set. The level comes from `RUST_LOG` (default
/// info). With a `tracer` (trace export configured), spans also go to
/// OpenTelemetry.
pub fn init_logging(json: bool, tracer: Option<SdkTracer>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let otel = tracer.map(|t| tracing_opentelemetry::layer().with_tracer(t));
    let registry = tracing_subscriber::registry().with(filter).with(otel);
    if json {
        let _ = registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init();
    } else {
        let _ = registry
            .with(
                fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(std::io::stderr),
            )
            .try_init();
    }
}
