//! The spans of a node replacement that the rollout controllers emit, and
//! the annotations that carry a replacement's trace from object to object
//! (see `telemetry::trace` for why traces ride on the objects).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::update::PendingNode;
use crate::telemetry::trace::{self, SpanRecord, TRACEPARENT_ANNOTATION, TraceParent};

/// On a PendingNode: when the cloud accepted the create (RFC 3339), where
/// waiting for the join begins.
pub const CREATED_AT_ANNOTATION: &str = "nodewarden.dev/instance-created-at";
/// How long a finished trace may take to leave before work goes on.
pub const TRACE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// The annotations a rollout's NodeMaintenance carries: the replacement's
/// trace, so the drain is a phase of it.
pub fn drain_annotations(node: Option<&Node>) -> BTreeMap<String, String> {
    node.and_then(|n| n.metadata.annotations.as_ref())
        .and_then(|a| a.get(TRACEPARENT_ANNOTATION))
        .map(|tp| BTreeMap::from([(TRACEPARENT_ANNOTATION.to_string(), tp.clone())]))
        .unwrap_or_default()
}

/// The "create instance" phase: from the PendingNode to the cloud's answer.
pub fn trace_create(
    tp: &TraceParent,
    started: SystemTime,
    accepted: SystemTime,
    group: &str,
    request_id: &str,
    provider_id: &str,
    resumed: bool,
) {
    trace::emit_phase(
        tp,
        SpanRecord::new("create instance", started, accepted)
            .attr("nodewarden.scaling_group", group.to_string())
            .attr("nodewarden.request_id", request_id.to_string())
            .attr("nodewarden.provider_id", provider_id.to_string())
            .attr("nodewarden.resumed", resumed),
    );
}

/// "wait for join" (cloud accepted → Node object) and "wait ready" (Node →
/// Ready), from the timestamps the objects keep, so any replica can emit them.
pub fn trace_join(tp: &TraceParent, pending: &PendingNode, heir: &Node) {
    let accepted = pending
        .annotations()
        .get(CREATED_AT_ANNOTATION)
        .and_then(|s| trace::parse_time(s));
    let Some(joined) = heir
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| SystemTime::from(t.0))
    else {
        return;
    };
    let ready = heir
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| SystemTime::from(t.0).max(joined))
        .unwrap_or_else(SystemTime::now);
    if let Some(accepted) = accepted {
        trace::emit_phase(
            tp,
            SpanRecord::new("wait for join", accepted, joined.max(accepted))
                .attr("k8s.node.name", heir.name_any())
                .attr("nodewarden.provider_id", pending.spec.provider_id.clone()),
        );
    }
    trace::emit_phase(
        tp,
        SpanRecord::new("wait ready", joined, ready).attr("k8s.node.name", heir.name_any()),
    );
}
