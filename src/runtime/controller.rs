//! The loop that wires reflectors to reconcilers:
//! store events → key mappers → work queue → N workers → reconcile.
//!
//! Every replica runs its reflectors (hot standby: stores stay warm), but the
//! workers run only while this replica leads. When leadership is gained,
//! every key the mappers know is queued once, so a new leader looks at the
//! whole world; when it is lost, the workers stop at once (an in-flight
//! reconcile is dropped at its next await — reconciles are idempotent, and
//! anything disruptive checks `LeaderHandle::is_leader` right before acting).
//!
//! A reconcile returns `Action::Done`, `Action::RequeueAfter(d)` or an error;
//! an error retries with the queue's rate limiter (per-key exponential and a
//! shared token bucket), success forgets the key's failures.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Resource;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::leader::LeaderHandle;
use super::rate_limiter::RateLimitConfig;
use super::reflector::Reflector;
use super::store::{ObjectKey, Store};
use super::workqueue::WorkQueue;
use crate::error::{Categorized, Category};
use crate::telemetry::Metrics;
use crate::telemetry::metrics::{ControllerLabels, ErrorLabels, TraceLabels};

/// What a successful reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the next relevant event.
    Done,
    /// Look again after this long (deadlines, polling a cloud operation).
    RequeueAfter(Duration),
}

/// One controller's business logic, called with the key of an object.
pub trait Reconciler: Send + Sync + 'static {
    type Error: Categorized;
    fn reconcile(&self, key: &ObjectKey) -> impl Future<Output = Result<Action, Self::Error>> + Send;
}

#[derive(Clone, Debug)]
pub struct ControllerConfig {
    pub workers: usize,
    pub rate_limit: RateLimitConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            workers: 4,
            rate_limit: RateLimitConfig::default(),
        }
    }
}

/// Lists every key a mapper knows (used when leadership is gained).
type Resync = Box<dyn Fn() -> Vec<ObjectKey> + Send + Sync>;

/// Resolves once a store the reconciler reads has its first full list.
type SyncedWait = Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

pub struct Controller<R: Reconciler> {
    name: String,
    reconciler: Arc<R>,
    queue: WorkQueue<ObjectKey>,
    config: ControllerConfig,
    resyncs: Vec<Resync>,
    synced: Vec<SyncedWait>,
    metrics: Metrics,
}

impl<R: Reconciler> Controller<R> {
    pub fn new(name: &str, reconciler: R, config: ControllerConfig, metrics: Metrics) -> Self {
        let queue = WorkQueue::new(name, config.rate_limit.build(), Some(metrics.queue.clone()));
        Controller {
            name: name.to_owned(),
            reconciler: Arc::new(reconciler),
            queue,
            config,
            resyncs: Vec::new(),
            synced: Vec::new(),
            metrics,
        }
    }

    /// The controller's queue, for code that wants to enqueue keys directly.
    pub fn queue(&self) -> WorkQueue<ObjectKey> {
        self.queue.clone()
    }

    /// Reconcile the keys `map` returns for every change of a `K` seen by
    /// `reflector`: the object itself, its owner, related objects. Deletions
    /// map too (with the object's last known state).
    pub fn watches<K>(
        &mut self,
        reflector: &mut Reflector<K>,
        map: impl Fn(&K) -> Vec<ObjectKey> + Send + Sync + 'static,
    ) where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    {
        let map = Arc::new(map);
        let queue = self.queue.clone();
        let on_event = map.clone();
        reflector.on_event(move |event| {
            for key in on_event(event.object()) {
                queue.add(key);
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
    /// WaitForCacheSync).
    pub fn needs<K>(&mut self, store: &Store<K>)
    where
        K: Resource + Clone + Send + Sync + 'static,
    {
        let store = store.clone();
        self.synced.push(Box::new(move || {
            let store = store.clone();
            Box::pin(async move { store.wait_synced().await })
        }));
    }

    /// Runs until `shutdown`: workers while leading, idle otherwise.
    pub async fn run(self, leader: LeaderHandle, shutdown: CancellationToken) {
        let mut leading = leader.subscribe();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                changed = leading.wait_for(|l| *l) => if changed.is_err() { break },
            }
            let synced = futures::future::join_all(self.synced.iter().map(|wait| wait()));
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = leading.wait_for(|l| !*l) => continue,
                _ = synced => {}
            }
            tracing::info!(controller = %self.name, "leading, caches synced: starting workers");
            for key in self.resyncs.iter().flat_map(|resync| resync()) {
                self.queue.add(key);
            }
            let term = shutdown.child_token();
            let workers: Vec<_> = (0..self.config.workers.max(1))
                .map(|_| tokio::spawn(self.worker(term.clone())))
                .collect();
            tokio::select! {
                _ = shutdown.cancelled() => {}
                _ = leading.wait_for(|l| !*l) => {}
            }
            term.cancel();
            for worker in workers {
                let _ = worker.await;
            }
            if shutdown.is_cancelled() {
                break;
            }
            tracing::warn!(controller = %self.name, "leadership lost: workers stopped");
        }
        self.queue.shut_down();
    }

    fn worker(&self, term: CancellationToken) -> impl Future<Output = ()> + Send + 'static {
        let (name, queue, reconciler, metrics) = (
            self.name.clone(),
            self.queue.clone(),
            self.reconciler.clone(),
            self.metrics.clone(),
        );
        async move {
            let labels = ControllerLabels {
                controller: name.clone(),
            };
            loop {
                let key = tokio::select! {
                    _ = term.cancelled() => return,
                    key = queue.get() => match key { Some(k) => k, None => return },
                };
                let span = tracing::info_span!("reconcile", controller = %name, object = %key);
                let started = Instant::now();
                let result = tokio::select! {
                    _ = term.cancelled() => {
                        // Not finished: the next leader (maybe us) looks again.
                        queue.done(&key);
                        return;
                    }
                    r = reconciler.reconcile(&key).instrument(span.clone()) => r,
                };
                metrics.reconciles.get_or_create(&labels).inc();
                let exemplar = span
                    .in_scope(crate::telemetry::trace::current_trace_id)
                    .map(|trace_id| TraceLabels { trace_id });
                metrics.reconcile_duration.get_or_create(&labels).observe(
                    started.elapsed().as_secs_f64(),
                    exemplar,
                    None,
                );
                match result {
                    Ok(Action::Done) => queue.forget(&key),
                    Ok(Action::RequeueAfter(after)) => {
                        queue.forget(&key);
                        queue.add_after(key.clone(), after);
                    }
                    Err(e) => {
                        let category = e.category();
                        metrics
                            .reconcile_errors
                            .get_or_create(&ErrorLabels {
                                controller: name.clone(),
                                category: category.to_string(),
                            })
                            .inc();
                        let _enter = span.enter();
                        let retries = queue.num_requeues(&key);
                        // Optimistic-locking conflicts are routine: the next try
                        // reads the newer object.
                        if category == Category::Conflict {
                            tracing::info!(error = %e, %category, retries, "reconcile conflicted; retrying");
                        } else {
                            tracing::warn!(error = %e, %category, retries, "reconcile failed");
                        }
                        queue.add_rate_limited(key.clone());
                    }
                }
                queue.done(&key);
            }
        }
    }
}
