//! Rolling replacement end to end: the real control plane, kwok nodes, the
//! sim-cloud as a separate process, nodewarden's controllers in-process, and
//! a checker watching the rollout invariants throughout (`support::rollout::check`).

use crate::support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::rollout::*;
use crate::support::{Probe, RUN_LABEL, seen, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use nodewarden::api::update::{NodeVersion, condition, reason};
use nodewarden::cloud::CloudProvider;
use nodewarden::cloud::InstanceState;
use nodewarden::controllers::node_maintenance::MaintenanceConfig;
use nodewarden::controllers::node_version::STATUS_LIST_LIMIT;
use serde_json::json;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_nodes_are_replaced_without_breaching_an_invariant_and_surge_3_replaces_three_at_once() {
    let r = setup("rollout", &[("cp", "ControlPlane", 3), ("workers", "Worker", 9)]).await;
    let env = &r.env;
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;
    workload(env, "web", 6).await;
    workload(env, "api", 3).await;

    let checker = Checker::start(env, 12, 1);
    let log = ConditionLog::start(env, &env.name("version"));

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
    let peak_one = checker.take_peak_surge();
    checker.set_surge(3);
    let three = roll(&r, "img-3", 3).await;
    assert_no_leak(&r).await;
    let peak_three = checker.take_peak_surge();
    let found = checker.finish().await;

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
    wait_none_left::<nodewarden::api::node_maintenance::medik8s::NodeMaintenance>(env).await;
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    // The conditions told the rollout's story as it went.
    for (type_, reason) in [
        (condition::OUTDATED, reason::NODE_VERSIONS_OUT_OF_DATE),
        (condition::OUTDATED, reason::NODE_VERSIONS_UP_TO_DATE),
        (condition::PROGRESSING, reason::WAITING_FOR_CONTROL_PLANE),
        (condition::PROGRESSING, reason::REPLACING_NODES),
        (condition::PROGRESSING, reason::ROLLOUT_COMPLETE),
        (condition::DEGRADED, reason::AS_EXPECTED),
    ] {
        assert!(
            log.saw(type_, reason),
            "{type_}={reason} never shown: {:?}",
            log.all()
        );
    }
    // The surge is judged by what was in flight at once, not by the clock:
    // under a loaded machine one wave can take longer than the whole of
    // another rollout (the times are printed above; benches/rollout.rs
    // measures them against the ideal).
    assert!(
        peak_three >= 3,
        "maxSurge 3 never had 3 replacements in flight at once (peak {peak_three}; {peak_one} at maxSurge 1)"
    );
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
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
    let faults = nodewarden::cloud::sim::wire::Faults {
        never_join: 1,
        ..Default::default()
    };
    r.set_faults(&faults).await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;
    let log = ConditionLog::start(env, &env.name("version"));

    let took = roll(&r, "img-2", 1).await;
    assert_no_leak(&r).await;
    assert!(
        log.saw(condition::DEGRADED, reason::JOIN_TIMEOUT),
        "Degraded=JoinTimeout never shown: {:?}",
        log.all()
    );
    env.wait_events(
        "NodeVersion",
        &env.name("version"),
        &["RolloutBlocked", "RolloutFinished"],
    )
    .await;
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

    // Managed nodes no ScalingGroup covers (no provider ID) are named. More
    // of them than a status list holds: the list names the first 100 and
    // `listTotals` says how many there are.
    let strays = env.create_kwok_nodes(STATUS_LIST_LIMIT + 1, &[]).await;
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    let total = strays.len() as u32;
    let status = wait_for("every stray node counted", Duration::from_secs(30), || async {
        match versions.get(&env.name("version")).await {
            Ok(v) => match v.status.unwrap_or_default() {
                s if s.list_totals.get("invalid") == Some(&total) => Probe::Done(s),
                s => Probe::NotYet(format!("{:?}", s.list_totals)),
            },
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let degraded = status
        .rollout_conditions
        .iter()
        .find(|c| c.type_ == condition::DEGRADED);
    let message = degraded
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default();
    assert_eq!(message.0, reason::INVALID_NODES);
    assert!(
        message
            .1
            .starts_with(&format!("{total} node(s) belong to no ScalingGroup")),
        "{message:?}"
    );
    assert_eq!(status.invalid.len(), STATUS_LIST_LIMIT);
    assert!(
        status
            .invalid
            .iter()
            .all(|r| strays.iter().any(|s| r.name.as_deref() == Some(s.as_str()))),
        "{:?}",
        status.invalid
    );
    assert_eq!(
        status.list_totals.get("invalid"),
        Some(&(strays.len() as u32)),
        "{:?}",
        status.list_totals
    );
    assert_eq!(
        status.list_totals.get("upToDate"),
        Some(&3),
        "{:?}",
        status.list_totals
    );
    let nodes = Api::<Node>::all(env.client.clone());
    for stray in &strays {
        nodes
            .delete(stray, &Default::default())
            .await
            .expect("deleting a stray node");
    }
    let wanted = (condition::DEGRADED, "False", reason::AS_EXPECTED);
    support::wait_for_condition(&versions, &env.name("version"), wanted, Duration::from_secs(30)).await;
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

/// What a leader killed at the worst moments leaves behind, made by hand,
/// then a fresh operator: it must finish every half-done step and end with
/// exactly the nodes it started with, all current, nothing leaked.
/// - a pairing half written: the heir names its donor, the donor no heir;
/// - a pairing done whose PendingNode was not deleted yet;
/// - a PendingNode written, its cloud create never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_resumes_from_the_states_a_killed_leader_leaves() {
    use nodewarden::api::update::PendingNode;
    use nodewarden::cloud::CreateNodeRequest;

    let r = setup("resume", &[("workers", "Worker", 3)]).await;
    let env = &r.env;
    let group = r.groups[0].0.clone();
    let old: Vec<String> = node_names(env).await.into_iter().collect();
    let provider = &r.sim.sim.provider;
    provider
        .set_group_image(&group, "img-2")
        .await
        .expect("the group's new image");
    let nv_patch = json!({"spec": {"image": "img-2", "rollout": {"maxSurge": 3}}});
    Api::<NodeVersion>::all(env.client.clone())
        .patch(
            &env.name("version"),
            &PatchParams::default(),
            &Patch::Merge(&nv_patch),
        )
        .await
        .expect("the new image");

    // Two new nodes, created as the dead leader would have.
    let pending: Api<PendingNode> = Api::all(env.client.clone());
    let nodes: Api<Node> = Api::all(env.client.clone());
    let deadline =
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second() + 600)
            .expect("a time")
            .to_string();
    let mut heirs = Vec::new();
    for name in ["join-half", "join-left"] {
        let pn_name = env.name(name);
        let created = provider
            .create_node(&CreateNodeRequest::new(&group).with_request_id(&pn_name))
            .await
            .expect("an instance");
        let pn: PendingNode = serde_json::from_value(json!({
            "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "PendingNode",
            "metadata": {"name": pn_name, "labels": {RUN_LABEL: env.id}},
            "spec": {"providerID": created.provider_id, "groupID": group, "nodeName": created.node_name,
                     "goal": "Join", "deadline": deadline},
        }))
        .expect("a PendingNode");
        pending
            .create(&PostParams::default(), &pn)
            .await
            .expect("creating");
        heirs.push(created.node_name);
    }
    for heir in &heirs {
        wait_for(&format!("{heir} Ready"), Duration::from_secs(60), || async {
            match nodes.get_opt(heir).await {
                Ok(Some(n)) if support::node_is_ready(&n) => Probe::Done(()),
                Ok(_) => Probe::NotYet("not Ready".into()),
                Err(e) => Probe::NotYet(seen(e)),
            }
        })
        .await;
    }
    let annotate = |node: String, annotations: serde_json::Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"annotations": annotations}})),
                )
                .await
                .expect("annotating");
        }
    };
    const DONOR: &str = "constellation.edgeless.systems/donor";
    const HEIR: &str = "constellation.edgeless.systems/heir";
    // Half written: only the heir's side.
    annotate(heirs[0].clone(), json!({DONOR: old[0]})).await;
    // Both sides written, the PendingNode left.
    annotate(heirs[1].clone(), json!({DONOR: old[1]})).await;
    annotate(old[1].clone(), json!({HEIR: heirs[1]})).await;
    // A create written down but never sent.
    let never_sent: PendingNode = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "PendingNode",
        "metadata": {"name": env.name("join-unsent"), "labels": {RUN_LABEL: env.id}},
        "spec": {"groupID": group, "goal": "Join", "deadline": deadline},
    }))
    .expect("a PendingNode");
    pending
        .create(&PostParams::default(), &never_sent)
        .await
        .expect("creating");

    // 3 nodes, 2 heirs and 1 instance on its way: surge 3 from the start.
    let checker = Checker::start(env, 3, 3);
    let cloud: Arc<dyn CloudProvider> = Arc::new(provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;
    wait_for("three nodes, all on img-2", Duration::from_secs(120), || async {
        let names = node_names(env).await;
        let list = nodes
            .list(&ListParams::default().labels(&env.run_selector()))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let current = list
            .iter()
            .filter(|n| runs_image(n, "img-2") && support::node_is_ready(n))
            .count();
        if names.len() == 3 && current == 3 && old.iter().all(|o| !names.contains(o)) {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("{names:?}, {current} on img-2"))
        }
    })
    .await;
    assert!(
        node_names(env).await.contains(&heirs[0]),
        "the half-paired heir replaced its donor"
    );
    assert_no_leak(&r).await;
    wait_none_left::<PendingNode>(env).await;
    let found = checker.finish().await;
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}

/// Plays Constellation's join service until stopped: every node of the run
/// without a components annotation gets a JoiningNode naming the components
/// the NodeVersion asks for now (with a deadline), as a node that joins is
/// given them. Returns how many JoiningNodes it made.
async fn join_service(client: kube::Client, run_id: String, stop: CancellationToken) -> usize {
    use nodewarden::api::update::JoiningNode;
    use nodewarden::controllers::node_version::COMPONENTS_ANNOTATION;
    let nodes: Api<Node> = Api::all(client.clone());
    let versions: Api<NodeVersion> = Api::all(client.clone());
    let joining: Api<JoiningNode> = Api::all(client);
    let selector = format!("{RUN_LABEL}={run_id}");
    let mut made = BTreeSet::new();
    while !stop.is_cancelled() {
        let wanted = versions
            .get(&format!("{run_id}-version"))
            .await
            .map(|v| v.spec.kubernetes_components_reference)
            .unwrap_or_default();
        if let Ok(list) = nodes.list(&ListParams::default().labels(&selector)).await {
            for n in list.items {
                let name = n.name_any();
                if n.annotations().contains_key(COMPONENTS_ANNOTATION) || made.contains(&name) {
                    continue;
                }
                let deadline =
                    k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(300);
                let jn: JoiningNode = serde_json::from_value(json!({
                    "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "JoiningNode",
                    "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
                    "spec": {"name": name, "componentsreference": wanted, "deadline": deadline.to_string()},
                }))
                .expect("a JoiningNode");
                if joining.create(&PostParams::default(), &jn).await.is_ok() {
                    made.insert(name);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    made.len()
}

/// A new `kubernetesComponentsReference` replaces every node as a new image
/// does; each new node gets its components through a JoiningNode (its
/// annotation set by nodewarden, the JoiningNode then removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_kubernetes_components_roll_every_node_through_joining_nodes() {
    use nodewarden::api::update::JoiningNode;
    use nodewarden::controllers::node_version::COMPONENTS_ANNOTATION;
    let r = setup(
        "components",
        &[("cp", "ControlPlane", 1), ("workers", "Worker", 3)],
    )
    .await;
    let env = &r.env;
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    let components = |c: &str| json!({"spec": {"kubernetesComponentsReference": c}});
    versions
        .patch(
            &env.name("version"),
            &PatchParams::default(),
            &Patch::Merge(&components("k8s-components-1")),
        )
        .await
        .expect("the first components");
    let stop = CancellationToken::new();
    let service = tokio::spawn(join_service(env.client.clone(), env.id.clone(), stop.clone()));
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let on = |want: &'static str| {
        let (nodes, selector) = (nodes.clone(), env.run_selector());
        async move {
            match nodes.list(&ListParams::default().labels(&selector)).await {
                Ok(l) => {
                    let current = l
                        .items
                        .iter()
                        .filter(|n| {
                            n.annotations().get(COMPONENTS_ANNOTATION).map(String::as_str) == Some(want)
                        })
                        .count();
                    match (current, l.items.len()) {
                        (4, 4) => Probe::Done(l.items.iter().map(|n| n.name_any()).collect::<BTreeSet<_>>()),
                        (c, t) => Probe::NotYet(format!("{c} of {t} nodes on {want}")),
                    }
                }
                Err(e) => Probe::NotYet(seen(e)),
            }
        }
    };
    let before = wait_for("4 nodes on k8s-components-1", Duration::from_secs(60), || {
        on("k8s-components-1")
    })
    .await;
    let checker = Checker::start(env, 4, 1);
    versions
        .patch(
            &env.name("version"),
            &PatchParams::default(),
            &Patch::Merge(&components("k8s-components-2")),
        )
        .await
        .expect("new components");
    let after = wait_for("4 nodes on k8s-components-2", Duration::from_secs(120), || {
        on("k8s-components-2")
    })
    .await;
    let found = checker.finish().await;
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    assert!(
        before.is_disjoint(&after),
        "every node was replaced: {before:?} then {after:?}"
    );
    stop.cancel();
    let made = service.await.expect("the join service");
    assert_eq!(made, 8, "a JoiningNode per node: 4 at the start, 4 replacements");
    wait_none_left::<JoiningNode>(env).await;
    assert_no_leak(&r).await;
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}

/// What the constellation CLI does to a NodeVersion, and what it reads back:
/// `apply` reads the object into its own struct (which drops `rollout` and
/// `maxNodeBudget`) and writes the whole object back; `status` and
/// `upgrade check` require exactly one condition and show its message. A
/// rollout with the operator's surge as its default keeps that surge when
/// the write lands mid-rollout, and the CLI's reading holds during and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_constellation_clis_whole_object_write_mid_rollout_keeps_the_surge() {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let r = setup("cli-write", &[("workers", "Worker", 6)]).await;
    let env = &r.env;
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let mut config = env.operator_config(MaintenanceConfig::default(), Some(cloud), "operator");
    config.rollout.max_surge = Some(IntOrString::Int(2));
    let op = env.start_operator_from(config).await;
    let checker = Checker::start(env, 6, 2);
    let api: Api<NodeVersion> = Api::all(env.client.clone());
    let name = env.name("version");

    // What the CLI's NewNodeVersion asserts, on the object as it is now.
    let cli_reads = |nv: &NodeVersion| -> Result<String, String> {
        let conditions = nv
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        match conditions.as_slice() {
            [one] => Ok(one.message.clone()),
            other => Err(format!("expected exactly one condition, got {}", other.len())),
        }
    };
    let rollout = roll_nodes(env, 6, "img-2", Some(2));
    let cli = async {
        // Mid-rollout: a replacement in flight.
        wait_for("a replacement in flight", Duration::from_secs(60), || async {
            match api.get(&name).await {
                Ok(nv) if nv.status.as_ref().and_then(|s| s.replacing).unwrap_or(0) > 0 => Probe::Done(()),
                Ok(nv) => Probe::NotYet(format!("{:?}", nv.status.and_then(|s| s.progress))),
                Err(e) => Probe::NotYet(seen(e)),
            }
        })
        .await;
        // `constellation apply`: read, drop what it does not know, write it all back.
        wait_for("the whole-object write", Duration::from_secs(30), || async {
            let mut nv = match api.get(&name).await {
                Ok(nv) => nv,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            nv.spec.rollout = Default::default();
            nv.spec.max_node_budget = None;
            match api.replace(&name, &PostParams::default(), &nv).await {
                Ok(_) => Probe::Done(()),
                Err(e) => Probe::NotYet(seen(e)),
            }
        })
        .await;
        let written = api.get(&name).await.expect("the NodeVersion");
        assert!(written.spec.rollout.is_unset(), "{:?}", written.spec.rollout);
        // The operator's surge is in force, and says so; the CLI still reads it.
        wait_for(
            "the operator's settings in force",
            Duration::from_secs(30),
            || async {
                let nv = match api.get(&name).await {
                    Ok(nv) => nv,
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                let settings = nv
                    .status
                    .iter()
                    .flat_map(|s| s.rollout_conditions.iter())
                    .find(|c| {
                        c.type_ == condition::ROLLOUT_SETTINGS
                            && c.observed_generation == nv.metadata.generation
                    })
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                match (settings.starts_with("maxSurge 2 (operator)"), cli_reads(&nv)) {
                    (true, Ok(message)) => Probe::Done(message),
                    (_, read) => Probe::NotYet(format!("settings {settings:?}, CLI {read:?}")),
                }
            },
        )
        .await
    };
    let (_, during) = tokio::join!(rollout, cli);
    assert!(
        during == "Some node versions are out of date"
            || during == "Node version of every node is up to date",
        "{during}"
    );
    wait_for("the CLI's status once done", Duration::from_secs(30), || async {
        match api.get(&name).await.map_err(seen).and_then(|nv| cli_reads(&nv)) {
            Ok(m) if m == "Node version of every node is up to date" => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    assert_no_leak(&r).await;
    let peak = checker.peak_surge();
    let found = checker.finish().await;
    assert!(found.is_empty(), "invariants breached: {found:#?}");
    assert!(peak <= 2, "peak surge {peak}");
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}

/// Switching from Constellation's operator mid-rollout: it paired a donor
/// with a Ready heir and asked for the donor's drain with a NodeMaintenance
/// named as the node (taken up by its Node Maintenance Operator). nodewarden
/// adopts that maintenance as the donor's drain (no second one, which its
/// webhook would refuse), retires the donor and finishes the rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_mid_rollout_adopts_upstreams_maintenance_of_the_donor() {
    use nodewarden::api::node_maintenance::medik8s;
    use nodewarden::cloud::CreateNodeRequest;

    let r = setup("switch-mid", &[("workers", "Worker", 2)]).await;
    let env = &r.env;
    let group = r.groups[0].0.clone();
    let old: Vec<String> = node_names(env).await.into_iter().collect();
    let provider = &r.sim.sim.provider;
    provider
        .set_group_image(&group, "img-2")
        .await
        .expect("the group's new image");
    Api::<NodeVersion>::all(env.client.clone())
        .patch(
            &env.name("version"),
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"image": "img-2"}})),
        )
        .await
        .expect("the new image");
    // The heir upstream made, Ready and paired (its PendingNode gone).
    let heir = provider
        .create_node(&CreateNodeRequest::new(&group).with_request_id(env.name("heir")))
        .await
        .expect("an instance")
        .node_name;
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_for(&format!("{heir} Ready"), Duration::from_secs(60), || async {
        match nodes.get_opt(&heir).await {
            Ok(Some(n)) if support::node_is_ready(&n) => Probe::Done(()),
            Ok(_) => Probe::NotYet("not Ready".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let donor = old[0].clone();
    for (node, key, value) in [
        (&heir, "constellation.edgeless.systems/donor", &donor),
        (&donor, "constellation.edgeless.systems/heir", &heir),
    ] {
        nodes
            .patch(
                node,
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"annotations": {key: value}}})),
            )
            .await
            .expect("annotating");
    }
    // Upstream's drain request, with its Node Maintenance Operator's finalizer.
    let upstream: medik8s::NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": donor, "labels": {RUN_LABEL: env.id},
                     "finalizers": ["foregroundDeleteNodeMaintenance"]},
        "spec": {"nodeName": donor},
    }))
    .expect("a NodeMaintenance");
    let maintenances: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    maintenances
        .create(&PostParams::default(), &upstream)
        .await
        .expect("creating upstream's maintenance");

    // Every maintenance name seen while nodewarden works.
    let seen_names = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = CancellationToken::new();
    let watching = {
        let (seen_names, stop, api) = (seen_names.clone(), stop.clone(), maintenances.clone());
        let selector = env.run_selector();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if let Ok(list) = api.list(&ListParams::default().labels(&selector)).await {
                    let mut names = seen_names.lock().expect("the set");
                    names.extend(list.items.iter().map(|m| m.name_any()));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let cloud: Arc<dyn CloudProvider> = Arc::new(provider.clone());
    let op = env
        .start_operator_with(MaintenanceConfig::default(), Some(cloud), "operator")
        .await;
    wait_for("the donor retired", Duration::from_secs(120), || async {
        match nodes.get_opt(&donor).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(_)) => Probe::NotYet("still there".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    roll(&r, "img-2", 1).await;
    stop.cancel();
    let _ = watching.await;
    let names = seen_names.lock().expect("the set").clone();
    assert!(
        !names.contains(&format!("nodewarden-replace-{donor}")),
        "no second maintenance of the donor: {names:?}"
    );
    assert!(names.contains(&donor), "{names:?}");
    assert!(
        node_names(env).await.contains(&heir),
        "the donor's heir stays as its replacement"
    );
    assert_no_leak(&r).await;
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}

/// A Kubernetes upgrade as `constellation apply` makes it (a new components
/// ConfigMap, then `kubernetesClusterVersion` and its reference on the
/// NodeVersion): nodewarden sends the version and the upgradable components
/// to the upgrade-agent on its socket (a fake from the same contract, with
/// a kubeadm stub), with `status.activeclusterversionupgrade` true while it
/// runs, and replaces no node until the control plane is upgraded; then
/// every node is replaced and the flag is false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_kubernetes_version_upgrades_the_control_plane_before_any_node_is_replaced() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use nodewarden::controllers::node_version::COMPONENTS_ANNOTATION;
    use nodewarden::upgrade_agent::AgentClient;
    use support::upgrade_agent::FakeAgent;

    let r = setup(
        "cp-upgrade",
        &[("cp", "ControlPlane", 1), ("workers", "Worker", 2)],
    )
    .await;
    let env = &r.env;
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    let nv = env.name("version");
    let old_components = env.name("components-1");
    versions
        .patch(
            &nv,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"kubernetesComponentsReference": old_components}})),
        )
        .await
        .expect("the first components");
    let stop = CancellationToken::new();
    let service = tokio::spawn(join_service(env.client.clone(), env.id.clone(), stop.clone()));
    // kubeadm takes 3 s a run: the flag is seen while it runs.
    let agent = FakeAgent::start(3, "v0.0.0-never");
    let cloud: Arc<dyn CloudProvider> = Arc::new(r.sim.sim.provider.clone());
    let mut config = env.operator_config(MaintenanceConfig::default(), Some(cloud), "operator");
    config.upgrade_agent = Some(AgentClient::new(agent.socket.clone(), Duration::from_secs(60)));
    let op = env.start_operator_from(config).await;
    let before = wait_for("3 nodes with components", Duration::from_secs(60), || async {
        let names = node_names(env).await;
        let annotated = Api::<Node>::all(env.client.clone())
            .list(&ListParams::default().labels(&env.run_selector()))
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|n| n.annotations().contains_key(COMPONENTS_ANNOTATION))
                    .count()
            })
            .unwrap_or_default();
        match annotated == 3 {
            true => Probe::Done(names),
            false => Probe::NotYet(format!("{annotated} of 3 annotated")),
        }
    })
    .await;

    // What `constellation apply` writes: the components, then the NodeVersion.
    let served = env
        .client
        .apiserver_version()
        .await
        .expect("the API server's version")
        .git_version;
    let wanted = "v1.99.0";
    let new_components = env.name("components-2");
    let components = json!([
        {"url": "https://example.invalid/kubelet", "hash": "sha256:01", "install_path": "/run/state/bin/kubelet"},
        {"url": "https://example.invalid/kubeadm", "hash": "sha256:02", "install_path": "/run/state/bin/kubeadm"},
        {"url": "data:application/json;base64,W10=", "install_path": "/opt/kubernetes/patches/kube-apiserver+json.json"},
    ]);
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": new_components, "namespace": "kube-system", "labels": {RUN_LABEL: env.id}},
        "immutable": true,
        "data": {"components": components.to_string(), "cluster-version": wanted},
    }))
    .expect("a ConfigMap");
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), "kube-system");
    maps.create(&PostParams::default(), &cm)
        .await
        .expect("the components ConfigMap");
    versions
        .patch(
            &nv,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"kubernetesComponentsReference": new_components, "kubernetesClusterVersion": wanted}})),
        )
        .await
        .expect("the new Kubernetes version");

    // While the agent runs: the flag is true and every old node is there.
    let first_new = Arc::new(Mutex::new(None::<std::time::Instant>));
    let flag_seen = Arc::new(Mutex::new(Vec::<bool>::new()));
    let watching = {
        let (first_new, flag_seen, stop) = (first_new.clone(), flag_seen.clone(), stop.clone());
        let (versions, nv, before) = (versions.clone(), nv.clone(), before.clone());
        let client = env.client.clone();
        let selector = env.run_selector();
        tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(client);
            while !stop.is_cancelled() {
                if let Ok(v) = versions.get(&nv).await {
                    let flag = v
                        .status
                        .map(|s| s.active_cluster_version_upgrade)
                        .unwrap_or_default();
                    let mut seen = flag_seen.lock().expect("flags");
                    if seen.last() != Some(&flag) {
                        seen.push(flag);
                    }
                }
                if let Ok(l) = nodes.list(&ListParams::default().labels(&selector)).await
                    && l.items.iter().any(|n| !before.contains(&n.name_any()))
                {
                    first_new
                        .lock()
                        .expect("time")
                        .get_or_insert_with(std::time::Instant::now);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    wait_for(
        "every node replaced, on the new components",
        Duration::from_secs(180),
        || async {
            let list = Api::<Node>::all(env.client.clone())
                .list(&ListParams::default().labels(&env.run_selector()))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let on_new = list
                .iter()
                .filter(|n| n.annotations().get(COMPONENTS_ANNOTATION) == Some(&new_components))
                .count();
            match (
                on_new,
                list.len(),
                list.iter().any(|n| before.contains(&n.name_any())),
            ) {
                (3, 3, false) => Probe::Done(()),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    let nv_now = versions.get(&nv).await.expect("the NodeVersion");
    assert!(
        !nv_now
            .status
            .as_ref()
            .is_some_and(|s| s.active_cluster_version_upgrade),
        "activeclusterversionupgrade is false after"
    );
    stop.cancel();
    let _ = watching.await;
    let _ = service.await;

    let calls = agent.calls();
    assert_eq!(calls.len(), 1, "one upgrade: {calls:?}");
    let call = &calls[0];
    assert_eq!(call.status, 0);
    assert_eq!(call.request.wanted_kubernetes_version, wanted);
    let sent: Vec<&str> = call
        .request
        .kubernetes_components
        .iter()
        .map(|c| c.install_path.as_str())
        .collect();
    assert_eq!(
        sent,
        [
            "/run/state/bin/kubeadm",
            "/opt/kubernetes/patches/kube-apiserver+json.json"
        ],
        "kubeadm and its patches, as upstream sends them"
    );
    assert_eq!(
        agent.kubeadm_runs(),
        [
            format!(
                "upgrade plan --ignore-preflight-errors CoreDNSMigration,CoreDNSUnsupportedPlugins {wanted}"
            ),
            format!(
                "upgrade apply --yes --patches /opt/kubernetes/patches --ignore-preflight-errors CoreDNSMigration,CoreDNSUnsupportedPlugins {wanted}"
            ),
        ]
    );
    let first_new = first_new.lock().expect("time").expect("a new node appeared");
    assert!(
        call.ended <= first_new,
        "the control plane was upgraded ({:?}) before the first node was replaced ({:?})",
        call.ended,
        first_new
    );
    let flags = flag_seen.lock().expect("flags").clone();
    assert!(
        flags.windows(2).any(|w| w == [true, false]),
        "activeclusterversionupgrade true while the agent ran, false after: {flags:?}"
    );
    env.wait_events(
        "NodeVersion",
        &nv,
        &["ControlPlaneUpgradeStarted", "ControlPlaneUpgraded"],
    )
    .await;
    println!(
        "the API server served {served}; control plane upgraded to {wanted} in {:?}",
        call.ended - call.started
    );
    maps.delete(&new_components, &Default::default())
        .await
        .expect("deleting the ConfigMap");
    op.stop().await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}
