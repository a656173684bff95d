//! When a rollout stops itself (pure, table tested): after
//! `haltAfterFailedJoins` new nodes in a row were given up for its target
//! (never joined within joinTimeout, or failed at the cloud), or once
//! `haltAfterUnreadyPods` pods on its new nodes stayed unready past
//! podReadyTimeout while their workloads' pods are Ready elsewhere, the image is
//! taken to be bad and the planner creates no instance and retires no node
//! until a person decides: the image set back (every replaced node returns
//! to it, with the same safety), the threshold raised, or the NodeVersion
//! annotated `nodewarden.dev/resume-rollout` with a new value.
//!
//! A join of the target's clears the count while the rollout runs: a cloud
//! that loses an instance now and then does not halt a good image.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::update::halt::RolloutHalt;

/// Names kept in each of the record's lists (a halt needs a few; the
/// message shows five).
const KEPT: usize = 20;

/// What one pass saw of the target's new nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JoinOutcomes {
    /// New nodes of the target given up, as their PendingNodes show now.
    pub failed: Vec<String>,
    /// A new node of the target joined (its PendingNode still tracks it).
    pub joined: bool,
    /// Pods on the target's new nodes unready past podReadyTimeout while
    /// their workloads' pods are Ready elsewhere, as seen now.
    pub unready_pods: Vec<String>,
}

/// When a rollout halts (0: never on that count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// `haltAfterFailedJoins`.
    pub failed_joins: u32,
    /// `haltAfterUnreadyPods`.
    pub unready_pods: u32,
}

impl Thresholds {
    fn over(&self, halt: &RolloutHalt) -> bool {
        let reached = |threshold: u32, count: usize| threshold > 0 && count >= threshold as usize;
        reached(self.failed_joins, halt.failed_joins.len())
            || reached(self.unready_pods, halt.unready_pods.len())
    }
}

/// The record after a pass that saw `seen` for `target`, given the record
/// before (`prev`), the threshold in force (0: never halt), the resume
/// annotation's value and the time. None when there is nothing to keep.
pub fn next(
    prev: Option<&RolloutHalt>,
    target: &str,
    seen: &JoinOutcomes,
    thresholds: Thresholds,
    resume: Option<&str>,
    now: &Time,
) -> Option<RolloutHalt> {
    let mut halt = match prev {
        Some(p) if p.target == target => p.clone(),
        // A new target starts afresh; the annotation honoured stays honoured.
        _ => RolloutHalt {
            target: target.to_string(),
            resumed_with: prev.and_then(|p| p.resumed_with.clone()),
            ..Default::default()
        },
    };
    if let Some(value) = resume
        && halt.resumed_with.as_deref() != Some(value)
    {
        forgive(&mut halt);
        forgive_pods(&mut halt);
        halt.halted_at = None;
        halt.resumed_with = Some(value.to_string());
    }
    for name in &seen.failed {
        if !halt.failed_joins.contains(name) && !halt.forgiven.contains(name) {
            halt.failed_joins.push(name.clone());
        }
    }
    // A halt ends by a person's decision only, not by a late join.
    if seen.joined && !halt.is_halted() {
        forgive(&mut halt);
    }
    // Unready pods count while they are unready (a slow start is no bad
    // image); once halted, every one that halted it stays as evidence.
    let unready = seen.unready_pods.iter().filter(|p| !halt.forgiven.contains(p));
    match halt.is_halted() {
        true => {
            let new: Vec<String> = unready
                .filter(|p| !halt.unready_pods.contains(p))
                .cloned()
                .collect();
            halt.unready_pods.extend(new);
        }
        false => halt.unready_pods = unready.cloned().collect(),
    }
    // A forgiven failure whose PendingNode (or pod) is gone cannot be seen again.
    halt.forgiven
        .retain(|name| seen.failed.contains(name) || seen.unready_pods.contains(name));
    let over = thresholds.over(&halt);
    halt.halted_at = match (over, halt.halted_at.take()) {
        (true, Some(since)) => Some(since),
        (true, None) => Some(now.clone()),
        (false, _) => None,
    };
    let excess = halt.failed_joins.len().saturating_sub(KEPT);
    halt.failed_joins.drain(..excess);
    let excess = halt.unready_pods.len().saturating_sub(KEPT);
    halt.unready_pods.drain(..excess);
    let empty = halt.failed_joins.is_empty()
        && halt.unready_pods.is_empty()
        && halt.forgiven.is_empty()
        && !halt.is_halted()
        && halt.resumed_with.is_none();
    (!empty).then_some(halt)
}

/// Every failed join counted so far is forgiven.
fn forgive(halt: &mut RolloutHalt) {
    halt.forgiven.append(&mut halt.failed_joins);
    let excess = halt.forgiven.len().saturating_sub(KEPT);
    halt.forgiven.drain(..excess);
}

/// Every unready pod counted so far is forgiven (a resume: the person who
/// resumes has seen them).
fn forgive_pods(halt: &mut RolloutHalt) {
    halt.forgiven.append(&mut halt.unready_pods);
    let excess = halt.forgiven.len().saturating_sub(KEPT);
    halt.forgiven.drain(..excess);
}

/// What the Degraded condition says of a halt: the evidence and the ways
/// on. `previous`: the image most outdated nodes still run, if known.
pub fn message(halt: &RolloutHalt, image: &str, previous: Option<&str>) -> String {
    const SHOWN: usize = 5;
    let last = |names: &[String]| {
        names
            .iter()
            .rev()
            .take(SHOWN)
            .rev()
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut evidence = Vec::new();
    if !halt.failed_joins.is_empty() {
        evidence.push(format!(
            "{} new node(s) in a row of image {image} were given up (never joined within spec.rollout.joinTimeout, or failed at the cloud): {}",
            halt.failed_joins.len(),
            last(&halt.failed_joins)
        ));
    }
    if !halt.unready_pods.is_empty() {
        evidence.push(format!(
            "{} pod(s) on new nodes of image {image} stayed unready past spec.rollout.podReadyTimeout while their workloads' pods are Ready on other nodes: {}",
            halt.unready_pods.len(),
            last(&halt.unready_pods)
        ));
    }
    let back = match previous {
        Some(old) => format!("set spec.image back to {old} to return every replaced node to it"),
        None => "set spec.image back to the previous image to return every replaced node to it".to_string(),
    };
    format!(
        "halted: {}; no instance is created and no node retired. To go on: {back}, or fix the cause and annotate the NodeVersion {}=<a new value>",
        evidence.join("; "),
        crate::api::update::halt::RESUME_ANNOTATION,
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn joins(failed_joins: u32) -> Thresholds {
        Thresholds {
            failed_joins,
            unready_pods: 0,
        }
    }

    fn at(secs: i64) -> Time {
        Time(Timestamp::from_second(secs).expect("a time"))
    }

    fn failed(names: &[&str]) -> JoinOutcomes {
        JoinOutcomes {
            failed: names.iter().map(|n| n.to_string()).collect(),
            joined: false,
            unready_pods: Vec::new(),
        }
    }

    fn record(target: &str, failed: &[&str], forgiven: &[&str], halted: Option<i64>) -> RolloutHalt {
        RolloutHalt {
            target: target.into(),
            failed_joins: failed.iter().map(|n| n.to_string()).collect(),
            forgiven: forgiven.iter().map(|n| n.to_string()).collect(),
            halted_at: halted.map(at),
            resumed_with: None,
            unready_pods: Vec::new(),
        }
    }

    #[test]
    fn failures_in_a_row_halt_at_the_threshold_and_a_join_clears_them_first() {
        struct Case {
            what: &'static str,
            prev: Option<RolloutHalt>,
            seen: JoinOutcomes,
            threshold: u32,
            want: Option<RolloutHalt>,
        }
        let cases = [
            Case {
                what: "nothing seen, nothing kept",
                prev: None,
                seen: failed(&[]),
                threshold: 3,
                want: None,
            },
            Case {
                what: "two failures are counted, not yet a halt",
                prev: None,
                seen: failed(&["a", "b"]),
                threshold: 3,
                want: Some(record("img", &["a", "b"], &[], None)),
            },
            Case {
                what: "the third in a row halts, at this pass's time",
                prev: Some(record("img", &["a", "b"], &[], None)),
                seen: failed(&["b", "c"]),
                threshold: 3,
                want: Some(record("img", &["a", "b", "c"], &[], Some(100))),
            },
            Case {
                what: "a failure seen again is not counted twice",
                prev: Some(record("img", &["a"], &[], None)),
                seen: failed(&["a"]),
                threshold: 2,
                want: Some(record("img", &["a"], &[], None)),
            },
            Case {
                what: "a join forgives the failures before it; their PendingNodes still seen",
                prev: Some(record("img", &["a", "b"], &[], None)),
                seen: JoinOutcomes {
                    failed: vec!["a".into(), "b".into()],
                    joined: true,
                    unready_pods: Vec::new(),
                },
                threshold: 3,
                want: Some(record("img", &[], &["a", "b"], None)),
            },
            Case {
                what: "a forgiven failure stays forgiven while seen, and is forgotten once gone",
                prev: Some(record("img", &[], &["a", "b"], None)),
                seen: failed(&["b", "c"]),
                threshold: 3,
                want: Some(record("img", &["c"], &["b"], None)),
            },
            Case {
                what: "a halt stays through a late join, since kept",
                prev: Some(record("img", &["a", "b", "c"], &[], Some(50))),
                seen: JoinOutcomes {
                    failed: vec![],
                    joined: true,
                    unready_pods: Vec::new(),
                },
                threshold: 3,
                want: Some(record("img", &["a", "b", "c"], &[], Some(50))),
            },
            Case {
                what: "a threshold raised above the count lets the rollout go on",
                prev: Some(record("img", &["a", "b", "c"], &[], Some(50))),
                seen: failed(&[]),
                threshold: 5,
                want: Some(record("img", &["a", "b", "c"], &[], None)),
            },
            Case {
                what: "threshold 0 never halts",
                prev: None,
                seen: failed(&["a", "b", "c", "d"]),
                threshold: 0,
                want: Some(record("img", &["a", "b", "c", "d"], &[], None)),
            },
            Case {
                what: "a new target starts afresh (the old target's failures are not its own)",
                prev: Some(record("old", &["a", "b", "c"], &[], Some(50))),
                seen: failed(&[]),
                threshold: 3,
                want: None,
            },
        ];
        for case in cases {
            let got = next(
                case.prev.as_ref(),
                "img",
                &case.seen,
                joins(case.threshold),
                None,
                &at(100),
            );
            assert_eq!(got, case.want, "{}", case.what);
        }
    }

    #[test]
    fn a_new_resume_value_forgives_once_and_the_same_value_again_does_nothing() {
        let halted = record("img", &["a", "b", "c"], &[], Some(50));
        let seen = failed(&["b", "c"]);
        let resumed = next(Some(&halted), "img", &seen, joins(3), Some("1"), &at(100)).expect("a record");
        assert!(!resumed.is_halted(), "resumed: {resumed:?}");
        assert_eq!(resumed.failed_joins, Vec::<String>::new());
        assert_eq!(resumed.forgiven, vec!["b".to_string(), "c".to_string()]);
        assert_eq!(resumed.resumed_with.as_deref(), Some("1"));

        // Two more failures after the resume: counted from zero.
        let later = next(
            Some(&resumed),
            "img",
            &failed(&["b", "c", "d"]),
            joins(3),
            Some("1"),
            &at(110),
        )
        .expect("a record");
        assert_eq!(later.failed_joins, vec!["d".to_string()]);
        assert!(!later.is_halted());
        // The same value once more is no new resume: the count goes on to a halt.
        let again = next(
            Some(&later),
            "img",
            &failed(&["d", "e", "f"]),
            joins(3),
            Some("1"),
            &at(120),
        )
        .expect("a record");
        assert_eq!(again.failed_joins.len(), 3);
        assert_eq!(again.halted_at, Some(at(120)));
    }

    #[test]
    fn unready_pods_count_while_unready_halt_at_their_threshold_and_stay_as_evidence() {
        let both = Thresholds {
            failed_joins: 3,
            unready_pods: 2,
        };
        let pods = |names: &[&str]| JoinOutcomes {
            unready_pods: names.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        let one = next(None, "img", &pods(&["ns/a"]), both, None, &at(10)).expect("a record");
        assert_eq!((one.unready_pods.len(), one.is_halted()), (1, false));
        // Ready again before the threshold: no longer counted.
        assert_eq!(next(Some(&one), "img", &pods(&[]), both, None, &at(11)), None);
        // A join does not forgive pods.
        let mut joined = pods(&["ns/a", "ns/b"]);
        joined.joined = true;
        let halted = next(Some(&one), "img", &joined, both, None, &at(12)).expect("a record");
        assert_eq!(halted.halted_at, Some(at(12)));
        // Halted: the evidence stays when the pods go, and grows.
        let later = next(Some(&halted), "img", &pods(&["ns/c"]), both, None, &at(13)).expect("a record");
        assert_eq!(later.unready_pods, ["ns/a", "ns/b", "ns/c"]);
        assert_eq!(later.halted_at, Some(at(12)));
        // A resume forgives them while they are seen; 0 never halts on pods.
        let resumed =
            next(Some(&later), "img", &pods(&["ns/a"]), both, Some("r1"), &at(14)).expect("a record");
        assert!(
            !resumed.is_halted() && resumed.unready_pods.is_empty(),
            "{resumed:?}"
        );
        assert_eq!(resumed.forgiven, ["ns/a"]);
        let never = next(
            None,
            "img",
            &pods(&["ns/a", "ns/b", "ns/c"]),
            joins(3),
            None,
            &at(15),
        )
        .expect("a record");
        assert!(!never.is_halted());
        let text = message(&halted, "img-2", Some("img-1"));
        assert!(text.contains("2 pod(s) on new nodes of image img-2"), "{text}");
        assert!(text.contains("ns/a, ns/b"), "{text}");
        assert!(!text.contains("given up"), "{text}");
    }

    #[test]
    fn the_lists_stay_bounded() {
        let many: Vec<String> = (0..50).map(|i| format!("n{i:02}")).collect();
        let seen = JoinOutcomes {
            failed: many.clone(),
            ..Default::default()
        };
        let halt = next(None, "img", &seen, joins(0), None, &at(1)).expect("a record");
        assert_eq!(halt.failed_joins.len(), KEPT);
        assert_eq!(halt.failed_joins.last(), many.last(), "the newest kept");
        let forgiven = next(
            Some(&halt),
            "img",
            &JoinOutcomes {
                failed: many,
                joined: true,
                unready_pods: Vec::new(),
            },
            joins(0),
            None,
            &at(2),
        )
        .expect("a record");
        assert!(forgiven.forgiven.len() <= KEPT && forgiven.failed_joins.is_empty());
    }

    #[test]
    fn the_message_names_the_nodes_and_the_ways_on() {
        let halt = record("img", &["a", "b", "c"], &[], Some(1));
        let text = message(&halt, "img-2", Some("img-1"));
        assert!(text.contains("3 new node(s) in a row of image img-2"), "{text}");
        assert!(text.contains(": a, b, c;"), "{text}");
        assert!(text.contains("set spec.image back to img-1"), "{text}");
        assert!(text.contains("nodewarden.dev/resume-rollout"), "{text}");
    }
}
