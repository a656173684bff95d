//! The validating admission webhook against the real API server: nodewarden
//! makes its CA and serving certificate, puts the CA into the webhook
//! configuration, and the API server then refuses, with the Node
//! Maintenance Operator's words, what NMO refuses.

use crate::support;

use std::time::Duration;

use crate::support::admission::*;
use crate::support::{Probe, RUN_LABEL, RunningOperator, TestEnv, wait_for};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use nodewarden::admission::{AdmissionConfig, ServingNames};
use nodewarden::api::node_maintenance::{kubevirt, medik8s};
use nodewarden::api::update::ScalingGroup;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_refuses_what_the_node_maintenance_operator_refuses() {
    let env = TestEnv::new("admission").await;
    let (operator, configuration) = operator_with_webhook(&env).await;

    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    // A node that does not exist.
    let missing = env.name("no-such-node");
    let refused = first_refusal(&env, &nms, &missing).await;
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

    // etcd quorum, stacked etcd: one of three members may go, a second may not.
    let cp = env
        .create_kwok_nodes(3, &[("node-role.kubernetes.io/control-plane", "")])
        .await;
    for node in &cp {
        create_etcd_pod(&env, node).await;
    }
    create(&nms, &maintenance(&env, "cp-0", &cp[0]))
        .await
        .expect("one of three control-plane nodes may be in maintenance");
    let refused = create(&nms, &maintenance(&env, "cp-1", &cp[1]))
        .await
        .expect_err("a second control-plane node breaks quorum");
    assert!(
        refused.contains(&format!(
            "can not put master/control-plane node into maintenance at this moment, disrupting node {} \
             will violate etcd quorum",
            cp[1]
        )) && refused.contains(&format!("static pod kube-system/etcd-{}", cp[1]))
            && refused.contains("1 of the 3 members"),
        "{refused}"
    );
    for node in &cp {
        delete_etcd_pod(&env, node).await;
    }

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

/// nodewarden with its webhook on a free port and a configuration of the
/// test's own pointing at it, once its CA is in the configuration's
/// caBundle. Returns the operator and the configuration's name.
async fn operator_with_webhook(env: &TestEnv) -> (RunningOperator, String) {
    let port = free_port();
    let configuration = env.name("webhook");
    create_configuration(env, &configuration, port).await;
    let mut config = env.operator_config(Default::default(), None, "operator");
    config.admission = Some(admission_config(env, port, &configuration));
    let operator = env.start_operator_from(config).await;
    wait_ca_bundle(env, &configuration).await;
    let probe = maintenance(env, "probe", &env.name("no-such-node"));
    wait_webhook_answers(&Api::all(env.client.clone()), &probe).await;
    (operator, configuration)
}

/// The etcd quorum rule applies only where an etcd member runs: the one
/// control-plane node of a cluster is refused maintenance while a static etcd
/// pod runs on it, naming it, and admitted once etcd is external (no pod).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_control_plane_node_may_go_into_maintenance_only_where_etcd_is_external() {
    let env = TestEnv::new("admission-etcd").await;
    let (operator, configuration) = operator_with_webhook(&env).await;
    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    first_refusal(&env, &nms, &env.name("no-such-node")).await;

    let cp = env
        .create_kwok_nodes(1, &[("node-role.kubernetes.io/control-plane", "")])
        .await
        .remove(0);
    create_etcd_pod(&env, &cp).await;
    let refused = create(&nms, &maintenance(&env, "stacked", &cp))
        .await
        .expect_err("the only etcd member may not go");
    assert!(
        refused.contains(&format!("disrupting node {cp} will violate etcd quorum"))
            && refused.contains(&format!(
                "an etcd member runs on it (static pod kube-system/etcd-{cp})"
            ))
            && refused.contains("0 of the 1 members")
            && refused.contains("more than half of its members (1)"),
        "{refused}"
    );
    delete_etcd_pod(&env, &cp).await;
    create(&nms, &maintenance(&env, "external", &cp))
        .await
        .expect("with external etcd the control-plane node may go");
    delete_configuration(&env, &configuration).await;
    operator.stop().await;
    env.cleanup().await;
}

/// The webhook's refusal of a NodeMaintenance for `missing`, once the API
/// server calls it: until the API server uses the configuration with its
/// caBundle and the webhook serves its certificate, creates pass or fail
/// for other reasons.
async fn first_refusal(env: &TestEnv, nms: &Api<medik8s::NodeMaintenance>, missing: &str) -> String {
    wait_for("the webhook's first refusal", Duration::from_secs(30), || async {
        let nm = maintenance(env, &format!("missing-{}", rand_suffix()), missing);
        match create(nms, &nm).await {
            Err(message) if message.contains("invalid nodeName") => Probe::Done(message),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await
}

fn rand_suffix() -> String {
    format!("{:x}", rand::random::<u32>())
}

/// With `--webhook-certs=cert-manager` nodewarden serves the certificate
/// cert-manager wrote and touches neither the Secret nor the caBundle (the
/// test writes both, as cert-manager and its CA injector do); the
/// `manifests/cert-manager` component renders that setup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_from_cert_manager_are_served_as_they_are() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    use nodewarden::admission::{CertSource, certs};

    // The component, rendered over the base.
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let overlay = repo.join("target/kustomize-cert-manager");
    std::fs::create_dir_all(&overlay).expect("an overlay dir");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources: [../../manifests/base]\ncomponents: [../../manifests/cert-manager]\n",
    )
    .expect("writing the overlay");
    let docs = support::manifests::kustomize(&overlay);
    let find = |kind: &str, name: &str| support::manifests::find(&docs, kind, name).clone();
    assert_eq!(
        find("Certificate", "nodewarden-webhook")["spec"]["secretName"],
        "nodewarden-webhook-tls"
    );
    assert_eq!(
        find("ValidatingWebhookConfiguration", "nodewarden")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "nodewarden-system/nodewarden-webhook"
    );
    let args = find("Deployment", "nodewarden")["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(
        args.as_array()
            .is_some_and(|a| a.iter().any(|v| v == "--webhook-certs=cert-manager")),
        "{args}"
    );

    // What cert-manager and its CA injector would have written.
    let env = TestEnv::new("admission-cm").await;
    let port = free_port();
    let names = ServingNames {
        dns: Vec::new(),
        ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
    };
    let issued = certs::generate(&names, k8s_openapi::jiff::Timestamp::now()).expect("certificates");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": env.name("tls")},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": issued.tls_cert, "tls.key": issued.tls_key, "ca.crt": issued.ca_cert},
    }))
    .expect("a Secret");
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let written = secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("the Secret");
    let configuration = env.name("webhook");
    create_configuration(&env, &configuration, port).await;
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(env.client.clone());
    let mut vwc = vwcs.get(&configuration).await.expect("the configuration");
    for w in vwc.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(k8s_openapi::ByteString(issued.ca_cert.clone().into_bytes()));
    }
    let injected = vwcs
        .replace(&configuration, &PostParams::default(), &vwc)
        .await
        .expect("injecting the CA");

    let mut config = env.operator_config(Default::default(), None, "operator");
    config.admission = Some(AdmissionConfig {
        addr: format!("127.0.0.1:{port}").parse().expect("an address"),
        namespace: env.namespace.clone(),
        secret: env.name("tls"),
        webhook_configuration: configuration.clone(),
        names,
        certificates: CertSource::CertManager,
        node_selector: Some(env.run_selector()),
        etcd: Default::default(),
        refresh: Duration::from_secs(1),
    });
    let operator = env.start_operator_from(config).await;
    let nms: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    let missing = env.name("no-such-node");
    let refused = first_refusal(&env, &nms, &missing).await;
    assert!(
        refused.contains("invalid nodeName, no node with name"),
        "{refused}"
    );
    // Neither the Secret nor the caBundle was touched.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let now = secrets.get(&env.name("tls")).await.expect("the Secret");
    assert_eq!(now.metadata.resource_version, written.metadata.resource_version);
    let now = vwcs.get(&configuration).await.expect("the configuration");
    assert_eq!(now.metadata.resource_version, injected.metadata.resource_version);
    delete_configuration(&env, &configuration).await;
    operator.stop().await;
    env.cleanup().await;
}
