//! Property tests of the rolling-replacement planner (`nodewarden::rollout`):
//! random clusters, budgets and orders of events, including a leader that
//! dies part-way through carrying out a plan (only a prefix of its steps is
//! written, a pairing possibly half-written), checked against the
//! rollout invariants after every single change:
//!
//! - the nodes in flight never exceed `maxSurge` plus the nodes drained
//!   early (drained before they had a Ready heir, which maxUnavailable
//!   allows: each such node leaves, so its replacement adds no capacity;
//!   it lends its slot until it is retired), and nodes drained without a
//!   Ready heir never exceed `maxUnavailable` (invariant 1);
//! - a node is retired only once its drain succeeded and it is surplus or
//!   its heir is Ready (invariant 2);
//! - no worker instance is created while a control-plane node is outdated;
//! - with one failure domain at a time, the nodes drained and not yet
//!   retired are all of one domain;
//! - with a wave's allowance, a plan starts (creates, or drains early) at
//!   most that many replacements, besides the instances of nodes drained
//!   before it (their replacement began with the drain);
//! - planning again on the state the plan's own steps produce never repeats
//!   a step, and the planner comes to rest: with events stopped, re-planning
//!   reaches a fixed point within a few rounds;
//! - every rollout finishes with every node up to date, as many nodes as at
//!   the start, and no instance left joining.
//!
//! The model is deliberately independent of the planner's own bookkeeping:
//! the budgets are recomputed here from the nodes and joins themselves.

use std::collections::BTreeSet;

use nodewarden::rollout::{DrainState, Facts, GroupFacts, JoinFacts, NodeFacts, Role, Step, plan};
use proptest::prelude::*;

/// A cluster as the planner sees it, plus the counters the model needs.
#[derive(Clone, Debug)]
struct World {
    groups: Vec<GroupFacts>,
    nodes: Vec<NodeFacts>,
    joins: Vec<JoinFacts>,
    max_surge: usize,
    max_unavailable: usize,
    control_plane_first: bool,
    /// Replace one failure domain at a time (nodes carry "", "za" or "zb").
    one_domain: bool,
    /// The replacements a wave lets each plan start (None: no waves).
    wave_starts: Option<usize>,
    /// Nodes at the start.
    base: usize,
    /// Nodes whose drain was requested before they had a Ready heir.
    drained_early: BTreeSet<String>,
    next_id: usize,
}

impl World {
    fn facts(&self) -> Facts<'_> {
        Facts {
            groups: &self.groups,
            nodes: &self.nodes,
            joins: &self.joins,
            max_surge: self.max_surge,
            max_unavailable: self.max_unavailable,
            control_plane_first: self.control_plane_first,
            halted: false,
            wave_starts: self.wave_starts,
            one_domain_at_a_time: self.one_domain,
            unready_pods: 0,
        }
    }

    fn node(&self, name: &str) -> Option<&NodeFacts> {
        self.nodes.iter().find(|n| n.name == name)
    }

    fn node_mut(&mut self, name: &str) -> Option<&mut NodeFacts> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }

    fn role(&self, group: &str) -> Option<Role> {
        self.groups.iter().find(|g| g.id == group).map(|g| g.role)
    }

    fn heir_ready(&self, n: &NodeFacts) -> bool {
        n.donor_to
            .as_deref()
            .and_then(|h| self.node(h))
            .is_some_and(|h| h.ready)
    }

    /// Outdated nodes whose drain was requested while no Ready heir stands in.
    fn drained_without_heir(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| !n.up_to_date && !n.obsolete && n.drain != DrainState::None && !self.heir_ready(n))
            .count()
    }

    /// Invariant 1, recomputed from the nodes and joins.
    fn check_budgets(&self) -> Result<(), String> {
        let in_flight = (self.nodes.len() + self.joins.len()).saturating_sub(self.base);
        let lent = self
            .nodes
            .iter()
            .filter(|n| self.drained_early.contains(&n.name))
            .count();
        if in_flight > self.max_surge + lent {
            return Err(format!(
                "{in_flight} nodes in flight > maxSurge {} + {lent} drained early",
                self.max_surge
            ));
        }
        if self.one_domain {
            let disrupted: BTreeSet<&str> = self
                .nodes
                .iter()
                .filter(|n| !n.up_to_date && !n.obsolete && n.drain != DrainState::None)
                .map(|n| n.domain.as_str())
                .collect();
            if disrupted.len() > 1 {
                return Err(format!("nodes of domains {disrupted:?} drained at once"));
            }
        }
        let early = self.drained_without_heir();
        if early > self.max_unavailable {
            return Err(format!(
                "{early} drained without a Ready heir > maxUnavailable {}",
                self.max_unavailable
            ));
        }
        Ok(())
    }

    /// Whether `step` is allowed on this state (checked before it is carried out).
    fn check_step(&self, step: &Step) -> Result<(), String> {
        match step {
            Step::Retire { node } => {
                let n = self.node(node).ok_or(format!("retire of unknown {node}"))?;
                if n.drain != DrainState::Succeeded {
                    return Err(format!("{node} retired before its drain succeeded"));
                }
                if !n.obsolete && !self.heir_ready(n) {
                    return Err(format!("{node} retired without a Ready heir"));
                }
            }
            Step::Create { group, count } => {
                if *count == 0 {
                    return Err(format!("an empty create in {group}"));
                }
                let cp_outdated = self
                    .nodes
                    .iter()
                    .any(|n| !n.up_to_date && self.role(&n.group) == Some(Role::ControlPlane));
                if self.control_plane_first && cp_outdated && self.role(group) == Some(Role::Worker) {
                    return Err(format!(
                        "worker instances created in {group} while the control plane is outdated"
                    ));
                }
                if !self.groups.iter().any(|g| &g.id == group && g.image_ready) {
                    return Err(format!("instances created in {group} before its image is set"));
                }
            }
            Step::Pair { donor, heir } => {
                let (d, h) = (self.node(donor), self.node(heir));
                let (Some(d), Some(h)) = (d, h) else {
                    return Err(format!("pair of unknown {donor}/{heir}"));
                };
                if d.up_to_date || !h.up_to_date || d.group != h.group {
                    return Err(format!("pair {donor} -> {heir} across versions or groups"));
                }
                if d.donor_to.as_deref().is_some_and(|x| x != heir) {
                    return Err(format!("{donor} given a second heir {heir}"));
                }
            }
            Step::Drain { node } => {
                let n = self.node(node).ok_or(format!("drain of unknown {node}"))?;
                if n.drain != DrainState::None {
                    return Err(format!("{node} drained twice"));
                }
                if n.up_to_date && !n.obsolete {
                    return Err(format!("up-to-date {node} drained"));
                }
            }
            Step::MarkObsolete { node } => {
                let n = self.node(node).ok_or(format!("obsolete of unknown {node}"))?;
                if !n.up_to_date || n.heir_of.is_some() {
                    return Err(format!("{node} marked obsolete though it is needed"));
                }
            }
        }
        Ok(())
    }

    /// Carries out `step` as the controller would. `half`: a Pair is cut off
    /// after its first write (the heir's annotation).
    fn apply(&mut self, step: &Step, half: bool) {
        match step {
            Step::Pair { donor, heir } => {
                if let Some(h) = self.node_mut(heir) {
                    h.heir_of = Some(donor.clone());
                }
                if half {
                    return;
                }
                if let Some(d) = self.node_mut(donor) {
                    d.donor_to = Some(heir.clone());
                }
                // The pairing deletes the mint's PendingNode.
                if let Some(h) = self.node_mut(heir) {
                    h.joining = false;
                }
            }
            Step::Drain { node } => {
                let early = self
                    .node(node)
                    .is_some_and(|n| !n.obsolete && !self.heir_ready(n));
                if early {
                    self.drained_early.insert(node.clone());
                }
                if let Some(n) = self.node_mut(node) {
                    n.drain = DrainState::Running;
                }
            }
            Step::Retire { node } => self.nodes.retain(|n| &n.name != node),
            Step::Create { group, count } => {
                for _ in 0..*count {
                    self.next_id += 1;
                    self.joins.push(JoinFacts {
                        pending: format!("join-{}", self.next_id),
                        group: group.clone(),
                    });
                }
            }
            Step::MarkObsolete { node } => {
                if let Some(n) = self.node_mut(node) {
                    n.obsolete = true;
                }
            }
        }
    }

    /// Something the world does by itself; `pick` chooses which. Returns
    /// false when nothing can happen.
    fn event(&mut self, pick: usize) -> bool {
        let mut possible: Vec<usize> = Vec::new();
        // 0: an instance joins (as a Node, not Ready yet)
        if !self.joins.is_empty() {
            possible.push(0);
        }
        // 1: a new node turns Ready
        if self.nodes.iter().any(|n| !n.ready) {
            possible.push(1);
        }
        // 2: a drain finishes
        if self.nodes.iter().any(|n| n.drain == DrainState::Running) {
            possible.push(2);
        }
        // 3: a group's image becomes ready at the cloud
        if self.groups.iter().any(|g| !g.image_ready) {
            possible.push(3);
        }
        let Some(&what) = possible.get(pick % possible.len().max(1)) else {
            return false;
        };
        let k = pick / 4;
        match what {
            0 => {
                let j = self.joins.remove(k % self.joins.len());
                self.nodes.push(NodeFacts {
                    name: format!("node-{}", j.pending),
                    group: j.group,
                    // Where the cloud put it: any domain.
                    domain: DOMAINS[k % DOMAINS.len()].to_string(),
                    up_to_date: true,
                    ready: false,
                    joining: true,
                    ..NodeFacts::default()
                });
            }
            1 => {
                let waiting: Vec<usize> = (0..self.nodes.len()).filter(|&i| !self.nodes[i].ready).collect();
                self.nodes[waiting[k % waiting.len()]].ready = true;
            }
            2 => {
                let running: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| self.nodes[i].drain == DrainState::Running)
                    .collect();
                self.nodes[running[k % running.len()]].drain = DrainState::Succeeded;
            }
            _ => {
                let waiting: Vec<usize> = (0..self.groups.len())
                    .filter(|&i| !self.groups[i].image_ready)
                    .collect();
                self.groups[waiting[k % waiting.len()]].image_ready = true;
            }
        }
        true
    }

    fn done(&self) -> bool {
        self.joins.is_empty() && self.nodes.iter().all(|n| n.up_to_date && !n.obsolete && n.ready)
    }
}

/// The failure domains nodes are in (with `one_domain`); "" is a node
/// without the label.
const DOMAINS: [&str; 3] = ["", "za", "zb"];

/// A cluster to roll: one or two worker groups and maybe a control-plane
/// group, each with outdated and up-to-date nodes, some group images not
/// set at the cloud yet.
fn world() -> impl Strategy<Value = World> {
    (
        prop::collection::vec((0usize..5, 0usize..3, any::<bool>()), 1..=3),
        any::<bool>(),
        0usize..5,
        0usize..3,
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1usize..3),
    )
        .prop_map(
            |(groups, with_cp, surge, unavailable, cp_first, one_domain, wave_starts)| {
                let mut w = World {
                    groups: Vec::new(),
                    nodes: Vec::new(),
                    joins: Vec::new(),
                    max_surge: surge,
                    max_unavailable: unavailable,
                    control_plane_first: cp_first,
                    one_domain,
                    wave_starts,
                    base: 0,
                    drained_early: BTreeSet::new(),
                    next_id: 0,
                };
                // A rollout with neither budget cannot move; the resolved budgets
                // never are both 0 (maxSurge defaults to 1).
                if surge == 0 && unavailable == 0 {
                    w.max_surge = 1;
                }
                for (i, (outdated, current, image_ready)) in groups.into_iter().enumerate() {
                    let role = if i == 0 && with_cp {
                        Role::ControlPlane
                    } else {
                        Role::Worker
                    };
                    let id = format!("g{i}");
                    w.groups.push(GroupFacts {
                        id: id.clone(),
                        role,
                        image_ready,
                    });
                    for j in 0..outdated + current {
                        w.nodes.push(NodeFacts {
                            name: format!("{id}-n{j}"),
                            group: id.clone(),
                            up_to_date: j >= outdated,
                            ready: true,
                            domain: DOMAINS[(i + j) % DOMAINS.len()].to_string(),
                            ..NodeFacts::default()
                        });
                    }
                }
                w.base = w.nodes.len();
                w
            },
        )
}

/// Plans on `w`, checks each step, and carries out the steps (or, when
/// `crash` is Some(k), only the first k, the k-th Pair half-written).
fn reconcile(w: &mut World, crash: Option<usize>) -> Result<Vec<Step>, String> {
    let steps = plan(&w.facts());
    if let Some(allowed) = w.wave_starts {
        let started: usize = steps
            .iter()
            .map(|s| match s {
                Step::Create { count, .. } => *count,
                Step::Drain { node } => usize::from(
                    w.node(node)
                        .is_some_and(|n| !n.up_to_date && !n.obsolete && n.donor_to.is_none()),
                ),
                _ => 0,
            })
            .sum();
        let drained_before = w
            .nodes
            .iter()
            .filter(|n| !n.up_to_date && !n.obsolete && n.donor_to.is_none() && n.drain != DrainState::None)
            .count();
        if started > allowed + drained_before {
            return Err(format!(
                "{started} replacements started by one plan > the wave's {allowed} (+{drained_before} drained before): {steps:?}"
            ));
        }
    }
    let mut seen = BTreeSet::new();
    for step in &steps {
        if !seen.insert(step.clone()) {
            return Err(format!("{step:?} planned twice in one plan"));
        }
    }
    let cut = crash.map_or(steps.len(), |k| k % (steps.len() + 1));
    for (i, step) in steps.iter().enumerate().take(cut) {
        w.check_step(step)?;
        let half = crash.is_some() && i + 1 == cut && matches!(step, Step::Pair { .. });
        w.apply(step, half);
        w.check_budgets()?;
    }
    Ok(steps)
}

/// Steps that, once carried out, must never be planned again.
fn repeated(before: &[Step], after: &[Step]) -> Option<Step> {
    after
        .iter()
        .find(|s| !matches!(s, Step::Create { .. }) && before.contains(s))
        .cloned()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(768))]

    /// A whole rollout under a random order of events and leader crashes.
    #[test]
    fn every_rollout_keeps_the_budgets_and_finishes(
        mut w in world(),
        events in prop::collection::vec((any::<usize>(), 0u8..10, any::<usize>()), 400),
    ) {
        w.check_budgets().map_err(TestCaseError::fail)?;
        let base = w.base;
        for (pick, what, crash_at) in events {
            if w.done() {
                break;
            }
            // Mostly a full reconcile; sometimes a crash mid-way; sometimes
            // the world moves first.
            let crash = (what == 0).then_some(crash_at);
            if what >= 6 && w.event(pick) {
                w.check_budgets().map_err(TestCaseError::fail)?;
                continue;
            }
            let before = w.nodes.clone();
            let steps = reconcile(&mut w, crash).map_err(TestCaseError::fail)?;
            if crash.is_none() {
                // Planning again on what the steps wrote repeats none of them.
                let again = plan(&w.facts());
                if let Some(s) = repeated(&steps, &again) {
                    return Err(TestCaseError::fail(format!("{s:?} planned again after it was carried out; nodes before {before:?}")));
                }
            }
            if steps.is_empty() && !w.event(pick) && !w.done() {
                return Err(TestCaseError::fail(format!("stuck: nothing to plan and nothing can happen: {w:?}")));
            }
            w.check_budgets().map_err(TestCaseError::fail)?;
        }
        // Let the world finish: reconcile after every event.
        let mut rounds = 0;
        while !w.done() {
            rounds += 1;
            prop_assert!(rounds < 2_000, "the rollout does not finish: {w:?}");
            let steps = reconcile(&mut w, None).map_err(TestCaseError::fail)?;
            if !w.event(rounds) && steps.is_empty() {
                return Err(TestCaseError::fail(format!("stuck: {w:?}")));
            }
            w.check_budgets().map_err(TestCaseError::fail)?;
        }
        prop_assert_eq!(w.nodes.len(), base, "as many nodes as at the start");
        let names: BTreeSet<&str> = w.nodes.iter().map(|n| n.name.as_str()).collect();
        prop_assert_eq!(names.len(), base);
    }

    /// With the world standing still, re-planning comes to rest: each round
    /// only carries the rollout a step further (pair, retire, drain, create),
    /// never in a circle, and no step is planned twice.
    #[test]
    fn replanning_a_still_world_comes_to_rest(
        mut w in world(),
        events in prop::collection::vec(any::<usize>(), 0..60),
    ) {
        // Somewhere into a rollout: reconciles and events interleaved.
        for pick in events {
            reconcile(&mut w, None).map_err(TestCaseError::fail)?;
            w.event(pick);
        }
        let limit = 4 * (w.nodes.len() + w.joins.len()) + 4;
        let mut planned: BTreeSet<Step> = BTreeSet::new();
        for _ in 0..=limit {
            let steps = reconcile(&mut w, None).map_err(TestCaseError::fail)?;
            if steps.is_empty() {
                return Ok(());
            }
            for step in steps.into_iter().filter(|s| !matches!(s, Step::Create { .. })) {
                prop_assert!(planned.insert(step.clone()), "{:?} planned again without any event", step);
            }
        }
        prop_assert!(false, "still planning after {limit} rounds without events: {w:?}");
    }
}
