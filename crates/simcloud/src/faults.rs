//! Injectable faults: what a real cloud does to its callers on a bad day.
//!
//! The settings are the protocol's [`Faults`] (set with `POST /faults`, read
//! with `GET /faults`); this module is how the sim-cloud acts on them. They
//! are part of the persisted state, so a restarted sim-cloud keeps
//! misbehaving the same way. The decisions are pure functions of the settings
//! and a random number generator the caller passes in, so tests can pin them
//! down.

use rand::Rng;

use nodewarden_simwire::Faults;

/// What to do with one incoming cloud call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Handle it normally.
    Serve,
    /// Answer 500 and do nothing.
    Fail,
    /// Answer 429 with this `Retry-After` and do nothing.
    Throttle {
        /// The `Retry-After` to send, in whole seconds.
        retry_after_seconds: u64,
    },
}

/// Decides the fate of one call with a single draw, so the error and
/// throttle rates are exact fractions of all calls and never overlap.
pub fn verdict<R: Rng + ?Sized>(faults: &Faults, rng: &mut R) -> Verdict {
    if faults.error_rate <= 0.0 && faults.throttle_rate <= 0.0 {
        return Verdict::Serve;
    }
    let draw: f64 = rng.random();
    if draw < faults.error_rate {
        Verdict::Fail
    } else if draw < faults.error_rate + faults.throttle_rate {
        Verdict::Throttle {
            retry_after_seconds: faults.retry_after_seconds,
        }
    } else {
        Verdict::Serve
    }
}

/// Decides whether the answer to a change that was made gets lost.
pub fn loses_response<R: Rng + ?Sized>(faults: &Faults, rng: &mut R) -> bool {
    faults.lost_response_rate > 0.0 && rng.random::<f64>() < faults.lost_response_rate
}

/// Consumes one "never join" if any is left; true when the new instance gets it.
pub fn take_never_join(faults: &mut Faults) -> bool {
    take(&mut faults.never_join)
}

/// Consumes one "fail boot" if any is left; true when the new instance gets it.
pub fn take_fail_boot(faults: &mut Faults) -> bool {
    take(&mut faults.fail_boot)
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
        assert_eq!(verdict(&f, &mut Fixed(0.1)), Verdict::Fail);
        assert_eq!(
            verdict(&f, &mut Fixed(0.25)),
            Verdict::Throttle {
                retry_after_seconds: 2
            }
        );
        assert_eq!(
            verdict(&f, &mut Fixed(0.49)),
            Verdict::Throttle {
                retry_after_seconds: 2
            }
        );
        assert_eq!(verdict(&f, &mut Fixed(0.5)), Verdict::Serve);
        assert_eq!(verdict(&f, &mut Fixed(0.99)), Verdict::Serve);
    }

    #[test]
    fn no_faults_always_serve_and_full_rates_always_hit() {
        assert_eq!(verdict(&Faults::default(), &mut Fixed(0.0)), Verdict::Serve);
        assert_eq!(verdict(&faults(1.0, 0.0), &mut Fixed(0.999)), Verdict::Fail);
        assert!(matches!(
            verdict(&faults(0.0, 1.0), &mut Fixed(0.999)),
            Verdict::Throttle { .. }
        ));
    }

    #[test]
    fn rates_hold_over_many_calls() {
        let f = faults(0.1, 0.2);
        let mut rng = StdRng::seed_from_u64(7);
        let (mut failed, mut throttled) = (0, 0);
        for _ in 0..10_000 {
            match verdict(&f, &mut rng) {
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
        assert!(loses_response(&f, &mut Fixed(0.4)));
        assert!(!loses_response(&f, &mut Fixed(0.6)));
        assert!(!loses_response(&Faults::default(), &mut Fixed(0.0)));
    }

    #[test]
    fn counters_are_consumed_one_instance_at_a_time() {
        let mut f = Faults {
            never_join: 2,
            fail_boot: 1,
            ..Faults::default()
        };
        assert!(take_never_join(&mut f));
        assert!(take_never_join(&mut f));
        assert!(!take_never_join(&mut f));
        assert!(take_fail_boot(&mut f));
        assert!(!take_fail_boot(&mut f));
    }
}
