//! The Plan controller: applies an in-place upgrade node by node.
//!
//! Each reconcile gathers (the plan's version and hash, its nodes, their
//! NodeMaintenances and Jobs: reads only), decides with the pure functions of
//! `upgrade::schedule`, carries out one step per applying node, then writes
//! the status — conditioned on the Plan's resourceVersion, so a stale cache
//! or a second writer can never add a node beyond `concurrency`. A node is
//! drained through a NodeMaintenance of its own (PodDisruptionBudgets
//! honoured, the blocker named, a timeout that ends it), cordoned with a
//! recorded change when only `cordon` is asked, and released — exactly what
//! the plan did undone — once it is upgraded and Ready again.
//!
//! A phase per file: `gather` (reads), `decide` (pure, table-tested), `act`
//! (the steps' writes), `report` (status, Events, spans, metrics). This file
//! registers the controller and runs the phases in order.

mod act;
mod decide;
mod gather;
pub mod metrics;
mod report;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ObjectMeta};
use kube::runtime::events::Recorder;
use kube::{Client, ResourceExt};

pub use report::plan_status_write;

use super::{App, finalizer};
use crate::api::node_maintenance::medik8s;
use crate::api::plan::{Plan, PlanStatus};
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, Source, always};
use crate::runtime::store::{Key, ObjectKey, Store};
use crate::upgrade::job::JobDefaults;
use crate::upgrade::schedule::{self, NodeDecision, Step};
use crate::upgrade::tally::{ChangedNodes, Tally};
use crate::upgrade::window::Window;
use crate::upgrade::{labels, safe_concat_name};
use metrics::{PlanMetrics, PlanNodeState};

/// The finalizer that lets a deleted plan undo what it did first.
pub const FINALIZER: &str = "nodewarden.dev/plan";

/// Plan settings (`nodewarden run` flags).
#[derive(Clone, Debug)]
pub struct PlanConfig {
    /// Watch Plans (and their Jobs) in this namespace only; None: all.
    pub namespace: Option<String>,
    /// How often a channel is asked for its latest version (upstream: 15 min).
    pub channel_poll: Duration,
    /// How often a plan is looked at without an event (its Secrets' contents).
    pub recheck: Duration,
    /// How long a node must be Ready after its Job before the next may start.
    pub settle: Duration,
    /// Job settings.
    pub jobs: JobDefaults,
}

impl Default for PlanConfig {
    fn default() -> Self {
        PlanConfig {
            namespace: None,
            channel_poll: Duration::from_secs(15 * 60),
            recheck: Duration::from_secs(30),
            settle: Duration::from_secs(10),
            jobs: JobDefaults::default(),
        }
    }
}

/// Registers the Plan controller: Plans, and the Nodes, Jobs and
/// NodeMaintenances that tell how their nodes are doing.
pub fn register(manager: &mut Manager, app: &App) {
    let plans_source = Source {
        namespace: app.plans.namespace.clone(),
        ..app.objects.clone()
    };
    let jobs_source = Source {
        namespace: app.plans.namespace.clone(),
        label_selector: Some(match &app.objects.label_selector {
            Some(s) => format!("{},{s}", labels::PLAN),
            None => labels::PLAN.to_string(),
        }),
        field_selector: None,
    };
    let mut c = manager.controller::<Plan>("plan", &plans_source);
    let plans = c.store();
    // Few plans, many nodes: a node change that matters looks at every
    // plan, and is noted for each so its pass looks at that node alone.
    let all_plans = plans.clone();
    let changed_nodes = Arc::new(ChangedNodes::default());
    let noted = changed_nodes.clone();
    c.watches(&app.nodes, super::node_changed(), move |node: &Node| {
        let keys = all_plans.keys();
        noted.note(gather::name_of(node), keys.iter().map(Key::untyped));
        keys
    });
    c.watches(&jobs_source, always(), |job: &Job| {
        plan_of(&job.metadata).into_iter().collect()
    });
    c.watches(&app.objects, always(), |m: &medik8s::NodeMaintenance| {
        plan_of(&m.metadata).into_iter().collect()
    });
    let jobs = c.reads::<Job>(&jobs_source);
    let maintenances = c.reads::<medik8s::NodeMaintenance>(&app.objects);
    let nodes = c.reads::<Node>(&app.nodes);
    c.on_failure(app.report_failures());
    c.register(PlanReconciler {
        ctx: Arc::new(PlanContext {
            client: app.client.clone(),
            leader: app.leader.clone(),
            recorder: app.recorder.clone(),
            metrics: PlanMetrics::register(&app.metrics),
            config: app.plans.clone(),
            plans,
            nodes,
            jobs,
            maintenances,
            changed_nodes,
            tallies: Mutex::default(),
            channels: Mutex::default(),
            exclusive: tokio::sync::Mutex::new(()),
            exclusive_applying: Mutex::default(),
            cluster_id: tokio::sync::OnceCell::new(),
        }),
    });
}

/// A plan's key in the store (and in the tallies).
fn plan_key(plan: &Plan) -> ObjectKey {
    ObjectKey::new(plan.namespace().as_deref(), &plan.name_any())
}

/// The Plan a Job or NodeMaintenance belongs to, from its labels.
fn plan_of(meta: &ObjectMeta) -> Option<Key<Plan>> {
    let l = meta.labels.as_ref()?;
    let plan = l.get(labels::PLAN)?;
    let ns = l
        .get(labels::PLAN_NAMESPACE)
        .cloned()
        .or_else(|| meta.namespace.clone())?;
    Some(Key::new(Some(&ns), plan))
}

/// Who the plan is in node change records.
fn owner(plan: &Plan) -> String {
    format!("plan/{}", plan.key())
}

/// The plan's NodeMaintenance for `node` (cluster-scoped, so the plan's namespace is in the name).
pub fn maintenance_name(plan: &Plan, node: &str) -> String {
    safe_concat_name(&[
        "plan",
        plan.metadata.namespace.as_deref().unwrap_or_default(),
        plan.metadata.name.as_deref().unwrap_or_default(),
        node,
    ])
}

/// What the Plan reconciler reads, and remembers between passes.
struct PlanContext {
    client: Client,
    leader: LeaderHandle,
    recorder: Recorder,
    metrics: PlanMetrics,
    config: PlanConfig,
    plans: Store<Plan>,
    nodes: Store<Node>,
    jobs: Store<Job>,
    maintenances: Store<medik8s::NodeMaintenance>,
    /// The nodes that changed since each plan's last pass.
    changed_nodes: Arc<ChangedNodes<ObjectKey>>,
    /// Per plan: what its last pass knew of the nodes it selects.
    tallies: Mutex<HashMap<ObjectKey, Tally>>,
    /// Per plan: its channel's last answer.
    channels: Mutex<HashMap<String, gather::ChannelAnswer>>,
    /// Exclusive plans start nodes one plan at a time.
    exclusive: tokio::sync::Mutex<()>,
    /// Exclusive plans this replica last wrote with nodes applying.
    exclusive_applying: Mutex<BTreeSet<String>>,
    /// The cluster's ID told to channels, read once.
    cluster_id: tokio::sync::OnceCell<String>,
}

struct PlanReconciler {
    ctx: Arc<PlanContext>,
}

impl Reconciler for PlanReconciler {
    type Object = Plan;
    type Error = Error;

    async fn reconcile(&self, key: &Key<Plan>, plan: Option<Arc<Plan>>) -> Result<Action> {
        let Some(plan) = plan else {
            let k = key.untyped();
            self.ctx
                .metrics
                .forget_plan(k.namespace.as_deref().unwrap_or_default(), &k.name);
            self.forget_tally(k);
            return Ok(Action::Done);
        };
        if plan.metadata.deletion_timestamp.is_some() {
            return self.finalize(&plan).await;
        }
        if !finalizer::holds(plan.as_ref(), FINALIZER) {
            // The update brings the plan back through the watch.
            return self.add_finalizer(&plan).await.map(|_| Action::Done);
        }
        let now = Timestamp::now();
        let generation = plan.metadata.generation;
        let mut status = plan.status.clone().unwrap_or_default();
        // Gather what admission could not check, and the version.
        let validated = self.validate(&plan).await;
        let resolved = self.resolve(&plan).await;
        report::checks(&mut status, generation, &validated, &resolved, now);
        let (Ok((window, secrets)), Ok((version, _))) = (validated, resolved) else {
            report::nothing_starts(&mut status, generation, now);
            self.write_status(&plan, status).await?;
            return Ok(Action::RequeueAfter(self.ctx.config.recheck));
        };
        // Decide, act and report: one round.
        let target = decide::target(&plan, version, &secrets, window);
        status.latest_version = Some(target.version.clone());
        status.latest_hash = Some(target.hash.clone());
        let wait = self.roll(&plan, status, &target, now).await?;
        Ok(Action::RequeueAfter(wait.min(self.ctx.config.recheck)))
    }
}

/// What the plan aims at: its resolved version and the hash of it all.
struct Target {
    version: String,
    hash: String,
    window: Option<Window>,
}

/// One applying node: what the cluster shows and what to do.
struct Applying {
    name: String,
    decision: NodeDecision,
}

/// What one round decided: the applying nodes that go on and those
/// released, the nodes chosen to start (or why none may), and the tally's
/// counts of the selected nodes.
struct Round<'a> {
    kept: Vec<&'a Applying>,
    released: Vec<String>,
    chosen: Vec<String>,
    blocked: Option<String>,
    upgraded: usize,
    selected: usize,
    counts: HashMap<PlanNodeState, usize>,
}

impl PlanReconciler {
    /// One round: a step on every applying node, then the new `applying`
    /// (released nodes off, new ones on) written before anything starts on
    /// them. Returns how soon to look again.
    async fn roll(
        &self,
        plan: &Plan,
        mut status: PlanStatus,
        target: &Target,
        now: Timestamp,
    ) -> Result<Duration> {
        // Upstream lists hostname label values; the steps work on node names.
        status.applying = self.applying_names(&status.applying);
        let applying = self.assess(plan, &status, target, now);
        for a in &applying {
            self.step(plan, &a.name, a.decision.step, target).await?;
        }
        let _exclusive = match plan.spec.exclusive.unwrap_or(false) {
            true => Some(self.ctx.exclusive.lock().await),
            false => None,
        };
        let old = status.clone();
        let round = self.next_round(plan, &mut status, &applying, target, now);
        report::round_status(&mut status, plan, &old, &round, &target.hash, now);
        self.publish(plan, &old, &mut status, &round, target, now).await?;
        Ok(decide::next_look(plan, &status, &round.kept, now))
    }

    /// Each applying node: what the cluster shows of it, and what to do.
    fn assess(&self, plan: &Plan, status: &PlanStatus, target: &Target, now: Timestamp) -> Vec<Applying> {
        status
            .applying
            .iter()
            .map(|name| {
                let facts = self.node_facts(plan, name, target, now);
                let record = status.nodes.iter().find(|r| &r.name == name);
                let decision = schedule::decide_node(
                    decide::prep_of(plan),
                    &target.hash,
                    &facts,
                    record,
                    now,
                    self.ctx.config.settle,
                );
                Applying {
                    name: name.clone(),
                    decision,
                }
            })
            .collect()
    }

    /// The round after the steps: the nodes finished are released, the
    /// rest kept, and new ones chosen on the plan's tally; `status.applying`
    /// becomes the kept and the chosen, by name.
    fn next_round<'a>(
        &self,
        plan: &Plan,
        status: &mut PlanStatus,
        applying: &'a [Applying],
        target: &Target,
        now: Timestamp,
    ) -> Round<'a> {
        let released: Vec<String> = applying
            .iter()
            .filter(|a| a.decision.step == Step::Finish)
            .map(|a| a.name.clone())
            .collect();
        let kept: Vec<&Applying> = applying
            .iter()
            .filter(|a| a.decision.step != Step::Finish)
            .collect();
        let mut tallies = self.ctx.tallies.lock().unwrap_or_else(|e| e.into_inner());
        let tally = self.tally(&mut tallies, plan, &target.hash);
        let (chosen, blocked) = self.choose(plan, status, &kept, tally, target, now);
        status.applying = kept
            .iter()
            .map(|a| a.name.clone())
            .chain(chosen.iter().cloned())
            .collect();
        status.applying.sort();
        Round {
            counts: report::node_counts(status, tally),
            upgraded: tally.upgraded(),
            selected: tally.selected(),
            kept,
            released,
            chosen,
            blocked,
        }
    }

    /// The nodes to start now, or why none may start.
    fn choose(
        &self,
        plan: &Plan,
        status: &PlanStatus,
        kept: &[&Applying],
        tally: &Tally,
        target: &Target,
        now: Timestamp,
    ) -> (Vec<String>, Option<String>) {
        let holder = self.exclusive_holder(plan);
        if let Some(why) = decide::start_blocked(plan, status, kept, target, holder.as_deref(), now) {
            return (Vec::new(), Some(why));
        }
        let concurrency = decide::concurrency(plan);
        if kept.len() >= concurrency {
            return (Vec::new(), None);
        }
        let candidates = self.candidates(kept, tally);
        let uid = plan.metadata.uid.clone().unwrap_or_default();
        (
            schedule::choose(&uid, &target.hash, kept.len(), concurrency, &candidates),
            None,
        )
    }

    async fn add_finalizer(&self, plan: &Plan) -> Result<()> {
        self.ctx.leader.ensure_leader()?;
        finalizer::add(&self.plans_api(plan), plan, FINALIZER).await
    }

    /// The Plans of `plan`'s namespace.
    fn plans_api(&self, plan: &Plan) -> Api<Plan> {
        Api::namespaced(self.ctx.client.clone(), &plan.namespace().unwrap_or_default())
    }

    /// A deleted plan: release every node it touched (those it lists, and
    /// any that still carry its cordon record or NodeMaintenance), then let
    /// go — only once its NodeMaintenances are gone, not just asked to go:
    /// a plan created again under the same name would otherwise start new
    /// nodes while the old drains still hold theirs (more nodes out than
    /// its concurrency; the storms' seed 7). A maintenance's deletion wakes
    /// the plan (its labels name it).
    async fn finalize(&self, plan: &Plan) -> Result<Action> {
        if !finalizer::holds(plan, FINALIZER) {
            return Ok(Action::Done);
        }
        self.ctx
            .metrics
            .forget_plan(&plan.namespace().unwrap_or_default(), &plan.name_any());
        let hash = plan
            .status
            .as_ref()
            .and_then(|s| s.latest_hash.clone())
            .unwrap_or_default();
        for node in &self.nodes_touched(plan) {
            self.ctx.leader.ensure_leader()?;
            self.release(plan, node, &hash).await?;
        }
        self.delete_jobs(plan).await?;
        let left = self.maintenances_left(plan).await?;
        if !left.is_empty() {
            tracing::debug!(plan = %plan.key(), nodes = ?left, "waiting for the plan's maintenances to be gone");
            return Ok(Action::RequeueAfter(Duration::from_secs(2)));
        }
        finalizer::remove(&self.plans_api(plan), plan, FINALIZER).await?;
        Ok(Action::Done)
    }
}
