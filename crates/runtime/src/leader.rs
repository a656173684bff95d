//! Leader election on a `coordination.k8s.io/v1` Lease, to client-go's rules.
//!
//! Why hand-written: `kube-leader-election` writes the Lease with a merge patch
//! that carries no resourceVersion precondition, so two replicas that both see
//! an expired lease can both "win". nodewarden deletes nodes; it needs at most
//! one leader at any moment.
//!
//! Safety rests on two rules:
//! 1. Every write of the Lease (create, acquire, renew, release) is conditioned
//!    on the resourceVersion this candidate just read. Of two candidates that
//!    saw the same record, at most one write succeeds; the other gets 409.
//! 2. Time is only measured on the local monotonic clock, never by comparing
//!    the record's timestamps with it (machines' wall clocks disagree). A
//!    candidate treats a lease as expired `leaseDurationSeconds` after it *saw*
//!    the record last change; the holder treats itself as leader only until
//!    `renew_deadline` after it *started* its last successful renewal.
//!
//! A renewal is committed after it was started and seen by others after it was
//! committed, so with `renew_deadline < lease_duration` the old leader's handle
//! says "not leader" before any other candidate may take the lease — even if
//! the old leader is cut off or its renew loop is stuck.
//!
//! Like client-go, this cannot protect against someone deleting the Lease by
//! hand while it is held: the next candidate creates it at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::sync::lock;

pub use super::lease::LeaseError;
use super::lease::{KubeLeaseLock, LeaseLock, LeaseRecord, Observed, Written, holding_spec};

type Result<T, E = LeaseError> = std::result::Result<T, E>;

/// This replica is not (or no longer) the leader: returned by
/// [`LeaderHandle::ensure_leader`] so disruptive code can stop with `?`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this replica is not the leader")]
pub struct NotLeader;

/// client-go's jitter factor for the acquire loop: waits are uniform in
/// `[retry_period, retry_period × 2.2)`.
const JITTER_FACTOR: f64 = 1.2;

/// Timing and identity of one candidate. `new` gives client-go's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// Must be unique per process (e.g. pod name plus a random suffix): two
    /// processes with one identity would both consider themselves the holder.
    pub identity: String,
    /// How long others wait after the lease last changed before taking it.
    /// Written to the Lease rounded up to whole seconds.
    pub lease_duration: Duration,
    /// How long the leader keeps acting without a successful renewal.
    pub renew_deadline: Duration,
    /// Pause between acquire attempts (jittered) and between renewals.
    pub retry_period: Duration,
}

/// A [`LeaderElectionConfig`] that would break the guarantees.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid leader election config: {0}")]
pub struct ConfigError(String);

impl LeaderElectionConfig {
    /// client-go's defaults: lease 15 s, renew deadline 10 s, retry 2 s.
    pub fn new(
        namespace: impl Into<String>,
        lease_name: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaderElectionConfig {
            namespace: namespace.into(),
            lease_name: lease_name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Checks client-go's rule `lease_duration > renew_deadline > 1.2 × retry_period`:
    /// the first keeps the old leader's deadline ahead of others' expiry, the
    /// second leaves room for at least one retry of a failed renewal.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |why: &str| Err(ConfigError(why.to_owned()));
        if self.identity.is_empty() {
            return fail("identity must not be empty");
        }
        if self.namespace.is_empty() || self.lease_name.is_empty() {
            return fail("namespace and lease name must not be empty");
        }
        if self.retry_period.is_zero() {
            return fail("retry_period must be positive");
        }
        if self.lease_duration <= self.renew_deadline {
            return fail("lease_duration must be greater than renew_deadline");
        }
        if self.renew_deadline <= self.retry_period.mul_f64(JITTER_FACTOR) {
            return fail("renew_deadline must be greater than 1.2 × retry_period");
        }
        if self.lease_duration > Duration::from_secs(i32::MAX as u64) {
            return fail("lease_duration does not fit leaseDurationSeconds");
        }
        Ok(())
    }

    /// `leaseDurationSeconds` to write: rounded up, so others never wait less
    /// than our own `lease_duration` (which the deadline check relies on).
    fn lease_seconds(&self) -> i32 {
        let whole = self.lease_duration.as_secs() + u64::from(self.lease_duration.subsec_nanos() > 0);
        i32::try_from(whole.max(1)).unwrap_or(i32::MAX)
    }
}

/// State shared between the election loop and its handles.
#[derive(Debug)]
struct Shared {
    identity: String,
    /// While leading: when leadership lapses unless a renewal succeeds first.
    valid_until: Mutex<Option<Instant>>,
    leading: watch::Sender<bool>,
}

impl Shared {
    fn lead_until(&self, until: Instant) {
        *lock(&self.valid_until) = Some(until);
        self.leading
            .send_if_modified(|leading| !std::mem::replace(leading, true));
    }

    fn stop_leading(&self) {
        *lock(&self.valid_until) = None;
        self.leading
            .send_if_modified(|leading| std::mem::replace(leading, false));
    }
}

/// A cheap view of one candidate's leadership, for the code that acts on it.
#[derive(Clone, Debug)]
pub struct LeaderHandle {
    shared: Arc<Shared>,
}

impl LeaderHandle {
    /// True only while this replica holds the lease and its last successful
    /// renewal started less than `renew_deadline` ago. Decided by the clock,
    /// not by the election loop, so a stuck loop cannot keep it true. Check it
    /// right before anything disruptive.
    pub fn is_leader(&self) -> bool {
        lock(&self.shared.valid_until).is_some_and(|until| Instant::now() < until)
    }

    /// While [`Self::is_leader`]: the moment leadership lapses unless a
    /// renewal succeeds first (a fence for writes: `runtime::fence`).
    pub fn valid_until(&self) -> Option<Instant> {
        lock(&self.shared.valid_until).filter(|until| Instant::now() < *until)
    }

    /// [`NotLeader`] unless [`Self::is_leader`], for use with `?`.
    pub fn ensure_leader(&self) -> Result<(), NotLeader> {
        if self.is_leader() { Ok(()) } else { Err(NotLeader) }
    }

    /// Leadership transitions, to start and stop workers. The value follows
    /// the election loop, so it may turn false slightly later than
    /// [`Self::is_leader`] does; never rely on it alone before acting.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.shared.leading.subscribe()
    }

    /// The identity this replica writes into the Lease.
    pub fn identity(&self) -> &str {
        &self.shared.identity
    }

    /// A handle that leads until `until`, with no election behind it.
    #[cfg(test)]
    pub(crate) fn leading_until(until: Instant) -> Self {
        let shared = Arc::new(Shared {
            identity: "test".into(),
            valid_until: Mutex::new(None),
            leading: watch::Sender::new(false),
        });
        shared.lead_until(until);
        Self { shared }
    }
}

/// What one attempt to take or keep the lease found.
#[derive(Debug)]
enum Attempt {
    /// The lease now names us (created, acquired or renewed).
    Held,
    /// Another candidate holds the lease; by our clock it expires at `expires_at`.
    HeldByOther { holder: String, expires_at: Instant },
    /// Someone else wrote the lease between our read and our write.
    Conflict,
}

/// client-go's `wait.JitterUntil(retry, 1.2)`: uniform in `[retry, 2.2 × retry)`.
fn jittered(retry: Duration) -> Duration {
    jitter(retry, rand::random::<f64>())
}

/// `unit` is uniform in `[0, 1)`.
fn jitter(retry: Duration, unit: f64) -> Duration {
    retry.mul_f64(1.0 + JITTER_FACTOR * unit)
}

/// One candidate for leadership. Create it, hand out [`LeaderHandle`]s, then `run` it.
pub struct LeaderElector {
    lock: Box<dyn LeaseLock>,
    config: LeaderElectionConfig,
    shared: Arc<Shared>,
    observed: Option<Observed>,
}

impl LeaderElector {
    /// Fails when the config would break the guarantees (see [`LeaderElectionConfig::validate`]).
    pub fn new(client: kube::Client, config: LeaderElectionConfig) -> Result<Self, ConfigError> {
        let lock = KubeLeaseLock::new(client, &config.namespace, &config.lease_name);
        Self::with_lock(Box::new(lock), config)
    }

    /// A candidate on any [`LeaseLock`] (an in-memory one in unit tests).
    pub fn with_lock(lock: Box<dyn LeaseLock>, config: LeaderElectionConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let shared = Arc::new(Shared {
            identity: config.identity.clone(),
            valid_until: Mutex::new(None),
            leading: watch::Sender::new(false),
        });
        Ok(LeaderElector {
            lock,
            config,
            shared,
            observed: None,
        })
    }

    /// A handle for the code that acts while leading.
    pub fn handle(&self) -> LeaderHandle {
        LeaderHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Campaigns, leads, and campaigns again after losing the lease (hot
    /// standby) until `shutdown` is cancelled. Then it stops leading (the
    /// handle turns false) and, if the lease names this candidate, releases it
    /// so a standby takes over within about one retry period.
    ///
    /// Cancel `shutdown` after the guarded workers have stopped: the lease is
    /// released right after the handle turns false.
    pub async fn run(mut self, shutdown: CancellationToken) {
        // Every log line of this candidate names it and its lease.
        let span = info_span!("leader_election", identity = %self.shared.identity, lease = %self.lease_ref());
        async move {
            info!("leader election started");
            while let Some(acquired) = self.acquire(&shutdown).await {
                self.lead(acquired, &shutdown).await;
            }
            self.shared.stop_leading();
            self.release().await;
        }
        .instrument(span)
        .await
    }

    fn lease_ref(&self) -> String {
        self.lock.describe()
    }

    /// Tries until the lease is ours; returns when the successful attempt
    /// started, or `None` on shutdown.
    async fn acquire(&mut self, shutdown: &CancellationToken) -> Option<Instant> {
        // A conflict means another candidate has just written the Lease: read
        // it again at once (once), so this standby learns the new version and
        // watches for its release instead of sleeping a retry period first.
        let mut conflicted = false;
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let started = Instant::now();
            let retry = jittered(self.config.retry_period);
            let attempt = self.attempt(self.config.renew_deadline).await;
            let after_conflict = std::mem::take(&mut conflicted);
            let (wait, held_at) = match attempt {
                // Cancelled while the attempt ran: `run` releases what we just took.
                Ok(Attempt::Held) if shutdown.is_cancelled() => return None,
                Ok(Attempt::Held) => return Some(started),
                // Also wake when the lease expires by our clock: takes up to one
                // jittered retry period off failover after a crash.
                Ok(Attempt::HeldByOther { expires_at, .. }) => (
                    retry.min(expires_at.saturating_duration_since(Instant::now())),
                    self.observed.as_ref().map(|o| o.resource_version.clone()),
                ),
                Ok(Attempt::Conflict) if !after_conflict => {
                    debug!("another candidate wrote the lease first; reading it again");
                    conflicted = true;
                    continue;
                }
                Ok(Attempt::Conflict) => {
                    debug!("another candidate wrote the lease first");
                    (retry, None)
                }
                Err(err) => {
                    warn!(error = %err, "could not acquire the lease");
                    (retry, None)
                }
            };
            // While another leads, also wake the moment it hands the lease
            // over: a graceful handoff then takes one read and one write,
            // not up to 2.2 retry periods.
            let released = async {
                match &held_at {
                    Some(version) => self.lock.released(version).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = sleep(wait) => {}
                _ = released => debug!("the lease was released; trying at once"),
            }
        }
    }

    /// Leads from `acquired` (start of the winning attempt) until a renewal
    /// misses the deadline, another candidate holds the lease, or shutdown.
    async fn lead(&mut self, acquired: Instant, shutdown: &CancellationToken) {
        let renew_deadline = self.config.renew_deadline;
        let mut valid_until = acquired + renew_deadline;
        let mut last_try = acquired;
        self.shared.lead_until(valid_until);
        info!("became leader");
        let reason = loop {
            // Wake at the deadline at the latest, so the watch channel follows
            // `is_leader` closely even when renewals keep failing.
            let next = (last_try + self.config.retry_period).min(valid_until);
            tokio::select! {
                _ = shutdown.cancelled() => break "shutting down".to_owned(),
                _ = sleep_until(next) => {}
            }
            let started = Instant::now();
            if started >= valid_until {
                break format!("lease not renewed within {renew_deadline:?}");
            }
            last_try = started;
            // Bounded by the deadline: a hung API call must not outlive it.
            match self.attempt(valid_until - started).await {
                Ok(Attempt::Held) => {
                    valid_until = started + renew_deadline;
                    self.shared.lead_until(valid_until);
                }
                Ok(Attempt::HeldByOther { holder, .. }) => break format!("lease taken by {holder}"),
                Ok(Attempt::Conflict) => {
                    debug!("lease changed during renewal; retrying")
                }
                Err(err) => {
                    warn!(error = %err, "renewing the lease failed")
                }
            }
        };
        self.shared.stop_leading();
        info!(%reason, "stopped leading");
    }

    /// One read-then-conditional-write, given up after `limit`.
    async fn attempt(&mut self, limit: Duration) -> Result<Attempt> {
        match timeout(limit, self.try_acquire_or_renew()).await {
            Ok(result) => result,
            Err(_) => Err(LeaseError::Timeout {
                lease: self.lease_ref(),
                after: limit,
            }),
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt> {
        let Some(record) = self.lock.get().await? else {
            return self.create().await;
        };
        let now = Instant::now();
        let previous = self.observed.take();
        let previous_holder = previous.as_ref().and_then(|p| p.holder().map(str::to_owned));
        let observed = Observed::next(previous, record.spec, record.resource_version, now);
        if observed.holder() != previous_holder.as_deref() {
            let holder = observed.holder().unwrap_or("<none>");
            info!(holder, "lease holder changed");
        }

        let identity = &self.shared.identity;
        let fallback = self.config.lease_duration;
        if !observed.available_to(identity, fallback, now) {
            let attempt = Attempt::HeldByOther {
                holder: observed.holder().unwrap_or_default().to_owned(),
                expires_at: observed.expires_at(fallback),
            };
            self.observed = Some(observed);
            return Ok(attempt);
        }
        let spec = holding_spec(
            &observed.spec,
            identity,
            self.config.lease_seconds(),
            Timestamp::now(),
        );
        let resource_version = observed.resource_version.clone();
        self.observed = Some(observed);
        let written = self.lock.update(&resource_version, spec).await?;
        Ok(self.remember(written))
    }

    /// The lease does not exist yet: create it holding it (a conflict if
    /// another candidate created it first).
    async fn create(&mut self) -> Result<Attempt> {
        let mut spec = holding_spec(
            &LeaseSpec::default(),
            &self.shared.identity,
            self.config.lease_seconds(),
            Timestamp::now(),
        );
        spec.lease_transitions = Some(0);
        let written = self.lock.create(spec).await?;
        Ok(self.remember(written))
    }

    /// Records our own successful write as the latest observation.
    fn remember(&mut self, written: Written) -> Attempt {
        match written {
            Written::Done(LeaseRecord {
                spec,
                resource_version,
            }) => {
                self.observed = Some(Observed {
                    spec,
                    resource_version,
                    at: Instant::now(),
                });
                Attempt::Held
            }
            Written::Conflict => Attempt::Conflict,
        }
    }

    /// Hands the lease over at once if it names us: no holder, 1 s duration.
    async fn release(&self) {
        const LATER: &str = "standbys take over when it expires";
        let limit = self.config.renew_deadline;
        match timeout(limit, self.try_release()).await {
            Ok(Ok(true)) => info!("released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(err)) => warn!(error = %err, "could not release the lease; {LATER}"),
            Err(_) => warn!("releasing the lease timed out after {limit:?}; {LATER}"),
        }
    }

    async fn try_release(&self) -> Result<bool> {
        let Some(mut record) = self.lock.get().await? else {
            return Ok(false);
        };
        if record.spec.holder_identity.as_deref() != Some(self.shared.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        record.spec.holder_identity = None;
        record.spec.lease_duration_seconds = Some(1);
        record.spec.acquire_time = Some(now.clone());
        record.spec.renew_time = Some(now);
        match self.lock.update(&record.resource_version, record.spec).await? {
            Written::Done(_) => Ok(true),
            Written::Conflict => {
                info!("lease changed before it could be released");
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LeaderElectionConfig {
        LeaderElectionConfig::new("ns", "lease", "me")
    }

    fn spec(holder: Option<&str>, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_owned),
            lease_duration_seconds: Some(seconds),
            lease_transitions: Some(4),
            acquire_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(config().validate(), Ok(()));
    }

    #[test]
    fn validate_rejects_unsafe_timings_and_empty_identity() {
        let secs = Duration::from_secs_f64;
        let with = |f: fn(&mut LeaderElectionConfig)| {
            let mut c = config();
            f(&mut c);
            c.validate()
        };
        assert!(with(|c| c.identity.clear()).is_err());
        assert!(with(|c| c.lease_name.clear()).is_err());
        assert!(with(|c| c.renew_deadline = c.lease_duration).is_err());
        assert!(
            with(|c| c.renew_deadline = Duration::from_millis(2400)).is_err(),
            "2.4 s = 1.2 × retry is not enough"
        );
        assert!(with(|c| c.renew_deadline = Duration::from_millis(2410)).is_ok());
        assert!(with(|c| c.retry_period = Duration::ZERO).is_err());
        let mut small = config();
        (small.lease_duration, small.renew_deadline, small.retry_period) = (secs(1.5), secs(1.0), secs(0.2));
        assert_eq!(small.validate(), Ok(()));
    }

    #[test]
    fn lease_seconds_round_up() {
        let mut c = config();
        assert_eq!(c.lease_seconds(), 15);
        c.lease_duration = Duration::from_millis(1500);
        assert_eq!(c.lease_seconds(), 2);
        c.lease_duration = Duration::from_millis(300);
        assert_eq!(c.lease_seconds(), 1);
    }

    #[test]
    fn expiry_counts_from_when_the_record_was_seen_to_change() {
        let t0 = Instant::now();
        let fallback = Duration::from_secs(15);
        let seen = Observed::next(None, spec(Some("other"), 3), "1".into(), t0);
        assert!(!seen.available_to("me", fallback, t0 + Duration::from_millis(2999)));
        assert!(seen.available_to("me", fallback, t0 + Duration::from_secs(3)));

        // Seeing the same record again does not restart the clock...
        let again = Observed::next(
            Some(seen.clone()),
            spec(Some("other"), 3),
            "1".into(),
            t0 + Duration::from_secs(2),
        );
        assert_eq!(again.at, t0);
        // ...but any change does, whatever the record's own timestamps say.
        let renewed = Observed::next(
            Some(again),
            spec(Some("other"), 3),
            "2".into(),
            t0 + Duration::from_secs(2),
        );
        assert_eq!(renewed.at, t0 + Duration::from_secs(2));
        assert!(!renewed.available_to("me", fallback, t0 + Duration::from_secs(4)));
        assert_eq!(renewed.expires_at(fallback), t0 + Duration::from_secs(5));
    }

    #[test]
    fn free_or_own_lease_is_available_at_once() {
        let t0 = Instant::now();
        let fallback = Duration::from_secs(15);
        let released = Observed::next(None, spec(None, 1), "1".into(), t0);
        assert!(released.available_to("me", fallback, t0));
        let empty = Observed::next(None, spec(Some(""), 15), "1".into(), t0);
        assert!(empty.available_to("me", fallback, t0));
        let ours = Observed::next(None, spec(Some("me"), 15), "1".into(), t0);
        assert!(ours.available_to("me", fallback, t0));
    }

    #[test]
    fn missing_duration_falls_back_to_our_own() {
        let t0 = Instant::now();
        let mut s = spec(Some("other"), 0);
        s.lease_duration_seconds = None;
        let seen = Observed::next(None, s, "1".into(), t0);
        assert_eq!(
            seen.expires_at(Duration::from_secs(15)),
            t0 + Duration::from_secs(15)
        );
    }

    #[test]
    fn new_holder_counts_a_transition_and_renewal_keeps_it() {
        let now = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let taken = holding_spec(&spec(Some("other"), 15), "me", 15, now);
        assert_eq!(taken.holder_identity.as_deref(), Some("me"));
        assert_eq!(taken.lease_transitions, Some(5));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.renew_time, Some(MicroTime(now)));

        let renewed = holding_spec(&spec(Some("me"), 15), "me", 15, now);
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(Timestamp::UNIX_EPOCH)));
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
    }

    #[test]
    fn jitter_stays_within_client_go_range() {
        let retry = Duration::from_secs(2);
        assert_eq!(jitter(retry, 0.0), retry);
        assert!(jitter(retry, 0.999_999) < Duration::from_millis(4400));
        for _ in 0..10_000 {
            let wait = jittered(retry);
            assert!(wait >= retry && wait < Duration::from_millis(4400), "{wait:?}");
        }
    }

    #[test]
    fn handle_turns_false_at_the_deadline_without_the_loop() {
        let shared = Arc::new(Shared {
            identity: "me".into(),
            valid_until: Mutex::new(None),
            leading: watch::Sender::new(false),
        });
        let handle = LeaderHandle {
            shared: Arc::clone(&shared),
        };
        assert!(!handle.is_leader());
        shared.lead_until(Instant::now() + Duration::from_secs(60));
        assert!(handle.is_leader() && *handle.subscribe().borrow());
        // A deadline in the past: the loop has not noticed yet, the handle has.
        shared.lead_until(Instant::now());
        assert!(!handle.is_leader());
        assert_eq!(handle.ensure_leader(), Err(NotLeader));
        shared.stop_leading();
        assert!(!*handle.subscribe().borrow());
    }

    /// An in-memory Lease shared by candidates; each candidate's handle on it
    /// can be cut off (its calls then hang, as over a dead connection).
    #[derive(Clone, Default)]
    struct FakeLock {
        record: Arc<Mutex<Option<LeaseRecord>>>,
        cut: Arc<std::sync::atomic::AtomicBool>,
        /// Woken at every write, as a watch would be.
        changed: Arc<tokio::sync::Notify>,
        /// This handle's next read misses the Lease, as a read that raced
        /// another candidate's create does.
        miss_next_get: Arc<std::sync::atomic::AtomicBool>,
    }

    impl FakeLock {
        /// Another candidate's handle on the same Lease.
        fn peer(&self) -> FakeLock {
            FakeLock {
                record: self.record.clone(),
                cut: Arc::default(),
                changed: self.changed.clone(),
                miss_next_get: Arc::default(),
            }
        }

        async fn reachable(&self) {
            if self.cut.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
        }

        fn write(&self, expected: Option<&str>, spec: LeaseSpec) -> Written {
            let mut record = lock(&self.record);
            if record.as_ref().map(|r| r.resource_version.as_str()) != expected {
                return Written::Conflict;
            }
            let version = record
                .as_ref()
                .and_then(|r| r.resource_version.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            let written = LeaseRecord {
                spec,
                resource_version: version.to_string(),
            };
            *record = Some(written.clone());
            self.changed.notify_waiters();
            Written::Done(written)
        }
    }

    impl LeaseLock for FakeLock {
        fn describe(&self) -> String {
            "fake/lease".into()
        }
        fn get(&self) -> futures::future::BoxFuture<'_, Result<Option<LeaseRecord>>> {
            Box::pin(async move {
                self.reachable().await;
                if self
                    .miss_next_get
                    .swap(false, std::sync::atomic::Ordering::SeqCst)
                {
                    return Ok(None);
                }
                Ok(lock(&self.record).clone())
            })
        }
        fn create(&self, spec: LeaseSpec) -> futures::future::BoxFuture<'_, Result<Written>> {
            Box::pin(async move {
                self.reachable().await;
                Ok(self.write(None, spec))
            })
        }
        fn update<'a>(
            &'a self,
            rv: &'a str,
            spec: LeaseSpec,
        ) -> futures::future::BoxFuture<'a, Result<Written>> {
            Box::pin(async move {
                self.reachable().await;
                Ok(self.write(Some(rv), spec))
            })
        }
        fn delete<'a>(&'a self, rv: &'a str) -> futures::future::BoxFuture<'a, Result<bool>> {
            Box::pin(async move {
                self.reachable().await;
                let mut record = lock(&self.record);
                let ours = record.as_ref().is_some_and(|r| r.resource_version == rv);
                if ours {
                    *record = None;
                    self.changed.notify_waiters();
                }
                Ok(ours)
            })
        }
        fn released<'a>(&'a self, rv: &'a str) -> futures::future::BoxFuture<'a, ()> {
            Box::pin(async move {
                self.reachable().await;
                loop {
                    // Registered before the look, so a write in between wakes it.
                    let changed = self.changed.notified();
                    let mut changed = std::pin::pin!(changed);
                    changed.as_mut().enable();
                    let free = match lock(&self.record).as_ref() {
                        None => true,
                        Some(r) => {
                            r.resource_version != rv
                                && r.spec.holder_identity.as_deref().is_none_or(str::is_empty)
                        }
                    };
                    if free {
                        return;
                    }
                    changed.await;
                }
            })
        }
    }

    fn candidate(lock: FakeLock, identity: &str) -> LeaderElector {
        let mut config = LeaderElectionConfig::new("ns", "lease", identity);
        config.lease_duration = Duration::from_secs(3);
        config.renew_deadline = Duration::from_secs(2);
        config.retry_period = Duration::from_millis(500);
        LeaderElector::with_lock(Box::new(lock), config).expect("a valid config")
    }

    /// Two candidates on one Lease, the leader then cut off: at no sampled
    /// moment do both lead, and the standby takes over once the cut-off
    /// leader's lease has run out by the standby's own clock.
    #[tokio::test(start_paused = true)]
    async fn one_leader_at_a_time_and_a_cut_off_leader_is_replaced() {
        let a_lock = FakeLock::default();
        let b_lock = a_lock.peer();
        let (a, b) = (candidate(a_lock.clone(), "a"), candidate(b_lock.clone(), "b"));
        let (a_handle, b_handle) = (a.handle(), b.handle());
        let stop = CancellationToken::new();
        let tasks = [
            tokio::spawn(a.run(stop.clone())),
            tokio::spawn(b.run(stop.clone())),
        ];
        let sample = |until: Duration| {
            let (a, b) = (a_handle.clone(), b_handle.clone());
            async move {
                let end = Instant::now() + until;
                while Instant::now() < end {
                    assert!(!(a.is_leader() && b.is_leader()), "two leaders at once");
                    sleep(Duration::from_millis(50)).await;
                }
            }
        };
        sample(Duration::from_secs(10)).await;
        let (leader, standby, cut) = match (a_handle.is_leader(), b_handle.is_leader()) {
            (true, false) => (&a_handle, &b_handle, &a_lock.cut),
            (false, true) => (&b_handle, &a_handle, &b_lock.cut),
            seen => panic!("expected one leader, saw {seen:?}"),
        };
        let leader = leader.clone();
        cut.store(true, std::sync::atomic::Ordering::SeqCst);
        let cut_at = Instant::now();
        while !standby.is_leader() {
            assert!(
                !(leader.is_leader() && standby.is_leader()),
                "two leaders at once"
            );
            sleep(Duration::from_millis(50)).await;
            assert!(
                cut_at.elapsed() < Duration::from_secs(20),
                "the standby never took over"
            );
        }
        assert!(!leader.is_leader(), "the cut-off leader still thinks it leads");
        assert!(
            cut_at.elapsed() >= Duration::from_secs(2),
            "taken over after {:?}: before the lease could run out",
            cut_at.elapsed()
        );
        sample(Duration::from_secs(5)).await;
        stop.cancel();
        for task in tasks {
            task.abort();
        }
    }

    /// Stops the leader a and waits for the standby b to lead; returns how
    /// long after a let go of the Lease that took.
    async fn hand_over(
        stop_a: CancellationToken,
        a_task: tokio::task::JoinHandle<()>,
        a_handle: &LeaderHandle,
        b_handle: &LeaderHandle,
    ) -> Duration {
        let released = Instant::now();
        stop_a.cancel();
        a_task.await.expect("a's election loop");
        assert!(!a_handle.is_leader());
        while !b_handle.is_leader() {
            sleep(Duration::from_millis(1)).await;
            assert!(released.elapsed() < Duration::from_secs(5), "b never took over");
        }
        released.elapsed()
    }

    /// A leader that shuts down hands over: the standby, watching the
    /// Lease, takes it at once instead of on its next retry.
    #[tokio::test(start_paused = true)]
    async fn a_standby_takes_a_released_lease_at_once() {
        let a_lock = FakeLock::default();
        let (a, b) = (candidate(a_lock.clone(), "a"), candidate(a_lock.peer(), "b"));
        let (a_handle, b_handle) = (a.handle(), b.handle());
        let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
        let a_task = tokio::spawn(a.run(stop_a.clone()));
        // a leads first; b only starts campaigning once it does.
        while !a_handle.is_leader() {
            sleep(Duration::from_millis(10)).await;
        }
        let b_task = tokio::spawn(b.run(stop_b.clone()));
        // Past b's first attempt, into its wait between retries.
        sleep(Duration::from_millis(100)).await;
        assert!(!b_handle.is_leader());
        let took = hand_over(stop_a, a_task, &a_handle, &b_handle).await;
        // The retry period is 500 ms (jittered up to 1.1 s); the watch is immediate.
        assert!(
            took < Duration::from_millis(50),
            "b took over {took:?} after the release"
        );
        stop_b.cancel();
        b_task.await.expect("b's election loop");
    }

    /// Candidates that start together race to create the Lease; the loser's
    /// create conflicts. It still watches the Lease from then on, so the
    /// first handoff is as quick as any later one (it used to sleep a retry
    /// period after the conflict before it read the Lease and watched).
    #[tokio::test(start_paused = true)]
    async fn a_standby_that_lost_the_create_race_takes_a_released_lease_at_once() {
        let a_lock = FakeLock::default();
        let b_lock = a_lock.peer();
        let (a, b) = (candidate(a_lock.clone(), "a"), candidate(b_lock.clone(), "b"));
        let (a_handle, b_handle) = (a.handle(), b.handle());
        let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
        let a_task = tokio::spawn(a.run(stop_a.clone()));
        while !a_handle.is_leader() {
            sleep(Duration::from_millis(10)).await;
        }
        // b read before a's create landed: its own create conflicts.
        b_lock
            .miss_next_get
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let b_task = tokio::spawn(b.run(stop_b.clone()));
        sleep(Duration::from_millis(20)).await;
        assert!(!b_handle.is_leader());
        assert!(
            !b_lock.miss_next_get.load(std::sync::atomic::Ordering::SeqCst),
            "b has not tried yet"
        );
        let took = hand_over(stop_a, a_task, &a_handle, &b_handle).await;
        assert!(
            took < Duration::from_millis(50),
            "b took over {took:?} after the release: it slept a retry period after its conflict"
        );
        stop_b.cancel();
        b_task.await.expect("b's election loop");
    }
}
