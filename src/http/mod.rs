//! The hyper server for /healthz, /readyz and /metrics.
