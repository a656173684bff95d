//! The NodeMaintenance controller: cordon, taint and drain a node while a
//! NodeMaintenance names it; undo exactly that when it is deleted.
//!
//! One reconciler type serves both API groups (medik8s and kubevirt). The
//! decisions — may this maintenance proceed, and what its status says — are
//! pure functions (`decide`, `status_for`) tested by tables; `reconcile` only
//! gathers facts and carries out the decision. Drains run in the shared
//! [`DrainEngine`], one task per node, so they never block a worker.
//!
//! A reconcile, by phase: gather (here: the claims on the node from both
//! groups' stores, then a concurrency slot and the node's lease) → decide
//! (`decide.rs`, pure: the decision, the status, the quarantine, the
//! finalizers left) → act (`act.rs`: the owner reference, the quarantine
//! and the drain; on deletion the undo, the lease released and the
//! finalizers removed; the per-node leases) → report (`report.rs`: the
//! status, conditioned on the version read; the drain's metrics and trace;
//! Events). This file holds the constants, the shared context, the
//! reconciler and the registration of both groups' controllers.

mod act;
mod decide;
mod report;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, ResourceExt};

use super::{App, finalizer};
use crate::api::node_maintenance::{MaintenanceObject, MaintenancePhase, kubevirt, medik8s};
use crate::drain::DrainEngine;
use crate::drain::node as quarantine;
use crate::error::{Category, Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::lease::Observed;
use crate::runtime::manager::{Manager, Task};
use crate::runtime::store::{Key, ObjectKey, Store};
use crate::runtime::sync::lock;
use crate::runtime::workqueue::WorkQueue;
use crate::telemetry::Metrics;
use decide::plan_drain;

pub use decide::{
    AllClaims, Claim, ClaimsOf, DUPLICATE_MAINTENANCE, Decision, Facts, LeaseState, begun_by_nmo, decide,
    finalizers_after_leaving, owner_of, status_for, to_finish,
};
pub use report::{DrainMetrics, DrainResult, ResultLabels, status_patch};

/// Held on every NodeMaintenance until its changes to the node are undone.
pub const FINALIZER: &str = "nodewarden.dev/node-maintenance";
/// The Node Maintenance Operator's finalizer, on every NodeMaintenance it
/// began. nodewarden finishes those: it takes over their quarantine and
/// removes this finalizer with its own once the node is restored, so none
/// stays Terminating after a switch.
pub const NMO_FINALIZER: &str = "foregroundDeleteNodeMaintenance";
/// The taint that keeps new pods off a node in maintenance (medik8s's).
pub use crate::drain::node::DRAIN_TAINT;
/// The taint a cordoned node carries.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// Tells remediation tools to leave the node alone while it is in maintenance.
pub const EXCLUDE_LABEL: &str = "remediation.medik8s.io/exclude-from-remediation";
/// The holder other medik8s tools recognise on the per-node lease.
pub const LEASE_HOLDER: &str = "node-maintenance";
/// Duration of the per-node lease (medik8s's: one hour).
pub const LEASE_SECONDS: i32 = 3600;
/// Index of NodeMaintenance stores: spec.nodeName.
pub const NODE_INDEX: &str = "node";

/// NodeMaintenance settings of the operator.
#[derive(Clone, Debug)]
pub struct MaintenanceConfig {
    /// Nodes in maintenance at once (None: no limit).
    pub max_concurrent: Option<usize>,
    /// Namespace of the per-node leases other remediation tools respect.
    pub lease_namespace: String,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            max_concurrent: None,
            lease_namespace: "medik8s-leases".into(),
        }
    }
}

/// What both groups' reconcilers share.
pub struct MaintenanceContext {
    /// The API client.
    pub client: Client,
    /// This replica's leadership, checked before anything disruptive.
    pub leader: LeaderHandle,
    /// The drains, shared by both API groups.
    pub engine: DrainEngine,
    /// Publishes the maintenance Events.
    pub recorder: Recorder,
    /// The managed Nodes.
    pub nodes: Store<Node>,
    /// Claims on one node, from both groups.
    pub claims_of: ClaimsOf,
    /// Every claim, from both groups.
    pub all_claims: AllClaims,
    /// Limits and the lease namespace.
    pub config: MaintenanceConfig,
    /// Drain metrics.
    pub metrics: DrainMetrics,
    /// Owners admitted under the concurrency limit (rebuilt from the stores).
    admitted: Mutex<BTreeSet<String>>,
    /// The per-node leases as this process last saw them (by node name).
    observed_leases: Mutex<HashMap<String, Observed>>,
}

impl MaintenanceContext {
    /// Atomically admits `owner` under the limit. Active maintenances in the
    /// stores count too, so a new leader never over-admits.
    fn admit(&self, owner: &str) -> bool {
        let mut admitted = lock(&self.admitted);
        if admitted.contains(owner) {
            return true;
        }
        let Some(limit) = self.config.max_concurrent else {
            admitted.insert(owner.to_string());
            return true;
        };
        let mut holding: BTreeSet<String> = admitted.clone();
        holding.extend(
            (self.all_claims)()
                .into_iter()
                .filter(|c| c.active && !c.deleting)
                .map(|c| c.owner),
        );
        if holding.contains(owner) || holding.len() < limit {
            admitted.insert(owner.to_string());
            true
        } else {
            false
        }
    }

    fn release(&self, owner: &str) {
        lock(&self.admitted).remove(owner);
    }
}

/// The reconciler of one group's NodeMaintenances.
pub struct NodeMaintenanceReconciler<M: MaintenanceObject> {
    /// What both groups share.
    pub ctx: Arc<MaintenanceContext>,
    /// This group's NodeMaintenances.
    pub store: Store<M>,
    /// This controller's queue, so a drain's progress re-enqueues its
    /// NodeMaintenance.
    pub queue: WorkQueue<Key<M>>,
}

impl<M: MaintenanceObject> Reconciler for NodeMaintenanceReconciler<M> {
    type Object = M;
    type Error = Error;

    async fn reconcile(&self, key: &Key<M>, obj: Option<Arc<M>>) -> Result<Action> {
        let Some(obj) = obj else {
            return Ok(Action::Done);
        };
        let api: Api<M> = Api::all(self.ctx.client.clone());
        let owner = owner_of(obj.as_ref());
        let node_name = obj.node_name().to_string();
        let has_finalizer = finalizer::holds(obj.as_ref(), FINALIZER);

        if obj.meta().deletion_timestamp.is_some() {
            if to_finish(obj.finalizers()) {
                self.leave(&api, obj.as_ref(), &owner, &node_name).await?;
            }
            return Ok(Action::Done);
        }
        if !has_finalizer {
            finalizer::add(&api, obj.as_ref(), FINALIZER).await?;
            if begun_by_nmo(obj.finalizers()) {
                self.event(
                    &obj.object_ref(&()),
                    EventType::Normal,
                    "TakenOverMaintenance",
                    &format!(
                        "node {node_name}: maintenance begun by the Node Maintenance Operator, finished by \
                         nodewarden (its cordon, taints and label undone on deletion, {NMO_FINALIZER} removed then)"
                    ),
                )
                .await;
            }
            // The update comes back as a watch event and reconciles again.
            return Ok(Action::Done);
        }
        // Gather and decide: the claims on the node, then a slot and its lease.
        let decision = self.decide(obj.as_ref(), &owner, &node_name).await?;
        // The version the status is written on: the one read, or the one
        // this pass's owner reference wrote.
        let mut version = obj.resource_version();
        // Act: own, quarantine and drain the node.
        let drain = match (&decision, self.ctx.nodes.get(&ObjectKey::cluster(&node_name))) {
            (Decision::Drain, Some(node)) => match self.start_drain(&api, key, obj.as_ref(), &node).await {
                Ok((drain, written)) => {
                    version = written.or(version);
                    Some(drain)
                }
                // The Node went after our store saw it (a rollout retired
                // it): the watch brings its deletion, and the garbage
                // collector this maintenance. Not an error to retry.
                Err(e) if e.category() == Category::NotFound => return Ok(Action::Done),
                Err(e) => return Err(e),
            },
            _ => None,
        };
        if matches!(decision, Decision::Fail { .. }) {
            self.ctx.release(&owner);
        }
        // Report: the status, the drain's end, Events; then the drain gauges.
        let phase = self
            .report(&api, obj.as_ref(), version.as_deref(), &decision, drain.as_ref())
            .await?;
        let (running, blocked) = self.ctx.engine.counts();
        self.ctx.metrics.drains_running.set(running as i64);
        self.ctx.metrics.drains_blocked.set(blocked as i64);
        Ok(match (&decision, phase) {
            (Decision::Wait { .. }, _) => Action::RequeueAfter(Duration::from_secs(5)),
            // Renew the per-node lease well before it runs out.
            (Decision::Drain, MaintenancePhase::Succeeded) => {
                Action::RequeueAfter(Duration::from_secs(LEASE_SECONDS as u64 / 3))
            }
            _ => Action::Done,
        })
    }
}

impl<M: MaintenanceObject> NodeMaintenanceReconciler<M> {
    /// Gathers the facts and decides (pure [`decide()`]): cheap checks first;
    /// a concurrency slot and the node's lease are taken only when they pass.
    async fn decide(&self, obj: &M, owner: &str, node_name: &str) -> Result<Decision> {
        let others: Vec<Claim> = (self.ctx.claims_of)(node_name)
            .into_iter()
            .filter(|c| c.owner != owner)
            .collect();
        let me = Claim::of(obj);
        let failed_as_duplicate = obj
            .maintenance_status()
            .filter(|s| s.phase == Some(MaintenancePhase::Failed))
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.reason == DUPLICATE_MAINTENANCE))
            .map(|c| c.message.as_str());
        let node = self.ctx.nodes.get(&ObjectKey::cluster(node_name));
        let holder = node.as_deref().and_then(holder_of);
        let fresh_holder;
        let mut facts = Facts {
            me: &me,
            owner,
            node_name,
            node_exists: node.is_some(),
            others: &others,
            drain_timeout: obj.drain_timeout(),
            admitted: true,
            lease: None,
            failed_as_duplicate,
            holder: holder.as_deref(),
        };
        let mut decision = decide(&facts);
        // Failing a maintenance as a duplicate is final: never on a store
        // that may not show yet that it holds the node (it wrote the node
        // just before). The node as the API has it decides.
        if matches!(&decision, Decision::Fail { reason, .. } if *reason == DUPLICATE_MAINTENANCE) {
            let nodes: Api<Node> = Api::all(self.ctx.client.clone());
            fresh_holder = nodes.get_opt(node_name).await?.as_ref().and_then(holder_of);
            facts.holder = fresh_holder.as_deref();
            decision = decide(&facts);
        }
        if decision != Decision::Drain {
            return Ok(decision);
        }
        facts.admitted = self.ctx.admit(owner);
        // A Plan's drain is `kubectl drain`: no medik8s lease.
        if facts.admitted && plan_drain(obj.annotations()).is_none() {
            facts.lease = Some(self.take_lease(node_name).await?);
        }
        Ok(decide(&facts))
    }
}

/// The NodeMaintenance controllers of both API groups (medik8s and
/// kubevirt), sharing one drain engine and one concurrency limit: each
/// reconciles its group's objects and the Nodes they name.
pub fn register(manager: &mut Manager, app: &App) {
    let medik8s = manager.store::<medik8s::NodeMaintenance>(&app.objects);
    let kubevirt = manager.store::<kubevirt::NodeMaintenance>(&app.objects);
    index_by_node(&medik8s);
    index_by_node(&kubevirt);
    let engine = app.drains.clone();
    let ctx = Arc::new(MaintenanceContext {
        client: app.client.clone(),
        leader: app.leader.clone(),
        engine: engine.clone(),
        recorder: app.recorder.clone(),
        nodes: manager.store::<Node>(&app.nodes),
        claims_of: claims_of(medik8s.clone(), kubevirt.clone()),
        all_claims: all_claims(medik8s.clone(), kubevirt.clone()),
        config: app.maintenance.clone(),
        metrics: DrainMetrics::register(&app.metrics),
        admitted: Mutex::new(BTreeSet::new()),
        observed_leases: Mutex::default(),
    });
    register_group::<medik8s::NodeMaintenance>(manager, app, "nodemaintenance", &ctx);
    register_group::<kubevirt::NodeMaintenance>(manager, app, "nodemaintenance-kubevirt", &ctx);
    let metrics = app.metrics.clone();
    manager.add_task(stop_drains_when_not_leading(engine, metrics));
}

/// One group's controller: its own objects, and the Nodes they name; it
/// reads the other group's claims too.
fn register_group<M: MaintenanceObject>(
    manager: &mut Manager,
    app: &App,
    name: &str,
    ctx: &Arc<MaintenanceContext>,
) {
    let mut c = manager.controller::<M>(name, &app.objects);
    let store = c.store();
    let by_node = store.clone();
    c.watches(&app.nodes, super::node_changed(), move |node: &Node| {
        keys_for_node(&by_node, node)
    });
    // Claims on a node come from both groups' stores.
    c.reads::<medik8s::NodeMaintenance>(&app.objects);
    c.reads::<kubevirt::NodeMaintenance>(&app.objects);
    c.on_failure(app.report_failures());
    let queue = c.queue();
    c.register(NodeMaintenanceReconciler {
        ctx: ctx.clone(),
        store,
        queue,
    });
}

/// The owner nodewarden's record on the node names (see [`quarantine`]).
fn holder_of(node: &Node) -> Option<String> {
    quarantine::recorded_changes(node).map(|c| c.owner)
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
fn stop_drains_when_not_leading(engine: DrainEngine, metrics: Metrics) -> Task {
    Box::new(move |leader, shutdown| {
        Box::pin(async move {
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
        })
    })
}

/// The keys of the NodeMaintenances (of one group's store) naming `node`.
pub fn keys_for_node<M: MaintenanceObject>(store: &Store<M>, node: &Node) -> Vec<Key<M>> {
    store.keys_by_index(NODE_INDEX, &node.name_any())
}

/// Adds the node index to a NodeMaintenance store.
pub fn index_by_node<M: MaintenanceObject>(store: &Store<M>) {
    store.add_index(NODE_INDEX, |m: &M| vec![m.node_name().to_string()]);
}
