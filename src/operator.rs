//! `nodewarden run`: the operator process. Every replica lists and watches
//! (hot standby); the elected leader's workers reconcile. This file only
//! chooses which controllers run (see `controllers::register_all`); the
//! Manager runs them.

use std::net::SocketAddr;
use std::sync::Arc;

use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::cloud::CloudProvider;
use crate::cloud::batch::BatchedStates;
use crate::cloud::metered::{CloudMetrics, MeteredCloud, Ration};
use crate::cloud::retry::{RetryPolicy, RetryingCloud};
use crate::controllers::node_maintenance::MaintenanceConfig;
use crate::controllers::{App, BareMetal, register_all, scaling_group};
use crate::http::{self, HttpState};
use crate::runtime::controller::ControllerConfig;
use crate::runtime::leader::{ConfigError, LeaderElectionConfig, LeaderElector};
use crate::runtime::manager::{Manager, Source};
use crate::telemetry::Metrics;

/// The leader-election Lease's name unless `--lease-name` says otherwise.
pub const LEASE_NAME: &str = "nodewarden";

/// Everything `nodewarden run` is configured with.
#[derive(Clone)]
pub struct OperatorConfig {
    /// Lease and timing of the leader election.
    pub leader: LeaderElectionConfig,
    /// Where /healthz, /readyz and /metrics are served.
    pub http_addr: SocketAddr,
    /// Only Nodes matching this label selector are nodewarden's to manage.
    pub node_selector: Option<String>,
    /// Only nodewarden objects (NodeMaintenance, ...) matching this label selector are handled.
    pub object_selector: Option<String>,
    /// NodeMaintenance settings.
    pub maintenance: MaintenanceConfig,
    /// Plan settings.
    pub plans: crate::controllers::plan::PlanConfig,
    /// The rollout settings a NodeVersion that leaves a field out gets.
    pub rollout: crate::api::update::Rollout,
    /// Workers per controller.
    pub workers: usize,
    /// The cloud that replaces nodes; None: no rolling replacement, only maintenance.
    pub cloud: Option<Arc<dyn CloudProvider>>,
    /// The calls a second to that cloud, shared by every controller.
    pub cloud_ration: Ration,
    /// etcd, whose member a control-plane node loses before it is retired:
    /// found on the control plane unless endpoints are given or it is external.
    pub etcd: crate::etcd::EtcdSetup,
    /// Constellation's upgrade-agent, which upgrades the control plane in
    /// place for a new `kubernetesClusterVersion` (None: not mounted).
    pub upgrade_agent: Option<crate::upgrade_agent::AgentClient>,
    /// Create ScalingGroups (following this NodeVersion) for cloud groups that
    /// have none, while leading.
    pub discover_scaling_groups: Option<String>,
    /// Run the SIPCluster controller (it needs metal3's BareMetalHost API).
    pub bare_metal: BareMetal,
    /// Serve the validating admission webhook (every replica); None: off.
    pub admission: Option<crate::admission::AdmissionConfig>,
    /// What any client of the webhook is held to (body size, timeouts,
    /// connections and reviews at once).
    pub webhook_limits: crate::admission::Limits,
}

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The leader election settings break its guarantees.
    #[error(transparent)]
    LeaderConfig(#[from] ConfigError),
    /// The HTTP endpoints could not be served.
    #[error("serving HTTP on {addr}: {source}")]
    Http {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        source: std::io::Error,
    },
}

/// The Manager `nodewarden run` runs: leader election and every controller
/// `config` asks for, registered. Tests run the same one.
pub fn manager(client: Client, config: &OperatorConfig, metrics: &Metrics) -> Result<Manager, OperatorError> {
    let elector = LeaderElector::new(client.clone(), config.leader.clone())?;
    let controller_config = ControllerConfig {
        workers: config.workers,
        ..Default::default()
    };
    let mut manager = Manager::new(client, elector, controller_config, Arc::new(metrics.clone()));
    let mut app = App::new(&manager, metrics.clone());
    app.nodes = Source::labelled(config.node_selector.clone());
    app.objects = Source::labelled(config.object_selector.clone());
    app.maintenance = config.maintenance.clone();
    app.plans = config.plans.clone();
    app.rollout = config.rollout.clone();
    app.bare_metal = config.bare_metal;
    app.cloud = config.cloud.clone().map(|cloud| {
        // Each attempt is metered and rationed; the state reads made at
        // once share one attempt; reads are retried above that.
        let metered = Arc::new(MeteredCloud::rationed(
            cloud,
            CloudMetrics::register(metrics),
            config.cloud_ration,
        ));
        let batched = Arc::new(BatchedStates::new(metered));
        Arc::new(RetryingCloud::new(batched, RetryPolicy::default())) as Arc<dyn CloudProvider>
    });
    app.etcd = config.etcd.clone();
    app.upgrade_agent = config.upgrade_agent.clone();
    log_etcd_setup(&app.etcd);
    register_all(&mut manager, &app);
    if let Some(node_version) = config.discover_scaling_groups.clone() {
        scaling_group::register_discovery(&mut manager, &app, node_version);
    }
    if let Some(admission) = config.admission.clone() {
        register_admission(&mut manager, admission, config.webhook_limits, metrics.clone());
    }
    Ok(manager)
}

/// The webhook on every replica: its server and its certificate keeper.
fn register_admission(
    manager: &mut Manager,
    config: crate::admission::AdmissionConfig,
    limits: crate::admission::Limits,
    metrics: Metrics,
) {
    use crate::admission::server;
    let resolver = Arc::new(server::CertResolver::default());
    // Every replica may create the Secret (the first create wins); the
    // keeper checks leadership itself before a renewal or a caBundle write.
    let (client, keeper_config, keeper_resolver) = (
        manager.unfenced_client().clone(),
        config.clone(),
        resolver.clone(),
    );
    manager.add_task(Box::new(move |leader, stop| {
        Box::pin(server::keep_certificates(
            client,
            keeper_config,
            keeper_resolver,
            leader,
            stop,
        ))
    }));
    let client = manager.client().clone();
    let metrics = crate::admission::metrics::WebhookMetrics::register(&metrics);
    manager.add_task(Box::new(move |_, stop| {
        Box::pin(server::serve(client, config, limits, metrics, resolver, stop))
    }));
}

/// Runs the operator until `shutdown` is cancelled, then stops the workers
/// first and releases the lease last, so a standby takes over at once.
pub async fn run(
    client: Client,
    config: OperatorConfig,
    shutdown: CancellationToken,
) -> Result<(), OperatorError> {
    let metrics = Metrics::new();
    let manager = manager(client, &config, &metrics)?;
    let identity = manager.leader().identity().to_owned();
    let state = HttpState {
        metrics,
        ready: Arc::new(manager.readiness()),
    };
    let http_stop = CancellationToken::new();
    let (addr, serve) = http::bind(config.http_addr, state, http_stop.clone())
        .await
        .map_err(|source| OperatorError::Http {
            addr: config.http_addr,
            source,
        })?;
    tracing::info!(%addr, %identity, "nodewarden serving /healthz, /readyz, /metrics");
    let http_task = tokio::spawn(serve);
    manager.run(shutdown).await;
    http_stop.cancel();
    let _ = http_task.await;
    tracing::info!("stopped");
    Ok(())
}

/// Says once at the start how etcd members of retired control-plane nodes
/// are removed.
fn log_etcd_setup(setup: &crate::etcd::EtcdSetup) {
    use crate::etcd::EtcdSetup;
    match setup {
        EtcdSetup::Endpoints(client) => tracing::info!(
            endpoints = ?client.endpoints(),
            "etcd member removal through the given endpoints: a control-plane node's member is removed before the node is retired"
        ),
        EtcdSetup::Discover(d) => tracing::info!(
            placement = ?d.placement,
            ca = %d.ca.display(),
            cert = %d.cert.display(),
            port = d.client_port,
            "etcd found on the control-plane nodes: a node that runs a member loses it before it is retired, and waits while etcd cannot be reached"
        ),
        EtcdSetup::External => tracing::info!(
            "etcd is external (--etcd-on-control-plane=false): retired control-plane nodes' members are not touched"
        ),
    }
}
