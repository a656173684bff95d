//! The deployment manifests (`manifests/base/*.yaml` and the cloud overlays
//! `manifests/aws`, `manifests/sim`) against the real API server: every
//! document passes a server-side dry-run apply, each overlay renders with
//! kubectl's kustomize into what it promises, and the RBAC rules use no
//! wildcards.

use crate::support;

use std::path::PathBuf;

use crate::support::manifests::{
    Applied, apply, describe, documents, file_name, find, generated_config_map, is_namespace, kustomize,
    shipped_container, to_object,
};
use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// Every `manifests/base/*.yaml` but its kustomization, sorted.
fn manifest_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/base");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("reading manifests/base/")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    files
}

/// `(file name, object)` for every document of every manifest file.
fn all_objects() -> Vec<(String, DynamicObject)> {
    let files = manifest_files();
    for wanted in ["namespace.yaml", "rbac.yaml", "deployment.yaml", "crds.yaml"] {
        assert!(
            files.iter().any(|f| f.ends_with(wanted)),
            "manifests/base/{wanted} is missing (found {files:?})"
        );
    }
    let mut objects = Vec::new();
    for file in &files {
        let name = file_name(file);
        for (i, doc) in documents(file).into_iter().enumerate() {
            let obj = to_object(&name, i, doc);
            assert!(obj.types.is_some(), "{name} document {i} has no apiVersion/kind");
            objects.push((name.clone(), obj));
        }
    }
    objects
}

#[tokio::test]
async fn every_manifest_passes_a_server_side_dry_run() {
    let objects = all_objects();
    let env = support::TestEnv::new("manifests").await;
    support::install_crds(&env.client).await;

    // Namespaced objects cannot be dry-run into a namespace that does not
    // exist: really create the manifests' namespaces (idempotent, and left in
    // place: other tests use medik8s-leases).
    let namespaces: Vec<&(String, DynamicObject)> = objects.iter().filter(|(_, o)| is_namespace(o)).collect();
    let names: Vec<String> = namespaces.iter().map(|(_, o)| o.name_any()).collect();
    for wanted in ["nodewarden-system", "medik8s-leases"] {
        assert!(
            names.iter().any(|n| n == wanted),
            "no Namespace {wanted} in the manifests"
        );
    }
    for (file, ns) in &namespaces {
        match apply(&env.client, ns, false).await {
            Ok(Applied::Done(_)) => {}
            Ok(Applied::NotServed(e)) | Err(e) => panic!("creating {}: {e}", describe(file, ns)),
        }
    }

    let mut failures = Vec::new();
    for (file, obj) in &objects {
        match apply(&env.client, obj, true).await {
            Ok(Applied::Done(answer)) => assert_eq!(
                answer.name_any(),
                obj.name_any(),
                "the dry run of {} answered another object",
                describe(file, obj)
            ),
            // Every kind of the manifests must be served: a missing one fails too.
            Ok(Applied::NotServed(e)) | Err(e) => failures.push(format!("{}: {e}", describe(file, obj))),
        }
    }
    env.cleanup().await;
    assert!(
        failures.is_empty(),
        "{} of {} documents fail a server-side dry run:\n{}",
        failures.len(),
        objects.len(),
        failures.join("\n")
    );
}

/// The container args and `envFrom` ConfigMaps of the Deployment an overlay renders.
fn container(docs: &[Value]) -> (Vec<String>, Vec<String>) {
    let (_, args, from) = shipped_container(docs);
    (args, from)
}

#[tokio::test]
async fn each_cloud_overlay_renders_its_cloud_and_passes_a_server_side_dry_run() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let env = support::TestEnv::new("overlays").await;
    support::install_crds(&env.client).await;

    let aws = kustomize(&repo.join("manifests/aws"));
    let sa = find(&aws, "ServiceAccount", "nodewarden");
    assert!(
        sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"]
            .as_str()
            .is_some_and(|arn| arn.starts_with("arn:aws:iam::")),
        "the aws overlay's ServiceAccount carries the IRSA role annotation: {sa}"
    );
    let (name, data) = generated_config_map(&aws, "nodewarden-aws");
    for key in [
        "NODEWARDEN_CLOUD",
        "AWS_REGION",
        "NODEWARDEN_AWS_CLUSTER_UID",
        "NODEWARDEN_DISCOVER_SCALING_GROUPS",
    ] {
        assert!(data.contains_key(key), "{name} sets {key}: {data:?}");
    }
    assert_eq!(data["NODEWARDEN_CLOUD"], "aws");
    let (_, from) = container(&aws);
    assert_eq!(from, vec![name.clone()], "the Deployment reads {name}");

    let sim = kustomize(&repo.join("manifests/sim"));
    let (args, _) = container(&sim);
    for wanted in [
        "--cloud=sim",
        "--sim-cloud=http://sim-cloud.nodewarden-system:8090",
    ] {
        assert!(
            args.iter().any(|a| a == wanted),
            "sim overlay args {args:?} lack {wanted}"
        );
    }
    // The base without a cloud: neither argument nor configuration names one.
    let base = kustomize(&repo.join("manifests/base"));
    let (args, from) = container(&base);
    assert!(
        !args.iter().any(|a| a.starts_with("--cloud")) && from.is_empty(),
        "the base names no cloud: {args:?} {from:?}"
    );

    // The simulator the sim overlay calls, at the address it calls.
    let sim_cloud = kustomize(&repo.join("manifests/sim-cloud"));
    let service = find(&sim_cloud, "Service", "sim-cloud");
    assert_eq!(service["metadata"]["namespace"], "nodewarden-system");
    assert_eq!(service["spec"]["ports"][0]["port"], 8090);
    let sim_cloud_container =
        &find(&sim_cloud, "Deployment", "sim-cloud")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(sim_cloud_container["command"], json!(["/nodewarden-simcloud"]));

    let mut failures = Vec::new();
    for (overlay, docs) in [("aws", &aws), ("sim", &sim), ("sim-cloud", &sim_cloud)] {
        for (i, doc) in docs.iter().enumerate() {
            let obj = to_object(overlay, i, doc.clone());
            // Namespaces for real (idempotent, left in place), so the
            // namespaced objects can be dry-run into them.
            match apply(&env.client, &obj, !is_namespace(&obj)).await {
                Ok(Applied::Done(_)) => {}
                Ok(Applied::NotServed(e)) | Err(e) => {
                    failures.push(format!("{}: {e}", describe(overlay, &obj)))
                }
            }
        }
    }
    env.cleanup().await;
    assert!(
        failures.is_empty(),
        "overlay documents fail a dry run:\n{}",
        failures.join("\n")
    );
}

/// Every string in `value` (arrays of strings, or one string).
fn strings(value: &Value) -> Vec<&str> {
    match value {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn rbac_rules_use_no_wildcards() {
    let mut roles = 0;
    for (file, obj) in all_objects() {
        let is_role = obj.types.as_ref().is_some_and(|t| {
            t.api_version.starts_with("rbac.authorization.k8s.io/")
                && (t.kind == "Role" || t.kind == "ClusterRole")
        });
        if !is_role {
            continue;
        }
        roles += 1;
        let what = describe(&file, &obj);
        assert!(
            obj.data.get("aggregationRule").is_none(),
            "{what}: an aggregated role takes rules from elsewhere"
        );
        let rules = obj.data["rules"]
            .as_array()
            .unwrap_or_else(|| panic!("{what} has no rules"));
        assert!(!rules.is_empty(), "{what} has no rules");
        for (i, rule) in rules.iter().enumerate() {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                for s in strings(&rule[field]) {
                    assert!(
                        !s.contains('*'),
                        "{what} rule {i}: {field} contains a wildcard: {s:?}"
                    );
                }
            }
            assert!(
                !strings(&rule["verbs"]).is_empty(),
                "{what} rule {i} grants no verbs"
            );
            // Escalation verbs have no place in an operator's role.
            for verb in strings(&rule["verbs"]) {
                assert!(
                    !["escalate", "bind", "impersonate"].contains(&verb),
                    "{what} rule {i}: verb {verb:?}"
                );
            }
        }
    }
    assert!(
        roles >= 3,
        "expected the ClusterRole and two Roles, found {roles}"
    );
}

/// `just e2e`'s sim-cloud (e2e/kind/run.sh applies it; kind cannot run
/// here): manifests/sim-cloud with the locally loaded image, never pulled,
/// and the two groups the kind suite drives.
#[test]
fn the_kind_suites_sim_cloud_is_the_shipped_one_with_its_image_and_groups() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let shipped = kustomize(&repo.join("manifests/sim-cloud"));
    let kind = kustomize(&repo.join("e2e/kind/sim-cloud"));
    let container = |docs: &[Value]| {
        find(docs, "Deployment", "sim-cloud")["spec"]["template"]["spec"]["containers"][0].clone()
    };
    let (shipped_c, kind_c) = (container(&shipped), container(&kind));
    assert_eq!(shipped_c["image"], "ghcr.io/nodewarden/nodewarden:0.1.0");
    assert_eq!(kind_c["image"], "nodewarden:e2e");
    assert_eq!(kind_c["imagePullPolicy"], "Never");
    assert_eq!(kind_c["args"], shipped_c["args"]);
    let groups = find(&kind, "ConfigMap", "sim-cloud")["data"]["groups.yaml"]
        .as_str()
        .expect("groups.yaml")
        .to_string();
    for group in ["e2e-control-plane", "e2e-workers"] {
        assert!(groups.contains(&format!("id: {group}")), "{groups}");
    }
    let kinds = |docs: &[Value]| -> Vec<String> {
        docs.iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap_or_default(),
                    d["metadata"]["name"].as_str().unwrap_or_default()
                )
            })
            .collect()
    };
    assert_eq!(kinds(&kind), kinds(&shipped), "the same objects");
}
