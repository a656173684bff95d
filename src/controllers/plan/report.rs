//! Reporting: the status a round leaves (per-node records, conditions,
//! progress), written on the version read; then the node metrics, the
//! phase spans and the Events.

use std::collections::{BTreeSet, HashMap};
use std::time::SystemTime;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::PostParams;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::decide::first_phase;
use super::gather::{Resolved, Validated};
use super::metrics::{JobResult, JobResultLabels, PlanFailure, PlanFailureLabels, PlanNodeState};
use super::{Applying, PlanReconciler, Round, Target};
use crate::api::conditions::set_condition;
use crate::api::plan::{NodeUpgrade, Plan, PlanStatus};
use crate::controllers::replacement_trace::TRACE_FLUSH_TIMEOUT;
use crate::error::Result;
use crate::runtime::store::ObjectKey;
use crate::telemetry::trace::{self, SpanRecord, TraceParent};
use crate::upgrade::job::HOSTNAME_LABEL;
use crate::upgrade::schedule::{self, Phase};
use crate::upgrade::tally::Tally;

/// Validated and LatestResolved: what admission could not check, and the
/// version the plan aims at (in `status.latestVersion`). As upstream's, a
/// healthy condition has no message: `kubectl get plans` prints the first
/// message there is, which must be a failure's.
pub(super) fn checks(
    status: &mut PlanStatus,
    generation: Option<i64>,
    validated: &Validated,
    resolved: &Resolved,
    now: Timestamp,
) {
    let cs = &mut status.conditions;
    match validated {
        Ok(_) => set_condition(cs, "Validated", true, "PlanIsValid", "", generation, now),
        Err(e) => set_condition(cs, "Validated", false, "Error", e.clone(), generation, now),
    }
    match resolved {
        Ok((_, how)) => set_condition(cs, "LatestResolved", true, how, "", generation, now),
        Err(e) => set_condition(cs, "LatestResolved", false, "Error", e.clone(), generation, now),
    }
}

/// Complete is False, and nothing starts, while the plan is invalid or its
/// version unresolved.
pub(super) fn nothing_starts(status: &mut PlanStatus, generation: Option<i64>, now: Timestamp) {
    let why = "the plan is invalid or its version unresolved: nothing starts";
    set_condition(
        &mut status.conditions,
        "Complete",
        false,
        "NotReady",
        why,
        generation,
        now,
    );
}

/// The status a round leaves: the per-node records, the last completion
/// (when a node was released), the progress and Complete.
pub(super) fn round_status(
    status: &mut PlanStatus,
    plan: &Plan,
    old: &PlanStatus,
    round: &Round,
    hash: &str,
    now: Timestamp,
) {
    status.nodes = records(old, &round.kept, &round.chosen, first_phase(plan), hash, now);
    if !round.released.is_empty() {
        status.last_completion_time = Some(Time(now));
    }
    status.progress = Some(format!("{}/{}", round.upgraded, round.selected));
    complete_condition(status, plan.metadata.generation, round, now);
}

impl PlanReconciler {
    /// Writes the round's status (`applying` as upstream's hostname
    /// entries), then tells of it: the node metrics, the exclusive plan's
    /// note, the spans and Events.
    pub(super) async fn publish(
        &self,
        plan: &Plan,
        old: &PlanStatus,
        status: &mut PlanStatus,
        round: &Round<'_>,
        target: &Target,
        now: Timestamp,
    ) -> Result<()> {
        let names = std::mem::take(&mut status.applying);
        status.applying = self.applying_entries(&names);
        self.write_status(plan, status.clone()).await?;
        self.ctx
            .metrics
            .set_plan_nodes(&plan.namespace().unwrap_or_default(), &plan.name_any(), |state| {
                round.counts.get(&state).copied().unwrap_or(0)
            });
        self.note_exclusive(plan, status);
        self.after_write(plan, old, status, &round.released, target, now)
            .await;
        Ok(())
    }

    /// `status.applying` as upstream writes it: the nodes' hostname label values, sorted.
    fn applying_entries(&self, names: &[String]) -> Vec<String> {
        let mut entries: Vec<String> = names
            .iter()
            .map(|name| {
                self.ctx
                    .nodes
                    .get(&ObjectKey::cluster(name))
                    .and_then(|n| n.labels().get(HOSTNAME_LABEL).cloned())
                    .unwrap_or_else(|| name.clone())
            })
            .collect();
        entries.sort();
        entries.dedup();
        entries
    }

    /// Remembers whether an exclusive plan has nodes applying, as written
    /// (the cache catches up later; the next exclusive plan must not wait for it).
    fn note_exclusive(&self, plan: &Plan, status: &PlanStatus) {
        if !plan.spec.exclusive.unwrap_or(false) {
            return;
        }
        let mut applying = self
            .ctx
            .exclusive_applying
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if status.applying.is_empty() {
            applying.remove(&plan.key());
        } else {
            applying.insert(plan.key());
        }
    }

    /// Writes the status, conditioned on the resourceVersion the plan was
    /// read at: a stale read loses (409) and is retried on fresh state.
    pub(super) async fn write_status(&self, plan: &Plan, status: PlanStatus) -> Result<()> {
        let updated = plan_status_write(plan, status);
        if plan.status == updated.status {
            return Ok(());
        }
        self.ctx.leader.ensure_leader()?;
        let api = self.plans_api(plan);
        api.replace_status(&plan.name_any(), &PostParams::default(), &updated)
            .await?;
        Ok(())
    }

    /// Once the status is written: the phase spans that ended, the root
    /// span of each released node, the Events.
    async fn after_write(
        &self,
        plan: &Plan,
        old: &PlanStatus,
        new: &PlanStatus,
        released: &[String],
        target: &Target,
        now: Timestamp,
    ) {
        let end = SystemTime::from(now);
        let mut emitted = false;
        for r in &old.nodes {
            let Some(tp) = TraceParent::parse(&r.traceparent) else {
                continue;
            };
            let next = new.nodes.iter().find(|n| n.name == r.name);
            if next.is_some_and(|n| n.phase == r.phase) {
                continue;
            }
            self.observe_job(plan, r, next, end);
            if let Some(span) = phase_span(&r.phase) {
                emitted = true;
                trace::emit_phase(
                    &tp,
                    SpanRecord::new(span, SystemTime::from(r.phase_since.0), end)
                        .attr("k8s.node.name", r.name.clone()),
                );
            }
            if released.contains(&r.name) {
                trace::emit_root(
                    &tp,
                    SpanRecord::new("upgrade node", SystemTime::from(r.started.0), end)
                        .attr("nodewarden.plan", plan.key())
                        .attr("k8s.node.name", r.name.clone())
                        .attr("nodewarden.version", target.version.clone())
                        .attr("nodewarden.hash", target.hash.clone()),
                );
                self.event(
                    plan,
                    EventType::Normal,
                    "Upgraded",
                    format!("node {} upgraded and Ready", r.name),
                );
            }
        }
        for n in &new.nodes {
            let was = old.nodes.iter().find(|r| r.name == n.name);
            if was.is_none() {
                self.event(
                    plan,
                    EventType::Normal,
                    "Upgrading",
                    format!("node {} starts applying", n.name),
                );
            }
            if n.phase == Phase::Failed.as_str() && was.is_none_or(|r| r.phase != n.phase) {
                self.event(
                    plan,
                    EventType::Warning,
                    failure_of(&n.message).as_str(),
                    format!("node {}: {}", n.name, n.message),
                );
            }
        }
        if emitted {
            // A replica killed later loses nothing it already wrote.
            trace::flush(TRACE_FLUSH_TIMEOUT).await;
        }
        let complete = |s: &PlanStatus| crate::api::conditions::is_true(&s.conditions, "Complete");
        if complete(new) && !complete(old) {
            self.event(
                plan,
                EventType::Normal,
                "Complete",
                format!("every selected node runs {}", target.version),
            );
        }
    }

    /// A record that left the job phase: the Job's duration; one that
    /// turned Failed: a failure.
    fn observe_job(&self, plan: &Plan, was: &NodeUpgrade, next: Option<&NodeUpgrade>, end: SystemTime) {
        let Some(next) = next else {
            return;
        };
        let took = end
            .duration_since(SystemTime::from(was.phase_since.0))
            .unwrap_or_default();
        let failed = next.phase == Phase::Failed.as_str();
        if was.phase == Phase::Upgrading.as_str() && (failed || next.phase == Phase::WaitingReady.as_str()) {
            let result = if failed {
                JobResult::Failed
            } else {
                JobResult::Succeeded
            };
            self.ctx
                .metrics
                .plan_job_duration
                .get_or_create(&JobResultLabels { result })
                .observe(took.as_secs_f64());
        }
        if failed {
            self.ctx
                .metrics
                .plan_failures
                .get_or_create(&PlanFailureLabels {
                    plan_namespace: plan.namespace().unwrap_or_default(),
                    plan: plan.name_any(),
                    reason: failure_of(&next.message),
                })
                .inc();
        }
    }

    /// An Event on the plan about its upgrade.
    pub(super) fn event(&self, plan: &Plan, type_: EventType, reason: &str, note: String) {
        let event = crate::controllers::event(type_, reason, "Upgrade", &note);
        crate::controllers::spawn_event(&self.ctx.recorder, event, plan.object_ref(&()));
    }
}

/// What a status write of `plan` sends: the plan as read (so its
/// resourceVersion, a precondition: a write landing late, after another
/// leader wrote, is refused with 409) with `status`, observed at the plan's
/// generation.
pub fn plan_status_write(plan: &Plan, mut status: PlanStatus) -> Plan {
    status.observed_generation = plan.metadata.generation;
    let mut updated = plan.clone();
    updated.status = Some(status);
    updated
}

/// The per-node records: a kept node keeps its start, trace and (in the
/// same phase) its phase's start; a new node gets a trace of its own.
fn records(
    old: &PlanStatus,
    kept: &[&Applying],
    chosen: &[String],
    first: Phase,
    hash: &str,
    now: Timestamp,
) -> Vec<NodeUpgrade> {
    let mut out = Vec::new();
    for a in kept {
        let prev = old.nodes.iter().find(|r| r.name == a.name);
        let phase = a.decision.phase.as_str().to_string();
        let same = prev.is_some_and(|r| r.phase == phase && r.hash == hash);
        out.push(NodeUpgrade {
            name: a.name.clone(),
            hash: hash.to_string(),
            phase_since: match (same, prev) {
                (true, Some(r)) => r.phase_since.clone(),
                _ => Time(now),
            },
            phase,
            started: prev.map(|r| r.started.clone()).unwrap_or(Time(now)),
            message: a.decision.message.clone(),
            traceparent: prev
                .map(|r| r.traceparent.clone())
                .unwrap_or_else(|| TraceParent::new_root().header()),
        });
    }
    out.extend(chosen.iter().map(|name| NodeUpgrade {
        name: name.clone(),
        hash: hash.to_string(),
        phase: first.as_str().into(),
        started: Time(now),
        phase_since: Time(now),
        message: "starting".into(),
        traceparent: TraceParent::new_root().header(),
    }));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Complete: True once every selected node is on the hash and none applies.
/// Only what is wrong or waiting carries a message (see [`checks`]); the
/// progress is in `status.progress` and `status.nodes`.
fn complete_condition(status: &mut PlanStatus, generation: Option<i64>, round: &Round, now: Timestamp) {
    let (upgraded, selected) = (round.upgraded, round.selected);
    let (ok, reason, message) = if let Some(f) = round.kept.iter().find(|a| a.decision.phase == Phase::Failed)
    {
        let reason = failure_of(&f.decision.message).as_str();
        (false, reason, format!("node {}: {}", f.name, f.decision.message))
    } else if !round.kept.is_empty() || !status.applying.is_empty() {
        // Only what holds a node up shows (a drain a pod or budget blocks).
        let held: Vec<String> = round
            .kept
            .iter()
            .filter(|a| a.decision.held)
            .map(|a| format!("node {}: {}", a.name, a.decision.message))
            .collect();
        (false, "SyncJob", held.join("; "))
    } else if upgraded < selected {
        let why = round
            .blocked
            .as_deref()
            .unwrap_or("waiting for nodes to be Ready");
        (false, "Waiting", format!("{upgraded}/{selected} upgraded; {why}"))
    } else {
        (true, "Complete", String::new())
    };
    set_condition(
        &mut status.conditions,
        "Complete",
        ok,
        reason,
        message,
        generation,
        now,
    );
}

/// The selected nodes by state: applying (or failed) as `status` lists
/// them, else upgraded or due by their hash label.
pub(super) fn node_counts(status: &PlanStatus, tally: &Tally) -> HashMap<PlanNodeState, usize> {
    let mut counts = HashMap::new();
    let applying: BTreeSet<&str> = status.applying.iter().map(String::as_str).collect();
    for r in status.nodes.iter().filter(|r| applying.contains(r.name.as_str())) {
        let state = match r.phase == Phase::Failed.as_str() {
            true => PlanNodeState::Failed,
            false => PlanNodeState::Applying,
        };
        *counts.entry(state).or_insert(0) += 1;
    }
    // The rest of the selected nodes: upgraded or due, applying ones aside.
    let (mut upgraded, mut due) = (tally.upgraded(), tally.selected() - tally.upgraded());
    for mark in applying.iter().filter_map(|name| tally.get(name)) {
        match mark.upgraded {
            true => upgraded -= 1,
            false => due -= 1,
        }
    }
    counts.insert(PlanNodeState::Upgraded, upgraded);
    counts.insert(PlanNodeState::Due, due);
    counts
}

/// What a failed node's message says failed (schedule's drain messages
/// start with "drain").
fn failure_of(message: &str) -> PlanFailure {
    if message.starts_with(schedule::DRAIN_FAILED) {
        PlanFailure::DrainFailed
    } else {
        PlanFailure::JobFailed
    }
}

/// A phase's span name in the node's trace.
fn phase_span(phase: &str) -> Option<&'static str> {
    Some(match phase {
        "Preparing" => "prepare",
        "Cordoning" => "cordon",
        "Draining" => "drain",
        "Upgrading" => "job",
        "WaitingReady" => "wait ready",
        "Releasing" => "uncordon",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::PlanSpec;

    #[test]
    fn a_status_write_carries_the_version_read_and_the_generation_observed() {
        let mut plan = Plan::new("p", PlanSpec::default());
        plan.metadata.resource_version = Some("12".into());
        plan.metadata.generation = Some(3);
        plan.status = Some(PlanStatus::default());
        let written = plan_status_write(&plan, PlanStatus::default());
        assert_eq!(written.metadata.resource_version.as_deref(), Some("12"));
        assert_eq!(
            written.status.as_ref().and_then(|s| s.observed_generation),
            Some(3)
        );
    }
}
