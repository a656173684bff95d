//! What the webhook allows, as pure functions of what it read (table-tested).
//! The messages of NodeMaintenance are the Node Maintenance Operator's own
//! words: scripts and tests written against it read them.

use std::collections::{BTreeMap, BTreeSet};

pub use crate::etcd::placement::{
    ETCD_POD_NAMESPACE, ETCD_POD_SELECTOR, EtcdPlacement, EtcdPod, etcd_members,
};

/// What the webhook knows of the etcd members on the cluster's nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ControlPlane {
    /// The nodes that run an etcd member, each with how that is known.
    pub members: BTreeMap<String, String>,
    /// Those Ready and not in maintenance (no NodeMaintenance names them
    /// that has not failed): the members etcd can count on.
    pub available: BTreeSet<String>,
}

/// Who asks for a NodeMaintenance, as its `nodewarden.dev/drain-for` label
/// says; each is held to the quorum rule that fits what its drain does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Requester {
    /// A person or another tool: NMO's rule (refused while too few members
    /// would be left on Ready nodes out of maintenance).
    #[default]
    Other,
    /// nodewarden's rollout draining a replaced node. A drain leaves the
    /// static etcd pod running; the member goes only through the rollout's
    /// etcd rules (the heir's member joined, the rest healthy, quorum kept
    /// after), so no quorum rule applies here: otherwise a one-member
    /// control plane could never be replaced.
    Rollout,
    /// nodewarden's Plan draining a node to upgrade it (its Job may restart
    /// the member). Refused only while waiting can help: another member is
    /// unavailable now and would count once back. Where every other member
    /// is available and still too few (a one- or two-member etcd), it
    /// proceeds, as upstream's `kubectl drain` does.
    Plan,
}

impl Requester {
    /// The requester a `nodewarden.dev/drain-for` label value names.
    pub fn from_label(value: &str) -> Requester {
        match value {
            "rollout" => Requester::Rollout,
            "plan" => Requester::Plan,
            _ => Requester::Other,
        }
    }
}

/// What the webhook read for a NodeMaintenance being created.
#[derive(Clone, Debug, PartialEq)]
pub struct MaintenanceCreate<'a> {
    /// spec.nodeName.
    pub node_name: &'a str,
    /// Who asks (its label).
    pub requester: Requester,
    /// The node exists.
    pub node_exists: bool,
    /// Other NodeMaintenances (either group, not being deleted) naming it.
    pub existing: &'a [String],
    /// The etcd members, when the node is part of the control plane.
    pub control_plane: Option<&'a ControlPlane>,
}

/// The members etcd needs for quorum among `members`: more than half.
pub fn quorum(members: usize) -> usize {
    members / 2 + 1
}

/// Allowed, or the reason it is denied.
pub fn maintenance_create(m: &MaintenanceCreate) -> Result<(), String> {
    if !m.node_exists {
        return Err(format!(
            "invalid nodeName, no node with name {} found",
            m.node_name
        ));
    }
    if !m.existing.is_empty() {
        return Err(format!(
            "invalid nodeName, a NodeMaintenance for node {} already exists",
            m.node_name
        ));
    }
    // Only a member on the node can cost etcd its quorum: a control-plane
    // node of an external etcd may go.
    if let Some(cp) = m.control_plane
        && let Some(why) = cp.members.get(m.node_name)
    {
        return quorum_rule(m.node_name, m.requester, cp, why);
    }
    Ok(())
}

/// The quorum rule for member node `node` (see [`Requester`]).
fn quorum_rule(node: &str, requester: Requester, cp: &ControlPlane, why: &str) -> Result<(), String> {
    let others = cp.members.keys().filter(|n| n.as_str() != node);
    let (mut left, mut away) = (0, 0);
    for n in others {
        if cp.available.contains(n) {
            left += 1;
        } else {
            away += 1;
        }
    }
    let needed = quorum(cp.members.len());
    let refused = match requester {
        Requester::Other => left < needed,
        Requester::Rollout => false,
        Requester::Plan => left < needed && away > 0,
    };
    if !refused {
        return Ok(());
    }
    let wait = match requester {
        Requester::Plan => "; the Plan drains it once the other members are back",
        _ => "",
    };
    Err(format!(
        "can not put master/control-plane node into maintenance at this moment, disrupting node {node} \
         will violate etcd quorum: an etcd member runs on it ({why}), and {left} of the {} members \
         would be left on Ready nodes out of maintenance; etcd needs more than half of its members \
         ({needed}) for quorum{wait}",
        cp.members.len()
    ))
}

/// Allowed, or why an update of a NodeMaintenance is denied.
pub fn maintenance_update(old_node: &str, new_node: &str) -> Result<(), String> {
    if old_node != new_node {
        return Err("updating spec.NodeName isn't allowed".into());
    }
    Ok(())
}

/// Allowed, or why a ScalingGroup naming `node_version` is denied.
pub fn scaling_group(node_version: &str, exists: bool) -> Result<(), String> {
    if exists {
        return Ok(());
    }
    Err(format!(
        "spec.nodeImage: NodeVersion {node_version:?} does not exist (create it first, or name an existing one)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(nodes: &[&str], available: &[&str]) -> ControlPlane {
        ControlPlane {
            members: nodes
                .iter()
                .map(|s| (s.to_string(), format!("static pod kube-system/etcd-{s}")))
                .collect(),
            available: available.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn maintenance_creation() {
        let three_up = cp(&["c1", "c2", "c3"], &["c1", "c2", "c3"]);
        let one_down = cp(&["c1", "c2", "c3"], &["c1", "c2"]);
        let five_two_down = cp(&["c1", "c2", "c3", "c4", "c5"], &["c1", "c2", "c3"]);
        let single = cp(&["c1"], &["c1"]);
        let external = ControlPlane::default();
        // c1 and c2 run etcd, c3 does not: c3 may always go, and one of the
        // two members while the other is available.
        let two_of_three = ControlPlane {
            available: ["c1", "c2", "c3"].iter().map(|s| s.to_string()).collect(),
            ..cp(&["c1", "c2"], &[])
        };
        let two_of_three_one_down = ControlPlane {
            available: ["c1", "c3"].iter().map(|s| s.to_string()).collect(),
            ..two_of_three.clone()
        };
        let other = ["nm-1".to_string()];
        let create = |node_name, control_plane| MaintenanceCreate {
            node_name,
            requester: Requester::Other,
            node_exists: true,
            existing: &[],
            control_plane,
        };
        let cases: [(&str, MaintenanceCreate, Result<(), &str>); 13] = [
            (
                "missing node",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "x",
                    node_exists: false,
                    existing: &[],
                    control_plane: None,
                },
                Err("invalid nodeName, no node with name x found"),
            ),
            (
                "second maintenance",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "w1",
                    node_exists: true,
                    existing: &other,
                    control_plane: None,
                },
                Err("invalid nodeName, a NodeMaintenance for node w1 already exists"),
            ),
            (
                "worker",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "w1",
                    node_exists: true,
                    existing: &[],
                    control_plane: None,
                },
                Ok(()),
            ),
            (
                "one of three",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "c1",
                    node_exists: true,
                    existing: &[],
                    control_plane: Some(&three_up),
                },
                Ok(()),
            ),
            (
                "second of three",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "c1",
                    node_exists: true,
                    existing: &[],
                    control_plane: Some(&one_down),
                },
                Err("quorum"),
            ),
            (
                "an unavailable member may go",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "c3",
                    node_exists: true,
                    existing: &[],
                    control_plane: Some(&one_down),
                },
                Ok(()),
            ),
            (
                "third of five",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "c1",
                    node_exists: true,
                    existing: &[],
                    control_plane: Some(&five_two_down),
                },
                Err("quorum"),
            ),
            (
                "a single control-plane node",
                MaintenanceCreate {
                    requester: Requester::Other,
                    node_name: "c1",
                    node_exists: true,
                    existing: &[],
                    control_plane: Some(&single),
                },
                Err("an etcd member runs on it (static pod kube-system/etcd-c1), and 0 of the 1 members"),
            ),
            (
                "a single control-plane node of an external etcd",
                create("c1", Some(&external)),
                Ok(()),
            ),
            (
                "a control-plane node without a member",
                create("c3", Some(&two_of_three_one_down)),
                Ok(()),
            ),
            (
                "one of two members, the other available",
                create("c1", Some(&two_of_three)),
                Err("1 of the 2 members"),
            ),
            (
                "a node without a member is not counted as available",
                create("c1", Some(&two_of_three_one_down)),
                Err("0 of the 2 members"),
            ),
            (
                "the reason is upstream's, with ours after",
                create("c1", Some(&single)),
                Err(
                    "can not put master/control-plane node into maintenance at this moment, disrupting node c1 \
                     will violate etcd quorum: ",
                ),
            ),
        ];
        for (what, m, want) in cases {
            let got = maintenance_create(&m);
            match (got, want) {
                (Ok(()), Ok(())) => {}
                (Err(msg), Err(want)) => assert!(msg.contains(want), "{what}: {msg}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    /// nodewarden's own drains: a rollout's never waits for quorum (the
    /// etcd rules guard the member), a Plan's only while waiting can help.
    #[test]
    fn nodewardens_own_drains_are_held_to_the_rule_that_fits_them() {
        let single = cp(&["c1"], &["c1"]);
        let pair = cp(&["c1", "c2"], &["c1", "c2"]);
        let three_up = cp(&["c1", "c2", "c3"], &["c1", "c2", "c3"]);
        let one_down = cp(&["c1", "c2", "c3"], &["c1", "c2"]);
        let pair_one_down = cp(&["c1", "c2"], &["c1"]);
        use Requester::*;
        // (what, requester, control plane, node, admitted)
        let cases: [(&str, Requester, &ControlPlane, &str, bool); 14] = [
            ("a person: the only member", Other, &single, "c1", false),
            (
                "a rollout: the only member (its heir's joins)",
                Rollout,
                &single,
                "c1",
                true,
            ),
            (
                "a Plan: the only member, nothing to wait for",
                Plan,
                &single,
                "c1",
                true,
            ),
            ("a person: one of two", Other, &pair, "c1", false),
            ("a rollout: one of two", Rollout, &pair, "c1", true),
            ("a Plan: one of two, the other available", Plan, &pair, "c1", true),
            (
                "a Plan: one of two, the other away: wait",
                Plan,
                &pair_one_down,
                "c1",
                false,
            ),
            ("a person: one of three", Other, &three_up, "c1", true),
            ("a Plan: one of three", Plan, &three_up, "c1", true),
            ("a person: a second of three", Other, &one_down, "c1", false),
            (
                "a Plan: a second of three waits for the first",
                Plan,
                &one_down,
                "c1",
                false,
            ),
            ("a rollout: a second of three", Rollout, &one_down, "c1", true),
            ("a Plan: the member that is away", Plan, &one_down, "c3", true),
            ("a person: the member that is away", Other, &one_down, "c3", true),
        ];
        for (what, requester, control_plane, node_name, admitted) in cases {
            let got = maintenance_create(&MaintenanceCreate {
                node_name,
                requester,
                node_exists: true,
                existing: &[],
                control_plane: Some(control_plane),
            });
            assert_eq!(got.is_ok(), admitted, "{what}: {got:?}");
        }
        let held = maintenance_create(&MaintenanceCreate {
            node_name: "c1",
            requester: Plan,
            node_exists: true,
            existing: &[],
            control_plane: Some(&one_down),
        });
        assert!(
            held.is_err_and(|m| m.ends_with("the Plan drains it once the other members are back")),
            "a Plan's refusal says it waits"
        );
        // The one-maintenance-per-node rule holds for every requester.
        let other = ["nm-1".to_string()];
        for requester in [Other, Rollout, Plan] {
            let got = maintenance_create(&MaintenanceCreate {
                node_name: "w1",
                requester,
                node_exists: true,
                existing: &other,
                control_plane: None,
            });
            assert!(got.is_err(), "{requester:?}");
        }
        for (label, want) in [("rollout", Rollout), ("plan", Plan), ("", Other), ("x", Other)] {
            assert_eq!(Requester::from_label(label), want);
        }
    }

    #[test]
    fn updates_and_scaling_groups() {
        assert_eq!(maintenance_update("a", "a"), Ok(()));
        assert_eq!(
            maintenance_update("a", "b"),
            Err("updating spec.NodeName isn't allowed".into())
        );
        assert_eq!(scaling_group("v", true), Ok(()));
        assert!(
            scaling_group("v", false).is_err_and(|m| m.contains("spec.nodeImage") && m.contains("\"v\""))
        );
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(4), 3);
        assert_eq!(quorum(5), 3);
    }
}
