//! Injectable faults: what a real cloud does to its callers on a bad day.
//!
//! Set with `POST /faults` (the body replaces the whole set; a missing field
//! means "no such fault"), read with `GET /faults`. They are part of the
//! persisted state, so a restarted sim-cloud keeps misbehaving the same way.
//! The decisions are pure functions of the settings and a random number
//! generator the caller passes in, so tests can pin them down.

use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use super::duration;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Faults {
    /// Fraction of cloud calls answered 500 without doing anything.
    pub error_rate: f64,
    /// Fraction of cloud calls answered 429 (with `Retry-After`) without doing anything.
    pub throttle_rate: f64,
    /// The `Retry-After` of throttled answers, in whole seconds (default 1).
    pub retry_after_seconds: u64,
    /// Fraction of successful creates and deletes whose answer is "lost":
    /// the change is made, but the caller gets a 500. Callers must find out
    /// what happened (idempotent retries) instead of assuming nothing did.
    pub lost_response_rate: f64,
    /// The next N created instances boot but never get a Node.
    pub never_join: u32,
    /// The next N created instances end up Failed instead of Ready (no Node).
    pub fail_boot: u32,
    /// Deletes requested while set take this long instead of the group's delay.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub delete_delay: Option<Duration>,
}

/// No faults at all.
impl Default for Faults {
    fn default() -> Faults {
        Faults {
            error_rate: 0.0,
            throttle_rate: 0.0,
            retry_after_seconds: 1,
            lost_response_rate: 0.0,
            never_join: 0,
            fail_boot: 0,
            delete_delay: None,
        }
    }
}

/// What to do with one incoming cloud call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Handle it normally.
    Serve,
    /// Answer 500 and do nothing.
    Fail,
    /// Answer 429 with this `Retry-After` and do nothing.
    Throttle { retry_after_seconds: u64 },
}

impl Faults {
    /// Rates must be fractions and, together, at most 1.
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("errorRate", self.error_rate),
            ("throttleRate", self.throttle_rate),
            ("lostResponseRate", self.lost_response_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1, not {rate}"));
            }
        }
        if self.error_rate + self.throttle_rate > 1.0 {
            return Err("errorRate + throttleRate must not exceed 1".into());
        }
        Ok(())
    }

    /// Decides the fate of one call with a single draw, so the error and
    /// throttle rates are exact fractions of all calls and never overlap.
    pub fn verdict<R: Rng + ?Sized>(&self, rng: &mut R) -> Verdict {
        if self.error_rate <= 0.0 && self.throttle_rate <= 0.0 {
            return Verdict::Serve;
        }
        let draw: f64 = rng.random();
        if draw < self.error_rate {
            Verdict::Fail
        } else if draw < self.error_rate + self.throttle_rate {
            Verdict::Throttle {
                retry_after_seconds: self.retry_after_seconds,
            }
        } else {
            Verdict::Serve
        }
    }

    /// Decides whether the answer to a change that was made gets lost.
    pub fn loses_response<R: Rng + ?Sized>(&self, rng: &mut R) -> bool {
        self.lost_response_rate > 0.0 && rng.random::<f64>() < self.lost_response_rate
    }

    /// Consumes one "never join" if any is left; true when the new instance gets it.
    pub fn take_never_join(&mut self) -> bool {
        take(&mut self.never_join)
    }

    /// Consumes one "fail boot" if any is left; true when the new instance gets it.
    pub fn take_fail_boot(&mut self) -> bool {
        take(&mut self.fail_boot)
    }
}

fn take(counter: &mut u32) -> bool {
    if *counter == 0 {
        return false;
    }
    *counter -= 1;
    true
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;

    /// A generator whose every `f64` draw is `value` (rand turns the top 53
    /// bits of a u64 into a float in [0, 1)).
    struct Fixed(f64);

    impl rand::RngCore for Fixed {
        fn next_u32(&mut self) -> u32 {
            (self.next_u64() >> 32) as u32
        }
        fn next_u64(&mut self) -> u64 {
            ((self.0 * (1u64 << 53) as f64) as u64) << 11
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            rand::rand_core::impls::fill_bytes_via_next(self, dest)
        }
    }

    fn faults(error_rate: f64, throttle_rate: f64) -> Faults {
        Faults {
            error_rate,
            throttle_rate,
            retry_after_seconds: 2,
            ..Faults::default()
        }
    }

    #[test]
    fn one_draw_splits_into_fail_throttle_serve() {
        let f = faults(0.2, 0.3);
        assert_eq!(f.verdict(&mut Fixed(0.1)), Verdict::Fail);
        assert_eq!(
            f.verdict(&mut Fixed(0.25)),
            Verdict::Throttle {
                retry_after_seconds: 2
            }
        );
        assert_eq!(
            f.verdict(&mut Fixed(0.49)),
            Verdict::Throttle {
                retry_after_seconds: 2
            }
        );
        assert_eq!(f.verdict(&mut Fixed(0.5)), Verdict::Serve);
        assert_eq!(f.verdict(&mut Fixed(0.99)), Verdict::Serve);
    }

    #[test]
    fn no_faults_always_serve_and_full_rates_always_hit() {
        assert_eq!(Faults::default().verdict(&mut Fixed(0.0)), Verdict::Serve);
        assert_eq!(faults(1.0, 0.0).verdict(&mut Fixed(0.999)), Verdict::Fail);
        assert!(matches!(
            faults(0.0, 1.0).verdict(&mut Fixed(0.999)),
            Verdict::Throttle { .. }
        ));
    }

    #[test]
    fn rates_hold_over_many_calls() {
        let f = faults(0.1, 0.2);
        let mut rng = StdRng::seed_from_u64(7);
        let (mut failed, mut throttled) = (0, 0);
        for _ in 0..10_000 {
            match f.verdict(&mut rng) {
                Verdict::Fail => failed += 1,
                Verdict::Throttle { .. } => throttled += 1,
                Verdict::Serve => {}
            }
        }
        assert!((800..1200).contains(&failed), "failed {failed}");
        assert!((1700..2300).contains(&throttled), "throttled {throttled}");
    }

    #[test]
    fn lost_responses_follow_their_rate() {
        let f = Faults {
            lost_response_rate: 0.5,
            ..Faults::default()
        };
        assert!(f.loses_response(&mut Fixed(0.4)));
        assert!(!f.loses_response(&mut Fixed(0.6)));
        assert!(!Faults::default().loses_response(&mut Fixed(0.0)));
    }

    #[test]
    fn counters_are_consumed_one_instance_at_a_time() {
        let mut f = Faults {
            never_join: 2,
            fail_boot: 1,
            ..Faults::default()
        };
        assert!(f.take_never_join());
        assert!(f.take_never_join());
        assert!(!f.take_never_join());
        assert!(f.take_fail_boot());
        assert!(!f.take_fail_boot());
    }

    #[test]
    fn validation_rejects_impossible_rates() {
        assert!(faults(0.5, 0.5).validate().is_ok());
        assert!(faults(0.6, 0.5).validate().is_err());
        assert!(faults(-0.1, 0.0).validate().is_err());
        let lost = Faults {
            lost_response_rate: 1.5,
            ..Faults::default()
        };
        assert!(lost.validate().is_err());
    }

    #[test]
    fn json_uses_the_documented_names() {
        let f: Faults = serde_json::from_str(
            r#"{"errorRate":0.1,"throttleRate":0.2,"retryAfterSeconds":3,"neverJoin":1,"deleteDelay":"5s"}"#,
        )
        .expect("parses");
        assert_eq!(f.delete_delay, Some(Duration::from_secs(5)));
        assert_eq!(f.never_join, 1);
        let defaults: Faults = serde_json::from_str("{}").expect("parses");
        assert_eq!(defaults, Faults::default());
        assert_eq!(defaults.retry_after_seconds, 1);
        let back: Faults =
            serde_json::from_value(serde_json::to_value(&f).expect("serializes")).expect("parses");
        assert_eq!(back, f);
    }
}
