//! A rollout that stops itself: new instances of a bad image never join,
//! the rollout halts after `haltAfterFailedJoins` of them in a row with at
//! most maxSurge in flight, touches no old node, removes what it made; the
//! image set back leaves a clean cluster, and a resume after the cause is
//! fixed finishes the rollout (real control plane, sim-cloud).

use crate::support;

use std::time::Duration;

use crate::support::rollout::*;
use crate::support::{Probe, seen, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use nodewarden::api::node_maintenance::medik8s;
use nodewarden::api::update::annotations::HEIR_ANNOTATION;
use nodewarden::api::update::halt::RESUME_ANNOTATION;
use nodewarden::api::update::{NodeVersion, NodeVersionStatus, condition, reason};
use nodewarden::cloud::InstanceState;
use nodewarden::cloud::sim::wire::{Faults, InstanceView};
use serde_json::json;

const BAD: &str = "img-bad";
const THRESHOLD: usize = 2;
const SURGE: usize = 2;

/// The rollout to the bad image until it halted: its status then.
async fn roll_to_a_bad_image(r: &Rollout) -> NodeVersionStatus {
    let env = &r.env;
    set_join_timeout(env, "3s").await;
    let faults = Faults {
        never_join: 1000,
        ..Default::default()
    };
    r.set_faults(&faults).await;
    patch_node_version(
        env,
        json!({"spec": {"image": BAD, "rollout": {"maxSurge": SURGE, "haltAfterFailedJoins": THRESHOLD}}}),
    )
    .await;
    wait_status(env, "the rollout halted", Duration::from_secs(90), |s| {
        degraded(s).is_some_and(|(reason, _)| reason == reason::ROLLOUT_HALTED)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_image_that_never_joins_halts_the_rollout_and_the_way_back_leaves_nothing() {
    let r = setup("halt", &[("workers", "Worker", 4)]).await;
    let env = &r.env;
    let op = r.start_operator().await;
    let old_nodes = node_names(env).await;

    let halted = roll_to_a_bad_image(&r).await;
    let halt = halted.halt.clone().expect("status.halt");
    assert!(halt.failed_joins.len() >= THRESHOLD, "{halt:?}");
    let (_, message) = degraded(&halted).expect("Degraded");
    for node in &halt.failed_joins[..THRESHOLD] {
        assert!(message.contains(node.as_str()), "{node} named: {message}");
    }
    assert!(message.contains("set spec.image back to img-1"), "{message}");
    let progressing = condition_of(&halted, condition::PROGRESSING).expect("Progressing");
    assert_eq!(
        (progressing.status.as_str(), progressing.reason.as_str()),
        ("False", reason::ROLLOUT_HALTED)
    );
    env.wait_events("NodeVersion", &env.name("version"), &["RolloutHalted"])
        .await;

    // Halted: well past the join timeout nothing new is made, what was in
    // flight (at most maxSurge beyond the failures counted) goes, and no
    // old node was touched.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let bad = r.instances_of(BAD).await;
    assert!(
        bad.len() < THRESHOLD + SURGE,
        "at most {} instances of the bad image: {:?}",
        THRESHOLD + SURGE - 1,
        names(&bad)
    );
    wait_bad_instances_gone(&r).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        r.instances_of(BAD).await.len(),
        bad.len(),
        "no instance made while halted"
    );
    assert_old_nodes_untouched(env, &old_nodes).await;

    // The way back: the image set back. Nothing is left to do or to remove.
    patch_node_version(env, json!({"spec": {"image": "img-1"}})).await;
    let back = settled_back(env).await;
    assert_eq!(back.halt, None, "the halt record of the bad image is gone");
    assert!(back.outdated.is_empty() && back.pending.is_empty(), "{back:?}");
    assert_eq!(node_names(env).await, old_nodes, "the same nodes as before");
    assert_no_leak(&r).await;
    r.finish(op).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halted_rollout_resumed_after_its_cause_is_fixed_finishes() {
    let r = setup("resume", &[("workers", "Worker", 3)]).await;
    let env = &r.env;
    let op = r.start_operator().await;
    roll_to_a_bad_image(&r).await;

    // The cause fixed (the cloud boots the image now), the rollout resumed.
    r.set_faults(&Faults::default()).await;
    patch_node_version(
        env,
        json!({"metadata": {"annotations": {RESUME_ANNOTATION: "1"}}}),
    )
    .await;
    let done = wait_status(env, "the rollout finished", Duration::from_secs(120), |s| {
        condition_of(s, condition::PROGRESSING).is_some_and(|c| c.reason == reason::ROLLOUT_COMPLETE)
    })
    .await;
    let halt = done.halt.expect("the record keeps the resume honoured");
    assert!(!halt.is_halted() && halt.failed_joins.is_empty(), "{halt:?}");
    assert_eq!(halt.resumed_with.as_deref(), Some("1"));
    env.wait_events("NodeVersion", &env.name("version"), &["RolloutResumed"])
        .await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let listed = nodes
        .list(&ListParams::default().labels(&env.run_selector()))
        .await
        .expect("nodes");
    assert_eq!(listed.items.len(), 3);
    assert!(
        listed.items.iter().all(|n| runs_image(n, BAD)),
        "every node on the image"
    );
    assert_no_leak(&r).await;
    r.finish(op).await;
}

/// The NodeVersion's status once `done` holds for it.
/// The status once the rollout is back at img-1, complete and not degraded.
async fn settled_back(env: &support::TestEnv) -> NodeVersionStatus {
    let settled = |s: &NodeVersionStatus| {
        degraded(s).is_none()
            && condition_of(s, condition::PROGRESSING).is_some_and(|c| c.reason == reason::ROLLOUT_COMPLETE)
    };
    wait_status(
        env,
        "the rollout back at img-1, settled",
        Duration::from_secs(60),
        settled,
    )
    .await
}

async fn wait_status(
    env: &support::TestEnv,
    what: &str,
    limit: Duration,
    done: impl Fn(&NodeVersionStatus) -> bool,
) -> NodeVersionStatus {
    let api: Api<NodeVersion> = Api::all(env.client.clone());
    let name = env.name("version");
    wait_for(what, limit, || async {
        match api.get(&name).await {
            Ok(nv) => match nv.status.unwrap_or_default() {
                s if done(&s) => Probe::Done(s),
                s => Probe::NotYet(format!("{:?} halt {:?}", s.rollout_conditions, s.halt)),
            },
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

fn condition_of<'a>(
    s: &'a NodeVersionStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.rollout_conditions.iter().find(|c| c.type_ == type_)
}

/// Degraded's reason and message when it is True.
fn degraded(s: &NodeVersionStatus) -> Option<(String, String)> {
    condition_of(s, condition::DEGRADED)
        .filter(|c| c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

fn names(instances: &[InstanceView]) -> Vec<(String, InstanceState)> {
    instances
        .iter()
        .map(|i| (i.instance.name.clone(), i.state))
        .collect()
}

async fn wait_bad_instances_gone(r: &Rollout) {
    wait_for(
        "every instance of the bad image deleted",
        Duration::from_secs(30),
        || async {
            let bad = r.instances_of(BAD).await;
            let live: Vec<_> = bad
                .iter()
                .filter(|i| !matches!(i.state, InstanceState::Terminated | InstanceState::Terminating))
                .collect();
            match live.is_empty() {
                true => Probe::Done(()),
                false => Probe::NotYet(format!("{:?}", names(&bad))),
            }
        },
    )
    .await;
}

/// The old nodes are all there, schedulable, paired with no heir, and no
/// NodeMaintenance drains any of them.
async fn assert_old_nodes_untouched(env: &support::TestEnv, old: &std::collections::BTreeSet<String>) {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let listed = nodes
        .list(&ListParams::default().labels(&env.run_selector()))
        .await
        .expect("nodes");
    let names: std::collections::BTreeSet<String> = listed.items.iter().map(|n| n.name_any()).collect();
    assert_eq!(&names, old, "no node added or removed");
    for n in &listed.items {
        let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        assert!(!cordoned, "{} cordoned", n.name_any());
        assert!(
            !n.annotations().contains_key(HEIR_ANNOTATION),
            "{} paired",
            n.name_any()
        );
    }
    let maintenances: Vec<String> = Api::<medik8s::NodeMaintenance>::all(env.client.clone())
        .list(&ListParams::default())
        .await
        .expect("NodeMaintenances")
        .items
        .into_iter()
        .map(|m| m.spec.node_name)
        .filter(|node| old.contains(node))
        .collect();
    assert!(maintenances.is_empty(), "drains requested: {maintenances:?}");
}

/// A DaemonSet over the workers (a node agent: a CNI or monitoring
/// daemon is what a new kernel breaks first), its pods Ready everywhere.
async fn node_agent(env: &support::TestEnv, name: &str, nodes: i32) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use kube::api::PostParams;
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {support::RUN_LABEL: env.id, "node-role.kubernetes.io/worker": ""},
                    "containers": [{"name": "agent", "image": "registry.invalid/agent:1"}],
                },
            },
        },
    }))
    .expect("a daemonset");
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), &env.namespace);
    api.create(&PostParams::default(), &ds)
        .await
        .expect("creating a daemonset");
    wait_for(
        &format!("{name} ready on {nodes} nodes"),
        Duration::from_secs(60),
        || async {
            match api.get(name).await {
                Ok(d) if d.status.as_ref().map(|s| s.number_ready) == Some(nodes) => Probe::Done(()),
                Ok(d) => Probe::NotYet(format!("{:?}", d.status)),
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
}

/// The agent's pod on the first wave's node is broken as soon as it is
/// Ready (before the wave ends: the pod starts as the node joins), and the
/// soak outlasts a look at the pods (it stands for 2 s): the second wave
/// never starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_breaks_workloads_halts_after_the_first_wave_and_the_way_back_restores_it() {
    const BREAKS: &str = "img-breaks";
    let r = setup("unready", &[("workers", "Worker", 5)]).await;
    let env = &r.env;
    node_agent(env, "agent", 5).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let kubelets = break_pods_on_image(env, BREAKS, stop.clone());
    let op = r.start_operator().await;
    let old_nodes = node_names(env).await;

    patch_node_version(
        env,
        json!({"spec": {"image": BREAKS, "rollout": {"maxSurge": 1, "waves": [1, "100%"], "soakTime": "6s",
               "podReadyTimeout": "3s", "haltAfterUnreadyPods": 1}}}),
    )
    .await;
    let halted = wait_status(env, "the rollout halted", Duration::from_secs(90), |s| {
        degraded(s).is_some_and(|(reason, _)| reason == reason::ROLLOUT_HALTED)
    })
    .await;
    let halt = halted.halt.clone().expect("status.halt");
    assert!(
        halt.failed_joins.is_empty() && !halt.unready_pods.is_empty(),
        "{halt:?}"
    );
    let (_, message) = degraded(&halted).expect("Degraded");
    assert!(
        message.contains("stayed unready past spec.rollout.podReadyTimeout"),
        "{message}"
    );
    assert!(
        message.contains(&halt.unready_pods[0]),
        "the evidence named: {message}"
    );
    assert!(message.contains("(DaemonSet agent)"), "{message}");
    env.wait_events("NodeVersion", &env.name("version"), &["RolloutHalted"])
        .await;

    // Halted after the first wave: one node on the image, no other made.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let made = r.instances_of(BREAKS).await;
    assert_eq!(
        made.len(),
        1,
        "the first wave's one instance only: {:?}",
        names(&made)
    );
    let first_wave = made[0].instance.name.clone();
    let now = node_names(env).await;
    assert_eq!(now.len(), 5);
    assert_eq!(
        old_nodes.difference(&now).count(),
        1,
        "one old node replaced: {now:?}"
    );

    // The way back: the first wave's node returns to the old image, the
    // halt record goes with the bad target.
    let took = roll_nodes(env, 5, "img-1", None).await;
    let back = settled_back(env).await;
    assert_eq!(back.halt, None, "{back:?}");
    assert!(
        !node_names(env).await.contains(&first_wave),
        "the first wave's node replaced back"
    );
    stop.cancel();
    let broken = kubelets.await.expect("the bad kubelets");
    println!(
        "halted with {} pod(s) unready after the first wave ({broken} broken); back to img-1 in {took:?}",
        halt.unready_pods.len()
    );
    assert_no_leak(&r).await;
    r.finish(op).await;
}
