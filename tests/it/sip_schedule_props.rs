//! Property tests of SIPCluster host selection (`sip::schedule::plan_cluster`):
//! random pools of BareMetalHosts (racks or none, some failed, some already
//! claimed by a role as active or standby) and random wants, checked for:
//!
//! - one host per topology value within a role (hosts without the label
//!   are unconstrained, as upstream SIP has it), no host in two roles, no
//!   failed host kept, never more actives or standbys than wanted, and a
//!   shortfall reported exactly when the role is not filled;
//! - a role short of hosts left no usable free host unclaimed;
//! - nothing is released that could have been kept: only as many working
//!   hosts as exceed the wants;
//! - what the plan says the role ends with is what its own steps produce;
//! - a new cluster that cannot be filled takes nothing and keeps nothing;
//! - planning again on the state the plan's steps produced changes nothing
//!   (a role that was short may still take hosts another role let go; after
//!   that, nothing at all).

use std::collections::{BTreeMap, BTreeSet};

use nodewarden::sip::schedule::{
    Candidate, ClusterPlan, HostState, Member, RoleView, RoleWants, plan_cluster,
};
use proptest::prelude::*;

const SURPLUS: &str = "more standby hosts than wanted";

/// A BareMetalHost as the model knows it.
#[derive(Clone, Debug)]
struct Host {
    name: String,
    rack: Option<String>,
    failed: bool,
    /// The role (index) and state it is labelled with.
    claim: Option<(usize, HostState)>,
}

#[derive(Clone, Debug)]
struct Pool {
    hosts: Vec<Host>,
    wants: Vec<RoleWants>,
}

fn pool() -> impl Strategy<Value = Pool> {
    let host = (
        prop::option::weighted(0.9, 0u8..6),
        prop::bool::weighted(0.15),
        prop::option::weighted(0.4, (0usize..2, any::<bool>())),
    );
    let wants = (0usize..4, 0usize..3, prop::bool::weighted(0.75));
    (
        prop::collection::vec(host, 0..16),
        prop::collection::vec(wants, 1..3),
    )
        .prop_map(|(raw, raw_wants)| {
            let roles = raw_wants.len();
            Pool {
                hosts: raw
                    .into_iter()
                    .enumerate()
                    .map(|(i, (rack, failed, claim))| Host {
                        name: format!("host-{i:02}"),
                        rack: rack.map(|r| format!("r{r}")),
                        failed,
                        claim: claim.map(|(role, active)| {
                            let state = if active {
                                HostState::Active
                            } else {
                                HostState::Standby
                            };
                            (role % roles, state)
                        }),
                    })
                    .collect(),
                wants: raw_wants
                    .into_iter()
                    .enumerate()
                    .map(|(i, (active, standby, spread))| RoleWants {
                        role: if i == 0 {
                            "ControlPlane".into()
                        } else {
                            "Worker".into()
                        },
                        active,
                        standby,
                        topology_key: spread.then(|| "rack".into()),
                    })
                    .collect(),
            }
        })
}

impl Pool {
    fn views(&self) -> Vec<RoleView> {
        let free: Vec<Candidate> = self
            .hosts
            .iter()
            .filter(|h| h.claim.is_none() && !h.failed)
            .map(|h| Candidate {
                name: h.name.clone(),
                topology: h.rack.clone(),
            })
            .collect();
        self.wants
            .iter()
            .enumerate()
            .map(|(role, wants)| RoleView {
                wants: wants.clone(),
                members: self
                    .hosts
                    .iter()
                    .filter_map(|h| match h.claim {
                        Some((r, state)) if r == role => Some(Member {
                            name: h.name.clone(),
                            state,
                            topology: h.rack.clone(),
                            unusable: h.failed.then(|| "provisioning error".to_string()),
                        }),
                        _ => None,
                    })
                    .collect(),
                free: free.clone(),
            })
            .collect()
    }

    fn host(&mut self, name: &str) -> &mut Host {
        self.hosts
            .iter_mut()
            .find(|h| h.name == name)
            .expect("a planned host exists")
    }

    /// Carries the plan out as the controller labels hosts, checking each
    /// step is possible: releases and restates touch the role's own hosts,
    /// claims free working ones.
    fn apply(&mut self, plan: &ClusterPlan) -> Result<(), TestCaseError> {
        for (role, p) in plan.roles.iter().enumerate() {
            for (name, _) in &p.release {
                let h = self.host(name);
                prop_assert!(
                    h.claim.is_some_and(|(r, _)| r == role),
                    "{name} released by a role it is not in"
                );
                h.claim = None;
            }
            for (name, state) in &p.restate {
                let h = self.host(name);
                prop_assert!(
                    h.claim.is_some_and(|(r, _)| r == role),
                    "{name} restated by a role it is not in"
                );
                h.claim = Some((role, *state));
            }
            for (name, state) in &p.claim {
                let h = self.host(name);
                prop_assert!(
                    h.claim.is_none() && !h.failed,
                    "{name} claimed while {:?}, failed {}",
                    h.claim,
                    h.failed
                );
                h.claim = Some((role, *state));
            }
        }
        Ok(())
    }

    fn role_hosts(&self, role: usize) -> Vec<(String, HostState)> {
        let mut v: Vec<(String, HostState)> = self
            .hosts
            .iter()
            .filter_map(|h| match h.claim {
                Some((r, s)) if r == role => Some((h.name.clone(), s)),
                _ => None,
            })
            .collect();
        v.sort();
        v
    }
}

fn is_empty(plan: &ClusterPlan) -> bool {
    plan.roles
        .iter()
        .all(|p| p.release.is_empty() && p.restate.is_empty() && p.claim.is_empty())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn host_selection_holds_its_rules_and_comes_to_rest(mut pool in pool(), initial in prop::bool::weighted(0.3)) {
        // A new cluster has no hosts yet.
        if initial {
            for h in &mut pool.hosts {
                h.claim = None;
            }
        }
        let views = pool.views();
        let plan = plan_cluster(&views, initial);
        prop_assert_eq!(plan.roles.len(), views.len());
        let by_name: BTreeMap<&str, &Host> = pool.hosts.iter().map(|h| (h.name.as_str(), h)).collect();

        if plan.held_back {
            prop_assert!(initial, "only a new cluster is held back");
            prop_assert!(plan.roles.iter().any(|p| p.shortfall.is_some()));
            for (p, v) in plan.roles.iter().zip(&views) {
                prop_assert!(p.claim.is_empty() && p.restate.is_empty() && p.result.is_empty());
                prop_assert_eq!(p.release.len(), v.members.len());
            }
            return Ok(());
        }
        prop_assert!(!initial || plan.roles.iter().all(|p| p.shortfall.is_none()));

        let mut everywhere = BTreeSet::new();
        for (p, v) in plan.roles.iter().zip(&views) {
            let w = &v.wants;
            let active = p.result.iter().filter(|(_, s)| *s == HostState::Active).count();
            let standby = p.result.len() - active;
            prop_assert!(active <= w.active && standby <= w.standby, "{}: {active}+{standby} for {}+{}", w.role, w.active, w.standby);
            prop_assert!(active == w.active || standby == 0, "{}: a standby waits while actives are missing", w.role);
            prop_assert_eq!(p.shortfall.is_some(), p.result.len() < w.active + w.standby, "{}: {:?}", &w.role, &p.shortfall);
            let mut racks = BTreeSet::new();
            for (name, _) in &p.result {
                let h = by_name[name.as_str()];
                prop_assert!(!h.failed, "failed {name} kept");
                prop_assert!(everywhere.insert(name.clone()), "{name} in two roles");
                if w.topology_key.is_some() && h.rack.is_some() {
                    prop_assert!(racks.insert(h.rack.clone()), "two hosts of {} on {:?}", &w.role, &h.rack);
                }
            }
            // Short: no usable free host was left that the role could take.
            if p.shortfall.is_some() {
                let claimed: BTreeSet<&String> = plan.roles.iter().flat_map(|p| p.claim.iter().map(|(n, _)| n)).collect();
                for c in v.free.iter().filter(|c| !claimed.contains(&c.name)) {
                    let fits = match &w.topology_key {
                        Some(_) => c.topology.is_none() || !racks.contains(&c.topology),
                        None => true,
                    };
                    prop_assert!(!fits, "{} short, yet free {} fits", &w.role, &c.name);
                }
            }
            // Only as many working hosts let go as exceed the wants.
            let usable: Vec<&Member> = v.members.iter().filter(|m| m.unusable.is_none()).collect();
            let eligible = match &w.topology_key {
                Some(_) => {
                    usable.iter().filter_map(|m| m.topology.as_ref()).collect::<BTreeSet<_>>().len()
                        + usable.iter().filter(|m| m.topology.is_none()).count()
                }
                None => usable.len(),
            };
            let let_go = p.release.iter().filter(|(_, why)| why == SURPLUS).count();
            prop_assert_eq!(let_go, eligible.saturating_sub(w.active + w.standby), "{}: {:?}", &w.role, &p.release);
        }

        // The result is what the steps produce.
        let mut after = pool.clone();
        after.apply(&plan)?;
        for (role, p) in plan.roles.iter().enumerate() {
            prop_assert_eq!(&after.role_hosts(role), &p.result, "role {}", role);
        }

        // Again on that state: only a role that was short may take hosts
        // another role let go; a third time, nothing.
        let second = plan_cluster(&after.views(), false);
        for (p, first) in second.roles.iter().zip(&plan.roles) {
            prop_assert!(p.release.is_empty() && p.restate.is_empty(), "second plan changes kept hosts: {:?}", p);
            prop_assert!(p.claim.is_empty() || first.shortfall.is_some(), "second plan claims for a filled role: {:?}", p);
        }
        after.apply(&second)?;
        let third = plan_cluster(&after.views(), false);
        prop_assert!(is_empty(&third), "third plan still changes things: {:?}", third);
    }
}
