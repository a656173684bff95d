//! Chaos: one rollout while the faults production brings come at once.
//!
//! Three `nodewarden run` replicas, each with its own ServiceAccount token and
//! its own proxy to the API server, roll 15 sim-cloud nodes in three groups
//! (PDB-guarded workloads on the workers) to a new image at maxSurge 3. From
//! the start the cloud fails or throttles 20% of calls and one instance never
//! joins; at moments drawn from a seeded schedule (printed first) the
//! sim-cloud is SIGKILLed and restarted, kube-apiserver is restarted, etcd is
//! compacted and kube-apiserver restarted again (every resumed watch gets
//! 410), the leader is SIGKILLed twice and once cut off from the API server
//! for longer than its lease while its process lives on, and an admin deletes
//! a NodeMaintenance mid-drain and cordons a node nodewarden has no business
//! with.
//!
//! It must end with every node on the new image, and: the invariant checker
//! (budget, heir Ready before a delete, PDBs, never fewer nodes than at the
//! start) found nothing; the API server's audit log shows no write by a
//! replica outside its lease term; nothing leaked in the cloud; no
//! PendingNode, NodeMaintenance, cordon or taint of nodewarden's left; the
//! admin's cordon intact; one trace per replaced node.
//!
//! It restarts the API server, so it is a test binary of its own: cargo runs
//! test binaries one after another, so no other test shares those moments.
//! `NODEWARDEN_SEED=<n>` picks a schedule (seed 1 when unset); `just chaos`
//! runs many seeds.

use nodewarden_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use nodewarden::api::node_maintenance::MaintenancePhase;
use nodewarden::api::node_maintenance::medik8s::NodeMaintenance;
use nodewarden::api::update::PendingNode;
use nodewarden::cloud::sim::wire::Faults;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use support::audit;
use support::chaos::*;
use support::jaeger::Jaeger;
use support::node_is_ready;
use support::replicas::*;
use support::rollout::*;
use support::sim::OwnedSimCloud;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const GROUPS: [(&str, &str, usize); 3] = [
    ("cp", "ControlPlane", 3),
    ("blue", "Worker", 6),
    ("green", "Worker", 6),
];
const NODES: usize = 15;
const SURGE: usize = 3;
const NEW_IMAGE: &str = "img-2";
const HEIR: &str = "constellation.edgeless.systems/heir";

/// One fault of the run.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Of the API server or the replicas.
    Cluster(ClusterFault),
    /// SIGKILL of the sim-cloud, restarted (same state file) after `down`.
    SimCloudKilled { down: Duration },
    /// An admin deletes a NodeMaintenance whose drain is running.
    MaintenanceDeletedMidDrain,
    /// An admin cordons an up-to-date node nodewarden is done with.
    UnrelatedNodeCordoned,
}

/// When a fault strikes: once `after_nodes` nodes run the new image, plus `delay`.
#[derive(Clone, Copy, Debug)]
struct Moment {
    fault: Fault,
    after_nodes: usize,
    delay: Duration,
}

/// The run's faults at seeded moments, in order. The admin's faults come
/// early enough that a drain and an up-to-date node are still to be found.
fn schedule(seed: u64) -> Vec<Moment> {
    let mut rng = StdRng::seed_from_u64(seed);
    let down = Duration::from_millis(rng.random_range(500..3000));
    let faults: Vec<Fault> = std::iter::once(Fault::SimCloudKilled { down })
        .chain(ClusterFault::all(&mut rng).into_iter().map(Fault::Cluster))
        .chain([Fault::MaintenanceDeletedMidDrain, Fault::UnrelatedNodeCordoned])
        .collect();
    let mut moments: Vec<Moment> = faults
        .into_iter()
        .map(|fault| {
            let after_nodes = match fault {
                Fault::MaintenanceDeletedMidDrain => rng.random_range(0..=8),
                Fault::UnrelatedNodeCordoned => rng.random_range(1..=9),
                _ => rng.random_range(0..=11),
            };
            Moment {
                fault,
                after_nodes,
                delay: Duration::from_millis(rng.random_range(0..2500)),
            }
        })
        .collect();
    moments.sort_by_key(|m| (m.after_nodes, m.delay));
    moments
}

/// What the fault tasks share: the cluster, the replicas, the cloud, and
/// which node the admin cordoned.
struct Stage {
    client: Client,
    selector: String,
    faulted: Faulted,
    sim: tokio::sync::Mutex<OwnedSimCloud>,
    cordoned: Mutex<Option<String>>,
}

impl Stage {
    /// Carries out one fault; what happened, for the log.
    async fn strike(&self, fault: Fault, done: &CancellationToken) -> String {
        match fault {
            Fault::Cluster(fault) => self.faulted.strike(fault).await,
            Fault::SimCloudKilled { down } => {
                self.sim.lock().await.sim.restart(down).await;
                format!("sim-cloud SIGKILLed, back after {down:?}")
            }
            Fault::MaintenanceDeletedMidDrain => {
                let api: Api<NodeMaintenance> = Api::all(self.client.clone());
                let params = ListParams::default().labels(&self.selector);
                while !done.is_cancelled() {
                    let running = api.list(&params).await.ok().and_then(|l| {
                        l.items.into_iter().find(|m| {
                            m.status.as_ref().and_then(|s| s.phase.as_ref())
                                == Some(&MaintenancePhase::Running)
                                && m.metadata.deletion_timestamp.is_none()
                        })
                    });
                    if let Some(m) = running
                        && api.delete(&m.name_any(), &DeleteParams::default()).await.is_ok()
                    {
                        return format!(
                            "admin deleted NodeMaintenance {} mid-drain of {}",
                            m.name_any(),
                            m.spec.node_name
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                "MISSED: no drain was running any more".into()
            }
            Fault::UnrelatedNodeCordoned => {
                let nodes: Api<Node> = Api::all(self.client.clone());
                let params = ListParams::default().labels(&self.selector);
                while !done.is_cancelled() {
                    if let Ok(list) = nodes.list(&params).await
                        && let Some(name) = done_with(&list.items)
                    {
                        let cordon = json!({"spec": {"unschedulable": true}});
                        if nodes
                            .patch(&name, &PatchParams::default(), &Patch::Merge(&cordon))
                            .await
                            .is_ok()
                        {
                            *self.cordoned.lock().unwrap_or_else(|e| e.into_inner()) = Some(name.clone());
                            return format!("admin cordoned {name}, up to date");
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                "MISSED: no node to cordon".into()
            }
        }
    }
}

/// A node nodewarden is done with: on the new image, Ready, schedulable and
/// the heir of a node still there (so it is no surplus mint to be retired).
fn done_with(nodes: &[Node]) -> Option<String> {
    let heirs: BTreeSet<&String> = nodes.iter().filter_map(|n| n.annotations().get(HEIR)).collect();
    nodes
        .iter()
        .filter(|n| runs_image(n, NEW_IMAGE) && node_is_ready(n))
        .filter(|n| !n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false))
        .find(|n| heirs.contains(&n.name_any()))
        .map(|n| n.name_any())
}

/// Publishes how many nodes run the new image (and are Ready), until `stop`.
async fn track_progress(
    client: Client,
    selector: String,
    progress: watch::Sender<usize>,
    stop: CancellationToken,
) {
    let nodes: Api<Node> = Api::all(client);
    let params = ListParams::default().labels(&selector);
    while !stop.is_cancelled() {
        if let Ok(list) = nodes.list(&params).await {
            let current = list
                .items
                .iter()
                .filter(|n| runs_image(n, NEW_IMAGE) && node_is_ready(n))
                .count();
            progress.send_if_modified(|p| std::mem::replace(p, current) != current);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_survives_every_fault_at_once() {
    // `just test` (and so CI) replays seed 1; `just chaos` tries many.
    let seed = support::seed_or("chaos", 1);
    let moments = schedule(seed);
    for m in &moments {
        println!(
            "chaos: scheduled {:?} once {} nodes are on {NEW_IMAGE}, +{:?}",
            m.fault, m.after_nodes, m.delay
        );
    }
    let since = Timestamp::now();
    let jaeger = Jaeger::start();
    let Rollout { env, sim, groups } = setup("chaos", &GROUPS).await;
    workload(&env, "web", 6).await;
    workload(&env, "api", 4).await;
    let initial = node_names(&env).await;
    assert_eq!(initial.len(), NODES);
    set_join_timeout(&env, "10s").await;
    let faults = Faults {
        error_rate: 0.1,
        throttle_rate: 0.1,
        retry_after_seconds: 1,
        never_join: 1,
        ..Default::default()
    };
    sim.sim
        .provider
        .set_faults(&faults)
        .await
        .expect("injecting cloud faults");

    let dir = replica_log_dir(&env.id);
    let lease_name = format!("nodewarden-{}", env.id);
    let sim_addr = sim.sim.addr.clone();
    let replicas = Replicas::start_linked(
        3,
        &env,
        &lease_name,
        &jaeger.otlp_endpoint,
        &["--sim-cloud", &sim_addr],
        &dir,
    )
    .await;
    let stage = Arc::new(Stage {
        client: env.client.clone(),
        selector: env.run_selector(),
        faulted: Faulted::new(replicas, env.client.clone(), &lease_name),
        sim: tokio::sync::Mutex::new(sim),
        cordoned: Mutex::default(),
    });
    let first = stage.faulted.leader().await;
    stage.faulted.record(format!("{first} leads"));

    let checker = Checker::start_with_sim(&env, NODES, SURGE, &stage.sim.lock().await.sim.provider);
    let done = CancellationToken::new();
    let (progress_tx, progress) = watch::channel(0);
    let tracker = tokio::spawn(track_progress(
        env.client.clone(),
        env.run_selector(),
        progress_tx,
        done.clone(),
    ));
    let strikes: Vec<_> = moments
        .iter()
        .map(|m| {
            let (stage, done, mut progress, m) = (stage.clone(), done.clone(), progress.clone(), *m);
            tokio::spawn(async move {
                let reached = tokio::select! {
                    r = progress.wait_for(|p| *p >= m.after_nodes) => r.is_ok(),
                    () = done.cancelled() => false,
                };
                if !reached {
                    return format!("MISSED: {:?} (the rollout ended first)", m.fault);
                }
                tokio::time::sleep(m.delay).await;
                stage.faulted.record(format!("{:?} strikes", m.fault));
                let what = stage.strike(m.fault, &done).await;
                stage.faulted.record(what.clone());
                what
            })
        })
        .collect();

    let took = roll_nodes(&env, NODES, NEW_IMAGE, Some(SURGE)).await;
    stage
        .faulted
        .record(format!("every node on {NEW_IMAGE} after {took:?}"));
    done.cancel();
    let _ = tracker.await;
    let mut outcomes = Vec::new();
    for s in strikes {
        outcomes.push(s.await.expect("a fault task"));
    }
    let found = checker.finish().await;
    let stage = Arc::try_unwrap(stage).ok().expect("the fault tasks are done");
    let log = stage.faulted.log();
    let replicas = stage.faulted.replicas.into_inner();
    let tail = replicas.tail_logs();
    assert!(found.is_empty(), "invariants breached: {found:#?}\n{tail}");
    let missed: Vec<&String> = outcomes.iter().filter(|o| o.starts_with("MISSED")).collect();
    assert!(missed.is_empty(), "faults that never struck: {missed:?}");

    // Nothing leaked or left behind; the admin's cordon stands.
    let r = Rollout {
        env,
        sim: stage.sim.into_inner(),
        groups,
    };
    let env = &r.env;
    assert_no_leak(&r).await;
    wait_none_left::<NodeMaintenance>(env).await;
    wait_none_left::<PendingNode>(env).await;
    let cordoned = stage
        .cordoned
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .expect("the admin cordoned a node");
    let nodes: Vec<Node> = Api::<Node>::all(env.client.clone())
        .list(&ListParams::default().labels(&env.run_selector()))
        .await
        .expect("listing nodes")
        .items;
    for n in &nodes {
        let name = n.name_any();
        let cordon = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        assert_eq!(cordon, name == cordoned, "{name}: cordoned {cordon} at the end");
        let taints: Vec<String> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        // The cordon's own taint, which the node lifecycle controller adds, is the admin's.
        let admins = |t: &String| name == cordoned && t == "node.kubernetes.io/unschedulable";
        let left: Vec<&String> = taints.iter().filter(|t| !admins(t)).collect();
        assert!(left.is_empty(), "{name} keeps taints {left:?}");
        assert!(
            n.finalizers().is_empty(),
            "{name} keeps finalizers {:?}",
            n.finalizers()
        );
    }

    // The 410s happened: the compaction was not for nothing.
    let expired = expired_watches(&replicas);
    assert!(expired > 0, "no replica saw a watch expire (410)");

    // No write by a replica outside its lease term (the audit log).
    let terms = assert_writes_within_terms(&replicas, &lease_name, since);
    let checked: usize = terms.checked.values().sum();

    // One trace per replaced node, root span included.
    let traces = jaeger
        .wait_node_traces("nodewarden", "replace node", &initial)
        .await;
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for t in &traces {
        let root = t.root("replace node").expect("a root span");
        *per_node
            .entry(root.tag_str("k8s.node.name").unwrap_or_default().to_string())
            .or_default() += 1;
    }
    let not_one: Vec<_> = per_node.iter().filter(|(_, n)| **n != 1).collect();
    assert!(not_one.is_empty(), "replacement traces per node: {not_one:?}");

    let made = r.instances_of(NEW_IMAGE).await.len();
    println!(
        "chaos seed {seed}: {NODES} nodes rolled in {took:?}; {} instances made; {} writes checked against {} lease terms ({:?}); {expired} watches expired",
        made,
        checked,
        terms.terms.len(),
        terms.checked,
    );
    for line in log {
        println!("chaos: {line}");
    }

    tear_down(replicas, &env.client, &lease_name).await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}

/// The lease-term check itself, on writes made up for it: it must tell a
/// leader's writes from a deposed one's.
#[test]
fn the_lease_term_check_catches_writes_outside_a_term() {
    use audit::AuditedWrite;
    let t0: Timestamp = "2026-01-01T00:00:00Z".parse().expect("a time");
    let at = |ms: i64| {
        t0.checked_add(k8s_openapi::jiff::SignedDuration::from_millis(ms))
            .expect("a time")
    };
    let lease = |ms: i64, token: &str, holder: &str| AuditedWrite {
        at: at(ms),
        token_id: token.into(),
        verb: "update".into(),
        target: "leases nodewarden-system/l".into(),
        code: 200,
        lease: Some(("nodewarden-system".into(), "l".into(), holder.into())),
    };
    let write = |ms: i64, token: &str| AuditedWrite {
        at: at(ms),
        token_id: token.into(),
        verb: "patch".into(),
        target: "nodes /n".into(),
        code: 200,
        lease: None,
    };
    let replicas = BTreeMap::from([
        ("ta".to_string(), "a".to_string()),
        ("tb".to_string(), "b".to_string()),
    ]);
    let check = |writes: Vec<AuditedWrite>| {
        audit::writes_outside_terms(&writes, &replicas, ("nodewarden-system", "l"), LEASE_DURATION)
            .breaches
            .len()
    };
    // (what, writes, breaches)
    let cases = [
        (
            "a writes while it leads",
            vec![lease(0, "ta", "a"), write(500, "ta"), write(2900, "ta")],
            0,
        ),
        (
            "a writes before it ever led",
            vec![write(0, "ta"), lease(10, "ta", "a")],
            1,
        ),
        (
            "a writes after its lease ran out",
            vec![lease(0, "ta", "a"), write(3100, "ta")],
            1,
        ),
        (
            "a renews and goes on",
            vec![lease(0, "ta", "a"), lease(2500, "ta", "a"), write(5000, "ta")],
            0,
        ),
        (
            "a writes after b took over",
            vec![lease(0, "ta", "a"), lease(1000, "tb", "b"), write(1500, "ta")],
            1,
        ),
        (
            "a writes after releasing",
            vec![lease(0, "ta", "a"), lease(1000, "ta", ""), write(1500, "ta")],
            1,
        ),
        (
            "b's writes after taking over",
            vec![lease(0, "ta", "a"), lease(3500, "tb", "b"), write(3600, "tb")],
            0,
        ),
        (
            "a refused take-over does not make a term",
            vec![
                AuditedWrite {
                    code: 409,
                    ..lease(0, "tb", "b")
                },
                write(10, "tb"),
            ],
            1,
        ),
    ];
    for (what, writes, breaches) in cases {
        assert_eq!(check(writes), breaches, "{what}");
    }
}
