//! The wiring end to end against the real API server: watch events reach the
//! reconciler through the queue, only the leader's workers reconcile, errors
//! retry with backoff (no sooner than a Retry-After), a reconcile that panics
//! is retried, and a new leader picks up every object.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::{Probe, TestEnv, control_plane, seen, wait_for};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::runtime::controller::{Action, Controller, ControllerConfig, Reconciler, Watches};
use nodewarden::runtime::error::{Categorized, Category, Retry};
use nodewarden::runtime::leader::{LeaderElectionConfig, LeaderElector, LeaderHandle};
use nodewarden::runtime::manager::{Manager, Source, always};
use nodewarden::runtime::metrics::NoMetrics;
use nodewarden::runtime::reflector::{Reflector, ReflectorConfig};
use nodewarden::runtime::store::Key;
use nodewarden::runtime::workqueue::WorkQueue;
use nodewarden::telemetry::Metrics;
use serde_json::json;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A failure the test asks for: retried with backoff, or after `after`.
#[derive(Debug, thiserror::Error)]
#[error("injected failure")]
struct Injected {
    after: Option<Duration>,
}

impl Categorized for Injected {
    fn category(&self) -> Category {
        Category::InvalidObject
    }

    fn retry(&self) -> Retry {
        self.after.map_or(Retry::Backoff, Retry::After)
    }
}

/// Marks each ConfigMap with the identity that reconciled it. A ConfigMap
/// annotated `fail: N` fails its first N reconciles, `throttle: S` fails its
/// first asking for a retry after S seconds, `panic: N` panics in its first N.
struct Marker {
    api: Api<ConfigMap>,
    leader: LeaderHandle,
    reconciles: Arc<AtomicUsize>,
    attempts: Attempts,
    failures: Arc<Mutex<HashMap<String, usize>>>,
}

/// When each object's reconciles started.
type Attempts = Arc<Mutex<HashMap<String, Vec<Instant>>>>;

fn annotated(cm: &ConfigMap, name: &str) -> usize {
    cm.annotations()
        .get(name)
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

impl Reconciler for Marker {
    type Object = ConfigMap;
    type Error = Injected;
    async fn reconcile(&self, key: &Key<ConfigMap>, cm: Option<Arc<ConfigMap>>) -> Result<Action, Injected> {
        self.reconciles.fetch_add(1, Ordering::SeqCst);
        let Some(cm) = cm else {
            return Ok(Action::Done);
        };
        let attempt = {
            let mut attempts = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
            let started = attempts.entry(key.name.clone()).or_default();
            started.push(Instant::now());
            started.len()
        };
        if attempt <= annotated(&cm, "panic") {
            panic!("injected panic in attempt {attempt}");
        }
        let throttle = annotated(&cm, "throttle");
        if attempt <= annotated(&cm, "fail") || (attempt == 1 && throttle > 0) {
            *self
                .failures
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(key.name.clone())
                .or_default() += 1;
            let after = (throttle > 0).then(|| Duration::from_secs(throttle as u64));
            return Err(Injected { after });
        }
        let me = self.leader.identity();
        if cm.annotations().get("reconciled-by").map(String::as_str) != Some(me) {
            let patch = json!({"metadata": {"annotations": {"reconciled-by": me}}});
            // A failed patch is retried like any error would be.
            if self
                .api
                .patch(&key.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_err()
            {
                return Err(Injected { after: None });
            }
        }
        Ok(Action::Done)
    }
}

struct Replica {
    identity: String,
    leader: LeaderHandle,
    reconciles: Arc<AtomicUsize>,
    attempts: Attempts,
    failures: Arc<Mutex<HashMap<String, usize>>>,
    tasks: JoinSet<()>,
}

fn election(namespace: &str, lease: &str, identity: &str) -> LeaderElectionConfig {
    let mut config = LeaderElectionConfig::new(namespace, lease, identity);
    config.lease_duration = Duration::from_secs(3);
    config.renew_deadline = Duration::from_secs(2);
    config.retry_period = Duration::from_millis(500);
    config
}

/// One replica: a Manager with the marker controller registered, as the
/// operator registers its controllers.
async fn start_replica(client: Client, namespace: &str, identity: &str) -> Replica {
    let elector = LeaderElector::new(client.clone(), election(namespace, "controller-test", identity))
        .expect("a valid election config");
    let mut manager = Manager::new(
        client.clone(),
        elector,
        ControllerConfig::default(),
        Arc::new(Metrics::new()),
    );
    let leader = manager.leader();
    let reconciles = Arc::new(AtomicUsize::new(0));
    let attempts = Attempts::default();
    let failures = Arc::new(Mutex::new(HashMap::new()));
    let source = Source {
        namespace: Some(namespace.to_owned()),
        ..Source::default()
    };
    manager
        .controller::<ConfigMap>("marker", &source)
        .register(Marker {
            api: Api::namespaced(client, namespace),
            leader: leader.clone(),
            reconciles: reconciles.clone(),
            attempts: attempts.clone(),
            failures: failures.clone(),
        });
    // Never cancelled: replicas end by abort (a crash, no lease release).
    let mut tasks = JoinSet::new();
    tasks.spawn(manager.run(CancellationToken::new()));
    Replica {
        identity: identity.to_owned(),
        leader,
        reconciles,
        attempts,
        failures,
        tasks,
    }
}

async fn create(api: &Api<ConfigMap>, name: &str, annotations: serde_json::Value) {
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}}))
            .expect("a cm");
    api.create(&PostParams::default(), &cm)
        .await
        .expect("creating a configmap");
}

async fn wait_marked(api: &Api<ConfigMap>, name: &str, by: &str) -> Duration {
    let start = Instant::now();
    wait_for(
        &format!("{name} reconciled by {by}"),
        Duration::from_secs(30),
        || async {
            match api.get(name).await {
                Ok(cm) => match cm.annotations().get("reconciled-by") {
                    Some(who) if who == by => Probe::Done(()),
                    other => Probe::NotYet(format!("reconciled-by {other:?}")),
                },
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_reconciles_and_a_new_leader_takes_over() {
    let env = TestEnv::new("controller").await;
    let cp = control_plane();
    let api: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    create(&api, "before-start", json!({})).await;

    let a = start_replica(cp.client().await, &env.namespace, "replica-a").await;
    let b = start_replica(cp.client().await, &env.namespace, "replica-b").await;
    let a_leads = wait_for("a leader", Duration::from_secs(15), || async {
        match (a.leader.is_leader(), b.leader.is_leader()) {
            (true, false) => Probe::Done(true),
            (false, true) => Probe::Done(false),
            seen => Probe::NotYet(format!("leading (a, b) = {seen:?}")),
        }
    })
    .await;
    let (mut leader, mut standby) = if a_leads { (a, b) } else { (b, a) };

    // An object that existed before leadership is reconciled (resync on gain).
    wait_marked(&api, "before-start", &leader.identity).await;

    // Watch events reach the reconciler: measure create → reconciled.
    let mut latencies = Vec::new();
    for i in 0..5 {
        let name = format!("cm-{i}");
        create(&api, &name, json!({})).await;
        latencies.push(wait_marked(&api, &name, &leader.identity).await);
    }
    println!("create → reconciled (includes the 200 ms poll of the check): {latencies:?}");

    // Errors retry with backoff until success: 3 failures, then a success.
    create(&api, "flaky", json!({"fail": "3"})).await;
    wait_marked(&api, "flaky", &leader.identity).await;
    let failures = leader
        .failures
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get("flaky")
        .copied();
    assert_eq!(
        failures,
        Some(3),
        "each failure is retried until the reconcile succeeds"
    );

    // The standby kept its store warm but never reconciled.
    assert_eq!(
        standby.reconciles.load(Ordering::SeqCst),
        0,
        "the standby reconciled"
    );
    assert!(leader.reconciles.load(Ordering::SeqCst) >= 7);

    // Crash the leader (no lease release): the standby takes over, reconciles
    // what exists and what comes next.
    leader.tasks.abort_all();
    let crashed = Instant::now();
    create(&api, "after-failover", json!({})).await;
    wait_marked(&api, "after-failover", &standby.identity).await;
    println!(
        "crash → standby reconciled a new object in {:?}",
        crashed.elapsed()
    );
    assert!(standby.leader.is_leader());
    let redone = standby
        .attempts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains_key("cm-0");
    assert!(redone, "a new leader looks at every object once");

    // A reconcile that panics is caught and retried: the worker survives and
    // the key is reconciled again (not stuck as "processing").
    create(&api, "panicky", json!({"panic": "1"})).await;
    wait_marked(&api, "panicky", &standby.identity).await;
    create(&api, "after-panic", json!({})).await;
    wait_marked(&api, "after-panic", &standby.identity).await;

    // A failure that asks for a retry after 3 s is retried no sooner, even
    // though an event for the object arrives meanwhile.
    create(&api, "throttled", json!({"throttle": "3"})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let poke = json!({"metadata": {"labels": {"poked": "yes"}}});
    api.patch("throttled", &PatchParams::default(), &Patch::Merge(&poke))
        .await
        .expect("poking the throttled configmap");
    wait_marked(&api, "throttled", &standby.identity).await;
    let started = standby.attempts.lock().unwrap_or_else(|e| e.into_inner())["throttled"].clone();
    assert!(started.len() >= 2, "retried: {started:?}");
    let waited = started[1] - started[0];
    println!("throttled: retried after {waited:?} (asked: 3 s)");
    assert!(
        waited >= Duration::from_secs(3),
        "retried after {waited:?}, sooner than the 3 s asked for"
    );

    standby.tasks.abort_all();
    env.cleanup().await;
}

/// A new leader's workers wait until every store the reconciler reads holds
/// its first full list: deciding on an empty cache would, for a rollout,
/// create again the instances that are already on their way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_start_only_once_every_needed_store_is_synced() {
    let env = TestEnv::new("controller-sync").await;
    let client = control_plane().client().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &env.namespace);
    create(&api, "waiting", json!({})).await;

    let elector = LeaderElector::new(client.clone(), election(&env.namespace, "sync-test", "only"))
        .expect("a valid election config");
    let leader = elector.handle();
    let mut reflector = Reflector::new("configmaps", api.clone(), ReflectorConfig::default());
    // A second store the reconciler reads, whose reflector starts late.
    let late = Reflector::new("late", api.clone(), ReflectorConfig::default());
    let reconciles = Arc::new(AtomicUsize::new(0));
    let marker = Marker {
        api: api.clone(),
        leader: leader.clone(),
        reconciles: reconciles.clone(),
        attempts: Arc::default(),
        failures: Arc::default(),
    };
    let mut watches = Watches::new(WorkQueue::with_defaults("marker"));
    watches.watch(
        &mut reflector,
        always(),
        Arc::new(|cm: &ConfigMap| Key::of(cm).into_iter().collect()),
    );
    watches.needs(&late.store());
    let controller = Controller::new(
        "marker",
        marker,
        reflector.store(),
        watches,
        ControllerConfig::default(),
        Arc::new(NoMetrics),
        None,
    );
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    tasks.spawn(reflector.run(stop.clone()));
    tasks.spawn(controller.run(leader.clone(), stop.clone()));
    tasks.spawn(elector.run(stop.clone()));

    wait_for("leadership", Duration::from_secs(30), || async {
        if leader.is_leader() {
            Probe::Done(())
        } else {
            Probe::NotYet("not leading".into())
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        reconciles.load(Ordering::SeqCst),
        0,
        "no reconcile while a needed store is unsynced"
    );
    tasks.spawn(late.run(stop.clone()));
    wait_marked(&api, "waiting", "only").await;
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    env.cleanup().await;
}
