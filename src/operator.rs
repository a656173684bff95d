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
use crate::api::update::{AutoscalingStrategy, JoiningNode, NodeVersion, PendingNode, ScalingGroup};
use crate::cloud::CloudProvider;
use crate::cloud::metered::MeteredCloud;
use crate::controllers::autoscaling_strategy::{self, AutoscalingStrategyReconciler};
use crate::controllers::joining_node::{self, JoiningNodeReconciler};
use crate::controllers::node_maintenance::{
    AllClaims, Claim, ClaimsOf, MaintenanceConfig, MaintenanceContext, NODE_INDEX, NodeMaintenanceReconciler,
    index_by_node, keys_for_node,
};
use crate::controllers::node_version::NodeVersionReconciler;
use crate::controllers::pending_node::PendingNodeReconciler;
use crate::controllers::scaling_group::{self, ScalingGroupReconciler};
use crate::drain::DrainEngine;
use crate::http::{self, HttpState};
use crate::runtime::controller::{Controller, ControllerConfig};
use crate::runtime::leader::{ConfigError, LeaderElectionConfig, LeaderElector, LeaderHandle};
use crate::runtime::reflector::{Reflector, ReflectorConfig, strip_node};
use crate::runtime::store::{ObjectKey, Store};
use crate::telemetry::Metrics;
use k8s_openapi::api::apps::v1::Deployment;

#[derive(Clone)]
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
    /// The cloud that replaces nodes; None: no rolling replacement, only maintenance.
    pub cloud: Option<Arc<dyn CloudProvider>>,
    /// Create ScalingGroups (following this NodeVersion) for cloud groups that
    /// have none, while leading.
    pub discover_scaling_groups: Option<String>,
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
        metrics.clone(),
    ));
    let controller_config = ControllerConfig {
        workers: config.workers,
        ..Default::default()
    };
    let mut medik8s_controller = maintenance_controller(
        "nodemaintenance",
        &maintenance,
        &mut nm_medik8s,
        &mut nodes,
        &controller_config,
        &metrics,
    );
    let mut kubevirt_controller = maintenance_controller(
        "nodemaintenance-kubevirt",
        &maintenance,
        &mut nm_kubevirt,
        &mut nodes,
        &controller_config,
        &metrics,
    );

    // Claims on a node come from both groups' stores.
    medik8s_controller.needs(&kubevirt_store);
    kubevirt_controller.needs(&medik8s_store);

    let mut rollout_tasks = Vec::new();
    let mut rollout_synced: Vec<SyncedCheck> = Vec::new();
    if let Some(cloud) = &config.cloud {
        let cloud: Arc<dyn CloudProvider> = Arc::new(MeteredCloud::new(cloud.clone(), metrics.clone()));
        let (tasks, synced) = rollout_controllers(
            &client,
            cloud,
            &leader,
            &config,
            &mut nodes,
            &mut nm_medik8s,
            &controller_config,
            &metrics,
        );
        rollout_tasks = tasks;
        rollout_synced = synced;
    }
    let ready = (
        node_store.clone(),
        medik8s_store.clone(),
        kubevirt_store.clone(),
        rollout_synced,
    );
    let state = HttpState {
        metrics: metrics.clone(),
        ready: Arc::new(move || {
            ready.0.is_synced() && ready.1.is_synced() && ready.2.is_synced() && ready.3.iter().all(|s| s())
        }),
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
    for task in rollout_tasks {
        tasks.spawn(task(leader.clone(), work.clone()));
    }
    tasks.spawn(nodes.run(work.clone()));
    tasks.spawn(nm_medik8s.run(work.clone()));
    tasks.spawn(nm_kubevirt.run(work.clone()));
    tasks.spawn(medik8s_controller.run(leader.clone(), work.clone()));
    tasks.spawn(kubevirt_controller.run(leader.clone(), work.clone()));
    tasks.spawn(stop_drains_when_not_leading(
        leader.clone(),
        engine.clone(),
        metrics.clone(),
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
    metrics: Metrics,
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
            metrics.forget_leader_state();
        }
    }
    engine.stop_all();
}

/// "Has this store its first full list?", for /readyz.
type SyncedCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// A task of the operator, started with the leader handle and the shutdown token.
type Task =
    Box<dyn FnOnce(LeaderHandle, CancellationToken) -> futures::future::BoxFuture<'static, ()> + Send>;

fn reflector_of<K>(client: &Client, name: &str, selector: &Option<String>) -> Reflector<K>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    Reflector::new(
        name,
        Api::<K>::all(client.clone()),
        ReflectorConfig {
            label_selector: selector.clone(),
            ..Default::default()
        },
    )
}

/// The rolling-replacement controllers (NodeVersion, PendingNode) and their
/// reflectors. Returns the tasks to spawn and the synced checks for /readyz.
#[allow(clippy::too_many_arguments)]
fn rollout_controllers(
    client: &Client,
    cloud: Arc<dyn CloudProvider>,
    leader: &LeaderHandle,
    config: &OperatorConfig,
    nodes: &mut Reflector<Node>,
    maintenances: &mut Reflector<medik8s::NodeMaintenance>,
    controller_config: &ControllerConfig,
    metrics: &Metrics,
) -> (Vec<Task>, Vec<SyncedCheck>) {
    let selector = &config.object_selector;
    let cloud_for_groups = cloud.clone();
    let cloud_for_discovery = cloud.clone();
    let mut versions = reflector_of::<NodeVersion>(client, "nodeversions", selector);
    let mut groups = reflector_of::<ScalingGroup>(client, "scalinggroups", selector);
    let mut pending = reflector_of::<PendingNode>(client, "pendingnodes", selector);
    let mut strategies = reflector_of::<AutoscalingStrategy>(client, "autoscalingstrategies", selector);
    let mut joining = reflector_of::<JoiningNode>(client, "joiningnodes", selector);
    // The autoscaler Deployments the strategies name (Deployments are few).
    let mut deployments = Reflector::new(
        "deployments",
        Api::<Deployment>::all(client.clone()),
        ReflectorConfig::default(),
    );
    let (version_store, group_store, pending_store, strategy_store) = (
        versions.store(),
        groups.store(),
        pending.store(),
        strategies.store(),
    );
    let group_store_for_discovery = group_store.clone();

    let mut version_controller = Controller::new(
        "nodeversion",
        NodeVersionReconciler {
            client: client.clone(),
            cloud: cloud.clone(),
            leader: leader.clone(),
            versions: version_store.clone(),
            groups: group_store.clone(),
            nodes: nodes.store(),
            pending: pending_store.clone(),
            maintenances: maintenances.store(),
            strategies: strategy_store.clone(),
            metrics: metrics.clone(),
        },
        controller_config.clone(),
        metrics.clone(),
    );
    // Read, not watched: the autoscaler's strategies.
    version_controller.needs(&strategy_store);
    // Few NodeVersions exist: any relevant change looks at all of them.
    let all_versions = {
        let store = version_store.clone();
        move || store.keys()
    };
    version_controller.watches(&mut versions, |v: &NodeVersion| {
        ObjectKey::of(v).into_iter().collect()
    });
    let all = all_versions.clone();
    version_controller.watches(nodes, move |_: &Node| all());
    let all = all_versions.clone();
    version_controller.watches(&mut pending, move |_: &PendingNode| all());
    let all = all_versions.clone();
    version_controller.watches(maintenances, move |m: &medik8s::NodeMaintenance| {
        if m.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with(crate::controllers::node_version::DRAIN_PREFIX))
        {
            all()
        } else {
            Vec::new()
        }
    });
    let all = all_versions.clone();
    version_controller.watches(&mut groups, move |_: &ScalingGroup| all());

    let mut pending_controller = Controller::new(
        "pendingnode",
        PendingNodeReconciler {
            client: client.clone(),
            cloud: cloud.clone(),
            leader: leader.clone(),
            pending: pending_store.clone(),
            nodes: nodes.store(),
        },
        controller_config.clone(),
        metrics.clone(),
    );
    pending_controller.watches(&mut pending, |p: &PendingNode| {
        ObjectKey::of(p).into_iter().collect()
    });
    let by_node = pending_store.clone();
    pending_controller.watches(nodes, move |n: &Node| {
        let name = n.metadata.name.clone().unwrap_or_default();
        by_node
            .list()
            .iter()
            .filter(|p| p.spec.node_name == name)
            .filter_map(|p| ObjectKey::of(p.as_ref()))
            .collect()
    });

    let mut group_controller = Controller::new(
        "scalinggroup",
        ScalingGroupReconciler::new(
            client.clone(),
            leader.clone(),
            cloud_for_groups,
            group_store.clone(),
            version_store.clone(),
        ),
        controller_config.clone(),
        metrics.clone(),
    );
    group_controller.watches(&mut groups, |g: &ScalingGroup| {
        ObjectKey::of(g).into_iter().collect()
    });
    let by_version = group_store.clone();
    group_controller.watches(&mut versions, move |v: &NodeVersion| {
        scaling_group::keys_for_node_version(&by_version, v)
    });

    let mut strategy_controller = Controller::new(
        "autoscalingstrategy",
        AutoscalingStrategyReconciler::new(
            client.clone(),
            leader.clone(),
            strategy_store.clone(),
            deployments.store(),
        ),
        controller_config.clone(),
        metrics.clone(),
    );
    strategy_controller.watches(&mut strategies, |s: &AutoscalingStrategy| {
        ObjectKey::of(s).into_iter().collect()
    });
    let by_deployment = strategy_store.clone();
    strategy_controller.watches(&mut deployments, move |d: &Deployment| {
        autoscaling_strategy::keys_for_deployment(&by_deployment, d)
    });

    let joining_store = joining.store();
    let mut joining_controller = Controller::new(
        "joiningnode",
        JoiningNodeReconciler::new(
            client.clone(),
            leader.clone(),
            joining_store.clone(),
            nodes.store(),
        ),
        controller_config.clone(),
        metrics.clone(),
    );
    joining_controller.watches(&mut joining, |j: &JoiningNode| {
        ObjectKey::of(j).into_iter().collect()
    });
    let by_node = joining_store.clone();
    joining_controller.watches(nodes, move |n: &Node| joining_node::keys_for_node(&by_node, n));

    let synced: Vec<SyncedCheck> = vec![
        Arc::new(move || joining_store.is_synced()),
        Arc::new(move || version_store.is_synced()),
        Arc::new(move || group_store.is_synced()),
        Arc::new(move || pending_store.is_synced()),
        Arc::new(move || strategy_store.is_synced()),
    ];
    let mut tasks: Vec<Task> = Vec::new();
    if let Some(node_version) = config.discover_scaling_groups.clone() {
        let (client, cloud, store) = (client.clone(), cloud_for_discovery, group_store_for_discovery);
        tasks.push(Box::new(move |leader, stop| {
            Box::pin(discover_scaling_groups(
                client,
                cloud,
                store,
                node_version,
                leader,
                stop,
            ))
        }));
    }
    tasks.extend::<Vec<Task>>(vec![
        Box::new(move |_, stop| Box::pin(versions.run(stop))),
        Box::new(move |_, stop| Box::pin(groups.run(stop))),
        Box::new(move |_, stop| Box::pin(pending.run(stop))),
        Box::new(move |_, stop| Box::pin(strategies.run(stop))),
        Box::new(move |leader, stop| Box::pin(version_controller.run(leader, stop))),
        Box::new(move |leader, stop| Box::pin(pending_controller.run(leader, stop))),
        Box::new(move |_, stop| Box::pin(joining.run(stop))),
        Box::new(move |_, stop| Box::pin(deployments.run(stop))),
        Box::new(move |leader, stop| Box::pin(group_controller.run(leader, stop))),
        Box::new(move |leader, stop| Box::pin(strategy_controller.run(leader, stop))),
        Box::new(move |leader, stop| Box::pin(joining_controller.run(leader, stop))),
    ]);
    (tasks, synced)
}

/// While leading: create ScalingGroups for cloud groups that have none, at
/// once and then every 10 minutes (Constellation runs this outside leader
/// election; here only the leader writes).
async fn discover_scaling_groups(
    client: Client,
    cloud: Arc<dyn CloudProvider>,
    groups: Store<ScalingGroup>,
    node_version: String,
    leader: LeaderHandle,
    stop: CancellationToken,
) {
    let mut leading = leader.subscribe();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = leading.wait_for(|l| *l) => if changed.is_err() { return },
        }
        if leader.is_leader() {
            match scaling_group::discover_and_create(
                &client,
                cloud.as_ref(),
                &groups,
                &node_version,
                &Default::default(),
            )
            .await
            {
                Ok(created) if !created.is_empty() => tracing::info!(?created, "discovered scaling groups"),
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "scaling group discovery failed"),
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(600)) => {}
        }
    }
}
