//! What a rollout that did not finish was doing, for a test's panic: the
//! NodeVersion's lists and conditions, its PendingNodes, the nodes not yet
//! on the image, and the warnings said about them. A stall seen once on a
//! loaded CI machine is then explained by the run that saw it.

use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Event, Node};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use nodewarden::api::update::{NodeVersion, PendingNode};

use super::TestEnv;
use super::rollout::runs_image;

/// The state of rollout `version` to `image`, several lines, for a panic.
pub async fn rollout_state(env: &TestEnv, version: &str, image: &str) -> String {
    let mut out = String::new();
    node_version_lines(env, version, &mut out).await;
    pending_node_lines(env, &mut out).await;
    outdated_node_lines(env, image, &mut out).await;
    warning_lines(env, &mut out).await;
    out
}

async fn node_version_lines(env: &TestEnv, version: &str, out: &mut String) {
    let nv = match Api::<NodeVersion>::all(env.client.clone()).get(version).await {
        Ok(nv) => nv,
        Err(e) => {
            let _ = writeln!(out, "  NodeVersion {version}: {e}");
            return;
        }
    };
    let Some(status) = nv.status else {
        let _ = writeln!(out, "  NodeVersion {version}: no status");
        return;
    };
    let names = |refs: &[k8s_openapi::api::core::v1::ObjectReference]| {
        refs.iter()
            .filter_map(|r| r.name.clone())
            .collect::<Vec<_>>()
            .join(",")
    };
    let _ = writeln!(
        out,
        "  NodeVersion {version}: budget {} outdated [{}] donors [{}] heirs [{}] mints [{}] pending [{}] obsolete [{}] invalid [{}]",
        status.budget,
        names(&status.outdated),
        names(&status.donors),
        names(&status.heirs),
        names(&status.mints),
        names(&status.pending),
        names(&status.obsolete),
        names(&status.invalid),
    );
    for c in status.conditions.iter().chain(&status.rollout_conditions) {
        let _ = writeln!(out, "    {}={} {}: {}", c.type_, c.status, c.reason, c.message);
    }
}

async fn pending_node_lines(env: &TestEnv, out: &mut String) {
    let listed = Api::<PendingNode>::all(env.client.clone())
        .list(&ListParams::default())
        .await;
    let all = match listed {
        Ok(l) => l.items,
        Err(e) => {
            let _ = writeln!(out, "  PendingNodes: {e}");
            return;
        }
    };
    // Labelled as their NodeVersion, or named after nodes with the test's id.
    let ours = |pn: &&PendingNode| {
        pn.spec.node_name.contains(&env.id) || pn.labels().get(super::RUN_LABEL) == Some(&env.id)
    };
    for pn in all.iter().filter(ours) {
        let _ = writeln!(
            out,
            "  PendingNode {}: node {} goal {:?} state {:?} annotations {:?}",
            pn.name_any(),
            pn.spec.node_name,
            pn.spec.goal,
            pn.status.as_ref().and_then(|s| s.csp_state),
            pn.annotations(),
        );
    }
}

async fn outdated_node_lines(env: &TestEnv, image: &str, out: &mut String) {
    let listed = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default().labels(&env.run_selector()))
        .await;
    let nodes = match listed {
        Ok(l) => l.items,
        Err(e) => {
            let _ = writeln!(out, "  Nodes: {e}");
            return;
        }
    };
    for node in nodes.iter().filter(|n| !runs_image(n, image)) {
        let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        let _ = writeln!(
            out,
            "  Node {} (not on the image): unschedulable {unschedulable} providerID {:?} annotations {:?}",
            node.name_any(),
            node.spec.as_ref().and_then(|s| s.provider_id.clone()),
            node.annotations(),
        );
    }
}

/// The last Warning Events of the cluster that name the test's objects.
async fn warning_lines(env: &TestEnv, out: &mut String) {
    let Ok(events) = Api::<Event>::all(env.client.clone())
        .list(&ListParams::default().fields("type=Warning"))
        .await
    else {
        return;
    };
    let mut ours: Vec<&Event> = events
        .items
        .iter()
        .filter(|e| {
            e.involved_object
                .name
                .as_deref()
                .is_some_and(|n| n.contains(&env.id))
                || e.involved_object.namespace.as_deref() == Some(env.namespace.as_str())
        })
        .collect();
    ours.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
    for e in ours.iter().rev().take(12).rev() {
        let _ = writeln!(
            out,
            "  Warning {} on {}: {} (x{})",
            e.reason.clone().unwrap_or_default(),
            e.involved_object.name.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default(),
            e.count.unwrap_or(1),
        );
    }
}
