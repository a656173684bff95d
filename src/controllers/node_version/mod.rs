//! The NodeVersion controller: replaces every node whose image or Kubernetes
//! components differ from its NodeVersion, within the rollout's budgets.
//!
//! It gathers facts from its stores (Nodes, ScalingGroups, PendingNodes,
//! NodeMaintenances) and asks the cloud only for what nodes lack (their group
//! and image, then cached in annotations, as Constellation does). The plan
//! itself is [`crate::rollout::plan`], a pure function. Event-driven: every
//! change of a watched object reconciles the NodeVersions again.
//!
//! Creating an instance never leaks one: the PendingNode that tracks it is
//! written first, and its UID is the idempotency key of the cloud call, so a
//! leader that dies in between leaves a PendingNode its successor completes.
//!
//! A pass runs in phases, a module each: `gather` reads the facts; `decide`
//! (what the planner is told, the pairings) and `status` (what the status
//! says) are pure; `act` and `retire` change the world; `report` writes the
//! status (through the write cache in `status_writes`), Events, metrics and
//! the rollout's trace.

mod act;
mod control_plane;
mod decide;
mod etcd_reach;
mod gather;
pub mod metrics;
mod report;
mod retire;
mod status;
mod status_writes;
mod workloads;

use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::{Client, ResourceExt};

pub use self::decide::{inheritable_labels, pairing_patches};
pub use self::gather::Retired;
pub use self::status::{Problems, STATUS_LIST_LIMIT};
pub use self::status_writes::StatusWrites;
use super::App;
use super::replacement_trace::SentRoots;
use crate::api::node_maintenance::medik8s;
pub use crate::api::update::annotations::{
    COMPONENTS_ANNOTATION, DONOR_ANNOTATION, GROUP_ANNOTATION, HEIR_ANNOTATION, IMAGE_ANNOTATION,
    OBSOLETE_ANNOTATION, PAUSED_BY_ANNOTATION,
};
use crate::api::update::{AutoscalingStrategy, NodeVersion, PendingNode, Rollout, ScalingGroup, reason};
use crate::cloud::CloudProvider;
use crate::error::{Error, Result};
use crate::etcd::EtcdSetup;
use crate::rollout;
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, Source, always};
use crate::runtime::store::{Key, Store};
use crate::runtime::workqueue::WorkQueue;

/// NodeMaintenances a rollout creates are named with this prefix.
pub const DRAIN_PREFIX: &str = "nodewarden-replace-";

/// The name of the NodeMaintenance that drains `node` for a rollout.
pub fn drain_name(node: &str) -> String {
    format!("{DRAIN_PREFIX}{node}")
}

/// The NodeVersion controller. Few NodeVersions exist, so any relevant
/// change of a Node, PendingNode, ScalingGroup or rollout drain looks at all
/// of them; Node updates only when they change what a rollout reads.
pub fn register(manager: &mut Manager, app: &App) {
    let Some(cloud) = app.cloud.clone() else {
        return;
    };
    let mut c = manager.controller::<NodeVersion>("nodeversion", &app.objects);
    let versions = c.store();
    let all = move || versions.keys();
    let every = all.clone();
    let nodes = c.watches(&app.nodes, super::node_changed(), move |_: &Node| every());
    let every = all.clone();
    let pending = c.watches(&app.objects, always(), move |_: &PendingNode| every());
    let every = all.clone();
    let groups = c.watches(&app.objects, always(), move |_: &ScalingGroup| every());
    let every = all;
    let maintenances = c.watches(&app.objects, always(), move |m: &medik8s::NodeMaintenance| {
        if m.name_any().starts_with(DRAIN_PREFIX) || m.name_any() == m.spec.node_name {
            every()
        } else {
            Vec::new()
        }
    });
    // Read, not watched: the autoscaler's strategies.
    let strategies = c.reads::<AutoscalingStrategy>(&app.objects);
    c.on_failure(app.report_failures());
    let queue = c.queue();
    c.register(NodeVersionReconciler {
        client: app.client.clone(),
        cloud,
        leader: app.leader.clone(),
        groups,
        nodes,
        pending,
        maintenances,
        strategies,
        metrics: metrics::RolloutMetrics::register(&app.metrics),
        recorder: app.recorder.clone(),
        sent_roots: SentRoots::default(),
        status_writes: StatusWrites::default(),
        queue,
        drains: app.drains.clone(),
        retired: Retired::default(),
        node_source: app.nodes.clone(),
        object_source: app.objects.clone(),
        rollout_defaults: app.rollout.clone(),
        etcd: app.etcd.clone(),
        etcd_turn: Default::default(),
        upgrade_agent: app.upgrade_agent.clone(),
        control_plane_runs: Default::default(),
        pod_trials: Default::default(),
    });
}

/// Replaces outdated nodes of one NodeVersion (see the module docs).
pub struct NodeVersionReconciler {
    /// The API client.
    pub client: Client,
    /// The cloud that creates and deletes instances.
    pub cloud: Arc<dyn CloudProvider>,
    /// This replica's leadership, checked before anything disruptive.
    pub leader: LeaderHandle,
    /// The ScalingGroups.
    pub groups: Store<ScalingGroup>,
    /// The managed Nodes.
    pub nodes: Store<Node>,
    /// The PendingNodes that track joining and leaving instances.
    pub pending: Store<PendingNode>,
    /// The NodeMaintenances (the rollout drains through them).
    pub maintenances: Store<medik8s::NodeMaintenance>,
    /// The autoscaler's strategies (paused during a rollout).
    pub strategies: Store<AutoscalingStrategy>,
    /// Rollout metrics.
    pub metrics: metrics::RolloutMetrics,
    /// Publishes the rollout's Events on its NodeVersion.
    pub recorder: kube::runtime::events::Recorder,
    /// Replacement roots this replica sent.
    pub sent_roots: SentRoots,
    /// Status writes in flight.
    pub status_writes: StatusWrites,
    /// The drains of this replica: a drained node's pods as its drain's
    /// watch sees them (see `evict_stragglers`).
    pub drains: crate::drain::DrainEngine,
    /// Nodes this replica deleted that the store may still show.
    pub retired: Retired,
    /// This controller's queue (a failed status write queues its object).
    pub queue: WorkQueue<Key<NodeVersion>>,
    /// The Nodes the `nodes` store watches, for a fresh read.
    pub node_source: Source,
    /// The PendingNodes the `pending` store watches, for a fresh read.
    pub object_source: Source,
    /// The rollout settings a NodeVersion that leaves a field out gets.
    pub rollout_defaults: Rollout,
    /// etcd, whose member a control-plane node loses before it is retired.
    pub etcd: EtcdSetup,
    /// One member removal at a time: each is judged on a member list that
    /// another in flight would change.
    pub etcd_turn: tokio::sync::Mutex<()>,
    /// Constellation's upgrade-agent, which upgrades the control plane in
    /// place (None: not mounted; Kubernetes versions come with new nodes only).
    pub upgrade_agent: Option<crate::upgrade_agent::AgentClient>,
    /// This replica's control-plane upgrades, by NodeVersion.
    pub control_plane_runs: Arc<control_plane::Runs>,
    /// The last look at each rollout's new nodes' pods.
    pub(crate) pod_trials: workloads::PodTrials,
}

/// How soon a retirement waiting for etcd looks again: etcd's health is
/// not watched, so nothing else would wake it.
const ETCD_RECHECK: std::time::Duration = std::time::Duration::from_secs(5);

impl Reconciler for NodeVersionReconciler {
    type Object = NodeVersion;
    type Error = Error;

    async fn reconcile(&self, key: &Key<NodeVersion>, nv: Option<Arc<NodeVersion>>) -> Result<Action> {
        let Some(nv) = nv else {
            self.forget_metrics(&key.name);
            return Ok(Action::Done);
        };
        match self.roll_out(&nv).await {
            // Say so on the object: the retry alone is only in the logs.
            Err(Error::Cloud(e)) => {
                self.report_error(&nv, reason::CLOUD_ERROR, e.to_string()).await?;
                Err(Error::Cloud(e))
            }
            Err(Error::Etcd(e)) => {
                self.report_error(&nv, reason::ETCD_ERROR, e.to_string()).await?;
                Err(Error::Etcd(e))
            }
            done => done,
        }
    }
}

impl NodeVersionReconciler {
    /// One pass of the rollout: gather the facts (and settle the joins they
    /// show), decide (pure), act step by step, report.
    async fn roll_out(&self, nv: &Arc<NodeVersion>) -> Result<Action> {
        // Gather: the stores, the cloud for what nodes lack (a node it was
        // asked about is in scope as written), and the joins settled.
        let control_plane = self.upgrade_control_plane(nv).await?;
        let annotated = self.annotate_unknown_nodes().await?;
        let scope = self.scope(nv, annotated);
        let joins = self.settle_joins(nv, &scope).await?;
        // Decide.
        let in_force = self.rollout(nv);
        let topology_key = in_force.topology_key.as_deref();
        let node_facts = decide::node_facts(nv, &scope, &joins, topology_key, |node| self.drain_state(node));
        // The status last written: the halt and wave records come from it,
        // and the new status is built on it.
        let base = self.status_writes.latest(nv).await;
        let pods = self.pods_on_new_nodes(nv, &scope, &in_force).await?;
        let halt = self.halt(nv, &base, &scope, &in_force, &pods.failing);
        let halted = halt.as_ref().is_some_and(|h| h.is_halted());
        let mut facts = decide::facts(&in_force, &scope, &node_facts, &joins, halted);
        facts.unready_pods = pods.unready_now;
        let wave = self.wave(nv, &base, &in_force, &facts);
        facts.wave_starts = wave.as_ref().map(|w| w.starts);
        let domains = rollout::domains::domains(&facts);
        let domain = topology_key
            .zip(domains.as_ref())
            .map(|of| decide::domain_status(of, base.domain.as_ref()));
        // Nodes wait while the control plane is upgraded in place.
        let steps = match control_plane.hold {
            true => Vec::new(),
            false => rollout::plan(&facts),
        };
        let counts = rollout::counts(&facts);
        // Act, within the rollout's trace (its replacements link to it). The
        // metrics come before the autoscaler's pause: a pause that fails
        // hides no progress.
        let rollout_trace = self.trace_rollout(nv, &counts).await?;
        let etcd_waits = self.carry_out_all(nv, &steps, &scope, rollout_trace).await?;
        self.record_metrics(nv, &counts, !steps.is_empty());
        self.pause_autoscaling(&nv.name_any(), counts.outdated > 0)
            .await?;
        // Report.
        let mut problems = self.problems(&scope, etcd_waits);
        problems.control_plane_failed = control_plane.failed.clone();
        problems.halted = halt.as_ref().filter(|h| h.is_halted()).map(|h| {
            rollout::halt::message(h, &nv.spec.image, decide::previous_image(nv, &scope).as_deref())
        });
        let pass = status::Pass {
            facts: &facts,
            counts: &counts,
            steps: &steps,
            problems: &problems,
            control_plane: &control_plane,
            halt: halt.as_ref(),
            wave: wave.as_ref().map(|w| &w.status),
            domain: domain.as_ref().zip(domains.map(|d| d.hold)),
        };
        self.write_status(nv, &base, &pass);
        let etcd_recheck = (!problems.etcd_waits.is_empty()).then_some(ETCD_RECHECK);
        let soak_ends = wave.and_then(|w| w.recheck);
        Ok(
            match etcd_recheck
                .into_iter()
                .chain(control_plane.recheck)
                .chain(soak_ends)
                .chain(pods.recheck)
                .min()
            {
                Some(after) => Action::RequeueAfter(after),
                None => Action::Done,
            },
        )
    }
}
