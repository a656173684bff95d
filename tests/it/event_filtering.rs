//! What reaches a reconcile, with the controllers registered as the operator
//! registers them: a Node's status-only change requeues no NodeVersion, and
//! with the cloud down while Nodes change 50 times a second, the cloud is
//! called no more often than the per-key backoff allows (events arriving
//! during a backoff wait for it), while the NodeVersion says why it is stuck
//! (a condition and a Warning Event).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use nodewarden::api::update::{NodeVersion, ScalingGroup};
use nodewarden::cloud::sim::SimProvider;
use nodewarden::cloud::{
    CloudFuture, CloudProvider, CreateNodeRequest, CreatedNode, InstanceState, ScalingGroup as CloudGroup,
};
use nodewarden::operator::manager;
use nodewarden::telemetry::Metrics;
use nodewarden::telemetry::metrics::ControllerLabels;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A real provider (pointed at a port nothing listens on) whose calls are counted.
struct Counted {
    inner: SimProvider,
    calls: Arc<AtomicUsize>,
}

impl Counted {
    fn count<'a, T: Send + 'a>(&'a self, call: CloudFuture<'a, T>) -> CloudFuture<'a, T> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        call
    }
}

impl CloudProvider for Counted {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn create_node<'a>(&'a self, request: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
        self.count(self.inner.create_node(request))
    }
    fn delete_node<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, ()> {
        self.count(self.inner.delete_node(provider_id))
    }
    fn node_state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        self.count(self.inner.node_state(provider_id))
    }
    fn node_image<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        self.count(self.inner.node_image(provider_id))
    }
    fn node_group<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, String> {
        self.count(self.inner.node_group(provider_id))
    }
    fn group_image<'a>(&'a self, group_id: &'a str) -> CloudFuture<'a, String> {
        self.count(self.inner.group_image(group_id))
    }
    fn set_group_image<'a>(&'a self, group_id: &'a str, image: &'a str) -> CloudFuture<'a, ()> {
        self.count(self.inner.set_group_image(group_id, image))
    }
    fn list_groups(&self) -> CloudFuture<'_, Vec<CloudGroup>> {
        self.count(self.inner.list_groups())
    }
}

/// The operator's Manager (every controller registered, as `nodewarden run`
/// does) for this test's nodes and objects, running until the token is cancelled.
async fn start(env: &TestEnv, cloud: Arc<dyn CloudProvider>) -> (Metrics, CancellationToken) {
    support::install_crds(&env.client).await;
    let config = env.operator_config(Default::default(), Some(cloud), "filtering");
    let metrics = Metrics::new();
    let manager = manager(env.client.clone(), &config, &metrics).expect("a valid config");
    let stop = CancellationToken::new();
    tokio::spawn(manager.run(stop.clone()));
    (metrics, stop)
}

fn reconciles(metrics: &Metrics, controller: &str) -> u64 {
    metrics
        .reconciles
        .get_or_create(&ControllerLabels {
            controller: controller.to_owned(),
        })
        .get()
}

async fn create_node_version(env: &TestEnv) -> String {
    let name = env.name("version");
    let nv: NodeVersion = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "NodeVersion",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": {"image": "img-1"},
    }))
    .expect("a node version");
    Api::<NodeVersion>::all(env.client.clone())
        .create(&PostParams::default(), &nv)
        .await
        .expect("creating the node version");
    name
}

/// Waits until `count` has not moved for `quiet`; returns its value.
async fn settled(count: impl Fn() -> u64, quiet: Duration) -> u64 {
    let mut last = count();
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(60);
    while since.elapsed() < quiet {
        assert!(Instant::now() < deadline, "reconciles never settled");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_status_change_requeues_no_node_version() {
    let env = TestEnv::new("filter-status").await;
    let nodes = env.create_kwok_nodes(3, &[]).await;
    // Ready first: becoming Ready is a change that rightly reconciles.
    let api: Api<Node> = Api::all(env.client.clone());
    for node in &nodes {
        wait_for("the node to be Ready", Duration::from_secs(30), || async {
            match api.get(node).await {
                Ok(n) if support::node_is_ready(&n) => Probe::Done(()),
                Ok(_) => Probe::NotYet("not Ready".into()),
                Err(e) => Probe::NotYet(seen(e)),
            }
        })
        .await;
    }
    let cloud = Arc::new(Counted {
        inner: SimProvider::new("127.0.0.1:9").expect("a provider"),
        calls: Arc::default(),
    });
    let (metrics, stop) = start(&env, cloud).await;
    create_node_version(&env).await;
    wait_for(
        "a first NodeVersion reconcile",
        Duration::from_secs(30),
        || async {
            match reconciles(&metrics, "nodeversion") {
                0 => Probe::NotYet("none yet".into()),
                _ => Probe::Done(()),
            }
        },
    )
    .await;
    let before = settled(|| reconciles(&metrics, "nodeversion"), Duration::from_secs(3)).await;

    // Status only (what kubelets and kwok write all the time): 30 changes.
    for i in 0..10 {
        for node in &nodes {
            let patch = json!({"status": {"capacity": {"example.com/widgets": i.to_string()}}});
            api.patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("patching a node's status");
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        reconciles(&metrics, "nodeversion"),
        before,
        "a status-only Node change reconciled a NodeVersion"
    );

    // A label is what a rollout reads: that one goes through.
    let patch = json!({"metadata": {"labels": {"example.com/pool": "blue"}}});
    api.patch(&nodes[0], &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("labelling a node");
    wait_for(
        "a reconcile after the label change",
        Duration::from_secs(10),
        || async {
            match reconciles(&metrics, "nodeversion") {
                n if n > before => Probe::Done(()),
                n => Probe::NotYet(format!("{n} reconciles")),
            }
        },
    )
    .await;

    stop.cancel();
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cloud_down_busy_nodes_do_not_multiply_cloud_calls() {
    const NODES: usize = 20;
    const CHURN: Duration = Duration::from_secs(30);
    let env = TestEnv::new("filter-backoff").await;
    let group = env.name("workers");
    let mut names = Vec::new();
    for i in 0..NODES {
        let name = env.name(&format!("n{i}"));
        env.create_kwok_node_with(&name, &[], &format!("sim://{group}/{name}"))
            .await;
        names.push(name);
    }
    let calls = Arc::new(AtomicUsize::new(0));
    let cloud = Arc::new(Counted {
        inner: SimProvider::new("127.0.0.1:9").expect("a provider"),
        calls: calls.clone(),
    });
    let launched = Instant::now();
    let (_metrics, stop) = start(&env, cloud).await;
    let nv_name = create_node_version(&env).await;
    let sg: ScalingGroup = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "ScalingGroup",
        "metadata": {"name": group, "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeImage": nv_name, "groupId": group, "role": "Worker", "autoscaling": false},
    }))
    .expect("a ScalingGroup");
    Api::<ScalingGroup>::all(env.client.clone())
        .create(&PostParams::default(), &sg)
        .await
        .expect("creating the ScalingGroup");

    // Nodes change up to 50 times a second (labels: changes the predicates
    // let through), one patch at a time: patches sent without waiting piled
    // up on the same nodes under a loaded API server until one timed out (504).
    let started = Instant::now();
    let api: Api<Node> = Api::all(env.client.clone());
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut updates = 0usize;
    while started.elapsed() < CHURN {
        tick.tick().await;
        let node = &names[updates % NODES];
        let patch = json!({"metadata": {"labels": {"example.com/tick": updates.to_string()}}});
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("labelling a node");
        updates += 1;
    }
    let elapsed = started.elapsed();
    let made = calls.load(Ordering::SeqCst);

    // Each failing key (the NodeVersion, the ScalingGroup) is tried once and
    // then after 5 ms, 10 ms, 20 ms, ... (client-go's per-item backoff): within
    // T (since the operator started) that is at most 1 + log2(T / 5 ms + 1)
    // tries, each one cloud read, which is itself tried a few times in place.
    let window = launched.elapsed().as_secs_f64();
    let tries_per_key = 1 + (window / 0.005 + 1.0).log2().floor() as usize;
    let allowed = 2 * tries_per_key * nodewarden::cloud::retry::RetryPolicy::default().attempts;
    println!(
        "{updates} node updates in {elapsed:?} ({:.0}/s): {made} cloud calls, backoff allows {allowed}",
        updates as f64 / elapsed.as_secs_f64()
    );
    // Enough node events that an operator asking the cloud on each would
    // exceed the bound several times over (a rate would measure the API
    // server: a loaded one answered 27 patches a second).
    assert!(
        updates >= 5 * allowed,
        "{updates} node updates are too few to tell against a bound of {allowed}"
    );
    assert!(made >= 2, "the cloud was never asked: the test proves nothing");
    assert!(
        made <= allowed,
        "{made} cloud calls, the backoff allows {allowed}"
    );

    // The NodeVersion says why it is stuck.
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    wait_for(
        "Degraded=CloudError on the NodeVersion",
        Duration::from_secs(10),
        || async {
            let nv = match versions.get(&nv_name).await {
                Ok(nv) => nv,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let conditions = nv.status.map(|s| s.rollout_conditions).unwrap_or_default();
            match conditions.iter().find(|c| c.type_ == "Degraded") {
                Some(c)
                    if c.status == "True"
                        && c.reason == "CloudError"
                        && c.message.contains("cannot reach the cloud") =>
                {
                    Probe::Done(())
                }
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;

    // And every failed reconcile is an Event on its object, reason = category.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), "default");
    wait_for(
        "a CloudError Event on the NodeVersion",
        Duration::from_secs(10),
        || async {
            let list = match events.list(&Default::default()).await {
                Ok(list) => list,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let found = list.items.iter().any(|e| {
                e.reason.as_deref() == Some("CloudError")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(nv_name.as_str())
            });
            if found {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("{} events, none for {nv_name}", list.items.len()))
            }
        },
    )
    .await;
    stop.cancel();
    env.cleanup().await;
}
