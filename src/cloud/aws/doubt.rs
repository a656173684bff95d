//! Capacity changes whose answer never came. A SetDesiredCapacity or a
//! terminate-with-decrement that timed out may still be carried out later,
//! after a change sent since: a create's "desired + 1", computed before a
//! terminate and landing after it, undoes the terminate's decrement, and
//! the group starts an instance nobody asked for (seen in CI with the
//! cloud paused mid-rollout: a tenth node where nine were rolled). So no
//! capacity change is sent while an earlier one is in doubt: it is first
//! seen to have landed, or it has had longer than any request waits before
//! the cloud acts on it or drops it.

use std::time::Duration;

use tokio::time::Instant;

/// How long a request without an answer may still land. AWS's front ends
/// close a request long before this; moto paused in a test resumes well
/// within it.
pub const DOUBT_LIMIT: Duration = Duration::from_secs(60);

/// A capacity change sent without an answer.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    /// A group's desired capacity set from `before`.
    Desired { group: String, before: i32 },
    /// An instance terminated in its group, decrementing its capacity.
    Terminate { instance: String },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Desired { group, before } => write!(
                f,
                "the desired capacity of Auto Scaling group {group} set from {before}"
            ),
            Change::Terminate { instance } => write!(f, "the termination of instance {instance}"),
        }
    }
}

/// A change in doubt and when it was sent.
#[derive(Clone, Debug, PartialEq)]
pub struct InDoubt {
    pub change: Change,
    pub sent: Instant,
}

/// What the cloud shows now of a change in doubt.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Seen {
    /// The group's desired capacity.
    Desired(i32),
    /// Whether the instance is still in service in a group.
    InService(bool),
}

/// What becomes of a change in doubt.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// Its effect shows: it is no longer in doubt.
    Landed,
    /// No effect after [`DOUBT_LIMIT`]: it was dropped.
    Dropped,
    /// It may still land: no other capacity change may be sent yet.
    Wait,
}

/// Judges a change in doubt by what the cloud shows `at` a moment.
pub fn judge(doubt: &InDoubt, seen: Seen, at: Instant) -> Verdict {
    let landed = match (&doubt.change, seen) {
        // Any move from the value it was computed from: it landed, or
        // someone else changed the group (then it lands on their value, or
        // has already).
        (Change::Desired { before, .. }, Seen::Desired(now)) => now != *before,
        (Change::Terminate { .. }, Seen::InService(still)) => !still,
        // A mismatched observation tells nothing.
        _ => false,
    };
    if landed {
        Verdict::Landed
    } else if at.saturating_duration_since(doubt.sent) >= DOUBT_LIMIT {
        Verdict::Dropped
    } else {
        Verdict::Wait
    }
}

/// Adds `change`, sent at `sent`, to `doubts` when `e` leaves its outcome
/// unknown.
pub fn note(doubts: &mut Vec<InDoubt>, e: &super::CloudError, change: Change, sent: Instant) {
    if outcome_unknown(e) {
        doubts.push(InDoubt { change, sent });
    }
}

/// Whether an error leaves the call's outcome unknown: no answer, or a
/// server failure (AWS says such a request may or may not have been
/// carried out).
pub fn outcome_unknown(e: &super::CloudError) -> bool {
    matches!(
        e,
        super::CloudError::Timeout { .. }
            | super::CloudError::Transport(_)
            | super::CloudError::Server { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_in_doubt_holds_the_next_until_it_shows_or_expires() {
        let sent = Instant::now();
        let desired = InDoubt {
            change: Change::Desired {
                group: "g".into(),
                before: 4,
            },
            sent,
        };
        let terminate = InDoubt {
            change: Change::Terminate {
                instance: "i-1".into(),
            },
            sent,
        };
        let soon = sent + Duration::from_secs(5);
        let late = sent + DOUBT_LIMIT;
        for (doubt, seen, at, verdict) in [
            (&desired, Seen::Desired(4), soon, Verdict::Wait),
            (&desired, Seen::Desired(5), soon, Verdict::Landed),
            (&desired, Seen::Desired(3), soon, Verdict::Landed),
            (&desired, Seen::Desired(4), late, Verdict::Dropped),
            (&desired, Seen::InService(false), soon, Verdict::Wait),
            (&terminate, Seen::InService(true), soon, Verdict::Wait),
            (&terminate, Seen::InService(false), soon, Verdict::Landed),
            (&terminate, Seen::InService(true), late, Verdict::Dropped),
            (&terminate, Seen::Desired(1), soon, Verdict::Wait),
        ] {
            assert_eq!(judge(doubt, seen, at), verdict, "{doubt:?} {seen:?}");
        }
    }

    #[test]
    fn no_answer_and_server_failures_leave_the_outcome_unknown() {
        use super::super::CloudError;
        assert!(outcome_unknown(&CloudError::Timeout {
            after: Duration::from_secs(3)
        }));
        assert!(outcome_unknown(&CloudError::Transport("reset".into())));
        assert!(outcome_unknown(&CloudError::Server {
            status: 500,
            message: String::new()
        }));
        assert!(!outcome_unknown(&CloudError::Throttled { retry_after: None }));
        assert!(!outcome_unknown(&CloudError::Rejected {
            status: 400,
            message: String::new()
        }));
    }
}
