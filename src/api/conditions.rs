//! Status conditions (metav1.Condition) shared by every resource.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Sets (or adds) condition `type_`, keeping its lastTransitionTime when the
/// status did not change, so the time says when it last flipped.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            observed_generation,
            last_transition_time: Time(now),
        }),
    }
}

/// Is condition `type_` present and True?
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let t0 = Timestamp::from_second(1_000).expect("a time");
        let t1 = Timestamp::from_second(2_000).expect("a time");
        let t2 = Timestamp::from_second(3_000).expect("a time");
        let mut cs = Vec::new();
        set_condition(&mut cs, "Drained", false, "Draining", "3 pods left", Some(1), t0);
        set_condition(&mut cs, "Drained", false, "BlockedByPDB", "pdb x", Some(2), t1);
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, Time(t0));
        assert_eq!(cs[0].reason, "BlockedByPDB");
        assert_eq!(cs[0].observed_generation, Some(2));
        set_condition(&mut cs, "Drained", true, "Drained", "done", Some(2), t2);
        assert_eq!(cs[0].last_transition_time, Time(t2));
        assert!(is_true(&cs, "Drained"));
        assert!(!is_true(&cs, "Other"));
    }
}
