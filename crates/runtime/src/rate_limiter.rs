//! Retry rate limiters for the work queue, mirroring client-go's
//! `workqueue` rate limiters.
//!
//! A limiter answers "how long should this key wait before it is retried?".
//! The default combines two views: a per-key exponential backoff (one broken
//! object must not spin) and a shared token bucket (many broken objects must
//! not flood the API server together). The larger of the two delays wins.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::sync::lock;

/// Decides how long a key waits before it is retried.
pub trait RateLimiter<K>: Send + Sync {
    /// Delay before `key` may be processed again. Records one more failure.
    fn when(&self, key: &K) -> Duration;
    /// Stops tracking `key`: its failure history is cleared.
    fn forget(&self, key: &K);
    /// How many times `key` has been rate limited since the last `forget`.
    fn num_requeues(&self, key: &K) -> u32;
}

impl<K, R: RateLimiter<K> + ?Sized> RateLimiter<K> for Box<R> {
    fn when(&self, key: &K) -> Duration {
        (**self).when(key)
    }
    fn forget(&self, key: &K) {
        (**self).forget(key)
    }
    fn num_requeues(&self, key: &K) -> u32 {
        (**self).num_requeues(key)
    }
}

/// Tunables for the default limiter. `Default` gives client-go's numbers
/// (`DefaultTypedControllerRateLimiter`): 5 ms base, 1000 s cap, 10 qps,
/// burst 100.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimitConfig {
    /// First per-key backoff; doubles on every further failure.
    pub base_delay: Duration,
    /// Upper bound of the per-key backoff.
    pub max_delay: Duration,
    /// Sustained retry rate shared by all keys.
    pub qps: f64,
    /// Retries allowed at once before `qps` spacing applies.
    pub burst: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            base_delay: Duration::from_millis(5),
            max_delay: Duration::from_secs(1000),
            qps: 10.0,
            burst: 100,
        }
    }
}

impl RateLimitConfig {
    /// Builds `max(ItemExponential, TokenBucket)` from these settings.
    pub fn build<K>(&self) -> MaxOf<K>
    where
        K: Clone + Eq + Hash + Send + Sync + 'static,
    {
        MaxOf::new(vec![
            Box::new(ItemExponential::new(self.base_delay, self.max_delay)),
            Box::new(TokenBucket::new(self.qps, self.burst)),
        ])
    }
}

/// The default limiter: client-go's numbers, see [`RateLimitConfig`].
pub fn default_rate_limiter<K>() -> MaxOf<K>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
{
    RateLimitConfig::default().build()
}

/// Per-key exponential backoff: `base * 2^failures`, capped at `max`.
#[derive(Debug)]
pub struct ItemExponential<K> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash> Default for ItemExponential<K> {
    fn default() -> Self {
        let c = RateLimitConfig::default();
        Self::new(c.base_delay, c.max_delay)
    }
}

impl<K: Eq + Hash> ItemExponential<K> {
    /// Waits `base`, doubling per failure of the key, at most `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// `base * 2^exp`, saturating at `max` instead of overflowing.
    fn backoff(&self, exp: u32) -> Duration {
        if self.base.is_zero() {
            return Duration::ZERO;
        }
        if exp >= u128::BITS {
            return self.max;
        }
        match self.base.as_nanos().checked_mul(1u128 << exp) {
            Some(n) if n < self.max.as_nanos() => {
                // n < max, and max fits a Duration, so n fits u64 seconds.
                Duration::new((n / 1_000_000_000) as u64, (n % 1_000_000_000) as u32)
            }
            _ => self.max,
        }
    }
}

impl<K: Clone + Eq + Hash + Send + Sync> RateLimiter<K> for ItemExponential<K> {
    fn when(&self, key: &K) -> Duration {
        let mut failures = lock(&self.failures);
        let count = failures.entry(key.clone()).or_insert(0);
        let exp = *count;
        *count = count.saturating_add(1);
        drop(failures);
        self.backoff(exp)
    }

    fn forget(&self, key: &K) {
        lock(&self.failures).remove(key);
    }

    fn num_requeues(&self, key: &K) -> u32 {
        lock(&self.failures).get(key).copied().unwrap_or(0)
    }
}

/// A token bucket shared by all keys, like `golang.org/x/time/rate`:
/// `when` reserves one token and returns how long until it is available
/// (`Reserve().Delay()`). Tokens may go negative, so waits queue up fairly.
#[derive(Debug)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Option<Instant>,
}

impl Default for TokenBucket {
    fn default() -> Self {
        let c = RateLimitConfig::default();
        Self::new(c.qps, c.burst)
    }
}

impl TokenBucket {
    /// `qps` that is not a finite positive number means "unlimited".
    /// `burst` 0 is treated as 1: x/time/rate would refuse every
    /// reservation, which as a retry delay means "never", and that is never
    /// what a caller configuring a retry limiter wants.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            state: Mutex::new(Bucket {
                tokens: burst,
                last: None,
            }),
        }
    }

    fn unlimited(&self) -> bool {
        !(self.qps.is_finite() && self.qps > 0.0)
    }

    /// Reserves one token at time `now` and returns the wait until it is
    /// available. Taking `now` as an argument keeps tests deterministic.
    pub fn reserve_at(&self, now: Instant) -> Duration {
        if self.unlimited() {
            return Duration::ZERO;
        }
        let mut b = lock(&self.state);
        let elapsed = match b.last {
            // A `now` earlier than the last reservation adds nothing.
            Some(last) => now.saturating_duration_since(last),
            None => Duration::ZERO,
        };
        let tokens = (b.tokens + elapsed.as_secs_f64() * self.qps).min(self.burst) - 1.0;
        b.tokens = tokens;
        if b.last.is_none_or(|last| now > last) {
            b.last = Some(now);
        }
        drop(b);
        if tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::try_from_secs_f64(-tokens / self.qps).unwrap_or(Duration::MAX)
        }
    }
}

impl<K> RateLimiter<K> for TokenBucket {
    fn when(&self, _key: &K) -> Duration {
        self.reserve_at(Instant::now())
    }
    fn forget(&self, _key: &K) {}
    fn num_requeues(&self, _key: &K) -> u32 {
        0
    }
}

/// Combines limiters: the longest delay wins. Every limiter is asked on each
/// `when`, so all of them record the failure (client-go `MaxOfRateLimiter`).
pub struct MaxOf<K> {
    limiters: Vec<Box<dyn RateLimiter<K>>>,
}

impl<K> MaxOf<K> {
    /// Combines `limiters`.
    pub fn new(limiters: Vec<Box<dyn RateLimiter<K>>>) -> Self {
        Self { limiters }
    }
}

impl<K> RateLimiter<K> for MaxOf<K> {
    fn when(&self, key: &K) -> Duration {
        self.limiters
            .iter()
            .map(|l| l.when(key))
            .max()
            .unwrap_or(Duration::ZERO)
    }

    fn forget(&self, key: &K) {
        for l in &self.limiters {
            l.forget(key);
        }
    }

    fn num_requeues(&self, key: &K) -> u32 {
        self.limiters
            .iter()
            .map(|l| l.num_requeues(key))
            .max()
            .unwrap_or(0)
    }
}

impl<K> std::fmt::Debug for MaxOf<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MaxOf")
            .field("limiters", &self.limiters.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn exponential_doubles_then_caps() {
        let l = ItemExponential::new(5 * MS, Duration::from_secs(1000));
        let got: Vec<Duration> = (0..5).map(|_| l.when(&"a")).collect();
        assert_eq!(got, vec![5 * MS, 10 * MS, 20 * MS, 40 * MS, 80 * MS]);
        assert_eq!(l.num_requeues(&"a"), 5);
        // 5ms * 2^18 = 1310.72s > 1000s: the cap applies from there on.
        for _ in 5..18 {
            l.when(&"a");
        }
        assert_eq!(l.when(&"a"), Duration::from_secs(1000));
        assert_eq!(l.num_requeues(&"a"), 19);
    }

    #[test]
    fn exponential_keys_are_independent_and_forget_resets() {
        let l = ItemExponential::new(5 * MS, Duration::from_secs(1));
        l.when(&"a");
        l.when(&"a");
        assert_eq!(l.when(&"b"), 5 * MS);
        assert_eq!(l.when(&"a"), 20 * MS);
        l.forget(&"a");
        assert_eq!(l.num_requeues(&"a"), 0);
        assert_eq!(l.when(&"a"), 5 * MS);
        assert_eq!(l.num_requeues(&"b"), 1);
    }

    #[test]
    fn exponential_never_overflows() {
        let l = ItemExponential::new(Duration::MAX, Duration::MAX);
        assert_eq!(l.when(&1), Duration::MAX);
        assert_eq!(l.when(&1), Duration::MAX);
        let l = ItemExponential::<u32>::new(MS, Duration::from_secs(60));
        assert_eq!(l.backoff(63), Duration::from_secs(60));
        assert_eq!(l.backoff(127), Duration::from_secs(60));
        assert_eq!(l.backoff(u32::MAX), Duration::from_secs(60));
        assert_eq!(l.backoff(0), MS);
        let zero = ItemExponential::<u32>::new(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(zero.backoff(200), Duration::ZERO);
    }

    #[test]
    fn token_bucket_allows_burst_then_spaces_at_qps() {
        let b = TokenBucket::new(10.0, 3);
        let t0 = Instant::now();
        // Burst: three tokens free at the same instant.
        for _ in 0..3 {
            assert_eq!(b.reserve_at(t0), Duration::ZERO);
        }
        // Then one token per 100 ms, reservations queue up behind each other.
        let waits: Vec<Duration> = (0..3).map(|_| b.reserve_at(t0)).collect();
        assert_eq!(waits, vec![100 * MS, 200 * MS, 300 * MS]);
    }

    #[test]
    fn token_bucket_refills_over_time_up_to_burst() {
        let b = TokenBucket::new(10.0, 2);
        let t0 = Instant::now();
        b.reserve_at(t0);
        b.reserve_at(t0);
        assert_eq!(b.reserve_at(t0), 100 * MS); // tokens = -1
        // 100 ms later the debt is paid: the next token is 100 ms away.
        assert_eq!(b.reserve_at(t0 + 100 * MS), 100 * MS);
        // Long idle refills only up to the burst.
        let t1 = t0 + Duration::from_secs(60);
        assert_eq!(b.reserve_at(t1), Duration::ZERO);
        assert_eq!(b.reserve_at(t1), Duration::ZERO);
        assert_eq!(b.reserve_at(t1), 100 * MS);
        // A clock going backwards adds no tokens.
        assert_eq!(b.reserve_at(t0), 200 * MS);
    }

    #[test]
    fn token_bucket_unlimited_and_zero_burst() {
        let inf = TokenBucket::new(f64::INFINITY, 1);
        let t0 = Instant::now();
        for _ in 0..1000 {
            assert_eq!(inf.reserve_at(t0), Duration::ZERO);
        }
        let b = TokenBucket::new(1.0, 0);
        assert_eq!(b.reserve_at(t0), Duration::ZERO);
        assert_eq!(b.reserve_at(t0), Duration::from_secs(1));
    }

    #[test]
    fn max_of_takes_longest_and_forgets_all() {
        let cfg = RateLimitConfig {
            base_delay: 5 * MS,
            max_delay: Duration::from_secs(1000),
            qps: 1.0,
            burst: 1,
        };
        let l: MaxOf<&str> = cfg.build();
        // Bucket: first token free; exponential: 5 ms.
        assert_eq!(l.when(&"a"), 5 * MS);
        // Bucket now owes 1 s, exponential says 10 ms; bucket wins (the
        // real clock moved by microseconds, so allow a little slack).
        let d = l.when(&"b");
        assert!(d > 900 * MS && d <= Duration::from_secs(1), "{d:?}");
        assert_eq!(l.num_requeues(&"a"), 1);
        l.forget(&"a");
        assert_eq!(l.num_requeues(&"a"), 0);
    }

    #[test]
    fn default_config_is_client_go() {
        let c = RateLimitConfig::default();
        assert_eq!(c.base_delay, 5 * MS);
        assert_eq!(c.max_delay, Duration::from_secs(1000));
        assert_eq!(c.qps, 10.0);
        assert_eq!(c.burst, 100);
        let l = default_rate_limiter::<u32>();
        assert_eq!(l.when(&7), 5 * MS);
        assert_eq!(l.when(&7), 10 * MS);
        assert_eq!(l.num_requeues(&7), 2);
    }
}
