//! The faults every chaos run shares: the API server restarted (once after
//! etcd was compacted, so resumed watches get 410), the leader SIGKILLed or
//! cut off from the API server while its process lives on. And the checks
//! that follow a run: no replica wrote outside its lease term (the audit
//! log), and the compaction did expire watches.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;

use super::replicas::{Replicas, SYSTEM_NAMESPACE, holder, wait_for_new_leader};
use super::{Probe, audit, control_plane, wait_for};

/// The replicas' `--lease-duration` (`support::replicas::TEST_ELECTION`).
pub const LEASE_DURATION: Duration = Duration::from_secs(3);

/// A fault of the cluster or of the replicas.
#[derive(Clone, Copy, Debug)]
pub enum ClusterFault {
    /// kube-apiserver SIGKILLed and started again, etcd kept.
    ApiserverRestarted,
    /// etcd compacted to its current revision, then kube-apiserver
    /// restarted: every watch resumed from before gets 410 Gone.
    EtcdCompactedAndApiserverRestarted,
    /// SIGKILL of the leader (restarted under its name once another leads).
    LeaderKilled,
    /// The leader's connections to the API server cut for `cut` (longer
    /// than its lease), its process left running.
    LeaderCutOff { cut: Duration },
}

impl ClusterFault {
    /// Each fault once, the leader killed twice; the cut-off drawn from `rng`.
    pub fn all(rng: &mut impl rand::Rng) -> Vec<ClusterFault> {
        vec![
            ClusterFault::ApiserverRestarted,
            ClusterFault::EtcdCompactedAndApiserverRestarted,
            ClusterFault::LeaderKilled,
            ClusterFault::LeaderKilled,
            ClusterFault::LeaderCutOff {
                cut: Duration::from_millis(rng.random_range(4000..7000)),
            },
        ]
    }
}

/// The replicas under fault, and a log of what happened when.
pub struct Faulted {
    pub replicas: tokio::sync::Mutex<Replicas>,
    pub leases: Api<Lease>,
    pub lease_name: String,
    pub started: Instant,
    log: Mutex<Vec<String>>,
}

impl Faulted {
    pub fn new(replicas: Replicas, client: kube::Client, lease_name: &str) -> Faulted {
        Faulted {
            replicas: tokio::sync::Mutex::new(replicas),
            leases: Api::namespaced(client, SYSTEM_NAMESPACE),
            lease_name: lease_name.to_string(),
            started: Instant::now(),
            log: Mutex::default(),
        }
    }

    /// Prints `what` with the time since the start, and keeps it for the summary.
    pub fn record(&self, what: String) {
        let line = format!("{:>7.2?} {what}", self.started.elapsed());
        println!("chaos: {line}");
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }

    /// Everything recorded, in order.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub async fn leader(&self) -> String {
        wait_for("a leader", Duration::from_secs(30), || async {
            match holder(&self.leases, &self.lease_name).await {
                Some(h) => Probe::Done(h),
                None => Probe::NotYet("no holder".into()),
            }
        })
        .await
    }

    /// Carries out one fault; what happened, for the log.
    pub async fn strike(&self, fault: ClusterFault) -> String {
        match fault {
            ClusterFault::ApiserverRestarted => {
                let took = restart_apiserver().await;
                format!("kube-apiserver restarted in {took:?}")
            }
            ClusterFault::EtcdCompactedAndApiserverRestarted => {
                let revision = control_plane().compact_etcd().await;
                let took = restart_apiserver().await;
                format!("etcd compacted at revision {revision}, kube-apiserver restarted in {took:?}")
            }
            ClusterFault::LeaderKilled => {
                let mut replicas = self.replicas.lock().await;
                let leader = self.leader().await;
                let killed = Instant::now();
                replicas.kill(&leader).await;
                let (next, took) = wait_for_new_leader(&self.leases, &self.lease_name, &leader, killed).await;
                replicas.restart(&leader);
                format!("leader {leader} SIGKILLed; {next} took over after {took:?}")
            }
            ClusterFault::LeaderCutOff { cut } => {
                let mut replicas = self.replicas.lock().await;
                let leader = self.leader().await;
                let since = Instant::now();
                replicas.links[&leader].proxy.cut();
                let (next, took) = wait_for_new_leader(&self.leases, &self.lease_name, &leader, since).await;
                tokio::time::sleep(cut.saturating_sub(since.elapsed())).await;
                let alive = replicas.is_running(&leader);
                replicas.links[&leader].proxy.restore();
                assert!(alive, "{leader} exited while cut off: it must wait to lead again");
                format!(
                    "leader {leader} cut off for {:?} (alive throughout); {next} took over after {took:?}",
                    since.elapsed()
                )
            }
        }
    }
}

pub async fn restart_apiserver() -> Duration {
    let start = Instant::now();
    tokio::task::spawn_blocking(|| control_plane().restart_apiserver())
        .await
        .expect("restarting kube-apiserver");
    start.elapsed()
}

/// How many times the replicas' logs say a watch expired (410).
pub fn expired_watches(replicas: &Replicas) -> usize {
    replicas
        .identities()
        .iter()
        .map(|id| {
            std::fs::read_to_string(replicas.logs.join(format!("{id}.log")))
                .unwrap_or_default()
                .matches("watch expired (410)")
                .count()
        })
        .sum()
}

/// Asserts that no replica (each with its own token: `Replicas::start_linked`)
/// wrote outside its term of the election Lease `lease_name` since `since`,
/// by the API server's audit log. Returns what was checked.
pub fn assert_writes_within_terms(
    replicas: &Replicas,
    lease_name: &str,
    since: Timestamp,
) -> audit::TermCheck {
    let tokens: BTreeMap<String, String> = replicas
        .links
        .iter()
        .map(|(identity, link)| (link.token_id.clone(), identity.clone()))
        .collect();
    let writes = audit::writes_since(&control_plane().audit_log(), since);
    let terms = audit::writes_outside_terms(&writes, &tokens, (SYSTEM_NAMESPACE, lease_name), LEASE_DURATION);
    assert!(
        terms.breaches.is_empty(),
        "writes outside the writer's lease term: {:#?}",
        terms.breaches
    );
    assert!(
        terms.checked.values().sum::<usize>() > 0,
        "the audit log recorded the replicas' writes"
    );
    terms
}

/// After a passing run: the replicas stopped, their logs and the election
/// Lease removed (a failing run keeps the logs, where it is explained).
pub async fn tear_down(mut replicas: Replicas, client: &kube::Client, lease_name: &str) {
    replicas.running.clear();
    let _ = std::fs::remove_dir_all(&replicas.logs);
    let _ = Api::<Lease>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .delete(lease_name, &kube::api::DeleteParams::default())
        .await;
}
