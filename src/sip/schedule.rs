//! Which BareMetalHosts a SIPCluster role keeps, promotes, releases and
//! claims (pure).
//!
//! A role's hosts are the hosts labelled for it: the labels are the record,
//! so a new leader sees exactly what the last one claimed. Spread: at most
//! one of the role's hosts (active or standby) per value of its
//! topologyKey; a host without that label is unconstrained, as upstream SIP
//! has it: it can be claimed, and it is kept.

use std::collections::BTreeSet;

/// Whether a claimed host serves or waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostState {
    /// In use by the cluster (load balancer backend).
    Active,
    /// Held to replace a failed active host.
    Standby,
}

impl HostState {
    /// The label value: `active` or `standby`.
    pub fn as_str(self) -> &'static str {
        match self {
            HostState::Active => "active",
            HostState::Standby => "standby",
        }
    }

    /// From the label value; anything else counts as active (a host
    /// upstream labelled, without our state label, is in use).
    pub fn from_label(value: Option<&str>) -> HostState {
        match value {
            Some("standby") => HostState::Standby,
            _ => HostState::Active,
        }
    }
}

/// One of the role's hosts now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The BareMetalHost's name.
    pub name: String,
    /// Active or standby, per its label.
    pub state: HostState,
    /// Its value of the topologyKey (None: it has no such label).
    pub topology: Option<String>,
    /// Why it can no longer serve (failed, going away, no longer selected).
    pub unusable: Option<String>,
}

/// A free host the role could claim: usable, selected, claimed by no one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The BareMetalHost's name.
    pub name: String,
    /// Its value of the topologyKey.
    pub topology: Option<String>,
}

/// What a role wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoleWants {
    /// `ControlPlane` or `Worker`.
    pub role: String,
    /// Active hosts.
    pub active: usize,
    /// Standby hosts.
    pub standby: usize,
    /// The topologyKey (None: no spread).
    pub topology_key: Option<String>,
}

/// The changes for one role.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RolePlan {
    /// Hosts to unlabel, and why.
    pub release: Vec<(String, String)>,
    /// Hosts of the role whose state changes (promotions, demotions).
    pub restate: Vec<(String, HostState)>,
    /// Free hosts to label for the role, in this state.
    pub claim: Vec<(String, HostState)>,
    /// Active hosts that failed, and the host that replaces each (None:
    /// nothing to replace it with).
    pub replaced: Vec<(String, Option<String>)>,
    /// What is missing, when the role cannot be filled.
    pub shortfall: Option<String>,
    /// The role's hosts once the plan is done: (name, state).
    pub result: Vec<(String, HostState)>,
}

/// A role's hosts while planning: (name, state).
type Kept = Vec<(String, HostState)>;

fn count(kept: &[(String, HostState)], state: HostState) -> usize {
    kept.iter().filter(|(_, s)| *s == state).count()
}

/// The plan for one role. `members` are the role's hosts now; `free` the
/// hosts it may claim (the caller removes those claimed by earlier roles).
pub fn plan_role(wants: &RoleWants, members: &[Member], free: &[Candidate]) -> RolePlan {
    let mut plan = RolePlan::default();
    let (mut kept, mut used, failed_actives) = keep_members(wants, members, &mut plan);
    rebalance(wants, &mut kept, &mut plan);
    release_surplus_standbys(wants, &mut kept, &mut plan);
    let missing = claim_free(wants, free, &mut used, &mut kept, &mut plan);
    // Pair each failed active with the host that now serves in its place.
    let mut newly_active = plan
        .restate
        .iter()
        .filter(|(_, s)| *s == HostState::Active)
        .chain(plan.claim.iter().filter(|(_, s)| *s == HostState::Active))
        .map(|(n, _)| n.clone());
    plan.replaced = failed_actives
        .into_iter()
        .map(|old| (old, newly_active.next()))
        .collect();
    if missing > 0 {
        let per = match &wants.topology_key {
            Some(k) => format!(" (one per {k} value)"),
            None => String::new(),
        };
        plan.shortfall = Some(format!(
            "{}: {} wanted ({} active + {} standby), {} available{per}",
            wants.role,
            wants.active + wants.standby,
            wants.active,
            wants.standby,
            kept.len()
        ));
    }
    kept.sort();
    plan.result = kept;
    plan
}

/// Keeps usable members, actives first, one per topology value; the rest
/// are released. Returns the kept hosts, the topology values they use and
/// the active hosts that failed.
fn keep_members(
    wants: &RoleWants,
    members: &[Member],
    plan: &mut RolePlan,
) -> (Kept, BTreeSet<String>, Vec<String>) {
    let mut used = BTreeSet::new();
    let mut sorted: Vec<&Member> = members.iter().collect();
    sorted.sort_by(|a, b| (a.state, &a.name).cmp(&(b.state, &b.name)));
    let mut kept = Vec::new();
    let mut failed_actives = Vec::new();
    for m in sorted {
        let why = match (&m.unusable, &m.topology) {
            (Some(why), _) => Some(why.clone()),
            (None, Some(t)) if wants.topology_key.is_some() && used.contains(t) => {
                Some(format!("another host of the role shares its topology value {t}"))
            }
            _ => None,
        };
        match why {
            Some(why) => {
                if m.state == HostState::Active && m.unusable.is_some() {
                    failed_actives.push(m.name.clone());
                }
                plan.release.push((m.name.clone(), why));
            }
            None => {
                if let Some(t) = &m.topology {
                    used.insert(t.clone());
                }
                kept.push((m.name.clone(), m.state));
            }
        }
    }
    (kept, used, failed_actives)
}

/// Too many actives: the extras become standbys. Too few: standbys are
/// promoted.
fn rebalance(wants: &RoleWants, kept: &mut Kept, plan: &mut RolePlan) {
    let (from, to, mut n) = match count(kept, HostState::Active) {
        a if a > wants.active => (HostState::Active, HostState::Standby, a - wants.active),
        a => (HostState::Standby, HostState::Active, wants.active - a),
    };
    // Demote the last actives, promote the first standbys.
    let order: Vec<usize> = match from {
        HostState::Active => (0..kept.len()).rev().collect(),
        HostState::Standby => (0..kept.len()).collect(),
    };
    for i in order {
        if n == 0 {
            break;
        }
        if kept[i].1 == from {
            kept[i].1 = to;
            plan.restate.push((kept[i].0.clone(), to));
            n -= 1;
        }
    }
}

/// Too many standbys: release those that were standbys all along first
/// (not the actives just demoted).
fn release_surplus_standbys(wants: &RoleWants, kept: &mut Kept, plan: &mut RolePlan) {
    let mut surplus = count(kept, HostState::Standby).saturating_sub(wants.standby);
    let demoted: BTreeSet<String> = plan
        .restate
        .iter()
        .filter(|(_, s)| *s == HostState::Standby)
        .map(|(n, _)| n.clone())
        .collect();
    let mut order: Vec<usize> = (0..kept.len())
        .filter(|i| kept[*i].1 == HostState::Standby)
        .collect();
    order.sort_by_key(|i| {
        (
            demoted.contains(&kept[*i].0),
            std::cmp::Reverse(kept[*i].0.clone()),
        )
    });
    let mut dropped = BTreeSet::new();
    for i in order {
        if surplus == 0 {
            break;
        }
        dropped.insert(kept[i].0.clone());
        plan.release
            .push((kept[i].0.clone(), "more standby hosts than wanted".into()));
        surplus -= 1;
    }
    plan.restate.retain(|(n, _)| !dropped.contains(n));
    kept.retain(|(n, _)| !dropped.contains(n));
}

/// Claims free hosts, actives first, then standbys, one per topology
/// value. Returns how many are still missing.
fn claim_free(
    wants: &RoleWants,
    free: &[Candidate],
    used: &mut BTreeSet<String>,
    kept: &mut Kept,
    plan: &mut RolePlan,
) -> usize {
    let mut need_active = wants.active.saturating_sub(count(kept, HostState::Active));
    let mut need_standby = wants.standby.saturating_sub(count(kept, HostState::Standby));
    let mut free: Vec<&Candidate> = free.iter().collect();
    free.sort_by(|a, b| a.name.cmp(&b.name));
    for c in free {
        if need_active + need_standby == 0 {
            break;
        }
        // A host without the label takes no topology value.
        if wants.topology_key.is_some()
            && let Some(t) = &c.topology
            && !used.insert(t.clone())
        {
            continue;
        }
        let state = if need_active > 0 {
            need_active -= 1;
            HostState::Active
        } else {
            need_standby -= 1;
            HostState::Standby
        };
        plan.claim.push((c.name.clone(), state));
        kept.push((c.name.clone(), state));
    }
    need_active + need_standby
}

/// One role as the cluster shows it: what it wants, its hosts, the free
/// hosts it could claim.
#[derive(Clone, Debug)]
pub struct RoleView {
    /// What the role wants.
    pub wants: RoleWants,
    /// Its hosts now.
    pub members: Vec<Member>,
    /// Free hosts it could claim (a host may be a candidate of both roles).
    pub free: Vec<Candidate>,
}

/// The plan of every role, and whether claims were held back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterPlan {
    /// Per role, in the order given.
    pub roles: Vec<RolePlan>,
    /// A cluster never yet complete that cannot be filled claims nothing
    /// and gives back what it holds (upstream's all-or-nothing, kept across
    /// a leader killed mid-claim), so two clusters never each hold half of
    /// a pool that fits one.
    pub held_back: bool,
}

/// Plans every role in turn; a host one role claims is not free for the
/// next. `initial`: the cluster has never had its hosts (its status lists
/// none), so it gets all of them or none.
pub fn plan_cluster(roles: &[RoleView], initial: bool) -> ClusterPlan {
    let mut taken: BTreeSet<String> = BTreeSet::new();
    let mut plans = Vec::new();
    for r in roles {
        let free: Vec<Candidate> = r
            .free
            .iter()
            .filter(|c| !taken.contains(&c.name))
            .cloned()
            .collect();
        let plan = plan_role(&r.wants, &r.members, &free);
        taken.extend(plan.claim.iter().map(|(n, _)| n.clone()));
        plans.push(plan);
    }
    let held_back = initial && plans.iter().any(|p| p.shortfall.is_some());
    if held_back {
        for (p, r) in plans.iter_mut().zip(roles) {
            p.claim.clear();
            p.restate.clear();
            p.replaced.clear();
            p.result.clear();
            let why = "a new cluster gets all of its hosts or none";
            p.release = r
                .members
                .iter()
                .map(|m| (m.name.clone(), why.to_string()))
                .collect();
        }
    }
    ClusterPlan {
        roles: plans,
        held_back,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HostState::{Active, Standby};

    fn wants(active: usize, standby: usize) -> RoleWants {
        RoleWants {
            role: "Worker".into(),
            active,
            standby,
            topology_key: Some("rack".into()),
        }
    }

    fn member(name: &str, state: HostState, rack: &str) -> Member {
        Member {
            name: name.into(),
            state,
            topology: Some(rack.into()),
            unusable: None,
        }
    }

    fn free(name: &str, rack: &str) -> Candidate {
        Candidate {
            name: name.into(),
            topology: Some(rack.into()),
        }
    }

    fn names(v: &[(String, HostState)]) -> Vec<(&str, HostState)> {
        v.iter().map(|(n, s)| (n.as_str(), *s)).collect()
    }

    #[test]
    fn a_new_role_claims_one_host_per_rack_actives_first() {
        let pool = [
            free("a1", "r1"),
            free("a2", "r1"),
            free("b1", "r2"),
            free("c1", "r3"),
        ];
        let p = plan_role(&wants(2, 1), &[], &pool);
        assert_eq!(names(&p.claim), [("a1", Active), ("b1", Active), ("c1", Standby)]);
        assert_eq!(p.shortfall, None);
    }

    #[test]
    fn too_few_racks_is_a_shortfall_naming_the_counts() {
        let pool = [free("a1", "r1"), free("a2", "r1"), free("b1", "r2")];
        let p = plan_role(&wants(4, 1), &[], &pool);
        assert_eq!(
            p.shortfall.as_deref(),
            Some("Worker: 5 wanted (4 active + 1 standby), 2 available (one per rack value)")
        );
    }

    /// Hosts without the topology label are unconstrained, as upstream
    /// SIP has it: (members, free, wants) → (claimed, kept, released).
    #[test]
    fn hosts_without_the_topology_label_are_unconstrained() {
        let bare = |name: &str| Candidate {
            name: name.into(),
            topology: None,
        };
        let held = |name: &str, state| Member {
            name: name.into(),
            state,
            topology: None,
            unusable: None,
        };
        type Case<'a> = (&'a str, Vec<Member>, Vec<Candidate>, RoleWants, [Vec<&'a str>; 3]);
        let cases: [Case; 5] = [
            (
                "claimed",
                vec![],
                vec![bare("x")],
                wants(1, 0),
                [vec!["x"], vec!["x"], vec![]],
            ),
            (
                "several claimed, beside one per rack",
                vec![],
                vec![bare("x"), bare("y"), free("a1", "r1"), free("a2", "r1")],
                wants(3, 0),
                [vec!["a1", "x", "y"], vec!["a1", "x", "y"], vec![]],
            ),
            (
                "one held is kept",
                vec![held("x", Active), member("a", Active, "r1")],
                vec![],
                wants(2, 0),
                [vec![], vec!["a", "x"], vec![]],
            ),
            (
                "two held beside a rack's host are kept",
                vec![held("x", Active), held("y", Standby), member("a", Active, "r1")],
                vec![],
                wants(2, 1),
                [vec![], vec!["a", "x", "y"], vec![]],
            ),
            (
                "no spread",
                vec![],
                vec![bare("x")],
                RoleWants {
                    topology_key: None,
                    ..wants(1, 0)
                },
                [vec!["x"], vec!["x"], vec![]],
            ),
        ];
        for (what, members, pool, w, [claimed, kept, released]) in cases {
            let p = plan_role(&w, &members, &pool);
            let mut c: Vec<&str> = p.claim.iter().map(|(n, _)| n.as_str()).collect();
            c.sort();
            assert_eq!(c, claimed, "{what}");
            assert_eq!(
                p.result.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
                kept,
                "{what}"
            );
            assert_eq!(
                p.release.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
                released,
                "{what}"
            );
            assert_eq!(p.shortfall, None, "{what}");
        }
    }

    #[test]
    fn a_failed_active_is_replaced_by_the_standby_and_a_new_standby_claimed() {
        let mut failed = member("a1", Active, "r1");
        failed.unusable = Some("operational status \"error\"".into());
        let members = [failed, member("b1", Active, "r2"), member("c1", Standby, "r3")];
        let p = plan_role(&wants(2, 1), &members, &[free("a2", "r1"), free("d1", "r4")]);
        assert_eq!(p.release[0].0, "a1");
        assert_eq!(names(&p.restate), [("c1", Active)]);
        // The failed host's rack is free again.
        assert_eq!(names(&p.claim), [("a2", Standby)]);
        assert_eq!(p.replaced, [("a1".to_string(), Some("c1".to_string()))]);
        assert_eq!(
            names(&p.result),
            [("a2", Standby), ("b1", Active), ("c1", Active)]
        );
    }

    #[test]
    fn a_failed_active_without_standby_is_replaced_by_a_free_host() {
        let mut failed = member("a1", Active, "r1");
        failed.unusable = Some("deleted".into());
        let p = plan_role(&wants(1, 0), &[failed], &[free("b1", "r2")]);
        assert_eq!(names(&p.claim), [("b1", Active)]);
        assert_eq!(p.replaced, [("a1".to_string(), Some("b1".to_string()))]);
    }

    #[test]
    fn shrinking_releases_standbys_first() {
        let members = [
            member("a", Active, "r1"),
            member("b", Active, "r2"),
            member("c", Active, "r3"),
            member("s", Standby, "r4"),
        ];
        // 3+1 -> 2+1: an active becomes the standby, the old standby goes.
        let p = plan_role(&wants(2, 1), &members, &[]);
        assert_eq!(names(&p.restate), [("c", Standby)]);
        assert_eq!(
            p.release,
            [("s".to_string(), "more standby hosts than wanted".to_string())]
        );
        assert_eq!(names(&p.result), [("a", Active), ("b", Active), ("c", Standby)]);
        // 3+1 -> 3+0: the standby goes.
        let p = plan_role(&wants(3, 0), &members, &[]);
        assert_eq!(p.release.len(), 1);
        assert_eq!(p.release[0].0, "s");
        assert!(p.restate.is_empty());
    }

    #[test]
    fn two_members_on_one_rack_keep_the_active() {
        let members = [member("s", Standby, "r1"), member("a", Active, "r1")];
        let p = plan_role(&wants(1, 1), &members, &[]);
        assert_eq!(p.release[0].0, "s");
        assert!(p.shortfall.is_some(), "the standby is missing now");
    }

    #[test]
    fn roles_share_no_host_and_a_new_cluster_that_cannot_be_filled_claims_nothing() {
        let pool = vec![free("a", "r1"), free("b", "r2"), free("c", "r3")];
        let role = |role: &str, active| RoleView {
            wants: RoleWants {
                role: role.into(),
                active,
                standby: 0,
                topology_key: Some("rack".into()),
            },
            members: Vec::new(),
            free: pool.clone(),
        };
        let p = plan_cluster(&[role("ControlPlane", 1), role("Worker", 2)], true);
        assert_eq!(names(&p.roles[0].claim), [("a", Active)]);
        assert_eq!(names(&p.roles[1].claim), [("b", Active), ("c", Active)]);
        assert!(!p.held_back);
        let p = plan_cluster(&[role("ControlPlane", 1), role("Worker", 3)], true);
        assert!(p.held_back);
        assert!(p.roles.iter().all(|r| r.claim.is_empty()), "all or nothing");
        assert!(p.roles[1].shortfall.is_some());
        // Half claimed by a leader killed mid-claim: given back.
        let mut half = role("Worker", 3);
        half.members = vec![member("b", Active, "r2")];
        half.free.retain(|c| c.name != "b");
        let p = plan_cluster(&[role("ControlPlane", 1), half.clone()], true);
        assert!(p.held_back);
        assert_eq!(p.roles[1].release[0].0, "b");
        // A cluster that had its hosts keeps them when one more cannot be found.
        let p = plan_cluster(&[role("ControlPlane", 1), half], false);
        assert!(!p.held_back);
        assert!(p.roles[1].release.is_empty());
        assert_eq!(p.roles[1].claim.len(), 1, "what can be claimed is");
    }

    #[test]
    fn a_satisfied_role_changes_nothing() {
        let members = [member("a", Active, "r1"), member("s", Standby, "r2")];
        let p = plan_role(&wants(1, 1), &members, &[free("x", "r3")]);
        assert_eq!(
            p,
            RolePlan {
                result: vec![("a".into(), Active), ("s".into(), Standby)],
                ..Default::default()
            }
        );
    }
}
