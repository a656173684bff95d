//! The ground is real: kwok nodes become Ready, the real scheduler places a
//! Deployment's pods on them, and compacting etcd expires old resourceVersions.

use crate::support;

use std::time::Duration;

use crate::support::{Probe, TestEnv, node_is_ready, seen, wait_for};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

#[tokio::test]
async fn twenty_kwok_nodes_become_ready() {
    let env = TestEnv::new("nodes-ready").await;
    let names = env.create_kwok_nodes(20, &[("pool", "a")]).await;
    env.wait_for_nodes("Ready", 20, node_is_ready).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    // Every node we asked for is there, under the name we gave it.
    let listed: Vec<String> = nodes
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("listing nodes")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for name in &names {
        assert!(listed.contains(name), "node {name} missing from {listed:?}");
    }
    env.cleanup().await;
}

#[tokio::test]
async fn scheduler_places_a_deployment_on_kwok_nodes() {
    let env = TestEnv::new("deployment").await;
    let nodes = env.create_kwok_nodes(5, &[]).await;
    // Every node schedulable before the pods come: a node kwok has not made
    // Ready yet (or whose not-ready taint is not lifted yet) is filtered out,
    // and 10 pods created a moment after the nodes all landed on the one
    // node that was.
    env.wait_for_nodes("Ready and untainted", 5, |n| {
        node_is_ready(n)
            && n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_none_or(|t| {
                t.iter()
                    .all(|t| t.effect != "NoSchedule" && t.effect != "NoExecute")
            })
    })
    .await;
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), &env.namespace);
    // Only this test's nodes: parallel tests have kwok nodes too.
    env.create_deployment("web", 10, json!({support::RUN_LABEL: env.id}))
        .await;

    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let placed = wait_for(
        "10 Ready pods on the test's nodes",
        Duration::from_secs(90),
        || async {
            match pods.list(&ListParams::default().labels("app=web")).await {
                Ok(list) => {
                    let ready: Vec<String> = list
                        .items
                        .iter()
                        .filter(|p| pod_is_ready(p))
                        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                        .collect();
                    if ready.len() == 10 {
                        Probe::Done(ready)
                    } else {
                        Probe::NotYet(format!("{} pods, {} Ready", list.items.len(), ready.len()))
                    }
                }
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
    for node in &placed {
        assert!(
            nodes.contains(node),
            "a pod was placed on {node}, not one of {nodes:?}"
        );
    }
    // The default scheduler spreads replicas: more than one node is used.
    let mut distinct = placed.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() > 1, "all 10 pods landed on {distinct:?}");

    let status = wait_for(
        "the Deployment to report 10 ready replicas",
        Duration::from_secs(60),
        || async {
            match deployments.get("web").await {
                Ok(d) => match d.status.as_ref().and_then(|s| s.ready_replicas) {
                    Some(10) => Probe::Done(d),
                    other => Probe::NotYet(format!("readyReplicas {other:?}")),
                },
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;
    assert_eq!(status.status.and_then(|s| s.available_replicas), Some(10));
    env.cleanup().await;
}

fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410() {
    let env = TestEnv::new("compaction").await;
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"n": "0"}})).expect("a configmap");
    let created = cms
        .create(&PostParams::default(), &cm)
        .await
        .expect("creating a configmap");
    let old_rv = created
        .metadata
        .resource_version
        .clone()
        .expect("a resourceVersion");

    // Before compaction the old resourceVersion is watchable and replays the updates.
    for n in 1..=3 {
        let patch = json!({"data": {"n": n.to_string()}});
        cms.patch(
            "c",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .expect("updating the configmap");
    }
    let first = first_watch_event(&cms, &old_rv).await;
    assert!(
        matches!(first, Ok(WatchEvent::Modified(_))),
        "before compaction a watch from {old_rv} should replay an update, got {first:?}"
    );

    let revision = support::control_plane().compact_etcd().await;
    assert!(revision > old_rv.parse::<i64>().expect("a numeric resourceVersion"));

    let after = first_watch_event(&cms, &old_rv).await;
    let code = match &after {
        Ok(WatchEvent::Error(status)) => status.code,
        Err(kube::Error::Api(status)) => status.code,
        other => panic!("expected 410 Gone after compaction, got {other:?}"),
    };
    assert_eq!(code, 410, "expected 410 Gone after compaction, got {after:?}");
    env.cleanup().await;
}

/// The first event of a watch started at `rv` (or the error that refused it).
async fn first_watch_event(cms: &Api<ConfigMap>, rv: &str) -> Result<WatchEvent<ConfigMap>, kube::Error> {
    // Only our ConfigMap: the namespace also gets kube-root-ca.crt from the controller-manager.
    let params = WatchParams::default().fields("metadata.name=c").timeout(10);
    let mut stream = cms.watch(&params, rv).await?.boxed();
    match tokio::time::timeout(Duration::from_secs(15), stream.next()).await {
        Ok(Some(event)) => event,
        Ok(None) => panic!("watch from {rv} ended without an event"),
        Err(_) => panic!("no watch event from {rv} within 15 s"),
    }
}
