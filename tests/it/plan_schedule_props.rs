//! Property tests of the Plan schedule (`upgrade::schedule`): random plans
//! (concurrency, cordon or drain or neither), random nodes and random orders
//! of events — drains and Jobs finishing or failing, nodes rebooting and
//! flapping, a leader dying part-way through a round (only a prefix of its
//! steps taken, its status never written) — driven through the same round
//! the Plan controller runs, and checked after every round:
//!
//! - `status.applying` never holds more than `concurrency` nodes, and a node
//!   carries something of the plan (its cordon, its NodeMaintenance, a
//!   running Job) only while it is applying: never more than `concurrency`
//!   nodes disturbed at once;
//! - a Job starts only once its node is prepared as the plan asks (drained,
//!   or cordoned), and never on a NotReady node's first step;
//! - a node is released only after its Job succeeded and it has been Ready
//!   for the settle time; it leaves `applying` only once nothing of the plan
//!   is left on it;
//! - after a failure no further node starts;
//! - deciding again on the state a round's own steps produced never repeats
//!   a step that changes the cluster;
//! - with events stopped, every due node ends upgraded and nothing of the
//!   plan is left (or, after a failure, only the failed nodes, still held).
//!
//! The model keeps its own record of the cluster; only the decisions come
//! from the schedule.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use nodewarden::api::plan::NodeUpgrade;
use nodewarden::upgrade::schedule::{
    Candidate, JobState, Maintenance, NodeDecision, NodeFacts, Phase, Prep, Step, choose, decide_node,
    is_due, start_blocked,
};
use proptest::prelude::*;

const HASH: &str = "hash-2";
const SETTLE: Duration = Duration::from_secs(10);

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + second).expect("a time in range")
}

/// One node as the cluster shows it.
#[derive(Clone, Debug)]
struct Node {
    name: String,
    uid: String,
    label: Option<String>,
    ready: bool,
    ready_since: i64,
    maintenance: Maintenance,
    cordoned: bool,
    job: JobState,
    /// The Job ran to success (so the node was upgraded).
    upgraded: bool,
}

impl Node {
    fn remnants(&self) -> bool {
        self.maintenance != Maintenance::Absent || self.cordoned || self.job == JobState::Running
    }

    fn facts(&self) -> NodeFacts {
        NodeFacts {
            name: self.name.clone(),
            hash_label: self.label.clone(),
            ready: self.ready,
            ready_since: Some(at(self.ready_since)),
            selected: true,
            maintenance: self.maintenance.clone(),
            cordoned_by_plan: self.cordoned,
            held_by: None,
            job: self.job.clone(),
            job_outdated: false,
            prepare_job: None,
            earlier_job_running: false,
            remnants: self.remnants(),
        }
    }
}

/// The cluster plus the plan's status.
#[derive(Clone, Debug)]
struct World {
    nodes: Vec<Node>,
    prep: Prep,
    concurrency: usize,
    applying: Vec<String>,
    records: Vec<NodeUpgrade>,
    now: i64,
}

/// What can happen between two rounds.
#[derive(Clone, Debug)]
enum Event {
    /// A running drain finishes (or fails).
    DrainDone { node: usize, fails: bool },
    /// A running Job finishes (or fails); a success reboots the node.
    JobDone { node: usize, fails: bool },
    /// A NotReady node comes back.
    Ready { node: usize },
    /// A node not applying goes NotReady.
    Flap { node: usize },
    /// The leader dies after taking this many of a round's steps.
    LeaderDies { after: usize },
    /// Time passes.
    Tick { seconds: i64 },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0usize..12, prop::bool::weighted(0.05)).prop_map(|(node, fails)| Event::DrainDone { node, fails }),
        4 => (0usize..12, prop::bool::weighted(0.05)).prop_map(|(node, fails)| Event::JobDone { node, fails }),
        3 => (0usize..12).prop_map(|node| Event::Ready { node }),
        1 => (0usize..12).prop_map(|node| Event::Flap { node }),
        1 => (0usize..4).prop_map(|after| Event::LeaderDies { after }),
        3 => (1i64..8).prop_map(|seconds| Event::Tick { seconds }),
    ]
}

fn world() -> impl Strategy<Value = World> {
    (
        1usize..12,
        prop_oneof![Just(Prep::Nothing), Just(Prep::Cordon), Just(Prep::Drain)],
        1usize..5,
        prop::collection::vec(
            (
                any::<u32>(),
                prop::bool::weighted(0.2),
                prop::bool::weighted(0.15),
            ),
            12,
        ),
    )
        .prop_map(|(n, prep, concurrency, raw)| World {
            nodes: raw
                .into_iter()
                .take(n)
                .enumerate()
                .map(|(i, (uid, done, not_ready))| Node {
                    name: format!("node-{i}"),
                    uid: format!("{uid:08x}-{i}"),
                    label: done.then(|| HASH.to_string()),
                    ready: !not_ready,
                    ready_since: 0,
                    maintenance: Maintenance::Absent,
                    cordoned: false,
                    job: JobState::Absent,
                    upgraded: done,
                })
                .collect(),
            prep,
            concurrency,
            applying: Vec::new(),
            records: Vec::new(),
            now: 100,
        })
}

fn changes_the_cluster(step: Step) -> bool {
    matches!(step, Step::Cordon | Step::Drain | Step::CreateJob | Step::Label)
}

impl World {
    fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .expect("an applying node exists")
    }

    fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .expect("an applying node exists")
    }

    fn decisions(&self) -> Vec<(String, NodeDecision)> {
        self.applying
            .iter()
            .map(|name| {
                let record = self.records.iter().find(|r| &r.name == name);
                let d = decide_node(
                    self.prep,
                    HASH,
                    &self.node(name).facts(),
                    record,
                    at(self.now),
                    SETTLE,
                );
                (name.clone(), d)
            })
            .collect()
    }

    /// One round of the controller: a step on every applying node (all of
    /// them, or only `steps_before_death` if the leader dies), then the new
    /// `applying` and records, written only by a leader that lived.
    fn round(&mut self, steps_before_death: Option<usize>) -> Result<(), TestCaseError> {
        let decisions = self.decisions();
        for (i, (name, d)) in decisions.iter().enumerate() {
            if steps_before_death.is_some_and(|n| i >= n) {
                return Ok(());
            }
            self.check_step(name, d)?;
            self.take(name, d.step);
        }
        if steps_before_death.is_some() {
            return Ok(());
        }
        let kept: Vec<&(String, NodeDecision)> =
            decisions.iter().filter(|(_, d)| d.step != Step::Finish).collect();
        let failed = kept
            .iter()
            .find(|(_, d)| d.phase == Phase::Failed)
            .map(|(n, _)| n.as_str());
        let chosen = match start_blocked(failed, true, None, None, at(self.now)) {
            Some(_) => Vec::new(),
            None => {
                let applying: BTreeSet<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
                let candidates: Vec<Candidate> = self
                    .nodes
                    .iter()
                    .filter(|n| !applying.contains(n.name.as_str()) && is_due(n.label.as_deref(), HASH))
                    .map(|n| Candidate {
                        name: n.name.clone(),
                        uid: n.uid.clone(),
                        ready: n.ready,
                    })
                    .collect();
                choose("plan-uid", HASH, kept.len(), self.concurrency, &candidates)
            }
        };
        if failed.is_some() {
            prop_assert!(chosen.is_empty(), "a node started after {failed:?} failed");
        }
        for name in &chosen {
            prop_assert!(self.node(name).ready, "NotReady {name} was chosen");
        }
        let mut records = Vec::new();
        for (name, d) in &kept {
            let prev = self.records.iter().find(|r| &r.name == name);
            let phase = d.phase.as_str().to_string();
            let since = match prev {
                Some(r) if r.phase == phase => r.phase_since.clone(),
                _ => Time(at(self.now)),
            };
            records.push(record(name, &phase, since));
        }
        let first = match self.prep {
            Prep::Drain => Phase::Draining,
            Prep::Cordon => Phase::Cordoning,
            Prep::Nothing => Phase::Upgrading,
        };
        records.extend(
            chosen
                .iter()
                .map(|n| record(n, first.as_str(), Time(at(self.now)))),
        );
        self.applying = kept.iter().map(|(n, _)| n.clone()).chain(chosen).collect();
        self.applying.sort();
        self.records = records;
        Ok(())
    }

    /// The step is allowed by what the cluster shows.
    fn check_step(&self, name: &str, d: &NodeDecision) -> Result<(), TestCaseError> {
        let node = self.node(name);
        let record = self.records.iter().find(|r| r.name == name);
        match d.step {
            Step::CreateJob => {
                prop_assert_eq!(&node.job, &JobState::Absent, "{} gets a second Job", name);
                match self.prep {
                    Prep::Drain => prop_assert_eq!(
                        &node.maintenance,
                        &Maintenance::Succeeded,
                        "Job on undrained {}",
                        name
                    ),
                    Prep::Cordon => prop_assert!(node.cordoned, "Job on uncordoned {}", name),
                    Prep::Nothing => {}
                }
            }
            Step::Label => {
                prop_assert_eq!(&node.job, &JobState::Succeeded, "{} labelled without a Job", name)
            }
            Step::Release => {
                prop_assert!(
                    record.is_some_and(|r| r.phase == Phase::Releasing.as_str()),
                    "{name} released before its status said so"
                );
                prop_assert!(
                    node.upgraded && node.label.as_deref() == Some(HASH),
                    "{name} released before it was upgraded"
                );
                prop_assert!(node.ready, "{name} released while NotReady");
                prop_assert!(
                    self.now - node.ready_since >= SETTLE.as_secs() as i64,
                    "{name} released {}s after it came back, settle is {SETTLE:?}",
                    self.now - node.ready_since
                );
            }
            Step::Finish => prop_assert!(
                !node.remnants(),
                "{name} left applying with the plan's things on it"
            ),
            // The model's plans are never edited (the unit table has it).
            Step::RetryJob => prop_assert!(false, "{name}: a Job made again though the plan did not change"),
            // The model's plans have no `prepare` (its order is in the unit table).
            Step::Prepare | Step::RetryPrepare => {
                prop_assert!(false, "{name}: a prepare step without prepare")
            }
            Step::Cordon | Step::Drain | Step::Wait => {}
        }
        Ok(())
    }

    fn take(&mut self, name: &str, step: Step) {
        let node = self.node_mut(name);
        match step {
            Step::Cordon => node.cordoned = true,
            Step::Drain => node.maintenance = Maintenance::Running("draining".into()),
            Step::CreateJob => node.job = JobState::Running,
            Step::Label => node.label = Some(HASH.into()),
            Step::Release => {
                node.maintenance = Maintenance::Absent;
                node.cordoned = false;
                if node.job == JobState::Running {
                    node.job = JobState::Absent;
                }
            }
            Step::Wait | Step::Finish | Step::Prepare | Step::RetryPrepare | Step::RetryJob => {}
        }
    }

    fn apply(&mut self, event: &Event) {
        let now = self.now;
        let len = self.nodes.len();
        match *event {
            Event::DrainDone { node, fails } => {
                let n = &mut self.nodes[node % len];
                if matches!(n.maintenance, Maintenance::Running(_) | Maintenance::Held(_)) {
                    n.maintenance = match fails {
                        true => Maintenance::Failed("a PDB blocks eviction".into()),
                        false => Maintenance::Succeeded,
                    };
                }
            }
            Event::JobDone { node, fails } => {
                let n = &mut self.nodes[node % len];
                if n.job == JobState::Running {
                    if fails {
                        n.job = JobState::Failed("backoff limit".into());
                    } else {
                        n.job = JobState::Succeeded;
                        n.upgraded = true;
                        n.ready = false;
                    }
                }
            }
            Event::Ready { node } => {
                let n = &mut self.nodes[node % len];
                if !n.ready {
                    n.ready = true;
                    n.ready_since = now;
                }
            }
            Event::Flap { node } => {
                let name = self.nodes[node % len].name.clone();
                if !self.applying.contains(&name) {
                    self.nodes[node % len].ready = false;
                }
            }
            Event::Tick { seconds } => self.now += seconds,
            Event::LeaderDies { .. } => {}
        }
    }

    /// Invariants of the state between rounds.
    fn check(&self) -> Result<(), TestCaseError> {
        prop_assert!(
            self.applying.len() <= self.concurrency,
            "{} applying at concurrency {}",
            self.applying.len(),
            self.concurrency
        );
        for n in &self.nodes {
            if n.remnants() {
                prop_assert!(
                    self.applying.contains(&n.name),
                    "{} carries the plan's things but is not applying",
                    n.name
                );
            }
        }
        Ok(())
    }

    /// Decide again on what the last round produced: nothing that changes
    /// the cluster is asked twice.
    fn check_idempotent(&self, before: &[(String, NodeDecision)]) -> Result<(), TestCaseError> {
        for (name, again) in self.decisions() {
            if let Some((_, first)) = before.iter().find(|(n, _)| *n == name) {
                prop_assert!(
                    !(changes_the_cluster(first.step) && first.step == again.step),
                    "{name}: {:?} asked again right after it was taken",
                    first.step
                );
            }
        }
        Ok(())
    }

    /// With no more faults: Jobs and drains succeed, nodes come back, time passes.
    fn settle_everything(&mut self) {
        self.now += 1;
        for n in &mut self.nodes {
            if matches!(n.maintenance, Maintenance::Running(_) | Maintenance::Held(_)) {
                n.maintenance = Maintenance::Succeeded;
            }
            if n.job == JobState::Running {
                n.job = JobState::Succeeded;
                n.upgraded = true;
                n.ready = false;
            } else if !n.ready {
                n.ready = true;
                n.ready_since = self.now;
            }
        }
        self.now += SETTLE.as_secs() as i64;
    }
}

fn record(name: &str, phase: &str, since: Time) -> NodeUpgrade {
    NodeUpgrade {
        name: name.into(),
        hash: HASH.into(),
        phase: phase.into(),
        started: Time(at(0)),
        phase_since: since,
        message: String::new(),
        traceparent: String::new(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn a_plan_holds_its_bounds_and_finishes(mut w in world(), events in prop::collection::vec(event(), 0..120)) {
        for e in &events {
            w.apply(e);
            let death = match e {
                Event::LeaderDies { after } => Some(*after),
                _ => None,
            };
            let before = w.decisions();
            w.round(death)?;
            w.check()?;
            if death.is_none() {
                w.check_idempotent(&before)?;
            }
        }
        // Events stop: the plan comes to rest within a bounded number of rounds.
        let rounds = 12 * (w.nodes.len() + 1);
        for _ in 0..rounds {
            w.settle_everything();
            w.round(None)?;
            w.check()?;
        }
        let failed: BTreeSet<String> = w
            .records
            .iter()
            .filter(|r| r.phase == Phase::Failed.as_str())
            .map(|r| r.name.clone())
            .collect();
        prop_assert_eq!(w.applying.iter().cloned().collect::<BTreeSet<_>>(), failed.clone(), "only failed nodes stay applying");
        for n in &w.nodes {
            if failed.contains(&n.name) {
                continue;
            }
            prop_assert!(!n.remnants(), "{} keeps the plan's things", n.name);
            if failed.is_empty() {
                prop_assert_eq!(n.label.as_deref(), Some(HASH), "{} never upgraded", &n.name);
                prop_assert!(n.upgraded);
            }
        }
    }

    /// Choosing is bounded by the free slots, takes only Ready due nodes,
    /// each once, does not depend on the order nodes are listed in, and a
    /// larger concurrency only adds to what a smaller one picks.
    #[test]
    fn choosing_is_bounded_and_stable(
        raw in prop::collection::vec((any::<u32>(), prop::bool::weighted(0.8)), 0..20),
        applying in 0usize..6,
        concurrency in 0usize..8,
        rotate in 0usize..20,
    ) {
        let candidates: Vec<Candidate> = raw
            .iter()
            .enumerate()
            .map(|(i, (uid, ready))| Candidate { name: format!("node-{i}"), uid: format!("{uid:08x}"), ready: *ready })
            .collect();
        let chosen = choose("plan-uid", HASH, applying, concurrency, &candidates);
        prop_assert!(chosen.len() <= concurrency.saturating_sub(applying));
        let ready = candidates.iter().filter(|c| c.ready).count();
        prop_assert_eq!(chosen.len(), ready.min(concurrency.saturating_sub(applying)), "free slots left empty");
        let distinct: BTreeSet<&String> = chosen.iter().collect();
        prop_assert_eq!(distinct.len(), chosen.len());
        for name in &chosen {
            prop_assert!(candidates.iter().any(|c| &c.name == name && c.ready));
        }
        let mut rotated = candidates.clone();
        if !rotated.is_empty() {
            rotated.rotate_left(rotate % candidates.len());
        }
        prop_assert_eq!(&choose("plan-uid", HASH, applying, concurrency, &rotated), &chosen);
        let more = choose("plan-uid", HASH, applying, concurrency + 1, &candidates);
        prop_assert_eq!(&more[..chosen.len()], &chosen[..]);
        // Once the chosen are applying, no slot is left for the rest, or
        // no Ready candidate is.
        let rest: Vec<Candidate> = candidates.iter().filter(|c| !chosen.contains(&c.name)).cloned().collect();
        prop_assert!(choose("plan-uid", HASH, applying + chosen.len(), concurrency, &rest).is_empty());
    }
}
