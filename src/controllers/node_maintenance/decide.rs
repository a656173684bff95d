//! The reconcile's decisions, pure: the claims on a node and which comes
//! first, whether a maintenance may drain now, the status it should show,
//! the Event of a phase change, the finalizers it leaves, what its
//! quarantine is and whether it drains by kubectl's rules (a Plan's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Taint;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::super::finalizer;
use super::{EXCLUDE_LABEL, FINALIZER, NMO_FINALIZER, UNSCHEDULABLE_TAINT};
use crate::api::conditions::set_condition;
use crate::api::node_maintenance::{
    MaintenanceObject, MaintenancePhase, NodeMaintenanceStatus, parse_duration,
};
use crate::drain::kubectl::{self, KubectlDrain};
use crate::drain::node::Quarantine;
use crate::drain::{DrainOutcome, DrainProgress, DrainStatus};

/// One NodeMaintenance as the cross-group checks see it.
#[derive(Clone, Debug, PartialEq)]
pub struct Claim {
    /// `<group>/<name>`: the owner recorded on the Node.
    pub owner: String,
    /// When the claim was made (its creation time).
    pub created: Option<Timestamp>,
    /// The claiming object's UID: breaks ties between claims made in the
    /// same second (creation times have a resolution of one second).
    pub uid: Option<String>,
    /// The claiming object is being deleted.
    pub deleting: bool,
    /// Holds (or held) the node: entered maintenance and has not failed.
    pub active: bool,
}

impl Claim {
    /// The claim a NodeMaintenance makes on its node.
    pub fn of<M: MaintenanceObject>(m: &M) -> Claim {
        let status = m.maintenance_status();
        Claim {
            owner: owner_of(m),
            created: m.meta().creation_timestamp.as_ref().map(|t| t.0),
            uid: m.meta().uid.clone(),
            deleting: m.meta().deletion_timestamp.is_some(),
            active: status
                .is_some_and(|s| s.eviction_pods.is_some() && s.phase != Some(MaintenancePhase::Failed)),
        }
    }
}

/// The owner a NodeMaintenance is known by in claims, quarantines and drains.
pub fn owner_of<M: MaintenanceObject>(m: &M) -> String {
    format!("{}/{}", M::GROUP, m.name_any())
}

/// The NodeMaintenances of a node, across both groups.
pub type ClaimsOf = Arc<dyn Fn(&str) -> Vec<Claim> + Send + Sync>;
/// Every NodeMaintenance, across both groups.
pub type AllClaims = Arc<dyn Fn() -> Vec<Claim> + Send + Sync>;

/// The per-node lease as found.
#[derive(Clone, Debug, PartialEq)]
pub enum LeaseState {
    /// This operator holds it.
    Ours,
    /// Another tool holds it (its holder identity).
    HeldBy(String),
}

/// What a NodeMaintenance may do now.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Impossible as asked: phase Failed, nothing is done to the node.
    Fail {
        /// The condition's reason.
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
    /// Not yet (another tool holds the node's lease, or too many nodes are in
    /// maintenance): phase Running, retried.
    Wait {
        /// The condition's reason.
        reason: &'static str,
        /// The condition's message.
        message: String,
    },
    /// Quarantine the node and drain it.
    Drain,
}

/// Facts for [`decide`], gathered by the reconciler.
pub struct Facts<'a> {
    /// The maintenance deciding, as a claim on its node.
    pub me: &'a Claim,
    /// The maintenance deciding.
    pub owner: &'a str,
    /// The node it names.
    pub node_name: &'a str,
    /// Whether that node exists.
    pub node_exists: bool,
    /// The other NodeMaintenances of the same node.
    pub others: &'a [Claim],
    /// Its spec.drainTimeout as written.
    pub drain_timeout: Option<&'a str>,
    /// Some(false) when the concurrency limit keeps this one waiting.
    pub admitted: bool,
    /// The node's lease, once asked for (only when everything else allows the drain).
    pub lease: Option<LeaseState>,
    /// The message of an earlier DuplicateMaintenance failure: a duplicate
    /// stays failed (it never takes the node over, even once the first claim
    /// is gone; deleting that one ends the node's maintenance).
    pub failed_as_duplicate: Option<&'a str>,
    /// Who the node's record says quarantined it (an owner as claims name
    /// them), if anyone: the one fact no stale view of a status overrules.
    pub holder: Option<&'a str>,
}

/// The order in which claims on a node win: one that holds the node first
/// (whatever its age: it was there first, across restarts and leader
/// changes), then the earliest created, then the smaller UID. Never the name.
fn precedence(c: &Claim) -> (bool, Option<Timestamp>, Option<&str>, &str) {
    (!c.active, c.created, c.uid.as_deref(), c.owner.as_str())
}

/// The claim on the same node that comes before `me`, if any.
fn first_claim<'a>(me: &Claim, others: &'a [Claim]) -> Option<&'a Claim> {
    others
        .iter()
        .filter(|c| c.owner != me.owner && !c.deleting)
        .filter(|c| precedence(c) < precedence(me))
        .min_by(|a, b| precedence(a).cmp(&precedence(b)))
}

/// The reason of a failure because another maintenance holds the node.
pub const DUPLICATE_MAINTENANCE: &str = "DuplicateMaintenance";

/// Whether another claim keeps this one off its node. The node's holder
/// first: the maintenance it names keeps the node (its own status may not
/// have reached this view yet, and ranked by creation a later claim could
/// fail the holder, leaving the node held by a failed maintenance and the
/// later one retrying forever); a holder that is no maintenance of the node
/// (a rollout's or Plan's drain ending) is waited for. With no holder, the
/// first claim by precedence. A failed duplicate stays failed.
fn claim_refusal(f: &Facts) -> Option<Decision> {
    let duplicate_of = |owner: &str| Decision::Fail {
        reason: DUPLICATE_MAINTENANCE,
        message: format!(
            "spec.nodeName: node {:?} is already in maintenance by {owner}",
            f.node_name
        ),
    };
    match f.holder {
        Some(h) if h == f.owner => None,
        _ if f.failed_as_duplicate.is_some() => Some(Decision::Fail {
            reason: DUPLICATE_MAINTENANCE,
            message: f.failed_as_duplicate.unwrap_or_default().to_string(),
        }),
        Some(h) if f.others.iter().any(|c| c.owner == h && !c.deleting) => Some(duplicate_of(h)),
        Some(h) => Some(Decision::Wait {
            reason: "NodeHeld",
            message: format!("node {:?} is held by {h} until it ends", f.node_name),
        }),
        None => first_claim(f.me, f.others).map(|first| duplicate_of(&first.owner)),
    }
}

/// What a maintenance should do given the facts (pure; table-tested).
pub fn decide(f: &Facts) -> Decision {
    if let Some(t) = f.drain_timeout
        && parse_duration(t).is_none()
    {
        return Decision::Fail {
            reason: "InvalidSpec",
            message: format!("spec.drainTimeout: {t:?} is not a duration such as 90s, 30m or 1h30m"),
        };
    }
    if !f.node_exists {
        return Decision::Fail {
            reason: "NodeNotFound",
            message: format!("spec.nodeName: node {:?} not found", f.node_name),
        };
    }
    if let Some(refusal) = claim_refusal(f) {
        return refusal;
    }
    if let Some(LeaseState::HeldBy(holder)) = &f.lease {
        return Decision::Wait {
            reason: "LeaseHeld",
            message: format!(
                "the maintenance lease of node {:?} is held by {holder:?}",
                f.node_name
            ),
        };
    }
    if !f.admitted {
        return Decision::Wait {
            reason: "WaitingForSlot",
            message: "the limit of nodes in maintenance at once is reached".into(),
        };
    }
    Decision::Drain
}

/// The status a NodeMaintenance should show.
pub fn status_for(
    prev: Option<&NodeMaintenanceStatus>,
    decision: &Decision,
    drain: Option<&DrainStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> NodeMaintenanceStatus {
    let mut s = prev.cloned().unwrap_or_default();
    s.total_pods_legacy = None;
    let mut conditions = s.conditions.take().unwrap_or_default();
    let verdict = match (decision, drain) {
        (Decision::Fail { reason, message }, _) => {
            s.last_error = Some(message.clone());
            Verdict::new(MaintenancePhase::Failed, false, reason, message.clone())
        }
        (Decision::Wait { reason, message }, _) => {
            if *reason == "LeaseHeld" {
                s.error_on_lease_count = Some(s.error_on_lease_count.unwrap_or(0) + 1);
            }
            s.last_error = Some(message.clone());
            Verdict::new(MaintenancePhase::Running, false, reason, message.clone())
        }
        (Decision::Drain, Some(d)) if d.progress.counted => {
            record_progress(&mut s, &d.progress);
            drain_verdict(&mut s, d)
        }
        // Until the node's pods are counted no count is known: the status
        // keeps what it had rather than show zeros.
        (Decision::Drain, _) => Verdict::new(
            MaintenancePhase::Running,
            false,
            "Draining",
            "the drain begins (the node's pods are being counted)".to_string(),
        ),
    };
    s.phase = Some(verdict.phase);
    set_condition(
        &mut conditions,
        "Drained",
        verdict.drained,
        verdict.reason,
        verdict.message,
        generation,
        now,
    );
    s.conditions = Some(conditions);
    s
}

/// What a status says: its phase, and its Drained condition.
struct Verdict {
    phase: MaintenancePhase,
    drained: bool,
    reason: &'static str,
    message: String,
}

impl Verdict {
    fn new(phase: MaintenancePhase, drained: bool, reason: &'static str, message: String) -> Self {
        Verdict {
            phase,
            drained,
            reason,
            message,
        }
    }
}

/// The drain's counts, pending pods, blockers and last error, as the
/// status shows them.
fn record_progress(s: &mut NodeMaintenanceStatus, p: &DrainProgress) {
    s.total_pods = Some(p.total_pods);
    s.eviction_pods = Some(p.eviction_pods);
    s.drain_progress = Some(p.percent());
    s.pending_pods = Some(p.pending.iter().map(|r| r.name.clone()).collect());
    s.pending_pods_refs = Some(p.pending.clone());
    s.pending_pods_count = Some(p.pending.len() as i32);
    s.blocked_by = (!p.blocked.is_empty()).then(|| p.blocked.clone());
    s.last_error = p.last_error.clone();
}

/// What a running or ended drain says.
fn drain_verdict(s: &mut NodeMaintenanceStatus, d: &DrainStatus) -> Verdict {
    let p = &d.progress;
    match d.outcome {
        DrainOutcome::Succeeded => {
            // Refusals met on the way are history once the drain is done.
            s.last_error = None;
            s.blocked_by = None;
            Verdict::new(
                MaintenancePhase::Succeeded,
                true,
                "Drained",
                format!("{} pods evicted", p.eviction_pods),
            )
        }
        DrainOutcome::TimedOut => {
            let message = format!(
                "drain did not finish within spec.drainTimeout: {}",
                timeout_blockers(p)
            );
            s.last_error = Some(message.clone());
            Verdict::new(MaintenancePhase::Failed, false, "DrainTimeout", message)
        }
        DrainOutcome::Running if !p.blocked.is_empty() => Verdict::new(
            MaintenancePhase::Running,
            false,
            "BlockedByPDB",
            blocked_by_budgets(p),
        ),
        DrainOutcome::Running => Verdict::new(
            MaintenancePhase::Running,
            false,
            "Draining",
            format!("{} of {} pods to evict left", p.pending.len(), p.eviction_pods),
        ),
    }
}

/// What held a drain past its timeout: the pods a budget refused (with the
/// budget), else the pods still pending.
fn timeout_blockers(p: &DrainProgress) -> String {
    if p.blocked.is_empty() {
        p.pending
            .iter()
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect::<Vec<_>>()
            .join(", ")
    } else {
        p.blocked
            .iter()
            .map(|b| format!("{} blocked by {}", b.pod, b.pdb))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A running drain's evictions refused: how many, by which budgets.
fn blocked_by_budgets(p: &DrainProgress) -> String {
    let names = p.blocked.iter().map(|b| b.pdb.clone()).collect::<BTreeSet<_>>();
    format!(
        "eviction of {} pods refused by PodDisruptionBudget {}",
        p.blocked.len(),
        names.into_iter().collect::<Vec<_>>().join(", ")
    )
}

/// Two statuses equal but for the time of the update?
pub(super) fn same_status(a: &NodeMaintenanceStatus, b: &NodeMaintenanceStatus) -> bool {
    let strip = |s: &NodeMaintenanceStatus| NodeMaintenanceStatus {
        last_update: None,
        ..s.clone()
    };
    strip(a) == strip(b)
}

/// Whether the Node Maintenance Operator began this maintenance (its finalizer).
pub fn begun_by_nmo(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f == NMO_FINALIZER)
}

/// Whether a maintenance being deleted is nodewarden's to finish: it holds
/// nodewarden's finalizer, or the Node Maintenance Operator's (no one else
/// will remove that one).
pub fn to_finish(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f == FINALIZER) || begun_by_nmo(finalizers)
}

/// The finalizers left once nodewarden finished a maintenance: its own and
/// the Node Maintenance Operator's go, any other tool's stay.
pub fn finalizers_after_leaving(finalizers: &[String]) -> Vec<String> {
    finalizer::without(finalizers, &[FINALIZER, NMO_FINALIZER])
}

/// The event for a phase change.
pub(super) fn phase_event(
    prev: Option<MaintenancePhase>,
    next: MaintenancePhase,
) -> Option<(EventType, &'static str)> {
    match (prev, next) {
        (p, n) if p == Some(n) => None,
        (_, MaintenancePhase::Running) => Some((EventType::Normal, "BeginMaintenance")),
        (_, MaintenancePhase::Succeeded) => Some((EventType::Normal, "SucceedMaintenance")),
        (_, MaintenancePhase::Failed) => Some((EventType::Warning, "FailedMaintenance")),
    }
}

/// What maintenance does to a node: cordon, the group's drain taint and the
/// unschedulable taint, and the label that keeps remediation tools away. A
/// Plan's drain (kubectl's rules) only cordons, as `kubectl drain` does.
pub(super) fn quarantine_spec(drain_taint: &str, kubectl_rules: bool) -> Quarantine {
    let taint = |key: &str| Taint {
        key: key.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    if kubectl_rules {
        return Quarantine {
            cordon: true,
            taints: Vec::new(),
            labels: BTreeMap::new(),
        };
    }
    Quarantine {
        cordon: true,
        taints: vec![taint(drain_taint), taint(UNSCHEDULABLE_TAINT)],
        labels: BTreeMap::from([(EXCLUDE_LABEL.to_string(), "true".to_string())]),
    }
}

/// A Plan's NodeMaintenance drains by kubectl's rules with the Plan's
/// options (its annotation); any other keeps NodeMaintenance's rules. An
/// annotation that does not parse gets kubectl's strictest rules: it can
/// only come from a Plan, and the strict rules remove nothing a Plan would keep.
pub(super) fn plan_drain(annotations: &BTreeMap<String, String>) -> Option<KubectlDrain> {
    let raw = annotations.get(kubectl::ANNOTATION)?;
    Some(serde_json::from_str(raw).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::node_maintenance::{DrainBlocker, PodReference};

    fn ts(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("a time")
    }

    fn claim(owner: &str, created: i64) -> Claim {
        Claim {
            owner: owner.into(),
            created: Some(ts(created)),
            uid: Some(format!("uid-of-{owner}")),
            deleting: false,
            active: false,
        }
    }

    static ME: std::sync::LazyLock<Claim> = std::sync::LazyLock::new(|| Claim {
        uid: Some("uid-5".into()),
        ..claim("g/me", 100)
    });
    static ME_HOLDING: std::sync::LazyLock<Claim> = std::sync::LazyLock::new(|| Claim {
        active: true,
        ..ME.clone()
    });

    fn facts<'a>(others: &'a [Claim]) -> Facts<'a> {
        Facts {
            me: &ME,
            owner: "g/me",
            node_name: "n1",
            node_exists: true,
            others,
            drain_timeout: None,
            admitted: true,
            lease: Some(LeaseState::Ours),
            failed_as_duplicate: None,
            holder: None,
        }
    }

    #[test]
    fn decisions() {
        let earlier = [claim("g/first", 50)];
        let later = [claim("g/second", 150)];
        // Same second: the UID decides, never the name.
        let same_time_smaller_uid = [Claim {
            uid: Some("uid-1".into()),
            ..claim("g/z", 100)
        }];
        let same_time_larger_uid_smaller_name = [Claim {
            uid: Some("uid-9".into()),
            ..claim("g/a", 100)
        }];
        let earlier_but_holding_nothing = [claim("g/older", 50)];
        let later_but_holding = [Claim {
            active: true,
            ..claim("g/holder", 150)
        }];
        let deleting = [Claim {
            deleting: true,
            ..claim("g/first", 50)
        }];
        type Case<'a> = (&'a str, Box<dyn Fn(&mut Facts<'a>) + 'a>, &'a str);
        let cases: Vec<Case> = vec![
            ("ok", Box::new(|_| {}), "Drain"),
            (
                "no node",
                Box::new(|f| f.node_exists = false),
                "Fail:NodeNotFound",
            ),
            (
                "earlier claim",
                Box::new(|f| f.others = &earlier),
                "Fail:DuplicateMaintenance",
            ),
            ("later claim loses", Box::new(|f| f.others = &later), "Drain"),
            (
                "tie broken by uid",
                Box::new(|f| f.others = &same_time_smaller_uid),
                "Fail:DuplicateMaintenance",
            ),
            (
                "a smaller name does not win a tie",
                Box::new(|f| f.others = &same_time_larger_uid_smaller_name),
                "Drain",
            ),
            (
                "the holder keeps the node against an older claim",
                Box::new(|f| {
                    f.me = &ME_HOLDING;
                    f.others = &earlier_but_holding_nothing;
                }),
                "Drain",
            ),
            (
                "a holder wins over an earlier creation",
                Box::new(|f| f.others = &later_but_holding),
                "Fail:DuplicateMaintenance",
            ),
            (
                "a failed duplicate stays failed once the first is gone",
                Box::new(|f| {
                    f.failed_as_duplicate = Some("node \"n1\" is already in maintenance by g/first")
                }),
                "Fail:DuplicateMaintenance",
            ),
            (
                "deleting claim ignored",
                Box::new(|f| f.others = &deleting),
                "Drain",
            ),
            (
                "the node's holder keeps it though a claim ranks first in a stale view",
                Box::new(|f| {
                    f.holder = Some("g/me");
                    f.others = &same_time_smaller_uid;
                }),
                "Drain",
            ),
            (
                "the node's holder is never failed as a duplicate",
                Box::new(|f| {
                    f.holder = Some("g/me");
                    f.failed_as_duplicate = Some("node \"n1\" is already in maintenance by g/z");
                }),
                "Drain",
            ),
            (
                "a maintenance holding the node wins though it ranks later in this view",
                Box::new(|f| {
                    f.holder = Some("g/second");
                    f.others = &later;
                }),
                "Fail:DuplicateMaintenance",
            ),
            (
                "a holder that is no maintenance of the node is waited for",
                Box::new(|f| f.holder = Some("plan/ns/p")),
                "Wait:NodeHeld",
            ),
            (
                "a holder whose maintenance is being deleted is waited for",
                Box::new(|f| {
                    f.holder = Some("g/first");
                    f.others = &deleting;
                }),
                "Wait:NodeHeld",
            ),
            (
                "bad timeout",
                Box::new(|f| f.drain_timeout = Some("ten minutes")),
                "Fail:InvalidSpec",
            ),
            (
                "good timeout",
                Box::new(|f| f.drain_timeout = Some("10m")),
                "Drain",
            ),
            (
                "lease held",
                Box::new(|f| f.lease = Some(LeaseState::HeldBy("snr".into()))),
                "Wait:LeaseHeld",
            ),
            (
                "over limit",
                Box::new(|f| f.admitted = false),
                "Wait:WaitingForSlot",
            ),
            (
                "bad input wins over waiting",
                Box::new(|f| {
                    f.node_exists = false;
                    f.admitted = false;
                }),
                "Fail:NodeNotFound",
            ),
        ];
        for (name, tweak, want) in cases {
            let mut f = facts(&[]);
            tweak(&mut f);
            let got = match decide(&f) {
                Decision::Drain => "Drain".to_string(),
                Decision::Fail { reason, .. } => format!("Fail:{reason}"),
                Decision::Wait { reason, .. } => format!("Wait:{reason}"),
            };
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn failure_messages_name_the_field_and_the_first_claim() {
        let earlier = [claim("nodemaintenance.medik8s.io/first", 50)];
        let mut f = facts(&earlier);
        let Decision::Fail { message, .. } = decide(&f) else {
            panic!("expected a failure")
        };
        assert!(
            message.contains("spec.nodeName") && message.contains("nodemaintenance.medik8s.io/first"),
            "{message}"
        );
        f.others = &[];
        f.node_exists = false;
        let Decision::Fail { message, .. } = decide(&f) else {
            panic!("expected a failure")
        };
        assert!(
            message.contains("spec.nodeName") && message.contains("\"n1\""),
            "{message}"
        );
    }

    fn drain(outcome: DrainOutcome, eviction: i32, pending: usize, blocked: bool) -> DrainStatus {
        let pending: Vec<PodReference> = (0..pending)
            .map(|i| PodReference {
                namespace: "ns".into(),
                name: format!("p{i}"),
            })
            .collect();
        DrainStatus {
            owner: "g/me".into(),
            outcome,
            progress: DrainProgress {
                counted: true,
                total_pods: eviction + 1,
                eviction_pods: eviction,
                blocked: if blocked {
                    vec![DrainBlocker {
                        pod: "ns/p0".into(),
                        pdb: "ns/web-pdb".into(),
                    }]
                } else {
                    vec![]
                },
                pending,
                last_error: None,
                forced: 0,
            },
            started: tokio::time::Instant::now(),
            pod_events: Vec::new(),
        }
    }

    #[test]
    fn statuses() {
        let now = ts(1000);
        // (decision, drain, phase, progress, condition reason, Drained)
        let cases = [
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Running, 4, 3, false)),
                MaintenancePhase::Running,
                Some(25),
                "Draining",
                false,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Running, 4, 1, true)),
                MaintenancePhase::Running,
                Some(75),
                "BlockedByPDB",
                false,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Succeeded, 4, 0, false)),
                MaintenancePhase::Succeeded,
                Some(100),
                "Drained",
                true,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::Succeeded, 0, 0, false)),
                MaintenancePhase::Succeeded,
                Some(100),
                "Drained",
                true,
            ),
            (
                Decision::Drain,
                Some(drain(DrainOutcome::TimedOut, 4, 1, true)),
                MaintenancePhase::Failed,
                Some(75),
                "DrainTimeout",
                false,
            ),
            (
                Decision::Fail {
                    reason: "NodeNotFound",
                    message: "x".into(),
                },
                None,
                MaintenancePhase::Failed,
                None,
                "NodeNotFound",
                false,
            ),
            (
                Decision::Wait {
                    reason: "WaitingForSlot",
                    message: "x".into(),
                },
                None,
                MaintenancePhase::Running,
                None,
                "WaitingForSlot",
                false,
            ),
        ];
        for (decision, d, phase, progress, reason, drained) in cases {
            let s = status_for(None, &decision, d.as_ref(), Some(3), now);
            assert_eq!(s.phase, Some(phase), "{reason}");
            assert_eq!(s.drain_progress, progress, "{reason}");
            let c = &s.conditions.as_ref().expect("conditions")[0];
            assert_eq!((c.reason.as_str(), c.status == "True"), (reason, drained));
            assert_eq!(c.observed_generation, Some(3));
        }
    }

    #[test]
    fn a_drain_whose_pods_are_not_counted_yet_says_it_begins() {
        let mut begun = drain(DrainOutcome::Running, 0, 0, false);
        begun.progress = DrainProgress::default();
        let s = status_for(None, &Decision::Drain, Some(&begun), Some(1), ts(1));
        assert_eq!(s.phase, Some(MaintenancePhase::Running));
        assert_eq!(
            (s.total_pods, s.eviction_pods, s.drain_progress),
            (None, None, None)
        );
        let c = &s.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            ("Draining", "the drain begins (the node's pods are being counted)")
        );
        // Once counted, the count.
        let counted = drain(DrainOutcome::Running, 5, 5, false);
        let s = status_for(Some(&s), &Decision::Drain, Some(&counted), Some(1), ts(2));
        let c = &s.conditions.as_ref().expect("conditions")[0];
        assert_eq!(c.message, "5 of 5 pods to evict left");
    }

    #[test]
    fn blocked_status_names_the_budget_and_timeout_names_the_blockers() {
        let blocked = drain(DrainOutcome::Running, 2, 1, true);
        let s = status_for(None, &Decision::Drain, Some(&blocked), Some(1), ts(1));
        let message = &s.conditions.as_ref().expect("conditions")[0].message;
        assert!(message.contains("ns/web-pdb"), "{message}");
        assert_eq!(
            s.blocked_by.as_ref().map(|b| b[0].pdb.as_str()),
            Some("ns/web-pdb")
        );
        assert_eq!(s.pending_pods.as_deref(), Some(&["p0".to_string()][..]));
        let timed_out = drain(DrainOutcome::TimedOut, 2, 1, true);
        let s = status_for(None, &Decision::Drain, Some(&timed_out), Some(1), ts(1));
        let err = s.last_error.expect("an error");
        assert!(
            err.contains("spec.drainTimeout") && err.contains("ns/p0 blocked by ns/web-pdb"),
            "{err}"
        );
    }

    #[test]
    fn finalizers_nodewarden_finishes_and_removes() {
        let f = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // (finalizers, begun by NMO, nodewarden finishes it, left after)
        let cases: [(&[&str], bool, bool, &[&str]); 5] = [
            (&[FINALIZER], false, true, &[]),
            (&[NMO_FINALIZER], true, true, &[]),
            (&[NMO_FINALIZER, FINALIZER], true, true, &[]),
            (&["other.io/keep", NMO_FINALIZER], true, true, &["other.io/keep"]),
            (&["other.io/keep"], false, false, &["other.io/keep"]),
        ];
        for (have, by_nmo, finish, left) in cases {
            let have = f(have);
            assert_eq!(begun_by_nmo(&have), by_nmo, "{have:?}");
            assert_eq!(to_finish(&have), finish, "{have:?}");
            assert_eq!(finalizers_after_leaving(&have), f(left), "{have:?}");
        }
    }

    #[test]
    fn phase_events() {
        use MaintenancePhase::*;
        let reason = |p, n| phase_event(p, n).map(|(_, r)| r);
        assert_eq!(reason(None, Running), Some("BeginMaintenance"));
        assert_eq!(reason(Some(Running), Running), None);
        assert_eq!(reason(Some(Running), Succeeded), Some("SucceedMaintenance"));
        assert_eq!(reason(Some(Running), Failed), Some("FailedMaintenance"));
        assert_eq!(reason(None, Failed), Some("FailedMaintenance"));
    }
}
