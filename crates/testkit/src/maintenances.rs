//! A sampler of NodeMaintenances for the storms: whatever creates them (a
//! person, a Plan), a node is never held by two live maintenances, and a
//! node whose maintenance Succeeded is cordoned.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use nodewarden::api::node_maintenance::MaintenancePhase;
use nodewarden::api::node_maintenance::medik8s::NodeMaintenance;
use tokio_util::sync::CancellationToken;

/// Samples every NodeMaintenance on `nodes` each 200 ms until `stop`: how
/// many samples it took, and every breach seen. A sample judges only the
/// maintenances unchanged across its read of the nodes, so a maintenance
/// that moved on in between is not held against the node's older state.
pub async fn sample_maintenances(
    client: Client,
    nodes: BTreeSet<String>,
    stop: CancellationToken,
) -> (usize, Vec<String>) {
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    let nodes_api: Api<Node> = Api::all(client);
    let ours = |list: kube::core::ObjectList<NodeMaintenance>| -> Vec<NodeMaintenance> {
        list.items
            .into_iter()
            .filter(|m| nodes.contains(&m.spec.node_name))
            .collect()
    };
    let mut breaches = Vec::new();
    let mut samples = 0;
    while !stop.is_cancelled() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let Ok(before) = api.list(&ListParams::default()).await.map(ours) else {
            continue;
        };
        let Ok(node_list) = nodes_api.list(&ListParams::default()).await else {
            continue;
        };
        let Ok(after) = api.list(&ListParams::default()).await.map(ours) else {
            continue;
        };
        samples += 1;
        let steady = before
            .iter()
            .filter(|m| m.metadata.deletion_timestamp.is_none())
            .filter(|m| {
                after.iter().any(|a| {
                    a.metadata.uid == m.metadata.uid
                        && a.metadata.resource_version == m.metadata.resource_version
                })
            });
        let mut holders: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for m in steady {
            let status = m.status.as_ref();
            let active = status
                .is_some_and(|s| s.eviction_pods.is_some() && s.phase != Some(MaintenancePhase::Failed));
            if active {
                holders
                    .entry(m.spec.node_name.as_str())
                    .or_default()
                    .push(m.name_any());
            }
            if status.and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded) {
                let node = node_list.items.iter().find(|n| n.name_any() == m.spec.node_name);
                if node.is_some_and(|n| !cordoned(n)) {
                    breaches.push(format!(
                        "{} Succeeded but {} is not cordoned",
                        m.name_any(),
                        m.spec.node_name
                    ));
                }
            }
        }
        for (node, held) in holders {
            if held.len() > 1 {
                breaches.push(format!("{node} held by {held:?}"));
            }
        }
    }
    (samples, breaches)
}

fn cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}
