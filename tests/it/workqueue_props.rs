//! Property tests for the work queue and its rate limiters, against small
//! reference models of client-go's behaviour.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use futures::FutureExt;
use nodewarden::runtime::rate_limiter::{ItemExponential, RateLimiter, TokenBucket};
use nodewarden::runtime::workqueue::WorkQueue;
use proptest::prelude::*;
use tokio::time::Instant;

/// Counts failures like a real limiter but never delays, so rate-limited
/// adds are immediate and the model needs no clock.
#[derive(Default)]
struct CountingNoDelay(Mutex<HashMap<u8, u32>>);

impl RateLimiter<u8> for CountingNoDelay {
    fn when(&self, key: &u8) -> Duration {
        *self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(*key)
            .or_default() += 1;
        Duration::ZERO
    }
    fn forget(&self, key: &u8) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
    fn num_requeues(&self, key: &u8) -> u32 {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// client-go's queue, written as plainly as possible.
#[derive(Default)]
struct Model {
    queue: VecDeque<u8>,
    dirty: HashSet<u8>,
    processing: HashSet<u8>,
    failures: HashMap<u8, u32>,
}

impl Model {
    fn add(&mut self, k: u8) {
        if self.dirty.insert(k) && !self.processing.contains(&k) {
            self.queue.push_back(k);
        }
    }
    fn get(&mut self) -> Option<u8> {
        let k = self.queue.pop_front()?;
        self.dirty.remove(&k);
        self.processing.insert(k);
        Some(k)
    }
    fn done(&mut self, k: u8) {
        if self.processing.remove(&k) && self.dirty.contains(&k) {
            self.queue.push_back(k);
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Add(u8),
    AddRateLimited(u8),
    Get,
    /// Done for the n-th (mod len) key currently processing.
    Done(usize),
    /// Done for a key that may not be processing at all.
    StrayDone(u8),
    Forget(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..8;
    prop_oneof![
        4 => key.clone().prop_map(Op::Add),
        1 => key.clone().prop_map(Op::AddRateLimited),
        4 => Just(Op::Get),
        3 => any::<usize>().prop_map(Op::Done),
        1 => key.clone().prop_map(Op::StrayDone),
        1 => key.prop_map(Op::Forget),
    ]
}

/// A non-blocking get: `Some(k)` if a key is ready now.
fn try_get(q: &WorkQueue<u8>) -> Option<u8> {
    match q.get().now_or_never() {
        Some(Some(k)) => Some(k),
        Some(None) => panic!("queue unexpectedly closed"),
        None => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any interleaving of add / get / done behaves exactly like the model:
    /// same keys in the same order, same depth, no key handed out while it
    /// is processing, and failures counted only by rate-limited adds.
    #[test]
    fn queue_matches_client_go_model(ops in prop::collection::vec(op(), 0..200)) {
        let q = WorkQueue::new("model", CountingNoDelay::default(), None);
        let mut m = Model::default();
        let mut processing: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                Op::Add(k) => { q.add(k); m.add(k); }
                Op::AddRateLimited(k) => {
                    q.add_rate_limited(k);
                    *m.failures.entry(k).or_default() += 1;
                    m.add(k);
                }
                Op::Get => {
                    let got = try_get(&q);
                    prop_assert_eq!(got, m.get());
                    if let Some(k) = got {
                        prop_assert!(!processing.contains(&k), "{} handed out twice", k);
                        processing.push(k);
                    }
                }
                Op::Done(i) => {
                    if !processing.is_empty() {
                        let k = processing.swap_remove(i % processing.len());
                        q.done(&k);
                        m.done(k);
                    }
                }
                Op::StrayDone(k) => {
                    if !processing.contains(&k) {
                        q.done(&k);
                        m.done(k);
                    }
                }
                Op::Forget(k) => { q.forget(&k); m.failures.remove(&k); }
            }
            prop_assert_eq!(q.len(), m.queue.len());
            for k in 0..8 {
                prop_assert_eq!(q.num_requeues(&k), m.failures.get(&k).copied().unwrap_or(0));
            }
        }
    }

    /// Backoff is `base * 2^failures` capped at `max`, never panics on
    /// overflow, and `forget` starts over.
    #[test]
    fn exponential_backoff_formula(
        base_us in 0u64..10_000_000,
        max_s in 0u64..100_000,
        steps in prop::collection::vec(prop::option::weighted(0.9, 0u8..3), 0..150),
    ) {
        let base = Duration::from_micros(base_us);
        let max = Duration::from_secs(max_s);
        let l = ItemExponential::new(base, max);
        let mut failures = [0u32; 3];
        for step in steps {
            match step {
                Some(k) => {
                    let n = failures[k as usize];
                    let expect = (0..n).try_fold(base, |d, _| d.checked_mul(2))
                        .map_or(max, |d| d.min(max));
                    prop_assert_eq!(l.when(&k), expect);
                    failures[k as usize] += 1;
                    prop_assert_eq!(l.num_requeues(&k), failures[k as usize]);
                }
                None => {
                    l.forget(&0);
                    failures[0] = 0;
                }
            }
        }
    }

    /// Whatever the arrival pattern, the times at which reservations become
    /// ready never beat the bucket: within any window of ready times
    /// `[r_i, r_j]` at most `burst + qps * (r_j - r_i)` reservations fit.
    /// They are handed out in arrival order, and a full bucket never delays.
    #[test]
    fn token_bucket_never_exceeds_rate(
        qps in 1u32..200,
        burst in 1u32..30,
        arrivals in prop::collection::vec((0u64..300, 1usize..6), 1..60),
    ) {
        let b = TokenBucket::new(f64::from(qps), burst);
        let t0 = Instant::now();
        let mut now = t0;
        let mut ready: Vec<Instant> = Vec::new();
        for (advance_ms, n) in arrivals {
            now += Duration::from_millis(advance_ms);
            let refilled = ready.last().is_none_or(|&last| {
                now.saturating_duration_since(last).as_secs_f64() * f64::from(qps)
                    >= f64::from(burst)
            });
            for i in 0..n {
                let wait = b.reserve_at(now);
                if refilled && (i as u32) < burst {
                    prop_assert_eq!(wait, Duration::ZERO);
                }
                ready.push(now + wait);
            }
        }
        prop_assert!(ready.windows(2).all(|w| w[0] <= w[1]), "not FIFO");
        for i in 0..ready.len() {
            for j in i..ready.len() {
                let window = (ready[j] - ready[i]).as_secs_f64();
                let allowed = f64::from(burst) + f64::from(qps) * window + 1e-6;
                prop_assert!(
                    (j - i + 1) as f64 <= allowed,
                    "{} reservations in {:?} (qps {}, burst {})",
                    j - i + 1, ready[j] - ready[i], qps, burst
                );
            }
        }
    }
}

/// Many adds of one key between gets always collapse into one hand-out,
/// also through the async path with a waiting getter.
#[tokio::test]
async fn waiting_getter_gets_a_burst_once() {
    let q: WorkQueue<u8> = WorkQueue::with_defaults("burst");
    let getter = tokio::spawn({
        let q = q.clone();
        async move { q.get().await }
    });
    tokio::task::yield_now().await;
    for _ in 0..1000 {
        q.add(1);
    }
    let k = tokio::time::timeout(Duration::from_secs(10), getter)
        .await
        .expect("getter woke")
        .expect("join");
    assert_eq!(k, Some(1));
    assert_eq!(q.len(), 0);
    assert_eq!(try_get(&q), None);
    q.done(&1);
    assert_eq!(try_get(&q), None);
}
