//! The admission webhook in tests: a ValidatingWebhookConfiguration that
//! sends the test's objects (selected by its run label) to a webhook at a
//! URL on loopback, and waiting until the API server calls it.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use super::{Probe, RUN_LABEL, TestEnv, seen, wait_for};

/// A medik8s NodeMaintenance of the test (its run label) for `node`.
pub fn maintenance(
    env: &TestEnv,
    name: &str,
    node: &str,
) -> nodewarden::api::node_maintenance::medik8s::NodeMaintenance {
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": env.name(name), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": node, "reason": "test"},
    }))
    .expect("a NodeMaintenance")
}

/// The API server's answer to creating `obj`: Ok, or the refusal's message
/// (the webhook's verdict when it refused).
pub async fn create<K>(api: &Api<K>, obj: &K) -> Result<(), String>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err(s.message),
        Err(e) => Err(e.to_string()),
    }
}

/// Waits until creating `nm` (for a node that does not exist) gets the
/// webhook's own verdict. The API server reads webhook configurations
/// through an informer: for a moment after the caBundle is set it may still
/// call with the old one (a TLS failure) or not at all.
pub async fn wait_webhook_answers(
    nms: &Api<nodewarden::api::node_maintenance::medik8s::NodeMaintenance>,
    nm: &nodewarden::api::node_maintenance::medik8s::NodeMaintenance,
) {
    wait_for("the webhook answering", Duration::from_secs(30), || async {
        match create(nms, nm).await {
            Err(m) if m.contains("invalid nodeName") => Probe::Done(()),
            Ok(()) => panic!("a maintenance of a missing node was admitted"),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
}

/// A free loopback port (bound and released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The webhook's settings for a test: served on loopback `port` with a
/// certificate for 127.0.0.1, its caBundle kept in `configuration`, the
/// test's nodes only.
pub fn admission_config(
    env: &TestEnv,
    port: u16,
    configuration: &str,
) -> nodewarden::admission::AdmissionConfig {
    nodewarden::admission::AdmissionConfig {
        addr: format!("127.0.0.1:{port}").parse().expect("an address"),
        namespace: env.namespace.clone(),
        secret: env.name("webhook-tls"),
        webhook_configuration: configuration.to_string(),
        names: nodewarden::admission::ServingNames {
            dns: Vec::new(),
            ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
        },
        certificates: Default::default(),
        node_selector: Some(env.run_selector()),
        etcd: Default::default(),
        refresh: Duration::from_secs(1),
    }
}

/// Creates the configuration `name`: NodeMaintenances (both groups) and
/// ScalingGroups of this test go to `https://127.0.0.1:<port>/validate`,
/// failurePolicy Fail, 5 s timeout; no caBundle (nodewarden sets it).
pub async fn create_configuration(env: &TestEnv, name: &str, port: u16) {
    let rules = json!([
        {"apiGroups": ["nodemaintenance.medik8s.io", "nodemaintenance.kubevirt.io"], "apiVersions": ["v1beta1"],
         "operations": ["CREATE", "UPDATE"], "resources": ["nodemaintenances"], "scope": "Cluster"},
        {"apiGroups": ["update.edgeless.systems"], "apiVersions": ["v1alpha1"],
         "operations": ["CREATE", "UPDATE"], "resources": ["scalinggroups"], "scope": "Cluster"},
    ]);
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "webhooks": [{
            "name": "validate.nodewarden.dev",
            "clientConfig": {"url": format!("https://127.0.0.1:{port}/validate")},
            "rules": rules,
            "objectSelector": {"matchLabels": {RUN_LABEL: env.id}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }],
    }))
    .expect("a ValidatingWebhookConfiguration");
    Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .expect("creating the webhook configuration");
}

/// Waits until nodewarden has put its CA into the configuration.
pub async fn wait_ca_bundle(env: &TestEnv, name: &str) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    wait_for(
        "the caBundle set by nodewarden",
        Duration::from_secs(30),
        || async {
            match api.get(name).await {
                Ok(v) => match v
                    .webhooks
                    .unwrap_or_default()
                    .first()
                    .and_then(|w| w.client_config.ca_bundle.clone())
                {
                    Some(ca) if !ca.0.is_empty() => Probe::Done(()),
                    other => Probe::NotYet(format!("{other:?}")),
                },
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
}

/// A static etcd pod on `node` as kubeadm makes it (`kube-system/etcd-<node>`,
/// label `component=etcd`, bound to the node), carrying the test's run label.
pub async fn create_etcd_pod(env: &TestEnv, node: &str) {
    create_etcd_pod_in(&env.client, &env.id, node).await
}

/// [`create_etcd_pod`] with a client and a run id (from a task without the `TestEnv`).
pub async fn create_etcd_pod_in(client: &kube::Client, run: &str, node: &str) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {
            "name": format!("etcd-{node}"),
            "labels": {"component": "etcd", "tier": "control-plane", RUN_LABEL: run},
            // A mirror pod, as the kubelet makes for a static pod: a drain
            // leaves it (a maintenance of this node would otherwise take
            // the member away before the next admission counts it).
            "annotations": {"kubernetes.io/config.mirror": "etcd"},
        },
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "etcd", "image": "registry.k8s.io/etcd:3.5.21-0"}],
        },
    }))
    .expect("an etcd pod");
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "kube-system")
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the etcd pod");
}

/// Deletes the etcd pod of `node` at once and waits until it is gone.
pub async fn delete_etcd_pod(env: &TestEnv, node: &str) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), "kube-system");
    let name = format!("etcd-{node}");
    let _ = pods.delete(&name, &DeleteParams::default().grace_period(0)).await;
    wait_for(&format!("{name} gone"), Duration::from_secs(30), || async {
        match pods.get_opt(&name).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(_)) => Probe::NotYet("still there".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

pub async fn delete_configuration(env: &TestEnv, name: &str) {
    let _ = Api::<ValidatingWebhookConfiguration>::all(env.client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// A TCP balancer on loopback in front of the replicas' webhooks, as the
/// webhook Service is in a cluster: each connection goes to the next
/// backend that accepts it (a killed replica refuses, so its turn passes).
pub struct Balancer {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Balancer {
    pub async fn start(backends: Vec<u16>) -> Balancer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the balancer");
        let port = listener.local_addr().expect("an address").port();
        let task = tokio::spawn(async move {
            let mut next = 0usize;
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let order: Vec<u16> = (0..backends.len())
                    .map(|i| backends[(next + i) % backends.len()])
                    .collect();
                next = next.wrapping_add(1);
                tokio::spawn(async move {
                    for backend in order {
                        let connect = tokio::net::TcpStream::connect(("127.0.0.1", backend));
                        if let Ok(Ok(mut outbound)) =
                            tokio::time::timeout(Duration::from_secs(1), connect).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                            return;
                        }
                    }
                });
            }
        });
        Balancer { port, task }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
