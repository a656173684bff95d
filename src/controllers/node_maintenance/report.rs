//! What a reconcile tells: the status (written on the version it was
//! computed from), the drain's duration and trace when it ends, Events, and
//! the drain metrics.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use opentelemetry::KeyValue;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;

use super::NodeMaintenanceReconciler;
use super::decide::{Decision, owner_of, phase_event, same_status, status_for};
use crate::api::node_maintenance::{MaintenanceObject, MaintenancePhase, NodeMaintenanceStatus};
use crate::drain::DrainStatus;
use crate::error::Result;
use crate::telemetry::Metrics;
use crate::telemetry::metrics::HistogramFamily;
use crate::telemetry::trace::{self, SpanRecord};

impl<M: MaintenanceObject> NodeMaintenanceReconciler<M> {
    /// Writes the status the decision and the drain lead to (pure
    /// [`status_for`]) when it changed, with the drain's metrics and trace
    /// when it ended and an Event when the phase changed. Returns the phase.
    ///
    /// The write is conditioned on `version`, the maintenance's as read (or
    /// as this pass wrote it): the phase is what rollouts and other
    /// maintenances decide on, so a status landing late, after another
    /// leader wrote a newer one, is refused (409) rather than undoing it.
    pub(super) async fn report(
        &self,
        api: &Api<M>,
        obj: &M,
        version: Option<&str>,
        decision: &Decision,
        drain: Option<&DrainStatus>,
    ) -> Result<MaintenancePhase> {
        let node_name = obj.node_name();
        let prev = obj.maintenance_status();
        let now = Timestamp::now();
        let mut status = status_for(prev, decision, drain, obj.meta().generation, now);
        let phase = status.phase.unwrap_or(MaintenancePhase::Running);
        if phase == MaintenancePhase::Failed && drain.is_some() {
            // Timed out with policy Fail: the maintenance no longer holds a slot.
            self.ctx.release(&owner_of(obj));
        }
        if prev.is_some_and(|p| same_status(p, &status)) {
            return Ok(phase);
        }
        status.last_update = Some(Time(now));
        let patch = status_patch(&status, version);
        api.patch_status(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        let ended = matches!(phase, MaintenancePhase::Succeeded | MaintenancePhase::Failed)
            && prev.and_then(|p| p.phase) != Some(phase);
        if let (true, Some(d)) = (ended, drain) {
            self.drain_ended(obj, node_name, phase, d).await;
        }
        if let Some((type_, reason)) = phase_event(prev.and_then(|p| p.phase), phase) {
            let note = match decision {
                Decision::Fail { message, .. } => message.clone(),
                _ => status
                    .conditions
                    .as_ref()
                    .and_then(|c| c.first())
                    .map(|c| c.message.clone())
                    .unwrap_or_default(),
            };
            self.event(
                &obj.object_ref(&()),
                type_,
                reason,
                &format!("node {node_name}: {note}"),
            )
            .await;
        }
        Ok(phase)
    }

    /// The drain ended: its duration, and its span when the maintenance is
    /// part of a traced node replacement (evictions as events). Measured from
    /// the object's creation, so a drain a new leader finished counts whole.
    async fn drain_ended(&self, obj: &M, node: &str, phase: MaintenancePhase, drain: &DrainStatus) {
        let end = SystemTime::now();
        let start = obj
            .meta()
            .creation_timestamp
            .as_ref()
            .map(|t| SystemTime::from(t.0))
            .unwrap_or(end);
        let result = if phase == MaintenancePhase::Succeeded {
            DrainResult::Succeeded
        } else {
            DrainResult::Failed
        };
        self.ctx
            .metrics
            .drain_duration
            .get_or_create(&ResultLabels { result })
            .observe(end.duration_since(start).unwrap_or_default().as_secs_f64());
        let Some((tp, _)) = trace::from_annotations(obj.meta().annotations.as_ref()) else {
            return;
        };
        let mut record = SpanRecord::new("drain", start, end)
            .attr("k8s.node.name", node.to_string())
            .attr("nodewarden.nodemaintenance", obj.name_any())
            .attr("nodewarden.pods.total", i64::from(drain.progress.total_pods))
            .attr(
                "nodewarden.pods.to_evict",
                i64::from(drain.progress.eviction_pods),
            )
            .attr("nodewarden.pods.forced", i64::from(drain.progress.forced))
            // Counted from this replica's own events: evictions before a
            // leader change were another replica's (its drain span was lost).
            .attr(
                "nodewarden.pods.evicted",
                drain.pod_events.iter().filter(|e| e.what == "evicted").count() as i64,
            );
        record.events = drain
            .pod_events
            .iter()
            .map(|e| {
                opentelemetry::trace::Event::new(
                    e.what,
                    e.at,
                    vec![KeyValue::new("k8s.pod", e.pod.clone())],
                    0,
                )
            })
            .collect();
        if phase == MaintenancePhase::Failed {
            record.error = drain.progress.last_error.clone().or(Some("drain failed".into()));
        }
        trace::emit_phase(&tp, record);
        trace::flush(Duration::from_secs(2)).await;
    }

    /// An Event about `regarding` (the maintenance, or its node as the Node
    /// Maintenance Operator does for UncordonNode).
    pub(super) async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = super::super::event(type_, reason, "Maintenance", note);
        if let Err(e) = self.ctx.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %e, reason, "publishing an event failed");
        }
    }
}

/// The merge patch that writes `status`, conditioned on `version` (the
/// maintenance's resourceVersion the status was computed from). A merge patch
/// keeps fields it does not name: the optional fields that are unset are
/// written as null, so they are cleared.
pub fn status_patch(status: &NodeMaintenanceStatus, version: Option<&str>) -> serde_json::Value {
    let mut patch = json!({"metadata": {"resourceVersion": version}, "status": status});
    for (field, cleared) in [
        ("blockedBy", status.blocked_by.is_none()),
        ("lastError", status.last_error.is_none()),
    ] {
        if cleared {
            patch["status"][field] = serde_json::Value::Null;
        }
    }
    patch
}

/// How a drain ended, the `result` label of `drain_duration_seconds`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum DrainResult {
    /// Every pod to evict is gone.
    Succeeded,
    /// The maintenance ended any other way.
    Failed,
}

impl DrainResult {
    /// The label text: `succeeded` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            DrainResult::Succeeded => "succeeded",
            DrainResult::Failed => "failed",
        }
    }
}

crate::telemetry::metrics::label_value_from_as_str!(DrainResult);

/// Label set of `drain_duration_seconds`: how the drain ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// How the drain ended.
    pub result: DrainResult,
}

/// The drain families, registered by the NodeMaintenance controller.
#[derive(Clone)]
pub struct DrainMetrics {
    /// From the NodeMaintenance's creation to its drain's end.
    pub drain_duration: HistogramFamily<ResultLabels>,
    /// Drains in progress.
    pub drains_running: Gauge,
    /// Drains with at least one pod a PodDisruptionBudget keeps.
    pub drains_blocked: Gauge,
}

impl DrainMetrics {
    /// The families, registered with `metrics`; the gauges go to zero when
    /// leadership is lost.
    pub fn register(metrics: &Metrics) -> Self {
        let m = DrainMetrics {
            drain_duration: Family::new_with_constructor(|| {
                // 1 s .. ~1.1 h
                Histogram::new(exponential_buckets(1.0, 2.0, 13))
            }),
            drains_running: Gauge::default(),
            drains_blocked: Gauge::default(),
        };
        metrics.register(
            "drain_duration_seconds",
            "Time from a NodeMaintenance's creation to the end of its drain, by result",
            m.drain_duration.clone(),
        );
        metrics.register("drains_running", "Drains in progress", m.drains_running.clone());
        metrics.register(
            "drains_blocked",
            "Drains with a pod whose eviction a PodDisruptionBudget refuses",
            m.drains_blocked.clone(),
        );
        let leader_only = m.clone();
        metrics.leader_only(move || {
            leader_only.drains_running.set(0);
            leader_only.drains_blocked.set(0);
        });
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_results_export_their_text_and_gauges_go_with_leadership() {
        let metrics = Metrics::new();
        let m = DrainMetrics::register(&metrics);
        for result in [DrainResult::Succeeded, DrainResult::Failed] {
            m.drain_duration
                .get_or_create(&ResultLabels { result })
                .observe(1.0);
        }
        m.drains_blocked.set(1);
        let text = metrics.encode();
        for line in [
            r#"nodewarden_drain_duration_seconds_count{result="succeeded"} 1"#,
            r#"nodewarden_drain_duration_seconds_count{result="failed"} 1"#,
            "nodewarden_drains_blocked 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        metrics.forget_leader_state();
        assert!(metrics.encode().contains("nodewarden_drains_blocked 0"));
    }

    #[test]
    fn a_status_is_written_on_the_version_it_was_computed_from_and_clears_what_is_unset() {
        let status = NodeMaintenanceStatus {
            phase: Some(MaintenancePhase::Running),
            last_error: None,
            blocked_by: None,
            ..Default::default()
        };
        let patch = status_patch(&status, Some("42"));
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["status"]["phase"], "Running");
        for cleared in ["lastError", "blockedBy"] {
            assert!(
                patch["status"]
                    .get(cleared)
                    .is_some_and(serde_json::Value::is_null),
                "{cleared} is written as null: {patch}"
            );
        }
        let failed = NodeMaintenanceStatus {
            last_error: Some("a budget".into()),
            ..status
        };
        assert_eq!(
            status_patch(&failed, Some("43"))["status"]["lastError"],
            "a budget"
        );
    }
}
