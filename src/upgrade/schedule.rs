//! Which nodes apply a Plan next, and what each applying node needs (pure).
//!
//! Everything here is decided from what the cluster shows — the Plan's
//! status, the nodes' labels and readiness, the NodeMaintenances and Jobs —
//! never from memory, so a new leader carries on exactly where the last one
//! stopped. A node is listed in `status.applying` (written, conditioned on
//! the Plan's resourceVersion) before any step is taken on it: the list is
//! what bounds concurrency, also under a stale cache or a leader change.

use std::time::Duration;

use jiff::Timestamp;
use sha2::{Digest, Sha256};

use crate::api::plan::NodeUpgrade;

/// What a node needs before its Job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prep {
    /// Neither cordon nor drain.
    Nothing,
    /// Cordon only.
    Cordon,
    /// Cordon and drain (through a NodeMaintenance).
    Drain,
}

/// The node's NodeMaintenance made by this plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Maintenance {
    /// None exists.
    Absent,
    /// Draining, or waiting for its turn; the message says which.
    Running(String),
    /// Draining, held up by something the message names (a pod kubectl's
    /// rules refuse, a PodDisruptionBudget): what `kubectl get plans` shows.
    Held(String),
    /// Cordoned and drained.
    Succeeded,
    /// The drain failed or ran past the plan's drain timeout; the message
    /// names the blocker.
    Failed(String),
}

/// How a failed drain's message starts. A drain that ran past its timeout
/// goes on (the node stays cordoned, as with upstream's drain retried by
/// its Job), so unlike a failed Job it holds only while the drain does.
pub const DRAIN_FAILED: &str = "drain failed";

/// The node's Job for the plan's current hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobState {
    /// None exists.
    Absent,
    /// Created, not finished.
    Running,
    /// Completed.
    Succeeded,
    /// Failed (backoff limit or deadline); the message says why.
    Failed(String),
}

/// One node of the plan, as the cluster shows it.
#[derive(Clone, Debug)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// Its `plan.upgrade.cattle.io/<plan>` label.
    pub hash_label: Option<String>,
    /// Ready now.
    pub ready: bool,
    /// When Ready last turned True.
    pub ready_since: Option<Timestamp>,
    /// It exists and the plan's selector still picks it.
    pub selected: bool,
    /// Its NodeMaintenance (drain plans).
    pub maintenance: Maintenance,
    /// This plan's cordon is on it (cordon-only plans).
    pub cordoned_by_plan: bool,
    /// Another owner holds it (a NodeMaintenance's or another plan's
    /// record on the node): a cordon waits until they let go.
    pub held_by: Option<String>,
    /// Its Job for the current hash.
    pub job: JobState,
    /// That Job was made from an earlier spec of the plan (its template
    /// differs from what the plan renders now).
    pub job_outdated: bool,
    /// Its prepare Job for the current hash (None: the plan has no `prepare`).
    pub prepare_job: Option<JobState>,
    /// A Job of an earlier hash still runs on it.
    pub earlier_job_running: bool,
    /// Something this plan put on it is still there: its NodeMaintenance
    /// (also while being deleted), its cordon, a running Job.
    pub remnants: bool,
}

/// What to do on an applying node now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing: wait for the next change.
    Wait,
    /// Cordon it (recorded, so the undo is exact).
    Cordon,
    /// Create its NodeMaintenance.
    Drain,
    /// Create its prepare Job (before any cordon or drain).
    Prepare,
    /// Delete its failed prepare Job, so the next pass makes it again
    /// (upstream recreates a failed Job).
    RetryPrepare,
    /// Delete its failed Job made from an earlier spec, so the next pass
    /// makes it with the plan's edit (upstream's apply replaces it).
    RetryJob,
    /// Create its Job.
    CreateJob,
    /// Label it with the hash and postCompleteLabels.
    Label,
    /// Undo this plan's cordon or drain, stop its running Jobs.
    Release,
    /// Nothing of the plan is left on it: take it off `applying`.
    Finish,
}

/// A node's phase in `status.nodes` (and its trace's span names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Its prepare Job runs (nothing else is done to it yet).
    Preparing,
    /// Being cordoned.
    Cordoning,
    /// Being drained.
    Draining,
    /// Its Job runs.
    Upgrading,
    /// Upgraded; waiting for it to be (and stay) Ready.
    WaitingReady,
    /// Done: being released.
    Releasing,
    /// Its drain or Job failed: it stays cordoned and the plan stops.
    Failed,
}

impl Phase {
    /// The name in status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Preparing => "Preparing",
            Phase::Cordoning => "Cordoning",
            Phase::Draining => "Draining",
            Phase::Upgrading => "Upgrading",
            Phase::WaitingReady => "WaitingReady",
            Phase::Releasing => "Releasing",
            Phase::Failed => "Failed",
        }
    }
}

/// The decision for one applying node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeDecision {
    /// Where it is.
    pub phase: Phase,
    /// What to do now.
    pub step: Step,
    /// What it waits for, or why it failed.
    pub message: String,
    /// Held up by something a user must see (a drain a pod or a budget
    /// blocks), though not failed.
    pub held: bool,
}

fn decision(phase: Phase, step: Step, message: impl Into<String>) -> NodeDecision {
    NodeDecision {
        phase,
        step,
        message: message.into(),
        held: false,
    }
}

/// What the next step on an applying node is. `record` is its entry in
/// `status.nodes`; `settle` how long it must have been Ready after its Job
/// before it counts as done (the health gate upstream lacks). The status
/// says Releasing before anything is undone (so a round that read a stale
/// status undoes nothing and no phase goes unrecorded), and a released node
/// leaves `applying` only once nothing of the plan is left on it, so the
/// next node never drains while the last one is still cordoned.
pub fn decide_node(
    prep: Prep,
    hash: &str,
    node: &NodeFacts,
    record: Option<&NodeUpgrade>,
    now: Timestamp,
    settle: Duration,
) -> NodeDecision {
    let d = decide(prep, hash, node, record, now, settle);
    let releasing = record.is_some_and(|r| r.phase == Phase::Releasing.as_str());
    match d.step {
        Step::Release if !node.remnants => decision(Phase::Releasing, Step::Finish, d.message),
        Step::Release if !releasing => decision(Phase::Releasing, Step::Wait, d.message),
        _ => d,
    }
}

fn decide(
    prep: Prep,
    hash: &str,
    node: &NodeFacts,
    record: Option<&NodeUpgrade>,
    now: Timestamp,
    settle: Duration,
) -> NodeDecision {
    if !node.selected {
        return decision(Phase::Releasing, Step::Release, "no longer selected by the plan");
    }
    // A failed Job holds while it exists: the node stays cordoned and no
    // further node starts. Once it is gone (its TTL, upstream's 900 s by
    // default) it is made again, as upstream recreates a failed Job; each
    // failure is reported. A failed drain holds while its maintenance says so.
    if node.hash_label.as_deref() == Some(hash) {
        return health_gate(node, record, now, settle);
    }
    match &node.job {
        JobState::Succeeded => decision(Phase::WaitingReady, Step::Label, "its Job succeeded"),
        JobState::Failed(_) if node.job_outdated => decision(
            Phase::Upgrading,
            Step::RetryJob,
            "the plan changed since its Job failed: the Job is made again",
        ),
        JobState::Failed(why) => decision(Phase::Failed, Step::Wait, why.clone()),
        JobState::Running => decision(Phase::Upgrading, Step::Wait, "its Job runs"),
        JobState::Absent if node.earlier_job_running => decision(
            Phase::Upgrading,
            Step::Wait,
            "the Job of the plan's previous version is still running",
        ),
        JobState::Absent => match &node.prepare_job {
            Some(JobState::Absent) => decision(Phase::Preparing, Step::Prepare, "starting its prepare Job"),
            Some(JobState::Running) => decision(Phase::Preparing, Step::Wait, "its prepare Job runs"),
            Some(JobState::Failed(why)) => decision(Phase::Preparing, Step::RetryPrepare, why.clone()),
            Some(JobState::Succeeded) | None => prepare(prep, node),
        },
    }
}

/// Before the Job: cordon or drain as the plan asks, then the Job.
fn prepare(prep: Prep, node: &NodeFacts) -> NodeDecision {
    match (prep, &node.maintenance) {
        (Prep::Drain, Maintenance::Absent) => decision(Phase::Draining, Step::Drain, "draining"),
        (Prep::Drain, Maintenance::Running(m)) => decision(Phase::Draining, Step::Wait, m.clone()),
        (Prep::Drain, Maintenance::Held(m)) => NodeDecision {
            held: true,
            ..decision(Phase::Draining, Step::Wait, m.clone())
        },
        (Prep::Drain, Maintenance::Failed(m)) => {
            decision(Phase::Failed, Step::Wait, format!("{DRAIN_FAILED}: {m}"))
        }
        (Prep::Cordon, _) if !node.cordoned_by_plan => match &node.held_by {
            Some(owner) => decision(
                Phase::Cordoning,
                Step::Wait,
                format!("waiting for {owner} to release the node"),
            ),
            None => decision(Phase::Cordoning, Step::Cordon, "cordoning"),
        },
        _ => decision(Phase::Upgrading, Step::CreateJob, "starting its Job"),
    }
}

/// Upgraded: done once Ready again and Ready for `settle` since the later
/// of the label and its last Ready transition.
fn health_gate(
    node: &NodeFacts,
    record: Option<&NodeUpgrade>,
    now: Timestamp,
    settle: Duration,
) -> NodeDecision {
    if !node.ready {
        return decision(
            Phase::WaitingReady,
            Step::Wait,
            "waiting for the node to be Ready again",
        );
    }
    let labelled = record
        .filter(|r| r.phase == Phase::WaitingReady.as_str())
        .map(|r| r.phase_since.0);
    let since = match (labelled, node.ready_since) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let settled = since.is_none_or(|t| now.duration_since(t).unsigned_abs() >= settle || now < t);
    if settled {
        decision(Phase::Releasing, Step::Release, "upgraded and Ready")
    } else {
        decision(
            Phase::WaitingReady,
            Step::Wait,
            format!("Ready; settling for {}s", settle.as_secs()),
        )
    }
}

/// Why no new node may start now (None: slots may be filled).
pub fn start_blocked(
    failed: Option<&str>,
    window_open: bool,
    exclusive_holder: Option<&str>,
    delay_until: Option<Timestamp>,
    now: Timestamp,
) -> Option<String> {
    if let Some(node) = failed {
        return Some(format!(
            "node {node} failed; no further node starts until the plan changes"
        ));
    }
    if !window_open {
        return Some("outside the plan's window".into());
    }
    if let Some(other) = exclusive_holder {
        return Some(format!("exclusive plan {other} is applying"));
    }
    match delay_until {
        Some(t) if now < t => Some(format!("postCompleteDelay: next node at {t}")),
        _ => None,
    }
}

/// A node that could start.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Its name.
    pub name: String,
    /// Its UID (orders candidates).
    pub uid: String,
    /// Ready now: a NotReady node does not start.
    pub ready: bool,
}

/// The nodes to add to `applying`: up to `concurrency - applying` Ready
/// candidates, in an order fixed by node, plan and hash (upstream's), so
/// every replica and every retry picks the same ones.
pub fn choose(
    plan_uid: &str,
    hash: &str,
    applying: usize,
    concurrency: usize,
    candidates: &[Candidate],
) -> Vec<String> {
    let free = concurrency.saturating_sub(applying);
    if free == 0 {
        return Vec::new();
    }
    let mut ordered: Vec<(String, &Candidate)> = candidates
        .iter()
        .filter(|c| c.ready)
        .map(|c| {
            let key = Sha256::new()
                .chain_update(c.uid.as_bytes())
                .chain_update(plan_uid.as_bytes())
                .chain_update(hash.as_bytes())
                .finalize();
            (super::hex(&key), c)
        })
        .collect();
    ordered.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    ordered
        .into_iter()
        .take(free)
        .map(|(_, c)| c.name.clone())
        .collect()
}

/// Is a node due: picked by the selector and labelled neither with the hash nor `disabled`?
pub fn is_due(hash_label: Option<&str>, hash: &str) -> bool {
    !matches!(hash_label, Some(l) if l == hash || l == crate::api::plan::DISABLED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const H: &str = "hash-2";

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).expect("a time")
    }

    fn node() -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            hash_label: Some("hash-1".into()),
            ready: true,
            ready_since: Some(t(0)),
            selected: true,
            maintenance: Maintenance::Absent,
            cordoned_by_plan: false,
            held_by: None,
            job: JobState::Absent,
            job_outdated: false,
            prepare_job: None,
            earlier_job_running: false,
            remnants: true,
        }
    }

    fn record(phase: Phase, hash: &str, since: i64) -> NodeUpgrade {
        NodeUpgrade {
            name: "n1".into(),
            hash: hash.into(),
            phase: phase.as_str().into(),
            started: Time(t(0)),
            phase_since: Time(t(since)),
            message: "Job x failed".into(),
            traceparent: String::new(),
        }
    }

    /// what, prep, node, its record, now, expected phase and step.
    type Row<'a> = (
        &'a str,
        Prep,
        NodeFacts,
        Option<&'a NodeUpgrade>,
        i64,
        Phase,
        Step,
    );

    #[test]
    fn steps_of_a_node() {
        let settle = Duration::from_secs(10);
        let with = |f: &dyn Fn(&mut NodeFacts)| {
            let mut n = node();
            f(&mut n);
            n
        };
        let failed = record(Phase::Failed, H, 0);
        let failed_old = record(Phase::Failed, "hash-1", 0);
        let drain_failed = NodeUpgrade {
            message: format!("{DRAIN_FAILED}: blocked by pod p (PodDisruptionBudget x)"),
            ..record(Phase::Failed, H, 0)
        };
        let labelled = record(Phase::WaitingReady, H, 100);
        let releasing = record(Phase::Releasing, H, 110);
        #[rustfmt::skip]
        let table: Vec<Row> = vec![
            ("drain first", Prep::Drain, node(), None, 0, Phase::Draining, Step::Drain),
            ("drain running", Prep::Drain, with(&|n| n.maintenance = Maintenance::Running("2 pods".into())), None, 0, Phase::Draining, Step::Wait),
            ("drain held by a pod", Prep::Drain, with(&|n| n.maintenance = Maintenance::Held("blocked by pod a/b".into())), None, 0, Phase::Draining, Step::Wait),
            ("drained: job", Prep::Drain, with(&|n| n.maintenance = Maintenance::Succeeded), None, 0, Phase::Upgrading, Step::CreateJob),
            ("drain failed", Prep::Drain, with(&|n| n.maintenance = Maintenance::Failed("pdb x".into())), None, 0, Phase::Failed, Step::Wait),
            ("cordon first", Prep::Cordon, node(), None, 0, Phase::Cordoning, Step::Cordon),
            ("held by another: wait", Prep::Cordon, with(&|n| n.held_by = Some("nodemaintenance.medik8s.io/x".into())), None, 0, Phase::Cordoning, Step::Wait),
            ("cordoned: job", Prep::Cordon, with(&|n| n.cordoned_by_plan = true), None, 0, Phase::Upgrading, Step::CreateJob),
            ("no prep: job", Prep::Nothing, node(), None, 0, Phase::Upgrading, Step::CreateJob),
            ("job runs", Prep::Drain, with(&|n| n.job = JobState::Running), None, 0, Phase::Upgrading, Step::Wait),
            ("job failed", Prep::Drain, with(&|n| n.job = JobState::Failed("x".into())), None, 0, Phase::Failed, Step::Wait),
            ("job failed, the plan edited since: made again", Prep::Drain, with(&|n| { n.job = JobState::Failed("x".into()); n.job_outdated = true; }), Some(&failed), 0, Phase::Upgrading, Step::RetryJob),
            ("a running job of an earlier spec runs on", Prep::Drain, with(&|n| { n.job = JobState::Running; n.job_outdated = true; }), None, 0, Phase::Upgrading, Step::Wait),
            ("a drain failure lasts while the drain fails", Prep::Drain, with(&|n| n.maintenance = Maintenance::Failed("pdb x".into())), Some(&drain_failed), 0, Phase::Failed, Step::Wait),
            ("a drain that failed and then finished goes on", Prep::Drain, with(&|n| n.maintenance = Maintenance::Succeeded), Some(&drain_failed), 0, Phase::Upgrading, Step::CreateJob),
            ("a failed job gone (its TTL) is made again, as upstream", Prep::Drain, with(&|n| n.maintenance = Maintenance::Succeeded), Some(&failed), 0, Phase::Upgrading, Step::CreateJob),
            ("a new hash retries", Prep::Drain, with(&|n| n.maintenance = Maintenance::Succeeded), Some(&failed_old), 0, Phase::Upgrading, Step::CreateJob),
            ("earlier job first", Prep::Drain, with(&|n| n.earlier_job_running = true), None, 0, Phase::Upgrading, Step::Wait),
            ("job done: label", Prep::Drain, with(&|n| n.job = JobState::Succeeded), None, 0, Phase::WaitingReady, Step::Label),
            ("labelled, rebooting", Prep::Drain, with(&|n| { n.hash_label = Some(H.into()); n.ready = false; }), Some(&labelled), 200, Phase::WaitingReady, Step::Wait),
            ("labelled, settling", Prep::Drain, with(&|n| n.hash_label = Some(H.into())), Some(&labelled), 105, Phase::WaitingReady, Step::Wait),
            ("back Ready, settling", Prep::Drain, with(&|n| { n.hash_label = Some(H.into()); n.ready_since = Some(t(300)); }), Some(&labelled), 305, Phase::WaitingReady, Step::Wait),
            ("settled: recorded releasing first", Prep::Drain, with(&|n| n.hash_label = Some(H.into())), Some(&labelled), 110, Phase::Releasing, Step::Wait),
            ("recorded releasing: release", Prep::Drain, with(&|n| n.hash_label = Some(H.into())), Some(&releasing), 110, Phase::Releasing, Step::Release),
            ("deselected: recorded releasing first", Prep::Drain, with(&|n| { n.selected = false; n.job = JobState::Running; }), None, 0, Phase::Releasing, Step::Wait),
            ("deselected, recorded: release", Prep::Drain, with(&|n| { n.selected = false; n.job = JobState::Running; }), Some(&releasing), 0, Phase::Releasing, Step::Release),
            ("released: finish", Prep::Drain, with(&|n| { n.hash_label = Some(H.into()); n.remnants = false; }), Some(&labelled), 110, Phase::Releasing, Step::Finish),
            ("deselected, nothing left: finish", Prep::Drain, with(&|n| { n.selected = false; n.remnants = false; }), None, 0, Phase::Releasing, Step::Finish),
            ("prepare before the drain", Prep::Drain, with(&|n| n.prepare_job = Some(JobState::Absent)), None, 0, Phase::Preparing, Step::Prepare),
            ("prepare runs: no drain yet", Prep::Drain, with(&|n| n.prepare_job = Some(JobState::Running)), None, 0, Phase::Preparing, Step::Wait),
            ("prepare failed: retried", Prep::Drain, with(&|n| n.prepare_job = Some(JobState::Failed("deadline".into()))), None, 0, Phase::Preparing, Step::RetryPrepare),
            ("prepared: drain", Prep::Drain, with(&|n| n.prepare_job = Some(JobState::Succeeded)), None, 0, Phase::Draining, Step::Drain),
            ("prepared, drained: job", Prep::Drain, with(&|n| { n.prepare_job = Some(JobState::Succeeded); n.maintenance = Maintenance::Succeeded; }), None, 0, Phase::Upgrading, Step::CreateJob),
            ("no prep, settled: finish", Prep::Nothing, with(&|n| { n.hash_label = Some(H.into()); n.remnants = false; }), Some(&labelled), 110, Phase::Releasing, Step::Finish),
        ];
        for (what, prep, n, rec, now, phase, step) in table {
            let d = decide_node(prep, H, &n, rec, t(now), settle);
            assert_eq!((d.phase, d.step), (phase, step), "{what}: {}", d.message);
        }
    }

    #[test]
    fn choosing_is_bounded_stable_and_skips_not_ready() {
        let cands: Vec<Candidate> = (0..8)
            .map(|i| Candidate {
                name: format!("n{i}"),
                uid: format!("uid-{i}"),
                ready: i != 3,
            })
            .collect();
        let a = choose("plan", H, 0, 2, &cands);
        assert_eq!(a.len(), 2);
        assert_eq!(a, choose("plan", H, 0, 2, &cands), "same answer every time");
        let mut reversed = cands.clone();
        reversed.reverse();
        assert_eq!(a, choose("plan", H, 0, 2, &reversed), "independent of list order");
        assert!(choose("plan", H, 2, 2, &cands).is_empty(), "no free slot");
        assert_eq!(choose("plan", H, 1, 2, &cands).len(), 1);
        assert!(
            !choose("plan", H, 0, 8, &cands).contains(&"n3".to_string()),
            "NotReady never starts"
        );
        assert!(choose("plan", H, 0, 0, &cands).is_empty(), "concurrency 0 pauses");
    }

    #[test]
    fn what_blocks_a_start() {
        let now = t(100);
        let table = [
            (Some("n1"), true, None, None, true),
            (None, false, None, None, true),
            (None, true, Some("other"), None, true),
            (None, true, None, Some(t(200)), true),
            (None, true, None, Some(t(50)), false),
            (None, true, None, None, false),
        ];
        for (i, (failed, window, holder, delay, blocked)) in table.into_iter().enumerate() {
            assert_eq!(
                start_blocked(failed, window, holder, delay, now).is_some(),
                blocked,
                "row {i}"
            );
        }
    }

    #[test]
    fn due_nodes() {
        assert!(is_due(None, H));
        assert!(is_due(Some("hash-1"), H));
        assert!(!is_due(Some(H), H));
        assert!(!is_due(Some("disabled"), H));
    }
}
