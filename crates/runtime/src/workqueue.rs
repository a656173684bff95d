//! An async work queue with client-go `workqueue` semantics.
//!
//! Controllers react to "key X changed", not to individual events, so the
//! queue is a set with an order:
//!
//! * a key that is already waiting ("dirty") is not queued twice, so bursts
//!   of events collapse into one reconcile;
//! * a key that is being processed is never handed to a second worker; an
//!   `add` meanwhile only marks it dirty and it is re-queued (at the back) by
//!   [`WorkQueue::done`];
//! * delayed adds wait in an ordered map; a second delayed add of a waiting
//!   key keeps the earlier ready time;
//! * only [`WorkQueue::add_rate_limited`] counts as a failure for backoff, a
//!   plain [`WorkQueue::add`] (a watch event) never does;
//! * a key waiting out its backoff after a failure is *held*: adds and
//!   delayed adds meanwhile are absorbed (the key comes back when the
//!   backoff ends, so no event is lost), and a key that was added while its
//!   failing reconcile ran is not re-queued at `done`. client-go lets any
//!   event bypass the backoff, so a failing object that is mapped from a busy
//!   watch (every Node update requeues a NodeVersion) is retried at the event
//!   rate, not the backoff's.
//!
//! Delayed keys are moved into the queue lazily, by whichever operation looks
//! at the queue next (`get`, `len`), and waiting getters sleep until the
//! earliest ready time. So there is no background task to spawn, leak, or
//! keep alive, and the queue can be built outside a runtime.
//!
//! Deliberate difference from client-go: [`WorkQueue::shut_down`] makes `get`
//! return `None` at once even if keys remain (client-go hands them out);
//! [`WorkQueue::shut_down_with_drain`] is the variant that finishes the work.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::metrics::QueueMetrics;
use super::rate_limiter::{RateLimiter, default_rate_limiter};
use crate::sync::lock;

/// Delays are clamped to this (like tokio's "far future") so that
/// `now + delay` cannot overflow.
const MAX_DELAY: Duration = Duration::from_secs(86_400 * 365 * 30);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Running,
    /// No adds accepted; `get` hands out what is left.
    Draining,
    /// No adds accepted; `get` returns `None`.
    Stopped,
}

/// Everything behind the one lock. Invariants: `queue` holds exactly the
/// dirty keys that are not processing, each once; `dirty_processing` counts
/// keys in both `dirty` and `processing`; `delayed` and `waiting` mirror
/// each other.
struct State<K> {
    phase: Phase,
    queue: VecDeque<K>,
    dirty: HashSet<K>,
    processing: HashSet<K>,
    dirty_processing: usize,
    /// Delayed adds ordered by (ready time, insertion order).
    delayed: BTreeMap<(Instant, u64), K>,
    /// Ready time of each delayed key, to keep only the earliest.
    waiting: HashMap<K, (Instant, u64)>,
    /// Delayed keys that are waiting out a failure's backoff: not to be
    /// handed out before their ready time, whatever is added meanwhile.
    held: HashSet<K>,
    seq: u64,
    /// When each dirty key was added; only kept when metrics are on.
    added_at: HashMap<K, Instant>,
    /// When each processing key was handed out; only with metrics.
    started_at: HashMap<K, Instant>,
}

impl<K: Clone + Eq + Hash> State<K> {
    fn new() -> Self {
        Self {
            phase: Phase::Running,
            queue: VecDeque::new(),
            dirty: HashSet::new(),
            processing: HashSet::new(),
            dirty_processing: 0,
            delayed: BTreeMap::new(),
            waiting: HashMap::new(),
            held: HashSet::new(),
            seq: 0,
            added_at: HashMap::new(),
            started_at: HashMap::new(),
        }
    }

    /// client-go `Add`. Returns true if the key was pushed to `queue`.
    fn insert(&mut self, key: K, m: Option<&dyn QueueMetrics>) -> bool {
        if self.dirty.contains(&key) || self.held.contains(&key) {
            return false;
        }
        if let Some(m) = m {
            m.added();
            self.added_at.entry(key.clone()).or_insert_with(Instant::now);
        }
        if self.processing.contains(&key) {
            self.dirty_processing += 1;
            self.dirty.insert(key);
            return false;
        }
        self.dirty.insert(key.clone());
        self.queue.push_back(key);
        if let Some(m) = m {
            m.depth(self.queue.len());
        }
        true
    }

    /// Moves delayed keys that are ready at `now` into the queue, earliest
    /// first. Returns how many were pushed.
    fn promote(&mut self, now: Instant, m: Option<&dyn QueueMetrics>) -> usize {
        let mut pushed = 0;
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.waiting.remove(&key);
            self.held.remove(&key);
            if self.insert(key, m) {
                pushed += 1;
            }
        }
        pushed
    }

    fn clear_delayed(&mut self) {
        self.delayed.clear();
        self.waiting.clear();
        self.held.clear();
    }

    /// Nothing queued and nothing that `done` could re-queue.
    fn nothing_left_to_hand_out(&self) -> bool {
        self.queue.is_empty() && self.dirty_processing == 0
    }
}

/// What `get` should do next.
#[derive(Debug, PartialEq, Eq)]
enum Step<K> {
    Item(K),
    Closed,
    /// Sleep until notified, or until the given delayed key is ready.
    Wait(Option<Instant>),
}

struct Inner<K> {
    name: String,
    state: Mutex<State<K>>,
    /// Wakes `get`: `notify_one` per pushed key, `notify_waiters` when the
    /// earliest delayed time or the phase changes.
    getters: Notify,
    /// Wakes `shut_down_with_drain` when the queue may have become idle.
    idle: Notify,
    limiter: Box<dyn RateLimiter<K>>,
    metrics: Option<Arc<dyn QueueMetrics>>,
}

/// A cheap-to-clone handle to a work queue. See the module docs.
pub struct WorkQueue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<K> fmt::Debug for WorkQueue<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkQueue")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

impl<K> WorkQueue<K>
where
    K: Clone + Eq + Hash + Send + Sync + 'static,
{
    /// A queue named `name` (the metrics label) that uses `limiter` for
    /// [`add_rate_limited`](Self::add_rate_limited).
    pub fn new(
        name: &str,
        limiter: impl RateLimiter<K> + 'static,
        metrics: Option<Arc<dyn QueueMetrics>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                state: Mutex::new(State::new()),
                getters: Notify::new(),
                idle: Notify::new(),
                limiter: Box::new(limiter),
                metrics,
            }),
        }
    }

    /// client-go's default limiter (max of 5 ms..1000 s per-key backoff and
    /// a 10 qps / 100 burst bucket), no metrics.
    pub fn with_defaults(name: &str) -> Self {
        Self::new(name, default_rate_limiter(), None)
    }

    /// The name the queue was created with (its controller's, under a Manager).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn metrics(&self) -> Option<&dyn QueueMetrics> {
        self.inner.metrics.as_deref()
    }

    /// Marks `key` as needing processing. Ignored during shutdown.
    pub fn add(&self, key: K) {
        let pushed = {
            let mut st = lock(&self.inner.state);
            st.phase == Phase::Running && st.insert(key, self.metrics())
        };
        if pushed {
            self.inner.getters.notify_one();
        }
    }

    /// Adds `key` once `delay` has passed; a zero delay adds at once. If the
    /// key is already waiting for a delayed add, the earlier time wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        self.add_at(key, Instant::now() + delay.min(MAX_DELAY));
    }

    fn add_at(&self, key: K, ready_at: Instant) {
        self.schedule(key, ready_at, false);
    }

    /// Puts `key` in the delayed map for `ready_at`. A plain delayed add
    /// keeps an earlier time already there and is absorbed by a held key; a
    /// held add (a backoff) replaces whatever was there.
    fn schedule(&self, key: K, ready_at: Instant, hold: bool) {
        let earliest = {
            let mut st = lock(&self.inner.state);
            if st.phase != Phase::Running || (!hold && st.held.contains(&key)) {
                return;
            }
            if let Some(&old) = st.waiting.get(&key) {
                if !hold && old.0 <= ready_at {
                    return;
                }
                st.delayed.remove(&old);
            }
            if hold {
                st.held.insert(key.clone());
            }
            st.seq += 1;
            let slot = (ready_at, st.seq);
            st.delayed.insert(slot, key.clone());
            st.waiting.insert(key, slot);
            st.delayed.first_key_value().map(|(k, _)| *k) == Some(slot)
        };
        if earliest {
            // Sleeping getters must shorten their sleep.
            self.inner.getters.notify_waiters();
        }
    }

    /// Re-adds `key` after the delay its rate limiter chooses, counting one
    /// more failure for it, and holds it until then (see the module docs).
    /// Use this on reconcile errors, not for events.
    pub fn add_rate_limited(&self, key: K) {
        self.add_rate_limited_after(key, Duration::ZERO);
    }

    /// Like [`add_rate_limited`](Self::add_rate_limited), but not sooner
    /// than `at_least` (a Retry-After the other side asked for).
    pub fn add_rate_limited_after(&self, key: K, at_least: Duration) {
        if self.is_shutting_down() {
            return;
        }
        if let Some(m) = self.metrics() {
            m.retried();
        }
        let delay = self.inner.limiter.when(&key).max(at_least).min(MAX_DELAY);
        self.schedule(key, Instant::now() + delay, true);
    }

    /// Clears the failure history of `key` (call after a success).
    pub fn forget(&self, key: &K) {
        self.inner.limiter.forget(key);
    }

    /// How many rate-limited re-adds `key` had since its last `forget`.
    pub fn num_requeues(&self, key: &K) -> u32 {
        self.inner.limiter.num_requeues(key)
    }

    /// Waits for a key and marks it processing; the caller must call
    /// [`done`](Self::done) with it. Returns `None` after `shut_down`, or
    /// after `shut_down_with_drain` once nothing is left to hand out.
    ///
    /// Cancel safe: dropping the future never loses a key. Waiting for a
    /// delayed key needs a tokio runtime with the time driver enabled.
    pub async fn get(&self) -> Option<K> {
        loop {
            // Register before looking, so a wake-up between the look and
            // the await is not lost.
            let mut notified = pin!(self.inner.getters.notified());
            notified.as_mut().enable();
            match self.step(Instant::now()) {
                Step::Item(key) => return Some(key),
                Step::Closed => return None,
                Step::Wait(None) => notified.await,
                Step::Wait(Some(at)) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
            }
        }
    }

    /// One non-blocking look at the queue at time `now`.
    fn step(&self, now: Instant) -> Step<K> {
        let m = self.metrics();
        let (step, promoted, all_done) = {
            let mut st = lock(&self.inner.state);
            if st.phase == Phase::Stopped {
                return Step::Closed;
            }
            let promoted = if st.delayed.is_empty() {
                0
            } else {
                st.promote(now, m)
            };
            if let Some(key) = st.queue.pop_front() {
                st.dirty.remove(&key);
                st.processing.insert(key.clone());
                if let Some(m) = m {
                    m.depth(st.queue.len());
                    if let Some(t) = st.added_at.remove(&key) {
                        m.waited(now.saturating_duration_since(t));
                    }
                    st.started_at.insert(key.clone(), now);
                }
                (Step::Item(key), promoted.saturating_sub(1), false)
            } else if st.phase == Phase::Draining {
                if st.nothing_left_to_hand_out() {
                    (Step::Closed, 0, st.processing.is_empty())
                } else {
                    (Step::Wait(None), 0, false)
                }
            } else {
                let next = st.delayed.first_key_value().map(|(k, _)| k.0);
                (Step::Wait(next), 0, false)
            }
        };
        // Other getters may take the rest of what was promoted.
        for _ in 0..promoted {
            self.inner.getters.notify_one();
        }
        if all_done {
            self.inner.idle.notify_waiters();
        }
        step
    }

    /// Marks `key` as processed. If it was added meanwhile, it goes to the
    /// back of the queue now. A key that is not processing is ignored.
    pub fn done(&self, key: &K) {
        let m = self.metrics();
        let (requeued, getters_closed, idle) = {
            let mut st = lock(&self.inner.state);
            if !st.processing.remove(key) {
                return;
            }
            if let Some(m) = m
                && let Some(t) = st.started_at.remove(key)
            {
                m.worked(t.elapsed());
            }
            let dirty = st.dirty.contains(key);
            if dirty {
                st.dirty_processing -= 1;
            }
            // Added while its reconcile failed: the backoff brings it back.
            let requeued = dirty && !st.held.contains(key);
            if dirty && !requeued {
                st.dirty.remove(key);
                st.added_at.remove(key);
            } else if requeued {
                st.queue.push_back(key.clone());
                if let Some(m) = m {
                    m.depth(st.queue.len());
                }
            }
            let draining = st.phase == Phase::Draining;
            (
                requeued,
                draining && st.nothing_left_to_hand_out(),
                draining && st.queue.is_empty() && st.processing.is_empty(),
            )
        };
        if requeued {
            self.inner.getters.notify_one();
        }
        if getters_closed {
            // Getters waiting for a possible re-queue can return None now.
            self.inner.getters.notify_waiters();
        }
        if idle {
            self.inner.idle.notify_waiters();
        }
    }

    /// Number of keys ready to be handed out (not processing, not delayed).
    pub fn len(&self) -> usize {
        let (len, promoted) = {
            let mut st = lock(&self.inner.state);
            let promoted = if st.phase == Phase::Running && !st.delayed.is_empty() {
                st.promote(Instant::now(), self.metrics())
            } else {
                0
            };
            (st.queue.len(), promoted)
        };
        for _ in 0..promoted {
            self.inner.getters.notify_one();
        }
        len
    }

    /// Whether no key is ready to be handed out.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops at once: adds are ignored, pending delayed adds dropped, and
    /// every `get` (waiting or future) returns `None` even if keys remain.
    /// Also ends a `shut_down_with_drain` that is still waiting.
    pub fn shut_down(&self) {
        {
            let mut st = lock(&self.inner.state);
            st.phase = Phase::Stopped;
            st.clear_delayed();
        }
        self.inner.getters.notify_waiters();
        self.inner.idle.notify_waiters();
    }

    /// Stops accepting adds (pending delayed adds are dropped) right away,
    /// and returns a future that resolves once workers have taken every
    /// queued key and called `done` for each. Meanwhile `get` keeps handing
    /// out what is left, then returns `None`.
    ///
    /// The shutdown itself happens at the call, not at the first poll, so
    /// no add can slip in between. The future needs running workers or it
    /// waits forever; a concurrent [`shut_down`](Self::shut_down) ends it.
    pub fn shut_down_with_drain(&self) -> impl Future<Output = ()> + Send + 'static {
        {
            let mut st = lock(&self.inner.state);
            if st.phase == Phase::Running {
                st.phase = Phase::Draining;
                st.clear_delayed();
            }
        }
        // Getters idling on an empty queue may return None now.
        self.inner.getters.notify_waiters();
        let inner = Arc::clone(&self.inner);
        async move {
            loop {
                let mut idle = pin!(inner.idle.notified());
                idle.as_mut().enable();
                {
                    let st = lock(&inner.state);
                    if st.phase != Phase::Draining || (st.queue.is_empty() && st.processing.is_empty()) {
                        return;
                    }
                }
                idle.await;
            }
        }
    }

    /// Whether a shutdown (either kind) has begun.
    pub fn is_shutting_down(&self) -> bool {
        lock(&self.inner.state).phase != Phase::Running
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate_limiter::ItemExponential;
    use futures::FutureExt;
    use proptest::prelude::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    const MS: Duration = Duration::from_millis(1);
    /// Guards against hangs only; never reached when the code is right.
    const HANG: Duration = Duration::from_secs(20);

    fn queue() -> WorkQueue<u32> {
        WorkQueue::with_defaults("test")
    }

    fn try_get<K: Clone + Eq + Hash + Send + Sync + 'static>(q: &WorkQueue<K>) -> Option<K> {
        match q.get().now_or_never() {
            Some(Some(k)) => Some(k),
            Some(None) => panic!("queue closed"),
            None => None,
        }
    }

    async fn within<F: Future>(f: F) -> F::Output {
        tokio::time::timeout(HANG, f).await.expect("timed out")
    }

    #[test]
    fn burst_of_adds_collapses_into_one_get() {
        let q = queue();
        for _ in 0..100 {
            q.add(1);
        }
        q.add(2);
        assert_eq!(q.len(), 2);
        assert_eq!(try_get(&q), Some(1));
        assert_eq!(try_get(&q), Some(2));
        assert_eq!(try_get(&q), None);
    }

    #[test]
    fn add_while_processing_requeues_at_done_to_the_back() {
        let q = queue();
        q.add(1);
        assert_eq!(try_get(&q), Some(1));
        q.add(1);
        q.add(1);
        q.add(2);
        // 1 is processing: it must not be handed out again yet.
        assert_eq!(q.len(), 1);
        assert_eq!(try_get(&q), Some(2));
        assert_eq!(try_get(&q), None);
        q.done(&1);
        assert_eq!(q.len(), 1);
        assert_eq!(try_get(&q), Some(1));
        q.done(&1);
        q.done(&2);
        assert_eq!(try_get(&q), None);
        // done of an unknown key does nothing.
        q.done(&7);
        assert!(q.is_empty());
    }

    #[test]
    fn plain_add_never_counts_as_failure() {
        let q = queue();
        for _ in 0..10 {
            q.add(1);
            if let Some(k) = try_get(&q) {
                q.done(&k);
            }
        }
        assert_eq!(q.num_requeues(&1), 0);
        q.add_rate_limited(1);
        q.add_rate_limited(1);
        assert_eq!(q.num_requeues(&1), 2);
        q.add(1);
        assert_eq!(q.num_requeues(&1), 2);
        q.forget(&1);
        assert_eq!(q.num_requeues(&1), 0);
    }

    #[test]
    fn delayed_adds_come_out_in_ready_order() {
        let q = queue();
        let t0 = Instant::now();
        q.add_at(30, t0 + 30 * MS);
        q.add_at(10, t0 + 10 * MS);
        q.add_at(20, t0 + 20 * MS);
        assert_eq!(q.step(t0), Step::Wait(Some(t0 + 10 * MS)));
        assert_eq!(q.step(t0 + 25 * MS), Step::Item(10));
        assert_eq!(q.step(t0 + 25 * MS), Step::Item(20));
        assert_eq!(q.step(t0 + 25 * MS), Step::Wait(Some(t0 + 30 * MS)));
        assert_eq!(q.step(t0 + 30 * MS), Step::Item(30));
        assert_eq!(q.step(t0 + 30 * MS), Step::Wait(None));
    }

    #[test]
    fn duplicate_delayed_add_keeps_earlier_time() {
        let q = queue();
        let t0 = Instant::now();
        q.add_at(1, t0 + 50 * MS);
        q.add_at(1, t0 + 20 * MS); // earlier: replaces
        q.add_at(1, t0 + 90 * MS); // later: ignored
        assert_eq!(q.step(t0), Step::Wait(Some(t0 + 20 * MS)));
        assert_eq!(q.step(t0 + 20 * MS), Step::Item(1));
        q.done(&1);
        // Nothing else was left behind for 50 ms or 90 ms.
        assert_eq!(q.step(t0 + 100 * MS), Step::Wait(None));
    }

    #[test]
    fn delayed_add_of_processing_key_waits_for_done() {
        let q = queue();
        let t0 = Instant::now();
        q.add(1);
        assert_eq!(q.step(t0), Step::Item(1));
        q.add_at(1, t0 + 5 * MS);
        assert_eq!(q.step(t0 + 10 * MS), Step::Wait(None));
        q.done(&1);
        assert_eq!(q.step(t0 + 10 * MS), Step::Item(1));
    }

    #[tokio::test]
    async fn get_wakes_for_delayed_add_in_delay_order() {
        let q = queue();
        q.add_after(3, 60 * MS);
        q.add_after(1, 20 * MS);
        q.add_after(2, 40 * MS);
        q.add_after(0, Duration::ZERO); // immediate
        let mut got = Vec::new();
        for _ in 0..4 {
            let k = within(q.get()).await.expect("open");
            q.done(&k);
            got.push(k);
        }
        assert_eq!(got, vec![0, 1, 2, 3]);
    }

    #[tokio::test]
    async fn waiting_getter_sees_new_earlier_delayed_add() {
        let q = queue();
        q.add_after(2, Duration::from_secs(3600));
        let getter = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        // The getter sleeps until +1h; this must wake it much earlier.
        q.add_after(1, 10 * MS);
        assert_eq!(within(getter).await.expect("join"), Some(1));
    }

    #[test]
    fn backoff_grows_and_forget_resets() {
        // Hours, so that scheduling noise (µs..ms) cannot blur the steps.
        const H: Duration = Duration::from_secs(3600);
        let slack = Duration::from_secs(60);
        let limiter = ItemExponential::new(H, 8 * H);
        let q: WorkQueue<u32> = WorkQueue::new("backoff", limiter, None);
        let ready_delay = |q: &WorkQueue<u32>, before: Instant| {
            let mut st = lock(&q.inner.state);
            let at = st.waiting[&1].0;
            // Take it out so the next, later add is not ignored in favour
            // of this earlier one.
            st.clear_delayed();
            at - before
        };
        let mut delays = Vec::new();
        for _ in 0..6 {
            let before = Instant::now();
            q.add_rate_limited(1);
            delays.push(ready_delay(&q, before));
        }
        for (d, hours) in delays.iter().zip([1, 2, 4, 8, 8, 8]) {
            assert!(*d >= hours * H && *d < hours * H + slack, "{delays:?}");
        }
        assert_eq!(q.num_requeues(&1), 6);
        q.forget(&1);
        assert_eq!(q.num_requeues(&1), 0);
        let before = Instant::now();
        q.add_rate_limited(1);
        let d = ready_delay(&q, before);
        assert!(d >= H && d < H + slack, "{d:?}");
        assert_eq!(q.num_requeues(&1), 1);
    }

    #[tokio::test]
    async fn shut_down_makes_get_return_none_at_once() {
        let q = queue();
        let waiting = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.add(1);
        q.add(2);
        q.shut_down();
        // The early getter may or may not have taken 1 before the shutdown.
        let first = within(waiting).await.expect("join");
        assert!(first.is_none() || first == Some(1));
        assert!(q.is_shutting_down());
        assert_eq!(within(q.get()).await, None);
        q.add(3);
        q.add_after(4, MS);
        q.add_rate_limited(5);
        assert_eq!(q.num_requeues(&5), 0);
        assert_eq!(within(q.get()).await, None);
        // A drain after a hard stop has nothing to wait for.
        within(q.shut_down_with_drain()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drain_processes_everything_queued_then_resolves() {
        let q = queue();
        for k in 0..100 {
            q.add(k);
        }
        // A key that is processing and dirty at shutdown time must also be
        // processed again before the drain ends.
        let first = within(q.get()).await.expect("open");
        q.add(first);
        q.add_after(1000, Duration::from_secs(3600)); // dropped by drain
        let processed = Arc::new(Mutex::new(Vec::new()));
        let drain = tokio::spawn(q.shut_down_with_drain());
        q.add(500); // ignored: shutting down
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (q, processed) = (q.clone(), processed.clone());
                tokio::spawn(async move {
                    while let Some(k) = q.get().await {
                        tokio::task::yield_now().await;
                        lock(&processed).push(k);
                        q.done(&k);
                    }
                })
            })
            .collect();
        assert!(!drain.is_finished());
        lock(&processed).push(first);
        q.done(&first);
        within(drain).await.expect("join");
        // Resolved only after the last done.
        let mut got = lock(&processed).clone();
        assert_eq!(got.len(), 101, "{got:?}");
        got.sort_unstable();
        got.dedup();
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        assert!(q.is_empty());
        for w in workers {
            within(w).await.expect("worker");
        }
    }

    #[tokio::test]
    async fn shut_down_ends_a_waiting_drain() {
        let q = queue();
        q.add(1);
        let drain = tokio::spawn(q.shut_down_with_drain());
        tokio::task::yield_now().await;
        assert!(!drain.is_finished());
        q.shut_down();
        within(drain).await.expect("join");
    }

    /// 16 workers on a multi-thread runtime, keys added continuously: no key
    /// is ever processed by two workers at once, and every key is processed
    /// at least once after its last add.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_key_is_processed_concurrently_and_none_is_lost() {
        const KEYS: u32 = 64;
        let q = queue();
        let in_flight = Arc::new(Mutex::new(HashSet::new()));
        // generation[k] is bumped before each add; seen[k] is the highest
        // generation a worker observed after getting k.
        let generation = Arc::new(Mutex::new(vec![0u64; KEYS as usize]));
        let seen = Arc::new(Mutex::new(vec![0u64; KEYS as usize]));
        let workers: Vec<_> = (0..16)
            .map(|_| {
                let (q, in_flight) = (q.clone(), in_flight.clone());
                let (generation, seen) = (generation.clone(), seen.clone());
                tokio::spawn(async move {
                    let mut processed = 0u64;
                    while let Some(k) = q.get().await {
                        assert!(lock(&in_flight).insert(k), "{k} processed twice");
                        let g = lock(&generation)[k as usize];
                        {
                            let mut seen = lock(&seen);
                            seen[k as usize] = seen[k as usize].max(g);
                        }
                        tokio::task::yield_now().await;
                        assert!(lock(&in_flight).remove(&k));
                        q.done(&k);
                        processed += 1;
                    }
                    processed
                })
            })
            .collect();
        let mut rng = StdRng::seed_from_u64(7);
        let mut adds = 0u64;
        for round in 0..20_000u32 {
            let k = rng.random_range(0..KEYS);
            lock(&generation)[k as usize] += 1;
            q.add(k);
            adds += 1;
            if round % 64 == 0 {
                tokio::task::yield_now().await;
            }
        }
        within(q.shut_down_with_drain()).await;
        let mut processed = 0;
        for w in workers {
            processed += within(w).await.expect("worker panicked");
        }
        assert!(lock(&in_flight).is_empty());
        assert_eq!(*lock(&seen), *lock(&generation));
        assert!(processed >= u64::from(KEYS).min(adds) && processed <= adds);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_in_backoff_waits_it_out_whatever_is_added() {
        let limiter = ItemExponential::new(Duration::from_secs(1), Duration::from_secs(60));
        let q: WorkQueue<u32> = WorkQueue::new("held", limiter, None);
        q.add(1);
        let k = within(q.get()).await.expect("open");
        // An event arrives while the reconcile runs, then it fails.
        q.add(1);
        q.add_rate_limited(1);
        q.done(&k);
        assert_eq!(q.len(), 0, "not re-queued at done: the backoff brings it back");
        // Events and short requeues during the backoff are absorbed.
        q.add(1);
        q.add_after(1, MS);
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(q.len(), 0);
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(q.len(), 1, "handed out once the backoff ends");
        let k = within(q.get()).await.expect("open");
        q.done(&k);
        // Once out of backoff, events go through at once again.
        q.add(1);
        assert_eq!(q.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_a_floor_on_the_backoff() {
        let q: WorkQueue<u32> = WorkQueue::with_defaults("after");
        q.add_rate_limited_after(7, Duration::from_secs(30));
        tokio::time::advance(Duration::from_millis(29_990)).await;
        assert_eq!(q.len(), 0);
        tokio::time::advance(Duration::from_millis(20)).await;
        assert_eq!(q.len(), 1);
    }

    /// Counts what the queue reports.
    #[derive(Default)]
    struct Recorded {
        depth: std::sync::atomic::AtomicUsize,
        added: std::sync::atomic::AtomicUsize,
        waited: std::sync::atomic::AtomicUsize,
        worked: std::sync::atomic::AtomicUsize,
        retried: std::sync::atomic::AtomicUsize,
    }

    impl QueueMetrics for Recorded {
        fn depth(&self, depth: usize) {
            self.depth.store(depth, std::sync::atomic::Ordering::Relaxed);
        }
        fn added(&self) {
            self.added.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        fn waited(&self, _: Duration) {
            self.waited.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        fn worked(&self, _: Duration) {
            self.worked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        fn retried(&self) {
            self.retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn metrics_track_depth_adds_durations_and_retries() {
        use std::sync::atomic::Ordering::Relaxed;
        let nodes = Arc::new(Recorded::default());
        let other = Arc::new(Recorded::default());
        let q: WorkQueue<u32> = WorkQueue::new("nodes", default_rate_limiter(), Some(nodes.clone()));
        let o: WorkQueue<u32> = WorkQueue::new("other", default_rate_limiter(), Some(other.clone()));
        q.add(1);
        q.add(1);
        q.add(2);
        o.add(1);
        let k = within(q.get()).await.expect("open");
        q.done(&k);
        q.add_rate_limited(3);
        assert_eq!(nodes.depth.load(Relaxed), 1);
        assert_eq!(other.depth.load(Relaxed), 1);
        assert_eq!(nodes.added.load(Relaxed), 2);
        assert_eq!(nodes.retried.load(Relaxed), 1);
        assert_eq!(nodes.waited.load(Relaxed), 1);
        assert_eq!(nodes.worked.load(Relaxed), 1);
        assert_eq!(other.worked.load(Relaxed), 0);
    }

    #[derive(Clone, Debug)]
    enum DelayOp {
        After(u8, u16),
        Take(u16),
    }

    proptest! {
        /// Against a simple model: a delayed key is handed out once the
        /// clock passes the earliest time it was scheduled for, and keys
        /// come out in (ready time, schedule order).
        #[test]
        fn delayed_adds_match_model(ops in prop::collection::vec(
            prop_oneof![
                (0u8..6, 1u16..100).prop_map(|(k, d)| DelayOp::After(k, d)),
                (0u16..50).prop_map(DelayOp::Take),
            ], 0..60)
        ) {
            let q = queue();
            let t0 = Instant::now();
            let mut now = t0;
            // key -> (ready, seq)
            let mut model: HashMap<u32, (Instant, u64)> = HashMap::new();
            let mut seq = 0u64;
            for op in ops {
                match op {
                    DelayOp::After(k, d) => {
                        let k = u32::from(k);
                        let at = now + MS * u32::from(d);
                        q.add_at(k, at);
                        seq += 1;
                        let e = model.entry(k).or_insert((at, seq));
                        if at < e.0 { *e = (at, seq); }
                    }
                    DelayOp::Take(adv) => {
                        now += MS * u32::from(adv);
                        let mut ready: Vec<_> = model.iter()
                            .filter(|(_, v)| v.0 <= now)
                            .map(|(k, v)| (*v, *k))
                            .collect();
                        ready.sort();
                        for (_, k) in ready {
                            model.remove(&k);
                            prop_assert_eq!(q.step(now), Step::Item(k));
                            q.done(&k);
                        }
                        let next = model.values().min().map(|v| v.0);
                        prop_assert_eq!(q.step(now), Step::Wait(next));
                    }
                }
            }
        }
    }
}
