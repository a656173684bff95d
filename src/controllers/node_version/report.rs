//! Reporting a pass: its status (written through `status_writes`), the
//! Degraded condition of a pass that failed, Events, metrics and the
//! rollout's trace.

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::NodeVersionReconciler;
use super::decide;
use super::gather::Scope;
use super::metrics::{NodeState, NodeStateLabels, NodeVersionLabels};
use super::status::{Pass, next_status};
use crate::api::conditions::set_condition;
use crate::api::update::halt::RESUME_ANNOTATION;
use crate::api::update::{
    DomainStatus, NodeVersion, NodeVersionStatus, Rollout, RolloutHalt, WaveStatus, condition,
};
use crate::controllers::replacement_trace::{FinishedReplacement, trace_node_deleted, trace_rollout_end};
use crate::error::Result;
use crate::rollout::{self, Facts, waves::Allowance};
use crate::telemetry::trace::{self, TRACE_STARTED_ANNOTATION, TRACEPARENT_ANNOTATION, TraceParent};

impl NodeVersionReconciler {
    /// An Event on `nv` (in the background: never a reason to fail).
    pub(super) fn event(&self, nv: &NodeVersion, type_: EventType, reason: &str, note: String) {
        use kube::Resource;
        let event = crate::controllers::event(type_, reason, "Rollout", &note);
        crate::controllers::spawn_event(&self.recorder, event, nv.object_ref(&()));
    }

    /// Degraded=True with `reason` and the error's message (cleared by the
    /// next pass that gets through).
    pub(super) async fn report_error(&self, nv: &NodeVersion, reason: &str, message: String) -> Result<()> {
        // After the last pass's status (that write would undo this one), and
        // built on it.
        let mut status = self.status_writes.latest(nv).await;
        let before = status.rollout_conditions.clone();
        set_condition(
            &mut status.rollout_conditions,
            condition::DEGRADED,
            true,
            reason,
            message,
            nv.metadata.generation,
            Timestamp::now(),
        );
        if status.rollout_conditions == before {
            return Ok(());
        }
        let api: Api<NodeVersion> = Api::all(self.client.clone());
        let written = api
            .patch_status(
                &nv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"rolloutConditions": &status.rollout_conditions}})),
            )
            .await?;
        self.status_writes
            .written(&nv.name_any(), status, written.metadata.resource_version);
        Ok(())
    }

    /// One trace per rollout: started (on the NodeVersion) when nodes are
    /// outdated, its root span sent when none are left. Returns the trace
    /// replacements link to.
    pub(super) async fn trace_rollout(
        &self,
        nv: &NodeVersion,
        counts: &rollout::Counts,
    ) -> Result<Option<TraceParent>> {
        let api: Api<NodeVersion> = Api::all(self.client.clone());
        let current = trace::from_annotations(nv.metadata.annotations.as_ref());
        match (current, counts.outdated > 0) {
            (Some((tp, _)), true) => Ok(Some(tp)),
            (None, true) => {
                let tp = TraceParent::new_root();
                let patch = json!({"metadata": {"annotations": {
                    TRACEPARENT_ANNOTATION: tp.header(),
                    TRACE_STARTED_ANNOTATION: trace::format_time(SystemTime::now()),
                }}});
                api.patch(&nv.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                self.event(
                    nv,
                    EventType::Normal,
                    "RolloutStarted",
                    format!(
                        "replacing {} of {} nodes to run image {}",
                        counts.outdated, counts.nodes, nv.spec.image
                    ),
                );
                Ok(Some(tp))
            }
            (Some((tp, started)), false) => {
                let surge = self.rollout(nv).limits_for(counts.nodes, 1).max_surge;
                let (started, now) = trace_rollout_end(&tp, started, nv, counts.nodes, surge).await;
                let patch = json!({"metadata": {"annotations": {
                    TRACEPARENT_ANNOTATION: null,
                    TRACE_STARTED_ANNOTATION: null,
                }}});
                api.patch(&nv.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                let seconds = now.duration_since(started).unwrap_or_default().as_secs_f64();
                tracing::info!(
                    trace_id = %tp.trace_id,
                    nodeversion = %nv.name_any(),
                    seconds,
                    "rollout finished"
                );
                self.event(
                    nv,
                    EventType::Normal,
                    "RolloutFinished",
                    format!(
                        "all {} nodes run image {} ({seconds:.0} s)",
                        counts.nodes, nv.spec.image
                    ),
                );
                Ok(None)
            }
            (None, false) => Ok(None),
        }
    }

    /// The old Node is gone: count it, close its trace, tell the NodeVersion.
    pub(super) fn finish_replacement(
        &self,
        nv: &NodeVersion,
        finished: &FinishedReplacement<'_>,
        trace: Option<&(TraceParent, Option<SystemTime>)>,
        deleting: SystemTime,
    ) {
        self.metrics
            .replacements
            .get_or_create(&NodeVersionLabels {
                nodeversion: finished.nodeversion.to_string(),
            })
            .inc();
        if let Some(trace) = trace {
            trace_node_deleted(finished, trace, deleting);
        }
        self.event(
            nv,
            EventType::Normal,
            "NodeReplaced",
            format!(
                "node {} replaced by {} (scaling group {})",
                finished.donor.name_any(),
                finished.heir,
                finished.group
            ),
        );
    }

    pub(super) fn record_metrics(&self, nv: &NodeVersion, counts: &rollout::Counts, stepped: bool) {
        let nodeversion = nv.name_any();
        // Progress: a step taken, or a node changed from outdated to up to date.
        let mut progressed = stepped;
        for (state, n) in [
            (NodeState::UpToDate, counts.up_to_date),
            (NodeState::Outdated, counts.outdated),
            (NodeState::Replacing, counts.surge + counts.unavailable),
        ] {
            let labels = NodeStateLabels {
                nodeversion: nodeversion.clone(),
                state,
            };
            let before = self.metrics.nodes.get_or_create(&labels).set(n as i64);
            progressed |= before != n as i64 && state != NodeState::Replacing;
        }
        let ratio = if counts.nodes == 0 {
            1.0
        } else {
            counts.up_to_date as f64 / counts.nodes as f64
        };
        let labels = NodeVersionLabels { nodeversion };
        self.metrics.rollout_progress.get_or_create(&labels).set(ratio);
        if progressed || self.metrics.rollout_last_progress.get(&labels).is_none() {
            self.mark_progress(&labels.nodeversion);
        }
    }

    fn mark_progress(&self, nodeversion: &str) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.metrics
            .rollout_last_progress
            .get_or_create(&NodeVersionLabels {
                nodeversion: nodeversion.to_string(),
            })
            .set(now);
    }

    pub(super) fn forget_metrics(&self, nodeversion: &str) {
        let labels = NodeVersionLabels {
            nodeversion: nodeversion.to_string(),
        };
        self.metrics.rollout_progress.remove(&labels);
        self.metrics.rollout_last_progress.remove(&labels);
        for state in NodeState::ALL {
            self.metrics.nodes.remove(&NodeStateLabels {
                nodeversion: nodeversion.to_string(),
                state,
            });
        }
    }

    /// The halt record after this pass: the record in `base` (the status
    /// last written), the target's failed and joined nodes seen in
    /// `scope`, the threshold in force and the resume annotation (see
    /// `rollout::halt`).
    pub(super) fn halt(
        &self,
        nv: &NodeVersion,
        base: &NodeVersionStatus,
        scope: &Scope,
        in_force: &Rollout,
        unready_pods: &[String],
    ) -> Option<RolloutHalt> {
        let target = decide::rollout_target(nv);
        let mut seen = decide::join_outcomes(scope, &target);
        seen.unready_pods = unready_pods.to_vec();
        let resume = nv.annotations().get(RESUME_ANNOTATION).map(String::as_str);
        let now = Time(Timestamp::now());
        rollout::halt::next(
            base.halt.as_ref(),
            &target,
            &seen,
            rollout::halt::Thresholds {
                failed_joins: in_force.halt_after_failed_joins(),
                unready_pods: in_force.halt_after_unready_pods(),
            },
            resume,
            &now,
        )
    }

    /// What the rollout's waves allow now (None: it has none), from the
    /// record in `base` and where `facts`' nodes stand.
    pub(super) fn wave(
        &self,
        nv: &NodeVersion,
        base: &NodeVersionStatus,
        in_force: &Rollout,
        facts: &Facts<'_>,
    ) -> Option<Allowance> {
        let waves = in_force.waves.as_ref().filter(|w| !w.is_empty())?;
        let progress = rollout::waves::progress(facts);
        let ends = rollout::waves::ends(waves, progress.total);
        Some(rollout::waves::allow(
            base.wave.as_ref(),
            &decide::rollout_target(nv),
            &ends,
            progress,
            in_force.soak_time(),
            &Time(Timestamp::now()),
        ))
    }

    /// Writes the status after `pass` (in the background, see
    /// `StatusWrites`), built on `base` (`StatusWrites::latest`: the last
    /// write landed first, as merge patches land in order), and tells of new
    /// settings in force or a new reason the rollout is blocked.
    pub(super) fn write_status(&self, nv: &NodeVersion, base: &NodeVersionStatus, pass: &Pass<'_>) {
        let status = next_status(base, nv, pass, &self.rollout_defaults, Timestamp::now());
        if status == *base {
            return;
        }
        self.status_writes
            .start(self.client.clone(), &self.queue, nv, (base, status.clone()));
        self.announce_changes(nv, base, &status);
    }

    /// Events for what changed from `before` to `after`: the settings in
    /// force, and the reason the rollout is Degraded.
    fn announce_changes(&self, nv: &NodeVersion, before: &NodeVersionStatus, after: &NodeVersionStatus) {
        if let Some(message) = settings_in_force(&after.rollout_conditions)
            && settings_in_force(&before.rollout_conditions).as_ref() != Some(&message)
        {
            self.event(
                nv,
                EventType::Normal,
                "RolloutSettings",
                format!("in force: {message}"),
            );
        }
        self.announce_halt(nv, before.halt.as_ref(), after.halt.as_ref());
        self.announce_domain(nv, before.domain.as_ref(), after.domain.as_ref());
        announce_wave(nv, before.wave.as_ref(), after.wave.as_ref());
        let was = degraded(&before.rollout_conditions);
        if let Some((reason, message)) = degraded(&after.rollout_conditions)
            && was.as_ref().map(|b| &b.0) != Some(&reason)
        {
            self.event(
                nv,
                EventType::Warning,
                "RolloutBlocked",
                format!("{reason}: {message}"),
            );
        }
    }
}

impl NodeVersionReconciler {
    /// A halt that began or ended: an Event, and a span in the rollout's trace.
    fn announce_halt(&self, nv: &NodeVersion, before: Option<&RolloutHalt>, after: Option<&RolloutHalt>) {
        let halted = |h: Option<&RolloutHalt>| h.is_some_and(RolloutHalt::is_halted);
        match (halted(before), after.filter(|h| h.is_halted())) {
            (false, Some(halt)) => {
                let failed = halt.failed_joins.join(", ");
                tracing::warn!(nodeversion = %nv.name_any(), image = %nv.spec.image, %failed, "rollout halted");
                self.event(
                    nv,
                    EventType::Warning,
                    "RolloutHalted",
                    format!(
                        "{} new node(s) in a row of image {} were given up ({failed}): no instance is created and no node retired",
                        halt.failed_joins.len(),
                        nv.spec.image
                    ),
                );
                if let Some((tp, _)) = trace::from_annotations(nv.metadata.annotations.as_ref()) {
                    let now = SystemTime::now();
                    let mut span = trace::SpanRecord::new(trace::ROLLOUT_HALTED, now, now)
                        .attr("nodewarden.nodeversion", nv.name_any())
                        .attr("nodewarden.image.new", nv.spec.image.clone())
                        .attr("nodewarden.failed_joins", failed.clone());
                    span.error = Some(format!("halted after {} failed joins", halt.failed_joins.len()));
                    trace::emit_phase(&tp, span);
                }
            }
            (true, None) => self.event(
                nv,
                EventType::Normal,
                "RolloutResumed",
                format!("the rollout to image {} goes on", nv.spec.image),
            ),
            _ => {}
        }
    }
}

/// A span in `nv`'s rollout trace (one of several of its name: `key`
/// tells them apart), from `start` to `end` (unset: now).
fn rollout_span(
    nv: &NodeVersion,
    (name, key): (&'static str, &str),
    (start, end): (Option<&MicroTime>, Option<&MicroTime>),
    attrs: Vec<(&'static str, String)>,
) {
    let Some((tp, _)) = trace::from_annotations(nv.metadata.annotations.as_ref()) else {
        return;
    };
    let end = end.map_or_else(SystemTime::now, |t| SystemTime::from(t.0));
    let start = start.map_or(end, |t| SystemTime::from(t.0));
    let mut span = trace::SpanRecord::new(name, start, end).attr("nodewarden.nodeversion", nv.name_any());
    for (k, v) in attrs {
        span = span.attr(k, v);
    }
    trace::emit_recurring_phase(&tp, key, span);
}

/// Spans for a wave that finished (from its start) and for a soak that
/// ended (the next wave began).
fn announce_wave(nv: &NodeVersion, before: Option<&WaveStatus>, after: Option<&WaveStatus>) {
    let Some(after) = after else { return };
    let same_target = before.filter(|b| b.target == after.target);
    let wave = |w: &WaveStatus| ("nodewarden.wave", (w.wave + 1).to_string());
    if after.finished_at.is_some()
        && same_target.is_none_or(|b| b.wave != after.wave || b.finished_at.is_none())
    {
        let key = format!("{} {}", after.target, after.wave);
        rollout_span(
            nv,
            (trace::ROLLOUT_WAVE, &key),
            (after.started_at.as_ref(), after.finished_at.as_ref()),
            vec![wave(after)],
        );
    }
    if let Some(b) = same_target.filter(|b| b.wave < after.wave && b.finished_at.is_some()) {
        let key = format!("{} {}", b.target, b.wave);
        rollout_span(
            nv,
            (trace::WAVE_SOAK, &key),
            (b.finished_at.as_ref(), after.started_at.as_ref()),
            vec![wave(b)],
        );
    }
}

impl NodeVersionReconciler {
    /// An Event when a failure domain's replacements begin, and a span for
    /// the domain before it.
    fn announce_domain(&self, nv: &NodeVersion, before: Option<&DomainStatus>, after: Option<&DomainStatus>) {
        let Some(after) = after else { return };
        if let Some(b) = before.filter(|b| b.current.is_some() && b.current != after.current) {
            let name = b.current.clone().unwrap_or_default();
            let attrs = vec![("nodewarden.domain", format!("{}={name}", b.key))];
            rollout_span(
                nv,
                (trace::ROLLOUT_DOMAIN, &name),
                (b.since.as_ref(), None),
                attrs,
            );
        }
        let Some(current) = &after.current else { return };
        if before.and_then(|b| b.current.as_ref()) == Some(current) {
            return;
        }
        let list = |v: &[String]| match v.is_empty() {
            true => "none".to_string(),
            false => v.join(", "),
        };
        self.event(
            nv,
            EventType::Normal,
            "RolloutDomainStarted",
            format!(
                "replacing the nodes of {}={current}; done: {}; waiting: {}",
                after.key,
                list(&after.done),
                list(&after.waiting)
            ),
        );
    }
}

/// The reason and message of a Degraded condition that is True.
fn degraded(conditions: &[Condition]) -> Option<(String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == condition::DEGRADED && c.status == "True")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// The settings in force, as the RolloutSettings condition names them.
fn settings_in_force(conditions: &[Condition]) -> Option<String> {
    conditions
        .iter()
        .find(|c| c.type_ == condition::ROLLOUT_SETTINGS)
        .map(|c| c.message.clone())
}
