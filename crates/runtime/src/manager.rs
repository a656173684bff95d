//! The Manager: one per process. It owns the client, one shared reflector per
//! watched type and selector, leader election, the controllers registered
//! with it and the order everything stops in (controller-runtime's Manager).
//!
//! A controller registers in one place what it reconciles, what it watches
//! (with which predicate and key mapper) and what it reads:
//!
//! ```ignore
//! let mut c = mgr.controller::<NodeVersion>("nodeversion", &objects);
//! c.watches::<Node>(&nodes, node_changed, |_| all_versions());
//! c.owns::<Job>(&jobs, always());
//! let strategies = c.reads::<AutoscalingStrategy>(&objects);
//! c.register(NodeVersionReconciler { .. });
//! ```
//!
//! A store is only ever obtained through the Manager, which runs the
//! reflector behind it: no reflector can be left out of the task list (its
//! controller would wait forever for the sync), and two controllers reading
//! Nodes share one watch and one cache.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use kube::Client;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::controller::{
    Controller, ControllerConfig, FailureReporter, Object, Predicate, Reconciler, Watches,
};
use super::leader::{LeaderElector, LeaderHandle};
use super::metrics::RuntimeMetrics;
use super::owner::OwnerKind;
use super::reflector::{Event, Reflector, ReflectorConfig};
use super::store::{Key, Store};
use super::workqueue::WorkQueue;

/// Which objects of a kind to watch: all namespaces unless `namespace`, and
/// only those matching the selectors.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Source {
    /// One namespace only.
    pub namespace: Option<String>,
    /// Only objects with these labels.
    pub label_selector: Option<String>,
    /// Only objects with these fields.
    pub field_selector: Option<String>,
}

impl Source {
    /// Every object of the kind.
    pub fn all() -> Self {
        Source::default()
    }

    /// Objects matching a label selector (None: all).
    pub fn labelled(selector: Option<String>) -> Self {
        Source {
            label_selector: selector,
            ..Source::default()
        }
    }

    /// A list of what the source's watch sees, read fresh from the API
    /// server (no resourceVersion: a consistent read). The namespace is the
    /// `Api`'s to choose.
    pub fn list_params(&self) -> kube::api::ListParams {
        let mut params = kube::api::ListParams::default();
        if let Some(labels) = &self.label_selector {
            params = params.labels(labels);
        }
        if let Some(fields) = &self.field_selector {
            params = params.fields(fields);
        }
        params
    }

    /// The labels an object needs to be seen through this source: the
    /// selector's `key=value` (or `key==value`) terms. Set-based and negated
    /// terms (`in`, `!=`, `!key`) name no single value and are left out; an
    /// object created with these labels still fails such a term only when
    /// the selector excludes it on purpose.
    pub fn required_labels(&self) -> std::collections::BTreeMap<String, String> {
        let Some(selector) = self.label_selector.as_deref() else {
            return Default::default();
        };
        selector
            .split(',')
            .filter(|term| !term.contains("!=") && !term.contains('(') && !term.contains(')'))
            .filter_map(|term| {
                let (key, value) = term.split_once("==").or_else(|| term.split_once('='))?;
                Some((key.trim().to_string(), value.trim().to_string()))
            })
            .filter(|(key, _)| !key.is_empty())
            .collect()
    }
}

/// A task the Manager runs: given the leader handle and its stop token.
pub type Task = Box<dyn FnOnce(LeaderHandle, CancellationToken) -> BoxFuture<'static, ()> + Send>;

/// A reflector whose type is erased, so reflectors of every kind sit in one map.
trait AnyReflector: Send {
    fn as_any(&mut self) -> &mut dyn Any;
    fn synced(&self) -> Box<dyn Fn() -> bool + Send + Sync>;
    fn into_task(self: Box<Self>) -> Task;
}

impl<K: Object> AnyReflector for Reflector<K> {
    fn as_any(&mut self) -> &mut dyn Any {
        self
    }

    fn synced(&self) -> Box<dyn Fn() -> bool + Send + Sync> {
        let store = self.store();
        Box::new(move || store.is_synced())
    }

    fn into_task(self: Box<Self>) -> Task {
        Box::new(move |_, stop| Box::pin(self.run(stop)))
    }
}

type Transform = Box<dyn Any + Send>;

/// Owns the shared machinery; see the module docs.
pub struct Manager {
    client: Client,
    unfenced: Client,
    elector: LeaderElector,
    leader: LeaderHandle,
    config: ControllerConfig,
    reflector_config: ReflectorConfig,
    metrics: Arc<dyn RuntimeMetrics>,
    reflectors: HashMap<(TypeId, Source), Box<dyn AnyReflector>>,
    transforms: HashMap<TypeId, Transform>,
    synced: Vec<Box<dyn Fn() -> bool + Send + Sync>>,
    optional: HashMap<(TypeId, Source), Duration>,
    tasks: Vec<Task>,
}

impl Manager {
    /// A Manager whose controllers reconcile while `elector` leads.
    pub fn new(
        client: Client,
        elector: LeaderElector,
        config: ControllerConfig,
        metrics: Arc<dyn RuntimeMetrics>,
    ) -> Self {
        let leader = elector.handle();
        Manager {
            // Controllers write only within this replica's lease term; the
            // elector keeps the unfenced client for the Lease itself.
            client: super::fence::fenced(client.clone(), leader.clone()),
            unfenced: client,
            elector,
            leader,
            config,
            reflector_config: ReflectorConfig::default(),
            metrics,
            reflectors: HashMap::new(),
            transforms: HashMap::new(),
            synced: Vec::new(),
            optional: HashMap::new(),
            tasks: Vec::new(),
        }
    }

    /// Sets the list/watch settings of the reflectors created from now on.
    pub fn with_reflector_config(mut self, config: ReflectorConfig) -> Self {
        self.reflector_config = config;
        self
    }

    /// The API client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The client without the write fence, for the few writes made outside
    /// a controller: the webhook certificate keeper's (every replica races
    /// to create the Secret; the leader, checking its leadership itself,
    /// renews it and sets the caBundle, each conditioned on the object's
    /// resourceVersion). Never for a controller's writes.
    pub fn unfenced_client(&self) -> &Client {
        &self.unfenced
    }

    /// This replica's leadership.
    pub fn leader(&self) -> LeaderHandle {
        self.leader.clone()
    }

    /// The controllers' settings.
    pub fn controller_config(&self) -> &ControllerConfig {
        &self.config
    }

    /// Every `K` is passed through `transform` before it is cached (e.g. to
    /// drop large fields nobody reads). Call before the first store of `K`.
    pub fn transform<K: Object>(&mut self, transform: fn(K) -> K) {
        self.transforms.insert(TypeId::of::<K>(), Box::new(transform));
    }

    /// Marks the `K`s of `source` as an API that may be installed after
    /// the start (a CRD of another project): until it is, their reflector
    /// asks again every `retry` instead of failing, /readyz does not wait for
    /// it, and the controllers that watch them start once it is served.
    /// Call before the first store of them.
    pub fn optional<K: Object>(&mut self, source: &Source, retry: Duration) {
        self.optional.insert((TypeId::of::<K>(), source.clone()), retry);
    }

    /// The shared cache of the `K`s `source` selects, fed by the one
    /// reflector the Manager keeps for them.
    pub fn store<K: Object>(&mut self, source: &Source) -> Store<K> {
        self.reflector::<K>(source).store()
    }

    fn reflector<K: Object>(&mut self, source: &Source) -> &mut Reflector<K> {
        let id = (TypeId::of::<K>(), source.clone());
        if !self.reflectors.contains_key(&id) {
            let reflector = self.new_reflector::<K>(source);
            self.synced.push(AnyReflector::synced(&reflector));
            self.reflectors.insert(id.clone(), Box::new(reflector));
        }
        self.reflectors
            .get_mut(&id)
            .and_then(|r| r.as_any().downcast_mut::<Reflector<K>>())
            .expect("the reflector stored under a TypeId is of that type")
    }

    fn new_reflector<K: Object>(&self, source: &Source) -> Reflector<K> {
        // One namespace is a field selector: it works for every kind alike.
        let in_namespace = source
            .namespace
            .as_ref()
            .map(|ns| format!("metadata.namespace={ns}"));
        let field_selector = match (in_namespace, &source.field_selector) {
            (Some(ns), Some(fields)) => Some(format!("{ns},{fields}")),
            (ns, fields) => ns.or_else(|| fields.clone()),
        };
        let config = ReflectorConfig {
            label_selector: source.label_selector.clone(),
            field_selector,
            absent_api: self.optional.get(&(TypeId::of::<K>(), source.clone())).copied(),
            ..self.reflector_config.clone()
        };
        let name = K::plural(&()).into_owned();
        let selector = [
            ("labels", &config.label_selector),
            ("fields", &config.field_selector),
        ]
        .into_iter()
        .filter_map(|(kind, s)| s.as_ref().map(|s| format!("{kind}:{s}")))
        .collect::<Vec<_>>()
        .join(" ");
        let api = Api::<K>::all(self.client.clone());
        let reflector = Reflector::new(&name, api, config);
        self.metrics.reflector(&name, &selector, reflector.stats());
        match self
            .transforms
            .get(&TypeId::of::<K>())
            .and_then(|t| t.downcast_ref::<fn(K) -> K>())
        {
            Some(transform) => reflector.with_transform(*transform),
            None => reflector,
        }
    }

    /// Starts declaring a controller named `name` that reconciles the `K`s
    /// `source` selects; finish with [`ControllerBuilder::register`].
    pub fn controller<K: Object>(&mut self, name: &str, source: &Source) -> ControllerBuilder<'_, K> {
        let queue = WorkQueue::new(name, self.config.rate_limit.build(), self.metrics.queue(name));
        let mut builder = ControllerBuilder {
            primary: self.store::<K>(source),
            manager: self,
            name: name.to_owned(),
            watches: Watches::new(queue),
            on_failure: None,
        };
        builder.watches(source, always(), |k: &K| Key::of(k).into_iter().collect());
        builder
    }

    /// Runs `task` beside the controllers, stopped with them.
    pub fn add_task(&mut self, task: Task) {
        self.tasks.push(task);
    }

    /// "Has every store its first full list?", for /readyz; the stores of
    /// an [`optional`](Self::optional) API that is not installed are not waited for.
    pub fn readiness(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let checks: Vec<_> = self
            .reflectors
            .iter()
            .filter(|(id, _)| !self.optional.contains_key(*id))
            .map(|(_, r)| r.synced())
            .collect();
        move || checks.iter().all(|synced| synced())
    }

    /// Runs everything until `shutdown`; then stops the controllers and
    /// tasks, then the reflectors, and releases the lease last, so a standby
    /// takes over at once.
    pub async fn run(self, shutdown: CancellationToken) {
        let Manager {
            elector,
            leader,
            metrics,
            reflectors,
            tasks,
            ..
        } = self;
        let work = CancellationToken::new();
        let watching = CancellationToken::new();
        let election = CancellationToken::new();
        let mut workers = tokio::task::JoinSet::new();
        for task in tasks {
            workers.spawn(task(leader.clone(), work.clone()));
        }
        let mut watches = tokio::task::JoinSet::new();
        for reflector in reflectors.into_values() {
            watches.spawn(reflector.into_task()(leader.clone(), watching.clone()));
        }
        // JoinSets all: a Manager whose future is dropped (a test's crash)
        // takes every task with it, the elector included.
        let mut electing = tokio::task::JoinSet::new();
        electing.spawn(elector.run(election.clone()));
        electing.spawn(report_leading(leader, metrics));

        shutdown.cancelled().await;
        tracing::info!("shutting down: stopping workers");
        work.cancel();
        while workers.join_next().await.is_some() {}
        watching.cancel();
        while watches.join_next().await.is_some() {}
        election.cancel();
        // Bounded: releasing the lease is one API call.
        let _ = tokio::time::timeout(Duration::from_secs(10), electing.join_next()).await;
        electing.abort_all();
    }
}

/// Follows leadership into the metrics.
async fn report_leading(leader: LeaderHandle, metrics: Arc<dyn RuntimeMetrics>) {
    let mut leading = leader.subscribe();
    loop {
        metrics.leading(*leading.borrow_and_update());
        if leading.changed().await.is_err() {
            // Never resolves first: the elector ends before this is aborted.
            return std::future::pending().await;
        }
    }
}

/// Lets every event through.
pub fn always<K>() -> Predicate<K> {
    Arc::new(|_: &Event<K>| true)
}

/// Lets additions and deletions through, and updates that change what
/// `view` shows of the object (e.g. its labels, spec and readiness, but not
/// a status heartbeat).
pub fn changed<K, V: PartialEq>(view: impl Fn(&K) -> V + Send + Sync + 'static) -> Predicate<K> {
    Arc::new(move |event: &Event<K>| match event {
        Event::Updated { old, new } => view(old) != view(new),
        Event::Added(_) | Event::Deleted(_) => true,
    })
}

/// A registration in progress; see [`Manager::controller`].
pub struct ControllerBuilder<'m, K: Object> {
    manager: &'m mut Manager,
    name: String,
    primary: Store<K>,
    watches: Watches<K>,
    on_failure: Option<FailureReporter<K>>,
}

impl<K: Object> ControllerBuilder<'_, K> {
    /// The Manager, for what the reconciler needs besides stores.
    pub fn manager(&mut self) -> &mut Manager {
        self.manager
    }

    /// The store of the reconciled objects.
    pub fn store(&self) -> Store<K> {
        self.primary.clone()
    }

    /// The controller's queue, for a reconciler that requeues other keys.
    pub fn queue(&self) -> WorkQueue<Key<K>> {
        self.watches.queue()
    }

    /// Reconcile what `map` returns for each change of a `W` from `source`
    /// that `predicate` lets through. Returns the `W` store.
    pub fn watches<W: Object>(
        &mut self,
        source: &Source,
        predicate: Predicate<W>,
        map: impl Fn(&W) -> Vec<Key<K>> + Send + Sync + 'static,
    ) -> Store<W> {
        let reflector = self.manager.reflector::<W>(source);
        self.watches.watch(reflector, predicate, Arc::new(map));
        reflector.store()
    }

    /// Reconcile the controller of each `W` from `source` whose change
    /// `predicate` lets through, when that controller is a `K`
    /// (controller-runtime's `Owns`): for the objects the reconciler makes,
    /// so that one deleted or edited behind its back is made right at once
    /// rather than at the next periodic look. Only the controller owner
    /// reference counts ([`OwnerKind::controller_of`]). Returns the `W` store.
    pub fn owns<W: Object>(&mut self, source: &Source, predicate: Predicate<W>) -> Store<W>
    where
        K::Scope: 'static,
    {
        let owner = OwnerKind::of::<K>();
        self.watches(source, predicate, move |w: &W| {
            owner.controller_of(w.meta()).map(Key::from).into_iter().collect()
        })
    }

    /// The reconciler reads the `W`s of `source` without reacting to them;
    /// its workers wait for their first list all the same.
    pub fn reads<W: Object>(&mut self, source: &Source) -> Store<W> {
        let store = self.manager.store::<W>(source);
        self.watches.needs(&store);
        store
    }

    /// Reports each failed reconcile on its object (an Event, typically).
    pub fn on_failure(&mut self, reporter: FailureReporter<K>) {
        self.on_failure = Some(reporter);
    }

    /// Finishes the declaration: the controller runs with the Manager.
    pub fn register<R: Reconciler<Object = K>>(self, reconciler: R) {
        let ControllerBuilder {
            manager,
            name,
            primary,
            watches,
            on_failure,
        } = self;
        let config = manager.config.clone();
        let metrics = manager.metrics.clone();
        let controller = Controller::new(&name, reconciler, primary, watches, config, metrics, on_failure);
        manager.add_task(Box::new(move |leader, stop| {
            Box::pin(controller.run(leader, stop))
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_labels_are_the_equality_terms() {
        type Case<'a> = (Option<&'a str>, &'a [(&'a str, &'a str)]);
        let cases: [Case; 6] = [
            (None, &[]),
            (Some("run=abc"), &[("run", "abc")]),
            (Some("run==abc, team=infra"), &[("run", "abc"), ("team", "infra")]),
            (Some("run=abc,tier!=edge"), &[("run", "abc")]),
            (Some("env in (a,b),run=x"), &[("run", "x")]),
            (Some("!legacy"), &[]),
        ];
        for (selector, want) in cases {
            let got = Source::labelled(selector.map(String::from)).required_labels();
            let want: std::collections::BTreeMap<String, String> =
                want.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(got, want, "{selector:?}");
        }
    }
}
