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

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, PropagationPolicy,
};
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource, ResourceExt};

use super::replacement_trace::TRACE_FLUSH_TIMEOUT;
use super::{App, finalizer};
use crate::api::conditions::set_condition;
use crate::api::node_maintenance::{MaintenancePhase, medik8s};
use crate::api::plan::{NodeUpgrade, Plan, PlanStatus, node_label};
use crate::drain::kubectl::{self, KubectlDrain};
use crate::drain::node::{Quarantine, recorded_changes};
use crate::drain::pods::selector_matches;
use crate::error::{Error, Result};
use crate::node::node_is_ready;
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, Source, always};
use crate::runtime::store::{Key, ObjectKey, Store};
use crate::telemetry::metrics::{
    JobResult, JobResultLabels, Metrics, PlanFailure, PlanFailureLabels, PlanNodeState,
};
use crate::telemetry::trace::{self, SpanRecord, TRACEPARENT_ANNOTATION, TraceParent};
use crate::upgrade::job::{
    HOSTNAME_LABEL, JobDefaults, JobNode, STEP_LABEL, inherited_labels, job_name, parse_go_duration,
    prepare_job, prepare_job_name, upgrade_job,
};
use crate::upgrade::schedule::{
    self, Candidate, JobState, Maintenance, NodeDecision, NodeFacts, Phase, Prep, Step,
};
use crate::upgrade::tally::{Basis, ChangedNodes, Mark, Tally};
use crate::upgrade::window::Window;
use crate::upgrade::{channel, hash, labels, safe_concat_name};

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
        noted.note(name_of(node), keys.iter().map(Key::untyped));
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
            metrics: app.metrics.clone(),
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

struct PlanContext {
    client: Client,
    leader: LeaderHandle,
    recorder: Recorder,
    metrics: Metrics,
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
    channels: Mutex<HashMap<String, ChannelAnswer>>,
    /// Exclusive plans start nodes one plan at a time.
    exclusive: tokio::sync::Mutex<()>,
    /// Exclusive plans this replica last wrote with nodes applying.
    exclusive_applying: Mutex<BTreeSet<String>>,
    /// The cluster's ID told to channels, read once.
    cluster_id: tokio::sync::OnceCell<String>,
}

/// What a channel answered, and when.
struct ChannelAnswer {
    url: String,
    answer: std::result::Result<String, String>,
    at: Instant,
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
        let mut status = plan.status.clone().unwrap_or_default();
        let generation = plan.metadata.generation;
        let validated = self.validate(&plan).await;
        let resolved = self.resolve(&plan).await;
        let cs = &mut status.conditions;
        match &validated {
            Ok(_) => set_condition(
                cs,
                "Validated",
                true,
                "PlanIsValid",
                "the plan is valid",
                generation,
                now,
            ),
            Err(e) => set_condition(cs, "Validated", false, "Error", e.clone(), generation, now),
        }
        match &resolved {
            Ok((v, how)) => set_condition(
                cs,
                "LatestResolved",
                true,
                how,
                format!("version {v}"),
                generation,
                now,
            ),
            Err(e) => set_condition(cs, "LatestResolved", false, "Error", e.clone(), generation, now),
        }
        let (Ok((window, secrets)), Ok((version, _))) = (validated, resolved) else {
            let why = "the plan is invalid or its version unresolved: nothing starts";
            set_condition(
                &mut status.conditions,
                "Complete",
                false,
                "NotReady",
                why,
                generation,
                now,
            );
            self.write_status(&plan, status).await?;
            return Ok(Action::RequeueAfter(self.ctx.config.recheck));
        };
        // Upstream hashes the Plan as stored; an object that cannot be JSON
        // has no digest fields (serializing plain data cannot fail).
        let as_json = serde_json::to_value(&*plan).unwrap_or_default();
        let account = plan.spec.service_account_name.as_deref().unwrap_or("");
        let hash = hash::plan_hash(&version, account, &as_json, &secrets);
        status.latest_version = Some(version.clone());
        status.latest_hash = Some(hash.clone());
        let target = Target {
            version,
            hash,
            window,
        };
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
        let mut applying = Vec::new();
        for name in &status.applying {
            let facts = self.node_facts(plan, name, &target.hash, now);
            let record = status.nodes.iter().find(|r| &r.name == name);
            let decision = schedule::decide_node(
                prep_of(plan),
                &target.hash,
                &facts,
                record,
                now,
                self.ctx.config.settle,
            );
            applying.push(Applying {
                name: name.clone(),
                decision,
            });
        }
        for a in &applying {
            self.step(plan, &a.name, a.decision.step, target).await?;
        }
        let released: Vec<String> = applying
            .iter()
            .filter(|a| a.decision.step == Step::Finish)
            .map(|a| a.name.clone())
            .collect();
        let kept: Vec<&Applying> = applying
            .iter()
            .filter(|a| a.decision.step != Step::Finish)
            .collect();
        let _exclusive = match plan.spec.exclusive.unwrap_or(false) {
            true => Some(self.ctx.exclusive.lock().await),
            false => None,
        };
        let old = status.clone();
        let (chosen, blocked, upgraded, selected, counts) = {
            let mut tallies = self.ctx.tallies.lock().unwrap_or_else(|e| e.into_inner());
            let tally = self.tally(&mut tallies, plan, &target.hash);
            let (chosen, blocked) = self.choose(plan, &status, &kept, tally, target, now);
            status.applying = kept
                .iter()
                .map(|a| a.name.clone())
                .chain(chosen.iter().cloned())
                .collect();
            status.applying.sort();
            let counts = node_counts(&status, tally);
            (chosen, blocked, tally.upgraded(), tally.selected(), counts)
        };
        let first = match (&plan.spec.prepare, prep_of(plan)) {
            (Some(_), _) => Phase::Preparing,
            (None, Prep::Drain) => Phase::Draining,
            (None, Prep::Cordon) => Phase::Cordoning,
            (None, Prep::Nothing) => Phase::Upgrading,
        };
        status.nodes = records(&old, &kept, &chosen, first, &target.hash, now);
        if !released.is_empty() {
            status.last_completion_time = Some(Time(now));
        }
        status.progress = Some(format!("{upgraded}/{selected}"));
        complete_condition(
            &mut status,
            plan.metadata.generation,
            &kept,
            blocked.as_deref(),
            upgraded,
            selected,
            now,
        );
        let names = std::mem::take(&mut status.applying);
        status.applying = self.applying_entries(&names);
        self.write_status(plan, status.clone()).await?;
        self.ctx
            .metrics
            .set_plan_nodes(&plan.namespace().unwrap_or_default(), &plan.name_any(), |state| {
                counts.get(&state).copied().unwrap_or(0)
            });
        self.note_exclusive(plan, &status);
        self.after_write(plan, &old, &status, &released, target, now)
            .await;
        Ok(next_look(plan, &status, &kept, now))
    }

    /// The nodes a `status.applying` lists by hostname label value
    /// (upstream's entries); the common case, a node named as its label,
    /// needs no scan.
    fn applying_names(&self, entries: &[String]) -> Vec<String> {
        let named = |e: &String| {
            self.ctx
                .nodes
                .get(&ObjectKey::cluster(e))
                .is_some_and(|n| n.labels().get(HOSTNAME_LABEL) == Some(e))
        };
        if entries.iter().all(named) {
            return entries.to_vec();
        }
        let nodes: Vec<(String, String)> = self
            .ctx
            .nodes
            .list()
            .iter()
            .filter_map(|n| Some((n.name_any(), n.labels().get(HOSTNAME_LABEL)?.clone())))
            .collect();
        nodes_of_hostnames(entries, &nodes)
    }

    /// `status.applying` as upstream writes it: the nodes' hostname label values, sorted.
    fn applying_entries(&self, names: &[String]) -> Vec<String> {
        let mut entries: Vec<String> = names
            .iter()
            .map(|name| {
                self.ctx
                    .nodes
                    .get(&ObjectKey::cluster(name))
                    .and_then(|n| n.labels().get(HOSTNAME_LABEL).cloned())
                    .unwrap_or_else(|| name.clone())
            })
            .collect();
        entries.sort();
        entries.dedup();
        entries
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
        let failed = kept
            .iter()
            .find(|a| a.decision.phase == Phase::Failed)
            .map(|a| a.name.as_str());
        // Upstream's rule: outside the window new nodes still start while
        // any node of the plan is applying.
        let window_open = target.window.as_ref().is_none_or(|w| w.contains(now)) || !kept.is_empty();
        let holder = self.exclusive_holder(plan);
        let delay_until = delay_until(plan, status);
        let mut blocked = schedule::start_blocked(failed, window_open, holder.as_deref(), delay_until, now);
        if !window_open && target.window.as_ref().is_some_and(Window::never_opens) {
            blocked = blocked.map(|b| format!("{b} (it has no days, so it never opens)"));
        }
        // Upstream's default is 0, which selects no node (it says nothing; we do).
        let concurrency = plan.spec.concurrency.unwrap_or(0).max(0) as usize;
        if blocked.is_some() {
            return (Vec::new(), blocked);
        }
        if concurrency == 0 {
            return (
                Vec::new(),
                Some("spec.concurrency is unset or 0: no node starts until it is set".into()),
            );
        }
        if kept.len() >= concurrency {
            return (Vec::new(), None);
        }
        let applying: BTreeSet<&str> = kept.iter().map(|a| a.name.as_str()).collect();
        let candidates: Vec<Candidate> = tally
            .due()
            .filter(|name| !applying.contains(name))
            .filter_map(|name| self.ctx.nodes.get(&ObjectKey::cluster(name)))
            .map(|n| Candidate {
                name: n.name_any(),
                uid: n.metadata.uid.clone().unwrap_or_default(),
                ready: node_is_ready(&n),
            })
            .collect();
        let uid = plan.metadata.uid.clone().unwrap_or_default();
        (
            schedule::choose(&uid, &target.hash, kept.len(), concurrency, &candidates),
            None,
        )
    }

    /// Another exclusive plan with nodes applying, when this one is exclusive.
    fn exclusive_holder(&self, plan: &Plan) -> Option<String> {
        if !plan.spec.exclusive.unwrap_or(false) {
            return None;
        }
        self.ctx
            .plans
            .list()
            .into_iter()
            .filter(|p| p.spec.exclusive.unwrap_or(false) && p.metadata.uid != plan.metadata.uid)
            .find(|p| p.status.as_ref().is_some_and(|s| !s.applying.is_empty()))
            .map(|p| p.key())
            // What this replica wrote may not be in the cache yet.
            .or_else(|| {
                let applying = self
                    .ctx
                    .exclusive_applying
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                applying.iter().find(|k| **k != plan.key()).cloned()
            })
    }

    /// Remembers whether an exclusive plan has nodes applying, as written
    /// (the cache catches up later; the next exclusive plan must not wait for it).
    fn note_exclusive(&self, plan: &Plan, status: &PlanStatus) {
        if !plan.spec.exclusive.unwrap_or(false) {
            return;
        }
        let mut applying = self
            .ctx
            .exclusive_applying
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if status.applying.is_empty() {
            applying.remove(&plan.key());
        } else {
            applying.insert(plan.key());
        }
    }

    /// The plan's tally of the nodes it selects (that have a hostname to
    /// pin a Job to), brought up to date: from the nodes that changed since
    /// its last pass, or from every node when the target, the selector or
    /// the plan itself is new (or this is its first pass here).
    fn tally<'t>(&self, tallies: &'t mut HashMap<ObjectKey, Tally>, plan: &Plan, hash: &str) -> &'t Tally {
        let key = plan_key(plan);
        let basis = Basis {
            plan_uid: plan.metadata.uid.clone().unwrap_or_default(),
            generation: plan.metadata.generation,
            hash: hash.to_string(),
        };
        // Taken before the cache is read: a change after this is noted again.
        let changed = self.ctx.changed_nodes.take(&key);
        let label = node_label(&plan.name_any());
        let mark = |node: &Node| {
            selects(plan, node).then(|| {
                let value = hash_label_of(&label, node);
                Mark {
                    upgraded: value == Some(hash),
                    due: schedule::is_due(value, hash),
                }
            })
        };
        match tallies.entry(key) {
            Entry::Occupied(e) if e.get().basis() == &basis => {
                let tally = e.into_mut();
                for name in changed {
                    let node = self.ctx.nodes.get(&ObjectKey::cluster(&name));
                    tally.set(&name, node.as_deref().and_then(mark));
                }
                tally
            }
            e => {
                let mut tally = Tally::new(basis);
                for node in self.ctx.nodes.list() {
                    if let Some(m) = mark(&node) {
                        tally.set(name_of(&node), Some(m));
                    }
                }
                match e {
                    Entry::Occupied(mut e) => {
                        e.insert(tally);
                        e.into_mut()
                    }
                    Entry::Vacant(e) => e.insert(tally),
                }
            }
        }
    }

    /// A deleted plan's tally and notes go with it.
    fn forget_tally(&self, key: &ObjectKey) {
        self.ctx.changed_nodes.take(key);
        self.ctx
            .tallies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// What the cluster shows about one applying node.
    fn node_facts(&self, plan: &Plan, name: &str, hash: &str, now: Timestamp) -> NodeFacts {
        let node = self.ctx.nodes.get(&ObjectKey::cluster(name));
        let plan_name = plan.name_any();
        let ns = plan.namespace().unwrap_or_default();
        let current = job_name(&plan_name, name, hash);
        let job_object = self.ctx.jobs.get(&ObjectKey::new(Some(&ns), &current));
        let job = job_object
            .as_deref()
            .map(|j| job_state(j, name))
            .unwrap_or(JobState::Absent);
        let prepare_job = plan.spec.prepare.as_ref().map(|_| {
            self.ctx
                .jobs
                .get(&ObjectKey::new(
                    Some(&ns),
                    &prepare_job_name(&plan_name, name, hash),
                ))
                .map(|j| job_state(&j, name))
                .unwrap_or(JobState::Absent)
        });
        let earlier_job_running = self.ctx.jobs.list().iter().any(|j| {
            j.namespace().as_deref() == Some(ns.as_str())
                && j.labels().get(labels::PLAN) == Some(&plan_name)
                && j.labels().get(labels::NODE).map(String::as_str) == Some(name)
                && !j.labels().contains_key(STEP_LABEL)
                && j.name_any() != current
                && job_state(j, name) == JobState::Running
        });
        let maintenance = self
            .ctx
            .maintenances
            .get(&ObjectKey::cluster(&maintenance_name(plan, name)))
            .map(|m| maintenance_state(&m, drain_timeout(plan), now))
            .unwrap_or(Maintenance::Absent);
        let record = node.as_deref().and_then(recorded_changes);
        let cordoned_by_plan = record.as_ref().is_some_and(|c| c.owner == owner(plan));
        let held_by = record.map(|c| c.owner).filter(|o| *o != owner(plan));
        let upstream_cordon = node
            .as_deref()
            .is_some_and(|n| cordoned_by_upstream(plan, n, job_object.as_deref()));
        let remnants = maintenance != Maintenance::Absent
            || cordoned_by_plan
            || upstream_cordon
            || job == JobState::Running
            || earlier_job_running;
        NodeFacts {
            name: name.to_string(),
            hash_label: node.as_ref().and_then(|n| hash_label(plan, n)),
            ready: node.as_deref().is_some_and(node_is_ready),
            ready_since: node.as_deref().and_then(ready_since),
            selected: node.as_deref().is_some_and(|n| selects(plan, n)),
            maintenance,
            cordoned_by_plan,
            held_by,
            job,
            prepare_job,
            earlier_job_running,
            remnants,
        }
    }
}

/// Did upstream's Job (a System Upgrade Controller's, taken over) cordon
/// the node? Its own cordon or drain container did, and upstream uncordons
/// once the Job completed: a node taken over mid-upgrade gets the same.
/// Only a node no one recorded a change on (an admin's or another owner's
/// cordon stays).
fn cordoned_by_upstream(plan: &Plan, node: &Node, job: Option<&Job>) -> bool {
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let upstream_job =
        job.is_some_and(|j| made_by_upstream(j) && job_state(j, &node.name_any()) == JobState::Succeeded);
    unschedulable && upstream_job && prep_of(plan) != Prep::Nothing && recorded_changes(node).is_none()
}

/// A Job the System Upgrade Controller made: it carries upstream's
/// controller label (which nodewarden's carry too) and, unlike
/// nodewarden's, no owner (upstream makes its Jobs without one).
fn made_by_upstream(job: &Job) -> bool {
    job.labels().contains_key(labels::CONTROLLER)
        && !job
            .owner_references()
            .iter()
            .any(|o| o.kind == "Plan" && o.controller == Some(true))
}

/// The nodes whose hostname label is one of `entries` (`nodes`: name and
/// label), in the entries' order; an entry no node carries stands for
/// itself (a node since gone, or a name an older status wrote), so the
/// step that finds no node releases it.
fn nodes_of_hostnames(entries: &[String], nodes: &[(String, String)]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for entry in entries {
        let found: Vec<&String> = nodes.iter().filter(|(_, h)| h == entry).map(|(n, _)| n).collect();
        let found = match found.is_empty() {
            true => vec![entry],
            false => found,
        };
        for name in found {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
    }
    names
}

/// How the plan prepares a node: drain implies cordon.
fn prep_of(plan: &Plan) -> Prep {
    match (&plan.spec.drain, plan.spec.cordon.unwrap_or(false)) {
        (Some(_), _) => Prep::Drain,
        (None, true) => Prep::Cordon,
        (None, false) => Prep::Nothing,
    }
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

fn selects(plan: &Plan, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    labels.contains_key(HOSTNAME_LABEL)
        && node.metadata.deletion_timestamp.is_none()
        && plan
            .spec
            .node_selector
            .as_ref()
            .is_some_and(|s| selector_matches(s, labels))
}

fn hash_label(plan: &Plan, node: &Node) -> Option<String> {
    hash_label_of(&node_label(&plan.name_any()), node).map(str::to_string)
}

/// The plan's hash label on `node`, by the label's key made once: a pass
/// looks at every selected node, and at thousands of nodes making the key
/// (and copying the value) for each was most of a reconcile's time.
fn hash_label_of<'a>(key: &str, node: &'a Node) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// A node's name without a copy.
fn name_of(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

fn ready_since(node: &Node) -> Option<Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

fn job_state(job: &Job, node: &str) -> JobState {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let find = |t: &str| conditions.and_then(|cs| cs.iter().find(|c| c.type_ == t && c.status == "True"));
    if find("Complete").is_some() {
        return JobState::Succeeded;
    }
    match find("Failed") {
        // Upstream's words: "Job <ns>/<name> failed on Node <node>: <reason>: <message>".
        Some(c) => JobState::Failed(format!(
            "Job {}/{} failed on Node {node}: {}: {}",
            job.namespace().unwrap_or_default(),
            job.name_any(),
            c.reason.as_deref().unwrap_or_default(),
            c.message.as_deref().unwrap_or_default(),
        )),
        None => JobState::Running,
    }
}

/// How the plan's maintenance of a node stands. One still draining past
/// `timeout` (spec.drain.timeout) counts as failed, naming what blocks it,
/// though it goes on draining: the failure clears when the drain finishes.
fn maintenance_state(m: &medik8s::NodeMaintenance, timeout: Option<Duration>, now: Timestamp) -> Maintenance {
    let status = m.status.clone().unwrap_or_default();
    let blockers: Vec<String> = status
        .blocked_by
        .iter()
        .flatten()
        .map(|b| match b.pdb.as_str() {
            "" => format!("pod {}", b.pod),
            pdb => format!("pod {} (PodDisruptionBudget {pdb})", b.pod),
        })
        .collect();
    let mut detail: Vec<String> = status.last_error.iter().cloned().collect();
    if !blockers.is_empty() {
        detail.push(format!("blocked by {}", blockers.join(", ")));
    }
    let detail = detail.join("; ");
    match status.phase {
        Some(MaintenancePhase::Succeeded) => Maintenance::Succeeded,
        Some(MaintenancePhase::Failed) => {
            Maintenance::Failed(format!("NodeMaintenance {}: {detail}", m.name_any()))
        }
        _ => {
            let left = match status.pending_pods_count {
                Some(n) if n > 0 => format!(": {n} pods left"),
                _ => String::new(),
            };
            let started = m.metadata.creation_timestamp.as_ref().map(|t| t.0);
            if let (Some(timeout), Some(started)) = (timeout, started)
                && now.duration_since(started).unsigned_abs() >= timeout
                && now > started
            {
                let detail = match detail.as_str() {
                    "" => String::new(),
                    d => format!("; {d}"),
                };
                return Maintenance::Failed(format!(
                    "NodeMaintenance {} not drained within spec.drain.timeout ({}s), still draining{left}{detail}",
                    m.name_any(),
                    timeout.as_secs()
                ));
            }
            Maintenance::Running(match detail.as_str() {
                "" => format!("draining{left}"),
                d => format!("draining{left}; {d}"),
            })
        }
    }
}

/// When the next node may start after the last completion.
fn delay_until(plan: &Plan, status: &PlanStatus) -> Option<Timestamp> {
    let delay = plan
        .spec
        .post_complete_delay
        .as_deref()
        .and_then(parse_go_duration)?;
    let last = status.last_completion_time.as_ref()?.0;
    last.checked_add(jiff::SignedDuration::try_from(delay).ok()?).ok()
}

/// The per-node records: a kept node keeps its start, trace and (in the
/// same phase) its phase's start; a new node gets a trace of its own.
fn records(
    old: &PlanStatus,
    kept: &[&Applying],
    chosen: &[String],
    first: Phase,
    hash: &str,
    now: Timestamp,
) -> Vec<NodeUpgrade> {
    let mut out = Vec::new();
    for a in kept {
        let prev = old.nodes.iter().find(|r| r.name == a.name);
        let phase = a.decision.phase.as_str().to_string();
        let same = prev.is_some_and(|r| r.phase == phase && r.hash == hash);
        out.push(NodeUpgrade {
            name: a.name.clone(),
            hash: hash.to_string(),
            phase_since: match (same, prev) {
                (true, Some(r)) => r.phase_since.clone(),
                _ => Time(now),
            },
            phase,
            started: prev.map(|r| r.started.clone()).unwrap_or(Time(now)),
            message: a.decision.message.clone(),
            traceparent: prev
                .map(|r| r.traceparent.clone())
                .unwrap_or_else(|| TraceParent::new_root().header()),
        });
    }
    out.extend(chosen.iter().map(|name| NodeUpgrade {
        name: name.clone(),
        hash: hash.to_string(),
        phase: first.as_str().into(),
        started: Time(now),
        phase_since: Time(now),
        message: "starting".into(),
        traceparent: TraceParent::new_root().header(),
    }));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Complete: True once every selected node is on the hash and none applies.
fn complete_condition(
    status: &mut PlanStatus,
    generation: Option<i64>,
    kept: &[&Applying],
    blocked: Option<&str>,
    upgraded: usize,
    selected: usize,
    now: Timestamp,
) {
    let (ok, reason, message) = if let Some(f) = kept.iter().find(|a| a.decision.phase == Phase::Failed) {
        let reason = failure_of(&f.decision.message).as_str();
        (false, reason, format!("node {}: {}", f.name, f.decision.message))
    } else if !kept.is_empty() || !status.applying.is_empty() {
        let nodes: Vec<String> = status
            .nodes
            .iter()
            .map(|r| format!("{} {} ({})", r.name, r.phase, r.message))
            .collect();
        (
            false,
            "SyncJob",
            format!("{upgraded}/{selected} upgraded; {}", nodes.join("; ")),
        )
    } else if upgraded < selected {
        let why = blocked.unwrap_or("waiting for nodes to be Ready");
        (false, "Waiting", format!("{upgraded}/{selected} upgraded; {why}"))
    } else {
        (
            true,
            "Complete",
            format!("all {selected} selected nodes upgraded"),
        )
    };
    set_condition(
        &mut status.conditions,
        "Complete",
        ok,
        reason,
        message,
        generation,
        now,
    );
}

/// The selected nodes by state: applying (or failed) as `status` lists
/// them, else upgraded or due by their hash label.
fn node_counts(status: &PlanStatus, tally: &Tally) -> HashMap<PlanNodeState, usize> {
    let mut counts = HashMap::new();
    let applying: BTreeSet<&str> = status.applying.iter().map(String::as_str).collect();
    for r in status.nodes.iter().filter(|r| applying.contains(r.name.as_str())) {
        let state = match r.phase == Phase::Failed.as_str() {
            true => PlanNodeState::Failed,
            false => PlanNodeState::Applying,
        };
        *counts.entry(state).or_insert(0) += 1;
    }
    // The rest of the selected nodes: upgraded or due, applying ones aside.
    let (mut upgraded, mut due) = (tally.upgraded(), tally.selected() - tally.upgraded());
    for mark in applying.iter().filter_map(|name| tally.get(name)) {
        match mark.upgraded {
            true => upgraded -= 1,
            false => due -= 1,
        }
    }
    counts.insert(PlanNodeState::Upgraded, upgraded);
    counts.insert(PlanNodeState::Due, due);
    counts
}

/// What a failed node's message says failed (schedule's drain messages
/// start with "drain").
fn failure_of(message: &str) -> PlanFailure {
    if message.starts_with(schedule::DRAIN_FAILED) {
        PlanFailure::DrainFailed
    } else {
        PlanFailure::JobFailed
    }
}

/// How soon to look again: while a node settles or a delay runs out.
fn next_look(plan: &Plan, status: &PlanStatus, kept: &[&Applying], now: Timestamp) -> Duration {
    let mut wait = Duration::from_secs(3600);
    if kept
        .iter()
        .any(|a| matches!(a.decision.phase, Phase::WaitingReady | Phase::Releasing))
    {
        wait = wait.min(Duration::from_secs(1));
    }
    if let Some(t) = delay_until(plan, status).filter(|t| *t > now) {
        wait = wait.min(now.duration_until(t).unsigned_abs() + Duration::from_millis(50));
    }
    wait
}

/// kubectl's hash of each Secret in the hash, in `spec.secrets` order.
type SecretData = Vec<String>;

impl PlanReconciler {
    /// What admission could not check: the window's time zone, the
    /// Secrets the hash needs. Upstream's wording where it has one.
    async fn validate(&self, plan: &Plan) -> std::result::Result<(Option<Window>, SecretData), String> {
        let spec = &plan.spec;
        if let Some(d) = &spec.drain
            && d.delete_emptydir_data.is_some()
            && d.delete_local_data.is_some()
        {
            return Err("spec.drain cannot specify both deleteEmptydirData and deleteLocalData".into());
        }
        if let Some(delay) = spec.post_complete_delay.as_deref() {
            if delay.trim_start().starts_with('-') {
                return Err("spec.postCompleteDelay is negative".into());
            }
            if parse_go_duration(delay).is_none() {
                return Err(format!("spec.postCompleteDelay {delay:?} is not a duration"));
            }
        }
        let window = spec.window.as_ref().map(Window::parse).transpose()?;
        let ns = plan.namespace().unwrap_or_default();
        let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &ns);
        let mut secrets = SecretData::new();
        for name in hash::hashed_secrets(spec) {
            match api.get_opt(name).await {
                Ok(Some(s)) => {
                    secrets.push(hash::secret_hash(&s));
                }
                Ok(None) => {
                    return Err(format!(
                        "spec.secrets: secret \"{name}\" not found in namespace {ns}"
                    ));
                }
                Err(e) => return Err(format!("spec.secrets: reading secret \"{name}\": {e}")),
            }
        }
        Ok((window, secrets))
    }

    /// The version: `spec.version`, else the channel's answer (asked at
    /// most once per poll interval). Ok carries how: Version or Channel.
    async fn resolve(&self, plan: &Plan) -> std::result::Result<(String, &'static str), String> {
        if let Some(v) = plan.spec.version.as_deref().filter(|v| !v.is_empty()) {
            return Ok((channel::munge(v), "Version"));
        }
        let Some(url) = plan.spec.channel.as_deref().filter(|c| !c.is_empty()) else {
            return Err("cannot resolve plan: missing channel and version".into());
        };
        let key = plan.key();
        let cached = {
            let channels = self.ctx.channels.lock().unwrap_or_else(|e| e.into_inner());
            channels
                .get(&key)
                .filter(|c| c.url == url && c.at.elapsed() < self.ctx.config.channel_poll)
                .map(|c| c.answer.clone())
        };
        let answer = match cached {
            Some(answer) => answer,
            None => {
                let asker = channel::Asker {
                    cluster_id: self.cluster_id().await,
                    latest_version: plan.status.as_ref().and_then(|s| s.latest_version.clone()),
                };
                let answer = channel::resolve(url, &asker).await.map_err(|e| e.to_string());
                let mut channels = self.ctx.channels.lock().unwrap_or_else(|e| e.into_inner());
                channels.insert(
                    key,
                    ChannelAnswer {
                        url: url.to_string(),
                        answer: answer.clone(),
                        at: Instant::now(),
                    },
                );
                answer
            }
        };
        answer.map(|v| (v, "Channel"))
    }

    /// The cluster's ID as upstream tells channels: the UID of
    /// `kube-system`, read once. Unreadable, channels are asked without it.
    async fn cluster_id(&self) -> Option<String> {
        let read = self
            .ctx
            .cluster_id
            .get_or_try_init(|| async {
                let api: Api<Namespace> = Api::all(self.ctx.client.clone());
                api.get("kube-system")
                    .await
                    .map(|ns| ns.metadata.uid.unwrap_or_default())
            })
            .await;
        match read {
            Ok(uid) => Some(uid.clone()),
            Err(e) => {
                tracing::warn!(error = %e, "kube-system unreadable: channels are asked without a cluster ID");
                None
            }
        }
    }

    /// Carries out one node's step.
    async fn step(&self, plan: &Plan, node: &str, step: Step, target: &Target) -> Result<()> {
        if matches!(step, Step::Wait | Step::Finish) {
            return Ok(());
        }
        self.ctx.leader.ensure_leader()?;
        match step {
            Step::Wait | Step::Finish => Ok(()),
            Step::Drain => self.create_maintenance(plan, node, target).await,
            Step::Cordon => self.cordon(plan, node).await,
            Step::CreateJob => self.create_job(plan, node, target).await,
            Step::Prepare => self.create_prepare_job(plan, node, target).await,
            Step::RetryPrepare => self.retry_prepare(plan, node, target).await,
            Step::Label => self.label(plan, node, target).await,
            Step::Release => self.release(plan, node, &target.hash).await,
        }
    }

    async fn create_maintenance(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let mut labels = inherited_labels(plan);
        labels.insert(labels::PLAN.into(), plan.name_any());
        labels.insert(
            labels::PLAN_NAMESPACE.into(),
            plan.namespace().unwrap_or_default(),
        );
        // The node's record (and trace) was written when it was chosen.
        let traceparent = plan
            .status
            .iter()
            .flat_map(|s| s.nodes.iter())
            .find(|r| r.name == node)
            .map(|r| r.traceparent.clone())
            .unwrap_or_default();
        let mut annotations = BTreeMap::new();
        if !traceparent.is_empty() {
            annotations.insert(TRACEPARENT_ANNOTATION.to_string(), traceparent);
        }
        // The drain follows kubectl's rules with the plan's options, as upstream's.
        let drain = KubectlDrain::of(&plan.spec.drain.clone().unwrap_or_default());
        annotations.insert(
            kubectl::ANNOTATION.to_string(),
            serde_json::to_string(&drain).unwrap_or_default(),
        );
        let m = medik8s::NodeMaintenance {
            metadata: ObjectMeta {
                name: Some(maintenance_name(plan, node)),
                labels: Some(labels),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: medik8s::NodeMaintenanceSpec {
                node_name: node.to_string(),
                reason: Some(format!(
                    "Plan {} upgrades the node to {}",
                    plan.key(),
                    target.version
                )),
                // No deadline of its own: past spec.drain.timeout the plan
                // reports the drain failed while it goes on (see
                // `maintenance_state`), instead of a transient PDB block
                // stopping the plan for good.
                drain_timeout: None,
                on_drain_timeout: None,
            },
            status: None,
        };
        let api: Api<medik8s::NodeMaintenance> = Api::all(self.ctx.client.clone());
        match api.create(&PostParams::default(), &m).await {
            Ok(_) => {
                self.event(
                    plan,
                    EventType::Normal,
                    "Draining",
                    format!("draining node {node}"),
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn cordon(&self, plan: &Plan, node: &str) -> Result<()> {
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        // Written back whole, so read fresh: the cache keeps a trimmed Node.
        let Some(current) = api.get_opt(node).await? else {
            return Ok(());
        };
        let want = Quarantine {
            cordon: true,
            taints: Vec::new(),
            labels: BTreeMap::new(),
        };
        // Held by another since the cache saw it: retried, and the next
        // round waits for them (see `held_by`).
        let changed =
            crate::drain::node::apply(&current, &want, &owner(plan)).map_err(|e| Error::Changed {
                kind: "Node",
                name: node.to_string(),
                reason: e.to_string(),
            })?;
        if let Some(changed) = changed {
            api.replace(node, &PostParams::default(), &changed).await?;
            self.event(plan, EventType::Normal, "Cordon", format!("cordoned node {node}"));
        }
        Ok(())
    }

    async fn create_job(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let Some(current) = self.ctx.nodes.get(&ObjectKey::cluster(node)) else {
            return Ok(());
        };
        let job = upgrade_job(
            plan,
            &JobNode::of(&current),
            &target.version,
            &target.hash,
            &self.ctx.config.jobs,
        );
        self.create_job_once(plan, job, format!("upgrades node {node}"))
            .await
    }

    /// The node's prepare Job, before anything else is done to it.
    async fn create_prepare_job(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let Some(current) = self.ctx.nodes.get(&ObjectKey::cluster(node)) else {
            return Ok(());
        };
        let Some(job) = prepare_job(
            plan,
            &JobNode::of(&current),
            &target.version,
            &target.hash,
            &self.ctx.config.jobs,
        ) else {
            return Ok(());
        };
        self.create_job_once(plan, job, format!("prepares node {node}"))
            .await
    }

    /// Creates a Job of a fixed name: one per node, step and hash. Made
    /// before (by this replica or the last leader) counts as done.
    async fn create_job_once(&self, plan: &Plan, job: Job, what: String) -> Result<()> {
        let api: Api<Job> = Api::namespaced(self.ctx.client.clone(), &plan.namespace().unwrap_or_default());
        match api.create(&PostParams::default(), &job).await {
            Ok(j) => {
                self.event(
                    plan,
                    EventType::Normal,
                    "SyncJob",
                    format!("Job {} {what}", j.name_any()),
                );
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// A failed prepare Job is reported and deleted, and the next pass
    /// makes it again: upstream recreates a failed Job, and a prepare that
    /// waits for something (the servers of a k3s pair) must go on waiting.
    /// Nothing has been cordoned or drained yet, so nothing waits on it.
    async fn retry_prepare(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let ns = plan.namespace().unwrap_or_default();
        let name = prepare_job_name(&plan.name_any(), node, &target.hash);
        let Some(job) = self.ctx.jobs.get(&ObjectKey::new(Some(&ns), &name)) else {
            return Ok(());
        };
        if let JobState::Failed(why) = job_state(&job, node) {
            self.event(plan, EventType::Warning, "JobFailed", format!("{why}; retrying"));
        }
        let api: Api<Job> = Api::namespaced(self.ctx.client.clone(), &ns);
        super::delete_if_present(&api, &name, &background_deletion(&job)).await?;
        Ok(())
    }

    /// The node gets the hash and postCompleteLabels (with the version and hash expanded).
    async fn label(&self, plan: &Plan, node: &str, target: &Target) -> Result<()> {
        let mut labels = serde_json::Map::new();
        labels.insert(node_label(&plan.name_any()), target.hash.clone().into());
        for (k, v) in &plan.spec.post_complete_labels {
            let v = v
                .replace("$(LATEST_VERSION)", &target.version)
                .replace("$(LATEST_HASH)", &target.hash);
            labels.insert(k.clone(), v.into());
        }
        let patch = serde_json::json!({ "metadata": { "labels": labels } });
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.event(
            plan,
            EventType::Normal,
            "JobComplete",
            format!("node {node} upgraded to {}", target.version),
        );
        Ok(())
    }

    /// Deletes every Job of this plan (by owner UID, so never a recreated
    /// plan's), finished ones too. They are owned by the plan, but a deleted
    /// plan does not leave its cleanup to the garbage collector's pace — nor
    /// to a collector that lost track after an API server restart (seen in
    /// tests/chaos_storms.rs: a finished Job outlived its plan by minutes).
    async fn delete_jobs(&self, plan: &Plan) -> Result<()> {
        let ns = plan.namespace().unwrap_or_default();
        let Some(uid) = plan.uid() else {
            return Ok(());
        };
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &ns);
        for job in self.ctx.jobs.list() {
            let ours = job.namespace().as_deref() == Some(ns.as_str())
                && job.owner_references().iter().any(|o| o.uid == uid);
            if ours {
                self.ctx.leader.ensure_leader()?;
                super::delete_if_present(&jobs, &job.name_any(), &background_deletion(&job)).await?;
            }
        }
        Ok(())
    }

    /// Undoes exactly what the plan did on `node`: its NodeMaintenance
    /// (whose undo uncordons only if it cordoned), its cordon record, its
    /// unfinished Jobs.
    async fn release(&self, plan: &Plan, node: &str, hash: &str) -> Result<()> {
        let maintenances: Api<medik8s::NodeMaintenance> = Api::all(self.ctx.client.clone());
        // The maintenance there now (a fresh list: the role may not get
        // them), deleted by its UID: a delete landing late, after another
        // leader began the node's next drain under the same name, is refused
        // instead of ending that drain.
        let name = maintenance_name(plan, node);
        let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
        for m in maintenances.list(&by_name).await?.items {
            super::delete_if_present(&maintenances, &name, &super::same_object(&m.metadata)).await?;
        }
        // Written back whole, so read fresh: the cache keeps a trimmed Node.
        let api: Api<Node> = Api::all(self.ctx.client.clone());
        if self.ctx.nodes.get(&ObjectKey::cluster(node)).is_some()
            && let Some(current) = api.get_opt(node).await?
            && let Some(restored) = crate::drain::node::undo(&current, &owner(plan))
        {
            api.replace(node, &PostParams::default(), &restored).await?;
        } else if let Some(current) = api.get_opt(node).await? {
            // Upstream's own cordon, lifted as upstream lifts it (on the
            // resourceVersion read: a late write loses to any change since).
            let job = self.ctx.jobs.get(&ObjectKey::new(
                plan.namespace().as_deref(),
                &job_name(&plan.name_any(), node, hash),
            ));
            if cordoned_by_upstream(plan, &current, job.as_deref()) {
                let mut uncordoned = current.clone();
                if let Some(spec) = uncordoned.spec.as_mut() {
                    spec.unschedulable = None;
                }
                api.replace(node, &PostParams::default(), &uncordoned).await?;
            }
        }
        let ns = plan.namespace().unwrap_or_default();
        let jobs: Api<Job> = Api::namespaced(self.ctx.client.clone(), &ns);
        for job in self.ctx.jobs.list() {
            let ours = job.namespace().as_deref() == Some(ns.as_str())
                && job.labels().get(labels::PLAN) == Some(&plan.name_any())
                && job.labels().get(labels::NODE).map(String::as_str) == Some(node);
            if ours && job_state(&job, node) == JobState::Running {
                super::delete_if_present(&jobs, &job.name_any(), &background_deletion(&job)).await?;
            }
        }
        Ok(())
    }

    /// Writes the status, conditioned on the resourceVersion the plan was
    /// read at: a stale read loses (409) and is retried on fresh state.
    async fn write_status(&self, plan: &Plan, status: PlanStatus) -> Result<()> {
        let updated = plan_status_write(plan, status);
        if plan.status == updated.status {
            return Ok(());
        }
        self.ctx.leader.ensure_leader()?;
        let api: Api<Plan> = Api::namespaced(self.ctx.client.clone(), &plan.namespace().unwrap_or_default());
        api.replace_status(&plan.name_any(), &PostParams::default(), &updated)
            .await?;
        Ok(())
    }

    /// Once the status is written: the phase spans that ended, the root
    /// span of each released node, the Events.
    async fn after_write(
        &self,
        plan: &Plan,
        old: &PlanStatus,
        new: &PlanStatus,
        released: &[String],
        target: &Target,
        now: Timestamp,
    ) {
        let end = SystemTime::from(now);
        let mut emitted = false;
        for r in &old.nodes {
            let Some(tp) = TraceParent::parse(&r.traceparent) else {
                continue;
            };
            let next = new.nodes.iter().find(|n| n.name == r.name);
            if next.is_some_and(|n| n.phase == r.phase) {
                continue;
            }
            self.observe_job(plan, r, next, end);
            if let Some(span) = phase_span(&r.phase) {
                emitted = true;
                trace::emit_phase(
                    &tp,
                    SpanRecord::new(span, SystemTime::from(r.phase_since.0), end)
                        .attr("k8s.node.name", r.name.clone()),
                );
            }
            if released.contains(&r.name) {
                trace::emit_root(
                    &tp,
                    SpanRecord::new("upgrade node", SystemTime::from(r.started.0), end)
                        .attr("nodewarden.plan", plan.key())
                        .attr("k8s.node.name", r.name.clone())
                        .attr("nodewarden.version", target.version.clone())
                        .attr("nodewarden.hash", target.hash.clone()),
                );
                self.event(
                    plan,
                    EventType::Normal,
                    "Upgraded",
                    format!("node {} upgraded and Ready", r.name),
                );
            }
        }
        for n in &new.nodes {
            let was = old.nodes.iter().find(|r| r.name == n.name);
            if was.is_none() {
                self.event(
                    plan,
                    EventType::Normal,
                    "Upgrading",
                    format!("node {} starts applying", n.name),
                );
            }
            if n.phase == Phase::Failed.as_str() && was.is_none_or(|r| r.phase != n.phase) {
                self.event(
                    plan,
                    EventType::Warning,
                    failure_of(&n.message).as_str(),
                    format!("node {}: {}", n.name, n.message),
                );
            }
        }
        if emitted {
            // A replica killed later loses nothing it already wrote.
            trace::flush(TRACE_FLUSH_TIMEOUT).await;
        }
        let complete = |s: &PlanStatus| crate::api::conditions::is_true(&s.conditions, "Complete");
        if complete(new) && !complete(old) {
            self.event(
                plan,
                EventType::Normal,
                "Complete",
                format!("every selected node runs {}", target.version),
            );
        }
    }

    /// A record that left the job phase: the Job's duration; one that
    /// turned Failed: a failure.
    fn observe_job(&self, plan: &Plan, was: &NodeUpgrade, next: Option<&NodeUpgrade>, end: SystemTime) {
        let Some(next) = next else {
            return;
        };
        let took = end
            .duration_since(SystemTime::from(was.phase_since.0))
            .unwrap_or_default();
        let failed = next.phase == Phase::Failed.as_str();
        if was.phase == Phase::Upgrading.as_str() && (failed || next.phase == Phase::WaitingReady.as_str()) {
            let result = if failed {
                JobResult::Failed
            } else {
                JobResult::Succeeded
            };
            self.ctx
                .metrics
                .plan_job_duration
                .get_or_create(&JobResultLabels { result })
                .observe(took.as_secs_f64());
        }
        if failed {
            self.ctx
                .metrics
                .plan_failures
                .get_or_create(&PlanFailureLabels {
                    plan_namespace: plan.namespace().unwrap_or_default(),
                    plan: plan.name_any(),
                    reason: failure_of(&next.message),
                })
                .inc();
        }
    }

    fn event(&self, plan: &Plan, type_: EventType, reason: &str, note: String) {
        let event = super::event(type_, reason, "Upgrade", &note);
        super::spawn_event(&self.ctx.recorder, event, plan.object_ref(&()));
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
        let entries = plan
            .status
            .as_ref()
            .map(|s| s.applying.clone())
            .unwrap_or_default();
        let mut nodes: BTreeSet<String> = self.applying_names(&entries).into_iter().collect();
        let me = owner(plan);
        for n in self.ctx.nodes.list() {
            if recorded_changes(&n).is_some_and(|c| c.owner == me) {
                nodes.insert(n.name_any());
            }
        }
        for m in self.ctx.maintenances.list() {
            if plan_of(&m.metadata).is_some_and(|k| {
                k.untyped() == &ObjectKey::new(plan.namespace().as_deref(), &plan.name_any())
            }) {
                nodes.insert(m.spec.node_name.clone());
            }
        }
        for node in &nodes {
            self.ctx.leader.ensure_leader()?;
            let hash = plan
                .status
                .as_ref()
                .and_then(|s| s.latest_hash.clone())
                .unwrap_or_default();
            self.release(plan, node, &hash).await?;
        }
        self.delete_jobs(plan).await?;
        // One fresh list by the plan's labels (what its maintenances carry;
        // the role may list them, not get them).
        let maintenances: Api<medik8s::NodeMaintenance> = Api::all(self.ctx.client.clone());
        let of_plan = format!(
            "{}={},{}={}",
            labels::PLAN,
            plan.name_any(),
            labels::PLAN_NAMESPACE,
            plan.namespace().unwrap_or_default()
        );
        let left: Vec<String> = maintenances
            .list(&ListParams::default().labels(&of_plan))
            .await?
            .items
            .into_iter()
            .map(|m| m.spec.node_name)
            .collect();
        if !left.is_empty() {
            tracing::debug!(plan = %plan.key(), nodes = ?left, "waiting for the plan's maintenances to be gone");
            return Ok(Action::RequeueAfter(Duration::from_secs(2)));
        }
        finalizer::remove(&self.plans_api(plan), plan, FINALIZER).await?;
        Ok(Action::Done)
    }
}

/// What a status write of `plan` sends: the plan as read (so its
/// resourceVersion, a precondition: a write landing late, after another
/// leader wrote, is refused with 409) with `status`, observed at the plan's
/// generation.
pub fn plan_status_write(plan: &Plan, mut status: PlanStatus) -> Plan {
    status.observed_generation = plan.metadata.generation;
    let mut updated = plan.clone();
    updated.status = Some(status);
    updated
}

/// A phase's span name in the node's trace.
fn phase_span(phase: &str) -> Option<&'static str> {
    Some(match phase {
        "Preparing" => "prepare",
        "Cordoning" => "cordon",
        "Draining" => "drain",
        "Upgrading" => "job",
        "WaitingReady" => "wait ready",
        "Releasing" => "uncordon",
        _ => return None,
    })
}

/// `job` deleted with its pods (the API's default for Jobs keeps them), and
/// only `job`: a delete landing late, after a plan of the same name made a
/// Job of the same name (one per node and hash), is refused.
fn background_deletion(job: &Job) -> DeleteParams {
    DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..super::same_object(&job.metadata)
    }
}

/// drain.timeout as a NodeMaintenance drainTimeout: nanoseconds or a Go duration.
/// spec.drain.timeout: nanoseconds as a number (upstream's Go duration) or a
/// duration string; none or zero is no timeout.
fn drain_timeout(plan: &Plan) -> Option<Duration> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match plan.spec.drain.as_ref()?.timeout.as_ref()? {
        IntOrString::Int(ns) if *ns > 0 => Some(Duration::from_nanos(*ns as u64)),
        IntOrString::Int(_) => None,
        IntOrString::String(s) => parse_go_duration(s).filter(|d| !d.is_zero()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn applying_entries_are_hostnames() {
        let nodes = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(n, h)| (n.to_string(), h.to_string()))
                .collect()
        };
        let strings = |s: &[&str]| -> Vec<String> { s.iter().map(|x| x.to_string()).collect() };
        /// Entries, nodes as name and hostname, the node names.
        type Row<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a [&'a str]);
        let table: &[Row] = &[
            (&["a"], &[("a", "a")], &["a"]),
            (
                &["ip-10-0-0-1"],
                &[("ip-10-0-0-1.ec2.internal", "ip-10-0-0-1")],
                &["ip-10-0-0-1.ec2.internal"],
            ),
            // An older status's node name, or a node since gone: itself.
            (&["gone"], &[("a", "a")], &["gone"]),
            // Two nodes sharing a hostname are both applying (upstream selects by label).
            (&["h"], &[("n1", "h"), ("n2", "h")], &["n1", "n2"]),
            (&["h", "n1"], &[("n1", "h")], &["n1"]),
            (&[], &[("a", "a")], &[]),
        ];
        for (entries, all, want) in table {
            assert_eq!(
                super::nodes_of_hostnames(&strings(entries), &nodes(all)),
                strings(want),
                "{entries:?}"
            );
        }
    }

    use super::*;
    use crate::api::plan::PlanSpec;
    use serde_json::json;

    #[test]
    fn a_status_write_carries_the_version_read_and_the_generation_observed() {
        let mut plan = Plan::new("p", PlanSpec::default());
        plan.metadata.resource_version = Some("12".into());
        plan.metadata.generation = Some(3);
        plan.status = Some(PlanStatus::default());
        let written = plan_status_write(&plan, PlanStatus::default());
        assert_eq!(written.metadata.resource_version.as_deref(), Some("12"));
        assert_eq!(
            written.status.as_ref().and_then(|s| s.observed_generation),
            Some(3)
        );
    }

    #[test]
    fn a_drain_past_its_timeout_fails_while_it_goes_on() {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).expect("a time");
        let nm = |phase: &str, blocked: bool| -> medik8s::NodeMaintenance {
            let blocked_by = match blocked {
                true => json!([{"pod": "ns/web-1", "pdb": "ns/web"}]),
                false => json!([]),
            };
            serde_json::from_value(json!({
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
                "metadata": {"name": "m", "creationTimestamp": t(0).to_string()},
                "spec": {"nodeName": "n1"},
                "status": {"phase": phase, "pendingPodsCount": 1, "blockedBy": blocked_by},
            }))
            .expect("a NodeMaintenance")
        };
        let minute = Some(Duration::from_secs(60));
        // (what, maintenance, timeout, now, expected state's kind, named in its message)
        let cases = [
            (
                "running, in time",
                nm("Running", true),
                minute,
                59,
                "Running",
                "web-1",
            ),
            (
                "running, past its timeout",
                nm("Running", true),
                minute,
                60,
                "Failed",
                "PodDisruptionBudget ns/web",
            ),
            (
                "no timeout: running",
                nm("Running", true),
                None,
                3600,
                "Running",
                "web-1",
            ),
            (
                "done after its timeout",
                nm("Succeeded", false),
                minute,
                600,
                "Succeeded",
                "",
            ),
        ];
        for (what, m, timeout, now, kind, named) in cases {
            let got = maintenance_state(&m, timeout, t(now));
            let (got_kind, message) = match &got {
                Maintenance::Absent => ("Absent", ""),
                Maintenance::Running(m) => ("Running", m.as_str()),
                Maintenance::Succeeded => ("Succeeded", ""),
                Maintenance::Failed(m) => ("Failed", m.as_str()),
            };
            assert_eq!(got_kind, kind, "{what}: {got:?}");
            assert!(message.contains(named), "{what}: {message}");
        }
    }

    #[test]
    fn the_next_node_waits_out_post_complete_delay() {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).expect("a time");
        let plan = |delay: Option<&str>| {
            Plan::new(
                "p",
                PlanSpec {
                    post_complete_delay: delay.map(String::from),
                    ..Default::default()
                },
            )
        };
        let done_at = |s: Option<i64>| PlanStatus {
            last_completion_time: s.map(|s| Time(t(s))),
            ..Default::default()
        };
        let table = [
            (Some("30s"), Some(100), Some(t(130))),
            (Some("1m30s"), Some(0), Some(t(90))),
            (Some("30s"), None, None),
            (None, Some(100), None),
        ];
        for (delay, last, want) in table {
            assert_eq!(
                delay_until(&plan(delay), &done_at(last)),
                want,
                "{delay:?} after {last:?}"
            );
        }
    }
}
