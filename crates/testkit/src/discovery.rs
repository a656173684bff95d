//! A cloud cluster's groups found by nodewarden: a NodeVersion with
//! upstream's `maxNodeBudget`, the groups' instances joined as Nodes, and
//! the ScalingGroups discovery makes from the groups' tags or labels.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use nodewarden::api::update::{NodeVersion, ScalingGroup};
use nodewarden::controllers::scaling_group::object_name;

use super::{Probe, RUN_LABEL, TestEnv, node_is_ready, seen, wait_for};

/// A NodeVersion on `image` whose surge is upstream's `maxNodeBudget`
/// (no `rollout`), and no ScalingGroup: discovery makes those.
pub async fn create_budget_node_version(env: &TestEnv, image: &str, budget: u32) {
    let nv: NodeVersion = serde_json::from_value(serde_json::json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "NodeVersion",
        "metadata": {"name": env.name("version"), "labels": {RUN_LABEL: env.id}},
        "spec": {"image": image, "maxNodeBudget": budget},
    }))
    .expect("a NodeVersion");
    Api::<NodeVersion>::all(env.client.clone())
        .create(&PostParams::default(), &nv)
        .await
        .expect("creating the NodeVersion");
}

/// Waits until the test's Nodes are `total`, all Ready (joined from `from`).
pub async fn wait_ready_nodes(env: &TestEnv, total: usize, from: &str) {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for(
        &format!("{total} Ready nodes from {from}"),
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
}

/// Waits until discovery made one ScalingGroup per cloud group of `groups`
/// (group ID, node group name, ScalingGroup role), named after the ID, with
/// its role and node group, following the test's NodeVersion and seen
/// through the test's object selector.
pub async fn wait_discovered(env: &TestEnv, groups: &[(String, String, &str)]) {
    let api: Api<ScalingGroup> = Api::all(env.client.clone());
    let selector = env.run_selector();
    type Seen = BTreeMap<String, (String, String, String, String)>;
    let want: Seen = groups
        .iter()
        .map(|(id, node_group, role)| {
            let seen = (
                id.clone(),
                role.to_string(),
                node_group.clone(),
                env.name("version"),
            );
            (object_name(id), seen)
        })
        .collect();
    wait_for(
        "ScalingGroups discovered from the cloud's groups",
        Duration::from_secs(30),
        || async {
            let got: Seen = match api.list(&ListParams::default().labels(&selector)).await {
                Ok(l) => l.items.iter().map(|g| (g.name_any(), described(g))).collect(),
                Err(e) => return Probe::NotYet(seen(e)),
            };
            match got == want {
                true => Probe::Done(()),
                false => Probe::NotYet(format!("{got:?}")),
            }
        },
    )
    .await;
}

/// A ScalingGroup as discovery writes it: (groupId, role, nodeGroupName, nodeImage).
fn described(g: &ScalingGroup) -> (String, String, String, String) {
    let role = serde_json::to_value(g.spec.role)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default();
    (
        g.spec.group_id.clone(),
        role,
        g.spec.node_group_name.clone(),
        g.spec.node_image.clone(),
    )
}

/// Waits until the cloud's running instances (`running`: their provider
/// IDs) are exactly the test's Nodes: nothing leaked, nothing missing.
pub async fn wait_instances_equal_nodes<F, Fut>(env: &TestEnv, cloud: &str, mut running: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<BTreeSet<String>, String>>,
{
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for(
        &format!("{cloud}'s instances equal the Nodes"),
        Duration::from_secs(30),
        || {
            let running = running();
            let nodes = nodes.clone();
            let selector = selector.clone();
            async move {
                let running = match running.await {
                    Ok(ids) => ids,
                    Err(e) => return Probe::NotYet(e),
                };
                let node_ids: BTreeSet<String> =
                    match nodes.list(&ListParams::default().labels(&selector)).await {
                        Ok(l) => l
                            .items
                            .iter()
                            .filter_map(|n| n.spec.as_ref()?.provider_id.clone())
                            .collect(),
                        Err(e) => return Probe::NotYet(seen(e)),
                    };
                match running == node_ids {
                    true => Probe::Done(()),
                    false => Probe::NotYet(format!("instances {running:?} vs nodes {node_ids:?}")),
                }
            }
        },
    )
    .await;
}

/// A cloud test cluster's joiner (the task playing the kubelets), running
/// until stopped.
pub struct Joiner {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Joiner {
    /// Spawns `join` (given the token that stops it) and waits until the
    /// test has `total` Ready Nodes (`what` names the instances).
    pub async fn start<F, Fut>(env: &TestEnv, total: usize, what: &str, join: F) -> Joiner
    where
        F: FnOnce(tokio_util::sync::CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(join(stop.clone()));
        wait_ready_nodes(env, total, what).await;
        Joiner { stop, task }
    }

    /// Stops the joiner and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Puts `key=value` on every Node of the test.
pub async fn label_nodes(env: &TestEnv, key: &str, value: &str) {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let listed = nodes
        .list(&ListParams::default().labels(&env.run_selector()))
        .await
        .expect("the nodes");
    let patch = serde_json::json!({"metadata": {"labels": {key: value}}});
    for node in listed.items {
        nodes
            .patch(
                &node.name_any(),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .expect("labelling a node");
    }
}

/// Every Node of the test carries `key=value` (an heir inherits its donor's labels).
pub async fn assert_nodes_labelled(env: &TestEnv, key: &str, value: &str) {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let listed = nodes
        .list(&ListParams::default().labels(&env.run_selector()))
        .await
        .expect("the nodes");
    assert!(!listed.items.is_empty(), "no nodes");
    for node in &listed.items {
        assert_eq!(
            node.labels().get(key).map(String::as_str),
            Some(value),
            "node {} inherited {key}",
            node.name_any()
        );
    }
}
