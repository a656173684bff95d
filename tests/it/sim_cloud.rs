//! `nodewarden-simcloud` as a real child process against the real local
//! control plane, driven through the `sim` provider: instances boot, join as
//! kwok Nodes, terminate, take the group's image, misbehave on request, and
//! survive a kill -9 of the sim-cloud.

use crate::support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::{Probe, RUN_LABEL, TestEnv, node_is_ready, seen, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use nodewarden::cloud::sim::SimProvider;
use nodewarden::cloud::sim::wire::{Faults, InstanceView};
use nodewarden::cloud::{CloudError, CloudProvider, CreateNodeRequest, GroupRole, InstanceState};
use nodewarden_simcloud::nodes::SCALING_GROUP_LABEL;

const TIMEOUT: Duration = Duration::from_secs(60);

use crate::support::sim::SimCloud;

/// A temp directory with a config of one group and a state file path.
struct Files {
    _dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
}

/// Writes a config with one group `<env.id>-<suffix>` whose Nodes carry the
/// test's run label (so the harness's cleanup removes them).
fn files(env: &TestEnv, suffix: &str, group_yaml: &str) -> (Files, String) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let group = env.name(suffix);
    let config = dir.path().join("sim-cloud.yaml");
    let yaml = format!(
        "groups:\n  - id: {group}\n    labels:\n      {RUN_LABEL}: {id}\n      example.com/zone: zone-a\n{group_yaml}",
        id = env.id
    );
    std::fs::write(&config, yaml).expect("writing the config");
    let state = dir.path().join("state.json");
    (
        Files {
            _dir: dir,
            config,
            state,
        },
        group,
    )
}

async fn get_node(env: &TestEnv, name: &str) -> Option<Node> {
    Api::<Node>::all(env.client.clone())
        .get_opt(name)
        .await
        .ok()
        .flatten()
}

/// Waits until the Node `name` exists and kwok has made it Ready.
async fn wait_node_ready(env: &TestEnv, name: &str) -> Node {
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_for(&format!("Node {name} Ready"), TIMEOUT, || async {
        match nodes.get_opt(name).await {
            Ok(Some(node)) if node_is_ready(&node) => Probe::Done(node),
            Ok(Some(_)) => Probe::NotYet("exists, not Ready".into()),
            Ok(None) => Probe::NotYet("no Node".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

/// Waits until the provider reports `state` for the instance.
async fn wait_state(provider: &SimProvider, provider_id: &str, state: InstanceState) {
    wait_for(&format!("{provider_id} {state:?}"), TIMEOUT, || async {
        match provider.node_state(provider_id).await {
            Ok(s) if s == state => Probe::Done(()),
            Ok(s) => Probe::NotYet(format!("{s:?}")),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

async fn instances(provider: &SimProvider) -> Vec<InstanceView> {
    provider.list_instances().await.expect("listing instances")
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(key))
        .map(String::as_str)
}

fn os_image(node: &Node) -> Option<&str> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.os_image.as_str())
}

#[tokio::test]
async fn initial_instances_join_as_ready_kwok_nodes() {
    let env = TestEnv::new("sim-initial").await;
    let (files, group) = files(
        &env,
        "cp",
        "    role: ControlPlane\n    initialSize: 2\n    image: img-v1\n    bootDelay: 30s\n    joinDelay: 30s\n",
    );
    let sim = SimCloud::start(&files.config, &files.state).await;

    let all = instances(&sim.provider).await;
    assert_eq!(all.len(), 2, "{all:?}");
    for view in &all {
        assert_eq!(
            view.state,
            InstanceState::Ready,
            "initial instances skip the boot delay"
        );
        let node = wait_node_ready(&env, &view.instance.name).await;
        let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.clone());
        assert_eq!(
            provider_id.as_deref(),
            Some(format!("sim://{group}/{}", view.instance.name).as_str())
        );
        assert_eq!(label(&node, "node-role.kubernetes.io/control-plane"), Some(""));
        assert_eq!(label(&node, SCALING_GROUP_LABEL), Some(group.as_str()));
        assert_eq!(label(&node, RUN_LABEL), Some(env.id.as_str()));
        assert_eq!(label(&node, "example.com/zone"), Some("zone-a"));
        assert_eq!(os_image(&node), Some("img-v1"));
        let cpu = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("cpu"))
            .map(|q| q.0.clone());
        assert_eq!(cpu.as_deref(), Some("32"));
    }
    let groups = sim.provider.list_groups().await.expect("listing groups");
    assert_eq!(groups.len(), 1);
    assert_eq!(
        (
            groups[0].id.as_str(),
            groups[0].role,
            groups[0].size,
            groups[0].image.as_str()
        ),
        (group.as_str(), GroupRole::ControlPlane, 2, "img-v1")
    );
    let by_label = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default().labels(&format!("{SCALING_GROUP_LABEL}={group}")))
        .await
        .expect("listing Nodes");
    assert_eq!(by_label.items.len(), 2);

    sim.kill().await;
    env.cleanup().await;
}

#[tokio::test]
async fn created_instance_boots_joins_and_terminates() {
    let env = TestEnv::new("sim-lifecycle").await;
    let (files, group) = files(
        &env,
        "w",
        "    role: Worker\n    image: img-v1\n    bootDelay: 2s\n    joinDelay: 3s\n    deleteDelay: 2s\n",
    );
    let sim = SimCloud::start(&files.config, &files.state).await;
    let p = &sim.provider;

    let created = p
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect("creating an instance");
    assert_eq!(
        created.provider_id,
        format!("sim://{group}/{}", created.node_name)
    );
    assert_eq!(
        p.node_state(&created.provider_id).await.ok(),
        Some(InstanceState::Creating)
    );
    assert_eq!(p.node_group(&created.provider_id).await.ok(), Some(group.clone()));

    wait_state(p, &created.provider_id, InstanceState::Ready).await;
    assert!(
        get_node(&env, &created.node_name).await.is_none(),
        "the Node joins only after the join delay"
    );
    let node = wait_node_ready(&env, &created.node_name).await;
    assert_eq!(label(&node, "node-role.kubernetes.io/worker"), Some(""));
    assert_eq!(label(&node, RUN_LABEL), Some(env.id.as_str()));

    p.delete_node(&created.provider_id).await.expect("deleting");
    assert_eq!(
        p.node_state(&created.provider_id).await.ok(),
        Some(InstanceState::Terminating)
    );
    p.delete_node(&created.provider_id)
        .await
        .expect("deleting again is harmless");
    wait_state(p, &created.provider_id, InstanceState::Terminated).await;
    assert!(
        get_node(&env, &created.node_name).await.is_some(),
        "the sim never deletes Nodes: that is the operator's job"
    );
    let all = instances(p).await;
    assert_eq!(all.len(), 1);
    assert!(all[0].instance.deleted_at_ms.is_some() && all[0].instance.terminated_at_ms.is_some());
    let groups = p.list_groups().await.expect("listing groups");
    assert_eq!(groups[0].size, 0, "a deleted instance no longer counts");

    sim.kill().await;
    env.cleanup().await;
}

#[tokio::test]
async fn group_image_applies_to_new_instances_only() {
    let env = TestEnv::new("sim-image").await;
    let (files, group) = files(
        &env,
        "w",
        "    role: Worker\n    initialSize: 1\n    image: img-v1\n    bootDelay: 500ms\n    joinDelay: 500ms\n",
    );
    let sim = SimCloud::start(&files.config, &files.state).await;
    let p = &sim.provider;
    let old = instances(p).await.remove(0);

    assert_eq!(p.group_image(&group).await.ok().as_deref(), Some("img-v1"));
    p.set_group_image(&group, "img-v2")
        .await
        .expect("setting the image");
    assert_eq!(p.group_image(&group).await.ok().as_deref(), Some("img-v2"));

    let created = p
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect("creating an instance");
    assert_eq!(
        p.node_image(&created.provider_id).await.ok().as_deref(),
        Some("img-v2")
    );
    assert_eq!(
        p.node_image(&old.provider_id).await.ok().as_deref(),
        Some("img-v1")
    );
    let node = wait_node_ready(&env, &created.node_name).await;
    assert_eq!(os_image(&node), Some("img-v2"));
    let old_node = wait_node_ready(&env, &old.instance.name).await;
    assert_eq!(os_image(&old_node), Some("img-v1"));

    let err = p
        .set_group_image(&group, "")
        .await
        .expect_err("an empty image is refused");
    assert!(matches!(err, CloudError::Rejected { status: 400, .. }), "{err}");
    let err = p.group_image(&env.name("nope")).await.expect_err("no such group");
    assert!(err.is_not_found(), "{err}");

    sim.kill().await;
    env.cleanup().await;
}

#[tokio::test]
async fn never_join_instance_never_gets_a_node() {
    let env = TestEnv::new("sim-never-join").await;
    let (files, group) = files(
        &env,
        "w",
        "    role: Worker\n    image: img-v1\n    bootDelay: 500ms\n    joinDelay: 500ms\n",
    );
    let sim = SimCloud::start(&files.config, &files.state).await;
    let p = &sim.provider;
    p.set_faults(&Faults {
        never_join: 1,
        ..Faults::default()
    })
    .await
    .expect("setting faults");

    let lost = p
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect("creating");
    let fine = p
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect("creating");
    wait_node_ready(&env, &fine.node_name).await;
    wait_state(p, &lost.provider_id, InstanceState::Ready).await;
    // Well past its would-be join time, and after a later instance joined.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(get_node(&env, &lost.node_name).await.is_none());
    let view = p.instance(&lost.provider_id).await.expect("the instance");
    assert!(view.never_join && view.instance.joined_at_ms.is_none());
    assert_eq!(
        p.faults().await.map(|f| f.never_join).ok(),
        Some(0),
        "the fault is used up"
    );

    sim.kill().await;
    env.cleanup().await;
}

#[tokio::test]
async fn error_and_throttle_faults_are_retryable_errors() {
    let env = TestEnv::new("sim-faults").await;
    let (files, group) = files(
        &env,
        "w",
        "    role: Worker\n    image: img-v1\n    bootDelay: 1s\n",
    );
    let sim = SimCloud::start(&files.config, &files.state).await;
    let p = &sim.provider;

    p.set_faults(&Faults {
        error_rate: 1.0,
        ..Faults::default()
    })
    .await
    .expect("setting faults");
    let err = p.list_groups().await.expect_err("every call fails");
    assert!(matches!(err, CloudError::Server { status: 500, .. }), "{err}");
    assert!(err.retryable());
    let err = p
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect_err("every call fails");
    assert!(err.retryable(), "{err}");
    assert!(instances(p).await.is_empty(), "a failed call changes nothing");

    p.set_faults(&Faults {
        throttle_rate: 1.0,
        retry_after_seconds: 2,
        ..Faults::default()
    })
    .await
    .expect("setting faults");
    let err = p.group_image(&group).await.expect_err("every call is throttled");
    assert!(err.retryable(), "{err}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(2)));

    p.set_faults(&Faults {
        error_rate: 0.3,
        throttle_rate: 0.3,
        ..Faults::default()
    })
    .await
    .expect("setting faults");
    let (mut ok, mut retryable) = (0, 0);
    for _ in 0..40 {
        match p.list_groups().await {
            Ok(_) => ok += 1,
            Err(e) if e.retryable() => retryable += 1,
            Err(e) => panic!("a fault gave a final error: {e}"),
        }
    }
    assert!(ok > 0 && retryable > 0, "{ok} answered, {retryable} failed");

    // A lost answer: the instance exists although the call failed. Retrying
    // with the same request ID finds it instead of leaking a second one.
    p.set_faults(&Faults {
        lost_response_rate: 1.0,
        ..Faults::default()
    })
    .await
    .expect("setting faults");
    let request = CreateNodeRequest::new(&group).with_request_id("join-1");
    let err = p.create_node(&request).await.expect_err("the answer is lost");
    assert!(err.retryable(), "{err}");
    p.set_faults(&Faults::default()).await.expect("clearing faults");
    let created = p.create_node(&request).await.expect("the retry succeeds");
    let all = instances(p).await;
    assert_eq!(all.len(), 1, "no leaked instance: {all:?}");
    assert_eq!(all[0].instance.name, created.node_name);

    // Never-existing instances are not found — not "Terminated".
    let missing = format!("sim://{group}/{}", env.name("never"));
    let err = p.node_state(&missing).await.expect_err("unknown instance");
    assert!(err.is_not_found() && !err.retryable(), "{err}");
    let err = p
        .node_state(&format!("sim://{}/{}", env.name("other"), created.node_name))
        .await
        .expect_err("the instance is not in that group");
    assert!(err.is_not_found(), "{err}");
    let err = p
        .node_state("aws:///zone/i-1")
        .await
        .expect_err("a foreign provider ID");
    assert!(matches!(err, CloudError::InvalidProviderId { .. }), "{err}");

    // Many states in one call: the known instance answers, the unknown one
    // and the one of another group are left out, as node_state's NotFound.
    let second = p
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect("a second instance");
    p.delete_node(&second.provider_id).await.expect("deleting it");
    let other_group = format!("sim://{}/{}", env.name("other"), created.node_name);
    let asked = [
        created.provider_id.clone(),
        second.provider_id.clone(),
        missing.clone(),
        other_group,
    ];
    let states = p.node_states(&asked).await.expect("states in one call");
    let answered: BTreeSet<&String> = states.keys().collect();
    assert_eq!(
        answered,
        BTreeSet::from([&created.provider_id, &second.provider_id]),
        "{states:?}"
    );
    assert_eq!(
        states.get(&created.provider_id).copied(),
        p.node_state(&created.provider_id).await.ok()
    );
    assert!(
        matches!(
            states.get(&second.provider_id),
            Some(InstanceState::Terminating | InstanceState::Terminated)
        ),
        "{states:?}"
    );
    assert!(p.states_per_call() > 1);
    let err = p
        .node_states(&["aws:///zone/i-1".to_string()])
        .await
        .expect_err("a foreign provider ID");
    assert!(matches!(err, CloudError::InvalidProviderId { .. }), "{err}");

    sim.kill().await;
    env.cleanup().await;
}

#[tokio::test]
async fn killed_mid_boot_the_restarted_sim_loses_nothing() {
    let env = TestEnv::new("sim-restart").await;
    let (files, group) = files(
        &env,
        "w",
        "    role: Worker\n    initialSize: 1\n    image: img-v1\n    bootDelay: 5s\n    joinDelay: 1s\n    deleteDelay: 6s\n",
    );
    let sim = SimCloud::start(&files.config, &files.state).await;
    let initial = instances(&sim.provider).await.remove(0);
    wait_node_ready(&env, &initial.instance.name).await;
    let doomed = sim
        .provider
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect("creating");
    let booting = sim
        .provider
        .create_node(&CreateNodeRequest::new(&group))
        .await
        .expect("creating");
    sim.provider
        .delete_node(&doomed.provider_id)
        .await
        .expect("deleting");
    let before: BTreeSet<String> = instances(&sim.provider)
        .await
        .into_iter()
        .map(|v| v.instance.name)
        .collect();
    assert_eq!(
        sim.provider.node_state(&booting.provider_id).await.ok(),
        Some(InstanceState::Creating)
    );
    sim.kill().await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let sim = SimCloud::start(&files.config, &files.state).await;
    let p = &sim.provider;
    let after: BTreeSet<String> = instances(p).await.into_iter().map(|v| v.instance.name).collect();
    assert_eq!(
        after, before,
        "every instance survived the restart, none was added"
    );
    assert_eq!(
        p.node_state(&doomed.provider_id).await.ok(),
        Some(InstanceState::Terminating),
        "the delete timer continues"
    );
    wait_state(p, &booting.provider_id, InstanceState::Ready).await;
    wait_node_ready(&env, &booting.node_name).await;
    wait_state(p, &doomed.provider_id, InstanceState::Terminated).await;
    assert!(
        get_node(&env, &doomed.node_name).await.is_none(),
        "deleted before joining"
    );
    let nodes = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default().labels(&format!("{SCALING_GROUP_LABEL}={group}")))
        .await
        .expect("listing Nodes");
    let mut names: Vec<String> = nodes
        .items
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    names.sort();
    let mut expected = vec![initial.instance.name.clone(), booting.node_name.clone()];
    expected.sort();
    assert_eq!(names, expected);

    sim.kill().await;
    env.cleanup().await;
}

/// A cloud create is keyed by the UID of the PendingNode it serves: the same
/// create arriving again (late, from a leader whose term lapsed) finds the
/// instance already made instead of leaking a second, and a PendingNode
/// recreated under the same name is never taken for the one before.
#[tokio::test]
async fn a_create_keyed_by_a_pending_node_is_made_once_and_never_for_its_namesake() {
    use kube::api::{DeleteParams, PostParams};
    use nodewarden::api::update::PendingNode;
    use nodewarden::controllers::pending_node::{REQUEST_KEY_ANNOTATION, request_key};

    let env = TestEnv::new("sim-keyed-create").await;
    support::install_crds(&env.client).await;
    let (files, group) = files(&env, "w", "    role: Worker\n    image: img-v1\n");
    let sim = SimCloud::start(&files.config, &files.state).await;
    let p = &sim.provider;
    let pending: Api<PendingNode> = Api::all(env.client.clone());
    let name = env.name("join");
    let tracker: PendingNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "PendingNode",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}, "annotations": {REQUEST_KEY_ANNOTATION: "uid"}},
        "spec": {"groupID": group, "goal": "Join"},
    }))
    .expect("a PendingNode");
    let create = |key: String| {
        let request = CreateNodeRequest::new(&group).with_request_id(key);
        async move { p.create_node(&request).await.expect("creating") }
    };

    let first = pending
        .create(&PostParams::default(), &tracker)
        .await
        .expect("the PendingNode");
    let first_key = request_key(&first).expect("a key");
    assert_eq!(Some(&first_key), first.metadata.uid.as_ref(), "keyed by its UID");
    let made = create(first_key.clone()).await;
    let again = create(first_key.clone()).await;
    assert_eq!(
        again.node_name, made.node_name,
        "the late create finds the instance made"
    );
    assert_eq!(instances(p).await.len(), 1, "no second instance");

    pending
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleting the PendingNode");
    wait_for("the PendingNode to go", TIMEOUT, || async {
        match pending.get_opt(&name).await {
            Ok(None) => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    let namesake = pending
        .create(&PostParams::default(), &tracker)
        .await
        .expect("the namesake");
    let namesake_key = request_key(&namesake).expect("a key");
    assert_ne!(namesake_key, first_key, "the namesake has a key of its own");
    let its_own = create(namesake_key).await;
    assert_ne!(
        its_own.node_name, made.node_name,
        "the namesake gets an instance of its own"
    );
    let late = create(first_key).await;
    assert_eq!(
        late.node_name, made.node_name,
        "a late create for the one before finds its instance"
    );
    assert_eq!(instances(p).await.len(), 2, "one instance each, none leaked");

    sim.kill().await;
    env.cleanup().await;
}
