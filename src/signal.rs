//! How a nodewarden process is asked to stop: SIGTERM (Kubernetes stopping
//! the pod) or SIGINT (Ctrl-C). The operator and the sim-cloud both wait
//! for it.

use tokio::signal::unix::{SignalKind, signal};

/// Returns at SIGTERM or SIGINT (Ctrl-C).
pub async fn wait() {
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops gracefully");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
