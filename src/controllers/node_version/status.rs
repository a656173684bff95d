//! The status a pass reports, decided from its facts (pure): the object
//! lists, the counts, Constellation's Outdated condition and the rollout's
//! own conditions (Progressing, Degraded, RolloutSettings).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::api::conditions::set_condition;
use crate::api::update::rollout::SettingSource;
use crate::api::update::{
    DomainStatus, NodeCounts, NodeVersion, NodeVersionStatus, Rollout, RolloutHalt, StatusList, WaveStatus,
    condition, message, reason,
};
use crate::rollout::{self, DrainState, Facts, NodeFacts, Role, Step};

/// Object lists in the status hold at most this many entries: at thousands
/// of nodes whole lists would outgrow etcd's object size limit. The counts
/// (`nodes`, `upToDateNodes`, `outdatedNodes`, `replacing`) stay exact.
pub const STATUS_LIST_LIMIT: usize = 100;

/// What is wrong besides drains, for the Degraded condition.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Problems {
    /// Instances whose join deadline passed (their PendingNodes, leaving).
    pub join_timeouts: Vec<String>,
    /// Creates the cloud keeps failing: `<PendingNode>: <the cloud's error>`.
    pub create_failures: Vec<String>,
    /// Managed nodes that belong to no ScalingGroup (no provider ID, or a
    /// group no ScalingGroup names).
    pub invalid_nodes: Vec<String>,
    /// Control-plane retirements waiting for their etcd member's removal:
    /// why, naming the members.
    pub etcd_waits: Vec<String>,
    /// Why the control plane's upgrade (upgrade-agent) failed.
    pub control_plane_failed: Option<String>,
    /// The rollout halted: the evidence and the ways on.
    pub halted: Option<String>,
}

/// What a pass found and planned, as its status reports it.
pub(super) struct Pass<'a> {
    /// What the planner looked at.
    pub(super) facts: &'a Facts<'a>,
    /// Its node counts and budgets in use.
    pub(super) counts: &'a rollout::Counts,
    /// The steps it planned.
    pub(super) steps: &'a [Step],
    /// What is wrong besides drains.
    pub(super) problems: &'a Problems,
    /// The control plane's in-place upgrade.
    pub(super) control_plane: &'a super::control_plane::ControlPlane,
    /// The failed joins of the target, and whether the rollout halted.
    pub(super) halt: Option<&'a RolloutHalt>,
    /// The wave under way, when the rollout has waves.
    pub(super) wave: Option<&'a WaveStatus>,
    /// The failure domains, when the rollout goes one at a time; and
    /// whether the next replacement waits for nodes to be Ready.
    pub(super) domain: Option<(&'a DomainStatus, bool)>,
}

/// The status after `pass`, built on `base` (the status last written): its
/// lists, budget, counts and conditions at `now`; `defaults` are the
/// operator's rollout settings, which the RolloutSettings condition names.
pub(super) fn next_status(
    base: &NodeVersionStatus,
    nv: &NodeVersion,
    pass: &Pass<'_>,
    defaults: &Rollout,
    now: Timestamp,
) -> NodeVersionStatus {
    let (facts, counts) = (pass.facts, pass.counts);
    let mut status = base.clone();
    set_lists(&mut status, pass);
    status.halt = pass.halt.cloned();
    status.wave = pass.wave.cloned();
    status.domain = pass.domain.map(|(d, _)| d.clone());
    if let Some(active) = pass.control_plane.active {
        status.active_cluster_version_upgrade = active;
    }
    status.budget = u32::try_from(facts.max_surge.saturating_sub(counts.surge)).unwrap_or(0);
    status.set_counts(NodeCounts {
        nodes: counts.nodes as u32,
        up_to_date: counts.up_to_date as u32,
        outdated: counts.outdated as u32,
        replacing: (counts.surge + counts.unavailable) as u32,
    });
    let generation = nv.metadata.generation;
    status.conditions = outdated_condition(&status.conditions, counts, generation, now);
    status.rollout_conditions = rollout_conditions(
        std::mem::take(&mut status.rollout_conditions),
        pass,
        generation,
        now,
    );
    settings_condition(
        &mut status.rollout_conditions,
        &nv.spec.own_rollout(),
        defaults,
        generation,
        now,
    );
    status
}

/// The status's object lists: each node by where it stands in the rollout,
/// the invalid nodes and the creates not joined yet.
fn set_lists(status: &mut NodeVersionStatus, pass: &Pass<'_>) {
    let facts = pass.facts;
    let nodes = |f: fn(&NodeFacts) -> bool| {
        facts
            .nodes
            .iter()
            .filter(move |n| f(n))
            .map(|n| reference(&n.name))
    };
    use StatusList::*;
    status.set_list(
        Outdated,
        STATUS_LIST_LIMIT,
        nodes(|n| !n.up_to_date && n.donor_to.is_none()),
    );
    status.set_list(
        UpToDate,
        STATUS_LIST_LIMIT,
        nodes(|n| n.up_to_date && n.heir_of.is_none() && !n.joining),
    );
    status.set_list(
        Donors,
        STATUS_LIST_LIMIT,
        nodes(|n| !n.up_to_date && n.donor_to.is_some()),
    );
    status.set_list(Heirs, STATUS_LIST_LIMIT, nodes(|n| n.heir_of.is_some()));
    status.set_list(
        Mints,
        STATUS_LIST_LIMIT,
        nodes(|n| n.up_to_date && n.joining && n.heir_of.is_none()),
    );
    status.set_list(
        Invalid,
        STATUS_LIST_LIMIT,
        pass.problems.invalid_nodes.iter().map(|n| reference(n)),
    );
    status.set_list(
        Pending,
        STATUS_LIST_LIMIT,
        facts.joins.iter().map(|j| ObjectReference {
            kind: Some("PendingNode".into()),
            name: Some(j.pending.clone()),
            ..Default::default()
        }),
    );
}

/// A reference to the Node `name`, for the status's lists.
fn reference(name: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

/// `names` joined for a message: the first few, then how many more.
fn name_list(names: &[&str]) -> String {
    const SHOWN: usize = 5;
    let mut text = names.iter().take(SHOWN).copied().collect::<Vec<_>>().join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// Whether outdated worker nodes wait for the control plane (the planner's
/// own rule, [`rollout::workers_wait_for_control_plane`]).
fn waiting_for_control_plane(facts: &Facts<'_>) -> bool {
    let worker_outdated = facts.nodes.iter().any(|n| {
        !n.up_to_date
            && facts
                .groups
                .iter()
                .any(|g| g.id == n.group && g.role == Role::Worker)
    });
    worker_outdated && rollout::workers_wait_for_control_plane(facts)
}

/// Constellation's one condition, Outdated, with its reasons and messages
/// (its CLI shows the message as the cluster's status). Only Outdated is
/// kept: the CLI refuses a NodeVersion with any other (pure).
fn outdated_condition(
    existing: &[Condition],
    counts: &rollout::Counts,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut conditions: Vec<Condition> = existing
        .iter()
        .filter(|c| c.type_ == condition::OUTDATED)
        .take(1)
        .cloned()
        .collect();
    let outdated = counts.outdated > 0;
    let (reason, message) = match outdated {
        true => (
            reason::NODE_VERSIONS_OUT_OF_DATE,
            message::NODE_VERSIONS_OUT_OF_DATE,
        ),
        false => (
            reason::NODE_VERSIONS_UP_TO_DATE,
            message::NODE_VERSIONS_UP_TO_DATE,
        ),
    };
    set_condition(
        &mut conditions,
        condition::OUTDATED,
        outdated,
        reason,
        message,
        generation,
        now,
    );
    conditions
}

/// RolloutSettings: the settings in force and where each comes from (pure).
fn settings_condition(
    conditions: &mut Vec<Condition>,
    own: &Rollout,
    defaults: &Rollout,
    generation: Option<i64>,
    now: Timestamp,
) {
    let described = Rollout::describe(own, defaults);
    let all_own = described
        .iter()
        .all(|(_, _, from)| *from == SettingSource::NodeVersion);
    let from = |source: SettingSource| match source {
        SettingSource::NodeVersion => "spec",
        SettingSource::Operator => "operator",
        SettingSource::Builtin => "built in",
    };
    let message = described
        .iter()
        .map(|(name, value, source)| format!("{name} {value} ({})", from(*source)))
        .collect::<Vec<_>>()
        .join(", ");
    let reason = match all_own {
        true => reason::FROM_NODE_VERSION,
        false => reason::FROM_OPERATOR,
    };
    set_condition(
        conditions,
        condition::ROLLOUT_SETTINGS,
        true,
        reason,
        message,
        generation,
        now,
    );
}

/// Progressing and Degraded as the counts, the plan and the problems say (pure).
fn rollout_conditions(
    mut conditions: Vec<Condition>,
    pass: &Pass<'_>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let (facts, counts, steps, problems) = (pass.facts, pass.counts, pass.steps, pass.problems);
    // Nodes wait while the agent upgrades the control plane (a failure is
    // Degraded, and says so there).
    let control_plane_hold = pass.control_plane.hold && pass.control_plane.failed.is_none();
    set_condition(
        &mut conditions,
        condition::PROGRESSING,
        counts.outdated > 0 && !facts.halted,
        match control_plane_hold {
            true => reason::UPGRADING_CONTROL_PLANE,
            false
                if !facts.halted
                    && counts.outdated > 0
                    && pass.wave.is_some_and(|w| w.finished_at.is_some()) =>
            {
                reason::SOAKING_WAVE
            }
            false if !facts.halted && counts.outdated > 0 && pass.domain.is_some_and(|(_, hold)| hold) => {
                reason::WAITING_FOR_DOMAIN
            }
            false => progressing_reason(facts, counts, steps),
        },
        format!(
            "{} of {} nodes outdated, {} in flight{}",
            counts.outdated,
            counts.nodes,
            counts.surge + counts.unavailable,
            pass.domain.map(|(d, _)| domain_progress(d)).unwrap_or_default()
        ),
        generation,
        now,
    );
    let found = degradations(facts, problems);
    // The most pressing problem names the reason; the message lists them all.
    let (degraded_reason, message) = match found.first() {
        None => (reason::AS_EXPECTED, "no problem".to_string()),
        Some((first, _)) => (
            *first,
            found
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
    };
    set_condition(
        &mut conditions,
        condition::DEGRADED,
        !found.is_empty(),
        degraded_reason,
        message,
        generation,
        now,
    );
    conditions
}

/// Where the domains stand, for Progressing's message: "; zone=b now, 1
/// done, 1 waiting".
fn domain_progress(d: &DomainStatus) -> String {
    let current = match &d.current {
        Some(name) => format!("{}={name} now", d.key),
        None => format!("no {} now", d.key),
    };
    format!("; {current}, {} done, {} waiting", d.done.len(), d.waiting.len())
}

/// Why the rollout progresses, or does not: complete, waiting for a
/// group's image or for the control plane, or replacing nodes.
fn progressing_reason(facts: &Facts<'_>, counts: &rollout::Counts, steps: &[Step]) -> &'static str {
    let waiting_for_group = facts.groups.iter().any(|g| !g.image_ready);
    if counts.outdated == 0 {
        reason::ROLLOUT_COMPLETE
    } else if facts.halted {
        reason::ROLLOUT_HALTED
    } else if waiting_for_group && steps.is_empty() {
        reason::WAITING_FOR_SCALING_GROUP
    } else if waiting_for_control_plane(facts) {
        reason::WAITING_FOR_CONTROL_PLANE
    } else {
        reason::REPLACING_NODES
    }
}

/// What degrades the rollout, most pressing first: each problem's reason
/// and message.
fn degradations(facts: &Facts<'_>, problems: &Problems) -> Vec<(&'static str, String)> {
    let failed_drains: Vec<&str> = facts
        .nodes
        .iter()
        .filter(|n| n.drain == DrainState::Failed)
        .map(|n| n.name.as_str())
        .collect();
    fn as_strs(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let mut found: Vec<(&str, String)> = Vec::new();
    if let Some(why) = &problems.halted {
        found.push((reason::ROLLOUT_HALTED, why.clone()));
    }
    if let Some(why) = &problems.control_plane_failed {
        found.push((
            reason::CONTROL_PLANE_UPGRADE_FAILED,
            format!("upgrading the control plane (nodes wait for it): {why}"),
        ));
    }
    if !problems.etcd_waits.is_empty() {
        found.push((
            reason::ETCD_MEMBER_REMOVAL_BLOCKED,
            problems.etcd_waits.join("; "),
        ));
    }
    if !problems.create_failures.is_empty() {
        found.push((
            reason::CLOUD_ERROR,
            format!(
                "creating instances fails (retried): {}",
                problems.create_failures.join("; ")
            ),
        ));
    }
    if !failed_drains.is_empty() {
        found.push((
            reason::DRAIN_TIMEOUT,
            format!("drains failed: {}", name_list(&failed_drains)),
        ));
    }
    if !problems.join_timeouts.is_empty() {
        found.push((
            reason::JOIN_TIMEOUT,
            format!(
                "not joined within spec.rollout.joinTimeout (or their instance failed), deleted and replaced: {}",
                name_list(&as_strs(&problems.join_timeouts))
            ),
        ));
    }
    if !problems.invalid_nodes.is_empty() {
        found.push((
            reason::INVALID_NODES,
            format!(
                "{} node(s) belong to no ScalingGroup (no provider ID, or a group no ScalingGroup names), see status.invalid: {}",
                problems.invalid_nodes.len(),
                name_list(&as_strs(&problems.invalid_nodes))
            ),
        ));
    }
    found
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::rollout::GroupFacts;

    fn group(id: &str, role: Role) -> GroupFacts {
        GroupFacts {
            id: id.into(),
            role,
            image_ready: true,
        }
    }

    fn node(name: &str, group: &str, up_to_date: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            group: group.into(),
            up_to_date,
            ready: true,
            ..Default::default()
        }
    }

    fn reasons(conditions: &[Condition]) -> BTreeMap<String, (String, String)> {
        conditions
            .iter()
            .map(|c| (c.type_.clone(), (c.status.clone(), c.reason.clone())))
            .collect()
    }

    #[test]
    fn every_declared_reason_is_set_when_it_happens() {
        let groups = [group("cp", Role::ControlPlane), group("w", Role::Worker)];
        let cp_outdated = [node("c1", "cp", false), node("w1", "w", false)];
        let workers_outdated = [node("c1", "cp", true), node("w1", "w", false)];
        let all_current = [node("c1", "cp", true), node("w1", "w", true)];
        let drain_failed = [NodeFacts {
            drain: DrainState::Failed,
            ..node("w1", "w", false)
        }];
        let timeouts = Problems {
            join_timeouts: vec!["w-new".into()],
            ..Default::default()
        };
        let invalid = Problems {
            invalid_nodes: vec!["stray".into()],
            ..Default::default()
        };
        let etcd = Problems {
            etcd_waits: vec!["node c1 waits for the removal of its etcd member: ...".into()],
            join_timeouts: vec!["w-new".into()],
            ..Default::default()
        };
        let none = Problems::default();
        let cp_failed = Problems {
            control_plane_failed: Some("kubeadm upgrade apply failed".into()),
            ..Default::default()
        };
        let creates_fail = Problems {
            create_failures: vec!["join-1: the cloud failed the request with status 503".into()],
            join_timeouts: vec!["w-new".into()],
            ..Default::default()
        };
        // (what, nodes, control-plane first, problems, control plane upgrading, Progressing reason, Degraded reason)
        type Case<'a> = (
            &'a str,
            &'a [NodeFacts],
            bool,
            &'a Problems,
            bool,
            &'a str,
            &'a str,
        );
        let cases: [Case; 11] = [
            (
                "creates keep failing",
                &workers_outdated,
                true,
                &creates_fail,
                false,
                reason::REPLACING_NODES,
                reason::CLOUD_ERROR,
            ),
            (
                "complete",
                &all_current,
                true,
                &none,
                false,
                reason::ROLLOUT_COMPLETE,
                reason::AS_EXPECTED,
            ),
            (
                "workers wait",
                &cp_outdated,
                true,
                &none,
                false,
                reason::WAITING_FOR_CONTROL_PLANE,
                reason::AS_EXPECTED,
            ),
            (
                "both at once",
                &cp_outdated,
                false,
                &none,
                false,
                reason::REPLACING_NODES,
                reason::AS_EXPECTED,
            ),
            (
                "workers' turn",
                &workers_outdated,
                true,
                &none,
                false,
                reason::REPLACING_NODES,
                reason::AS_EXPECTED,
            ),
            (
                "drain failed",
                &drain_failed,
                true,
                &none,
                false,
                reason::REPLACING_NODES,
                reason::DRAIN_TIMEOUT,
            ),
            (
                "join timeout",
                &workers_outdated,
                true,
                &timeouts,
                false,
                reason::REPLACING_NODES,
                reason::JOIN_TIMEOUT,
            ),
            (
                "invalid nodes",
                &all_current,
                true,
                &invalid,
                false,
                reason::ROLLOUT_COMPLETE,
                reason::INVALID_NODES,
            ),
            // A control-plane node held by etcd comes first: it stops the rollout.
            (
                "etcd member removal waits",
                &cp_outdated,
                true,
                &etcd,
                false,
                reason::WAITING_FOR_CONTROL_PLANE,
                reason::ETCD_MEMBER_REMOVAL_BLOCKED,
            ),
            (
                "the control plane upgraded in place",
                &cp_outdated,
                true,
                &none,
                true,
                reason::UPGRADING_CONTROL_PLANE,
                reason::AS_EXPECTED,
            ),
            (
                "the control plane's upgrade failed",
                &cp_outdated,
                true,
                &cp_failed,
                false,
                reason::WAITING_FOR_CONTROL_PLANE,
                reason::CONTROL_PLANE_UPGRADE_FAILED,
            ),
        ];
        for (what, nodes, cp_first, problems, hold, progressing, degraded) in cases {
            let facts = Facts {
                groups: &groups,
                nodes,
                joins: &[],
                max_surge: 1,
                max_unavailable: 0,
                control_plane_first: cp_first,
                halted: false,
                wave_starts: None,
                one_domain_at_a_time: false,
                unready_pods: 0,
            };
            let counts = rollout::counts(&facts);
            let steps = rollout::plan(&facts);
            let control_plane = super::super::control_plane::ControlPlane {
                hold,
                ..Default::default()
            };
            let pass = Pass {
                facts: &facts,
                counts: &counts,
                steps: &steps,
                problems,
                control_plane: &control_plane,
                halt: None,
                wave: None,
                domain: None,
            };
            let got = rollout_conditions(Vec::new(), &pass, Some(3), Timestamp::now());
            let got = reasons(&got);
            assert_eq!(got[condition::PROGRESSING].1, progressing, "{what}");
            assert_eq!(got[condition::DEGRADED].1, degraded, "{what}");
            assert_eq!(
                got[condition::DEGRADED].0,
                if degraded == reason::AS_EXPECTED {
                    "False"
                } else {
                    "True"
                },
                "{what}"
            );
        }
    }

    /// What the constellation CLI's `NewNodeVersion` requires: exactly one
    /// condition, whose message it shows as the cluster's status. Older
    /// nodewarden statuses (three conditions there) are brought down to it.
    #[test]
    fn constellations_cli_reads_exactly_one_condition() {
        let older = [condition::OUTDATED, condition::PROGRESSING, condition::DEGRADED]
            .iter()
            .map(|t| Condition {
                type_: t.to_string(),
                status: "True".into(),
                reason: "Old".into(),
                message: "old".into(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            })
            .collect::<Vec<_>>();
        for (outdated, want_status, want_reason, want_message) in [
            (
                3,
                "True",
                reason::NODE_VERSIONS_OUT_OF_DATE,
                "Some node versions are out of date",
            ),
            (
                0,
                "False",
                reason::NODE_VERSIONS_UP_TO_DATE,
                "Node version of every node is up to date",
            ),
        ] {
            let counts = rollout::Counts {
                nodes: 5,
                outdated,
                ..Default::default()
            };
            for existing in [&older[..], &[]] {
                let got = outdated_condition(existing, &counts, Some(2), Timestamp::now());
                assert_eq!(got.len(), 1, "{got:?}");
                let c = &got[0];
                assert_eq!(
                    (
                        c.type_.as_str(),
                        c.status.as_str(),
                        c.reason.as_str(),
                        c.message.as_str()
                    ),
                    (condition::OUTDATED, want_status, want_reason, want_message)
                );
                assert_eq!(c.observed_generation, Some(2));
            }
        }
    }

    #[test]
    fn the_settings_in_force_are_named_with_their_source() {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        let operator = Rollout {
            max_surge: Some(IntOrString::Int(3)),
            ..Rollout::default()
        };
        let own = Rollout {
            max_unavailable: Some(IntOrString::String("10%".into())),
            ..Rollout::default()
        };
        let mut conditions = Vec::new();
        settings_condition(&mut conditions, &own, &operator, Some(4), Timestamp::now());
        let c = &conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.reason.as_str()),
            (condition::ROLLOUT_SETTINGS, reason::FROM_OPERATOR)
        );
        assert_eq!(
            c.message,
            "maxSurge 3 (operator), maxUnavailable 10% (spec), controlPlaneFirst true (built in), \
             joinTimeout 30m (built in), drainTimeout none (built in), haltAfterFailedJoins 3 (built in), \
             haltAfterUnreadyPods 3 (built in), podReadyTimeout 5m (built in), waves none (built in), soakTime none (built in), \
             topologyKey none (built in)"
        );
        let all = Rollout {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
            control_plane_first: Some(true),
            join_timeout: Some("5m".into()),
            drain_timeout: Some("1h".into()),
            halt_after_failed_joins: Some(2),
            halt_after_unready_pods: Some(1),
            pod_ready_timeout: Some("2m".into()),
            waves: Some(vec![IntOrString::Int(1)]),
            soak_time: Some("1m".into()),
            topology_key: Some("topology.kubernetes.io/zone".into()),
        };
        let mut conditions = Vec::new();
        settings_condition(&mut conditions, &all, &operator, Some(4), Timestamp::now());
        assert_eq!(conditions[0].reason, reason::FROM_NODE_VERSION);
    }

    #[test]
    fn long_name_lists_are_cut_in_messages() {
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert_eq!(name_list(&names[..2]), "n0, n1");
        assert_eq!(name_list(&names), "n0, n1, n2, n3, n4 and 3 more");
    }
}
