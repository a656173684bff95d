//! The Helm chart `charts/nodewarden`, rendered by the pinned helm
//! (`e2e/helm/build.sh`): `helm lint` passes; every cloud × webhook choice
//! renders what it promises, and values the schema refuses (or a cloud setup
//! without a value it requires) are refused naming the value; each cloud's
//! identity settings (GKE Workload Identity, Azure workload identity, an
//! Azure client secret) reach the ServiceAccount and the pod; every
//! rendered object passes a server-side dry run against the real API server;
//! for the choices the kustomize manifests make, the chart renders the same
//! objects; `nodewarden run` takes every flag the chart can render; and a
//! `nodewarden run` process started as the rendered Deployment's container,
//! with a token of the rendered ServiceAccount, takes the Lease in the
//! release's namespace, becomes ready and serves the rendered webhook; and
//! `helm install`, then `helm uninstall` while such a replica runs, leaves
//! nothing of the release in its namespace.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams};
use serde_json::{Value, json};

use crate::support::chart::{Release, chart_dir, container, pod_environment, service_account_kubeconfig};
use crate::support::manifests::{Applied, apply, describe, find, gvk_of, is_namespace, kustomize, to_object};
use crate::support::replicas::{Replicas, SYSTEM_NAMESPACE, Shared, holder, replica_log_dir};
use crate::support::{Probe, RUN_LABEL, TestEnv, wait_for};

const CLOUDS: [&str; 5] = ["none", "aws", "gcp", "azure", "sim"];
const CERTIFICATES: [&str; 3] = ["own", "cert-manager", "off"];

/// API groups a cluster may lack: their objects are skipped in the dry run
/// when the API server does not serve them (no prometheus-operator or
/// cert-manager CRDs on the local control plane).
const OPTIONAL_GROUPS: [&str; 2] = ["monitoring.coreos.com", "cert-manager.io"];

/// AWS's required values, as a user gives them.
fn aws_values() -> Value {
    json!({
        "region": "us-east-1",
        "clusterUID": "the-cluster-uid",
        "roleARN": "arn:aws:iam::111122223333:role/nodewarden",
    })
}

/// GCP's values, as a user with a service account's key gives them.
fn gcp_values() -> Value {
    json!({"clusterUID": "the-cluster-uid", "project": "my-project", "keySecret": "nodewarden-gcp"})
}

/// An Azure client ID (the schema takes only GUIDs).
const AZURE_CLIENT_ID: &str = "00000000-0000-0000-0000-0000000000c1";

/// Azure's values, as a user with an app registration's secret gives them.
fn azure_values() -> Value {
    json!({
        "clusterUID": "the-cluster-uid",
        "subscription": "the-subscription",
        "resourceGroup": "the-resource-group",
        "tenantID": "the-tenant",
        "clientID": AZURE_CLIENT_ID,
        "clientSecretSecret": "nodewarden-azure",
        "callTimeout": 20,
    })
}

/// The values of one cloud × webhook-certificates choice.
fn choice(cloud: &str, certificates: &str) -> Value {
    let mut values = json!({"cloud": {"provider": cloud}, "webhook": {"certificates": certificates}});
    match cloud {
        "aws" => values["cloud"]["aws"] = aws_values(),
        "gcp" => values["cloud"]["gcp"] = gcp_values(),
        "azure" => values["cloud"]["azure"] = azure_values(),
        _ => {}
    }
    values
}

/// Every choice, named for messages.
fn choices() -> Vec<(String, Value)> {
    CLOUDS
        .iter()
        .flat_map(|cloud| {
            CERTIFICATES.iter().map(move |certs| {
                (
                    format!("cloud {cloud}, certificates {certs}"),
                    choice(cloud, certs),
                )
            })
        })
        .collect()
}

/// A value for every option the chart has, `lease_namespace` for the
/// maintenance Leases.
fn everything(lease_namespace: &str) -> Value {
    json!({
        "replicas": 2,
        "namespace": {"create": true},
        "serviceAccount": {"annotations": {"example.com/owner": "platform"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"example.com/team": "nodes"},
        "podLabels": {"example.com/team": "nodes"},
        "topologySpreadConstraints": [{"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "nodewarden"}}}],
        "resources": {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "imagePullSecrets": [{"name": "registry"}],
        "cloud": {"provider": "aws", "qps": 5, "burst": 10, "aws": {
            "region": "eu-west-1", "clusterUID": "uid-1",
            "roleARN": "arn:aws:iam::111122223333:role/nodewarden",
            "endpoint": "http://127.0.0.1:5000", "callTimeout": 3,
        }},
        "leaderElection": {"leaseDuration": 15, "renewDeadline": 10, "retryPeriod": 2.5},
        "workers": 4,
        "manage": {"nodes": "node-role.kubernetes.io/worker", "objects": "team in (a,b)"},
        "maintenance": {"maxConcurrent": 2, "leaseNamespace": lease_namespace},
        "rollout": {"maxSurge": "25%", "maxUnavailable": 1, "controlPlaneFirst": false,
                    "joinTimeout": "30m", "drainTimeout": "1h30m"},
        "etcd": {"endpoints": ["https://10.0.0.2:2379", "https://10.0.0.3:2379"],
                 "clientSecret": "etcd-client", "timeout": 5},
        "plans": {"namespace": "system-upgrade", "channelPoll": "15m", "settle": 10,
                  "jobDeadline": 1_000_000, "jobDeadlineMax": 0, "jobBackoffLimit": 2, "jobTTL": 900,
                  "jobPrivileged": false, "jobImagePullPolicy": "Always",
                  "jobPodReplacementPolicy": "Failed", "controllerName": "system-upgrade-controller",
                  "controllerEnvConfigMap": "default-controller-env"},
        "sip": "off",
        "webhook": {"certificates": "cert-manager", "etcdOnControlPlane": "false",
                    "handshakeTimeout": 10, "requestTimeout": 30, "maxConnections": 256, "maxInFlight": 8},
        "networkPolicy": {"enabled": true, "webhookFrom": ["10.0.0.0/24", "10.0.1.0/24"]},
        "metrics": {"serviceMonitor": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}},
                    "prometheusRule": {"enabled": true}},
        "tracing": {"otlpEndpoint": "http://jaeger-collector.observability:4318"},
        "log": {"json": true},
        "extraArgs": ["--lease-name=nodewarden"],
        "extraEnv": [{"name": "RUST_LOG", "value": "info"}],
        "extraVolumes": [{"name": "proxy-ca", "configMap": {"name": "proxy-ca"}}],
        "extraVolumeMounts": [{"name": "proxy-ca", "mountPath": "/etc/nodewarden/proxy-ca", "readOnly": true}],
    })
}

/// The chart rendered as release `nodewarden` in `namespace`.
fn render(namespace: &str, values: &Value) -> Vec<Value> {
    Release::new("nodewarden", namespace, values.clone())
        .template()
        .unwrap_or_else(|e| panic!("helm template with {values} failed:\n{e}"))
}

/// The rendered Deployment's container args.
fn args(docs: &[Value]) -> Vec<String> {
    container(docs, "nodewarden")["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(String::from)
        .collect()
}

fn has(docs: &[Value], kind: &str, name: &str) -> bool {
    docs.iter()
        .any(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

#[test]
fn helm_lint_passes_for_the_defaults_and_every_choice() {
    let defaults = Release::new("nodewarden", SYSTEM_NAMESPACE, json!({}));
    let mut all = vec![("the defaults".to_string(), defaults)];
    for (what, values) in choices()
        .into_iter()
        .chain([("everything".into(), everything("leases"))])
    {
        all.push((what, Release::new("nodewarden", SYSTEM_NAMESPACE, values)));
    }
    for (what, release) in all {
        if let Err(e) = release.lint() {
            panic!("helm lint --strict fails for {what}:\n{e}");
        }
    }
}

#[test]
fn each_choice_renders_its_cloud_and_webhook_in_the_release_namespace() {
    // Not nodewarden-system: the release's namespace is wherever it is installed.
    let ns = "ops";
    for (what, values) in choices() {
        let docs = render(ns, &values);
        let args = args(&docs);
        let arg = |a: &str| args.iter().any(|x| x == a);
        assert_eq!(args.first().map(String::as_str), Some("run"), "{what}: {args:?}");
        assert!(arg("--http-addr=0.0.0.0:8080"), "{what}: {args:?}");
        let c = container(&docs, "nodewarden");

        // Every namespaced object is in the release namespace, but the
        // per-node maintenance Leases' Role and binding.
        for doc in &docs {
            let (kind, name) = (&doc["kind"], doc["metadata"]["name"].as_str().unwrap_or_default());
            let want = match doc["metadata"]["namespace"].as_str() {
                None => continue,
                Some(_) if name == "nodewarden-node-leases" => "medik8s-leases",
                Some(_) => ns,
            };
            assert_eq!(doc["metadata"]["namespace"], want, "{what}: {kind} {name}");
        }
        // The Lease is where the pod runs: POD_NAMESPACE from the downward
        // API, no --lease-namespace, the election Role in the release namespace.
        let pod_namespace = c["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == "POD_NAMESPACE"))
            .map(|v| v["valueFrom"]["fieldRef"]["fieldPath"].clone());
        assert_eq!(pod_namespace, Some(json!("metadata.namespace")), "{what}");
        assert!(
            !args.iter().any(|a| a.starts_with("--lease-namespace")),
            "{what}: {args:?}"
        );
        let election = find(&docs, "Role", "nodewarden-leader-election");
        assert_eq!(election["metadata"]["namespace"], ns, "{what}");
        assert_eq!(election["rules"][0]["resources"], json!(["leases"]), "{what}");

        let (cloud, certs) = (&values["cloud"]["provider"], &values["webhook"]["certificates"]);
        match cloud.as_str() {
            Some("none") => assert!(
                !args.iter().any(|a| a.starts_with("--cloud")) && c.get("envFrom").is_none(),
                "{what} names no cloud: {args:?} {c}"
            ),
            Some("sim") => {
                assert!(arg("--cloud=sim"), "{what}: {args:?}");
                assert!(
                    arg(&format!("--sim-cloud=http://sim-cloud.{ns}:8090")),
                    "{what}: {args:?}"
                );
            }
            Some("gcp") => assert_gcp_rendered(&docs, c, &what),
            Some("azure") => assert_azure_rendered(&docs, c, &what),
            _ => {
                let data = &find(&docs, "ConfigMap", "nodewarden-aws")["data"];
                assert_eq!(
                    data,
                    &json!({"NODEWARDEN_CLOUD": "aws", "AWS_REGION": "us-east-1",
                            "NODEWARDEN_AWS_CLUSTER_UID": "the-cluster-uid",
                            "NODEWARDEN_DISCOVER_SCALING_GROUPS": "constellation-version"}),
                    "{what}"
                );
                assert_eq!(
                    c["envFrom"],
                    json!([{"configMapRef": {"name": "nodewarden-aws"}}]),
                    "{what}"
                );
                let sa = find(&docs, "ServiceAccount", "nodewarden");
                assert_eq!(
                    sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"],
                    "arn:aws:iam::111122223333:role/nodewarden",
                    "{what}"
                );
            }
        }

        let webhook = certs != "off";
        assert_eq!(arg("--webhook-addr=0.0.0.0:9443"), webhook, "{what}: {args:?}");
        assert_eq!(
            has(&docs, "ValidatingWebhookConfiguration", "nodewarden"),
            webhook,
            "{what}"
        );
        assert_eq!(has(&docs, "Service", "nodewarden-webhook"), webhook, "{what}");
        let ports = c["ports"].as_array().map(|p| p.len());
        assert_eq!(ports, Some(if webhook { 2 } else { 1 }), "{what}: {c}");
        let cert_manager = certs == "cert-manager";
        assert_eq!(
            arg("--webhook-certs=cert-manager"),
            cert_manager,
            "{what}: {args:?}"
        );
        assert_eq!(
            has(&docs, "Certificate", "nodewarden-webhook"),
            cert_manager,
            "{what}"
        );
        if cert_manager {
            let vwc = find(&docs, "ValidatingWebhookConfiguration", "nodewarden");
            assert_eq!(
                vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                format!("{ns}/nodewarden-webhook"),
                "{what}"
            );
            let certificate = find(&docs, "Certificate", "nodewarden-webhook");
            assert_eq!(
                certificate["spec"]["secretName"], "nodewarden-webhook-tls",
                "{what}"
            );
            assert_eq!(
                certificate["spec"]["dnsNames"][0],
                format!("nodewarden-webhook.{ns}.svc"),
                "{what}: the name nodewarden's Service answers to"
            );
        }
    }
}

/// The GCP choice: its ConfigMap read by the container, the key's Secret
/// mounted where GOOGLE_APPLICATION_CREDENTIALS points, the upgrade-agent
/// relayed as on AWS (Constellation runs it on every cloud).
fn assert_gcp_rendered(docs: &[Value], c: &Value, what: &str) {
    let data = &find(docs, "ConfigMap", "nodewarden-gcp")["data"];
    assert_eq!(
        data,
        &json!({"NODEWARDEN_CLOUD": "gcp", "NODEWARDEN_GCP_CLUSTER_UID": "the-cluster-uid",
                "NODEWARDEN_GCP_PROJECT": "my-project",
                "GOOGLE_APPLICATION_CREDENTIALS": "/etc/nodewarden/gcp/key.json",
                "NODEWARDEN_DISCOVER_SCALING_GROUPS": "constellation-version"}),
        "{what}"
    );
    assert_eq!(
        c["envFrom"],
        json!([{"configMapRef": {"name": "nodewarden-gcp"}}]),
        "{what}"
    );
    let mounts = c["volumeMounts"].as_array().expect("mounts");
    assert!(
        mounts.contains(&json!({"name": "gcp-key", "mountPath": "/etc/nodewarden/gcp", "readOnly": true})),
        "{what}: {mounts:?}"
    );
    let spec = &find(docs, "Deployment", "nodewarden")["spec"]["template"]["spec"];
    let volumes = spec["volumes"].as_array().expect("volumes");
    assert!(
        volumes.contains(&json!({"name": "gcp-key", "secret": {"secretName": "nodewarden-gcp"}})),
        "{what}: {volumes:?}"
    );
    assert!(
        volumes.iter().any(|v| v["name"] == "upgrade-agent"),
        "{what}: the upgrade-agent relayed"
    );
}

/// The Azure choice: its ConfigMap read by the container, the client secret
/// from its Secret, the call timeout as a flag, the upgrade-agent relayed as
/// on AWS and GCP.
fn assert_azure_rendered(docs: &[Value], c: &Value, what: &str) {
    let data = &find(docs, "ConfigMap", "nodewarden-azure")["data"];
    assert_eq!(
        data,
        &json!({"NODEWARDEN_CLOUD": "azure", "NODEWARDEN_AZURE_CLUSTER_UID": "the-cluster-uid",
                "NODEWARDEN_AZURE_SUBSCRIPTION": "the-subscription",
                "NODEWARDEN_AZURE_RESOURCE_GROUP": "the-resource-group",
                "AZURE_TENANT_ID": "the-tenant", "AZURE_CLIENT_ID": AZURE_CLIENT_ID,
                "NODEWARDEN_DISCOVER_SCALING_GROUPS": "constellation-version"}),
        "{what}"
    );
    assert_eq!(
        c["envFrom"],
        json!([{"configMapRef": {"name": "nodewarden-azure"}}]),
        "{what}"
    );
    assert_eq!(
        azure_secret_env(c),
        Some(json!({"name": "nodewarden-azure", "key": "client-secret"})),
        "{what}"
    );
    let args = c["args"].as_array().expect("args");
    assert!(
        args.contains(&json!("--azure-call-timeout=20")),
        "{what}: {args:?}"
    );
    let spec = &find(docs, "Deployment", "nodewarden")["spec"]["template"]["spec"];
    let volumes = spec["volumes"].as_array().expect("volumes");
    assert!(
        volumes.iter().any(|v| v["name"] == "upgrade-agent"),
        "{what}: the upgrade-agent relayed"
    );
}

/// Where the container's AZURE_CLIENT_SECRET comes from (its secretKeyRef).
fn azure_secret_env(c: &Value) -> Option<Value> {
    c["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == "AZURE_CLIENT_SECRET")
        .map(|e| e["valueFrom"]["secretKeyRef"].clone())
}

/// The rendered pod template's labels and the ServiceAccount's annotations.
fn pod_labels_and_account_annotations(docs: &[Value]) -> (Value, Value) {
    (
        find(docs, "Deployment", "nodewarden")["spec"]["template"]["metadata"]["labels"].clone(),
        find(docs, "ServiceAccount", "nodewarden")["metadata"]["annotations"].clone(),
    )
}

#[test]
fn azure_identities_reach_the_pod_and_the_service_account_when_asked() {
    let azure = |more: Value| {
        let mut azure = json!({"clusterUID": "uid-1", "subscription": "s", "resourceGroup": "rg"});
        for (k, v) in more.as_object().expect("an object") {
            azure[k] = v.clone();
        }
        let values = json!({"cloud": {"provider": "azure", "azure": azure},
                            "podLabels": {"example.com/team": "nodes"}});
        render("ops", &values)
    };
    let workload_label = |labels: &Value| labels.get("azure.workload.identity/use").cloned();

    // The node's managed identity (user-assigned: its client ID): nothing
    // but the settings.
    let managed = azure(json!({"clientID": AZURE_CLIENT_ID}));
    let (labels, annotations) = pod_labels_and_account_annotations(&managed);
    assert_eq!(workload_label(&labels), None, "{labels}");
    assert!(annotations.is_null(), "{annotations}");
    assert_eq!(azure_secret_env(container(&managed, "nodewarden")), None);
    let data = &find(&managed, "ConfigMap", "nodewarden-azure")["data"];
    assert_eq!(data["AZURE_CLIENT_ID"], AZURE_CLIENT_ID, "{data}");
    assert!(data.get("AZURE_TENANT_ID").is_none(), "{data}");

    // Workload identity: the label the webhook looks for, beside the user's,
    // and the identity named on the ServiceAccount.
    let workload = azure(json!({"workloadIdentity": true, "clientID": AZURE_CLIENT_ID,
                                "tenantID": "the-tenant", "endpoint": "http://127.0.0.1:8443",
                                "callTimeout": 2.5}));
    let (labels, annotations) = pod_labels_and_account_annotations(&workload);
    assert_eq!(
        labels,
        json!({"app.kubernetes.io/name": "nodewarden", "app.kubernetes.io/instance": "nodewarden",
               "azure.workload.identity/use": "true", "example.com/team": "nodes"})
    );
    assert_eq!(
        annotations,
        json!({"azure.workload.identity/client-id": AZURE_CLIENT_ID,
               "azure.workload.identity/tenant-id": "the-tenant"})
    );
    assert_eq!(azure_secret_env(container(&workload, "nodewarden")), None);
    let args = args(&workload);
    for flag in [
        "--azure-endpoint=http://127.0.0.1:8443",
        "--azure-call-timeout=2.5",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag}: {args:?}");
    }

    // An app registration's secret: from the key client-secret of its Secret.
    let secret = azure(
        json!({"clientSecretSecret": "azure-app", "clientID": AZURE_CLIENT_ID,
                              "tenantID": "the-tenant"}),
    );
    assert_eq!(
        azure_secret_env(container(&secret, "nodewarden")),
        Some(json!({"name": "azure-app", "key": "client-secret"}))
    );
    let (labels, annotations) = pod_labels_and_account_annotations(&secret);
    assert_eq!(workload_label(&labels), None, "{labels}");
    assert!(annotations.is_null(), "{annotations}");

    // Another cloud's release ignores the Azure values.
    let aws = render(
        "ops",
        &json!({"cloud": {"provider": "aws", "aws": aws_values(),
                          "azure": {"workloadIdentity": true, "clientID": AZURE_CLIENT_ID,
                                    "clientSecretSecret": "azure-app"}}}),
    );
    let (labels, annotations) = pod_labels_and_account_annotations(&aws);
    assert_eq!(workload_label(&labels), None, "{labels}");
    assert!(
        annotations.get("azure.workload.identity/client-id").is_none(),
        "{annotations}"
    );
    assert_eq!(azure_secret_env(container(&aws, "nodewarden")), None);
}

#[test]
fn gcp_workload_identity_annotates_the_service_account() {
    let account = "nodewarden@my-project.iam.gserviceaccount.com";
    let annotations = |values: Value| pod_labels_and_account_annotations(&render("ops", &values)).1;
    let gcp = |service_account: &str| json!({"cloud": {"provider": "gcp", "gcp": {"clusterUID": "uid-1", "serviceAccount": service_account}}});
    assert_eq!(
        annotations(gcp(account)),
        json!({"iam.gke.io/gcp-service-account": account})
    );
    assert!(
        annotations(gcp("")).is_null(),
        "no Workload Identity, no annotation"
    );
    // Beside the user's own annotations.
    let mut values = gcp(account);
    values["serviceAccount"] = json!({"annotations": {"example.com/owner": "platform"}});
    assert_eq!(
        annotations(values),
        json!({"example.com/owner": "platform", "iam.gke.io/gcp-service-account": account})
    );
    // Another cloud's release ignores it.
    let aws = json!({"cloud": {"provider": "aws", "aws": aws_values(),
                               "gcp": {"serviceAccount": account}}});
    let aws = annotations(aws);
    assert!(aws.get("iam.gke.io/gcp-service-account").is_none(), "{aws}");
}

#[test]
fn another_release_name_names_its_cluster_objects_and_tells_nodewarden() {
    let docs = Release::new("edge", "ops", json!({}))
        .template()
        .unwrap_or_else(|e| panic!("helm template failed:\n{e}"));
    // Cluster-scoped names carry the release; the webhook's Service keeps
    // the name nodewarden's own certificate is made for.
    for kind in [
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
    ] {
        assert!(has(&docs, kind, "edge-nodewarden"), "no {kind} edge-nodewarden");
    }
    assert!(has(&docs, "Service", "nodewarden-webhook"));
    let args = container(&docs, "edge-nodewarden")["args"].clone();
    assert!(
        args.as_array()
            .is_some_and(|a| a.iter().any(|x| x == "--webhook-configuration=edge-nodewarden")),
        "nodewarden keeps the caBundle of the configuration the release made: {args}"
    );
    let rules = &find(&docs, "ClusterRole", "edge-nodewarden")["rules"];
    let webhook_rule = rules
        .as_array()
        .and_then(|r| {
            r.iter()
                .find(|r| r["resources"] == json!(["validatingwebhookconfigurations"]))
        })
        .expect("a rule for the webhook configuration");
    assert_eq!(webhook_rule["resourceNames"], json!(["edge-nodewarden"]));
}

#[test]
fn production_settings_render_safe_defaults_and_what_is_given() {
    let docs = render(SYSTEM_NAMESPACE, &json!({}));
    let spec = &find(&docs, "Deployment", "nodewarden")["spec"]["template"]["spec"];
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    assert_eq!(spec["nodeSelector"], json!({"kubernetes.io/os": "linux"}));
    // Over zones and nodes, as a preference, so one node still runs every
    // replica; the anti-affinity stays for nodes without a zone label.
    let spread = spec["topologySpreadConstraints"]
        .as_array()
        .expect("spread constraints");
    let keys: Vec<&str> = spread.iter().filter_map(|c| c["topologyKey"].as_str()).collect();
    assert_eq!(keys, ["topology.kubernetes.io/zone", "kubernetes.io/hostname"]);
    for c in spread {
        assert_eq!(c["whenUnsatisfiable"], "ScheduleAnyway", "{c}");
        assert_eq!(c["maxSkew"], 1, "{c}");
        assert_eq!(
            c["labelSelector"]["matchLabels"],
            json!({"app.kubernetes.io/name": "nodewarden"})
        );
        assert_eq!(c["matchLabelKeys"], json!(["pod-template-hash"]), "{c}");
    }
    let anti = &spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
    let c = container(&docs, "nodewarden");
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}})
    );
    assert!(c.get("envFrom").is_none(), "{c}");
    assert_eq!(
        find(&docs, "PodDisruptionBudget", "nodewarden")["spec"]["minAvailable"],
        2
    );
    assert!(has(&docs, "Namespace", "medik8s-leases"));

    let given = render(
        "ops",
        &json!({
            "replicas": 1,
            "priorityClassName": "",
            "nodeSelector": null,
            "topologySpreadConstraints": [],
            "podLabels": {"example.com/team": "nodes", "app.kubernetes.io/name": "other"},
            "plans": {"controllerEnvConfigMap": "default-controller-env"},
            "cloud": {"provider": "aws", "aws": aws_values()},
            "maintenance": {"createLeaseNamespace": false},
            "extraVolumes": [{"name": "proxy-ca", "configMap": {"name": "proxy-ca"}}],
            "extraVolumeMounts": [{"name": "proxy-ca", "mountPath": "/etc/proxy-ca"}],
        }),
    );
    let template = &find(&given, "Deployment", "nodewarden")["spec"]["template"];
    let spec = &template["spec"];
    for absent in ["priorityClassName", "nodeSelector", "topologySpreadConstraints"] {
        assert!(spec.get(absent).is_none(), "{absent}: {spec}");
    }
    // The selector label stays the chart's.
    assert_eq!(
        template["metadata"]["labels"],
        json!({"app.kubernetes.io/name": "nodewarden", "app.kubernetes.io/instance": "nodewarden",
               "example.com/team": "nodes"})
    );
    // The System Upgrade Controller's settings, optional as upstream's; the
    // AWS ConfigMap last, so its settings win.
    let c = container(&given, "nodewarden");
    assert_eq!(
        c["envFrom"],
        json!([{"configMapRef": {"name": "default-controller-env", "optional": true}},
               {"configMapRef": {"name": "nodewarden-aws"}}])
    );
    let mounts = c["volumeMounts"].as_array().expect("mounts");
    assert_eq!(
        mounts.last(),
        Some(&json!({"name": "proxy-ca", "mountPath": "/etc/proxy-ca"}))
    );
    let volumes = spec["volumes"].as_array().expect("volumes");
    assert_eq!(
        volumes.last(),
        Some(&json!({"name": "proxy-ca", "configMap": {"name": "proxy-ca"}}))
    );
    // One replica: no budget (it would block every drain of its node).
    assert!(!has(&given, "PodDisruptionBudget", "nodewarden"));
    // medik8s-leases as another tool made it: not rendered, the Leases' Role still there.
    assert!(!given.iter().any(|d| d["kind"] == "Namespace"));
    assert_eq!(
        find(&given, "Role", "nodewarden-node-leases")["metadata"]["namespace"],
        "medik8s-leases"
    );
}

#[test]
fn etcd_on_control_plane_takes_the_boolean_that_set_gives() {
    // `--set etcd.onControlPlane=false` gives a boolean, `--set-string` a string.
    for (values, flag, host_pki) in [
        (
            json!({"etcd": {"onControlPlane": false}}),
            "--etcd-on-control-plane=false",
            false,
        ),
        (
            json!({"etcd": {"onControlPlane": "false"}}),
            "--etcd-on-control-plane=false",
            false,
        ),
        (
            json!({"etcd": {"onControlPlane": true}}),
            "--etcd-on-control-plane=true",
            true,
        ),
        (
            json!({"webhook": {"etcdOnControlPlane": false}}),
            "--etcd-on-control-plane=false",
            false,
        ),
    ] {
        let docs = render(SYSTEM_NAMESPACE, &values);
        assert!(
            args(&docs).iter().any(|a| a == flag),
            "{values}: {:?}",
            args(&docs)
        );
        let pki = args(&docs).iter().any(|a| a.starts_with("--etcd-pki-dir="));
        assert_eq!(pki, host_pki, "{values}: the host's etcd certificates");
    }
}

#[test]
fn the_schema_refuses_bad_values_naming_them() {
    let bad = [
        (
            json!({"cloud": {"provider": "openstack"}}),
            "at '/cloud/provider'",
        ),
        (
            json!({"cloud": {"gcp": {"serviceAccount": "nodewarden"}}}),
            "at '/cloud/gcp/serviceAccount'",
        ),
        (
            json!({"cloud": {"azure": {"clientID": "nodewarden"}}}),
            "at '/cloud/azure/clientID'",
        ),
        (
            json!({"cloud": {"azure": {"workloadIdentity": "yes"}}}),
            "at '/cloud/azure/workloadIdentity'",
        ),
        (
            json!({"webhook": {"certificates": "self-signed"}}),
            "at '/webhook/certificates'",
        ),
        (json!({"replicas": 0}), "at '/replicas'"),
        (json!({"replicas": "3"}), "at '/replicas'"),
        (json!({"replica": 3}), "'replica' not allowed"),
        (json!({"sip": "maybe"}), "at '/sip'"),
        (
            json!({"image": {"pullPolicy": "Sometimes"}}),
            "at '/image/pullPolicy'",
        ),
        (
            json!({"rollout": {"maxSurge": "a lot"}}),
            "at '/rollout/maxSurge'",
        ),
        (
            json!({"rollout": {"joinTimeout": "30 minutes"}}),
            "at '/rollout/joinTimeout'",
        ),
        (json!({"workers": 0}), "at '/workers'"),
        (
            json!({"cloud": {"aws": {"roleARN": "nodewarden"}}}),
            "at '/cloud/aws/roleARN'",
        ),
        (
            json!({"networkPolicy": {"enabled": true, "webhookFrom": ["the control plane"]}}),
            "at '/networkPolicy/webhookFrom/0'",
        ),
        (
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]}),
            "at '/topologySpreadConstraints/0/whenUnsatisfiable'",
        ),
        (
            json!({"extraVolumeMounts": [{"name": "ca"}]}),
            "at '/extraVolumeMounts/0'",
        ),
        (
            json!({"plans": {"controllerEnvConfigMap": "Default Env"}}),
            "at '/plans/controllerEnvConfigMap'",
        ),
    ];
    for (values, names) in bad {
        match Release::new("nodewarden", SYSTEM_NAMESPACE, values.clone()).template() {
            Ok(_) => panic!("the chart rendered with {values}"),
            Err(e) => {
                assert!(
                    e.contains("don't meet the specifications of the schema"),
                    "{values}: {e}"
                );
                assert!(e.contains(names), "the refusal of {values} names {names}: {e}");
            }
        }
    }
}

#[test]
fn a_missing_required_value_is_refused_naming_it() {
    let aws = |region: &str, uid: &str| json!({"cloud": {"provider": "aws", "aws": {"region": region, "clusterUID": uid}}});
    let azure = |azure: Value| json!({"cloud": {"provider": "azure", "azure": azure}});
    let missing = [
        (
            aws("eu-west-1", ""),
            "cloud.aws.clusterUID is required: the value of the Auto Scaling groups' constellation-uid tag",
        ),
        (aws("", "uid-1"), "cloud.aws.region is required"),
        (
            json!({"cloud": {"provider": "gcp"}}),
            "cloud.gcp.clusterUID is required: the value of the instance templates' constellation-uid label",
        ),
        (
            azure(json!({"subscription": "s", "resourceGroup": "rg"})),
            "cloud.azure.clusterUID is required: the value of the scale sets' constellation-uid tag",
        ),
        (
            azure(json!({"clusterUID": "uid-1", "resourceGroup": "rg"})),
            "cloud.azure.subscription is required: the subscription of the cluster's scale sets",
        ),
        (
            azure(json!({"clusterUID": "uid-1", "subscription": "s"})),
            "cloud.azure.resourceGroup is required: the resource group of the cluster's scale sets",
        ),
        (
            azure(
                json!({"clusterUID": "uid-1", "subscription": "s", "resourceGroup": "rg",
                         "workloadIdentity": true}),
            ),
            "cloud.azure.clientID is required with cloud.azure.workloadIdentity",
        ),
        (
            azure(
                json!({"clusterUID": "uid-1", "subscription": "s", "resourceGroup": "rg",
                         "clientSecretSecret": "azure-app", "clientID": AZURE_CLIENT_ID}),
            ),
            "cloud.azure.tenantID is required with cloud.azure.clientSecretSecret",
        ),
        (
            json!({"networkPolicy": {"enabled": true}}),
            "networkPolicy.webhookFrom is required with networkPolicy.enabled",
        ),
    ];
    for (values, message) in missing {
        match Release::new("nodewarden", SYSTEM_NAMESPACE, values.clone()).template() {
            Ok(_) => panic!("the chart rendered with {values}"),
            Err(e) => assert!(
                e.contains(message),
                "the refusal of {values} says {message:?}: {e}"
            ),
        }
    }
}

#[tokio::test]
async fn every_rendered_object_passes_a_server_side_dry_run() {
    let env = TestEnv::new("chart-dry-run").await;
    support::install_crds(&env.client).await;
    // The release goes to the test's namespace (it exists); medik8s-leases,
    // as manifests/base makes it (idempotent, left for the other tests).
    support::apply_manifest(
        &env.client,
        &support::repo().join("manifests/base/namespace.yaml"),
    )
    .await;
    let mut sets = choices();
    // The maintenance Leases in the release namespace: no second namespace
    // to make, and --maintenance-lease-namespace rendered.
    sets.push(("everything".into(), everything(&env.namespace)));

    // Each distinct object once (the CRDs and most RBAC are the same in every choice).
    let mut objects: Vec<(String, Value)> = Vec::new();
    for (what, values) in &sets {
        for doc in render(&env.namespace, values) {
            if !objects.iter().any(|(_, seen)| *seen == doc) {
                objects.push((what.clone(), doc));
            }
        }
    }
    let (mut failures, mut skipped) = (Vec::new(), BTreeSet::new());
    for (i, (what, doc)) in objects.iter().enumerate() {
        let obj = to_object(what, i, doc.clone());
        match apply(&env.client, &obj, true).await {
            Ok(Applied::Done(_)) => {}
            Ok(Applied::NotServed(_)) if OPTIONAL_GROUPS.contains(&gvk_of(&obj).group.as_str()) => {
                skipped.insert(describe(what, &obj));
            }
            Ok(Applied::NotServed(e)) | Err(e) => failures.push(format!("{}: {e}", describe(what, &obj))),
        }
    }
    // A Deployment's dry run admits no pod: each distinct pod template is
    // dry-run as a Pod too, so the pod admission plugins judge it (the
    // priority class outside kube-system, Pod Security, the pod's own
    // validation). The release's ServiceAccount exists only as a dry run:
    // the namespace's default stands in.
    let mut pods = 0;
    for (what, doc) in objects.iter().filter(|(_, d)| d["kind"] == "Deployment") {
        let template = &doc["spec"]["template"];
        let mut spec = template["spec"].clone();
        spec["serviceAccountName"] = json!("default");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("pod-{pods}"), "namespace": env.namespace,
                         "labels": template["metadata"]["labels"]},
            "spec": spec,
        });
        pods += 1;
        let obj = to_object(what, pods, pod);
        match apply(&env.client, &obj, true).await {
            Ok(Applied::Done(admitted)) => {
                let (class, priority) = (
                    &doc["spec"]["template"]["spec"]["priorityClassName"],
                    &admitted.data["spec"]["priority"],
                );
                if class == "system-cluster-critical" && *priority != json!(2_000_000_000) {
                    failures.push(format!(
                        "{what}: the pod's priority is {priority}, not system-cluster-critical's"
                    ));
                }
            }
            Ok(Applied::NotServed(e)) | Err(e) => failures.push(format!("{what}: its pod: {e}")),
        }
    }
    env.cleanup().await;
    println!(
        "{} distinct objects and {pods} pods dry-run; skipped (API not served here): {skipped:?}",
        objects.len()
    );
    assert!(
        failures.is_empty(),
        "rendered objects fail a server-side dry run:\n{}",
        failures.join("\n")
    );
}

/// Helm's labels, which the chart puts on every object and the kustomize
/// manifests do not carry.
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// The chart's own annotations: Helm keeps the Namespaces it renders on
/// uninstall, and a changed AWS ConfigMap rolls the pods (kustomize's hashed
/// ConfigMap name does that).
const HELM_ANNOTATIONS: [&str; 2] = ["helm.sh/resource-policy", "checksum/aws"];

/// Takes out of a rendered object what legitimately differs between the
/// chart and kustomize: Helm's labels and annotations (empty maps removed),
/// the order of the container's flags after `run` (clap takes them in any
/// order) and the image tag (base's is a placeholder; the chart's is its
/// appVersion, checked against the crate's version separately).
fn normalize(doc: &mut Value) {
    for meta in ["/metadata", "/spec/template/metadata"] {
        let Some(Value::Object(meta)) = doc.pointer_mut(meta) else {
            continue;
        };
        for (field, drop) in [
            ("labels", &HELM_LABELS[..]),
            ("annotations", &HELM_ANNOTATIONS[..]),
        ] {
            if let Some(Value::Object(map)) = meta.get_mut(field) {
                map.retain(|k, _| !drop.contains(&k.as_str()));
                if map.is_empty() {
                    meta.remove(field);
                }
            }
        }
    }
    if let Some(Value::Array(containers)) = doc.pointer_mut("/spec/template/spec/containers") {
        for c in containers {
            if let Some(Value::Array(args)) = c.get_mut("args")
                && !args.is_empty()
            {
                args[1..].sort_by_key(|a| a.to_string());
            }
            if let Some(image) = c["image"].as_str() {
                let repository = image.rsplit_once(':').map_or(image, |(repository, _)| repository);
                c["image"] = json!(repository);
            }
        }
    }
}

/// `apiVersion kind namespace/name`: what identifies an object.
fn key(doc: &Value) -> String {
    format!(
        "{} {} {}/{}",
        doc["apiVersion"].as_str().unwrap_or_default(),
        doc["kind"].as_str().unwrap_or_default(),
        doc["metadata"]["namespace"].as_str().unwrap_or_default(),
        doc["metadata"]["name"].as_str().unwrap_or_default()
    )
}

/// Where `chart` and `kustomize` differ, one line per leaf.
fn differences(path: &str, chart: &Value, kustomize: &Value, out: &mut Vec<String>) {
    match (chart, kustomize) {
        (Value::Object(a), Value::Object(b)) => {
            for k in a.keys().chain(b.keys()).collect::<BTreeSet<_>>() {
                let (x, y) = (a.get(k).unwrap_or(&Value::Null), b.get(k).unwrap_or(&Value::Null));
                differences(&format!("{path}/{k}"), x, y, out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}/{i}"), x, y, out);
            }
        }
        // kustomize prints the CRDs' `minimum: 0.0` as 0: the same number.
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        _ if chart != kustomize => out.push(format!("{path}: chart {chart} / kustomize {kustomize}")),
        _ => {}
    }
}

/// A kustomization of the base with `component` (as a user's overlay adds
/// it), in a directory of its own under target/.
fn base_with(component: &str) -> PathBuf {
    let dir = support::repo().join(format!("target/kustomize-chart-{component}"));
    std::fs::create_dir_all(&dir).expect("a kustomization directory");
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!("resources: [../../manifests/base]\ncomponents: [../../manifests/{component}]\n"),
    )
    .expect("writing the kustomization");
    dir
}

/// kustomize's rendering, with what only the overlay does taken out: the
/// generated ConfigMap's hash suffix (the chart names it plainly and rolls
/// the pods by an annotation instead) and its missing labels (the chart
/// labels it as every object), and the aws overlay's empty placeholders for
/// the cluster tag and the region (the chart requires both: the chart's
/// values are put in).
fn kustomized(dir: &Path, chart: &[Value]) -> Vec<Value> {
    let mut docs = kustomize(dir);
    for doc in &mut docs {
        let name = doc["metadata"]["name"].as_str().unwrap_or_default().to_string();
        if doc["kind"] == "ConfigMap" && name.starts_with("nodewarden-aws-") {
            doc["metadata"]["name"] = json!("nodewarden-aws");
            doc["metadata"]["labels"] = json!({"app.kubernetes.io/name": "nodewarden"});
            let rendered = &find(chart, "ConfigMap", "nodewarden-aws")["data"];
            for key in ["NODEWARDEN_AWS_CLUSTER_UID", "AWS_REGION"] {
                let placeholder = &mut doc["data"][key];
                assert_eq!(*placeholder, "", "the aws overlay's {key} is a placeholder");
                *placeholder = rendered[key].clone();
            }
        }
        if let Some(Value::Array(from)) = doc.pointer_mut("/spec/template/spec/containers/0/envFrom") {
            for f in from {
                if f["configMapRef"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("nodewarden-aws-"))
                {
                    f["configMapRef"]["name"] = json!("nodewarden-aws");
                }
            }
        }
    }
    docs
}

#[test]
fn the_chart_renders_what_kustomize_renders_for_the_same_choices() {
    let repo = support::repo();
    let created = json!({"create": true});
    let comparisons = [
        ("manifests/base", repo.join("manifests/base"), json!({})),
        (
            "manifests/aws",
            repo.join("manifests/aws"),
            json!({"cloud": {"provider": "aws", "aws": aws_values()}}),
        ),
        (
            "manifests/sim",
            repo.join("manifests/sim"),
            json!({"cloud": {"provider": "sim"}}),
        ),
        (
            "base + manifests/cert-manager",
            base_with("cert-manager"),
            json!({"webhook": {"certificates": "cert-manager"}}),
        ),
        (
            "base + manifests/networkpolicy",
            base_with("networkpolicy"),
            json!({"networkPolicy": {"enabled": true, "webhookFrom": ["192.0.2.0/24"]}}),
        ),
    ];
    for (what, dir, mut values) in comparisons {
        // The base makes nodewarden-system: the chart renders its release
        // namespace on request (else `helm install --create-namespace` makes it).
        values["namespace"] = created.clone();
        let chart = render(SYSTEM_NAMESPACE, &values);
        let image = container(&chart, "nodewarden")["image"].clone();
        assert_eq!(
            image,
            format!("ghcr.io/nodewarden/nodewarden:{}", env!("CARGO_PKG_VERSION")),
            "the chart's default image is the crate's version"
        );
        let kustomize = kustomized(&dir, &chart);
        let by_key = |docs: &[Value]| -> BTreeMap<String, Value> {
            docs.iter()
                .map(|d| {
                    let mut d = d.clone();
                    normalize(&mut d);
                    (key(&d), d)
                })
                .collect()
        };
        let (ours, theirs) = (by_key(&chart), by_key(&kustomize));
        let only = |a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>| -> Vec<String> {
            a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
        };
        assert!(
            ours.len() == theirs.len() && only(&ours, &theirs).is_empty(),
            "{what}: the chart renders other objects than kustomize\nonly in the chart: {:?}\nonly in kustomize: {:?}",
            only(&ours, &theirs),
            only(&theirs, &ours)
        );
        let mut found = Vec::new();
        for (k, doc) in &ours {
            let mut diffs = Vec::new();
            differences("", doc, &theirs[k], &mut diffs);
            found.extend(diffs.into_iter().map(|d| format!("{k}: {d}")));
        }
        assert!(
            found.is_empty(),
            "{what}: the chart differs from kustomize:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn the_charts_copies_and_monitoring_objects_are_the_repositorys() {
    let repo = support::repo();
    let chart = chart_dir();
    for (copy, source, how) in [
        ("crds/crds.yaml", "manifests/base/crds.yaml", "just crds"),
        (
            "files/alerts.yaml",
            "observability/alerts.yaml",
            "cp observability/alerts.yaml charts/nodewarden/files/",
        ),
    ] {
        let read =
            |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
        assert!(
            read(&chart.join(copy)) == read(&repo.join(source)),
            "charts/nodewarden/{copy} differs from {source}: run `{how}`"
        );
    }
    let meta: Value =
        serde_norway::from_str(&std::fs::read_to_string(chart.join("Chart.yaml")).expect("Chart.yaml"))
            .expect("Chart.yaml is YAML");
    assert_eq!(
        meta["appVersion"],
        env!("CARGO_PKG_VERSION"),
        "Chart.yaml's appVersion is the crate's version"
    );

    let docs = render(
        SYSTEM_NAMESPACE,
        &json!({"metrics": {"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}}}),
    );
    let single = |file: &str| {
        support::manifests::documents(&repo.join(file))
            .pop()
            .unwrap_or_else(|| panic!("{file} is empty"))
    };
    let mut monitor = find(&docs, "ServiceMonitor", "nodewarden").clone();
    normalize(&mut monitor);
    let mut diffs = Vec::new();
    differences(
        "",
        &monitor,
        &single("observability/servicemonitor.yaml"),
        &mut diffs,
    );
    assert!(
        diffs.is_empty(),
        "the ServiceMonitor differs from observability's:\n{}",
        diffs.join("\n")
    );
    // The rules as alerts.yaml has them: Prometheus's {{ $labels }} left alone.
    let rule = find(&docs, "PrometheusRule", "nodewarden");
    assert_eq!(
        rule["spec"]["groups"],
        single("observability/alerts.yaml")["groups"]
    );
}

#[test]
fn nodewarden_run_takes_every_flag_the_chart_renders() {
    let mut sets = choices();
    sets.push(("everything".into(), everything("node-leases")));
    let mut azure = azure_values();
    azure["endpoint"] = json!("http://127.0.0.1:8443");
    sets.push((
        "azure with its endpoint".into(),
        json!({"cloud": {"provider": "azure", "azure": azure}}),
    ));
    for (what, values) in sets {
        let docs = render(SYSTEM_NAMESPACE, &values);
        let args = args(&docs);
        // clap checks every argument (name, value, repetition) before it
        // answers --help: success means `nodewarden run` takes them all.
        let out = std::process::Command::new(support::nodewarden_binary())
            .args(&args)
            .arg("--help")
            .output()
            .expect("running nodewarden");
        assert!(
            out.status.success(),
            "{what}: nodewarden refuses {args:?}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Deletes what the release `name` made outside the test's namespace (the
/// namespace itself goes with the test's cleanup).
async fn delete_cluster_objects(client: &kube::Client, name: &str) {
    let gone = DeleteParams::default();
    let _ = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete(name, &gone)
        .await;
    let _ = Api::<ClusterRoleBinding>::all(client.clone())
        .delete(name, &gone)
        .await;
    let _ = Api::<ClusterRole>::all(client.clone()).delete(name, &gone).await;
    let leases_role = format!("{name}-node-leases");
    let _ = Api::<RoleBinding>::namespaced(client.clone(), "medik8s-leases")
        .delete(&leases_role, &gone)
        .await;
    let _ = Api::<Role>::namespaced(client.clone(), "medik8s-leases")
        .delete(&leases_role, &gone)
        .await;
}

/// The cluster-wide objects of a release, deleted when dropped: also when
/// the test panics, as `TestEnv` cleans up after itself.
pub(crate) struct ReleaseObjects(pub(crate) String);

impl Drop for ReleaseObjects {
    fn drop(&mut self) {
        let name = self.0.clone();
        // A runtime of its own: Drop may run inside the test's runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async {
                let client = support::control_plane().client().await;
                delete_cluster_objects(&client, &name).await;
            });
        })
        .join();
    }
}

/// A test's namespace, with nodewarden's CRDs and medik8s-leases as
/// manifests/base makes it (idempotent, left for the other tests), and a
/// release into that namespace with `values`, managing only the test's
/// Nodes and objects and leaving medik8s-leases alone; its name (it
/// contains "nodewarden") names its cluster-wide objects.
async fn test_release(test: &str, mut values: Value) -> (TestEnv, Release) {
    let env = TestEnv::new(test).await;
    support::install_crds(&env.client).await;
    support::apply_manifest(
        &env.client,
        &support::repo().join("manifests/base/namespace.yaml"),
    )
    .await;
    let selector = env.run_selector();
    values["manage"] = json!({"nodes": selector, "objects": selector});
    values["maintenance"] = json!({"createLeaseNamespace": false});
    let release = Release::new(&format!("nodewarden-{}", env.id), &env.namespace, values);
    (env, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_started_as_the_rendered_deployment_takes_the_lease_and_serves_the_webhook() {
    let (env, release) = test_release("chart-replica", json!({"replicas": 1})).await;
    let name = release.name.clone();
    // Deleted however the test ends.
    let _made = ReleaseObjects(name.clone());
    let docs = release
        .template()
        .unwrap_or_else(|e| panic!("helm template failed:\n{e}"));
    run_as_rendered(&env, &name, &docs).await;
    env.cleanup().await;
}

/// Applies a release rendered into the test's namespace and runs its
/// Deployment's container as the kubelet would (one replica, the rendered
/// args and environment, a token of the rendered ServiceAccount): it takes
/// the Lease, answers /readyz, sets the webhook's caBundle, refuses a bad
/// NodeMaintenance, and is refused nothing by the rendered RBAC. The
/// release `name` must manage only the test's Nodes and objects.
pub(crate) async fn run_as_rendered(env: &TestEnv, name: &str, docs: &[Value]) {
    // The release as Helm would apply it, but for the CRDs (installed
    // above), the Deployment (the test runs its container itself: pods
    // would land on kwok nodes) and the webhook configuration (below).
    let webhook_port = support::admission::free_port();
    for (i, doc) in docs.iter().enumerate() {
        let mut doc = doc.clone();
        match doc["kind"].as_str() {
            Some("CustomResourceDefinition" | "Deployment") => continue,
            // As rendered, but calling the replica on loopback (the API
            // server cannot reach a Service without pods) and only for this
            // test's objects (failurePolicy Fail would judge every test's).
            Some("ValidatingWebhookConfiguration") => {
                let hook = &mut doc["webhooks"][0];
                hook["clientConfig"] = json!({"url": format!("https://127.0.0.1:{webhook_port}/validate")});
                hook["objectSelector"] = json!({"matchLabels": {RUN_LABEL: env.id}});
            }
            _ => {}
        }
        let obj = to_object("chart", i, doc);
        assert!(!is_namespace(&obj), "the release renders no namespace here");
        match apply(&env.client, &obj, false).await {
            Ok(Applied::Done(_)) => {}
            Ok(Applied::NotServed(e)) | Err(e) => panic!("applying {}: {e}", describe("chart", &obj)),
        }
    }

    // The authorizer learns of new bindings through informers: started at
    // once, the replica could be refused its first calls.
    support::rbac::wait_until_in_effect(&env.client, docs).await;
    let (replicas, identity) = start_as_rendered(env, name, docs, webhook_port).await;
    // The webhook: its own certificate in the release's Secret, the
    // caBundle set in the release's configuration (the ClusterRole names
    // it), and a review of a NodeMaintenance answered by the replica.
    support::admission::wait_ca_bundle(env, name).await;
    let nm = support::admission::maintenance(env, "missing-node", "no-such-node");
    let nms = Api::all(env.client.clone());
    support::admission::wait_webhook_answers(&nms, &nm).await;
    let refused = support::admission::create(&nms, &nm).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("invalid nodeName, no node with name no-such-node found")),
        "the webhook refuses a maintenance of a missing node: {refused:?}\n{}",
        replicas.tail_logs()
    );
    // Every call it made was allowed by the chart's RBAC.
    let log =
        std::fs::read_to_string(replica_log_dir(&env.id).join(format!("{identity}.log"))).unwrap_or_default();
    let forbidden: Vec<&str> = log.lines().filter(|l| l.contains("forbidden")).collect();
    assert!(
        forbidden.is_empty(),
        "the replica was refused:\n{}",
        forbidden.join("\n")
    );

    drop(replicas);
}

/// Starts the release's Deployment's container as the kubelet would (one
/// replica, the rendered args and environment, a token of the rendered
/// ServiceAccount, its webhook on `webhook_port`) and waits until it holds
/// the Lease in the release's namespace and answers /readyz. Returns it
/// running, and its identity (its pod's name).
async fn start_as_rendered(
    env: &TestEnv,
    name: &str,
    docs: &[Value],
    webhook_port: u16,
) -> (Replicas, String) {
    // The pod's container as the kubelet runs it: the rendered args and
    // environment, a token of the rendered ServiceAccount. Its addresses
    // are the harness's loopback ports (0.0.0.0:8080 and :9443 are the pod's).
    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &env.namespace, name, &dir).await;
    let c = container(docs, name);
    let identity = format!("{name}-0");
    let args: Vec<String> = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|a| *a != "run" && !a.starts_with("--http-addr=") && !a.starts_with("--webhook-addr="))
        .map(String::from)
        .collect();
    let mut envs = pod_environment(docs, c, &env.namespace, &identity);
    envs.push(("RUST_LOG".into(), "info".into()));
    let mut replicas = Replicas::start_with_env(
        0,
        env,
        Shared {
            kubeconfig: &kubeconfig,
            lease_name: "nodewarden",
            otlp_endpoint: "",
            extra: &[],
            logs: &dir,
        },
        &[],
    );
    // Exactly the rendered container's: no test election timings, selectors or lease.
    replicas.args = args;
    replicas.election.clear();
    replicas.envs = envs;
    replicas.webhook = Some(BTreeMap::from([(identity.clone(), webhook_port)]));
    let replica = replicas.spawn(&identity);
    replicas.running.push(replica);

    // The Lease in the release's namespace, taken under its default name.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_for(
        "the replica holding the Lease",
        Duration::from_secs(30),
        || async {
            match holder(&leases, "nodewarden").await {
                Some(h) if h == identity => Probe::Done(()),
                other => Probe::NotYet(format!("holder {other:?}\n{}", replicas.tail_logs())),
            }
        },
    )
    .await;
    let readyz = format!("http://{}/readyz", replicas.http[&identity]);
    wait_for("/readyz", Duration::from_secs(30), || async {
        match support::jaeger::http_get(&readyz).await {
            Ok(_) => Probe::Done(()),
            Err(e) => Probe::NotYet(e),
        }
    })
    .await;
    (replicas, identity)
}

/// A post-renderer (an executable in `dir`) that gives the webhook an
/// objectSelector of the test's run label: installed by Helm, the webhook
/// (failurePolicy Fail, calling a Service no pod serves here) must judge no
/// other test's NodeMaintenances.
fn webhook_for_the_test_only(env: &TestEnv, dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("post-render");
    let script = format!(
        "#!/bin/sh\nexec sed 's|^    failurePolicy: Fail$|    objectSelector: {{matchLabels: {{{RUN_LABEL}: {id}}}}}\\n    failurePolicy: Fail|'\n",
        id = env.id
    );
    std::fs::write(&path, script).expect("writing the post-renderer");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("making it executable");
    path
}

/// What the test's namespace holds beyond what every namespace has (its
/// `default` ServiceAccount and `kube-root-ca.crt` ConfigMap) and Events,
/// which expire: every kind the API server lists there, by discovery.
async fn left_in_namespace(env: &TestEnv) -> Vec<String> {
    use kube::discovery::{Discovery, Scope, verbs};
    let discovery = Discovery::new(env.client.clone()).run().await.expect("discovery");
    let mut left = Vec::new();
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if caps.scope != Scope::Namespaced
                || !caps.supports_operation(verbs::LIST)
                || resource.kind == "Event"
            {
                continue;
            }
            let api: Api<kube::core::DynamicObject> =
                Api::namespaced_with(env.client.clone(), &env.namespace, &resource);
            let Ok(list) = api.list(&Default::default()).await else {
                continue;
            };
            for item in list.items {
                let name = item.metadata.name.unwrap_or_default();
                let everywhere = matches!(
                    (resource.kind.as_str(), name.as_str()),
                    ("ServiceAccount", "default") | ("ConfigMap", "kube-root-ca.crt")
                );
                if !everywhere {
                    left.push(format!("{} {name}", resource.kind));
                }
            }
        }
    }
    left
}

/// The Helm ownership of an object: its managed-by label and release annotation.
fn helm_owner(meta: &kube::api::ObjectMeta) -> (Option<&str>, Option<&str>) {
    (
        meta.labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .map(String::as_str),
        meta.annotations
            .as_ref()
            .and_then(|a| a.get("meta.helm.sh/release-name"))
            .map(String::as_str),
    )
}

/// Whether `api` holds an object named `name`.
async fn exists<K>(api: Api<K>, name: &str) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name)
        .await
        .unwrap_or_else(|e| panic!("reading {name}: {e}"))
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_leaves_nothing_of_the_release_behind() {
    use k8s_openapi::api::core::v1::{Pod, Secret};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    // The defaults (3 replicas, their budget, the webhook with nodewarden's
    // own certificates); the pods wait for a node that never comes (the
    // test runs the container itself), so they hold up no other test's drain.
    let (env, mut release) = test_release("chart-uninstall", json!({})).await;
    release.values["nodeSelector"] = json!({RUN_LABEL: env.id});
    let name = release.name.clone();
    let _made = ReleaseObjects(name.clone());
    let scratch = tempfile::tempdir().expect("a directory");
    let renderer = webhook_for_the_test_only(&env, scratch.path());
    let docs = release
        .template_through(&renderer)
        .unwrap_or_else(|e| panic!("helm template failed:\n{e}"));
    assert_eq!(
        find(&docs, "ValidatingWebhookConfiguration", &name)["webhooks"][0]["objectSelector"],
        json!({"matchLabels": {RUN_LABEL: env.id}}),
        "the webhook judges this test's objects only"
    );
    let kubeconfig = support::control_plane().kubeconfig.clone();
    if let Err(e) = release.install(&kubeconfig, &renderer) {
        panic!("helm install failed:\n{e}");
    }

    // The ReplicaSet's pods are admitted with system-cluster-critical outside kube-system.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_for("the release's 3 pods", Duration::from_secs(60), || async {
        match pods.list(&Default::default()).await {
            Ok(list) if list.items.len() == 3 => Probe::Done(list.items),
            Ok(list) => Probe::NotYet(format!("{} pods", list.items.len())),
            Err(e) => Probe::NotYet(e.to_string()),
        }
    })
    .await
    .iter()
    .for_each(|pod| {
        let spec = pod.spec.as_ref().expect("a spec");
        assert_eq!(
            (spec.priority_class_name.as_deref(), spec.priority),
            (Some("system-cluster-critical"), Some(2_000_000_000))
        );
    });

    // A replica takes the Lease Helm made empty and fills the Secret Helm
    // made empty; both stay Helm's.
    let (replicas, identity) = start_as_rendered(&env, &name, &docs, support::admission::free_port()).await;
    support::admission::wait_ca_bundle(&env, &name).await;
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let secret = wait_for(
        "the certificates in the Secret",
        Duration::from_secs(30),
        || async {
            match secrets.get("nodewarden-webhook-tls").await {
                Ok(s) if s.data.as_ref().is_some_and(|d| d.contains_key("tls.crt")) => Probe::Done(s),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(helm_owner(&secret.metadata), (Some("Helm"), Some(name.as_str())));
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.namespace);
    let lease = leases.get("nodewarden").await.expect("the Lease");
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
        Some(identity.as_str())
    );
    assert!(
        lease.spec.as_ref().and_then(|s| s.renew_time.as_ref()).is_some(),
        "renewed"
    );
    assert_eq!(helm_owner(&lease.metadata), (Some("Helm"), Some(name.as_str())));

    // Uninstalled while the replica still runs, as the pods do until they
    // are stopped: nothing of the release stays, or comes back once its
    // RBAC is gone.
    if let Err(e) = release.uninstall(&kubeconfig) {
        panic!("helm uninstall failed:\n{e}");
    }
    wait_for(
        "nothing of the release in its namespace",
        Duration::from_secs(60),
        || async {
            match left_in_namespace(&env).await {
                left if left.is_empty() => Probe::Done(()),
                left => Probe::NotYet(format!("{left:?}")),
            }
        },
    )
    .await;
    // Past a few of the leader's renewals (every 2 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let left = left_in_namespace(&env).await;
    assert!(
        left.is_empty(),
        "back after the uninstall: {left:?}\n{}",
        replicas.tail_logs()
    );
    drop(replicas);
    let client = &env.client;
    let leases_role = format!("{name}-node-leases");
    for (left, what) in [
        (
            exists(Api::<ClusterRole>::all(client.clone()), &name).await,
            "the ClusterRole",
        ),
        (
            exists(Api::<ClusterRoleBinding>::all(client.clone()), &name).await,
            "the ClusterRoleBinding",
        ),
        (
            exists(Api::<ValidatingWebhookConfiguration>::all(client.clone()), &name).await,
            "the webhook configuration",
        ),
        (
            exists(
                Api::<Role>::namespaced(client.clone(), "medik8s-leases"),
                &leases_role,
            )
            .await,
            "the Role of the maintenance Leases",
        ),
    ] {
        assert!(!left, "{what} outlived the release");
    }
    // Kept on purpose: the CRDs (and with them everyone's objects).
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    assert!(exists(crds, "nodemaintenances.nodemaintenance.medik8s.io").await);
    env.cleanup().await;
}
