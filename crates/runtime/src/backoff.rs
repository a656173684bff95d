//! Jittered exponential backoff for API retries (client-go's reflector
//! backoff): 800 ms doubling to 30 s, plus up to 100% jitter, reset once the
//! caller has been healthy for 2 minutes.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The shape of a [`Backoff`]; the default is client-go's reflector backoff.
#[derive(Clone, Copy, Debug)]
pub struct BackoffConfig {
    /// The first delay (before jitter).
    pub initial: Duration,
    /// The longest delay (before jitter).
    pub max: Duration,
    /// A failure after this long without one starts again from `initial`.
    pub reset_after: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        BackoffConfig {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(120),
        }
    }
}

/// One caller's backoff state: the delays so far and the last failure.
pub struct Backoff {
    config: BackoffConfig,
    delays: ExponentialBackoff,
    last_failure: Option<Instant>,
}

impl Backoff {
    /// A backoff that has seen no failure yet.
    pub fn new(config: BackoffConfig) -> Self {
        Backoff {
            config,
            delays: Self::build(&config),
            last_failure: None,
        }
    }

    fn build(config: &BackoffConfig) -> ExponentialBackoff {
        // without_max_times: a reflector retries for as long as it runs.
        ExponentialBuilder::default()
            .with_min_delay(config.initial)
            .with_max_delay(config.max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// The delay before the next attempt after a failure at `now`.
    pub fn next_delay(&mut self, now: Instant) -> Duration {
        if self
            .last_failure
            .is_some_and(|t| now.duration_since(t) >= self.config.reset_after)
        {
            self.delays = Self::build(&self.config);
        }
        self.last_failure = Some(now);
        // The iterator is unbounded (without_max_times); `max` is the fallback anyway.
        self.delays.next().unwrap_or(self.config.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_with_jitter_and_caps() {
        let mut b = Backoff::new(BackoffConfig::default());
        let now = Instant::now();
        let first = b.next_delay(now);
        assert!(
            first >= Duration::from_millis(800) && first < Duration::from_millis(1600),
            "{first:?}"
        );
        let second = b.next_delay(now);
        assert!(
            second >= Duration::from_millis(1600) && second < Duration::from_millis(3200),
            "{second:?}"
        );
        for _ in 0..20 {
            let d = b.next_delay(now);
            assert!(
                d < Duration::from_secs(60),
                "capped at 30 s plus jitter, got {d:?}"
            );
        }
        assert!(b.next_delay(now) >= Duration::from_secs(30));
    }

    #[test]
    fn resets_after_two_healthy_minutes() {
        let mut b = Backoff::new(BackoffConfig::default());
        let t0 = Instant::now();
        for _ in 0..10 {
            b.next_delay(t0);
        }
        // A failure 1 minute later still backs off long...
        assert!(b.next_delay(t0 + Duration::from_secs(60)) >= Duration::from_secs(30));
        // ...but after 2 minutes without failure it starts over.
        let d = b.next_delay(t0 + Duration::from_secs(181));
        assert!(d < Duration::from_millis(1600), "{d:?}");
    }
}
