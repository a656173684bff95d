//! What a Plan's pass reads of the nodes it selects, kept from one pass to
//! the next and brought up to date from the nodes that changed since.
//!
//! Every Node change that matters enqueues every Plan. Looking at every
//! node on every pass (selector, hash label, readiness) made a pass cost
//! milliseconds per thousand nodes, and a Node event waited for the running
//! pass: at 5,000 churning nodes the wait's p99 was about 100 ms. With a
//! tally a pass costs what changed.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;

/// What a pass needs of one selected node (the rest it reads from the
/// cache for the few nodes it starts or steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// Its hash label is the plan's current target.
    pub upgraded: bool,
    /// It is to be upgraded: not upgraded, and the plan not disabled on it.
    pub due: bool,
}

/// What the marks were taken against: a new target or a new selector
/// (a new generation) or a recreated plan marks every node anew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Basis {
    /// The plan's UID.
    pub plan_uid: String,
    /// The plan's generation (its selector is in its spec).
    pub generation: Option<i64>,
    /// The plan's target hash.
    pub hash: String,
}

/// The selected nodes of one plan, by name, with the count of upgraded ones.
#[derive(Debug)]
pub struct Tally {
    basis: Basis,
    marks: HashMap<String, Mark>,
    upgraded: usize,
}

impl Tally {
    /// An empty tally against `basis`: every node is still to be marked.
    pub fn new(basis: Basis) -> Tally {
        Tally {
            basis,
            marks: HashMap::new(),
            upgraded: 0,
        }
    }

    /// What the marks were taken against.
    pub fn basis(&self) -> &Basis {
        &self.basis
    }

    /// Records what the cluster shows of `name` now: `None` when the plan
    /// does not select it (or it is gone).
    pub fn set(&mut self, name: &str, mark: Option<Mark>) {
        let old = match mark {
            Some(mark) => {
                self.upgraded += usize::from(mark.upgraded);
                self.marks.insert(name.to_string(), mark)
            }
            None => self.marks.remove(name),
        };
        if let Some(old) = old {
            self.upgraded -= usize::from(old.upgraded);
        }
    }

    /// How many nodes the plan selects.
    pub fn selected(&self) -> usize {
        self.marks.len()
    }

    /// How many of them are upgraded.
    pub fn upgraded(&self) -> usize {
        self.upgraded
    }

    /// The mark of `name`, when the plan selects it.
    pub fn get(&self, name: &str) -> Option<&Mark> {
        self.marks.get(name)
    }

    /// The selected nodes to be upgraded.
    pub fn due(&self) -> impl Iterator<Item = &str> {
        self.marks.iter().filter(|(_, m)| m.due).map(|(n, _)| n.as_str())
    }
}

/// The nodes that changed since each plan's last pass, noted as the watch
/// delivers them (before the plan is enqueued, so a pass that takes the
/// notes sees every change that enqueued it).
#[derive(Debug)]
pub struct ChangedNodes<P> {
    by_plan: Mutex<HashMap<P, HashSet<String>>>,
}

impl<P> Default for ChangedNodes<P> {
    fn default() -> Self {
        ChangedNodes {
            by_plan: Mutex::new(HashMap::new()),
        }
    }
}

impl<P: Hash + Eq + Clone> ChangedNodes<P> {
    /// `node` changed; each of `plans` will look at it on its next pass.
    pub fn note<'a>(&self, node: &str, plans: impl IntoIterator<Item = &'a P>)
    where
        P: 'a,
    {
        let mut by_plan = self.by_plan.lock().unwrap_or_else(|e| e.into_inner());
        for plan in plans {
            by_plan.entry(plan.clone()).or_default().insert(node.to_string());
        }
    }

    /// The nodes that changed for `plan` since the last call, forgotten here.
    pub fn take(&self, plan: &P) -> HashSet<String> {
        let mut by_plan = self.by_plan.lock().unwrap_or_else(|e| e.into_inner());
        by_plan.remove(plan).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(upgraded: bool) -> Option<Mark> {
        Some(Mark {
            upgraded,
            due: !upgraded,
        })
    }

    fn basis() -> Basis {
        Basis {
            plan_uid: "p".into(),
            generation: Some(1),
            hash: "h".into(),
        }
    }

    #[test]
    fn counts_follow_every_kind_of_change() {
        type Steps = Vec<(&'static str, Option<Mark>)>;
        // (steps, selected, upgraded, due names)
        let cases: Vec<(Steps, usize, usize, Vec<&str>)> = vec![
            (vec![], 0, 0, vec![]),
            (vec![("a", mark(false)), ("b", mark(true))], 2, 1, vec!["a"]),
            // a node upgraded, then another selected
            (
                vec![("a", mark(false)), ("a", mark(true)), ("c", mark(false))],
                2,
                1,
                vec!["c"],
            ),
            // an upgraded node unselected (or deleted), an unknown one removed
            (vec![("a", mark(true)), ("a", None), ("z", None)], 0, 0, vec![]),
            // an upgraded node's label overwritten by an older hash
            (vec![("a", mark(true)), ("a", mark(false))], 1, 0, vec!["a"]),
            // the same mark twice counts once
            (vec![("a", mark(true)), ("a", mark(true))], 1, 1, vec![]),
            // disabled on a node: neither upgraded nor due
            (
                vec![(
                    "a",
                    Some(Mark {
                        upgraded: false,
                        due: false,
                    }),
                )],
                1,
                0,
                vec![],
            ),
        ];
        for (steps, selected, upgraded, due) in cases {
            let mut tally = Tally::new(basis());
            for (name, m) in steps.clone() {
                tally.set(name, m);
            }
            let mut got: Vec<&str> = tally.due().collect();
            got.sort();
            assert_eq!(
                (tally.selected(), tally.upgraded(), got),
                (selected, upgraded, due),
                "{steps:?}"
            );
        }
    }

    #[test]
    fn changed_nodes_are_noted_per_plan_and_taken_once() {
        let changed = ChangedNodes::<String>::default();
        let (p, q) = ("p".to_string(), "q".to_string());
        changed.note("n1", [&p, &q]);
        changed.note("n2", [&p]);
        changed.note("n1", [&p]);
        let mut got: Vec<String> = changed.take(&p).into_iter().collect();
        got.sort();
        assert_eq!(got, ["n1", "n2"]);
        assert!(changed.take(&p).is_empty(), "taken once");
        assert_eq!(changed.take(&q).into_iter().collect::<Vec<_>>(), ["n1"]);
    }
}
