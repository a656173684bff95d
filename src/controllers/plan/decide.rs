//! Deciding: what the gathered facts mean for the plan and its nodes. Pure
//! functions, tested by tables (the node-by-node schedule itself is
//! `upgrade::schedule`'s).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::gather::{SecretData, job_state};
use super::{Applying, Target};
use crate::api::node_maintenance::{MaintenancePhase, medik8s};
use crate::api::plan::{Plan, PlanStatus};
use crate::drain::node::recorded_changes;
use crate::drain::pods::selector_matches;
use crate::upgrade::job::{HOSTNAME_LABEL, parse_go_duration};
use crate::upgrade::schedule::{self, JobState, Maintenance, Phase, Prep};
use crate::upgrade::window::Window;
use crate::upgrade::{hash, labels};

/// What the plan aims at: `version`, and upstream's hash of it, the plan as
/// stored and its Secrets.
pub(super) fn target(plan: &Plan, version: String, secrets: &SecretData, window: Option<Window>) -> Target {
    // Upstream hashes the Plan as stored; an object that cannot be JSON
    // has no digest fields (serializing plain data cannot fail).
    let as_json = serde_json::to_value(plan).unwrap_or_default();
    let account = plan.spec.service_account_name.as_deref().unwrap_or("");
    let hash = hash::plan_hash(&version, account, &as_json, secrets);
    Target {
        version,
        hash,
        window,
    }
}

/// Why no node may start now, if none may: a failed node, the window,
/// another exclusive plan (`holder`), postCompleteDelay, or no concurrency.
pub(super) fn start_blocked(
    plan: &Plan,
    status: &PlanStatus,
    kept: &[&Applying],
    target: &Target,
    holder: Option<&str>,
    now: Timestamp,
) -> Option<String> {
    let failed = kept
        .iter()
        .find(|a| a.decision.phase == Phase::Failed)
        .map(|a| a.name.as_str());
    // Upstream's rule: outside the window new nodes still start while
    // any node of the plan is applying.
    let window_open = target.window.as_ref().is_none_or(|w| w.contains(now)) || !kept.is_empty();
    let delay_until = delay_until(plan, status);
    let mut blocked = schedule::start_blocked(failed, window_open, holder, delay_until, now);
    if !window_open && target.window.as_ref().is_some_and(Window::never_opens) {
        blocked = blocked.map(|b| format!("{b} (it has no days, so it never opens)"));
    }
    if blocked.is_some() {
        return blocked;
    }
    (concurrency(plan) == 0).then(|| "spec.concurrency is unset or 0: no node starts until it is set".into())
}

/// How many nodes may apply at once. Upstream's default is 0, which
/// selects no node (it says nothing; we do, see [`start_blocked`]).
pub(super) fn concurrency(plan: &Plan) -> usize {
    plan.spec.concurrency.unwrap_or(0).max(0) as usize
}

/// How the plan prepares a node: drain implies cordon.
pub(super) fn prep_of(plan: &Plan) -> Prep {
    match (&plan.spec.drain, plan.spec.cordon.unwrap_or(false)) {
        (Some(_), _) => Prep::Drain,
        (None, true) => Prep::Cordon,
        (None, false) => Prep::Nothing,
    }
}

/// The phase a chosen node starts in: its prepare Job's, when the plan
/// has one, else the first of what the plan does to a node.
pub(super) fn first_phase(plan: &Plan) -> Phase {
    match (&plan.spec.prepare, prep_of(plan)) {
        (Some(_), _) => Phase::Preparing,
        (None, Prep::Drain) => Phase::Draining,
        (None, Prep::Cordon) => Phase::Cordoning,
        (None, Prep::Nothing) => Phase::Upgrading,
    }
}

/// Does the plan select `node`? Its selector matches, and the node has a
/// hostname to pin a Job to and is not being deleted.
pub(super) fn selects(plan: &Plan, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    labels.contains_key(HOSTNAME_LABEL)
        && node.metadata.deletion_timestamp.is_none()
        && plan
            .spec
            .node_selector
            .as_ref()
            .is_some_and(|s| selector_matches(s, labels))
}

/// Did upstream's Job (a System Upgrade Controller's, taken over) cordon
/// the node? Its own cordon or drain container did, and upstream uncordons
/// once the Job completed: a node taken over mid-upgrade gets the same.
/// Only a node no one recorded a change on (an admin's or another owner's
/// cordon stays).
pub(super) fn cordoned_by_upstream(plan: &Plan, node: &Node, job: Option<&Job>) -> bool {
    let unschedulable = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let upstream_job =
        job.is_some_and(|j| made_by_upstream(j) && job_state(j, &node.name_any()) == JobState::Succeeded);
    unschedulable && upstream_job && prep_of(plan) != Prep::Nothing && recorded_changes(node).is_none()
}

/// A Job the System Upgrade Controller made: it carries upstream's
/// controller label (which nodewarden's carry too) and, unlike
/// nodewarden's, no owner (upstream makes its Jobs without one).
fn made_by_upstream(job: &Job) -> bool {
    job.labels().contains_key(labels::CONTROLLER)
        && !job
            .owner_references()
            .iter()
            .any(|o| o.kind == "Plan" && o.controller == Some(true))
}

/// spec.drain.timeout: nanoseconds as a number (upstream's Go duration) or a
/// duration string; none or zero is no timeout.
pub(super) fn drain_timeout(plan: &Plan) -> Option<Duration> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match plan.spec.drain.as_ref()?.timeout.as_ref()? {
        IntOrString::Int(ns) if *ns > 0 => Some(Duration::from_nanos(*ns as u64)),
        IntOrString::Int(_) => None,
        IntOrString::String(s) => parse_go_duration(s).filter(|d| !d.is_zero()),
    }
}

/// How the plan's maintenance of a node stands. One still draining past
/// `timeout` (spec.drain.timeout) counts as failed, naming what blocks it,
/// though it goes on draining: the failure clears when the drain finishes.
pub(super) fn maintenance_state(
    m: &medik8s::NodeMaintenance,
    timeout: Option<Duration>,
    now: Timestamp,
) -> Maintenance {
    let status = m.status.clone().unwrap_or_default();
    let blockers: Vec<String> = status
        .blocked_by
        .iter()
        .flatten()
        .map(|b| match b.pdb.as_str() {
            "" => format!("pod {}", b.pod),
            pdb => format!("pod {} (PodDisruptionBudget {pdb})", b.pod),
        })
        .collect();
    let mut detail: Vec<String> = status.last_error.iter().cloned().collect();
    if !blockers.is_empty() {
        detail.push(format!("blocked by {}", blockers.join(", ")));
    }
    let detail = detail.join("; ");
    match status.phase {
        Some(MaintenancePhase::Succeeded) => Maintenance::Succeeded,
        Some(MaintenancePhase::Failed) => {
            Maintenance::Failed(format!("NodeMaintenance {}: {detail}", m.name_any()))
        }
        _ => {
            let left = match status.pending_pods_count {
                Some(n) if n > 0 => format!(": {n} pods left"),
                _ => String::new(),
            };
            let started = m.metadata.creation_timestamp.as_ref().map(|t| t.0);
            if let (Some(timeout), Some(started)) = (timeout, started)
                && now.duration_since(started).unsigned_abs() >= timeout
                && now > started
            {
                let detail = match detail.as_str() {
                    "" => String::new(),
                    d => format!("; {d}"),
                };
                return Maintenance::Failed(format!(
                    "NodeMaintenance {} not drained within spec.drain.timeout ({}s), still draining{left}{detail}",
                    m.name_any(),
                    timeout.as_secs()
                ));
            }
            match detail.as_str() {
                "" => Maintenance::Running(format!("draining{left}")),
                d => Maintenance::Held(format!("draining{left}; {d}")),
            }
        }
    }
}

/// When the next node may start after the last completion.
fn delay_until(plan: &Plan, status: &PlanStatus) -> Option<Timestamp> {
    let delay = plan
        .spec
        .post_complete_delay
        .as_deref()
        .and_then(parse_go_duration)?;
    let last = status.last_completion_time.as_ref()?.0;
    last.checked_add(jiff::SignedDuration::try_from(delay).ok()?).ok()
}

/// How soon to look again: while a node settles or a delay runs out.
pub(super) fn next_look(plan: &Plan, status: &PlanStatus, kept: &[&Applying], now: Timestamp) -> Duration {
    let mut wait = Duration::from_secs(3600);
    if kept
        .iter()
        .any(|a| matches!(a.decision.phase, Phase::WaitingReady | Phase::Releasing))
    {
        wait = wait.min(Duration::from_secs(1));
    }
    if let Some(t) = delay_until(plan, status).filter(|t| *t > now) {
        wait = wait.min(now.duration_until(t).unsigned_abs() + Duration::from_millis(50));
    }
    wait
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::plan::PlanSpec;
    use crate::upgrade::schedule::{NodeDecision, Step};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    #[test]
    fn a_drain_past_its_timeout_fails_while_it_goes_on() {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).expect("a time");
        let nm = |phase: &str, blocked: bool| -> medik8s::NodeMaintenance {
            let blocked_by = match blocked {
                true => json!([{"pod": "ns/web-1", "pdb": "ns/web"}]),
                false => json!([]),
            };
            serde_json::from_value(json!({
                "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
                "metadata": {"name": "m", "creationTimestamp": t(0).to_string()},
                "spec": {"nodeName": "n1"},
                "status": {"phase": phase, "pendingPodsCount": 1, "blockedBy": blocked_by},
            }))
            .expect("a NodeMaintenance")
        };
        let minute = Some(Duration::from_secs(60));
        // (what, maintenance, timeout, now, expected state's kind, named in its message)
        let cases = [
            (
                "running, in time",
                nm("Running", true),
                minute,
                59,
                "Held",
                "web-1",
            ),
            (
                "running, past its timeout",
                nm("Running", true),
                minute,
                60,
                "Failed",
                "PodDisruptionBudget ns/web",
            ),
            (
                "no timeout: running",
                nm("Running", true),
                None,
                3600,
                "Held",
                "web-1",
            ),
            (
                "running, nothing in the way",
                nm("Running", false),
                None,
                3600,
                "Running",
                "1 pods left",
            ),
            (
                "done after its timeout",
                nm("Succeeded", false),
                minute,
                600,
                "Succeeded",
                "",
            ),
        ];
        for (what, m, timeout, now, kind, named) in cases {
            let got = maintenance_state(&m, timeout, t(now));
            let (got_kind, message) = match &got {
                Maintenance::Absent => ("Absent", ""),
                Maintenance::Running(m) => ("Running", m.as_str()),
                Maintenance::Held(m) => ("Held", m.as_str()),
                Maintenance::Succeeded => ("Succeeded", ""),
                Maintenance::Failed(m) => ("Failed", m.as_str()),
            };
            assert_eq!(got_kind, kind, "{what}: {got:?}");
            assert!(message.contains(named), "{what}: {message}");
        }
    }

    #[test]
    fn the_next_node_waits_out_post_complete_delay() {
        let t = |s: i64| Timestamp::from_second(1_800_000_000 + s).expect("a time");
        let plan = |delay: Option<&str>| {
            Plan::new(
                "p",
                PlanSpec {
                    post_complete_delay: delay.map(String::from),
                    ..Default::default()
                },
            )
        };
        let done_at = |s: Option<i64>| PlanStatus {
            last_completion_time: s.map(|s| Time(t(s))),
            ..Default::default()
        };
        let table = [
            (Some("30s"), Some(100), Some(t(130))),
            (Some("1m30s"), Some(0), Some(t(90))),
            (Some("30s"), None, None),
            (None, Some(100), None),
        ];
        for (delay, last, want) in table {
            assert_eq!(
                delay_until(&plan(delay), &done_at(last)),
                want,
                "{delay:?} after {last:?}"
            );
        }
    }

    #[test]
    fn what_keeps_new_nodes_from_starting() {
        let now = Timestamp::from_second(1_800_000_000).expect("a time");
        let plan = |concurrency: Option<i64>| {
            Plan::new(
                "p",
                PlanSpec {
                    concurrency,
                    ..Default::default()
                },
            )
        };
        let target = Target {
            version: "v1".into(),
            hash: "h".into(),
            window: None,
        };
        let node = |name: &str, phase: Phase| Applying {
            name: name.into(),
            decision: NodeDecision {
                phase,
                step: Step::Wait,
                message: "job failed".into(),
                held: false,
            },
        };
        let (failed, upgrading) = (node("a", Phase::Failed), node("b", Phase::Upgrading));
        /// Concurrency, the nodes kept, another exclusive plan applying,
        /// what the reason says (None: nothing blocks).
        type Row<'a> = (Option<i64>, &'a [&'a Applying], Option<&'a str>, Option<&'a str>);
        let table: &[Row] = &[
            (Some(1), &[], None, None),
            (Some(2), &[&upgrading], None, None),
            (None, &[], None, Some("spec.concurrency is unset or 0")),
            (Some(0), &[], None, Some("spec.concurrency is unset or 0")),
            (Some(1), &[&failed], None, Some("node a failed")),
            (Some(1), &[], Some("ns/other"), Some("exclusive plan ns/other")),
            // What blocks comes before a concurrency of 0.
            (None, &[], Some("ns/other"), Some("exclusive plan ns/other")),
        ];
        for (concurrency, kept, holder, want) in table {
            let got = start_blocked(
                &plan(*concurrency),
                &PlanStatus::default(),
                kept,
                &target,
                *holder,
                now,
            );
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) => assert!(g.contains(w), "{concurrency:?} {holder:?}: {g}"),
                _ => panic!("{concurrency:?} {holder:?}: {got:?}, want {want:?}"),
            }
        }
        assert_eq!(concurrency(&plan(Some(-3))), 0);
        assert_eq!(concurrency(&plan(Some(4))), 4);
    }
}
