//! What the webhook allows, as pure functions of what it read (table-tested).
//! The messages of NodeMaintenance are the Node Maintenance Operator's own
//! words: scripts and tests written against it read them.

use std::collections::BTreeSet;

/// What the webhook knows of the cluster's control plane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ControlPlane {
    /// Every control-plane node.
    pub nodes: BTreeSet<String>,
    /// Those Ready and not in maintenance (no NodeMaintenance names them
    /// that has not failed): the members etcd can count on.
    pub available: BTreeSet<String>,
}

/// What the webhook read for a NodeMaintenance being created.
#[derive(Clone, Debug, PartialEq)]
pub struct MaintenanceCreate<'a> {
    /// spec.nodeName.
    pub node_name: &'a str,
    /// The node exists.
    pub node_exists: bool,
    /// Other NodeMaintenances (either group, not being deleted) naming it.
    pub existing: &'a [String],
    /// The control plane, when the node is part of it.
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
    if let Some(cp) = m.control_plane {
        let left = cp.available.iter().filter(|n| n.as_str() != m.node_name).count();
        let needed = quorum(cp.nodes.len());
        if left < needed {
            return Err(format!(
                "invalid nodeName, can not put control-plane node {} into maintenance: it would leave {left} of \
                 {} control-plane nodes Ready and out of maintenance, and etcd needs more than half of its \
                 members ({needed}) for quorum",
                m.node_name,
                cp.nodes.len()
            ));
        }
    }
    Ok(())
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
            nodes: nodes.iter().map(|s| s.to_string()).collect(),
            available: available.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn maintenance_creation() {
        let three_up = cp(&["c1", "c2", "c3"], &["c1", "c2", "c3"]);
        let one_down = cp(&["c1", "c2", "c3"], &["c1", "c2"]);
        let five_two_down = cp(&["c1", "c2", "c3", "c4", "c5"], &["c1", "c2", "c3"]);
        let single = cp(&["c1"], &["c1"]);
        let other = ["nm-1".to_string()];
        let cases: [(&str, MaintenanceCreate, Result<(), &str>); 8] = [
            (
                "missing node",
                MaintenanceCreate {
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
                    node_name: "c1",
                    node_exists: true,
                    existing: &[],
                    control_plane: Some(&single),
                },
                Err("quorum"),
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
