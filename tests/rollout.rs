//! Rolling replacement end to end: the real control plane, kwok nodes, the
//! sim-cloud as a separate process, nodewarden's controllers in-process, and
//! a checker watching the invariants of DESIGN.md throughout.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::api::update::{NodeVersion, PendingNode, ScalingGroup};
use nodewarden::cloud::CloudProvider;
use nodewarden::cloud::InstanceState;
use nodewarden::controllers::node_maintenance::MaintenanceConfig;
use serde_json::json;
use support::sim::{OwnedSimCloud, SimCloud};
use support::{Probe, RUN_LABEL, TestEnv, node_is_ready, seen, wait_for};
use tokio_util::sync::CancellationToken;

const BOOT: Duration = Duration::from_secs(1);
const JOIN: Duration = Duration::from_secs(1);

/// What the checker saw break, if anything.
#[derive(Default)]
struct Breaches(Mutex<Vec<String>>);

impl Breaches {
    fn add(&self, what: String) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if all.len() < 50 {
            all.push(what);
        }
    }
    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Watches the cluster every 100 ms: never more nodes than `base + surge`
/// (invariant 1), a node only disappears once its heir is Ready (invariant 2),
/// the Deployments' PodDisruptionBudgets hold (invariant 3).
async fn check(
    client: Client,
    env_id: String,
    namespace: String,
    base: usize,
    surge: Arc<Mutex<usize>>,
    breaches: Arc<Breaches>,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    let pending: Api<PendingNode> = Api::all(client.clone());
    let mut last: BTreeMap<String, Node> = BTreeMap::new();
    while !stop.is_cancelled() {
        let Ok(list) = nodes
            .list(&ListParams::default().labels(&format!("{RUN_LABEL}={env_id}")))
            .await
        else {
            continue;
        };
        let now: BTreeMap<String, Node> = list.items.into_iter().map(|n| (n.name_any(), n)).collect();
        let joins = pending
            .list(&ListParams::default().labels(&format!("{RUN_LABEL}={env_id}")))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|p| p.spec.goal == Some(nodewarden::api::update::PendingNodeGoal::Join))
                    .filter(|p| !now.contains_key(&p.spec.node_name))
                    .count()
            })
            .unwrap_or(0);
        let allowed = base + *surge.lock().unwrap_or_else(|e| e.into_inner());
        if now.len() + joins > allowed {
            breaches.add(format!(
                "{} nodes + {joins} joining > {allowed} allowed",
                now.len()
            ));
        }
        for (name, node) in &last {
            if now.contains_key(name) {
                continue;
            }
            let heir = node
                .annotations()
                .get("constellation.edgeless.systems/heir")
                .cloned();
            match heir.as_ref().and_then(|h| now.get(h)) {
                Some(h) if node_is_ready(h) => {}
                _ => breaches.add(format!("{name} deleted without a Ready heir ({heir:?})")),
            }
        }
        if let Ok(list) = deployments.list(&ListParams::default()).await {
            for d in list.items {
                let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
                let available = d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
                // Each Deployment's budget allows one pod down at a time.
                if available < want - 1 {
                    breaches.add(format!(
                        "deployment {} had {available} of {want} available",
                        d.name_any()
                    ));
                }
            }
        }
        last = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Rollout {
    env: TestEnv,
    sim: OwnedSimCloud,
    groups: Vec<(String, &'static str, usize)>,
}

async fn setup(test: &str, groups: &[(&'static str, &'static str, usize)]) -> Rollout {
    let env = TestEnv::new(test).await;
    support::install_crds(&env.client).await;
    let groups: Vec<(String, &'static str, usize)> = groups
        .iter()
        .map(|(g, role, size)| (format!("{}-{g}", env.id), *role, *size))
        .collect();
    let config = json!({"groups": groups.iter().map(|(id, role, size)| json!({
        "id": id, "role": role, "initialSize": size, "image": "img-1",
        "bootDelay": format!("{}ms", BOOT.as_millis()), "joinDelay": format!("{}ms", JOIN.as_millis()),
        "deleteDelay": "1s", "labels": {RUN_LABEL: env.id},
    })).collect::<Vec<_>>()});
    let sim = SimCloud::start_with_config(&serde_json::to_string(&config).expect("json")).await;
    let total: usize = groups.iter().map(|g| g.2).sum();
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for(
        "the initial nodes to be Ready",
        Duration::from_secs(60),
        || async {
            match nodes.list(&ListParams::default().labels(&selector)).await {
                Ok(l) if l.items.iter().filter(|n| node_is_ready(n)).count() == total => Probe::Done(()),
                Ok(l) => Probe::NotYet(format!("{} nodes", l.items.len())),
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
    // The NodeVersion and its ScalingGroups, as Constellation's installer makes them.
    let nv: NodeVersion = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "NodeVersion",
        "metadata": {"name": env.name("version"), "labels": {RUN_LABEL: env.id}},
        "spec": {"image": "img-1", "rollout": {"maxSurge": 1, "maxUnavailable": 0}},
    }))
    .expect("a NodeVersion");
    Api::<NodeVersion>::all(env.client.clone())
        .create(&PostParams::default(), &nv)
        .await
        .expect("creating");
    for (id, role, _) in &groups {
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
    Rollout { env, sim, groups }
}

/// A Deployment over the workers with a budget of one pod down at a time.
async fn workload(env: &TestEnv, name: &str, replicas: i32) {
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {RUN_LABEL: env.id, "node-role.kubernetes.io/worker": ""},
                    "containers": [{"name": "c", "image": "registry.invalid/app:1"}],
                },
            },
        },
    }))
    .expect("a deployment");
    Api::<Deployment>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &d)
        .await
        .expect("creating a deployment");
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

/// Sets the image (and surge), then waits until every node runs it.
async fn roll(r: &Rollout, image: &str, surge: usize) -> Duration {
    let env = &r.env;
    let api: Api<NodeVersion> = Api::all(env.client.clone());
    let patch = json!({"spec": {"image": image, "rollout": {"maxSurge": surge}}});
    let start = Instant::now();
    api.patch(
        &env.name("version"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("new image");
    let total: usize = r.groups.iter().map(|g| g.2).sum();
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for(
        &format!("every node on {image}"),
        Duration::from_secs(240),
        || async {
            let Ok(list) = nodes.list(&ListParams::default().labels(&selector)).await else {
                return Probe::NotYet("list failed".into());
            };
            let current = list
                .items
                .iter()
                .filter(|n| {
                    n.status
                        .as_ref()
                        .and_then(|s| s.node_info.as_ref())
                        .is_some_and(|i| i.os_image == image)
                })
                .filter(|n| node_is_ready(n))
                .count();
            if current == total && list.items.len() == total {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("{current} of {} nodes on {image}", list.items.len()))
            }
        },
    )
    .await;
    start.elapsed()
}

/// Every instance the sim ever made is a current node or terminated (invariant 4).
async fn assert_no_leak(r: &Rollout) {
    let nodes: Api<Node> = Api::all(r.env.client.clone());
    let names: BTreeSet<String> = nodes
        .list(&ListParams::default().labels(&r.env.run_selector()))
        .await
        .expect("listing nodes")
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_nodes_are_replaced_without_breaching_an_invariant_and_surge_3_is_faster() {
    let r = setup("rollout", &[("cp", "ControlPlane", 3), ("workers", "Worker", 9)]).await;
    let env = &r.env;
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;
    workload(env, "web", 6).await;
    workload(env, "api", 3).await;

    let surge = Arc::new(Mutex::new(1usize));
    let breaches = Arc::new(Breaches::default());
    let stop = CancellationToken::new();
    let checker = tokio::spawn(check(
        env.client.clone(),
        env.id.clone(),
        env.namespace.clone(),
        12,
        surge.clone(),
        breaches.clone(),
        stop.clone(),
    ));

    let one = roll(&r, "img-2", 1).await;
    assert_no_leak(&r).await;
    *surge.lock().unwrap_or_else(|e| e.into_inner()) = 3;
    let three = roll(&r, "img-3", 3).await;
    assert_no_leak(&r).await;
    stop.cancel();
    let _ = checker.await;

    let ideal = |s: usize| (BOOT + JOIN) * (12_usize.div_ceil(s) as u32);
    println!(
        "rollout of 12 nodes: maxSurge 1 took {one:?} (ideal {:?}); maxSurge 3 took {three:?} (ideal {:?}); speed-up {:.2}",
        ideal(1),
        ideal(3),
        one.as_secs_f64() / three.as_secs_f64()
    );
    let found = breaches.all();
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    assert!(
        three < one,
        "maxSurge 3 ({three:?}) should beat maxSurge 1 ({one:?})"
    );
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}
