//! The NodeMaintenance controller: cordon, taint and drain a node while a
//! NodeMaintenance names it; undo exactly that when it is deleted.
//!
//! One reconciler type serves both API groups (medik8s and kubevirt). The
//! decisions — may this maintenance proceed, and what its status says — are
//! pure functions (`decide`, `status_for`) tested by tables; `reconcile` only
//! gathers facts and carries out the decision. Drains run in the shared
//! [`DrainEngine`], one task per node, so they never block a worker.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::api::core::v1::{Namespace, Node, ObjectReference, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::{App, finalizer};
use crate::api::conditions::set_condition;
use crate::api::node_maintenance::{
    MaintenanceObject, MaintenancePhase, NodeMaintenanceStatus, kubevirt, medik8s, parse_duration,
};
use crate::drain::kubectl::{self, KubectlDrain};
use crate::drain::node::{self as quarantine, Quarantine};
use crate::drain::{DrainEngine, DrainOptions, DrainOutcome, DrainProgress, DrainStatus};
use crate::error::{Category, Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::lease::{KubeLeaseLock, LeaseLock, Observed, Written, holding_spec};
use crate::runtime::manager::{Manager, Task};
use crate::runtime::store::{Key, ObjectKey, Store};
use crate::runtime::sync::lock;
use crate::runtime::workqueue::WorkQueue;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::HistogramFamily;
use crate::telemetry::trace::{self, SpanRecord};
use opentelemetry::KeyValue;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::time::Instant;

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

/// One NodeMaintenance as the cross-group checks see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// `<group>/<name>`: the owner recorded on the Node.
    pub owner: String,
    /// When the claim was made (its creation time).
    pub created: Option<Timestamp>,
    /// The claiming object's UID: breaks ties between claims made in the
    /// same second (creation times have a resolution of one second).
    pub uid: Option<String>,
    /// The claiming object is being deleted.
    pub deleting: bool,
    /// Holds (or held) the node: entered maintenance and has not failed.
    pub active: bool,
}

impl Claim {
    /// The claim a NodeMaintenance makes on its node.
    pub fn of<M: MaintenanceObject>(m: &M) -> Claim {
        let status = m.maintenance_status();
        Claim {
            owner: owner_of(m),
            created: m.meta().creation_timestamp.as_ref().map(|t| t.0),
            uid: m.meta().uid.clone(),
            deleting: m.meta().deletion_timestamp.is_some(),
            active: status
                .is_some_and(|s| s.eviction_pods.is_some() && s.phase != Some(MaintenancePhase::Failed)),
        }
    }
}

/// The owner a NodeMaintenance is known by in claims, quarantines and drains.
pub fn owner_of<M: MaintenanceObject>(m: &M) -> String {
    format!("{}/{}", M::GROUP, m.name_any())
}

/// The NodeMaintenances of a node, across both groups.
pub type ClaimsOf = Arc<dyn Fn(&str) -> Vec<Claim> + Send + Sync>;
/// Every NodeMaintenance, across both groups.
pub type AllClaims = Arc<dyn Fn() -> Vec<Claim> + Send + Sync>;

/// The per-node lease as found.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseState {
    /// This operator holds it.
    Ours,
    /// Another tool holds it (its holder identity).
    HeldBy(String),
}

/// What a NodeMaintenance may do now.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Impossible as asked: phase Failed, nothing is done to the node.
    Fail {
        /// The condition's reason.
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
    /// Not yet (another tool holds the node's lease, or too many nodes are in
    /// maintenance): phase Running, retried.
    Wait {
        /// The condition's reason.
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
    /// Quarantine the node and drain it.
    Drain,
}

/// Facts for [`decide`], gathered by the reconciler.
pub struct Facts<'a> {
    /// The maintenance deciding, as a claim on its node.
    pub me: &'a Claim,
    /// The maintenance deciding.
    pub owner: &'a str,
    /// The node it names.
    pub node_name: &'a str,
    /// Whether that node exists.
    pub node_exists: bool,
    /// The other NodeMaintenances of the same node.
    pub others: &'a [Claim],
    /// Its spec.drainTimeout as written.
    pub drain_timeout: Option<&'a str>,
    /// Some(false) when the concurrency limit keeps this one waiting.
    pub admitted: bool,
    /// The node's lease, once asked for (only when everything else allows the drain).
    pub lease: Option<LeaseState>,
    /// The message of an earlier DuplicateMaintenance failure: a duplicate
    /// stays failed (it never takes the node over, even once the first claim
    /// is gone; deleting that one ends the node's maintenance).
    pub failed_as_duplicate: Option<&'a str>,
}

/// The order in which claims on a node win: one that holds the node first
/// (whatever its age: it was there first, across restarts and leader
/// changes), then the earliest created, then the smaller UID. Never the name.
fn precedence(c: &Claim) -> (bool, Option<Timestamp>, Option<&str>, &str) {
    (!c.active, c.created, c.uid.as_deref(), c.owner.as_str())
}

/// The claim on the same node that comes before `me`, if any.
fn first_claim<'a>(me: &Claim, others: &'a [Claim]) -> Option<&'a Claim> {
    others
        .iter()
        .filter(|c| c.owner != me.owner && !c.deleting)
        .filter(|c| precedence(c) < precedence(me))
        .min_by(|a, b| precedence(a).cmp(&precedence(b)))
}

/// The reason of a failure because another maintenance holds the node.
pub const DUPLICATE_MAINTENANCE: &str = "DuplicateMaintenance";

/// What a maintenance should do given the facts (pure; table-tested).
pub fn decide(f: &Facts) -> Decision {
    if let Some(t) = f.drain_timeout
        && parse_duration(t).is_none()
    {
        return Decision::Fail {
            reason: "InvalidSpec",
            message: format!("spec.drainTimeout: {t:?} is not a duration such as 90s, 30m or 1h30m"),
        };
    }
    if !f.node_exists {
        return Decision::Fail {
            reason: "NodeNotFound",
            message: format!("spec.nodeName: node {:?} not found", f.node_name),
        };
    }
    if let Some(message) = f.failed_as_duplicate {
        return Decision::Fail {
            reason: DUPLICATE_MAINTENANCE,
            message: message.to_string(),
        };
    }
    if let Some(first) = first_claim(f.me, f.others) {
        return Decision::Fail {
            reason: DUPLICATE_MAINTENANCE,
            message: format!(
                "spec.nodeName: node {:?} is already in maintenance by {}",
                f.node_name, first.owner
            ),
        };
    }
    if let Some(LeaseState::HeldBy(holder)) = &f.lease {
        return Decision::Wait {
            reason: "LeaseHeld",
            message: format!(
                "the maintenance lease of node {:?} is held by {holder:?}",
                f.node_name
            ),
        };
    }
    if !f.admitted {
        return Decision::Wait {
            reason: "WaitingForSlot",
            message: "the limit of nodes in maintenance at once is reached".into(),
        };
    }
    Decision::Drain
}

/// The status a NodeMaintenance should show.
pub fn status_for(
    prev: Option<&NodeMaintenanceStatus>,
    decision: &Decision,
    drain: Option<&DrainStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> NodeMaintenanceStatus {
    let mut s = prev.cloned().unwrap_or_default();
    s.total_pods_legacy = None;
    let mut conditions = s.conditions.take().unwrap_or_default();
    let verdict = match (decision, drain) {
        (Decision::Fail { reason, message }, _) => {
            s.last_error = Some(message.clone());
            Verdict::new(MaintenancePhase::Failed, false, reason, message.clone())
        }
        (Decision::Wait { reason, message }, _) => {
            if *reason == "LeaseHeld" {
                s.error_on_lease_count = Some(s.error_on_lease_count.unwrap_or(0) + 1);
            }
            s.last_error = Some(message.clone());
            Verdict::new(MaintenancePhase::Running, false, reason, message.clone())
        }
        (Decision::Drain, None) => Verdict::new(
            MaintenancePhase::Running,
            false,
            "Draining",
            "drain starting".to_string(),
        ),
        (Decision::Drain, Some(d)) => {
            record_progress(&mut s, &d.progress);
            drain_verdict(&mut s, d)
        }
    };
    s.phase = Some(verdict.phase);
    set_condition(
        &mut conditions,
        "Drained",
        verdict.drained,
        verdict.reason,
        verdict.message,
        generation,
        now,
    );
    s.conditions = Some(conditions);
    s
}

/// What a status says: its phase, and its Drained condition.
struct Verdict {
    phase: MaintenancePhase,
    drained: bool,
    reason: &'static str,
    message: String,
}

impl Verdict {
    fn new(phase: MaintenancePhase, drained: bool, reason: &'static str, message: String) -> Self {
        Verdict {
            phase,
            drained,
            reason,
            message,
        }
    }
}

/// The drain's counts, pending pods, blockers and last error, as the
/// status shows them.
fn record_progress(s: &mut NodeMaintenanceStatus, p: &DrainProgress) {
    s.total_pods = Some(p.total_pods);
    s.eviction_pods = Some(p.eviction_pods);
    s.drain_progress = Some(p.percent());
    s.pending_pods = Some(p.pending.iter().map(|r| r.name.clone()).collect());
    s.pending_pods_refs = Some(p.pending.clone());
    s.pending_pods_count = Some(p.pending.len() as i32);
    s.blocked_by = (!p.blocked.is_empty()).then(|| p.blocked.clone());
    s.last_error = p.last_error.clone();
}

/// What a running or ended drain says.
fn drain_verdict(s: &mut NodeMaintenanceStatus, d: &DrainStatus) -> Verdict {
    let p = &d.progress;
    match d.outcome {
        DrainOutcome::Succeeded => {
            // Refusals met on the way are history once the drain is done.
            s.last_error = None;
            s.blocked_by = None;
            Verdict::new(
                MaintenancePhase::Succeeded,
                true,
                "Drained",
                format!("{} pods evicted", p.eviction_pods),
            )
        }
        DrainOutcome::TimedOut => {
            let message = format!(
                "drain did not finish within spec.drainTimeout: {}",
                timeout_blockers(p)
            );
            s.last_error = Some(message.clone());
            Verdict::new(MaintenancePhase::Failed, false, "DrainTimeout", message)
        }
        DrainOutcome::Running if !p.blocked.is_empty() => Verdict::new(
            MaintenancePhase::Running,
            false,
            "BlockedByPDB",
            blocked_by_budgets(p),
        ),
        DrainOutcome::Running => Verdict::new(
            MaintenancePhase::Running,
            false,
            "Draining",
            format!("{} of {} pods to evict left", p.pending.len(), p.eviction_pods),
        ),
    }
}

/// What held a drain past its timeout: the pods a budget refused (with the
/// budget), else the pods still pending.
fn timeout_blockers(p: &DrainProgress) -> String {
    if p.blocked.is_empty() {
        p.pending
            .iter()
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        p.blocked
            .iter()
            .map(|b| format!("{} blocked by {}", b.pod, b.pdb))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A running drain's evictions refused: how many, by which budgets.
fn blocked_by_budgets(p: &DrainProgress) -> String {
    let names = p.blocked.iter().map(|b| b.pdb.clone()).collect::<BTreeSet<_>>();
    format!(
        "eviction of {} pods refused by PodDisruptionBudget {}",
        p.blocked.len(),
        names.into_iter().collect::<Vec<_>>().join(", ")
    )
}

/// Two statuses equal but for the time of the update?
fn same_status(a: &NodeMaintenanceStatus, b: &NodeMaintenanceStatus) -> bool {
    let strip = |s: &NodeMaintenanceStatus| NodeMaintenanceStatus {
        last_update: None,
        ..s.clone()
    };
    strip(a) == strip(b)
}

/// Whether the Node Maintenance Operator began this maintenance (its finalizer).
pub fn begun_by_nmo(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f == NMO_FINALIZER)
}

/// Whether a maintenance being deleted is nodewarden's to finish: it holds
/// nodewarden's finalizer, or the Node Maintenance Operator's (no one else
/// will remove that one).
pub fn to_finish(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f == FINALIZER) || begun_by_nmo(finalizers)
}

/// The finalizers left once nodewarden finished a maintenance: its own and
/// the Node Maintenance Operator's go, any other tool's stay.
pub fn finalizers_after_leaving(finalizers: &[String]) -> Vec<String> {
    finalizer::without(finalizers, &[FINALIZER, NMO_FINALIZER])
}

/// The event for a phase change.
fn phase_event(prev: Option<MaintenancePhase>, next: MaintenancePhase) -> Option<(EventType, &'static str)> {
    match (prev, next) {
        (p, n) if p == Some(n) => None,
        (_, MaintenancePhase::Running) => Some((EventType::Normal, "BeginMaintenance")),
        (_, MaintenancePhase::Succeeded) => Some((EventType::Normal, "SucceedMaintenance")),
        (_, MaintenancePhase::Failed) => Some((EventType::Warning, "FailedMaintenance")),
    }
}

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

/// The observed leases, whatever a panic elsewhere left behind.
fn lock_map(map: &Mutex<HashMap<String, Observed>>) -> std::sync::MutexGuard<'_, HashMap<String, Observed>> {
    lock(map)
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

/// What maintenance does to a node: cordon, the group's drain taint and the
/// unschedulable taint, and the label that keeps remediation tools away. A
/// Plan's drain (kubectl's rules) only cordons, as `kubectl drain` does.
fn quarantine_spec(drain_taint: &str, kubectl_rules: bool) -> Quarantine {
    let taint = |key: &str| Taint {
        key: key.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    if kubectl_rules {
        return Quarantine {
            cordon: true,
            taints: Vec::new(),
            labels: BTreeMap::new(),
        };
    }
    Quarantine {
        cordon: true,
        taints: vec![taint(drain_taint), taint(UNSCHEDULABLE_TAINT)],
        labels: BTreeMap::from([(EXCLUDE_LABEL.to_string(), "true".to_string())]),
    }
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
        let decision = self.decide(obj.as_ref(), &owner, &node_name).await?;
        // The version the status is written on: the one read, or the one
        // this pass's owner reference wrote.
        let mut version = obj.resource_version();
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
    /// Gathers the facts and decides (pure [`decide`]): cheap checks first;
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
        let mut facts = Facts {
            me: &me,
            owner,
            node_name,
            node_exists: self.ctx.nodes.get(&ObjectKey::cluster(node_name)).is_some(),
            others: &others,
            drain_timeout: obj.drain_timeout(),
            admitted: true,
            lease: None,
            failed_as_duplicate,
        };
        let decision = decide(&facts);
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

    /// Owns the node, quarantines it and makes sure its drain runs (the
    /// drain's progress re-queues this maintenance). Returns the drain, and
    /// the maintenance's version if the owner reference was written now.
    async fn start_drain(
        &self,
        api: &Api<M>,
        key: &Key<M>,
        obj: &M,
        node: &Node,
    ) -> Result<(DrainStatus, Option<String>)> {
        let node_name = obj.node_name();
        let owner = owner_of(obj);
        let written = self.set_owner_reference(api, obj, node).await?;
        let kubectl = plan_drain(obj.annotations());
        let spec = quarantine_spec(M::DRAIN_TAINT, kubectl.is_some());
        self.quarantine(node_name, &owner, &spec, begun_by_nmo(obj.finalizers()))
            .await?;
        let options = DrainOptions {
            timeout: obj.drain_timeout().and_then(parse_duration),
            on_timeout: obj.on_drain_timeout(),
            kubectl,
            ..DrainOptions::default()
        };
        let (queue, me) = (self.queue.clone(), key.clone());
        let drain = self.ctx.engine.ensure(
            node_name,
            &owner,
            options,
            Arc::new(move || queue.add(me.clone())),
        );
        Ok((drain, written))
    }

    /// Writes the status the decision and the drain lead to (pure
    /// [`status_for`]) when it changed, with the drain's metrics and trace
    /// when it ended and an Event when the phase changed. Returns the phase.
    ///
    /// The write is conditioned on `version`, the maintenance's as read (or
    /// as this pass wrote it): the phase is what rollouts and other
    /// maintenances decide on, so a status landing late, after another
    /// leader wrote a newer one, is refused (409) rather than undoing it.
    async fn report(
        &self,
        api: &Api<M>,
        obj: &M,
        version: Option<&str>,
        decision: &Decision,
        drain: Option<&DrainStatus>,
    ) -> Result<MaintenancePhase> {
        let node_name = obj.node_name();
        let prev = obj.maintenance_status();
        let now = Timestamp::now();
        let mut status = status_for(prev, decision, drain, obj.meta().generation, now);
        let phase = status.phase.unwrap_or(MaintenancePhase::Running);
        if phase == MaintenancePhase::Failed && drain.is_some() {
            // Timed out with policy Fail: the maintenance no longer holds a slot.
            self.ctx.release(&owner_of(obj));
        }
        if prev.is_some_and(|p| same_status(p, &status)) {
            return Ok(phase);
        }
        status.last_update = Some(Time(now));
        let patch = status_patch(&status, version);
        api.patch_status(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let ended = matches!(phase, MaintenancePhase::Succeeded | MaintenancePhase::Failed)
            && prev.and_then(|p| p.phase) != Some(phase);
        if let (true, Some(d)) = (ended, drain) {
            self.drain_ended(obj, node_name, phase, d).await;
        }
        if let Some((type_, reason)) = phase_event(prev.and_then(|p| p.phase), phase) {
            let note = match decision {
                Decision::Fail { message, .. } => message.clone(),
                _ => status
                    .conditions
                    .as_ref()
                    .and_then(|c| c.first())
                    .map(|c| c.message.clone())
                    .unwrap_or_default(),
            };
            self.event(
                &obj.object_ref(&()),
                type_,
                reason,
                &format!("node {node_name}: {note}"),
            )
            .await;
        }
        Ok(phase)
    }
}

impl<M: MaintenanceObject> NodeMaintenanceReconciler<M> {
    /// The drain ended: its duration, and its span when the maintenance is
    /// part of a traced node replacement (evictions as events). Measured from
    /// the object's creation, so a drain a new leader finished counts whole.
    async fn drain_ended(&self, obj: &M, node: &str, phase: MaintenancePhase, drain: &DrainStatus) {
        let end = SystemTime::now();
        let start = obj
            .meta()
            .creation_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0))
            .unwrap_or(end);
        let result = if phase == MaintenancePhase::Succeeded {
            DrainResult::Succeeded
        } else {
            DrainResult::Failed
        };
        self.ctx
            .metrics
            .drain_duration
            .get_or_create(&ResultLabels { result })
            .observe(end.duration_since(start).unwrap_or_default().as_secs_f64());
        let Some((tp, _)) = trace::from_annotations(obj.meta().annotations.as_ref()) else {
            return;
        };
        let mut record = SpanRecord::new("drain", start, end)
            .attr("k8s.node.name", node.to_string())
            .attr("nodewarden.nodemaintenance", obj.name_any())
            .attr("nodewarden.pods.total", i64::from(drain.progress.total_pods))
            .attr(
                "nodewarden.pods.to_evict",
                i64::from(drain.progress.eviction_pods),
            )
            .attr("nodewarden.pods.forced", i64::from(drain.progress.forced))
            // Counted from this replica's own events: evictions before a
            // leader change were another replica's (its drain span was lost).
            .attr(
                "nodewarden.pods.evicted",
                drain.pod_events.iter().filter(|e| e.what == "evicted").count() as i64,
            );
        record.events = drain
            .pod_events
            .iter()
            .map(|e| {
                opentelemetry::trace::Event::new(
                    e.what,
                    e.at,
                    vec![KeyValue::new("k8s.pod", e.pod.clone())],
                    0,
                )
            })
            .collect();
        if phase == MaintenancePhase::Failed {
            record.error = drain.progress.last_error.clone().or(Some("drain failed".into()));
        }
        trace::emit_phase(&tp, record);
        trace::flush(Duration::from_secs(2)).await;
    }

    /// Deleted: stop the drain, undo our changes, release the lease, let go
    /// (of the Node Maintenance Operator's finalizer too).
    async fn leave(&self, api: &Api<M>, obj: &M, owner: &str, node_name: &str) -> Result<()> {
        self.ctx.engine.stop(node_name, owner);
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        let by_nmo = begun_by_nmo(obj.finalizers());
        if let Some(node) = nodes.get_opt(node_name).await? {
            // A maintenance the Node Maintenance Operator began and deleted
            // before nodewarden took it over has no record: lifted whole, as
            // that operator would have.
            let restored = quarantine::undo(&node, owner).or_else(|| {
                by_nmo
                    .then(|| quarantine::lift_unrecorded(&node, &quarantine_spec(M::DRAIN_TAINT, false)))
                    .flatten()
            });
            if let Some(restored) = restored {
                self.ctx.leader.ensure_leader()?;
                nodes
                    .replace(node_name, &PostParams::default(), &restored)
                    .await?;
                if quarantine::uncordoned(&node, &restored) {
                    self.event(
                        &node.object_ref(&()),
                        EventType::Normal,
                        "UncordonNode",
                        &format!("node {node_name} uncordoned: maintenance {owner} ended"),
                    )
                    .await;
                }
            }
        }
        let holds_lease = (self.ctx.claims_of)(node_name)
            .iter()
            .any(|c| c.owner != owner && c.active && !c.deleting);
        if !holds_lease && plan_drain(obj.annotations()).is_none() {
            self.release_lease(node_name).await?;
        }
        // Both finalizers in one write: nodewarden's and the Node Maintenance Operator's.
        finalizer::replace(api, obj, &finalizers_after_leaving(obj.finalizers())).await?;
        self.ctx.release(owner);
        self.event(
            &obj.object_ref(&()),
            EventType::Normal,
            "RemovedMaintenance",
            &format!("node {node_name} left maintenance"),
        )
        .await;
        Ok(())
    }

    /// Returns the maintenance's new version when it wrote one.
    async fn set_owner_reference(&self, api: &Api<M>, obj: &M, node: &Node) -> Result<Option<String>> {
        let uid = node.metadata.uid.clone().unwrap_or_default();
        if obj.owner_references().iter().any(|r| r.uid == uid) {
            return Ok(None);
        }
        let mut refs = obj.owner_references().to_vec();
        refs.push(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.name_any(),
            uid,
            ..Default::default()
        });
        let patch = json!({"metadata": {"ownerReferences": refs, "resourceVersion": obj.resource_version()}});
        let written = api
            .patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(written.resource_version())
    }

    /// Cordon, taints and the exclude label, recorded on the node for undo.
    /// Of a maintenance the Node Maintenance Operator began, the quarantine
    /// it made is taken over: undone whole on deletion, as it would have.
    async fn quarantine(&self, node_name: &str, owner: &str, spec: &Quarantine, by_nmo: bool) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        let node = nodes.get(node_name).await?;
        let applied = if by_nmo {
            quarantine::take_over(&node, spec, owner)
        } else {
            quarantine::apply(&node, spec, owner)
        };
        match applied {
            Ok(Some(held)) => {
                self.ctx.leader.ensure_leader()?;
                // `held` carries the resourceVersion read above: a concurrent
                // change is a conflict and retried, never overwritten.
                nodes.replace(node_name, &PostParams::default(), &held).await?;
                Ok(())
            }
            Ok(None) => Ok(()),
            // Another maintenance took the node between the stores' view and
            // this read (two created at once, each first by the other's
            // missing claim): retried, so the next decision sees that claim
            // hold the node and reports this one as a duplicate. Waiting for
            // a change instead left it without a status (seeded random specs).
            Err(e) => Err(Error::Changed {
                kind: "Node",
                name: node_name.to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// The per-node lease `node-<name>` in the lease namespace.
    fn node_lease(&self, node_name: &str) -> KubeLeaseLock {
        KubeLeaseLock::new(
            self.ctx.client.clone(),
            &self.ctx.config.lease_namespace,
            &format!("node-{node_name}"),
        )
    }

    /// Takes or renews the node's lease. Another holder's lease counts as
    /// expired only its duration after this process saw it last change
    /// (the one Lease rule, see `runtime::lease`), never by the wall clock.
    async fn take_lease(&self, node_name: &str) -> Result<LeaseState> {
        let lock = self.node_lease(node_name);
        let now = Instant::now();
        let fallback = Duration::from_secs(LEASE_SECONDS as u64);
        let Some(record) = lock.get().await? else {
            self.ensure_namespace(&self.ctx.config.lease_namespace).await?;
            let mut spec = holding_spec(
                &LeaseSpec::default(),
                LEASE_HOLDER,
                LEASE_SECONDS,
                Timestamp::now(),
            );
            spec.lease_transitions = Some(0);
            return Ok(match lock.create(spec).await? {
                Written::Done(_) => LeaseState::Ours,
                Written::Conflict => LeaseState::HeldBy("a writer that created it first".into()),
            });
        };
        let previous = lock_map(&self.ctx.observed_leases).remove(node_name);
        let observed = Observed::next(previous, record.spec, record.resource_version, now);
        let ours = observed.holder() == Some(LEASE_HOLDER);
        // Our own lease is renewed once half its duration has passed.
        let fresh = ours && now.saturating_duration_since(observed.at) < fallback / 2;
        if fresh || !observed.available_to(LEASE_HOLDER, fallback, now) {
            let state = if ours {
                LeaseState::Ours
            } else {
                LeaseState::HeldBy(observed.holder().unwrap_or_default().to_owned())
            };
            lock_map(&self.ctx.observed_leases).insert(node_name.to_owned(), observed);
            return Ok(state);
        }
        let spec = holding_spec(&observed.spec, LEASE_HOLDER, LEASE_SECONDS, Timestamp::now());
        match lock.update(&observed.resource_version, spec).await? {
            Written::Done(record) => {
                let mine = Observed::next(None, record.spec, record.resource_version, Instant::now());
                lock_map(&self.ctx.observed_leases).insert(node_name.to_owned(), mine);
                Ok(LeaseState::Ours)
            }
            Written::Conflict => Ok(LeaseState::HeldBy(
                observed
                    .holder()
                    .unwrap_or("a writer that changed it first")
                    .to_owned(),
            )),
        }
    }

    /// Deletes the node's lease if it is ours.
    async fn release_lease(&self, node_name: &str) -> Result<()> {
        lock_map(&self.ctx.observed_leases).remove(node_name);
        let lock = self.node_lease(node_name);
        let Some(record) = lock.get().await? else {
            return Ok(());
        };
        if record.spec.holder_identity.as_deref() == Some(LEASE_HOLDER) {
            lock.delete(&record.resource_version).await?;
        }
        Ok(())
    }

    async fn ensure_namespace(&self, ns: &str) -> Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.ctx.client.clone());
        if namespaces.get_opt(ns).await?.is_some() {
            return Ok(());
        }
        let namespace = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(ns.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// An Event about `regarding` (the maintenance, or its node as the Node
    /// Maintenance Operator does for UncordonNode).
    async fn event(&self, regarding: &ObjectReference, type_: EventType, reason: &str, note: &str) {
        let event = super::event(type_, reason, "Maintenance", note);
        if let Err(e) = self.ctx.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %e, reason, "publishing an event failed");
        }
    }
}

/// The merge patch that writes `status`, conditioned on `version` (the
/// maintenance's resourceVersion the status was computed from). A merge patch
/// keeps fields it does not name: the optional fields that are unset are
/// written as null, so they are cleared.
pub fn status_patch(status: &NodeMaintenanceStatus, version: Option<&str>) -> serde_json::Value {
    let mut patch = json!({"metadata": {"resourceVersion": version}, "status": status});
    for (field, cleared) in [
        ("blockedBy", status.blocked_by.is_none()),
        ("lastError", status.last_error.is_none()),
    ] {
        if cleared {
            patch["status"][field] = serde_json::Value::Null;
        }
    }
    patch
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

/// A Plan's NodeMaintenance drains by kubectl's rules with the Plan's
/// options (its annotation); any other keeps NodeMaintenance's rules. An
/// annotation that does not parse gets kubectl's strictest rules: it can
/// only come from a Plan, and the strict rules remove nothing a Plan would keep.
fn plan_drain(annotations: &BTreeMap<String, String>) -> Option<KubectlDrain> {
    let raw = annotations.get(kubectl::ANNOTATION)?;
    Some(serde_json::from_str(raw).unwrap_or_default())
}

/// How a drain ended, the `result` label of `drain_duration_seconds`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DrainResult {
    /// Every pod to evict is gone.
    Succeeded,
    /// The maintenance ended any other way.
    Failed,
}

impl DrainResult {
    /// The label text: `succeeded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainResult::Succeeded => "succeeded",
            DrainResult::Failed => "failed",
        }
    }
}

crate::telemetry::metrics::label_value_from_as_str!(DrainResult);

/// Label set of `drain_duration_seconds`: how the drain ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// How the drain ended.
    pub result: DrainResult,
}

/// The drain families, registered by the NodeMaintenance controller.
#[derive(Clone)]
pub struct DrainMetrics {
    /// From the NodeMaintenance's creation to its drain's end.
    pub drain_duration: HistogramFamily<ResultLabels>,
    /// Drains in progress.
    pub drains_running: Gauge,
    /// Drains with at least one pod a PodDisruptionBudget keeps.
    pub drains_blocked: Gauge,
}

impl DrainMetrics {
    /// The families, registered with `metrics`; the gauges go to zero when
    /// leadership is lost.
    pub fn register(metrics: &Metrics) -> Self {
        let m = DrainMetrics {
            drain_duration: Family::new_with_constructor(|| {
                // 1 s .. ~1.1 h
                Histogram::new(exponential_buckets(1.0, 2.0, 13))
            }),
            drains_running: Gauge::default(),
            drains_blocked: Gauge::default(),
        };
        metrics.register(
            "drain_duration_seconds",
            "Time from a NodeMaintenance's creation to the end of its drain, by result",
            m.drain_duration.clone(),
        );
        metrics.register("drains_running", "Drains in progress", m.drains_running.clone());
        metrics.register(
            "drains_blocked",
            "Drains with a pod whose eviction a PodDisruptionBudget refuses",
            m.drains_blocked.clone(),
        );
        let leader_only = m.clone();
        metrics.leader_only(move || {
            leader_only.drains_running.set(0);
            leader_only.drains_blocked.set(0);
        });
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_results_export_their_text_and_gauges_go_with_leadership() {
        let metrics = Metrics::new();
        let m = DrainMetrics::register(&metrics);
        for result in [DrainResult::Succeeded, DrainResult::Failed] {
            m.drain_duration
                .get_or_create(&ResultLabels { result })
                .observe(1.0);
        }
        m.drains_blocked.set(1);
        let text = metrics.encode();
        for line in [
            r#"nodewarden_drain_duration_seconds_count{result="succeeded"} 1"#,
            r#"nodewarden_drain_duration_seconds_count{result="failed"} 1"#,
            "nodewarden_drains_blocked 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        metrics.forget_leader_state();
        assert!(metrics.encode().contains("nodewarden_drains_blocked 0"));
    }
    use crate::api::node_maintenance::{DrainBlocker, PodReference};
    use crate::drain::DrainProgress;

    #[test]
    fn a_status_is_written_on_the_version_it_was_computed_from_and_clears_what_is_unset() {
        let status = NodeMaintenanceStatus {
            phase: Some(MaintenancePhase::Running),
            last_error: None,
            blocked_by: None,
            ..Default::default()
        };
        let patch = status_patch(&status, Some("42"));
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["status"]["phase"], "Running");
        for cleared in ["lastError", "blockedBy"] {
            assert!(
                patch["status"]
                    .get(cleared)
                    .is_some_and(serde_json::Value::is_null),
                "{cleared} is written as null: {patch}"
            );
        }
        let failed = NodeMaintenanceStatus {
            last_error: Some("a budget".into()),
            ..status
        };
        assert_eq!(
            status_patch(&failed, Some("43"))["status"]["lastError"],
            "a budget"
        );
    }

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("a time")
    }

    fn claim(owner: &str, created: i64) -> Claim {
        Claim {
            owner: owner.into(),
            created: Some(ts(created)),
            uid: Some(format!("uid-of-{owner}")),
            deleting: false,
            active: false,
        }
    }

    static ME: std::sync::LazyLock<Claim> = std::sync::LazyLock::new(|| Claim {
        uid: Some("uid-5".into()),
        ..claim("g/me", 100)
    });
    static ME_HOLDING: std::sync::LazyLock<Claim> = std::sync::LazyLock::new(|| Claim {
        active: true,
        ..ME.clone()
    });

    fn facts<'a>(others: &'a [Claim]) -> Facts<'a> {
        Facts {
            me: &ME,
            owner: "g/me",
            node_name: "n1",
            node_exists: true,
            others,
            drain_timeout: None,
            admitted: true,
            lease: Some(LeaseState::Ours),
            failed_as_duplicate: None,
        }
    }

    #[test]
    fn decisions() {
        let earlier = [claim("g/first", 50)];
        let later = [claim("g/second", 150)];
        // Same second: the UID decides, never the name.
        let same_time_smaller_uid = [Claim {
            uid: Some("uid-1".into()),
            ..claim("g/z", 100)
        }];
        let same_time_larger_uid_smaller_name = [Claim {
            uid: Some("uid-9".into()),
            ..claim("g/a", 100)
        }];
        let earlier_but_holding_nothing = [claim("g/older", 50)];
        let later_but_holding = [Claim {
            active: true,
            ..claim("g/holder", 150)
        }];
        let deleting = [Claim {
            deleting: true,
            ..claim("g/first", 50)
        }];
        type Case<'a> = (&'a str, Box<dyn Fn(&mut Facts<'a>) + 'a>, &'a str);
        let cases: Vec<Case> = vec![
            ("ok", Box::new(|_| {}), "Drain"),
            (
                "no node",
                Box::new(|f| f.node_exists = false),
                "Fail:NodeNotFound",
            ),
            (
                "earlier claim",
                Box::new(|f| f.others = &earlier),
                "Fail:DuplicateMaintenance",
            ),
            ("later claim loses", Box::new(|f| f.others = &later), "Drain"),
            (
                "tie broken by uid",
                Box::new(|f| f.others = &same_time_smaller_uid),
                "Fail:DuplicateMaintenance",
            ),
            (
                "a smaller name does not win a tie",
                Box::new(|f| f.others = &same_time_larger_uid_smaller_name),
                "Drain",
            ),
            (
                "the holder keeps the node against an older claim",
                Box::new(|f| {
                    f.me = &ME_HOLDING;
                    f.others = &earlier_but_holding_nothing;
                }),
                "Drain",
            ),
            (
                "a holder wins over an earlier creation",
                Box::new(|f| f.others = &later_but_holding),
                "Fail:DuplicateMaintenance",
            ),
            (
                "a failed duplicate stays failed once the first is gone",
                Box::new(|f| {
                    f.failed_as_duplicate = Some("node \"n1\" is already in maintenance by g/first")
                }),
                "Fail:DuplicateMaintenance",
            ),
            (
                "deleting claim ignored",
                Box::new(|f| f.others = &deleting),
                "Drain",
            ),
            (
                "bad timeout",
                Box::new(|f| f.drain_timeout = Some("ten minutes")),
                "Fail:InvalidSpec",
            ),
            (
                "good timeout",
                Box::new(|f| f.drain_timeout = Some("10m")),
                "Drain",
            ),
            (
                "lease held",
                Box::new(|f| f.lease = Some(LeaseState::HeldBy("snr".into()))),
                "Wait:LeaseHeld",
            ),
            (
                "over limit",
                Box::new(|f| f.admitted = false),
                "Wait:WaitingForSlot",
            ),
            (
                "bad input wins over waiting",
                Box::new(|f| {
                    f.node_exists = false;
                    f.admitted = false;
                }),
                "Fail:NodeNotFound",
            ),
        ];
        for (name, tweak, want) in cases {
            let mut f = facts(&[]);
            tweak(&mut f);
            let got = match decide(&f) {
                Decision::Drain => "Drain".to_string(),
                Decision::Fail { reason, .. } => format!("Fail:{reason}"),
                Decision::Wait { reason, .. } => format!("Wait:{reason}"),
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn failure_messages_name_the_field_and_the_first_claim() {
        let earlier = [claim("nodemaintenance.medik8s.io/first", 50)];
        let mut f = facts(&earlier);
        let Decision::Fail { message, .. } = decide(&f) else {
            panic!("expected a failure")
        };
        assert!(
            message.contains("spec.nodeName") && message.contains("nodemaintenance.medik8s.io/first"),
            "{message}"
        );
        f.others = &[];
        f.node_exists = false;
        let Decision::Fail { message, .. } = decide(&f) else {
            panic!("expected a failure")
        };
        assert!(
            message.contains("spec.nodeName") && message.contains("\"n1\""),
            "{message}"
        );
    }

    fn drain(outcome: DrainOutcome, eviction: i32, pending: usize, blocked: bool) -> DrainStatus {
        let pending: Vec<PodReference> = (0..pending)
            .map(|i| PodReference {
                namespace: "ns".into(),
                name: format!("p{i}"),
            })
            .collect();
        DrainStatus {
            owner: "g/me".into(),
            outcome,
            progress: DrainProgress {
                total_pods: eviction + 1,
                eviction_pods: eviction,
                blocked: if blocked {
                    vec![DrainBlocker {
                        pod: "ns/p0".into(),
                        pdb: "ns/web-pdb".into(),
                    }]
                } else {
                    vec![]
                },
                pending,
                last_error: None,
                forced: 0,
            },
            started: tokio::time::Instant::now(),
            pod_events: Vec::new(),
        }
    }

    #[test]
    fn statuses() {
        let now = ts(1000);
        // (decision, drain, phase, progress, condition reason, Drained)
        let cases = [
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Running, 4, 3, false)),
                MaintenancePhase::Running,
                Some(25),
                "Draining",
                false,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Running, 4, 1, true)),
                MaintenancePhase::Running,
                Some(75),
                "BlockedByPDB",
                false,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Succeeded, 4, 0, false)),
                MaintenancePhase::Succeeded,
                Some(100),
                "Drained",
                true,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Succeeded, 0, 0, false)),
                MaintenancePhase::Succeeded,
                Some(100),
                "Drained",
                true,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::TimedOut, 4, 1, true)),
                MaintenancePhase::Failed,
                Some(75),
                "DrainTimeout",
                false,
            ),
            (
                Decision::Fail {
                    reason: "NodeNotFound",
                    message: "x".into(),
                },
                None,
                MaintenancePhase::Failed,
                None,
                "NodeNotFound",
                false,
            ),
            (
                Decision::Wait {
                    reason: "WaitingForSlot",
                    message: "x".into(),
                },
                None,
                MaintenancePhase::Running,
                None,
                "WaitingForSlot",
                false,
            ),
        ];
        for (decision, d, phase, progress, reason, drained) in cases {
            let s = status_for(None, &decision, d.as_ref(), Some(3), now);
            assert_eq!(s.phase, Some(phase), "{reason}");
            assert_eq!(s.drain_progress, progress, "{reason}");
            let c = &s.conditions.as_ref().expect("conditions")[0];
            assert_eq!((c.reason.as_str(), c.status == "True"), (reason, drained));
            assert_eq!(c.observed_generation, Some(3));
        }
    }

    #[test]
    fn blocked_status_names_the_budget_and_timeout_names_the_blockers() {
        let blocked = drain(DrainOutcome::Running, 2, 1, true);
        let s = status_for(None, &Decision::Drain, Some(&blocked), Some(1), ts(1));
        let message = &s.conditions.as_ref().expect("conditions")[0].message;
        assert!(message.contains("ns/web-pdb"), "{message}");
        assert_eq!(
            s.blocked_by.as_ref().map(|b| b[0].pdb.as_str()),
            Some("ns/web-pdb")
        );
        assert_eq!(s.pending_pods.as_deref(), Some(&["p0".to_string()][..]));
        let timed_out = drain(DrainOutcome::TimedOut, 2, 1, true);
        let s = status_for(None, &Decision::Drain, Some(&timed_out), Some(1), ts(1));
        let err = s.last_error.expect("an error");
        assert!(
            err.contains("spec.drainTimeout") && err.contains("ns/p0 blocked by ns/web-pdb"),
            "{err}"
        );
    }

    #[test]
    fn finalizers_nodewarden_finishes_and_removes() {
        let f = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // (finalizers, begun by NMO, nodewarden finishes it, left after)
        let cases: [(&[&str], bool, bool, &[&str]); 5] = [
            (&[FINALIZER], false, true, &[]),
            (&[NMO_FINALIZER], true, true, &[]),
            (&[NMO_FINALIZER, FINALIZER], true, true, &[]),
            (&["other.io/keep", NMO_FINALIZER], true, true, &["other.io/keep"]),
            (&["other.io/keep"], false, false, &["other.io/keep"]),
        ];
        for (have, by_nmo, finish, left) in cases {
            let have = f(have);
            assert_eq!(begun_by_nmo(&have), by_nmo, "{have:?}");
            assert_eq!(to_finish(&have), finish, "{have:?}");
            assert_eq!(finalizers_after_leaving(&have), f(left), "{have:?}");
        }
    }

    #[test]
    fn phase_events() {
        use MaintenancePhase::*;
        let reason = |p, n| phase_event(p, n).map(|(_, r)| r);
        assert_eq!(reason(None, Running), Some("BeginMaintenance"));
        assert_eq!(reason(Some(Running), Running), None);
        assert_eq!(reason(Some(Running), Succeeded), Some("SucceedMaintenance"));
        assert_eq!(reason(Some(Running), Failed), Some("FailedMaintenance"));
        assert_eq!(reason(None, Failed), Some("FailedMaintenance"));
    }
}
