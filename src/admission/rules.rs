//! What the webhook allows, as pure functions of what it read (table-tested).
//! The messages of NodeMaintenance are the Node Maintenance Operator's own
//! words: scripts and tests written against it read them.

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

/// Where etcd's members run, which decides where the quorum rule applies
/// (the operator's `--etcd-on-control-plane`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EtcdPlacement {
    /// Where a static etcd pod runs (`auto`): kubeadm's and RKE2's
    /// `kube-system/etcd-<node>`, label `component=etcd`.
    #[default]
    Detect,
    /// On every control-plane node (`true`): etcd without a pod of its own,
    /// such as k3s's embedded one.
    ControlPlane,
    /// Off the nodes (`false`): external etcd, managed control planes.
    External,
}

impl FromStr for EtcdPlacement {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(EtcdPlacement::Detect),
            "true" => Ok(EtcdPlacement::ControlPlane),
            "false" => Ok(EtcdPlacement::External),
            other => Err(format!("{other:?}: expected auto, true or false")),
        }
    }
}

/// The namespace and label of static etcd pods (kubeadm's, RKE2's).
pub const ETCD_POD_NAMESPACE: &str = "kube-system";
/// The label selector of static etcd pods.
pub const ETCD_POD_SELECTOR: &str = "component=etcd";

/// A static etcd pod as the webhook reads it.
#[derive(Clone, Debug, PartialEq)]
pub struct EtcdPod {
    /// The pod's name (`etcd-<node>` as kubeadm names it).
    pub name: String,
    /// spec.nodeName.
    pub node: Option<String>,
}

/// The control-plane nodes that run an etcd member, each with how that is
/// known (the message of a refusal names it).
pub fn etcd_members(
    placement: EtcdPlacement,
    control_plane: &BTreeSet<String>,
    pods: &[EtcdPod],
) -> BTreeMap<String, String> {
    match placement {
        EtcdPlacement::External => BTreeMap::new(),
        EtcdPlacement::ControlPlane => control_plane
            .iter()
            .map(|n| (n.clone(), "--etcd-on-control-plane=true".to_string()))
            .collect(),
        EtcdPlacement::Detect => control_plane
            .iter()
            .filter_map(|n| {
                let on_node = |p: &&EtcdPod| match &p.node {
                    Some(bound) => bound == n,
                    None => p.name == format!("etcd-{n}"),
                };
                let pod = pods.iter().find(on_node)?;
                Some((n.clone(), format!("static pod {ETCD_POD_NAMESPACE}/{}", pod.name)))
            })
            .collect(),
    }
}

/// What the webhook knows of the etcd members on the cluster's nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ControlPlane {
    /// The nodes that run an etcd member, each with how that is known.
    pub members: BTreeMap<String, String>,
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
        let left = cp
            .available
            .iter()
            .filter(|n| n.as_str() != m.node_name && cp.members.contains_key(*n))
            .count();
        let needed = quorum(cp.members.len());
        if left < needed {
            return Err(format!(
                "can not put master/control-plane node into maintenance at this moment, disrupting node {} \
                 will violate etcd quorum: an etcd member runs on it ({why}), and {left} of the {} members \
                 would be left on Ready nodes out of maintenance; etcd needs more than half of its members \
                 ({needed}) for quorum",
                m.node_name,
                cp.members.len()
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
            members: nodes
                .iter()
                .map(|s| (s.to_string(), format!("static pod kube-system/etcd-{s}")))
                .collect(),
            available: available.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn etcd_members_are_where_etcd_runs() {
        let control_plane: BTreeSet<String> = ["c1", "c2", "c3"].iter().map(|s| s.to_string()).collect();
        let pod = |name: &str, node: Option<&str>| EtcdPod {
            name: name.into(),
            node: node.map(Into::into),
        };
        let pods = [
            pod("etcd-c1", Some("c1")),
            // Named for c2 but bound elsewhere: the binding counts.
            pod("etcd-c2", Some("w1")),
            // Not bound yet: the name tells.
            pod("etcd-c3", None),
        ];
        // (placement, pods, members with how they are known)
        type Case<'a> = (EtcdPlacement, &'a [EtcdPod], &'a [(&'a str, &'a str)]);
        let cases: [Case; 5] = [
            (
                EtcdPlacement::Detect,
                &pods,
                &[
                    ("c1", "static pod kube-system/etcd-c1"),
                    ("c3", "static pod kube-system/etcd-c3"),
                ],
            ),
            (EtcdPlacement::Detect, &[], &[]),
            (
                EtcdPlacement::ControlPlane,
                &[],
                &[
                    ("c1", "--etcd-on-control-plane=true"),
                    ("c2", "--etcd-on-control-plane=true"),
                    ("c3", "--etcd-on-control-plane=true"),
                ],
            ),
            (EtcdPlacement::External, &pods, &[]),
            (EtcdPlacement::External, &[], &[]),
        ];
        for (placement, pods, want) in cases {
            let want: BTreeMap<String, String> =
                want.iter().map(|(n, w)| (n.to_string(), w.to_string())).collect();
            assert_eq!(
                etcd_members(placement, &control_plane, pods),
                want,
                "{placement:?}"
            );
        }
        for (flag, want) in [
            ("auto", Ok(EtcdPlacement::Detect)),
            ("true", Ok(EtcdPlacement::ControlPlane)),
            ("false", Ok(EtcdPlacement::External)),
        ] {
            assert_eq!(flag.parse::<EtcdPlacement>(), want);
        }
        assert!("yes".parse::<EtcdPlacement>().is_err());
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
            node_exists: true,
            existing: &[],
            control_plane,
        };
        let cases: [(&str, MaintenanceCreate, Result<(), &str>); 13] = [
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
