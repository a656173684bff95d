//! The rolling replacement of outdated nodes — decisions only (pure, table
//! tested). The NodeVersion controller gathers [`Facts`] from its stores and
//! the cloud, calls [`plan`], and carries out the [`Step`]s.
//!
//! A node is *outdated* when its version (image and Kubernetes components)
//! differs from the rollout's target. Each outdated node (the *donor*) is
//! replaced by a fresh node (the *heir*) of the same scaling group:
//!
//! 1. create an instance (a PendingNode with goal Join tracks it);
//! 2. once it joined and is Ready (a *mint*), pair it with an outdated node of
//!    its group that has no heir, and copy the donor's labels to it;
//! 3. drain the donor (a NodeMaintenance);
//! 4. when the drain succeeded, delete the donor's Node and its instance.
//!
//! Budgets (invariant 1): `max_surge` bounds the extra nodes in flight
//! (instances joining, mints, heirs whose donor still exists); `max_unavailable`
//! bounds outdated nodes drained before their heir is Ready. A donor is only
//! deleted once its heir is Ready and its drain succeeded (invariant 2).
//! Control-plane groups go first: no worker instance is created while a
//! control-plane node is outdated (a kubelet must never be newer than the API
//! server).

use std::collections::{BTreeMap, BTreeSet};

/// A scaling group's role; control-plane groups sort (and go) first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Control-plane nodes.
    ControlPlane,
    /// Worker nodes.
    Worker,
}

/// A scaling group of this rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupFacts {
    /// The group's id at the cloud (`spec.groupId`).
    pub id: String,
    /// Control plane or workers.
    pub role: Role,
    /// The cloud creates new instances with the target image already.
    pub image_ready: bool,
}

/// A Node of this rollout's groups.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// The id of the node's scaling group.
    pub group: String,
    /// On the rollout's target version (image and Kubernetes components).
    pub up_to_date: bool,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// The node this one replaces (heir annotation).
    pub heir_of: Option<String>,
    /// The node replacing this one (donor annotation).
    pub donor_to: Option<String>,
    /// Drain requested (a NodeMaintenance exists) and how it stands.
    pub drain: DrainState,
    /// Joined through a PendingNode of this rollout that is still tracked.
    pub joining: bool,
    /// A surplus node being removed (a mint left without a partner).
    pub obsolete: bool,
}

/// Where the rollout's drain of a node stands (its NodeMaintenance's phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DrainState {
    /// No drain requested (no NodeMaintenance).
    #[default]
    None,
    /// Requested and not finished.
    Running,
    /// Drained: the node may be retired.
    Succeeded,
    /// The drain failed; the node is left alone (Degraded says so).
    Failed,
}

/// An instance created but not yet a Node (goal Join).
#[derive(Clone, Debug, PartialEq)]
pub struct JoinFacts {
    /// The PendingNode's name.
    pub pending: String,
    /// The id of the scaling group the instance was created in.
    pub group: String,
}

/// Everything [`plan`] and [`counts`] look at, gathered by the reconciler.
pub struct Facts<'a> {
    /// The rollout's scaling groups.
    pub groups: &'a [GroupFacts],
    /// The Nodes of those groups.
    pub nodes: &'a [NodeFacts],
    /// Instances created that are not Nodes yet.
    pub joins: &'a [JoinFacts],
    /// Extra nodes allowed in flight (resolved from `spec.rollout.maxSurge`).
    pub max_surge: usize,
    /// Outdated nodes allowed to drain before their heir is Ready (resolved
    /// from `spec.rollout.maxUnavailable`).
    pub max_unavailable: usize,
    /// No worker instance is created while a control-plane node is outdated.
    pub control_plane_first: bool,
}

/// What the controller should do now; every step is idempotent.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// Annotate both and copy the donor's labels to the heir.
    Pair {
        /// The outdated node being replaced.
        donor: String,
        /// The new node replacing it.
        heir: String,
    },
    /// Request the drain of a node (NodeMaintenance).
    Drain {
        /// The node to drain.
        node: String,
    },
    /// Delete the Node and its instance (the drain succeeded, the heir is Ready).
    Retire {
        /// The node to delete.
        node: String,
    },
    /// Create instances in a group.
    Create {
        /// The scaling group's id.
        group: String,
        /// How many instances.
        count: usize,
    },
    /// A Ready new node no outdated node needs any more (the target moved
    /// on, or its partner went away): mark it surplus, to drain and remove.
    MarkObsolete {
        /// The surplus node.
        node: String,
    },
}

/// A summary for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Nodes of the rollout's groups.
    pub nodes: usize,
    /// Of those, nodes on the target version.
    pub up_to_date: usize,
    /// Of those, nodes not on it.
    pub outdated: usize,
    /// Extra nodes in flight (joining, mints, heirs with donors).
    pub surge: usize,
    /// Outdated nodes draining without a Ready heir.
    pub unavailable: usize,
}

/// The node counts and the budgets in use, as [`plan`] sees them.
pub fn counts(f: &Facts) -> Counts {
    let by_name: BTreeMap<&str, &NodeFacts> = f.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let heir_ready = |n: &NodeFacts| {
        n.donor_to
            .as_deref()
            .and_then(|h| by_name.get(h))
            .is_some_and(|h| h.ready)
    };
    // A joined node still tracked by its PendingNode counts as surge even
    // before its image is known (the annotation may lag the join).
    let mints = f
        .nodes
        .iter()
        .filter(|n| n.joining && n.heir_of.is_none())
        .count();
    let heirs_with_donor = f
        .nodes
        .iter()
        .filter(|n| n.heir_of.as_deref().is_some_and(|d| by_name.contains_key(d)))
        .count();
    Counts {
        nodes: f.nodes.len(),
        up_to_date: f.nodes.iter().filter(|n| n.up_to_date).count(),
        outdated: f.nodes.iter().filter(|n| !n.up_to_date).count(),
        surge: f.joins.len() + mints + heirs_with_donor + f.nodes.iter().filter(|n| n.obsolete).count(),
        unavailable: f
            .nodes
            .iter()
            .filter(|n| !n.up_to_date && n.drain != DrainState::None && !heir_ready(n))
            .count(),
    }
}

/// Whether worker groups must wait: the control plane is replaced first and
/// one of its nodes is still outdated.
pub fn workers_wait_for_control_plane(f: &Facts) -> bool {
    let role_of = |group: &str| f.groups.iter().find(|g| g.id == group).map(|g| g.role);
    f.control_plane_first
        && f.nodes
            .iter()
            .any(|n| !n.up_to_date && role_of(&n.group) == Some(Role::ControlPlane))
}

/// The steps to take now, within the budgets: drain and retire donors whose
/// heir is Ready (and surplus nodes), pair Ready mints, drain early within
/// maxUnavailable, create instances within maxSurge.
pub fn plan(f: &Facts) -> Vec<Step> {
    let mut steps = Vec::new();
    let by_name: BTreeMap<&str, &NodeFacts> = f.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let role_of: BTreeMap<&str, Role> = f.groups.iter().map(|g| (g.id.as_str(), g.role)).collect();
    let c = counts(f);

    // Donors whose heir is Ready: drain, then retire once drained.
    for donor in f.nodes.iter().filter(|n| !n.up_to_date) {
        let Some(heir) = donor.donor_to.as_deref().and_then(|h| by_name.get(h)) else {
            continue;
        };
        if !heir.ready {
            continue;
        }
        match donor.drain {
            DrainState::None => steps.push(Step::Drain {
                node: donor.name.clone(),
            }),
            DrainState::Succeeded => steps.push(Step::Retire {
                node: donor.name.clone(),
            }),
            DrainState::Running | DrainState::Failed => {}
        }
    }

    // Surplus nodes go the same way as donors, without waiting for an heir.
    for node in f.nodes.iter().filter(|n| n.obsolete) {
        match node.drain {
            DrainState::None => steps.push(Step::Drain {
                node: node.name.clone(),
            }),
            DrainState::Succeeded => steps.push(Step::Retire {
                node: node.name.clone(),
            }),
            DrainState::Running | DrainState::Failed => {}
        }
    }

    // Pair each Ready mint with an outdated node of its group that has no heir
    // (one drained early first).
    let mut taken: BTreeSet<&str> = BTreeSet::new();

    // A pairing half written (a leader died between annotating the heir and
    // its donor): the heir names a donor that names no heir. Finish it, or
    // the donor would get a second heir and the first would be left over.
    for heir in f.nodes.iter() {
        let Some(donor) = heir.heir_of.as_deref().and_then(|d| by_name.get(d)) else {
            continue;
        };
        if donor.donor_to.is_none() && taken.insert(donor.name.as_str()) {
            steps.push(Step::Pair {
                donor: donor.name.clone(),
                heir: heir.name.clone(),
            });
        }
    }
    for mint in f
        .nodes
        .iter()
        .filter(|n| n.up_to_date && n.ready && n.joining && n.heir_of.is_none() && !n.obsolete)
    {
        // Nodes drained early come first: they are out of service already,
        // and the instance was created on the slot they lent.
        let partner = f
            .nodes
            .iter()
            .filter(|n| {
                !n.up_to_date
                    && n.group == mint.group
                    && n.donor_to.is_none()
                    && n.heir_of.is_none()
                    && !n.obsolete
                    && !taken.contains(n.name.as_str())
            })
            .min_by_key(|n| n.drain == DrainState::None);
        match partner {
            Some(donor) => {
                taken.insert(donor.name.as_str());
                steps.push(Step::Pair {
                    donor: donor.name.clone(),
                    heir: mint.name.clone(),
                });
            }
            None => steps.push(Step::MarkObsolete {
                node: mint.name.clone(),
            }),
        }
    }

    // Early drains within maxUnavailable: outdated nodes without an heir yet.
    let workers_wait = workers_wait_for_control_plane(f);
    let blocked_role = |group: &str| workers_wait && role_of.get(group) == Some(&Role::Worker);
    let early = f
        .nodes
        .iter()
        .filter(|n| {
            !n.up_to_date
                && n.donor_to.is_none()
                && n.drain == DrainState::None
                && !taken.contains(n.name.as_str())
                && !blocked_role(&n.group)
        })
        .take(f.max_unavailable.saturating_sub(c.unavailable));
    for node in early {
        steps.push(Step::Drain {
            node: node.name.clone(),
        });
    }

    // New instances: per group, outdated nodes still needing an heir, minus
    // instances already on their way; within the surge budget, plus one for
    // each node of the group drained early (it leaves, so its replacement
    // adds no surge). Replacements on their way in the group — instances
    // joining, joined nodes not paired yet — take those slots first, and a
    // mint pairs with a drained node first, so a slot is never used twice.
    let mut surge_left = f.max_surge.saturating_sub(c.surge);
    let mut groups: Vec<&GroupFacts> = f.groups.iter().collect();
    groups.sort_by_key(|g| (g.role, g.id.clone()));
    for g in groups {
        if !g.image_ready || blocked_role(&g.id) {
            continue;
        }
        let needing = f
            .nodes
            .iter()
            .filter(|n| {
                n.group == g.id && !n.up_to_date && n.donor_to.is_none() && !taken.contains(n.name.as_str())
            })
            .count();
        let on_the_way = f.joins.iter().filter(|j| j.group == g.id).count()
            + f.nodes
                .iter()
                .filter(|n| n.group == g.id && n.joining && n.heir_of.is_none())
                .count()
            - f.nodes
                .iter()
                .filter(|n| n.group == g.id && n.up_to_date && n.ready && n.joining && n.heir_of.is_none())
                .filter(|n| {
                    steps
                        .iter()
                        .any(|s| matches!(s, Step::Pair { heir, .. } if heir == &n.name))
                })
                .count();
        let want = needing.saturating_sub(on_the_way);
        // Drained nodes that no heir (old, or paired just now) stands in for.
        let drained_early = f
            .nodes
            .iter()
            .filter(|n| {
                n.group == g.id
                    && !n.up_to_date
                    && n.donor_to.is_none()
                    && n.drain != DrainState::None
                    && !taken.contains(n.name.as_str())
            })
            .count();
        let from_early = want.min(drained_early.saturating_sub(on_the_way));
        let from_surge = (want - from_early).min(surge_left);
        surge_left -= from_surge;
        let count = from_early + from_surge;
        if count > 0 {
            steps.push(Step::Create {
                group: g.id.clone(),
                count,
            });
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(id: &str, role: Role) -> GroupFacts {
        GroupFacts {
            id: id.into(),
            role,
            image_ready: true,
        }
    }

    fn old(name: &str, group: &str) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            group: group.into(),
            ready: true,
            ..Default::default()
        }
    }

    fn new(name: &str, group: &str) -> NodeFacts {
        NodeFacts {
            up_to_date: true,
            ..old(name, group)
        }
    }

    fn mint(name: &str, group: &str) -> NodeFacts {
        NodeFacts {
            joining: true,
            ..new(name, group)
        }
    }

    fn join(p: &str, group: &str) -> JoinFacts {
        JoinFacts {
            pending: p.into(),
            group: group.into(),
        }
    }

    fn facts<'a>(
        groups: &'a [GroupFacts],
        nodes: &'a [NodeFacts],
        joins: &'a [JoinFacts],
        surge: usize,
    ) -> Facts<'a> {
        Facts {
            groups,
            nodes,
            joins,
            max_surge: surge,
            max_unavailable: 0,
            control_plane_first: true,
        }
    }

    fn create(group: &str, count: usize) -> Step {
        Step::Create {
            group: group.into(),
            count,
        }
    }

    #[test]
    fn surge_bounds_creations() {
        let groups = [group("w", Role::Worker)];
        let nodes: Vec<NodeFacts> = (0..5).map(|i| old(&format!("n{i}"), "w")).collect();
        assert_eq!(plan(&facts(&groups, &nodes, &[], 1)), [create("w", 1)]);
        assert_eq!(plan(&facts(&groups, &nodes, &[], 3)), [create("w", 3)]);
        assert_eq!(
            plan(&facts(&groups, &nodes, &[], 10)),
            [create("w", 5)],
            "never more than needed"
        );
        // Joins in flight use the budget.
        let joins = [join("p1", "w")];
        assert_eq!(plan(&facts(&groups, &nodes, &joins, 1)), []);
        assert_eq!(plan(&facts(&groups, &nodes, &joins, 3)), [create("w", 2)]);
    }

    #[test]
    fn up_to_date_cluster_does_nothing() {
        let groups = [group("w", Role::Worker)];
        let nodes = [new("a", "w"), new("b", "w")];
        assert_eq!(plan(&facts(&groups, &nodes, &[], 3)), []);
        let c = counts(&facts(&groups, &nodes, &[], 3));
        assert_eq!((c.nodes, c.up_to_date, c.outdated, c.surge), (2, 2, 0, 0));
    }

    #[test]
    fn a_ready_mint_is_paired_in_its_group_and_no_extra_instance_is_made() {
        let groups = [group("w", Role::Worker), group("v", Role::Worker)];
        let nodes = [old("a", "v"), old("b", "w"), mint("m", "w")];
        let steps = plan(&facts(&groups, &nodes, &[], 1));
        assert_eq!(
            steps,
            [Step::Pair {
                donor: "b".into(),
                heir: "m".into()
            }]
        );
        // With a bigger budget, group v gets an instance too, w does not.
        let steps = plan(&facts(&groups, &nodes, &[], 2));
        assert_eq!(
            steps,
            [
                Step::Pair {
                    donor: "b".into(),
                    heir: "m".into()
                },
                create("v", 1)
            ]
        );
    }

    #[test]
    fn drain_only_after_the_heir_is_ready_and_retire_only_after_the_drain() {
        let groups = [group("w", Role::Worker)];
        let mut donor = NodeFacts {
            donor_to: Some("h".into()),
            ..old("d", "w")
        };
        let mut heir = NodeFacts {
            heir_of: Some("d".into()),
            ready: false,
            ..new("h", "w")
        };
        let plan_now = |d: &NodeFacts, h: &NodeFacts| plan(&facts(&groups, &[d.clone(), h.clone()], &[], 1));
        assert_eq!(plan_now(&donor, &heir), [], "heir not Ready: nothing");
        heir.ready = true;
        assert_eq!(plan_now(&donor, &heir), [Step::Drain { node: "d".into() }]);
        donor.drain = DrainState::Running;
        assert_eq!(plan_now(&donor, &heir), []);
        donor.drain = DrainState::Failed;
        assert_eq!(
            plan_now(&donor, &heir),
            [],
            "a failed drain never leads to deletion"
        );
        donor.drain = DrainState::Succeeded;
        assert_eq!(plan_now(&donor, &heir), [Step::Retire { node: "d".into() }]);
    }

    #[test]
    fn control_planes_go_first() {
        let groups = [group("cp", Role::ControlPlane), group("w", Role::Worker)];
        let nodes = [old("c1", "cp"), old("w1", "w"), old("w2", "w")];
        assert_eq!(plan(&facts(&groups, &nodes, &[], 3)), [create("cp", 1)]);
        let mut f = facts(&groups, &nodes, &[], 3);
        f.control_plane_first = false;
        assert_eq!(plan(&f), [create("cp", 1), create("w", 2)]);
        // Once the control plane is current, workers follow.
        let nodes = [new("c1", "cp"), old("w1", "w"), old("w2", "w")];
        assert_eq!(plan(&facts(&groups, &nodes, &[], 3)), [create("w", 2)]);
    }

    #[test]
    fn a_joined_node_of_unknown_image_still_counts_as_surge() {
        let groups = [group("w", Role::Worker)];
        let unknown = NodeFacts {
            joining: true,
            up_to_date: false,
            ..old("m", "w")
        };
        let nodes = [old("a", "w"), old("b", "w"), unknown];
        assert_eq!(
            plan(&facts(&groups, &nodes, &[], 1)),
            [],
            "no second instance while the first is unaccounted"
        );
    }

    #[test]
    fn a_mint_without_a_partner_is_surplus_and_removed() {
        let groups = [group("w", Role::Worker)];
        let nodes = [new("a", "w"), mint("m", "w")];
        assert_eq!(
            plan(&facts(&groups, &nodes, &[], 1)),
            [Step::MarkObsolete { node: "m".into() }]
        );
        let marked = [
            new("a", "w"),
            NodeFacts {
                obsolete: true,
                joining: false,
                ..new("m", "w")
            },
        ];
        assert_eq!(
            plan(&facts(&groups, &marked, &[], 1)),
            [Step::Drain { node: "m".into() }]
        );
        let drained = [
            new("a", "w"),
            NodeFacts {
                obsolete: true,
                drain: DrainState::Succeeded,
                ..new("m", "w")
            },
        ];
        assert_eq!(
            plan(&facts(&groups, &drained, &[], 1)),
            [Step::Retire { node: "m".into() }]
        );
    }

    #[test]
    fn no_instance_while_the_group_image_is_not_set() {
        let groups = [GroupFacts {
            image_ready: false,
            ..group("w", Role::Worker)
        }];
        let nodes = [old("a", "w")];
        assert_eq!(plan(&facts(&groups, &nodes, &[], 1)), []);
    }

    #[test]
    fn a_half_written_pairing_is_finished_not_paired_again() {
        let groups = [group("w", Role::Worker)];
        // h names d as its donor; d does not name h yet. m is a fresh mint.
        let nodes = [
            old("d", "w"),
            NodeFacts {
                heir_of: Some("d".into()),
                ..new("h", "w")
            },
            old("e", "w"),
            mint("m", "w"),
        ];
        let steps = plan(&facts(&groups, &nodes, &[], 2));
        assert_eq!(
            steps,
            [
                Step::Pair {
                    donor: "d".into(),
                    heir: "h".into()
                },
                Step::Pair {
                    donor: "e".into(),
                    heir: "m".into()
                },
            ]
        );
    }

    #[test]
    fn heirs_with_donors_count_against_surge() {
        let groups = [group("w", Role::Worker)];
        let nodes = [
            NodeFacts {
                donor_to: Some("h".into()),
                drain: DrainState::Running,
                ..old("d", "w")
            },
            NodeFacts {
                heir_of: Some("d".into()),
                ..new("h", "w")
            },
            old("x", "w"),
        ];
        assert_eq!(plan(&facts(&groups, &nodes, &[], 1)), []);
        assert_eq!(plan(&facts(&groups, &nodes, &[], 2)), [create("w", 1)]);
    }

    #[test]
    fn a_node_drained_ahead_lends_its_slot_once_and_to_its_own_group() {
        // Found by the property tests: at maxSurge 0 a drained node's slot
        // was spent in another group, or twice when the instance made for
        // it paired with a different node.
        let drained = |name: &str, g: &str| NodeFacts {
            drain: DrainState::Running,
            ..old(name, g)
        };
        let mut groups = [group("a", Role::Worker), group("b", Role::Worker)];
        groups[0].image_ready = false;
        let nodes = [drained("a1", "a"), old("b1", "b")];
        let mut f = facts(&groups, &nodes, &[], 0);
        f.max_unavailable = 1;
        assert_eq!(plan(&f), [], "no instance in group b for a node of group a");

        // The new node pairs with the drained node first, whatever the order.
        let groups = [group("w", Role::Worker)];
        let nodes = [old("w1", "w"), drained("w2", "w"), mint("m", "w")];
        let mut f = facts(&groups, &nodes, &[], 0);
        f.max_unavailable = 1;
        assert_eq!(
            plan(&f),
            [Step::Pair {
                donor: "w2".into(),
                heir: "m".into()
            }],
            "the drained node gets the heir; no second instance on its slot"
        );
    }

    #[test]
    fn max_unavailable_drains_ahead_and_replaces() {
        let groups = [group("w", Role::Worker)];
        let nodes = [old("a", "w"), old("b", "w"), old("c", "w")];
        let mut f = facts(&groups, &nodes, &[], 0);
        f.max_unavailable = 2;
        assert_eq!(
            plan(&f),
            [Step::Drain { node: "a".into() }, Step::Drain { node: "b".into() }]
        );
        let drained = [
            NodeFacts {
                drain: DrainState::Running,
                ..old("a", "w")
            },
            NodeFacts {
                drain: DrainState::Running,
                ..old("b", "w")
            },
            old("c", "w"),
        ];
        let mut f = facts(&groups, &drained, &[], 0);
        f.max_unavailable = 2;
        assert_eq!(
            plan(&f),
            [create("w", 2)],
            "replacements for the nodes drained ahead"
        );
        let c = counts(&f);
        assert_eq!(c.unavailable, 2);
    }
}
