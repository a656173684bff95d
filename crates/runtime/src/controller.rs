//! The loop that runs one reconciler:
//! store events → predicate → key mapper → work queue → N workers → reconcile.
//!
//! Every replica runs its reflectors (hot standby: stores stay warm), but the
//! workers run only while this replica leads. When leadership is gained,
//! every key the mappers know is queued once, so a new leader looks at the
//! whole world; when it is lost, the workers stop at once (an in-flight
//! reconcile is dropped at its next await — reconciles are idempotent, and
//! anything disruptive checks `LeaderHandle::is_leader` right before acting).
//!
//! A reconcile returns `Action::Done`, `Action::RequeueAfter(d)` or an error.
//! The error says how to retry ([`Retry`]): the queue's backoff (per-key
//! exponential and a shared token bucket; the key is held until it ends,
//! whatever events arrive), no sooner than a given time, or not until the
//! object changes. A reconcile that panics or runs past its timeout counts as
//! an error of category `Panic` / `Timeout` and is retried with backoff: the
//! worker survives and the key is never stuck "processing".
//!
//! Controllers are normally built and registered through
//! [`super::manager::Manager`], which owns the reflectors they share.

use std::fmt::Debug;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use kube::Resource;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::{Categorized, Category, Retry};
use super::leader::LeaderHandle;
use super::metrics::RuntimeMetrics;
use super::rate_limiter::RateLimitConfig;
use super::reflector::{Event, Reflector};
use super::store::{Key, Store};
use super::workqueue::WorkQueue;

/// What a successful reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the next relevant event.
    Done,
    /// Look again after this long (deadlines, polling a cloud operation).
    RequeueAfter(Duration),
}

/// A kind of object a controller can reconcile or watch (one with a static
/// type: every kind nodewarden knows at compile time).
pub trait Object:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static> Object for K {}

/// One controller's business logic.
pub trait Reconciler: Send + Sync + 'static {
    /// The kind of object it reconciles.
    type Object: Object;
    /// Its error: a category and a retry policy.
    type Error: Categorized;

    /// Brings the object named `key` to its desired state. `object` is the
    /// object as the store has it now; None when it is gone (or not yet seen).
    fn reconcile(
        &self,
        key: &Key<Self::Object>,
        object: Option<Arc<Self::Object>>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

/// Told about each failed reconcile whose object is still in the store, so
/// the application can emit an Event on it (reason = the error's category).
pub type FailureReporter<K> = Arc<dyn Fn(&K, Category, &str) + Send + Sync>;

/// How many workers a controller runs and how patient it is.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// Workers reconciling different keys at once.
    pub workers: usize,
    /// Backoff and overall retry rate of the queue.
    pub rate_limit: RateLimitConfig,
    /// A reconcile running longer than this is abandoned and retried.
    pub reconcile_timeout: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            workers: 4,
            rate_limit: RateLimitConfig::default(),
            reconcile_timeout: Duration::from_secs(120),
        }
    }
}

/// Lists every key a mapper knows (used when leadership is gained).
type Resync<K> = Box<dyn Fn() -> Vec<Key<K>> + Send + Sync>;

/// Resolves once a store the reconciler reads has its first full list.
type SyncedWait = Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// Decides whether a store event is worth a reconcile (controller-runtime's
/// predicates): e.g. a Node's status heartbeat is not.
pub type Predicate<K> = Arc<dyn Fn(&Event<K>) -> bool + Send + Sync>;

/// Maps a changed object to the keys of the objects to reconcile.
pub type Mapper<W, K> = Arc<dyn Fn(&W) -> Vec<Key<K>> + Send + Sync>;

/// A controller's queue and what feeds it: the watches that add keys, the
/// stores it must see synced before its workers start.
pub struct Watches<K> {
    queue: WorkQueue<Key<K>>,
    resyncs: Vec<Resync<K>>,
    synced: Vec<SyncedWait>,
}

impl<K: Object> Watches<K> {
    /// Nothing watched yet; keys go to `queue`.
    pub fn new(queue: WorkQueue<Key<K>>) -> Self {
        Watches {
            queue,
            resyncs: Vec::new(),
            synced: Vec::new(),
        }
    }

    /// The queue keys go to.
    pub fn queue(&self) -> WorkQueue<Key<K>> {
        self.queue.clone()
    }

    /// Queue the keys `map` returns for every change of a `W` seen by
    /// `reflector` that `predicate` lets through: the object itself, its
    /// owner, related objects. Deletions map too (with the object's last
    /// known state).
    pub fn watch<W: Object>(
        &mut self,
        reflector: &mut Reflector<W>,
        predicate: Predicate<W>,
        map: Mapper<W, K>,
    ) {
        let queue = self.queue.clone();
        let on_event = map.clone();
        reflector.on_event(move |event| {
            if predicate(event) {
                for key in on_event(event.object()) {
                    queue.add(key);
                }
            }
        });
        let store = reflector.store();
        self.needs(&store);
        self.resyncs.push(Box::new(move || {
            store.list().iter().flat_map(|o| map(o)).collect()
        }));
    }

    /// The reconciler reads `store` (watched or not): no worker starts before
    /// it holds its first full list. Deciding on an empty cache is how a
    /// fresh leader would create instances it already has (client-go's
    /// WaitForCacheSync). Nor before its reflector is connected: a replica
    /// that takes the lease just after losing the API server would decide
    /// on what it saw before the cut, and what its predecessor did meanwhile
    /// would be done again.
    pub fn needs<W: Send + Sync + 'static>(&mut self, store: &Store<W>) {
        let store = store.clone();
        self.synced.push(Box::new(move || {
            let store = store.clone();
            Box::pin(async move { store.wait_current().await })
        }));
    }
}

/// One reconciler with its queue, watches and workers.
pub struct Controller<R: Reconciler> {
    name: String,
    reconciler: Arc<R>,
    primary: Store<R::Object>,
    watches: Watches<R::Object>,
    config: ControllerConfig,
    metrics: Arc<dyn RuntimeMetrics>,
    on_failure: Option<FailureReporter<R::Object>>,
}

impl<R: Reconciler> Controller<R> {
    /// A controller named `name` (logs, metrics) for the objects of `primary`
    /// (each reconcile is passed its object from there), fed by `watches`.
    pub fn new(
        name: &str,
        reconciler: R,
        primary: Store<R::Object>,
        mut watches: Watches<R::Object>,
        config: ControllerConfig,
        metrics: Arc<dyn RuntimeMetrics>,
        on_failure: Option<FailureReporter<R::Object>>,
    ) -> Self {
        watches.needs(&primary);
        Controller {
            name: name.to_owned(),
            reconciler: Arc::new(reconciler),
            primary,
            watches,
            config,
            metrics,
            on_failure,
        }
    }

    /// Runs until `shutdown`: workers while leading, idle otherwise.
    pub async fn run(self, leader: LeaderHandle, shutdown: CancellationToken) {
        let mut leading = leader.subscribe();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = leading.wait_for(|l| *l) => if changed.is_err() { break },
            }
            let synced = futures::future::join_all(self.watches.synced.iter().map(|wait| wait()));
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = leading.wait_for(|l| !*l) => continue,
                _ = synced => {}
            }
            tracing::info!(controller = %self.name, "leading, caches current: starting workers");
            for key in self.watches.resyncs.iter().flat_map(|resync| resync()) {
                self.watches.queue.add(key);
            }
            let term = shutdown.child_token();
            // A JoinSet: dropping this future (a crash in tests) aborts the workers.
            let mut workers = tokio::task::JoinSet::new();
            for _ in 0..self.config.workers.max(1) {
                workers.spawn(self.worker().run(term.clone()));
            }
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = leading.wait_for(|l| !*l) => {}
            }
            term.cancel();
            while workers.join_next().await.is_some() {}
            if shutdown.is_cancelled() {
                break;
            }
            tracing::warn!(controller = %self.name, "leadership lost: workers stopped");
        }
        self.watches.queue.shut_down();
    }

    fn worker(&self) -> Worker<R> {
        Worker {
            name: self.name.clone(),
            queue: self.watches.queue(),
            reconciler: self.reconciler.clone(),
            primary: self.primary.clone(),
            timeout: self.config.reconcile_timeout,
            metrics: self.metrics.clone(),
            on_failure: self.on_failure.clone(),
        }
    }
}

/// How one reconcile ended, seen by the loop.
enum Outcome<E> {
    Ok(Action),
    Failed(E),
    Panicked(String),
    TimedOut(Duration),
    /// Leadership ended or shutdown: the next leader looks again.
    Cancelled,
}

/// One worker's share of a controller.
struct Worker<R: Reconciler> {
    name: String,
    queue: WorkQueue<Key<R::Object>>,
    reconciler: Arc<R>,
    primary: Store<R::Object>,
    timeout: Duration,
    metrics: Arc<dyn RuntimeMetrics>,
    on_failure: Option<FailureReporter<R::Object>>,
}

impl<R: Reconciler> Worker<R> {
    async fn run(self, term: CancellationToken) {
        loop {
            let key = tokio::select! {
                _ = term.cancelled() => return,
                key = self.queue.get() => match key { Some(k) => k, None => return },
            };
            let span = tracing::info_span!("reconcile", controller = %self.name, object = %key);
            let started = Instant::now();
            let outcome = self.reconcile(&key, &term).instrument(span.clone()).await;
            if !matches!(outcome, Outcome::Cancelled) {
                self.metrics.reconciled(&self.name, started.elapsed(), &span);
            }
            let _enter = span.enter();
            self.settle(&key, outcome);
            self.queue.done(&key);
        }
    }

    /// Runs the reconcile, catching a panic and bounding its time.
    async fn reconcile(&self, key: &Key<R::Object>, term: &CancellationToken) -> Outcome<R::Error> {
        let object = self.primary.get(key);
        let run = AssertUnwindSafe(self.reconciler.reconcile(key, object)).catch_unwind();
        tokio::select! {
            _ = term.cancelled() => Outcome::Cancelled,
            ended = tokio::time::timeout(self.timeout, run) => match ended {
                Err(_) => Outcome::TimedOut(self.timeout),
                Ok(Err(panic)) => Outcome::Panicked(panic_message(panic.as_ref())),
                Ok(Ok(Ok(action))) => Outcome::Ok(action),
                Ok(Ok(Err(e))) => Outcome::Failed(e),
            },
        }
    }

    /// Requeues (or not) after an outcome, and reports failures.
    fn settle(&self, key: &Key<R::Object>, outcome: Outcome<R::Error>) {
        let (category, retry, message) = match outcome {
            Outcome::Cancelled => return,
            Outcome::Ok(Action::Done) => return self.queue.forget(key),
            Outcome::Ok(Action::RequeueAfter(after)) => {
                self.queue.forget(key);
                return self.queue.add_after(key.clone(), after);
            }
            Outcome::Failed(e) => (e.category(), e.retry(), e.to_string()),
            Outcome::Panicked(message) => (
                Category::Panic,
                Retry::Backoff,
                format!("reconcile panicked: {message}"),
            ),
            Outcome::TimedOut(after) => (
                Category::Timeout,
                Retry::Backoff,
                format!("reconcile did not finish within {after:?}"),
            ),
        };
        self.metrics.failed(&self.name, category);
        let retries = self.queue.num_requeues(key);
        match (category, retry) {
            // Optimistic-locking conflicts are routine: the next try reads the newer object.
            (Category::Conflict, _) => {
                tracing::info!(error = %message, %category, retries, "reconcile conflicted; retrying")
            }
            (Category::Panic, _) => {
                tracing::error!(error = %message, %category, retries, "reconcile panicked; retrying")
            }
            (_, Retry::Never) => {
                tracing::warn!(error = %message, %category, "reconcile failed; waiting for a change")
            }
            _ => tracing::warn!(error = %message, %category, retries, "reconcile failed"),
        }
        if category != Category::Conflict
            && let (Some(report), Some(object)) = (&self.on_failure, self.primary.get(key))
        {
            report(&object, category, &message);
        }
        match retry {
            Retry::Backoff => self.queue.add_rate_limited(key.clone()),
            Retry::After(at_least) => self.queue.add_rate_limited_after(key.clone(), at_least),
            Retry::Never => self.queue.forget(key),
        }
    }
}

/// The text a panic was raised with, when it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic payload".to_owned())
}
