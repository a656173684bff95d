//! Lease leader election against the real local control plane: at most one
//! leader under churn, failover after a crash, fast handover on graceful
//! release, and a cut-off leader that stops before its lease can expire for
//! anyone else.
//!
//! Leadership is measured by sampling every candidate's `is_leader()` every
//! millisecond on a plain thread: a term runs from the first to the last sample
//! that saw it true, which lies inside the real term. Two sampled terms that
//! overlap therefore prove a real overlap; overlaps shorter than a sample gap
//! would go unseen, but every real handover here leaves at least one API round
//! trip between the old leader stopping and the new one starting.

use crate::support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::support::late::HoldingLink;
use crate::support::{TcpProxy, TestEnv};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use nodewarden::runtime::leader::{LeaderElectionConfig, LeaderElector, LeaderHandle};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "nodewarden-leader";

/// Scheduling and API latency allowed on top of the protocol's own bounds
/// (the test machine is small and shared with other builds).
const SLACK: Duration = Duration::from_millis(500);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Clone, Copy, Debug)]
struct Timings {
    lease: Duration,
    renew: Duration,
    retry: Duration,
}

impl Timings {
    fn secs(lease: f64, renew: f64, retry: f64) -> Self {
        Timings {
            lease: Duration::from_secs_f64(lease),
            renew: Duration::from_secs_f64(renew),
            retry: Duration::from_secs_f64(retry),
        }
    }

    /// The longest a jittered acquire retry waits: 2.2 × retry_period.
    fn max_retry_wait(&self) -> Duration {
        self.retry.mul_f64(2.2)
    }
}

fn config(namespace: &str, identity: &str, t: Timings) -> LeaderElectionConfig {
    LeaderElectionConfig {
        namespace: namespace.to_owned(),
        lease_name: LEASE.to_owned(),
        identity: identity.to_owned(),
        lease_duration: t.lease,
        renew_deadline: t.renew,
        retry_period: t.retry,
    }
}

/// One running candidate.
struct Candidate {
    handle: LeaderHandle,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

fn start(client: Client, config: LeaderElectionConfig) -> Candidate {
    let elector = LeaderElector::new(client, config).expect("a valid config");
    let handle = elector.handle();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(elector.run(shutdown.clone()));
    Candidate {
        handle,
        shutdown,
        task,
    }
}

/// Waits for the handle's watch channel to say "leading", then a little
/// longer so the recorder has sampled the new term.
async fn wait_until_leading(handle: &LeaderHandle, within: Duration) {
    let mut leading = handle.subscribe();
    let waited = tokio::time::timeout(within, leading.wait_for(|l| *l)).await;
    assert!(
        matches!(waited, Ok(Ok(_))),
        "{} did not become leader within {within:?}",
        handle.identity()
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Lets the standby see a few renewals, ending at a random point of the
/// leader's renew cycle.
async fn settle(t: Timings) {
    let phase = t.retry.mul_f64(rand::random::<f64>());
    tokio::time::sleep(Duration::from_secs(2) + phase).await;
}

/// One term as sampled (see the module comment).
#[derive(Clone, Debug)]
struct Term {
    identity: String,
    /// First and last samples that saw `is_leader()` true.
    first: Instant,
    last: Instant,
    /// First sample that saw it false again, if any.
    ended: Option<Instant>,
}

type Registry = Arc<Mutex<Vec<LeaderHandle>>>;

/// Samples `is_leader()` of every registered handle every millisecond.
struct Recorder {
    handles: Registry,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Term>>,
}

impl Recorder {
    fn start() -> Self {
        let handles = Registry::default();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (handles, stop) = (Arc::clone(&handles), Arc::clone(&stop));
            std::thread::spawn(move || sample(&handles, &stop))
        };
        Recorder {
            handles,
            stop,
            thread,
        }
    }

    fn registry(&self) -> Registry {
        Arc::clone(&self.handles)
    }

    fn watch(&self, handle: &LeaderHandle) {
        lock(&self.handles).push(handle.clone());
    }

    fn finish(self) -> Vec<Term> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampling thread panicked")
    }
}

fn sample(handles: &Mutex<Vec<LeaderHandle>>, stop: &AtomicBool) -> Vec<Term> {
    let mut terms: Vec<Term> = Vec::new();
    // Per handle: the index of its open term in `terms`.
    let mut open: Vec<Option<usize>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let handles = lock(handles);
        open.resize(handles.len(), None);
        for (handle, open) in handles.iter().zip(open.iter_mut()) {
            let leading = handle.is_leader();
            let now = Instant::now();
            match (*open, leading) {
                (None, true) => {
                    *open = Some(terms.len());
                    terms.push(Term {
                        identity: handle.identity().to_owned(),
                        first: now,
                        last: now,
                        ended: None,
                    });
                }
                (Some(i), true) => terms[i].last = now,
                (Some(i), false) => {
                    terms[i].ended = Some(now);
                    *open = None;
                }
                (None, false) => {}
            }
        }
        drop(handles);
        std::thread::sleep(Duration::from_millis(1));
    }
    terms
}

/// Panics if two terms overlap in time. Identities are unique per elector, so
/// this also rejects an old and a new incarnation of one slot leading at once.
fn assert_no_overlap(terms: &[Term]) {
    let mut sorted: Vec<&Term> = terms.iter().collect();
    sorted.sort_by_key(|t| t.first);
    let mut latest: Option<&Term> = None;
    for term in sorted {
        if let Some(prev) = latest {
            assert!(
                prev.last < term.first,
                "two leaders at once: {} led until {:?} after {} started\n{prev:?}\n{term:?}",
                prev.identity,
                prev.last - term.first,
                term.identity,
            );
        }
        if latest.is_none_or(|l| term.last > l.last) {
            latest = Some(term);
        }
    }
}

fn term_of<'a>(terms: &'a [Term], identity: &str) -> &'a Term {
    terms
        .iter()
        .find(|t| t.identity == identity)
        .unwrap_or_else(|| panic!("{identity} never led; terms: {terms:?}"))
}

async fn lease_holder(client: &Client, namespace: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), namespace)
        .get_opt(LEASE)
        .await
        .expect("reading the lease")?;
    lease.spec?.holder_identity
}

/// Many short terms among three slots that keep stopping (mostly gracefully,
/// sometimes by abort) and restarting with a fresh identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_one_leader_under_churn() {
    support::init_test_logging();
    let env = TestEnv::new("leader-churn").await;
    let t = Timings::secs(1.5, 1.0, 0.1);
    let run_for = Duration::from_secs(75);
    let recorder = Recorder::start();
    let until = Instant::now() + run_for;

    let mut slots = Vec::new();
    for slot in 0..3 {
        let client = support::control_plane().client().await;
        let (namespace, registry) = (env.namespace.clone(), recorder.registry());
        slots.push(tokio::spawn(churn(slot, client, namespace, t, registry, until)));
    }
    let mut stops = Stops::default();
    for slot in slots {
        let s = slot.await.expect("a churn task panicked");
        stops.graceful += s.graceful;
        stops.aborted += s.aborted;
    }
    // Let aborted electors' handles run out before the sampling stops.
    tokio::time::sleep(t.renew).await;
    let terms = recorder.finish();

    let lease = Api::<Lease>::namespaced(env.client.clone(), &env.namespace)
        .get(LEASE)
        .await
        .expect("reading the lease");
    let transitions = lease.spec.and_then(|s| s.lease_transitions).unwrap_or(0);
    println!(
        "churn: {} terms in {run_for:?} ({} electors stopped gracefully, {} aborted); leaseTransitions {transitions}",
        terms.len(),
        stops.graceful,
        stops.aborted
    );
    assert_no_overlap(&terms);
    let gaps: Vec<Duration> = {
        let mut sorted: Vec<&Term> = terms.iter().collect();
        sorted.sort_by_key(|t| t.first);
        sorted.windows(2).map(|w| w[1].first - w[0].last).collect()
    };
    if let Some(shortest) = gaps.iter().min() {
        println!("churn: shortest gap between two terms {shortest:?}");
    }
    assert!(
        terms.len() >= 100,
        "only {} terms: the churn did not exercise the election",
        terms.len()
    );
    env.cleanup().await;
}

#[derive(Default)]
struct Stops {
    graceful: usize,
    aborted: usize,
}

/// One slot: start an elector, wait a random while for leadership, hold it
/// briefly, stop (5 % by abort, i.e. a crash without release), repeat.
async fn churn(
    slot: usize,
    client: Client,
    namespace: String,
    t: Timings,
    registry: Registry,
    until: Instant,
) -> Stops {
    let ms = |range: std::ops::Range<u64>| Duration::from_millis(rand::random_range(range));
    let mut stops = Stops::default();
    let mut incarnation = 0;
    while Instant::now() < until {
        incarnation += 1;
        let identity = format!("slot{slot}-{incarnation}");
        let candidate = start(client.clone(), config(&namespace, &identity, t));
        lock(&registry).push(candidate.handle.clone());
        let mut leading = candidate.handle.subscribe();
        let patience = ms(500..4000);
        let led = matches!(
            tokio::time::timeout(patience, leading.wait_for(|l| *l)).await,
            Ok(Ok(_))
        );
        if led {
            tokio::time::sleep(ms(0..250)).await;
        }
        if rand::random_bool(0.05) {
            candidate.task.abort();
            stops.aborted += 1;
        } else {
            candidate.shutdown.cancel();
            let _ = candidate.task.await;
            stops.graceful += 1;
        }
        tokio::time::sleep(ms(0..200)).await;
    }
    stops
}

/// Candidate "a" leads, then "b" joins as standby; both watched by `recorder`.
async fn leader_and_standby(env: &TestEnv, t: Timings, recorder: &Recorder) -> (Candidate, Candidate) {
    let cp = support::control_plane();
    let a = start(cp.client().await, config(&env.namespace, "a", t));
    recorder.watch(&a.handle);
    wait_until_leading(&a.handle, Duration::from_secs(10)).await;
    let b = start(cp.client().await, config(&env.namespace, "b", t));
    recorder.watch(&b.handle);
    settle(t).await;
    assert!(
        a.handle.is_leader() && !b.handle.is_leader(),
        "a should still lead"
    );
    (a, b)
}

/// Two candidates; the leader's task is aborted (no release). The standby must
/// take over within lease_duration + 2.2 × retry_period, and not before the
/// crashed leader's handle turned false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashed_leader_is_replaced_within_lease_duration() {
    support::init_test_logging();
    let env = TestEnv::new("leader-crash").await;
    let t = Timings::secs(3.0, 2.0, 0.5);
    let recorder = Recorder::start();
    let (a, b) = leader_and_standby(&env, t, &recorder).await;

    let crashed = Instant::now();
    a.task.abort();
    let bound = t.lease + t.max_retry_wait();
    wait_until_leading(&b.handle, bound + Duration::from_secs(10)).await;
    let terms = recorder.finish();

    let (a_term, b_term) = (term_of(&terms, "a"), term_of(&terms, "b"));
    let failover = b_term.first - crashed;
    let a_stopped = a_term.ended.map(|e| e - crashed);
    println!(
        "crash failover: b led {failover:?} after a was aborted (bound {bound:?} + slack {SLACK:?}); \
         a's handle turned false {a_stopped:?} after the abort"
    );
    assert_no_overlap(&terms);
    assert!(
        failover <= bound + SLACK,
        "failover took {failover:?}, bound {bound:?}"
    );
    b.shutdown.cancel();
    let _ = b.task.await;
    env.cleanup().await;
}

/// Two candidates; the leader is shut down gracefully and releases the lease.
/// The standby must lead within one jittered retry period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_lease_is_taken_over_within_a_retry_period() {
    support::init_test_logging();
    let env = TestEnv::new("leader-release").await;
    let t = Timings::secs(3.0, 2.0, 0.5);
    let recorder = Recorder::start();
    let (a, b) = leader_and_standby(&env, t, &recorder).await;

    let released = Instant::now();
    a.shutdown.cancel();
    let a_done = tokio::time::timeout(Duration::from_secs(5), a.task).await;
    assert!(matches!(a_done, Ok(Ok(()))), "a did not shut down: {a_done:?}");
    let a_exited = released.elapsed();
    let bound = t.max_retry_wait();
    wait_until_leading(&b.handle, bound + Duration::from_secs(10)).await;
    let terms = recorder.finish();

    let handover = term_of(&terms, "b").first - released;
    println!(
        "graceful release: a exited {a_exited:?} and b led {handover:?} after a was cancelled \
         (bound {bound:?} + slack {SLACK:?})"
    );
    assert_no_overlap(&terms);
    assert!(
        handover <= bound + SLACK,
        "handover took {handover:?}, bound {bound:?}"
    );
    assert_eq!(
        lease_holder(&env.client, &env.namespace).await.as_deref(),
        Some("b")
    );
    b.shutdown.cancel();
    let _ = b.task.await;
    assert_eq!(
        lease_holder(&env.client, &env.namespace).await,
        None,
        "b released on shutdown"
    );
    env.cleanup().await;
}

/// How the proxy cuts its clients off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Drop every connection and refuse new ones: requests fail fast.
    Sever,
    /// Keep connections open but forward nothing: requests hang.
    Stall,
}

impl Cut {
    fn apply(self, proxy: &TcpProxy) {
        match self {
            Cut::Sever => proxy.cut(),
            Cut::Stall => proxy.stall(),
        }
    }
}

/// One read of the lease by the observer: when it was sent and what came back.
struct Read {
    sent: Instant,
    resource_version: String,
    holder: Option<String>,
    seconds: Option<i32>,
}

/// Reads the lease every 20 ms until cancelled.
async fn observe_lease(client: Client, namespace: String, stop: CancellationToken) -> Vec<Read> {
    let api = Api::<Lease>::namespaced(client, &namespace);
    let mut reads = Vec::new();
    while !stop.is_cancelled() {
        let sent = Instant::now();
        if let Ok(Some(lease)) = api.get_opt(LEASE).await {
            let spec = lease.spec.unwrap_or_default();
            reads.push(Read {
                sent,
                resource_version: lease.metadata.resource_version.unwrap_or_default(),
                holder: spec.holder_identity,
                seconds: spec.lease_duration_seconds,
            });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    reads
}

/// The earliest moment anyone could judge `holder`'s last record expired: its
/// commit came after the last read that still returned the record before it,
/// and nobody saw it before its commit.
fn earliest_expiry(reads: &[Read], holder: &str) -> Instant {
    let last = reads
        .iter()
        .rposition(|r| r.holder.as_deref() == Some(holder))
        .unwrap_or_else(|| panic!("the observer never saw {holder} hold the lease"));
    let version = &reads[last].resource_version;
    let first = reads
        .iter()
        .position(|r| &r.resource_version == version)
        .expect("the record was read");
    assert!(
        first > 0,
        "the observer must have seen the record before {holder}'s last one"
    );
    let seconds = reads[last]
        .seconds
        .and_then(|s| u64::try_from(s).ok())
        .expect("leaseDurationSeconds");
    reads[first - 1].sent + Duration::from_secs(seconds)
}

/// The leader's connection to the API server is cut. Its handle must turn
/// false before anyone could consider its lease expired, its watch channel
/// must follow, and the standby must lead only after that.
async fn cut_off_leader(mode: Cut) {
    support::init_test_logging();
    let env = TestEnv::new(&format!("leader-cut-{mode:?}")).await;
    let t = Timings::secs(3.0, 2.0, 0.5);
    let cp = support::control_plane();
    let stop_observer = CancellationToken::new();
    let observer = tokio::spawn(observe_lease(
        cp.client().await,
        env.namespace.clone(),
        stop_observer.clone(),
    ));
    let recorder = Recorder::start();

    let proxy = TcpProxy::start(cp.apiserver_addr()).await;
    let cut_off = start(cp.client_via(&proxy).await, config(&env.namespace, "cut-off", t));
    recorder.watch(&cut_off.handle);
    wait_until_leading(&cut_off.handle, Duration::from_secs(10)).await;
    let standby = start(cp.client().await, config(&env.namespace, "standby", t));
    recorder.watch(&standby.handle);
    settle(t).await;
    assert!(
        cut_off.handle.is_leader(),
        "the proxied candidate should still lead"
    );

    // Note when the watch channel follows the handle.
    let mut leading = cut_off.handle.subscribe();
    let watch_off = tokio::spawn(async move {
        let _ = leading.wait_for(|l| !*l).await;
        Instant::now()
    });
    let cut = Instant::now();
    mode.apply(&proxy);
    wait_until_leading(
        &standby.handle,
        t.lease + t.max_retry_wait() + Duration::from_secs(10),
    )
    .await;
    // Bounded: a renew loop stuck in a hung call would never flip the channel.
    let watch_off = tokio::time::timeout(SLACK, watch_off).await;
    stop_observer.cancel();
    let reads = observer.await.expect("the observer task");
    let terms = recorder.finish();

    let watch_off = watch_off.ok().and_then(Result::ok);
    let old = term_of(&terms, "cut-off");
    let new = term_of(&terms, "standby");
    let stopped = old.ended.expect("the cut-off leader's handle turned false");
    let expiry = earliest_expiry(&reads, "cut-off");
    println!(
        "cut-off leader ({mode:?}): handle false {:?} after the cut, {:?} before the lease could \
         expire for anyone ({:?} after the cut); watch followed {:?} later; standby led {:?} after the cut",
        stopped - cut,
        expiry.saturating_duration_since(stopped),
        expiry - cut,
        watch_off.map(|w| w.saturating_duration_since(stopped)),
        new.first - cut,
    );
    assert!(
        stopped < expiry,
        "the cut-off leader was still leader when its lease could expire"
    );
    assert!(
        new.first >= expiry,
        "the standby led before the lease could have expired"
    );
    assert!(
        new.first > old.last,
        "the standby led while the cut-off leader still did"
    );
    assert!(
        watch_off.is_some_and(|w| w <= stopped + Duration::from_millis(300)),
        "the watch channel did not follow the handle within 300 ms"
    );
    assert_no_overlap(&terms);

    // Shutting the cut-off candidate down must not hang on the dead connection.
    cut_off.shutdown.cancel();
    let done = tokio::time::timeout(t.renew * 2 + SLACK, cut_off.task).await;
    assert!(done.is_ok(), "the cut-off candidate did not shut down");
    standby.shutdown.cancel();
    let _ = standby.task.await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn severed_leader_stops_before_its_lease_expires() {
    cut_off_leader(Cut::Sever).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_leader_stops_before_its_lease_expires() {
    cut_off_leader(Cut::Stall).await;
}

/// The controllers' client writes only within the replica's term: a write is
/// refused before the replica leads, and one stuck on a stalled connection is
/// abandoned by the renew deadline, so the replica stops acting. The fence
/// cannot recall a request already on the wire; what keeps its late arrival
/// harmless is the write's precondition. Here the stuck write reaches the API
/// server after a successor took the lease and acted, and is refused there
/// (409 Conflict): the object keeps the successor's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_client_writes_only_within_the_lease_term() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;
    use nodewarden::runtime::error::Category;
    use nodewarden::runtime::fence::fenced;

    support::init_test_logging();
    let env = TestEnv::new("leader-fence").await;
    let t = Timings::secs(3.0, 2.0, 0.5);
    let cp = support::control_plane();
    // The election's Lease writes go through the proxy (stalled, they cannot
    // renew); the fenced writes through a link that holds them and delivers
    // them late.
    let proxy = TcpProxy::start(cp.apiserver_addr()).await;
    let elector = LeaderElector::new(cp.client_via(&proxy).await, config(&env.namespace, "fenced", t))
        .expect("a valid config");
    let handle = elector.handle();
    let link = HoldingLink::new(cp.client().await);
    let writes = Api::<ConfigMap>::namespaced(fenced(link.client(), handle.clone()), &env.namespace);
    let admin = Api::<ConfigMap>::namespaced(cp.client().await, &env.namespace);
    let config_map = |name: &str, owner: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"owner": owner}}))
            .expect("a ConfigMap")
    };
    let owned_by = |mut cm: ConfigMap, owner: &str| -> ConfigMap {
        cm.data
            .get_or_insert_default()
            .insert("owner".into(), owner.into());
        cm
    };
    let owner = |cm: &ConfigMap| cm.data.as_ref().and_then(|d| d.get("owner")).cloned();
    let category = |e: kube::Error| nodewarden::error::Error::from(e).category();

    let refused = writes
        .create(&PostParams::default(), &config_map("before", "fenced"))
        .await;
    assert_eq!(
        refused.map(drop).map_err(category),
        Err(Category::NotLeader),
        "a write before leading is refused"
    );
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(elector.run(shutdown.clone()));
    wait_until_leading(&handle, Duration::from_secs(10)).await;
    writes
        .create(&PostParams::default(), &config_map("state", "fenced"))
        .await
        .expect("a write while leading");
    // What the leader decides on: the object at this resourceVersion.
    let seen = writes
        .get("state")
        .await
        .expect("reads pass the fence whoever leads");

    proxy.stall();
    link.hold();
    let started = Instant::now();
    let stuck = writes
        .replace("state", &PostParams::default(), &owned_by(seen, "fenced, late"))
        .await;
    let took = started.elapsed();
    assert_eq!(
        stuck.map(drop).map_err(category),
        Err(Category::NotLeader),
        "a write stuck past the renew deadline is abandoned"
    );
    assert!(
        took <= t.renew + SLACK,
        "abandoned after {took:?}, later than the renew deadline {:?}",
        t.renew
    );
    assert!(
        !handle.is_leader(),
        "the replica stopped leading with its write abandoned"
    );
    assert_eq!(link.held(), 1, "the abandoned write is still on its way");

    // A successor takes the lease once it expires, and acts on what it reads.
    let successor = LeaderElector::new(cp.client().await, config(&env.namespace, "successor", t))
        .expect("a valid config");
    let successor_handle = successor.handle();
    let successor_task = tokio::spawn(successor.run(shutdown.clone()));
    wait_until_leading(&successor_handle, Duration::from_secs(15)).await;
    let successor_writes = Api::<ConfigMap>::namespaced(
        fenced(cp.client().await, successor_handle.clone()),
        &env.namespace,
    );
    let current = successor_writes.get("state").await.expect("reading the state");
    successor_writes
        .replace("state", &PostParams::default(), &owned_by(current, "successor"))
        .await
        .expect("the successor's write");

    // The stalled write arrives now, after the leader change: refused.
    proxy.restore();
    let answers = link.deliver().await;
    assert_eq!(answers.len(), 1, "one late write: {answers:?}");
    let late = &answers[0];
    assert_eq!(
        (late.method.as_str(), late.status),
        ("PUT", http::StatusCode::CONFLICT),
        "the late write is refused by its precondition: {}",
        late.describe()
    );
    assert!(!late.sender_waited, "its sender had given up on it");
    let now = admin.get("state").await.expect("reading the state");
    assert_eq!(
        owner(&now).as_deref(),
        Some("successor"),
        "the object shows the successor's state"
    );
    assert!(admin.get_opt("before").await.expect("reading").is_none());
    shutdown.cancel();
    let _ = task.await;
    let _ = successor_task.await;
    env.cleanup().await;
}
