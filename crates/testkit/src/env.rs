//! One test's own corner of the shared cluster: a namespace and a run id,
//! names no other test picks, kwok Nodes and Deployments, and the cleanup of
//! all of it (also when the test panics).

use std::collections::BTreeMap;
use std::fmt::Debug;

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use super::cluster::control_plane;

/// Label put on every object a test creates outside its namespace.
pub const RUN_LABEL: &str = "nodewarden.test/run";

/// One test's view of the cluster: a client, a namespace of its own and a run
/// id that no other test shares.
pub struct TestEnv {
    pub client: Client,
    pub id: String,
    pub namespace: String,
    cleaned: bool,
    nodes_created: std::sync::atomic::AtomicUsize,
}

impl TestEnv {
    /// Creates the test's namespace. `test` is a short name for humans; a random
    /// suffix keeps parallel and repeated runs apart.
    pub async fn new(test: &str) -> TestEnv {
        let cp = control_plane();
        let client = cp.client().await;
        let slug: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(30)
            .collect();
        let id = format!(
            "{}-{:06x}",
            slug.trim_matches('-'),
            rand::random::<u32>() & 0xff_ffff
        );
        let namespace = format!("t-{id}");
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": namespace, "labels": {RUN_LABEL: id}}
        }))
        .expect("a namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        TestEnv {
            client,
            id,
            namespace,
            cleaned: false,
            nodes_created: Default::default(),
        }
    }

    /// A name for a cluster-scoped object that no other test can pick.
    pub fn name(&self, what: &str) -> String {
        format!("{}-{what}", self.id)
    }

    /// The label selector matching everything this test created outside its namespace.
    pub fn run_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.id)
    }

    /// Waits up to a minute until `count` of this run's nodes pass `judge`
    /// (Ready, say: [`node_is_ready`](super::node_is_ready)); `what` names
    /// them in the wait's messages.
    pub async fn wait_for_nodes(&self, what: &str, count: usize, judge: impl Fn(&Node) -> bool) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let selector = self.run_selector();
        super::wait_for(
            &format!("{count} nodes to be {what}"),
            std::time::Duration::from_secs(60),
            || async {
                match nodes.list(&ListParams::default().labels(&selector)).await {
                    Ok(list) => {
                        let passing = list.items.iter().filter(|n| judge(n)).count();
                        if passing == count {
                            super::Probe::Done(())
                        } else {
                            super::Probe::NotYet(format!("{} nodes, {passing} {what}", list.items.len()))
                        }
                    }
                    Err(e) => super::Probe::NotYet(super::seen(e)),
                }
            },
        )
        .await;
    }

    /// Creates `count` Nodes that kwok will run (it marks them Ready and runs
    /// their pods), labelled with the run id and `labels`. Returns their names.
    pub async fn create_kwok_nodes(&self, count: usize, labels: &[(&str, &str)]) -> Vec<String> {
        let mut names = Vec::with_capacity(count);
        for _ in 0..count {
            let i = self
                .nodes_created
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let name = self.name(&format!("node-{i}"));
            self.create_kwok_node(&name, labels).await;
            names.push(name);
        }
        names
    }

    /// Creates one kwok Node named `name` (see `create_kwok_nodes`).
    pub async fn create_kwok_node(&self, name: &str, labels: &[(&str, &str)]) {
        self.create_kwok_node_with(name, labels, &format!("kwok://{name}"))
            .await
    }

    /// A kwok node with the given provider ID (e.g. a sim-cloud instance's).
    pub async fn create_kwok_node_with(&self, name: &str, labels: &[(&str, &str)], provider_id: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        {
            let mut all_labels: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            all_labels.insert(RUN_LABEL.into(), self.id.clone());
            all_labels.insert("kubernetes.io/hostname".into(), name.to_string());
            all_labels.insert("kubernetes.io/os".into(), "linux".into());
            all_labels.insert("kubernetes.io/arch".into(), "amd64".into());
            all_labels.insert("type".into(), "kwok".into());
            let node: Node = serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "labels": all_labels,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"providerID": provider_id},
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "nodeInfo": {"kubeletVersion": "fake", "architecture": "amd64", "operatingSystem": "linux"},
                },
            }))
            .expect("a node");
            nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("creating a kwok node");
        }
    }

    /// Creates a Deployment `name` of `replicas` pods (labelled `app: name`) in
    /// the test's namespace, placed by `node_selector`.
    pub async fn create_deployment(&self, name: &str, replicas: i32, node_selector: serde_json::Value) {
        let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "nodeSelector": node_selector,
                        "containers": [{"name": "c", "image": "registry.invalid/app:1"}],
                    },
                },
            },
        }))
        .expect("a deployment");
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &deployment)
            .await
            .expect("creating a deployment");
    }

    /// The reasons of the Events about the object `kind`/`name`, with their counts.
    pub async fn event_reasons(&self, kind: &str, name: &str) -> std::collections::BTreeMap<String, usize> {
        let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(self.client.clone());
        let mut reasons = std::collections::BTreeMap::new();
        if let Ok(list) = events
            .list(&ListParams::default().fields(&format!("regarding.kind={kind},regarding.name={name}")))
            .await
        {
            for e in list.items {
                *reasons.entry(e.reason.unwrap_or_default()).or_insert(0) += 1;
            }
        }
        reasons
    }

    /// Waits until the object `kind`/`name` has Events with each of `reasons`
    /// (Events are published in the background).
    pub async fn wait_events(&self, kind: &str, name: &str, reasons: &[&str]) {
        super::wait_for(
            &format!("Events {reasons:?} on {kind} {name}"),
            std::time::Duration::from_secs(20),
            || async {
                let seen = self.event_reasons(kind, name).await;
                match reasons.iter().all(|r| seen.contains_key(*r)) {
                    true => super::Probe::Done(()),
                    false => super::Probe::NotYet(format!("{seen:?}")),
                }
            },
        )
        .await;
    }

    /// Deletes the test's namespace and every cluster-scoped object carrying its run label.
    pub async fn cleanup(mut self) {
        self.cleaned = true;
        cleanup(&self.client, &self.id, &self.namespace).await;
    }
}

async fn cleanup(client: &Client, id: &str, namespace: &str) {
    let selector = format!("{RUN_LABEL}={id}");
    remove_all::<nodewarden::api::node_maintenance::medik8s::NodeMaintenance>(client, &selector).await;
    remove_all::<nodewarden::api::node_maintenance::kubevirt::NodeMaintenance>(client, &selector).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector))
        .await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::default())
        .await;
}

/// Deletes every `K` matching `selector`, dropping finalizers first (the
/// operator that would remove them may be gone already).
async fn remove_all<K>(client: &Client, selector: &str)
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let Ok(list) = api.list(&ListParams::default().labels(selector)).await else {
        return;
    };
    for obj in list.items {
        let name = obj.meta().name.clone().unwrap_or_default();
        let patch = json!({"metadata": {"finalizers": null}});
        let _ = api
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}

impl Drop for TestEnv {
    /// A test that panicked before `cleanup` still leaves the shared cluster clean.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let (id, namespace) = (self.id.clone(), self.namespace.clone());
        // A thread with its own runtime: Drop may run inside (or outside) the
        // test's runtime, and the test's client may be tied to that runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async {
                let client = control_plane().client().await;
                cleanup(&client, &id, &namespace).await;
            });
        })
        .join();
    }
}
