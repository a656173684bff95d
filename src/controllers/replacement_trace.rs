//! The spans of a node replacement that the rollout controllers emit, and
//! the annotations that carry a replacement's trace from object to object
//! (see `telemetry::trace` for why traces ride on the objects).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::update::PendingNode;
use opentelemetry::trace::TraceId;

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

/// The "transfer labels" phase: the heir took the donor's labels.
pub async fn trace_transfer(tp: &TraceParent, started: SystemTime, heir: &str, donor: &str, labels: usize) {
    trace::emit_phase(
        tp,
        SpanRecord::new("transfer labels", started, SystemTime::now())
            .attr("k8s.node.name", heir.to_owned())
            .attr("nodewarden.donor", donor.to_owned())
            .attr("nodewarden.labels", labels as i64),
    );
    trace::flush(TRACE_FLUSH_TIMEOUT).await;
}

/// The "delete instance" phase; `known`: the cloud still had the instance.
pub fn trace_delete_instance(
    tp: &TraceParent,
    started: SystemTime,
    ended: SystemTime,
    provider_id: &str,
    known: bool,
) {
    trace::emit_phase(
        tp,
        SpanRecord::new("delete instance", started, ended)
            .attr("nodewarden.provider_id", provider_id.to_owned())
            .attr("nodewarden.instance_known", known),
    );
}

/// The "remove etcd member" phase of a control-plane replacement: the
/// member list, the health checks and the removal; `outcome` says what
/// came of it ("removed", "removed already", "no member").
pub async fn trace_etcd_member(
    tp: &TraceParent,
    started: SystemTime,
    node: &str,
    ip: std::net::IpAddr,
    member: Option<&crate::etcd::Member>,
    outcome: &str,
) {
    let mut span = SpanRecord::new("remove etcd member", started, SystemTime::now())
        .attr("k8s.node.name", node.to_owned())
        .attr("nodewarden.etcd.peer_ip", ip.to_string())
        .attr("nodewarden.etcd.outcome", outcome.to_owned());
    if let Some(m) = member {
        span = span
            .attr("nodewarden.etcd.member_id", format!("{:x}", m.id))
            .attr("nodewarden.etcd.member_name", m.name.clone());
    }
    trace::emit_phase(tp, span);
    // Sent before the node goes: a successor would find no member to trace.
    trace::flush(TRACE_FLUSH_TIMEOUT).await;
}

/// Closes the trace of a node that joined but replaces nobody: a root span
/// `surplus node`, so the phases it already has are not left without one.
pub async fn trace_surplus(pending: &PendingNode, node: &str, why: &str) {
    let Some((tp, started)) = trace::from_annotations(pending.metadata.annotations.as_ref()) else {
        return;
    };
    let now = SystemTime::now();
    trace::emit_root(
        &tp,
        SpanRecord::new(trace::SURPLUS_NODE, started.unwrap_or(now), now)
            .attr("k8s.node.name", node.to_string())
            .attr("nodewarden.scaling_group", pending.spec.group_id.clone())
            .attr("nodewarden.reason", why.to_string())
            .link(trace::rollout_of(pending.metadata.annotations.as_ref())),
    );
    trace::flush(TRACE_FLUSH_TIMEOUT).await;
}

/// What the root span of a finished replacement says.
pub struct FinishedReplacement<'a> {
    /// The old node, carrying the replacement's trace.
    pub donor: &'a Node,
    /// The node that replaced it.
    pub heir: &'a str,
    /// Their scaling group.
    pub group: &'a str,
    /// `control-plane`, `worker` or `unknown`.
    pub role: &'a str,
    /// The donor's image.
    pub old_image: &'a str,
    /// The image the rollout brings.
    pub new_image: &'a str,
    /// The NodeVersion rolling out.
    pub nodeversion: &'a str,
}

/// The replacement's root span, sent (and flushed) right before the old
/// Node is deleted: once the Node is gone no replica could send it any more,
/// so a replica killed after the deletion must have sent it already. A
/// replica killed between this and the deletion leaves the retirement to the
/// next leader, which sends the root again with the same span id (one trace,
/// the later end).
pub async fn trace_replacement(
    r: &FinishedReplacement<'_>,
    (tp, started): &(TraceParent, Option<SystemTime>),
) {
    let now = SystemTime::now();
    let started = started.unwrap_or(now);
    trace::emit_root(
        tp,
        SpanRecord::new(trace::REPLACE_NODE, started, now)
            .attr("k8s.node.name", r.donor.name_any())
            .attr("nodewarden.heir", r.heir.to_owned())
            .attr("nodewarden.scaling_group", r.group.to_owned())
            .attr("nodewarden.role", r.role.to_owned())
            .attr("nodewarden.image.old", r.old_image.to_owned())
            .attr("nodewarden.image.new", r.new_image.to_owned())
            .attr("nodewarden.nodeversion", r.nodeversion.to_owned())
            .link(trace::rollout_of(r.donor.metadata.annotations.as_ref())),
    );
    trace::flush(TRACE_FLUSH_TIMEOUT).await;
}

/// The old Node is deleted: the "delete node" phase, and the log line. The
/// phase is the trace's last and no other replica could send it, so it is
/// flushed at once (in the background: the reconcile does not wait), leaving
/// only the milliseconds until the export to a replica killed right after.
pub fn trace_node_deleted(
    r: &FinishedReplacement<'_>,
    (tp, started): &(TraceParent, Option<SystemTime>),
    deleting: SystemTime,
) {
    let now = SystemTime::now();
    let name = r.donor.name_any();
    trace::emit_phase(
        tp,
        SpanRecord::new("delete node", deleting, now).attr("k8s.node.name", name.clone()),
    );
    tokio::spawn(trace::flush(TRACE_FLUSH_TIMEOUT));
    tracing::info!(
        trace_id = %tp.trace_id,
        node = %name,
        heir = r.heir,
        nodeversion = r.nodeversion,
        seconds = now.duration_since(started.unwrap_or(now)).unwrap_or_default().as_secs_f64(),
        "node replacement finished"
    );
}

/// Trace ids whose replacement root this replica sent, so that a retirement
/// repeated on a stale store does not send it twice (bounded: the oldest
/// are forgotten).
#[derive(Default)]
pub struct SentRoots(std::sync::Mutex<std::collections::VecDeque<TraceId>>);

impl SentRoots {
    const KEEP: usize = 4096;

    /// True the first time the replacement traced by `tp` asks; records it.
    pub fn first_time(&self, tp: &TraceParent) -> bool {
        let mut sent = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if sent.contains(&tp.trace_id) {
            return false;
        }
        if sent.len() >= Self::KEEP {
            sent.pop_front();
        }
        sent.push_back(tp.trace_id);
        true
    }
}

/// The rollout's root span, once no node is outdated. Returns when it
/// started and ended.
pub async fn trace_rollout_end(
    tp: &TraceParent,
    started: Option<SystemTime>,
    nv: &crate::api::update::NodeVersion,
    nodes: usize,
    max_surge: usize,
) -> (SystemTime, SystemTime) {
    let now = SystemTime::now();
    let started = started.unwrap_or(now);
    trace::emit_root(
        tp,
        SpanRecord::new(trace::ROLLOUT, started, now)
            .attr("nodewarden.nodeversion", nv.name_any())
            .attr("nodewarden.image.new", nv.spec.image.clone())
            .attr("nodewarden.nodes", nodes as i64)
            .attr(
                "nodewarden.max_surge",
                i64::try_from(max_surge).unwrap_or(i64::MAX),
            ),
    );
    trace::flush(TRACE_FLUSH_TIMEOUT).await;
    (started, now)
}
