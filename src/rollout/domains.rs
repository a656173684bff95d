//! One failure domain at a time (pure, table tested): with
//! `spec.rollout.topologyKey`, each node's domain is that label's value (a
//! zone, say; nodes without it are the domain ""), and only the current
//! domain's nodes are drained or get new instances. A domain stays current
//! while any of its nodes is being replaced; then the first domain (in
//! order) with outdated nodes is. Domains only lose outdated nodes, so the
//! choice holds from pass to pass without a record.
//!
//! New work starts only when the cluster is healthy: with nothing in flight
//! (no instance joining, no mint unpaired, no donor or drain), every node on
//! the target, and the workload pods on its new nodes, must be Ready before
//! the next replacement begins. So a domain
//! starts once the one before is complete and its nodes Ready.

use std::collections::BTreeSet;

use super::plan::workers_wait_for_control_plane;
use super::{DrainState, Facts, NodeFacts, Role};

/// Most domains a status list names (a topologyKey such as the hostname
/// makes one domain per node).
pub const LIST_LIMIT: usize = 100;

/// Where the rollout's domains stand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Domains {
    /// The domain whose nodes may be replaced now (None: no node to replace,
    /// or only workers that wait for the control plane).
    pub current: Option<String>,
    /// Domains with no outdated node left, in order.
    pub done: Vec<String>,
    /// Domains with outdated nodes after the current one, in order.
    pub waiting: Vec<String>,
    /// No new replacement may start: nothing is in flight and a node on the
    /// target is not Ready.
    pub hold: bool,
}

/// An outdated node still to be replaced (surplus nodes just go).
fn outdated(n: &NodeFacts) -> bool {
    !n.up_to_date && !n.obsolete
}

/// An outdated node whose replacement began: paired with an heir, or drained.
fn started(n: &NodeFacts) -> bool {
    outdated(n) && (n.donor_to.is_some() || n.drain != DrainState::None)
}

/// The domains of `f`'s nodes; None when the rollout has none
/// (`f.one_domain_at_a_time` off).
pub fn domains(f: &Facts) -> Option<Domains> {
    if !f.one_domain_at_a_time {
        return None;
    }
    let workers_wait = workers_wait_for_control_plane(f);
    let waits =
        |n: &NodeFacts| workers_wait && f.groups.iter().any(|g| g.id == n.group && g.role == Role::Worker);
    let current = f
        .nodes
        .iter()
        .filter(|n| started(n))
        .map(|n| n.domain.as_str())
        .min()
        .or_else(|| {
            f.nodes
                .iter()
                .filter(|n| outdated(n) && !waits(n))
                .map(|n| n.domain.as_str())
                .min()
        });
    let all: BTreeSet<&str> = f
        .nodes
        .iter()
        .filter(|n| !n.obsolete)
        .map(|n| n.domain.as_str())
        .collect();
    let with_outdated: BTreeSet<&str> = f
        .nodes
        .iter()
        .filter(|n| outdated(n))
        .map(|n| n.domain.as_str())
        .collect();
    let in_flight = !f.joins.is_empty()
        || f.nodes.iter().any(|n| n.joining && n.heir_of.is_none())
        || f.nodes.iter().any(started);
    let all_ready = f.unready_pods == 0
        && f.nodes
            .iter()
            .filter(|n| n.up_to_date && !n.obsolete)
            .all(|n| n.ready);
    let list = |set: &BTreeSet<&str>, keep: &dyn Fn(&str) -> bool| {
        set.iter()
            .filter(|d| keep(d))
            .take(LIST_LIMIT)
            .map(|d| d.to_string())
            .collect()
    };
    Some(Domains {
        done: list(&all, &|d| !with_outdated.contains(d)),
        waiting: list(&with_outdated, &|d| Some(d) != current),
        hold: current.is_some() && !in_flight && !all_ready,
        current: current.map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::{GroupFacts, JoinFacts};

    fn node(name: &str, group: &str, domain: &str, up_to_date: bool) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            group: group.into(),
            domain: domain.into(),
            up_to_date,
            ready: true,
            ..Default::default()
        }
    }

    fn facts<'a>(groups: &'a [GroupFacts], nodes: &'a [NodeFacts], joins: &'a [JoinFacts]) -> Facts<'a> {
        Facts {
            groups,
            nodes,
            joins,
            max_surge: 1,
            max_unavailable: 0,
            control_plane_first: true,
            halted: false,
            wave_starts: None,
            one_domain_at_a_time: true,
            unready_pods: 0,
        }
    }

    fn groups() -> Vec<GroupFacts> {
        [("cp", Role::ControlPlane), ("w", Role::Worker)]
            .map(|(id, role)| GroupFacts {
                id: id.into(),
                role,
                image_ready: true,
            })
            .to_vec()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn off_without_a_topology_key() {
        let g = groups();
        let nodes = [node("a", "w", "", false)];
        let mut f = facts(&g, &nodes, &[]);
        f.one_domain_at_a_time = false;
        assert_eq!(domains(&f), None);
    }

    #[test]
    fn the_first_domain_with_outdated_nodes_is_current() {
        let g = groups();
        let nodes = [
            node("a1", "w", "zone-a", true),
            node("b1", "w", "zone-b", false),
            node("c1", "w", "zone-c", false),
            node("n1", "w", "", true),
        ];
        let d = domains(&facts(&g, &nodes, &[])).expect("domains");
        assert_eq!(d.current.as_deref(), Some("zone-b"));
        assert_eq!(d.done, strings(&["", "zone-a"]));
        assert_eq!(d.waiting, strings(&["zone-c"]));
        assert!(!d.hold);
    }

    #[test]
    fn a_domain_being_replaced_stays_current_until_done() {
        let g = groups();
        // zone-a gained an outdated node (say, an old autoscaler node) while
        // zone-b is being replaced: zone-b finishes first.
        let mut donor = node("b1", "w", "zone-b", false);
        donor.donor_to = Some("w-9".into());
        let mut drained = node("b2", "w", "zone-b", false);
        drained.drain = DrainState::Running;
        let cases: Vec<(&str, Vec<NodeFacts>)> = vec![
            ("paired", vec![node("a1", "w", "zone-a", false), donor]),
            ("drained early", vec![node("a1", "w", "zone-a", false), drained]),
        ];
        for (case, nodes) in cases {
            let d = domains(&facts(&g, &nodes, &[])).expect("domains");
            assert_eq!(d.current.as_deref(), Some("zone-b"), "{case}");
            assert_eq!(d.waiting, strings(&["zone-a"]), "{case}");
        }
    }

    #[test]
    fn workers_domains_wait_for_the_control_plane() {
        let g = groups();
        let nodes = [
            node("w1", "w", "zone-a", false),
            node("cp1", "cp", "zone-a", true),
            node("cp2", "cp", "zone-b", false),
        ];
        let d = domains(&facts(&g, &nodes, &[])).expect("domains");
        assert_eq!(d.current.as_deref(), Some("zone-b"));
        let mut f = facts(&g, &nodes, &[]);
        f.control_plane_first = false;
        assert_eq!(domains(&f).and_then(|d| d.current).as_deref(), Some("zone-a"));
        let only_workers_wait = [
            node("w1", "w", "zone-a", false),
            node("cp2", "cp", "zone-b", true),
        ];
        let d = domains(&facts(&g, &only_workers_wait, &[])).expect("domains");
        assert_eq!(d.current.as_deref(), Some("zone-a"));
    }

    #[test]
    fn new_work_holds_while_a_node_on_the_target_is_not_ready_and_nothing_is_in_flight() {
        let g = groups();
        let mut not_ready = node("a9", "w", "zone-a", true);
        not_ready.ready = false;
        let settled = [node("b1", "w", "zone-b", false), not_ready.clone()];
        assert!(domains(&facts(&g, &settled, &[])).expect("domains").hold);
        // In flight: an instance joining, an unpaired mint, a donor.
        let join = [JoinFacts {
            pending: "p".into(),
            group: "w".into(),
        }];
        assert!(!domains(&facts(&g, &settled, &join)).expect("domains").hold);
        let mut mint = node("w-9", "w", "zone-c", true);
        mint.joining = true;
        let with_mint = [node("b1", "w", "zone-b", false), not_ready.clone(), mint];
        assert!(!domains(&facts(&g, &with_mint, &[])).expect("domains").hold);
        let mut donor = node("b1", "w", "zone-b", false);
        donor.donor_to = Some("a9".into());
        let with_donor = [donor, not_ready];
        assert!(!domains(&facts(&g, &with_donor, &[])).expect("domains").hold);
        // Everything on the target Ready: go on.
        let ready = [node("b1", "w", "zone-b", false), node("a9", "w", "zone-a", true)];
        assert!(!domains(&facts(&g, &ready, &[])).expect("domains").hold);
    }

    #[test]
    fn surplus_nodes_are_no_domain_s_work_and_a_finished_rollout_has_no_current() {
        let g = groups();
        let mut surplus = node("w-9", "w", "zone-z", true);
        surplus.obsolete = true;
        surplus.ready = false;
        let nodes = [node("a1", "w", "zone-a", true), surplus];
        let d = domains(&facts(&g, &nodes, &[])).expect("domains");
        assert_eq!(d.current, None);
        assert_eq!(d.done, strings(&["zone-a"]));
        assert!(d.waiting.is_empty());
        assert!(!d.hold);
    }
}
