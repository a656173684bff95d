//! Leader failover as users see it: three `nodewarden run` replicas with
//! production's election flags (lease 15 s, renew deadline 10 s, retry 2 s)
//! on the local control plane. The leader is stopped — SIGTERM (it
//! releases the lease) or SIGKILL (it cannot) — and two times are taken from
//! the moment of the signal: until the Lease names another replica, and
//! until that replica's first reconcile (its
//! `nodewarden_reconcile_duration_seconds` count rises; a NodeMaintenance
//! gives it something to reconcile at once).
//!
//! `cargo bench --bench failover` (or `just bench-failover`) runs 5 SIGTERM
//! and 3 SIGKILL trials and prints the figures. Under `cargo test`
//! (`just test`) it runs one SIGTERM trial, so the command cannot rot.

use nodewarden_testkit as support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, PostParams};
use nodewarden::api::node_maintenance::medik8s::NodeMaintenance;
use serde_json::json;
use support::replicas::*;
use support::{Probe, RUN_LABEL, TestEnv, wait_for};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stop {
    Term,
    Kill,
}

/// One trial's figures, from the signal.
struct Trial {
    new_leader: Duration,
    first_reconcile: Duration,
}

/// The replica's reconciles so far (all controllers), or None while it does not answer.
async fn reconciles(replicas: &Replicas, identity: &str) -> Option<f64> {
    let addr = replicas.http.get(identity)?;
    let text = support::jaeger::http_get(&format!("http://{addr}/metrics"))
        .await
        .ok()?;
    Some(
        text.lines()
            .filter(|l| l.starts_with("nodewarden_reconcile_duration_seconds_count"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum(),
    )
}

/// Whether the replica's /readyz answers 200: every store has its first list.
async fn ready(replicas: &Replicas, identity: &str) -> bool {
    let Some(addr) = replicas.http.get(identity) else {
        return false;
    };
    support::jaeger::http_get(&format!("http://{addr}/readyz"))
        .await
        .is_ok()
}

async fn trial(replicas: &mut Replicas, leases: &Api<Lease>, lease_name: &str, stop: Stop) -> Trial {
    let leader = wait_for("a leader", Duration::from_secs(60), || async {
        match holder(leases, lease_name).await {
            Some(h) => Probe::Done(h),
            None => Probe::NotYet("no holder".into()),
        }
    })
    .await;
    // Every standby is ready (its caches synced, as a pod's readiness probe
    // would wait for before a rollout stops the leader), and its count
    // before it leads.
    let mut before = std::collections::BTreeMap::new();
    for id in replicas.identities().into_iter().filter(|id| *id != leader) {
        let count = wait_for(&format!("{id} ready"), Duration::from_secs(60), || async {
            if !ready(replicas, &id).await {
                return Probe::NotYet("/readyz not 200".into());
            }
            match reconciles(replicas, &id).await {
                Some(c) => Probe::Done(c),
                None => Probe::NotYet("no answer".into()),
            }
        })
        .await;
        before.insert(id, count);
    }
    let signalled = Instant::now();
    match stop {
        Stop::Term => replicas.sigterm(&leader),
        Stop::Kill => replicas.kill(&leader).await,
    }
    let (next, new_leader) = wait_for_new_leader(leases, lease_name, &leader, signalled).await;
    let was = before.get(&next).copied().unwrap_or_default();
    loop {
        if reconciles(replicas, &next).await.is_some_and(|c| c > was) {
            break;
        }
        assert!(
            signalled.elapsed() < Duration::from_secs(60),
            "{next} leads but has not reconciled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first_reconcile = signalled.elapsed();
    // The stopped replica comes back as a standby (a pod's container restarted).
    if stop == Stop::Term {
        replicas.wait_exit(&leader).await;
    }
    replicas.restart(&leader);
    println!(
        "failover: {stop:?} of {leader}: {next} leads after {new_leader:.2?}, reconciles after {first_reconcile:.2?}"
    );
    Trial {
        new_leader,
        first_reconcile,
    }
}

/// Median and max of one figure over the trials.
fn median_max(trials: &[Trial], pick: fn(&Trial) -> Duration) -> (Duration, Duration) {
    let mut v: Vec<Duration> = trials.iter().map(pick).collect();
    v.sort();
    (
        v.get(v.len() / 2).copied().unwrap_or_default(),
        v.last().copied().unwrap_or_default(),
    )
}

/// Prints the trials' summary and returns it as JSON.
fn summary(what: &str, trials: &[Trial]) -> serde_json::Value {
    let (leader_median, leader_max) = median_max(trials, |t| t.new_leader);
    let (reconcile_median, reconcile_max) = median_max(trials, |t| t.first_reconcile);
    println!(
        "failover: {what} ({} trials): new leader median {leader_median:.2?}, max {leader_max:.2?}; first reconcile median {reconcile_median:.2?}, max {reconcile_max:.2?}",
        trials.len(),
    );
    json!({
        "trials": trials.len(),
        "new_leader_median_seconds": leader_median.as_secs_f64(),
        "new_leader_max_seconds": leader_max.as_secs_f64(),
        "first_reconcile_median_seconds": reconcile_median.as_secs_f64(),
        "first_reconcile_max_seconds": reconcile_max.as_secs_f64(),
    })
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` does not.
    let full = std::env::args().any(|a| a == "--bench");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(run(full));
}

async fn run(full: bool) {
    let env = TestEnv::new("failover").await;
    // Its own control plane may be fresh: the CRDs go in first.
    support::install_crds(&env.client).await;
    let nodes = env.create_kwok_nodes(1, &[]).await;
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": env.name("failover"), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": nodes[0], "reason": "something to reconcile"},
    }))
    .expect("a NodeMaintenance");
    Api::<NodeMaintenance>::all(env.client.clone())
        .create(&PostParams::default(), &nm)
        .await
        .expect("creating a NodeMaintenance");

    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    // Traces go nowhere: the exporter's failures do not touch the election.
    let mut replicas =
        Replicas::start_default_election(3, &env, &kubeconfig, &lease_name, "http://127.0.0.1:9", &[], &dir);
    let (terms, kills) = if full { (5, 3) } else { (1, 0) };
    let mut graceful = Vec::new();
    for _ in 0..terms {
        graceful.push(trial(&mut replicas, &leases, &lease_name, Stop::Term).await);
    }
    let mut crashes = Vec::new();
    for _ in 0..kills {
        crashes.push(trial(&mut replicas, &leases, &lease_name, Stop::Kill).await);
    }
    println!("failover: default flags: --lease-duration 15 --renew-deadline 10 --retry-period 2");
    let report = json!({
        "command": "cargo bench --bench failover",
        "lease_duration_seconds": 15,
        "renew_deadline_seconds": 10,
        "retry_period_seconds": 2,
        "sigterm": summary("SIGTERM", &graceful),
        "sigkill": (!crashes.is_empty()).then(|| summary("SIGKILL", &crashes)),
    });
    let out = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".run/bench-failover");
    if let Err(e) = std::fs::create_dir_all(&out).and_then(|()| {
        std::fs::write(
            out.join("failover.json"),
            serde_json::to_string_pretty(&report).unwrap_or_default(),
        )
    }) {
        println!("failover: writing {}/failover.json: {e}", out.display());
    }

    drop(replicas);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    env.cleanup().await;
}
