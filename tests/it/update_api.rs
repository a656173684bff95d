//! The `update.edgeless.systems/v1alpha1` API (Constellation's node operator
//! kinds) against the real API server: every seed example applies unchanged,
//! bad input is refused with a message naming the field, defaults and the
//! status subresource work, and `kubectl get` has columns worth reading.

use crate::support;

use std::fmt::Debug;
use std::path::PathBuf;
use std::time::Duration;

use crate::support::update_samples::{self, delete_and_wait, dynamic_api};
use crate::support::{RUN_LABEL, TestEnv};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ClusterResourceScope;
use kube::{Client, Resource, ResourceExt};
use nodewarden::api::update::{
    AutoscalingStrategy, JoiningNode, NodeCounts, NodeRole, NodeVersion, NodeVersionStatus, PendingNode,
    Rollout, ScalingGroup,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const GROUP: &str = "update.edgeless.systems";

/// Every `manifests/samples/update-*.yaml`, sorted.
fn update_samples() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/samples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("reading manifests/samples")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("update-") && n.ends_with(".yaml"))
        })
        .collect();
    files.sort();
    files
}

/// The sample parses as the typed object, and the stored object reads back as one.
async fn typed_round_trip<K>(client: &Client, text: &str, name: &str)
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope> + Clone + Debug + DeserializeOwned,
{
    let parsed: K = serde_norway::from_str(text).unwrap_or_else(|e| panic!("{name} parses as typed: {e}"));
    assert_eq!(parsed.name_any(), name);
    Api::<K>::all(client.clone())
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("{name} reads back as the typed object: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_seed_example_applies_unchanged() {
    let _samples = update_samples::lock().lock().await;
    let env = TestEnv::new("update-samples").await;
    support::install_crds(&env.client).await;
    let files = update_samples();
    // Both Constellation READMEs: 2 NodeVersions, 1 AutoscalingStrategy,
    // 2 ScalingGroups and 2 PendingNodes each.
    assert_eq!(files.len(), 14, "{files:?}");
    // The sample names are fixed (several samples share one), so one at a
    // time: apply, check, delete.
    for file in &files {
        let shown = file.display();
        let text = std::fs::read_to_string(file).expect("reading a sample");
        let sample: DynamicObject = serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{shown}: {e}"));
        let kind = sample.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
        let name = sample.name_any();
        let api = dynamic_api(&env.client, &kind);
        delete_and_wait(&api, &name).await; // left over from an interrupted run
        let params = PatchParams::apply("nodewarden-samples").validation_strict();
        api.patch(&name, &params, &Patch::Apply(&sample))
            .await
            .unwrap_or_else(|e| panic!("{shown} must apply unchanged: {e}"));
        let stored = api.get(&name).await.expect("the applied sample");
        let spec = sample.data["spec"].as_object().expect("a spec");
        for (field, value) in spec {
            assert_eq!(
                &stored.data["spec"][field], value,
                "{shown}: spec.{field} stored unchanged"
            );
        }
        match kind.as_str() {
            "NodeVersion" => typed_round_trip::<NodeVersion>(&env.client, &text, &name).await,
            "ScalingGroup" => typed_round_trip::<ScalingGroup>(&env.client, &text, &name).await,
            "PendingNode" => typed_round_trip::<PendingNode>(&env.client, &text, &name).await,
            "AutoscalingStrategy" => typed_round_trip::<AutoscalingStrategy>(&env.client, &text, &name).await,
            other => panic!("unexpected kind {other} in {shown}"),
        }
        delete_and_wait(&api, &name).await;
    }
    env.cleanup().await;
}

/// An object of `kind` named `name` with `spec`, labelled with the test's run.
fn object(env: &TestEnv, kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": kind,
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": spec,
    }))
    .expect("an object")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_field() {
    let env = TestEnv::new("update-bad").await;
    support::install_crds(&env.client).await;
    let image = "projects/p/global/images/i";
    // (what, kind, spec, what the error must say)
    let cases: Vec<(&str, &str, Value, Vec<&str>)> = vec![
        (
            "empty image",
            "NodeVersion",
            json!({"image": ""}),
            vec!["spec.image must not be empty"],
        ),
        (
            "no image",
            "NodeVersion",
            json!({"imageVersion": "v1"}),
            vec!["spec.image", "Required value"],
        ),
        (
            "surge and unavailable both 0",
            "NodeVersion",
            json!({"image": image, "rollout": {"maxSurge": 0, "maxUnavailable": 0}}),
            vec!["maxSurge and spec.rollout.maxUnavailable must not both be 0"],
        ),
        (
            "surge 0 with the default unavailable",
            "NodeVersion",
            json!({"image": image, "rollout": {"maxSurge": 0}}),
            vec!["must not both be 0"],
        ),
        (
            "both 0 as percentages",
            "NodeVersion",
            json!({"image": image, "rollout": {"maxSurge": "0%", "maxUnavailable": "0%"}}),
            vec!["must not both be 0"],
        ),
        (
            "surge without %",
            "NodeVersion",
            json!({"image": image, "rollout": {"maxSurge": "25"}}),
            vec!["spec.rollout.maxSurge must be a count"],
        ),
        (
            "negative surge",
            "NodeVersion",
            json!({"image": image, "rollout": {"maxSurge": -1}}),
            vec!["spec.rollout.maxSurge must be a count"],
        ),
        (
            "unavailable over 100%",
            "NodeVersion",
            json!({"image": image, "rollout": {"maxUnavailable": "150%"}}),
            vec!["spec.rollout.maxUnavailable must be a count"],
        ),
        (
            "join timeout not a duration",
            "NodeVersion",
            json!({"image": image, "rollout": {"joinTimeout": "soon"}}),
            vec!["spec.rollout.joinTimeout must be a duration"],
        ),
        (
            "drain timeout not a duration",
            "NodeVersion",
            json!({"image": image, "rollout": {"drainTimeout": "5 minutes"}}),
            vec!["spec.rollout.drainTimeout must be a duration"],
        ),
        (
            "unknown role",
            "ScalingGroup",
            json!({"nodeImage": "v", "role": "Master"}),
            vec!["spec.role", "Unsupported value", "Worker", "ControlPlane"],
        ),
        (
            "min above max",
            "ScalingGroup",
            json!({"nodeImage": "v", "min": 3, "max": 1}),
            vec!["spec.min must not be greater than spec.max"],
        ),
        (
            "negative min",
            "ScalingGroup",
            json!({"min": -1}),
            vec!["spec.min must not be negative"],
        ),
        (
            "unknown goal",
            "PendingNode",
            json!({"nodeName": "n", "goal": "Stay"}),
            vec!["spec.goal", "Unsupported value"],
        ),
        (
            "deadline not a time",
            "PendingNode",
            json!({"nodeName": "n", "goal": "Join", "deadline": "tomorrow"}),
            vec!["spec.deadline"],
        ),
        (
            "empty autoscaler deployment",
            "AutoscalingStrategy",
            json!({"enabled": true, "deploymentName": "", "deploymentNamespace": "kube-system"}),
            vec!["spec.deploymentName must not be empty"],
        ),
        (
            "autoscaler flag written with its dashes",
            "AutoscalingStrategy",
            json!({"enabled": true, "deploymentName": "ca", "deploymentNamespace": "kube-system",
                   "autoscalerExtraArgs": {"--v": "2"}}),
            vec!["spec.autoscalerExtraArgs: keys are flag names without leading dashes"],
        ),
        (
            "autoscaler node groups written by hand",
            "AutoscalingStrategy",
            json!({"enabled": true, "deploymentName": "ca", "deploymentNamespace": "kube-system",
                   "autoscalerExtraArgs": {"nodes": "1:3:asg"}}),
            vec!["--nodes comes from the ScalingGroups"],
        ),
    ];
    let mut failures = Vec::new();
    for (i, (what, kind, spec, want)) in cases.into_iter().enumerate() {
        let api = dynamic_api(&env.client, kind);
        let name = env.name(&format!("bad-{i}"));
        match api
            .create(&PostParams::default(), &object(&env, kind, &name, spec))
            .await
        {
            Ok(_) => {
                failures.push(format!("{what}: accepted"));
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
            Err(e) => {
                let msg = e.to_string();
                println!("{what}: {msg}");
                if let Some(missing) = want.iter().find(|w| !msg.contains(**w)) {
                    failures.push(format!("{what}: error lacks {missing:?}: {msg}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_status_and_printer_columns_work_on_the_server() {
    let env = TestEnv::new("update-good").await;
    support::install_crds(&env.client).await;
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    let dyn_versions = dynamic_api(&env.client, "NodeVersion");
    let groups = dynamic_api(&env.client, "ScalingGroup");
    let image = "projects/p/global/images/i";
    let mut created: Vec<(Api<DynamicObject>, String)> = Vec::new();

    // No rollout: Constellation's behaviour; nothing is filled in, so an
    // absent field stays absent (the operator's default applies to it).
    let plain = env.name("plain");
    dyn_versions
        .create(
            &PostParams::default(),
            &object(&env, "NodeVersion", &plain, json!({"image": image})),
        )
        .await
        .expect("a NodeVersion without rollout");
    created.push((dyn_versions.clone(), plain.clone()));
    let got = versions.get(&plain).await.expect("the NodeVersion");
    assert_eq!(got.spec.rollout, Rollout::default());
    assert_eq!(got.spec.rollout_limits(12, &Rollout::default()).max_surge, 1);
    let operator = Rollout {
        max_surge: Some(IntOrString::Int(3)),
        ..Rollout::default()
    };
    assert_eq!(got.spec.rollout_limits(12, &operator).max_surge, 3);

    // Upstream's maxNodeBudget is the surge while maxSurge is unset; an
    // explicit maxSurge wins.
    for (suffix, spec, want_surge) in [
        ("budget", json!({"image": image, "maxNodeBudget": 3}), 3),
        ("budget-zero", json!({"image": image, "maxNodeBudget": 0}), 1),
        (
            "budget-and-surge",
            json!({"image": image, "maxNodeBudget": 3, "rollout": {"maxSurge": 2}}),
            2,
        ),
        (
            "budget-and-rollout",
            json!({"image": image, "maxNodeBudget": 4, "rollout": {"maxUnavailable": 1}}),
            4,
        ),
    ] {
        let name = env.name(suffix);
        dyn_versions
            .create(
                &PostParams::default(),
                &object(&env, "NodeVersion", &name, spec.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("a NodeVersion with {spec}: {e}"));
        created.push((dyn_versions.clone(), name.clone()));
        let got = versions.get(&name).await.expect("the NodeVersion");
        assert_eq!(
            got.spec.rollout_limits(12, &Rollout::default()).max_surge,
            want_surge,
            "{spec}"
        );
    }

    // A partial rollout (and a null): the rest is left to the defaults.
    let partial = env.name("partial");
    let rollout = json!({"maxSurge": "25%", "maxUnavailable": null, "drainTimeout": "1h30m"});
    let spec = json!({"image": image, "rollout": rollout});
    dyn_versions
        .create(
            &PostParams::default(),
            &object(&env, "NodeVersion", &partial, spec),
        )
        .await
        .expect("a NodeVersion with a partial rollout");
    created.push((dyn_versions.clone(), partial.clone()));
    let got = versions.get(&partial).await.expect("the NodeVersion");
    let rollout = &got.spec.rollout;
    assert_eq!(rollout.max_surge, Some(IntOrString::String("25%".into())));
    assert_eq!(rollout.max_unavailable, None);
    assert!(rollout.control_plane_first());
    assert_eq!(rollout.join_timeout(), Duration::from_secs(30 * 60));
    assert_eq!(rollout.drain_timeout(), Some(Duration::from_secs(5400)));
    assert_eq!(rollout.max_surge_for(12, 1), 3);

    // Surge 0 is fine when nodes may be unavailable instead.
    let in_place = env.name("in-place");
    let rollout = json!({"maxSurge": 0, "maxUnavailable": "10%", "controlPlaneFirst": false});
    let spec = json!({"image": image, "rollout": rollout});
    dyn_versions
        .create(
            &PostParams::default(),
            &object(&env, "NodeVersion", &in_place, spec),
        )
        .await
        .expect("surge 0 with unavailable 10%");
    created.push((dyn_versions.clone(), in_place.clone()));

    // Role defaults to Worker; min == max is fine.
    let group = env.name("group");
    groups
        .create(
            &PostParams::default(),
            &object(
                &env,
                "ScalingGroup",
                &group,
                json!({"nodeImage": plain, "min": 2, "max": 2}),
            ),
        )
        .await
        .expect("a ScalingGroup");
    created.push((groups.clone(), group.clone()));
    let got = Api::<ScalingGroup>::all(env.client.clone())
        .get(&group)
        .await
        .expect("the ScalingGroup");
    assert_eq!(got.spec.role, NodeRole::Worker);

    // A JoiningNode with Constellation's lowercase names.
    let joining = env.name("joining");
    let joinings = dynamic_api(&env.client, "JoiningNode");
    let spec = json!({"name": joining, "componentsreference": "k8s-components-abc",
                      "iscontrolplane": true, "deadline": "2030-01-01T00:00:00Z"});
    joinings
        .create(
            &PostParams::default(),
            &object(&env, "JoiningNode", &joining, spec),
        )
        .await
        .expect("a JoiningNode");
    created.push((joinings.clone(), joining.clone()));
    let got = Api::<JoiningNode>::all(env.client.clone())
        .get(&joining)
        .await
        .expect("the JoiningNode");
    assert_eq!(got.spec.components_reference, "k8s-components-abc");
    assert!(got.spec.is_control_plane);

    // The status subresource takes the counts and conditions; the main
    // resource ignores status.
    let mut status = NodeVersionStatus {
        budget: 3,
        ..Default::default()
    };
    status.set_counts(NodeCounts {
        nodes: 12,
        up_to_date: 7,
        outdated: 5,
        replacing: 3,
    });
    nodewarden::api::conditions::set_condition(
        &mut status.conditions,
        nodewarden::api::update::condition::OUTDATED,
        true,
        nodewarden::api::update::reason::NODE_VERSIONS_OUT_OF_DATE,
        "5 of 12 nodes are outdated",
        got.metadata.generation,
        k8s_openapi::jiff::Timestamp::now(),
    );
    versions
        .patch_status(
            &plain,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": status})),
        )
        .await
        .expect("writing the status");
    let got = versions.get(&plain).await.expect("the NodeVersion");
    let read = got.status.expect("a status");
    assert_eq!(read.progress.as_deref(), Some("7/12"));
    assert_eq!(read.outdated_nodes, Some(5));
    assert_eq!(read.budget, 3);
    assert_eq!(read.conditions[0].reason, "NodeVersionsOutOfDate");

    // What `kubectl get nodeversions` shows: the server's Table.
    let request = http::Request::get(format!("/apis/{GROUP}/v1alpha1/nodeversions/{plain}"))
        .header(
            http::header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .body(Vec::new())
        .expect("a request");
    let table: Value = env.client.request(request).await.expect("the table");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| c["name"].as_str().unwrap_or_default())
        .collect();
    let cells = &table["rows"][0]["cells"];
    let cell = |column: &str| {
        let i = columns
            .iter()
            .position(|c| *c == column)
            .unwrap_or_else(|| panic!("no column {column} in {columns:?}"));
        cells[i].clone()
    };
    assert_eq!(cell("Image"), json!(image));
    assert_eq!(cell("Progress"), json!("7/12"));
    assert_eq!(cell("Outdated"), json!(5));

    for (api, name) in created {
        api.delete(&name, &DeleteParams::default())
            .await
            .expect("deleting");
    }
    env.cleanup().await;
}

#[test]
fn generated_crds_have_printer_columns_status_and_cluster_scope() {
    let want: [(&str, &[&str]); 5] = [
        (
            "NodeVersion",
            &["Image", "Progress", "Outdated", "Rollout", "Degraded", "Age"],
        ),
        ("ScalingGroup", &["Role", "Group", "Image", "Age"]),
        ("PendingNode", &["Node", "Goal", "State", "Deadline", "Age"]),
        (
            "AutoscalingStrategy",
            &["Deployment", "Enabled", "Replicas", "Configured", "Age"],
        ),
        ("JoiningNode", &["Components", "Deadline", "Age"]),
    ];
    let crds: Vec<_> = nodewarden::api::all_crds()
        .into_iter()
        .filter(|c| c.spec.group == GROUP)
        .collect();
    assert_eq!(crds.len(), want.len());
    for (kind, columns) in want {
        let crd = crds
            .iter()
            .find(|c| c.spec.names.kind == kind)
            .unwrap_or_else(|| panic!("no CRD for {kind}"));
        assert_eq!(crd.spec.scope, "Cluster", "{kind}");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{kind} has the status subresource"
        );
        let shown: Vec<&str> = version
            .additional_printer_columns
            .as_deref()
            .unwrap_or_default()
            .iter()
            .filter(|c| c.priority.unwrap_or(0) == 0)
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(shown, columns, "{kind}'s kubectl get columns");
    }
}
