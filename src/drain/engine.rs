//! The drain engine: one task per node being drained, so drains run
//! concurrently and never block a controller's workers.
//!
//! A drain watches the pods of its node (a reflector with the field selector
//! `spec.nodeName=<node>` — all pods of the cluster are never cached), evicts
//! every pod that must go through the Eviction API (so PodDisruptionBudgets are
//! honoured, and each pod keeps its own grace period), retries refused
//! evictions when the budget that refused them allows a disruption again
//! (or after a backoff), names that budget, and ends
//! when the pods are gone — or when its timeout passes: then it fails with the
//! blockers named, or deletes the remaining pods, as the caller chose.
//!
//! Every eviction and deletion checks leadership right before it is sent; a
//! drain whose replica stops leading ends, and the next leader starts it again.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, EvictParams, Preconditions};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::budgets::{BudgetWatch, Freed};
use super::kubectl::{self, KubectlDrain, Verdict};
use super::pods::{classify, covering_budgets, reference};
use crate::api::node_maintenance::{DrainBlocker, DrainTimeoutPolicy, PodReference};
use crate::runtime::backoff::{Backoff, BackoffConfig};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::reflector::{FirstList, Reflector, ReflectorConfig};
use crate::runtime::store::Store;
use crate::runtime::sync::lock;

/// Evictions in flight at once per drain.
const EVICTION_CONCURRENCY: usize = 16;
/// With nothing blocked, a drain still looks again this often (a missed pod
/// event can only delay it this long).
const IDLE_RECHECK: Duration = Duration::from_secs(30);
/// How long a drain that succeeded keeps watching its node's pods: whoever
/// acts on the drained node next (a rollout deleting it) sees a pod bound
/// since then without listing the node's pods again (see
/// [`DrainEngine::pods_since_success`]).
const WATCH_AFTER_SUCCESS: Duration = Duration::from_secs(60);

/// How a drain runs: its timeout and what happens when it passes.
#[derive(Clone, Debug)]
pub struct DrainOptions {
    /// Give up (or force) after this long from the drain's start; None: never.
    pub timeout: Option<Duration>,
    /// What to do when `timeout` passes with pods left.
    pub on_timeout: DrainTimeoutPolicy,
    /// Backoff for refused evictions and API errors.
    pub retry: BackoffConfig,
    /// A Plan's drain: kubectl's rules and options; None: NodeMaintenance's.
    pub kubectl: Option<KubectlDrain>,
}

impl Default for DrainOptions {
    fn default() -> Self {
        DrainOptions {
            timeout: None,
            on_timeout: DrainTimeoutPolicy::Fail,
            retry: BackoffConfig {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(10),
                reset_after: Duration::from_secs(60),
            },
            kubectl: None,
        }
    }
}

/// How far a drain has come, in the terms NodeMaintenance's status reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DrainProgress {
    /// Whether the node's pods were listed and counted: until then the
    /// counts below are zeros, not the node's.
    pub counted: bool,
    /// All pods on the node when the drain began.
    pub total_pods: i32,
    /// Pods to evict when the drain began.
    pub eviction_pods: i32,
    /// Pods still to go.
    pub pending: Vec<PodReference>,
    /// Pods whose eviction a PodDisruptionBudget refuses.
    pub blocked: Vec<DrainBlocker>,
    /// The latest round's errors or refusals, if any.
    pub last_error: Option<String>,
    /// Pods deleted (bypassing budgets) after the timeout.
    pub forced: i32,
}

impl DrainProgress {
    /// Percent of the pods to evict that are gone (NMO's drainProgress).
    pub fn percent(&self) -> i32 {
        if self.eviction_pods <= 0 {
            return if self.pending.is_empty() { 100 } else { 0 };
        }
        let done = (self.eviction_pods - self.pending.len() as i32).max(0);
        (done * 100 / self.eviction_pods).clamp(0, 100)
    }
}

/// Where a drain stands.
#[derive(Clone, Debug, PartialEq)]
pub enum DrainOutcome {
    /// Pods are left and the drain goes on (also after a DeletePods timeout,
    /// until the deleted pods are gone).
    Running,
    /// Every pod to evict is gone.
    Succeeded,
    /// The timeout passed with pods left and the policy is to fail.
    TimedOut,
}

/// A snapshot of one drain.
#[derive(Clone, Debug)]
pub struct DrainStatus {
    /// Who asked for the drain (only they can stop it).
    pub owner: String,
    /// Where the drain stands.
    pub outcome: DrainOutcome,
    /// How far it has come.
    pub progress: DrainProgress,
    /// When this replica started it (the timeout counts from here).
    pub started: Instant,
    /// What happened to each pod, in order (at most [`MAX_POD_EVENTS`]): the
    /// drain's trace span carries them as events.
    pub pod_events: Vec<PodEvent>,
}

/// Evictions, refusals and forced deletions recorded for a drain's trace.
pub const MAX_POD_EVENTS: usize = 128;

/// One thing that happened to one pod during a drain.
#[derive(Clone, Debug, PartialEq)]
pub struct PodEvent {
    /// When it happened.
    pub at: std::time::SystemTime,
    /// `evicted`, `eviction refused` or `deleted`.
    pub what: &'static str,
    /// namespace/name
    pub pod: String,
}

/// Called whenever a drain's status changes (e.g. to enqueue its owner).
pub type OnChange = Arc<dyn Fn() + Send + Sync>;

struct Drain {
    status: Arc<Mutex<DrainStatus>>,
    /// The node's pods, once listed.
    pods: Arc<OnceLock<Store<Pod>>>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// The drains this replica runs, one per node. Cheap to clone (shared state).
#[derive(Clone)]
pub struct DrainEngine {
    client: Client,
    leader: LeaderHandle,
    // Lock order: `drains`, then `budgets` or `prepared`; never the reverse.
    drains: Arc<Mutex<HashMap<String, Drain>>>,
    /// Watched from the first drain until this replica stops leading.
    budgets: Arc<Mutex<Option<Arc<BudgetWatch>>>>,
    /// Pod watches started ahead of their drain (see [`DrainEngine::prepare`]).
    prepared: Arc<Mutex<HashMap<String, Prepared>>>,
}

/// A pod watch started ahead of its drain, and when.
struct Prepared {
    watch: PodWatch,
    at: Instant,
}

/// How long a pod watch started ahead waits for its drain.
const PREPARED_FOR: Duration = Duration::from_secs(30);

impl DrainEngine {
    /// An engine with no drains; `leader` is checked before every eviction.
    pub fn new(client: Client, leader: LeaderHandle) -> Self {
        DrainEngine {
            client,
            leader,
            drains: Arc::default(),
            budgets: Arc::default(),
            prepared: Arc::default(),
        }
    }

    /// Starts listing and watching `node`'s pods for a drain about to be
    /// asked for (a rollout does this as it requests one): the drain then
    /// starts on a list already under way. A watch no drain takes within
    /// [`PREPARED_FOR`] is stopped.
    pub fn prepare(&self, node: &str) {
        // `drains` before `prepared`, as `ensure` takes them: the other
        // order deadlocks a rollout's prepare against a drain's start.
        let drains = lock(&self.drains);
        let mut prepared = self.prepared();
        if prepared.contains_key(node) || drains.contains_key(node) {
            return;
        }
        let watch = PodWatch::start(&self.client, node);
        prepared.insert(
            node.to_string(),
            Prepared {
                watch,
                at: Instant::now(),
            },
        );
    }

    /// The pod watches started ahead, less those no drain took in time.
    fn prepared(&self) -> std::sync::MutexGuard<'_, HashMap<String, Prepared>> {
        let mut prepared = lock(&self.prepared);
        prepared.retain(|_, p| p.at.elapsed() < PREPARED_FOR);
        prepared
    }

    /// Starts draining `node` for `owner` unless that drain already runs or
    /// has finished; returns its status. A drain of the node for another
    /// owner is stopped first (the caller settles ownership on the Node).
    pub fn ensure(&self, node: &str, owner: &str, options: DrainOptions, on_change: OnChange) -> DrainStatus {
        let mut drains = lock(&self.drains);
        if let Some(d) = drains.get(node) {
            let status = lock(&d.status).clone();
            let ended_early = d.task.is_finished() && status.outcome == DrainOutcome::Running;
            if status.owner == owner && !ended_early {
                return status;
            }
            d.cancel.cancel();
        }
        let status = Arc::new(Mutex::new(DrainStatus {
            owner: owner.to_string(),
            outcome: DrainOutcome::Running,
            progress: DrainProgress::default(),
            started: Instant::now(),
            pod_events: Vec::new(),
        }));
        let cancel = CancellationToken::new();
        let budgets = lock(&self.budgets)
            .get_or_insert_with(|| Arc::new(BudgetWatch::start(self.client.clone())))
            .clone();
        // Subscribed before the first eviction, so no freeing is missed.
        let freed = budgets.subscribe();
        let pods = Arc::new(OnceLock::new());
        let prepared = self.prepared().remove(node).map(|p| p.watch);
        let run = DrainRun {
            budgets,
            prepared,
            pods: pods.clone(),
            client: self.client.clone(),
            leader: self.leader.clone(),
            node: node.to_string(),
            options,
            status: status.clone(),
            on_change,
            cancel: cancel.clone(),
        };
        tracing::info!(node, owner, "drain started");
        let task = tokio::spawn(run.run(freed));
        let snapshot = lock(&status).clone();
        drains.insert(
            node.to_string(),
            Drain {
                status,
                pods,
                cancel,
                task,
            },
        );
        snapshot
    }

    /// The status of the drain of `node`, whoever owns it, if there is one.
    pub fn status(&self, node: &str) -> Option<DrainStatus> {
        lock(&self.drains).get(node).map(|d| lock(&d.status).clone())
    }

    /// The pods to evict on `node` now, from the pod watch of a drain of it
    /// that succeeded, while that watch is connected (for a while after the
    /// success). None: no such watch; list the node's pods instead.
    ///
    /// Why: a list of one node's pods that must be current waits for the API
    /// server's pod cache to catch up, up to a tenth of a second where pods
    /// change seldom, and a rollout looks once more before it deletes a
    /// drained node. The watch shows the same pods as soon as they change.
    pub fn pods_since_success(&self, node: &str) -> Option<Vec<Arc<Pod>>> {
        let drains = lock(&self.drains);
        let drain = drains.get(node)?;
        if lock(&drain.status).outcome != DrainOutcome::Succeeded || drain.task.is_finished() {
            return None;
        }
        let pods = drain.pods.get().filter(|p| p.is_current())?;
        Some(to_evict(&pods.list()))
    }

    /// Stops `owner`'s drain of `node` (if any) and forgets it.
    pub fn stop(&self, node: &str, owner: &str) {
        let mut drains = lock(&self.drains);
        if drains.get(node).is_some_and(|d| lock(&d.status).owner == owner)
            && let Some(d) = drains.remove(node)
        {
            d.cancel.cancel();
        }
    }

    /// Drains running, and of those how many a PodDisruptionBudget holds up.
    pub fn counts(&self) -> (usize, usize) {
        // Called on every maintenance reconcile: read in place, clone nothing.
        let (mut running, mut blocked) = (0, 0);
        for d in lock(&self.drains).values() {
            let status = lock(&d.status);
            if status.outcome == DrainOutcome::Running {
                running += 1;
                blocked += usize::from(!status.progress.blocked.is_empty());
            }
        }
        (running, blocked)
    }

    /// Stops every drain (leadership lost, shutdown).
    pub fn stop_all(&self) {
        for (_, d) in lock(&self.drains).drain() {
            d.cancel.cancel();
        }
        lock(&self.prepared).clear();
        lock(&self.budgets).take();
    }
}

struct DrainRun {
    client: Client,
    budgets: Arc<BudgetWatch>,
    /// The node's pod watch, if one was started ahead (taken at the start).
    prepared: Option<PodWatch>,
    pods: Arc<OnceLock<Store<Pod>>>,
    leader: LeaderHandle,
    node: String,
    options: DrainOptions,
    status: Arc<Mutex<DrainStatus>>,
    on_change: OnChange,
    cancel: CancellationToken,
}

/// What one round of evictions found.
#[derive(Default)]
struct Round {
    blocked: Vec<Arc<Pod>>,
    errors: Vec<String>,
    forced: i32,
}

/// The pods that must go through eviction, in a stable order.
fn to_evict(all: &[Arc<Pod>]) -> Vec<Arc<Pod>> {
    let mut pending: Vec<Arc<Pod>> = all.iter().filter(|p| classify(p).evicted()).cloned().collect();
    pending.sort_by_key(|p| reference(p));
    pending
}

/// The pods a Plan's drain removes (kubectl's rules), in a stable order.
fn to_remove(all: &[Arc<Pod>], opts: &KubectlDrain, now: jiff::Timestamp) -> Vec<Arc<Pod>> {
    let mut pending: Vec<Arc<Pod>> = all
        .iter()
        .filter(|p| kubectl::verdict(p, opts, now) == Verdict::Remove)
        .cloned()
        .collect();
    pending.sort_by_key(|p| reference(p));
    pending
}

/// The status's `last_error` after a round: its errors, else the budgets
/// refusing evictions, else none (the drain is only waiting for pods to go).
fn round_error(errors: &[String], blocked: &[DrainBlocker]) -> Option<String> {
    if !errors.is_empty() {
        Some(errors.join("; "))
    } else if !blocked.is_empty() {
        Some(format!(
            "eviction refused by PodDisruptionBudget: {}",
            blocked
                .iter()
                .map(|b| format!("{} ({})", b.pod, b.pdb))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    } else {
        None
    }
}

/// The node's pods as a drain sees them, kept current by a watch.
struct PodWatch {
    store: Store<Pod>,
    /// Notified on every pod event, so a drain looks again at once.
    changed: Arc<tokio::sync::Notify>,
    /// Stops the watch when the drain ends, however it ends.
    _stop: DropGuard,
}

impl PodWatch {
    /// Lists and watches `node`'s pods until dropped.
    fn start(client: &Client, node: &str) -> PodWatch {
        let pods: Api<Pod> = Api::all(client.clone());
        // A consistent first list, though it may wait up to 0.1 s for the
        // API server's cache: a drain that succeeds on a list lacking the
        // last milliseconds' pods deletes a node with a pod on it (the chaos
        // test caught it with FirstList::Cached).
        let config = ReflectorConfig {
            field_selector: Some(format!("spec.nodeName={node}")),
            first_list: FirstList::Paged,
            ..Default::default()
        };
        let mut reflector = Reflector::new("drain-pods", pods, config);
        let changed = Arc::new(tokio::sync::Notify::new());
        let wake = changed.clone();
        reflector.on_event(move |_| wake.notify_one());
        let store = reflector.store();
        let stop = CancellationToken::new();
        tokio::spawn(reflector.run(stop.clone()));
        PodWatch {
            store,
            changed,
            _stop: stop.drop_guard(),
        }
    }
}

/// What a drain does after one look at the node's pods.
enum Step {
    /// The drain has ended (its outcome is in the status).
    Done,
    /// Look again on the next pod event, or after this long.
    Wait(Duration),
}

impl DrainRun {
    async fn run(mut self, mut freed: Freed) {
        let Some(watch) = self.watch_pods().await else {
            return;
        };
        let started = lock(&self.status).started;
        tracing::debug!(node = %self.node, elapsed = ?started.elapsed(), "drain: the node's pods are listed");
        let _ = self.pods.set(watch.store.clone());
        let mut backoff = Backoff::new(self.options.retry);
        let mut first = true;
        loop {
            let wait = match self.step(&watch.store, started, &mut backoff, first).await {
                Step::Done if lock(&self.status).outcome == DrainOutcome::Succeeded => {
                    // The watch goes on for a while (see WATCH_AFTER_SUCCESS).
                    tokio::select! {
                        _ = self.cancel.cancelled() => {}
                        _ = tokio::time::sleep(WATCH_AFTER_SUCCESS) => {}
                    }
                    return;
                }
                Step::Done => return,
                Step::Wait(wait) => wait,
            };
            first = false;
            let blocking = self.blocking_budgets();
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = watch.changed.notified() => {}
                _ = freed.any_of(&blocking) => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// The budgets that refused the last round's evictions (`namespace/name`).
    fn blocking_budgets(&self) -> BTreeSet<String> {
        lock(&self.status)
            .progress
            .blocked
            .iter()
            .flat_map(|b| b.pdb.split(','))
            .filter(|k| !k.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Watches the pods of the node only (never all of the cluster's; the
    /// watch started ahead, if any) and waits for the first list, and for the
    /// budgets'; None if the drain is cancelled first.
    async fn watch_pods(&mut self) -> Option<PodWatch> {
        let watch = match self.prepared.take() {
            Some(watch) => watch,
            None => PodWatch::start(&self.client, &self.node),
        };
        tokio::select! {
            _ = self.cancel.cancelled() => return None,
            _ = async { tokio::join!(watch.store.wait_synced(), self.budgets.store().wait_synced()) } => {}
        }
        Some(watch)
    }

    /// One look at the node's pods: end the drain, or evict (delete, after
    /// a DeletePods timeout) what is left and say when to look again.
    async fn step(&self, store: &Store<Pod>, started: Instant, backoff: &mut Backoff, first: bool) -> Step {
        if !self.leader.is_leader() {
            self.update(|s| s.progress.last_error = Some("this replica stopped leading".into()));
            return Step::Done;
        }
        let all = store.list();
        let now = jiff::Timestamp::now();
        let pending = match &self.options.kubectl {
            None => to_evict(&all),
            Some(k) => to_remove(&all, k, now),
        };
        if first {
            // The totals are the node's as the drain began; later looks keep
            // them. The pending pods come with them, so no reader sees the
            // totals with none of their pods left.
            let (total, evict) = (all.len() as i32, pending.len() as i32);
            let refs: Vec<PodReference> = pending.iter().map(|p| reference(p)).collect();
            self.update(|s| {
                s.progress.counted = true;
                s.progress.total_pods = total;
                s.progress.eviction_pods = evict;
                s.progress.pending = refs;
            });
        }
        // kubectl refuses the whole drain while any pod blocks it: nothing
        // is removed, and the reason names the pods (as the drain Job retries).
        if let Some(why) = self.options.kubectl.as_ref().and_then(|k| {
            let pods: Vec<&Pod> = all.iter().map(|p| &**p).collect();
            kubectl::refusal(&pods, k, now)
        }) {
            let refs: Vec<PodReference> = pending.iter().map(|p| reference(p)).collect();
            self.update(|s| {
                s.progress.pending = refs;
                s.progress.last_error = Some(why);
            });
            return Step::Wait(self.next_wait(true, backoff, started));
        }
        if pending.is_empty() {
            self.succeed(started);
            return Step::Done;
        }
        let timed_out = self.options.timeout.is_some_and(|t| started.elapsed() >= t);
        if timed_out && self.options.on_timeout == DrainTimeoutPolicy::Fail {
            self.time_out(&pending);
            return Step::Done;
        }
        let trouble = self.act(&pending, timed_out).await;
        Step::Wait(self.next_wait(trouble, backoff, started))
    }

    fn succeed(&self, started: Instant) {
        self.update(|s| {
            s.progress.pending.clear();
            s.progress.blocked.clear();
            s.outcome = DrainOutcome::Succeeded;
        });
        tracing::info!(node = %self.node, elapsed = ?started.elapsed(), "drain succeeded");
    }

    fn time_out(&self, pending: &[Arc<Pod>]) {
        self.update(|s| {
            s.progress.pending = pending.iter().map(|p| reference(p)).collect();
            s.outcome = DrainOutcome::TimedOut;
        });
        tracing::warn!(node = %self.node, pending = pending.len(), "drain timed out");
    }

    /// Evicts (or, `forced`, deletes) the pending pods not already going,
    /// and reports the round; true if a budget or an error held a pod up.
    async fn act(&self, pending: &[Arc<Pod>], forced: bool) -> bool {
        // A pod already terminating needs nothing more; it is pending until gone.
        let to_act: Vec<Arc<Pod>> = pending
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect();
        let disable_eviction = self.options.kubectl.as_ref().is_some_and(|k| k.disable_eviction);
        let round = if forced || disable_eviction {
            self.delete(&to_act).await
        } else {
            self.evict(&to_act).await
        };
        let blocked = self.name_budgets(&round.blocked);
        let refs: Vec<PodReference> = pending.iter().map(|p| reference(p)).collect();
        let trouble = !blocked.is_empty() || !round.errors.is_empty();
        let last_error = round_error(&round.errors, &blocked);
        self.update(|s| {
            s.progress.pending = refs;
            s.progress.blocked = blocked;
            s.progress.forced += round.forced;
            s.progress.last_error = last_error;
        });
        trouble
    }

    /// Backoff while something holds the drain up, else the idle recheck;
    /// never past the timeout, so it is acted on when it passes.
    fn next_wait(&self, trouble: bool, backoff: &mut Backoff, started: Instant) -> Duration {
        let mut wait = if trouble {
            backoff.next_delay(std::time::Instant::now())
        } else {
            IDLE_RECHECK
        };
        if let Some(t) = self.options.timeout {
            wait = wait
                .min(t.saturating_sub(started.elapsed()))
                .max(Duration::from_millis(10));
        }
        wait
    }

    /// Applies `f` to the status and tells the owner if anything changed.
    fn update(&self, f: impl FnOnce(&mut DrainStatus)) {
        let changed = {
            let mut status = lock(&self.status);
            let before = (status.outcome.clone(), status.progress.clone());
            f(&mut status);
            before != (status.outcome.clone(), status.progress.clone())
        };
        if changed {
            (self.on_change)();
        }
    }

    async fn evict(&self, pods: &[Arc<Pod>]) -> Round {
        let results: Vec<(Arc<Pod>, Result<(), kube::Error>)> = futures::stream::iter(pods.iter().cloned())
            .map(|pod| async move {
                if !self.leader.is_leader() {
                    return (pod, Ok(()));
                }
                let r = reference(&pod);
                let api: Api<Pod> = Api::namespaced(self.client.clone(), &r.namespace);
                let params = EvictParams {
                    delete_options: Some(self.delete_params(&pod)),
                    ..Default::default()
                };
                let result = api.evict(&r.name, &params).await.map(|_| ());
                (pod, result)
            })
            .buffer_unordered(EVICTION_CONCURRENCY)
            .collect()
            .await;
        let mut round = Round::default();
        let mut events = Vec::new();
        for (pod, result) in results {
            let r = reference(&pod);
            let name = format!("{}/{}", r.namespace, r.name);
            match result {
                Ok(()) => events.push(("evicted", name)),
                // Gone, or (409) the name is another pod's now: the next look
                // sees the store without this one.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                // 429: a PodDisruptionBudget allows no disruption right now.
                Err(kube::Error::Api(s)) if s.code == 429 => {
                    events.push(("eviction refused", name));
                    round.blocked.push(pod)
                }
                Err(e) => round.errors.push(format!("evicting {name}: {e}")),
            }
        }
        self.record(events);
        round
    }

    /// The pod's deletion: only this pod (its UID), with a Plan's grace period.
    fn delete_params(&self, pod: &Pod) -> DeleteParams {
        let grace = self.options.kubectl.as_ref().and_then(|k| k.grace_period);
        DeleteParams {
            grace_period_seconds: grace.and_then(|g| u32::try_from(g).ok()),
            ..only(pod)
        }
    }

    /// Keeps pod events for the trace: each eviction, and a pod's first refusal.
    fn record(&self, events: Vec<(&'static str, String)>) {
        let at = std::time::SystemTime::now();
        let mut status = lock(&self.status);
        for (what, pod) in events {
            let seen = what == "eviction refused"
                && status.pod_events.iter().any(|e| e.what == what && e.pod == pod);
            if !seen && status.pod_events.len() < MAX_POD_EVENTS {
                status.pod_events.push(PodEvent { at, what, pod });
            }
        }
    }

    /// After the timeout with policy DeletePods: delete, bypassing budgets
    /// (each pod still gets its own grace period).
    async fn delete(&self, pods: &[Arc<Pod>]) -> Round {
        let mut round = Round::default();
        for pod in pods {
            if !self.leader.is_leader() {
                break;
            }
            let r = reference(pod);
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &r.namespace);
            match api.delete(&r.name, &self.delete_params(pod)).await {
                Ok(_) => {
                    round.forced += 1;
                    self.record(vec![("deleted", format!("{}/{}", r.namespace, r.name))]);
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => round
                    .errors
                    .push(format!("deleting {}/{}: {e}", r.namespace, r.name)),
            }
        }
        if round.forced > 0 {
            tracing::warn!(node = %self.node, pods = round.forced, "drain deleted pods (past its timeout, or a Plan's disableEviction)");
        }
        round
    }

    /// Which budget refused each blocked pod, from the watched budgets.
    fn name_budgets(&self, blocked: &[Arc<Pod>]) -> Vec<DrainBlocker> {
        let budgets = self.budgets.store().list();
        blocked
            .iter()
            .map(|pod| {
                let r = reference(pod);
                let pdb = covering_budgets(pod, &budgets)
                    .into_iter()
                    .map(super::budgets::key)
                    .collect::<Vec<_>>()
                    .join(",");
                DrainBlocker {
                    pod: format!("{}/{}", r.namespace, r.name),
                    pdb,
                }
            })
            .collect()
    }
}

/// Deletes (or evicts) this pod only, not one made since under its name (a
/// StatefulSet's, bound elsewhere): its UID as precondition. An eviction or
/// delete that lands late, after the name went to a new pod, answers 409.
fn only(pod: &Pod) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    }
}
