//! A rollout's fixtures shared by the rollout tests: the sim-cloud with its
//! groups, the NodeVersion and ScalingGroups, a workload with a budget, and
//! the invariant checker that watches the rollout invariants as they happen.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::api::update::{NodeVersion, PendingNode, ScalingGroup};
use nodewarden::cloud::InstanceState;
use nodewarden::cloud::sim::SimProvider;
use nodewarden::runtime::reflector::{Event as ReflectorEvent, Reflector, ReflectorConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::sim::{OwnedSimCloud, SimCloud};
use super::{Probe, RUN_LABEL, TestEnv, node_is_ready, seen, wait_for};

pub const BOOT: Duration = Duration::from_secs(1);
pub const JOIN: Duration = Duration::from_secs(1);

/// What the checker saw break, if anything.
#[derive(Default)]
pub struct Breaches(Mutex<Vec<String>>);

impl Breaches {
    pub fn add(&self, what: String) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() < 50 {
            all.push(what);
        }
    }
    pub fn all(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What the checker shares with its [`Checker`]: the surge it allows (set
/// with the rollout's), the breaches it found, the peak surge it saw.
#[derive(Clone)]
pub struct Tallies {
    pub surge: Arc<Mutex<usize>>,
    pub breaches: Arc<Breaches>,
    pub peak: Arc<std::sync::atomic::AtomicUsize>,
}

/// Watches the cluster and checks the rollout invariants on every
/// change, as it happens: never more nodes than `base + surge` counting
/// instances on their way (invariant 1); a node disappears only while its heir
/// is Ready (invariant 2, judged on the node's last state, which the deletion
/// event carries); the Deployments' budgets hold (invariant 3).
pub async fn check(
    client: Client,
    env_id: String,
    namespace: String,
    base: usize,
    tallies: Tallies,
    stop: CancellationToken,
    sim: Option<SimProvider>,
) {
    let Tallies {
        surge,
        breaches,
        peak,
    } = tallies;
    let selector = format!("{RUN_LABEL}={env_id}");
    let config = ReflectorConfig {
        label_selector: Some(selector.clone()),
        ..Default::default()
    };
    let mut nodes = Reflector::new("checker-nodes", Api::<Node>::all(client.clone()), config.clone());
    let mut pending = Reflector::new("checker-pending", Api::<PendingNode>::all(client.clone()), config);
    let (node_store, pending_store) = (nodes.store(), pending.store());

    let confirming = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let count_check = {
        let (node_store, pending_store, surge, breaches, client, selector, peak) = (
            node_store.clone(),
            pending_store.clone(),
            surge.clone(),
            breaches.clone(),
            client.clone(),
            selector.clone(),
            peak.clone(),
        );
        Arc::new(move || {
            let names: BTreeSet<String> = node_store.keys().into_iter().map(|k| k.name.clone()).collect();
            let joins = pending_store
                .list()
                .iter()
                .filter(|p| p.spec.goal == Some(nodewarden::api::update::PendingNodeGoal::Join))
                .filter(|p| !names.contains(&p.spec.node_name))
                .count();
            let allowed = base + *surge.lock().unwrap_or_else(|e| e.into_inner());
            if node_store.is_synced() {
                peak.fetch_max(
                    (names.len() + joins).saturating_sub(base),
                    std::sync::atomic::Ordering::SeqCst,
                );
            }
            // Nodes go only once their heir is there: never fewer than at the start.
            if node_store.is_synced() && names.len() < base {
                breaches.add(format!(
                    "{} nodes, fewer than the {base} at the start",
                    names.len()
                ));
            }
            // The two watches are separate streams: one may run ahead of the
            // other (a new PendingNode seen before an older Node deletion).
            // A count over the limit is confirmed against the API server.
            if names.len() + joins > allowed && !confirming.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let (client, selector, breaches, confirming, sim) = (
                    client.clone(),
                    selector.clone(),
                    breaches.clone(),
                    confirming.clone(),
                    sim.clone(),
                );
                tokio::spawn(async move {
                    if let Some((nodes, joins)) = in_flight_now(&client, &selector, sim.as_ref()).await
                        && nodes.len() + joins.len() > allowed
                    {
                        breaches.add(format!(
                            "{} nodes + {} joining > {allowed} allowed at {}: nodes {nodes:?}, joining {joins:?}",
                            nodes.len(),
                            joins.len(),
                            k8s_openapi::jiff::Timestamp::now(),
                        ));
                    }
                    confirming.store(false, std::sync::atomic::Ordering::SeqCst);
                });
            }
        })
    };
    let on_node = count_check.clone();
    let heirs = node_store.clone();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
    let node_breaches = breaches.clone();
    nodes.on_event(move |event| match event {
        ReflectorEvent::Deleted(node) => {
            // The heir the donor names or, when this last view of the donor
            // predates its pairing, the node naming it as donor. A deletion
            // seen by a relist (after a watch gap: an API server restart, a
            // compaction) comes with the last state the watch delivered, not
            // the final one; the store already holds the relist's fresh view.
            let heir = node
                .annotations()
                .get("constellation.edgeless.systems/heir")
                .cloned()
                .or_else(|| {
                    heirs.list().iter().find_map(|n| {
                        (n.annotations().get("constellation.edgeless.systems/donor")
                            == Some(&node.name_any()))
                        .then(|| n.name_any())
                    })
                });
            let heir_ready = heir
                .as_ref()
                .and_then(|h| heirs.get(&nodewarden::runtime::store::ObjectKey::cluster(h)))
                .is_some_and(|h| node_is_ready(&h));
            // A surplus node (a mint nobody needed) leaves without an heir.
            let surplus = node
                .annotations()
                .contains_key("constellation.edgeless.systems/obsolete");
            if !heir_ready && !surplus {
                node_breaches.add(format!(
                    "{} deleted without a Ready heir ({heir:?})",
                    node.name_any()
                ));
            }
            // Its pods were evicted before (only DaemonSet pods may stay).
            let (pods, name, breaches) = (pods.clone(), node.name_any(), node_breaches.clone());
            tokio::spawn(async move {
                let fields = format!("spec.nodeName={name}");
                if let Ok(list) = pods.list(&ListParams::default().fields(&fields)).await {
                    let left: Vec<String> = list
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .map(|p| p.name_any())
                        .collect();
                    if !left.is_empty() {
                        breaches.add(format!("{name} deleted with pods still on it: {left:?}"));
                    }
                }
            });
        }
        _ => on_node(),
    });
    let on_pending = count_check.clone();
    pending.on_event(move |_| on_pending());
    tokio::spawn(nodes.run(stop.clone()));
    tokio::spawn(pending.run(stop.clone()));

    // Every state of the Deployments' status, as the watch brings it (a
    // poll would sample them and keep the API server busy listing).
    let mut deployments = Reflector::new(
        "checker-deployments",
        Api::<Deployment>::namespaced(client.clone(), &namespace),
        ReflectorConfig::default(),
    );
    deployments.on_event(move |event| {
        let (ReflectorEvent::Added(d) | ReflectorEvent::Updated { new: d, .. }) = event else {
            return;
        };
        let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        let available = d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
        // Each Deployment's budget allows one pod down at a time.
        if available < want - 1 {
            breaches.add(format!(
                "deployment {} had {available} of {want} available",
                d.name_any()
            ));
        }
    });
    tokio::spawn(deployments.run(stop.clone()));
    stop.cancelled().await;
}

/// Nodes and instances on their way (PendingNode names) at one moment, from
/// the API server: nodes listed before and after the PendingNodes, and only
/// nodes in both lists counted, so nothing created or deleted in between
/// inflates the sum.
///
/// A PendingNode whose create was answered but not yet recorded (its leader
/// was cut off in between) names no node; with the sim-cloud at hand, the
/// instance made for it (its idempotency key is the PendingNode's name) is
/// looked up, so its Node, once joined, is not counted twice. Without it,
/// such a PendingNode is left out until it names its node.
async fn in_flight_now(
    client: &Client,
    selector: &str,
    sim: Option<&SimProvider>,
) -> Option<(Vec<String>, Vec<String>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let pending: Api<PendingNode> = Api::all(client.clone());
    let params = ListParams::default().labels(selector);
    let names = |l: kube::api::ObjectList<Node>| -> BTreeSet<String> {
        l.items.iter().map(|n| n.name_any()).collect()
    };
    let before = names(nodes.list(&params).await.ok()?);
    let joins = pending.list(&params).await.ok()?;
    let after = names(nodes.list(&params).await.ok()?);
    let seen: BTreeSet<&String> = before.union(&after).collect();
    let made_for: std::collections::BTreeMap<String, String> = match sim {
        Some(sim) => sim
            .list_instances()
            .await
            .ok()?
            .into_iter()
            .filter_map(|i| Some((i.instance.request_id?, i.instance.name)))
            .collect(),
        None => Default::default(),
    };
    // The cloud knows a create by its request key (the PendingNode's UID).
    let p_key = |p: &PendingNode| nodewarden::controllers::pending_node::request_key(p).ok();
    let node_of = |p: &PendingNode| match (p.spec.node_name.as_str(), p_key(p).and_then(|k| made_for.get(&k)))
    {
        ("", Some(made)) => made.clone(),
        (name, _) => name.to_string(),
    };
    let joining = joins
        .items
        .iter()
        .filter(|p| p.spec.goal == Some(nodewarden::api::update::PendingNodeGoal::Join))
        // Without the sim-cloud to ask, a PendingNode that names no node yet
        // is not counted: its instance may already be one of the nodes (the
        // aws provider names it only once the group shows it, and a fast
        // joiner registers it before). Once named it is counted as any other.
        .filter(|p| sim.is_some() || !p.spec.node_name.is_empty())
        .filter(|p| !seen.contains(&node_of(p)))
        .map(|p| format!("{} ({})", p.name_any(), p.spec.node_name))
        .collect();
    Some((before.intersection(&after).cloned().collect(), joining))
}

/// The invariant checker running in the background for one rollout.
pub struct Checker {
    /// The surge the checker allows (change it with the rollout's).
    pub surge: Arc<Mutex<usize>>,
    breaches: Arc<Breaches>,
    peak: Arc<std::sync::atomic::AtomicUsize>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Checker {
    /// Starts checking the rollout of `base` nodes with `surge` extra at most.
    pub fn start(env: &TestEnv, base: usize, surge: usize) -> Checker {
        Checker::start_with(env, base, surge, None)
    }

    /// As [`Checker::start`], asking the sim-cloud which instance was made
    /// for a PendingNode that names no node yet (see `in_flight_now`).
    pub fn start_with_sim(env: &TestEnv, base: usize, surge: usize, sim: &SimProvider) -> Checker {
        Checker::start_with(env, base, surge, Some(sim.clone()))
    }

    fn start_with(env: &TestEnv, base: usize, surge: usize, sim: Option<SimProvider>) -> Checker {
        let surge = Arc::new(Mutex::new(surge));
        let breaches = Arc::new(Breaches::default());
        let peak = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let task = tokio::spawn(check(
            env.client.clone(),
            env.id.clone(),
            env.namespace.clone(),
            base,
            Tallies {
                surge: surge.clone(),
                breaches: breaches.clone(),
                peak: peak.clone(),
            },
            stop.clone(),
            sim,
        ));
        Checker {
            surge,
            breaches,
            peak,
            stop,
            task,
        }
    }

    /// The most nodes beyond `base` (joining ones included) seen at once so
    /// far, as the watches saw them (a skew between them may add one).
    pub fn peak_surge(&self) -> usize {
        self.peak.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// As [`Checker::peak_surge`], starting the count again from zero (for
    /// the next rollout).
    pub fn take_peak_surge(&self) -> usize {
        self.peak.swap(0, std::sync::atomic::Ordering::SeqCst)
    }

    pub fn set_surge(&self, surge: usize) {
        *self.surge.lock().unwrap_or_else(|e| e.into_inner()) = surge;
    }

    /// Stops checking; what broke, if anything.
    pub async fn finish(self) -> Vec<String> {
        self.stop.cancel();
        let _ = self.task.await;
        self.breaches.all()
    }
}

/// Waits until none of the test's `K` (cluster-scoped, run-labelled) is left.
pub async fn wait_none_left<K>(env: &TestEnv)
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for(
        &format!("no {} left", K::kind(&())),
        Duration::from_secs(60),
        || async {
            match api.list(&ListParams::default().labels(&selector)).await {
                Ok(l) if l.items.is_empty() => Probe::Done(()),
                Ok(l) => Probe::NotYet(format!("{} left", l.items.len())),
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
}

/// The names of the test's nodes now.
pub async fn node_names(env: &TestEnv) -> BTreeSet<String> {
    Api::<Node>::all(env.client.clone())
        .list(&ListParams::default().labels(&env.run_selector()))
        .await
        .expect("listing nodes")
        .items
        .iter()
        .map(|n| n.name_any())
        .collect()
}

/// Whether the node reports running `image`.
pub fn runs_image(node: &Node, image: &str) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .is_some_and(|i| i.os_image == image)
}

pub struct Rollout {
    pub env: TestEnv,
    pub sim: OwnedSimCloud,
    pub groups: Vec<(String, &'static str, usize)>,
}

impl Rollout {
    /// An operator over the sim-cloud, with the default maintenance settings.
    pub async fn start_operator(&self) -> super::RunningOperator {
        let cloud: Arc<dyn nodewarden::cloud::CloudProvider> = Arc::new(self.sim.sim.provider.clone());
        self.env
            .start_operator_with(Default::default(), Some(cloud), "operator")
            .await
    }

    /// One `nodewarden run` over the sim-cloud as nodewarden's
    /// ServiceAccount, sending its traces to `otlp_endpoint`.
    pub async fn start_traced_replica(&self, otlp_endpoint: &str) -> super::replicas::Replicas {
        let env = &self.env;
        let dir = super::replicas::replica_log_dir(&env.id);
        let kubeconfig = super::replicas::service_account_kubeconfig(&env.client, &dir).await;
        super::replicas::Replicas::start(
            1,
            env,
            &kubeconfig,
            &format!("nodewarden-{}", env.id),
            otlp_endpoint,
            &["--sim-cloud", &self.sim.sim.addr],
            &dir,
        )
    }

    /// Sets the sim-cloud's faults (`Faults::default()` clears them).
    pub async fn set_faults(&self, faults: &nodewarden::cloud::sim::wire::Faults) {
        self.sim
            .sim
            .provider
            .set_faults(faults)
            .await
            .expect("setting the sim-cloud's faults");
    }

    /// Every instance of `image` the sim-cloud ever made.
    pub async fn instances_of(&self, image: &str) -> Vec<nodewarden::cloud::sim::wire::InstanceView> {
        let all = self
            .sim
            .sim
            .provider
            .list_instances()
            .await
            .expect("listing instances");
        all.into_iter().filter(|i| i.instance.image == image).collect()
    }

    /// Stops `operator` and the sim-cloud, and removes the test's objects.
    pub async fn finish(self, operator: super::RunningOperator) {
        operator.stop().await;
        let Rollout { env, sim, .. } = self;
        sim.sim.kill().await;
        env.cleanup().await;
    }
}

pub async fn setup(test: &str, groups: &[(&'static str, &'static str, usize)]) -> Rollout {
    setup_with(test, groups, json!({})).await
}

/// As [`setup`], every group's sim-cloud config extended (or overridden)
/// by the fields of `extra` (e.g. `internalIpBase`, `bootDelay`).
pub async fn setup_with(
    test: &str,
    groups: &[(&'static str, &'static str, usize)],
    extra: serde_json::Value,
) -> Rollout {
    let env = TestEnv::new(test).await;
    super::install_crds(&env.client).await;
    let groups: Vec<(String, &'static str, usize)> = groups
        .iter()
        .map(|(g, role, size)| (format!("{}-{g}", env.id), *role, *size))
        .collect();
    let config = json!({"groups": groups.iter().map(|(id, role, size)| {
        let mut group = json!({
            "id": id, "role": role, "initialSize": size, "image": "img-1",
            "bootDelay": format!("{}ms", BOOT.as_millis()), "joinDelay": format!("{}ms", JOIN.as_millis()),
            "deleteDelay": "1s", "labels": {RUN_LABEL: env.id},
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            group[k] = v.clone();
        }
        group
    }).collect::<Vec<_>>()});
    let sim = SimCloud::start_with_config(&serde_json::to_string(&config).expect("json")).await;
    let total: usize = groups.iter().map(|g| g.2).sum();
    env.wait_for_nodes("Ready", total, node_is_ready).await;
    let ids: Vec<(String, &'static str)> = groups.iter().map(|(id, role, _)| (id.clone(), *role)).collect();
    create_node_version(&env, &ids, "img-1").await;
    Rollout { env, sim, groups }
}

/// The NodeVersion (maxSurge 1) and a ScalingGroup per cloud group, as
/// Constellation's installer makes them.
pub async fn create_node_version(env: &TestEnv, groups: &[(String, &'static str)], image: &str) {
    let nv: NodeVersion = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "NodeVersion",
        "metadata": {"name": env.name("version"), "labels": {RUN_LABEL: env.id}},
        "spec": {"image": image, "rollout": {"maxSurge": 1, "maxUnavailable": 0}},
    }))
    .expect("a NodeVersion");
    Api::<NodeVersion>::all(env.client.clone())
        .create(&PostParams::default(), &nv)
        .await
        .expect("creating");
    for (id, role) in groups {
        let sg: ScalingGroup = serde_json::from_value(json!({
            "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "ScalingGroup",
            "metadata": {"name": id, "labels": {RUN_LABEL: env.id}},
            "spec": {"nodeImage": env.name("version"), "groupId": id, "role": role, "autoscaling": false},
        }))
        .expect("a ScalingGroup");
        Api::<ScalingGroup>::all(env.client.clone())
            .create(&PostParams::default(), &sg)
            .await
            .expect("creating");
    }
}

/// A Deployment over the workers with a budget of one pod down at a time.
pub async fn workload(env: &TestEnv, name: &str, replicas: i32) {
    env.create_deployment(
        name,
        replicas,
        json!({RUN_LABEL: env.id, "node-role.kubernetes.io/worker": ""}),
    )
    .await;
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}},
    }))
    .expect("a pdb");
    Api::<PodDisruptionBudget>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &pdb)
        .await
        .expect("creating a pdb");
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_for(&format!("{name} available"), Duration::from_secs(60), || async {
        match deployments.get(name).await {
            Ok(d) if d.status.as_ref().and_then(|s| s.available_replicas) == Some(replicas) => {
                Probe::Done(())
            }
            Ok(d) => Probe::NotYet(format!("{:?}", d.status)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
}

/// Sets `joinTimeout` on the test's NodeVersion: an instance that never
/// joins is given up on in seconds, not the default half hour.
pub async fn set_join_timeout(env: &TestEnv, timeout: &str) {
    patch_node_version(env, json!({"spec": {"rollout": {"joinTimeout": timeout}}})).await;
}

/// Merges `patch` into the test's NodeVersion.
pub async fn patch_node_version(env: &TestEnv, patch: serde_json::Value) {
    Api::<NodeVersion>::all(env.client.clone())
        .patch(
            &env.name("version"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("patching the NodeVersion");
}

/// Sets the image (and surge), then waits until every node runs it.
pub async fn roll(r: &Rollout, image: &str, surge: usize) -> Duration {
    let total: usize = r.groups.iter().map(|g| g.2).sum();
    roll_nodes(&r.env, total, image, Some(surge)).await
}

/// Sets the image (and the surge, if given), then waits until all `total` nodes run it.
pub async fn roll_nodes(env: &TestEnv, total: usize, image: &str, surge: Option<usize>) -> Duration {
    roll_nodes_of(env, &env.name("version"), total, image, surge).await
}

/// As [`roll_nodes`], of the NodeVersion named `version`.
pub async fn roll_nodes_of(
    env: &TestEnv,
    version: &str,
    total: usize,
    image: &str,
    surge: Option<usize>,
) -> Duration {
    // Watched, not polled: the end is seen as its last event arrives, so a
    // bench's clock is not rounded up to a polling period, and the API
    // server is not kept busy serialising node lists meanwhile.
    let config = ReflectorConfig {
        label_selector: Some(env.run_selector()),
        ..Default::default()
    };
    let mut reflector = Reflector::new("roll-nodes", Api::<Node>::all(env.client.clone()), config);
    let store = reflector.store();
    let changed = Arc::new(tokio::sync::Notify::new());
    let wake = changed.clone();
    reflector.on_event(move |_| wake.notify_one());
    let stop = CancellationToken::new();
    let _stop_watching = stop.clone().drop_guard();
    tokio::spawn(reflector.run(stop));
    wait_for("the nodes listed", Duration::from_secs(60), || async {
        if store.is_synced() {
            Probe::Done(())
        } else {
            Probe::NotYet("not listed yet".into())
        }
    })
    .await;

    let api: Api<NodeVersion> = Api::all(env.client.clone());
    let patch = match surge {
        Some(surge) => json!({"spec": {"image": image, "rollout": {"maxSurge": surge}}}),
        None => json!({"spec": {"image": image}}),
    };
    let start = Instant::now();
    api.patch(version, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("new image");
    let timeout = Duration::from_secs(240);
    loop {
        let nodes = store.list();
        let current = nodes
            .iter()
            .filter(|n| runs_image(n, image) && node_is_ready(n))
            .count();
        if current == total && nodes.len() == total {
            return start.elapsed();
        }
        if start.elapsed() > timeout {
            panic!(
                "timed out after {timeout:?} waiting for every node on {image}; last seen: {current} of {} nodes on {image}\n{}",
                nodes.len(),
                super::stall_report::rollout_state(env, version, image).await
            );
        }
        // A permit left by an event in between is taken at once; the period
        // only bounds the wait if the watch is down.
        let _ = tokio::time::timeout(Duration::from_secs(1), changed.notified()).await;
    }
}

/// Every instance the sim ever made is a current node or terminated (invariant 4).
pub async fn assert_no_leak(r: &Rollout) {
    let names = node_names(&r.env).await;
    wait_for(
        "every instance a node or terminated",
        Duration::from_secs(30),
        || async {
            let instances = r.sim.sim.provider.list_instances().await.unwrap_or_default();
            let live: BTreeSet<String> = instances
                .iter()
                .filter(|i| !matches!(i.state, InstanceState::Terminated | InstanceState::Terminating))
                .map(|i| i.instance.name.clone())
                .collect();
            if live == names {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("live {live:?} vs nodes {names:?}"))
            }
        },
    )
    .await;
}

/// Every (condition type, reason) the NodeVersion `name` showed while this
/// ran, seen through a watch (so short-lived states are not missed).
pub struct ConditionLog {
    seen: Arc<Mutex<BTreeSet<(String, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ConditionLog {
    pub fn start(env: &TestEnv, name: &str) -> ConditionLog {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        let api: Api<NodeVersion> = Api::all(env.client.clone());
        let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut events = kube::runtime::watcher(api, config).applied_objects().boxed();
            while let Some(event) = events.next().await {
                let Ok(nv) = event else { continue };
                let mut seen = record.lock().unwrap_or_else(|e| e.into_inner());
                let status = nv.status.unwrap_or_default();
                for c in status.conditions.into_iter().chain(status.rollout_conditions) {
                    seen.insert((c.type_, c.reason));
                }
            }
        });
        ConditionLog { seen, task }
    }

    /// Whether condition `type_` was ever seen with `reason`.
    pub fn saw(&self, type_: &str, reason: &str) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(type_.to_string(), reason.to_string()))
    }

    pub fn all(&self) -> BTreeSet<(String, String)> {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for ConditionLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Plays the kubelets of a bad image until `stop`: every pod of the test's
/// namespace on a node running `image` is made unready (its Ready condition
/// False, as a failing readiness probe leaves it) a moment after it turns
/// Ready, and stays so. kwok readies a pod once, while Pending, so it does
/// not undo this. Returns how many pods it broke.
pub fn break_pods_on_image(
    env: &TestEnv,
    image: &str,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<usize> {
    let (client, namespace, image, selector) = (
        env.client.clone(),
        env.namespace.clone(),
        image.to_string(),
        env.run_selector(),
    );
    tokio::spawn(async move {
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
        let nodes: Api<Node> = Api::all(client);
        let mut broken = BTreeSet::new();
        while !stop.is_cancelled() {
            let bad: BTreeSet<String> = match nodes.list(&ListParams::default().labels(&selector)).await {
                Ok(list) => list
                    .items
                    .iter()
                    .filter(|n| runs_image(n, &image))
                    .map(|n| n.name_any())
                    .collect(),
                Err(_) => BTreeSet::new(),
            };
            for pod in pods
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let on_bad = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .is_some_and(|n| bad.contains(n));
                let ready = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                if on_bad && ready && unready(&pods, &pod.name_any()).await {
                    broken.insert(pod.name_any());
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        broken.len()
    })
}

/// Sets pod `name`'s Ready and ContainersReady conditions False.
async fn unready(pods: &Api<k8s_openapi::api::core::v1::Pod>, name: &str) -> bool {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str| json!({"type": type_, "status": "False", "reason": "ReadinessProbeFailed", "lastTransitionTime": now});
    // A strategic merge patch merges conditions by type.
    let patch = json!({"status": {"conditions": [condition("Ready"), condition("ContainersReady")]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .is_ok()
}
