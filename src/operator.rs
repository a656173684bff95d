//! `nodewarden run`: the operator process. Every replica lists and watches
//! (hot standby); the elected leader's workers reconcile.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use kube::runtime::events::{Recorder, Reporter};

use crate::api::node_maintenance::{MaintenanceObject, kubevirt, medik8s};
use crate::controllers::node_maintenance::{
    AllClaims, Claim, ClaimsOf, MaintenanceConfig, MaintenanceContext, NODE_INDEX, NodeMaintenanceReconciler,
    index_by_node, keys_for_node,
};
use crate::drain::DrainEngine;
use crate::http::{self, HttpState};
use crate::runtime::controller::{Controller, ControllerConfig};
use crate::runtime::leader::{ConfigError, LeaderElectionConfig, LeaderElector, LeaderHandle};
use crate::runtime::reflector::{Reflector, ReflectorConfig, strip_node};
use crate::runtime::store::{ObjectKey, Store};
use crate::telemetry::Metrics;

#[derive(Clone, Debug)]
pub struct OperatorConfig {
    pub leader: LeaderElectionConfig,
    /// Where /healthz, /readyz and /metrics are served.
    pub http_addr: SocketAddr,
    /// Only Nodes matching this label selector are nodewarden's to manage.
    pub node_selector: Option<String>,
    /// Only nodewarden objects (NodeMaintenance, ...) matching this label selector are handled.
    pub object_selector: Option<String>,
    pub maintenance: MaintenanceConfig,
    /// Workers per controller.
    pub workers: usize,
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

    let mut nodes = Reflector::new(
        "nodes",
        Api::<Node>::all(client.clone()),
        ReflectorConfig {
            label_selector: config.node_selector.clone(),
            ..Default::default()
        },
    )
    .with_transform(strip_node);
    let node_store = nodes.store();
    let mut nm_medik8s = Reflector::new(
        "nodemaintenances.medik8s",
        Api::<medik8s::NodeMaintenance>::all(client.clone()),
        ReflectorConfig {
            label_selector: config.object_selector.clone(),
            ..Default::default()
        },
    );
    let mut nm_kubevirt = Reflector::new(
        "nodemaintenances.kubevirt",
        Api::<kubevirt::NodeMaintenance>::all(client.clone()),
        ReflectorConfig {
            label_selector: config.object_selector.clone(),
            ..Default::default()
        },
    );
    let (medik8s_store, kubevirt_store) = (nm_medik8s.store(), nm_kubevirt.store());
    index_by_node(&medik8s_store);
    index_by_node(&kubevirt_store);

    let engine = DrainEngine::new(client.clone(), leader.clone());
    let reporter = Reporter {
        controller: "nodewarden".into(),
        instance: Some(leader.identity().to_string()),
    };
    let maintenance = Arc::new(MaintenanceContext::new(
        client.clone(),
        leader.clone(),
        engine.clone(),
        Recorder::new(client.clone(), reporter),
        node_store.clone(),
        claims_of(medik8s_store.clone(), kubevirt_store.clone()),
        all_claims(medik8s_store.clone(), kubevirt_store.clone()),
        config.maintenance.clone(),
    ));
    let controller_config = ControllerConfig {
        workers: config.workers,
        ..Default::default()
    };
    let medik8s_controller = maintenance_controller(
        "nodemaintenance",
        &maintenance,
        &mut nm_medik8s,
        &mut nodes,
        &controller_config,
        &metrics,
    );
    let kubevirt_controller = maintenance_controller(
        "nodemaintenance-kubevirt",
        &maintenance,
        &mut nm_kubevirt,
        &mut nodes,
        &controller_config,
        &metrics,
    );

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
    tasks.spawn(nm_medik8s.run(work.clone()));
    tasks.spawn(nm_kubevirt.run(work.clone()));
    tasks.spawn(medik8s_controller.run(leader.clone(), work.clone()));
    tasks.spawn(kubevirt_controller.run(leader.clone(), work.clone()));
    tasks.spawn(stop_drains_when_not_leading(
        leader.clone(),
        engine.clone(),
        work.clone(),
    ));
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

/// One group's NodeMaintenance controller: its own objects, and the Nodes they name.
fn maintenance_controller<M: MaintenanceObject>(
    name: &str,
    ctx: &Arc<MaintenanceContext>,
    reflector: &mut Reflector<M>,
    nodes: &mut Reflector<Node>,
    config: &ControllerConfig,
    metrics: &Metrics,
) -> Controller<NodeMaintenanceReconciler<M>> {
    let queue = Arc::new(std::sync::OnceLock::new());
    let store = reflector.store();
    let reconciler = NodeMaintenanceReconciler {
        ctx: ctx.clone(),
        store: store.clone(),
        queue: queue.clone(),
    };
    let mut controller = Controller::new(name, reconciler, config.clone(), metrics.clone());
    let _ = queue.set(controller.queue());
    controller.watches(reflector, |m: &M| ObjectKey::of(m).into_iter().collect());
    controller.watches(nodes, move |node: &Node| keys_for_node(&store, node));
    controller
}

fn claims_of(a: Store<medik8s::NodeMaintenance>, b: Store<kubevirt::NodeMaintenance>) -> ClaimsOf {
    Arc::new(move |node: &str| {
        let mut claims: Vec<Claim> = a
            .by_index(NODE_INDEX, node)
            .iter()
            .map(|m| Claim::of(m.as_ref()))
            .collect();
        claims.extend(b.by_index(NODE_INDEX, node).iter().map(|m| Claim::of(m.as_ref())));
        claims
    })
}

fn all_claims(a: Store<medik8s::NodeMaintenance>, b: Store<kubevirt::NodeMaintenance>) -> AllClaims {
    Arc::new(move || {
        let mut claims: Vec<Claim> = a.list().iter().map(|m| Claim::of(m.as_ref())).collect();
        claims.extend(b.list().iter().map(|m| Claim::of(m.as_ref())));
        claims
    })
}

/// Drains are tasks of their own: stop them the moment leadership is lost.
async fn stop_drains_when_not_leading(
    leader: LeaderHandle,
    engine: DrainEngine,
    shutdown: CancellationToken,
) {
    let mut leading = leader.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = leading.changed() => if changed.is_err() { break },
        }
        if !*leading.borrow_and_update() {
            engine.stop_all();
        }
    }
    engine.stop_all();
}
