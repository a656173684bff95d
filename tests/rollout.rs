//! Rolling replacement end to end: the real control plane, kwok nodes, the
//! sim-cloud as a separate process, nodewarden's controllers in-process, and
//! a checker watching the invariants of DESIGN.md throughout.

mod support;

use std::collections::BTreeSet;
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
use nodewarden::runtime::reflector::{Event as ReflectorEvent, Reflector, ReflectorConfig};
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

/// Watches the cluster and checks the invariants of DESIGN.md on every
/// change, as it happens: never more nodes than `base + surge` counting
/// instances on their way (invariant 1); a node disappears only while its heir
/// is Ready (invariant 2, judged on the node's last state, which the deletion
/// event carries); the Deployments' budgets hold (invariant 3, sampled).
async fn check(
    client: Client,
    env_id: String,
    namespace: String,
    base: usize,
    surge: Arc<Mutex<usize>>,
    breaches: Arc<Breaches>,
    stop: CancellationToken,
) {
    let selector = format!("{RUN_LABEL}={env_id}");
    let config = ReflectorConfig {
        label_selector: Some(selector.clone()),
        ..Default::default()
    };
    let mut nodes = Reflector::new("checker-nodes", Api::<Node>::all(client.clone()), config.clone());
    let mut pending = Reflector::new("checker-pending", Api::<PendingNode>::all(client.clone()), config);
    let (node_store, pending_store) = (nodes.store(), pending.store());

    let count_check = {
        let (node_store, pending_store, surge, breaches) = (
            node_store.clone(),
            pending_store.clone(),
            surge.clone(),
            breaches.clone(),
        );
        Arc::new(move || {
            let names: BTreeSet<String> = node_store.keys().into_iter().map(|k| k.name).collect();
            let joins = pending_store
                .list()
                .iter()
                .filter(|p| p.spec.goal == Some(nodewarden::api::update::PendingNodeGoal::Join))
                .filter(|p| !names.contains(&p.spec.node_name))
                .count();
            let allowed = base + *surge.lock().unwrap_or_else(|e| e.into_inner());
            if names.len() + joins > allowed {
                breaches.add(format!(
                    "{} nodes + {joins} joining > {allowed} allowed",
                    names.len()
                ));
            }
        })
    };
    let on_node = count_check.clone();
    let heirs = node_store.clone();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &namespace);
    let node_breaches = breaches.clone();
    nodes.on_event(move |event| match event {
        ReflectorEvent::Deleted(node) => {
            let heir = node
                .annotations()
                .get("constellation.edgeless.systems/heir")
                .cloned();
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

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    while !stop.is_cancelled() {
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

    // An operator's label on one worker must follow it to its heir (and the next).
    let nodes: Api<Node> = Api::all(env.client.clone());
    let worker = nodes
        .list(
            &ListParams::default().labels(&format!("{},node-role.kubernetes.io/worker", env.run_selector())),
        )
        .await
        .expect("listing workers")
        .items[0]
        .name_any();
    let label = json!({"metadata": {"labels": {"team": "payments"}}});
    nodes
        .patch(&worker, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("labelling a worker");

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
    let labelled = nodes
        .list(&ListParams::default().labels(&format!("{},team=payments", env.run_selector())))
        .await
        .expect("listing nodes")
        .items;
    assert_eq!(labelled.len(), 1, "the label moved from donor to heir, twice");
    assert_ne!(labelled[0].name_any(), worker);
    // The drains' NodeMaintenances went with their nodes.
    let maintenances: Api<nodewarden::api::node_maintenance::medik8s::NodeMaintenance> =
        Api::all(env.client.clone());
    wait_for("no NodeMaintenance left", Duration::from_secs(60), || async {
        match maintenances
            .list(&ListParams::default().labels(&env.run_selector()))
            .await
        {
            Ok(l) if l.items.is_empty() => Probe::Done(()),
            Ok(l) => Probe::NotYet(format!("{} left", l.items.len())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
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

/// Sets `joinTimeout` on the test's NodeVersion.
async fn set_join_timeout(env: &TestEnv, timeout: &str) {
    let patch = json!({"spec": {"rollout": {"joinTimeout": timeout}}});
    Api::<NodeVersion>::all(env.client.clone())
        .patch(
            &env.name("version"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("setting joinTimeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_never_joins_is_deleted_and_replaced() {
    let r = setup(
        "never-join",
        &[("cp", "ControlPlane", 1), ("workers", "Worker", 2)],
    )
    .await;
    let env = &r.env;
    set_join_timeout(env, "4s").await;
    let faults = nodewarden::cloud::simcloud::faults::Faults {
        never_join: 1,
        ..Default::default()
    };
    r.sim
        .sim
        .provider
        .set_faults(&faults)
        .await
        .expect("injecting neverJoin");
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;

    let took = roll(&r, "img-2", 1).await;
    assert_no_leak(&r).await;
    let instances = r
        .sim
        .sim
        .provider
        .list_instances()
        .await
        .expect("listing instances");
    let stuck: Vec<_> = instances.iter().filter(|i| i.never_join).collect();
    assert_eq!(stuck.len(), 1, "one instance was made never to join");
    assert!(
        matches!(
            stuck[0].state,
            InstanceState::Terminated | InstanceState::Terminating
        ),
        "the instance that never joined is deleted: {:?}",
        stuck[0].state
    );
    let created = instances.iter().filter(|i| i.instance.image == "img-2").count();
    assert_eq!(created, 4, "3 replacements plus the one that never joined");
    println!("rollout with an instance that never joined: {took:?}");
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_image_mid_rollout_wins_and_the_autoscaler_is_paused_meanwhile() {
    let r = setup(
        "mid-rollout",
        &[("cp", "ControlPlane", 1), ("workers", "Worker", 3)],
    )
    .await;
    let env = &r.env;
    // A stand-in cluster-autoscaler Deployment and its strategy.
    env.create_deployment("cluster-autoscaler", 2, json!({RUN_LABEL: env.id}))
        .await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    let strategy: nodewarden::api::update::AutoscalingStrategy = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "AutoscalingStrategy",
        "metadata": {"name": env.name("autoscaling"), "labels": {RUN_LABEL: env.id}},
        "spec": {"enabled": true, "deploymentName": "cluster-autoscaler", "deploymentNamespace": env.namespace},
    }))
    .expect("a strategy");
    let strategies: Api<nodewarden::api::update::AutoscalingStrategy> = Api::all(env.client.clone());
    strategies
        .create(&PostParams::default(), &strategy)
        .await
        .expect("creating the strategy");

    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;

    // Watch the autoscaler's replicas throughout.
    let seen_replicas = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = CancellationToken::new();
    let watcher = {
        let (deployments, seen_replicas, stop) = (deployments.clone(), seen_replicas.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(d) = deployments.get("cluster-autoscaler").await {
                    let replicas = d.spec.and_then(|s| s.replicas).unwrap_or(-1);
                    seen_replicas
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(replicas);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // Start towards img-2; once the first node runs it, ask for img-3.
    let api: Api<NodeVersion> = Api::all(env.client.clone());
    let patch = json!({"spec": {"image": "img-2"}});
    api.patch(
        &env.name("version"),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .expect("img-2");
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for("a first node on img-2", Duration::from_secs(60), || async {
        let on_2 = nodes
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| {
                        n.status
                            .as_ref()
                            .and_then(|s| s.node_info.as_ref())
                            .is_some_and(|i| i.os_image == "img-2")
                    })
                    .count()
            })
            .unwrap_or(0);
        if on_2 > 0 {
            Probe::Done(())
        } else {
            Probe::NotYet("none yet".into())
        }
    })
    .await;
    roll(&r, "img-3", 1).await;
    assert_no_leak(&r).await;

    // The autoscaler came back once every node was current.
    wait_for(
        "the autoscaler restored to 2 replicas",
        Duration::from_secs(30),
        || async {
            match deployments.get("cluster-autoscaler").await {
                Ok(d) if d.spec.as_ref().and_then(|s| s.replicas) == Some(2) => Probe::Done(()),
                Ok(d) => Probe::NotYet(format!("replicas {:?}", d.spec.and_then(|s| s.replicas))),
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
    stop.cancel();
    let _ = watcher.await;
    let seen = seen_replicas.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        seen.contains(&0),
        "the autoscaler was scaled down during the rollout: {seen:?}"
    );
    let strategy = strategies
        .get(&env.name("autoscaling"))
        .await
        .expect("the strategy");
    assert!(strategy.spec.enabled, "the strategy is enabled again");
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}
