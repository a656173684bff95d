//! The validating admission webhook against the real API server: nodewarden
//! makes its CA and serving certificate, puts the CA into the webhook
//! configuration, and the API server then refuses, with the Node
//! Maintenance Operator's words, what NMO refuses.

mod support;

use std::time::Duration;

use kube::api::{Api, PostParams};
use kube::{Error, ResourceExt};
use nodewarden::admission::{AdmissionConfig, ServingNames};
use nodewarden::api::node_maintenance::{kubevirt, medik8s};
use nodewarden::api::update::ScalingGroup;
use serde_json::json;
use support::admission::*;
use support::{Probe, RUN_LABEL, TestEnv, wait_for};

fn maintenance(env: &TestEnv, name: &str, node: &str) -> medik8s::NodeMaintenance {
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": env.name(name), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": node, "reason": "test"},
    }))
    .expect("a NodeMaintenance")
}

/// The API server's answer to creating `obj`: Ok, or the refusal's message.
async fn create<K>(api: &Api<K>, obj: &K) -> Result<(), String>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(Error::Api(s)) => Err(s.message),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_refuses_what_the_node_maintenance_operator_refuses() {
    let env = TestEnv::new("admission").await;
    let port = free_port();
    let configuration = env.name("webhook");
    create_configuration(&env, &configuration, port).await;
    let mut config = env.operator_config(Default::default(), None, "operator");
    config.admission = Some(AdmissionConfig {
        addr: format!("127.0.0.1:{port}").parse().expect("an address"),
        namespace: env.namespace.clone(),
        secret: env.name("webhook-tls"),
        webhook_configuration: configuration.clone(),
        names: ServingNames {
            dns: Vec::new(),
            ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
        },
        node_selector: Some(env.run_selector()),
        refresh: Duration::from_secs(1),
    });
    let operator = env.start_operator_from(config).await;
    wait_ca_bundle(&env, &configuration).await;

    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    // A node that does not exist (the API server may take a moment to use
    // the new configuration: until then the create would pass).
    let missing = env.name("no-such-node");
    let refused = wait_for("the webhook's first refusal", Duration::from_secs(30), || async {
        let nm = maintenance(&env, &format!("missing-{}", rand_suffix()), &missing);
        match create(&nms, &nm).await {
            Err(message) => Probe::Done(message),
            Ok(()) => Probe::NotYet("admitted (the configuration is not in use yet)".into()),
        }
    })
    .await;
    assert!(
        refused.contains(&format!("invalid nodeName, no node with name {missing} found")),
        "{refused}"
    );

    // A second NodeMaintenance for a node, in either group.
    let worker = env.create_kwok_nodes(1, &[]).await.remove(0);
    create(&nms, &maintenance(&env, "first", &worker))
        .await
        .expect("the first maintenance of a node is admitted");
    let refused = create(&nms, &maintenance(&env, "second", &worker))
        .await
        .expect_err("a second maintenance of the node");
    let wanted = format!("invalid nodeName, a NodeMaintenance for node {worker} already exists");
    assert!(refused.contains(&wanted), "{refused}");
    let kv: kubevirt::NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.kubevirt.io/v1beta1", "kind": "NodeMaintenance",
        "metadata": {"name": env.name("kubevirt"), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": worker},
    }))
    .expect("a kubevirt NodeMaintenance");
    let refused = create(&Api::<kubevirt::NodeMaintenance>::all(env.client.clone()), &kv)
        .await
        .expect_err("a maintenance of the node in the other group");
    assert!(refused.contains(&wanted), "{refused}");

    // Changing spec.nodeName.
    let moved = json!({"spec": {"nodeName": "elsewhere"}});
    let refused = nms
        .patch(
            &env.name("first"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&moved),
        )
        .await
        .expect_err("nodeName cannot change");
    assert!(
        refused
            .to_string()
            .contains("updating spec.NodeName isn't allowed"),
        "{refused}"
    );

    // etcd quorum: one of three control-plane nodes may go, a second may not.
    let cp = env
        .create_kwok_nodes(3, &[("node-role.kubernetes.io/control-plane", "")])
        .await;
    create(&nms, &maintenance(&env, "cp-0", &cp[0]))
        .await
        .expect("one of three control-plane nodes may be in maintenance");
    let refused = create(&nms, &maintenance(&env, "cp-1", &cp[1]))
        .await
        .expect_err("a second control-plane node breaks quorum");
    assert!(
        refused.contains(&format!(
            "can not put control-plane node {} into maintenance",
            cp[1]
        )) && refused.contains("quorum"),
        "{refused}"
    );

    // A ScalingGroup naming a NodeVersion that does not exist.
    let sg: ScalingGroup = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "ScalingGroup",
        "metadata": {"name": env.name("group"), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeImage": env.name("no-such-version"), "groupId": "g", "role": "Worker", "autoscaling": false},
    }))
    .expect("a ScalingGroup");
    let refused = create(&Api::<ScalingGroup>::all(env.client.clone()), &sg)
        .await
        .expect_err("a ScalingGroup without its NodeVersion");
    assert!(
        refused.contains("spec.nodeImage") && refused.contains("does not exist"),
        "{refused}"
    );

    // Admitted objects are handled as usual.
    let first = nms.get(&env.name("first")).await.expect("the first maintenance");
    assert_eq!(first.name_any(), env.name("first"));
    delete_configuration(&env, &configuration).await;
    operator.stop().await;
    env.cleanup().await;
}

fn rand_suffix() -> String {
    format!("{:x}", rand::random::<u32>())
}
