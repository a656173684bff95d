//! `nodewarden run`: the operator process. Every replica lists and watches
//! (hot standby); the elected leader's workers reconcile.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use crate::http::{self, HttpState};
use crate::runtime::leader::{ConfigError, LeaderElectionConfig, LeaderElector};
use crate::runtime::reflector::{Reflector, ReflectorConfig, strip_node};
use crate::telemetry::Metrics;

#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub leader: LeaderElectionConfig,
    /// Where /healthz, /readyz and /metrics are served.
    pub http_addr: SocketAddr,
    /// Only Nodes matching this label selector are nodewarden's to manage.
    pub node_selector: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error(transparent)]
    LeaderConfig(#[from] ConfigError),
    #[error("serving HTTP on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Runs the operator until `shutdown` is cancelled, then stops the workers
/// first and releases the lease last, so a standby takes over at once.
pub async fn run(
    client: Client,
    config: OperatorConfig,
    shutdown: CancellationToken,
) -> Result<(), OperatorError> {
    let metrics = Metrics::new();
    let elector = LeaderElector::new(client.clone(), config.leader.clone())?;
    let leader = elector.handle();

    let nodes = Reflector::new(
        "nodes",
        Api::<Node>::all(client.clone()),
        ReflectorConfig {
            label_selector: config.node_selector.clone(),
            ..Default::default()
        },
    )
    .with_transform(strip_node);
    let node_store = nodes.store();

    let ready_stores = node_store.clone();
    let state = HttpState {
        metrics: metrics.clone(),
        ready: Arc::new(move || ready_stores.is_synced()),
    };
    let (addr, serve) = http::bind(config.http_addr, state, shutdown.clone())
        .await
        .map_err(|source| OperatorError::Http {
            addr: config.http_addr,
            source,
        })?;
    tracing::info!(%addr, identity = %leader.identity(), "nodewarden serving /healthz, /readyz, /metrics");

    // Workers and reflectors stop on `work`; the elector on `election`, after them.
    let work = CancellationToken::new();
    let election = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(nodes.run(work.clone()));
    let elector_task = tokio::spawn(elector.run(election.clone()));
    let gauge = metrics.leader.clone();
    let mut leading = leader.subscribe();
    let leader_gauge = tokio::spawn(async move {
        loop {
            gauge.set(i64::from(*leading.borrow_and_update()));
            if leading.changed().await.is_err() {
                return;
            }
        }
    });
    let http_task = tokio::spawn(serve);

    shutdown.cancelled().await;
    tracing::info!("shutting down: stopping workers");
    work.cancel();
    while tasks.join_next().await.is_some() {}
    election.cancel();
    // Bounded: releasing the lease is one API call.
    let _ = tokio::time::timeout(Duration::from_secs(10), elector_task).await;
    leader_gauge.abort();
    let _ = http_task.await;
    tracing::info!("stopped");
    Ok(())
}
