//! Chaos for the object controllers: storms of NodeMaintenances, Plans and
//! SIPClusters at once, while the API server and the replicas fail.
//!
//! Three `nodewarden run` replicas (each with its own token and proxy) serve
//! three storms for 45 s, from one seed:
//! - 50 NodeMaintenances on 20 PDB-guarded nodes, one deleted or created
//!   again every 100 ms;
//! - two Plans over the same 6 PDB-guarded nodes (one drains at concurrency
//!   2, one cordons at concurrency 1), every 1–3 s one's version bumped, or
//!   the plan deleted, or created again; each completed Job reboots its node;
//! - three SIPClusters over hosts for two, every 1–3 s one deleted or
//!   created again.
//!
//! Meanwhile, at seeded moments printed first: kube-apiserver restarted,
//! etcd compacted and kube-apiserver restarted (resumed watches get 410),
//! the leader SIGKILLed twice and once cut off from the API server for
//! longer than its lease while its process lives on.
//!
//! Watched throughout: no node held by two live maintenances, a Succeeded
//! maintenance's node cordoned; no plan busy on more nodes than its
//! concurrency; no PDB broken; no host passed from one SIPCluster to
//! another. Then the storms stop and the end state must be exact: both
//! Plans, on a last version, upgrade every node and are Complete; of the
//! three SIPClusters two are Ready with exactly their hosts and one is
//! Unschedulable. Everything deleted: no maintenance, cordon, taint, lease,
//! Job or host label is left. No replica wrote outside its lease term (the
//! audit log).
//!
//! It restarts the API server, so it is a test binary of its own.
//! `NODEWARDEN_SEED=<n>` picks the schedule (seed 1 when unset); `just chaos`
//! runs many seeds.

use nodewarden_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use nodewarden::api::metal3::BareMetalHost;
use nodewarden::api::node_maintenance::medik8s::NodeMaintenance;
use nodewarden::api::plan::{Plan, node_label};
use nodewarden::api::sip::{SIPCluster, labels};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::chaos::*;
use support::jaeger::Jaeger;
use support::maintenances::sample_maintenances;
use support::plans::{
    Breaches, create_pdb, create_plan, job_finished, plans, reboot_after_job, replica_plan_flags, upgrade,
};
use support::replicas::*;
use support::sip::{create_racks, create_sip, put_ssh_keys, sips, watch_claims};
use support::{Probe, RUN_LABEL, TestEnv, node_is_ready, seen, wait_for};
use tokio_util::sync::CancellationToken;

const STORM: Duration = Duration::from_secs(45);
const SETTLE: Duration = Duration::from_secs(240);
const MAINTENANCE_NODES: usize = 20;
const MAINTENANCES: usize = 50;
const PLAN_NODES: usize = 6;
/// (name, concurrency): the first drains, the second only cordons.
const PLANS: [(&str, usize); 2] = [("os", 2), ("agent", 1)];
/// (name, first NodePort): each wants 2 + 1 control-plane and 2 + 1 worker
/// hosts, and the racks hold 6 of each, so two fit and one never does.
const SIP_CLUSTERS: [(&str, i32); 3] = [("alpha", 30400), ("beta", 30410), ("gamma", 30420)];

/// The cluster faults at seeded offsets from the storm's start, in order.
fn schedule(seed: u64) -> Vec<(Duration, ClusterFault)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut moments: Vec<(Duration, ClusterFault)> = ClusterFault::all(&mut rng)
        .into_iter()
        .map(|f| (Duration::from_millis(rng.random_range(2_000..40_000)), f))
        .collect();
    moments.sort_by_key(|(at, _)| *at);
    moments
}

fn plan_spec(plan: &str, concurrency: usize, version: u32) -> Value {
    let mut spec = json!({
        "concurrency": concurrency,
        "version": format!("v{version}"),
        "nodeSelector": {"matchLabels": {"pool": "plan"}},
        "upgrade": upgrade(&format!("example.invalid/{plan}")),
    });
    spec["cordon"] = json!(true);
    if plan == "os" {
        spec["drain"] = json!({"timeout": "60s"});
    }
    spec
}

fn maintenance(env: &TestEnv, i: usize, node: &str) -> NodeMaintenance {
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": env.name(&format!("storm-{i}")), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": node, "reason": "storm"},
    }))
    .expect("a NodeMaintenance")
}

/// One in 10 per second: each step deletes maintenance `i` when it lives,
/// creates it again when it is gone. Returns (deleted, created again).
async fn maintenance_storm(
    env: Arc<TestEnv>,
    nodes: Vec<String>,
    seed: u64,
    until: Instant,
) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x4e4d);
    let api: Api<NodeMaintenance> = Api::all(env.client.clone());
    let (mut deleted, mut created) = (0, 0);
    while Instant::now() < until {
        let i = rng.random_range(0..MAINTENANCES);
        let name = env.name(&format!("storm-{i}"));
        match api.get_opt(&name).await {
            Ok(Some(m)) if m.metadata.deletion_timestamp.is_none() => {
                deleted += usize::from(api.delete(&name, &DeleteParams::default()).await.is_ok());
            }
            Ok(None) => {
                let m = maintenance(&env, i, &nodes[i % nodes.len()]);
                created += usize::from(api.create(&PostParams::default(), &m).await.is_ok());
            }
            // Being deleted, or the API server is away.
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (deleted, created)
}

/// Every 1–3 s one plan: its version bumped (most often), or deleted, or
/// created again when gone. Returns what it did, counted.
async fn plan_storm(env: Arc<TestEnv>, seed: u64, until: Instant) -> BTreeMap<&'static str, usize> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x504c);
    let api = plans(&env, &env.namespace);
    let mut versions: BTreeMap<&str, u32> = PLANS.iter().map(|(p, _)| (*p, 1)).collect();
    let mut did: BTreeMap<&'static str, usize> = BTreeMap::new();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..3000))).await;
        let (plan, concurrency) = PLANS[rng.random_range(0..PLANS.len())];
        let version = versions.entry(plan).or_default();
        match api.get_opt(plan).await {
            Ok(Some(p)) if p.metadata.deletion_timestamp.is_none() => {
                if rng.random_bool(0.7) {
                    *version += 1;
                    let bump = json!({"spec": {"version": format!("v{version}")}});
                    if api
                        .patch(plan, &PatchParams::default(), &Patch::Merge(&bump))
                        .await
                        .is_ok()
                    {
                        *did.entry("version bumped").or_default() += 1;
                    }
                } else if api.delete(plan, &DeleteParams::default()).await.is_ok() {
                    *did.entry("deleted").or_default() += 1;
                }
            }
            Ok(None) => {
                *version += 1;
                if create_plan(&env, plan, json!({}), plan_spec(plan, concurrency, *version))
                    .await
                    .is_ok()
                {
                    *did.entry("created again").or_default() += 1;
                }
            }
            _ => {}
        }
    }
    did
}

/// Every 1–3 s one SIPCluster deleted when it lives, created again when gone.
async fn sip_storm(env: Arc<TestEnv>, seed: u64, until: Instant) -> (usize, usize) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5349);
    let api = sips(&env);
    let (mut deleted, mut created) = (0, 0);
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1000..3000))).await;
        let (name, port) = SIP_CLUSTERS[rng.random_range(0..SIP_CLUSTERS.len())];
        match api.get_opt(name).await {
            Ok(Some(s)) if s.metadata.deletion_timestamp.is_none() => {
                deleted += usize::from(api.delete(name, &DeleteParams::default()).await.is_ok());
            }
            Ok(None) => {
                created += usize::from(create_sip(&env, name, sip_spec(&env, port)).await.is_ok());
            }
            _ => {}
        }
    }
    (deleted, created)
}

fn sip_spec(env: &TestEnv, port: i32) -> Value {
    support::sip::spec(env, (2, 1), (2, 1), port)
}

/// Polls both plans, their drains and Jobs, and the PDBs until stopped: a
/// plan never has more nodes applying (in its status) or busy (a drain of
/// its own, or an unfinished Job of the plan as it is now) than its
/// concurrency; no PDB has fewer healthy pods than it promises.
async fn check_plans_and_budgets(
    client: Client,
    ns: String,
    breaches: Arc<Breaches>,
    stop: CancellationToken,
) -> usize {
    let plans: Api<Plan> = Api::namespaced(client.clone(), &ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), &ns);
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client, &ns);
    let mut samples = 0;
    while !stop.is_cancelled() {
        samples += 1;
        let breach = |what: String| breaches.0.lock().unwrap_or_else(|e| e.into_inner()).push(what);
        for (plan, concurrency) in PLANS {
            let Ok(Some(p)) = plans.get_opt(plan).await else {
                continue;
            };
            let applying = p.status.as_ref().map(|s| s.applying.clone()).unwrap_or_default();
            if applying.len() > concurrency {
                breach(format!("sample {samples}: {plan} applies on {applying:?}"));
            }
            let of_plan = format!("upgrade.cattle.io/plan={plan}");
            let drains = format!("{of_plan},nodewarden.dev/plan-namespace={ns}");
            let (Ok(j), Ok(m)) = (
                jobs.list(&ListParams::default().labels(&of_plan)).await,
                maintenances.list(&ListParams::default().labels(&drains)).await,
            ) else {
                continue;
            };
            let uid = p.uid();
            let busy: BTreeSet<String> = j
                .items
                .iter()
                .filter(|j| !job_finished(j))
                .filter(|j| j.owner_references().iter().any(|o| Some(&o.uid) == uid.as_ref()))
                .filter_map(|j| j.labels().get("upgrade.cattle.io/node").cloned())
                .chain(m.items.iter().map(|m| m.spec.node_name.clone()))
                .collect();
            if busy.len() > concurrency {
                breach(format!("sample {samples}: {plan} busy on {busy:?}"));
            }
        }
        if let Ok(list) = pdbs.list(&ListParams::default()).await {
            for b in list.items {
                if let Some(s) = &b.status
                    && s.current_healthy < s.desired_healthy
                {
                    breach(format!("sample {samples}: PDB {} broken: {s:?}", b.name_any()));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    samples
}

/// Waits until every PDB of the test has the healthy pods it promises, so
/// the checker judges from a cluster that kept them.
async fn wait_budgets_kept(env: &TestEnv) {
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_for("the workloads up to their budgets", SETTLE, || async {
        let list = match pdbs.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => return Probe::NotYet(seen(e)),
        };
        let short: Vec<String> = list
            .iter()
            .filter(|b| {
                b.status.as_ref().is_none_or(|s| {
                    s.current_healthy < s.desired_healthy || s.expected_pods.unwrap_or(0) == 0
                })
            })
            .map(|b| b.name_any())
            .collect();
        if short.is_empty() && !list.is_empty() {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("short of their budget: {short:?}"))
        }
    })
    .await;
}

/// Waits until every node carries both plans' labels with their latest
/// hashes and both plans are Complete.
async fn wait_plans_done(env: &TestEnv, nodes: &[String]) {
    let api = plans(env, &env.namespace);
    let node_api: Api<Node> = Api::all(env.client.clone());
    wait_for("both plans done on every node", SETTLE, || async {
        let mut behind = Vec::new();
        for (plan, _) in PLANS {
            let p = match api.get(plan).await {
                Ok(p) => p,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let status = p.status.clone().unwrap_or_default();
            let complete = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True");
            let current = status.observed_generation == p.metadata.generation;
            if !complete || !current {
                let said = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Complete")
                    .map(|c| format!("{} {}: {}", c.status, c.reason, c.message));
                behind.push(format!(
                    "{plan}: progress {:?}, applying {:?}, Complete {said:?}",
                    status.progress, status.applying
                ));
                continue;
            }
            for n in nodes {
                let label = match node_api.get(n).await {
                    Ok(node) => node.labels().get(&node_label(plan)).cloned(),
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                if label != status.latest_hash {
                    behind.push(format!("{n} {plan}={label:?}"));
                }
            }
        }
        if behind.is_empty() {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("behind: {behind:?}"))
        }
    })
    .await;
}

/// How a SIPCluster stands, by its Ready condition of its current generation.
#[derive(Debug, PartialEq)]
enum Standing {
    Ready,
    /// Holding its hosts, a service refused only because kube-apiserver
    /// still counts its NodePort as allocated: a port the API server
    /// allocated as it was SIGKILLed stays so until its repair loop has seen
    /// it unused a few times (minutes). That is the API server's recovery,
    /// not the claims this test judges.
    PortStillAllocated,
    Unschedulable,
    Other(String),
}

impl Standing {
    fn holds_its_hosts(&self) -> bool {
        matches!(self, Standing::Ready | Standing::PortStillAllocated)
    }
}

fn standing(s: &SIPCluster) -> Standing {
    let ready = s
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == "Ready" && c.observed_generation == s.metadata.generation);
    match ready {
        Some(c) if c.status == "True" => Standing::Ready,
        Some(c) if c.reason == "InfraServiceFailure" && c.message.contains("port is already allocated") => {
            Standing::PortStillAllocated
        }
        Some(c) if c.status == "False" && c.reason == "Unschedulable" => Standing::Unschedulable,
        Some(c) => Standing::Other(format!("{} {}: {}", c.status, c.reason, c.message)),
        None => Standing::Other("no Ready condition of this generation".into()),
    }
}

/// Waits until two SIPClusters hold their hosts and the third is
/// Unschedulable, then checks that each of the two holds exactly its hosts:
/// 6, 4 of them active.
async fn wait_two_sip_clusters_fit(env: &TestEnv) {
    let api = sips(env);
    let verdicts = wait_for("two SIPClusters Ready, one Unschedulable", SETTLE, || async {
        let mut verdicts = BTreeMap::new();
        for (name, _) in SIP_CLUSTERS {
            match api.get(name).await {
                Ok(s) => {
                    verdicts.insert(name, standing(&s));
                }
                Err(e) => return Probe::NotYet(seen(e)),
            }
        }
        let holding = verdicts.values().filter(|v| v.holds_its_hosts()).count();
        let unschedulable = verdicts
            .values()
            .filter(|v| **v == Standing::Unschedulable)
            .count();
        if holding == 2 && unschedulable == 1 {
            Probe::Done(verdicts)
        } else {
            Probe::NotYet(format!("{verdicts:?}"))
        }
    })
    .await;
    for (name, v) in &verdicts {
        if *v == Standing::PortStillAllocated {
            println!(
                "chaos: {name} holds its hosts; a NodePort of its is still allocated by the killed API server"
            );
        }
    }
    let hosts: Api<BareMetalHost> = Api::namespaced(env.client.clone(), &env.namespace);
    wait_for(
        "exactly the Ready clusters' hosts labelled",
        Duration::from_secs(30),
        || async {
            let labelled = match hosts
                .list(&ListParams::default().labels(labels::CLUSTER_NAME))
                .await
            {
                Ok(l) => l.items,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let mut held: BTreeMap<String, (usize, usize)> = BTreeMap::new();
            for h in &labelled {
                let l = h.labels();
                let entry = held
                    .entry(l.get(labels::CLUSTER_NAME).cloned().unwrap_or_default())
                    .or_default();
                entry.0 += 1;
                entry.1 += usize::from(l.get(labels::STATE).map(String::as_str) == Some("active"));
            }
            let want: BTreeMap<String, (usize, usize)> = verdicts
                .iter()
                .filter(|(_, v)| v.holds_its_hosts())
                .map(|(name, _)| (name.to_string(), (6, 4)))
                .collect();
            if held == want {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("held (hosts, active) {held:?}, want {want:?}"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storms_of_maintenances_plans_and_sip_clusters_survive_every_fault() {
    let seed = support::seed_or("chaos storms", 1);
    let moments = schedule(seed);
    for (at, fault) in &moments {
        println!("chaos: scheduled {fault:?} at +{at:?}");
    }
    let since = Timestamp::now();
    let jaeger = Jaeger::start();
    let env = Arc::new(TestEnv::new("storms").await);
    support::install_crds(&env.client).await;
    let maintenance_nodes = env
        .create_kwok_nodes(MAINTENANCE_NODES, &[("pool", "maintenance")])
        .await;
    env.create_deployment("busy", 40, json!({"pool": "maintenance"}))
        .await;
    create_pdb(&env, "busy", "busy", 2).await;
    let plan_nodes = env.create_kwok_nodes(PLAN_NODES, &[("pool", "plan")]).await;
    env.create_deployment("web", 4, json!({"pool": "plan"})).await;
    create_pdb(&env, "web", "web", 1).await;
    put_ssh_keys(&env).await;
    create_racks(&env, 6, 2).await;

    wait_budgets_kept(&env).await;

    let dir = replica_log_dir(&env.id);
    let lease_name = format!("nodewarden-{}", env.id);
    let replicas = Replicas::start_linked(
        3,
        &env,
        &lease_name,
        &jaeger.otlp_endpoint,
        &replica_plan_flags(&env.namespace),
        &dir,
    )
    .await;
    let faulted = Arc::new(Faulted::new(replicas, env.client.clone(), &lease_name));
    let first = faulted.leader().await;
    faulted.record(format!("{first} leads"));

    // The watchers.
    let stop = CancellationToken::new();
    let all_nodes: BTreeSet<String> = maintenance_nodes.iter().chain(&plan_nodes).cloned().collect();
    let maintenance_sampler = tokio::spawn(sample_maintenances(
        env.client.clone(),
        all_nodes.clone(),
        stop.clone(),
    ));
    let breaches = Arc::new(Breaches::default());
    let plan_checker = tokio::spawn(check_plans_and_budgets(
        env.client.clone(),
        env.namespace.clone(),
        breaches.clone(),
        stop.clone(),
    ));
    let claims = tokio::spawn(watch_claims(
        env.client.clone(),
        env.namespace.clone(),
        stop.clone(),
    ));
    let rebooters: Vec<_> = PLANS
        .iter()
        .map(|(plan, _)| {
            tokio::spawn(reboot_after_job(
                env.client.clone(),
                env.namespace.clone(),
                plan,
                stop.clone(),
            ))
        })
        .collect();

    // The storms, from what each starts with.
    for i in 0..MAINTENANCES {
        let m = maintenance(&env, i, &maintenance_nodes[i % MAINTENANCE_NODES]);
        Api::<NodeMaintenance>::all(env.client.clone())
            .create(&PostParams::default(), &m)
            .await
            .expect("creating a NodeMaintenance");
    }
    for (plan, concurrency) in PLANS {
        create_plan(&env, plan, json!({}), plan_spec(plan, concurrency, 1))
            .await
            .expect("creating a plan");
    }
    for (name, port) in SIP_CLUSTERS {
        create_sip(&env, name, sip_spec(&env, port))
            .await
            .expect("creating a SIPCluster");
    }
    let started = Instant::now();
    let until = started + STORM;
    faulted.record("the storms begin".into());
    let storms = (
        tokio::spawn(maintenance_storm(
            env.clone(),
            maintenance_nodes.clone(),
            seed,
            until,
        )),
        tokio::spawn(plan_storm(env.clone(), seed, until)),
        tokio::spawn(sip_storm(env.clone(), seed, until)),
    );
    let faults = {
        let faulted = faulted.clone();
        tokio::spawn(async move {
            for (at, fault) in moments {
                tokio::time::sleep_until((started + at).into()).await;
                faulted.record(format!("{fault:?} strikes"));
                let what = faulted.strike(fault).await;
                faulted.record(what);
            }
        })
    };
    let maintenance_counts = storms.0.await.expect("the maintenance storm");
    let plan_counts = storms.1.await.expect("the plan storm");
    let sip_counts = storms.2.await.expect("the SIPCluster storm");
    faulted.record(format!(
        "the storms end: maintenances {maintenance_counts:?} (deleted, created again), plans {plan_counts:?}, SIPClusters {sip_counts:?}"
    ));

    // The end state: each storm's last word is carried out exactly.
    let api = plans(&env, &env.namespace);
    for (plan, concurrency) in PLANS {
        let last = plan_spec(plan, concurrency, 1000);
        wait_for(&format!("{plan} on its last version"), SETTLE, || async {
            let result = match api.get_opt(plan).await {
                Ok(Some(p)) if p.metadata.deletion_timestamp.is_some() => {
                    return Probe::NotYet("being deleted".into());
                }
                Ok(Some(_)) => {
                    let bump = json!({"spec": {"version": last["version"]}});
                    api.patch(plan, &PatchParams::default(), &Patch::Merge(&bump))
                        .await
                        .map(|_| ())
                }
                Ok(None) => create_plan(&env, plan, json!({}), last.clone()).await.map(|_| ()),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => Probe::Done(()),
                Err(e) => Probe::NotYet(seen(e)),
            }
        })
        .await;
    }
    for (name, port) in SIP_CLUSTERS {
        wait_for(&format!("{name} present"), SETTLE, || async {
            match sips(&env).get_opt(name).await {
                Ok(Some(s)) if s.metadata.deletion_timestamp.is_none() => Probe::Done(()),
                Ok(Some(_)) => Probe::NotYet("being deleted".into()),
                Ok(None) => match create_sip(&env, name, sip_spec(&env, port)).await {
                    Ok(_) => Probe::Done(()),
                    Err(e) => Probe::NotYet(seen(e)),
                },
                Err(e) => Probe::NotYet(seen(e)),
            }
        })
        .await;
    }
    faults.await.expect("the fault task");
    faulted.record("every fault struck".into());
    wait_plans_done(&env, &plan_nodes).await;
    faulted.record("both plans Complete on every node".into());
    wait_two_sip_clusters_fit(&env).await;
    faulted.record("two SIPClusters Ready with exactly their hosts, one Unschedulable".into());

    // Everything deleted: nothing of nodewarden's is left.
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let _ = maintenances
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&env.run_selector()),
        )
        .await;
    for (plan, _) in PLANS {
        let _ = api.delete(plan, &DeleteParams::default()).await;
    }
    for (name, _) in SIP_CLUSTERS {
        let _ = sips(&env).delete(name, &DeleteParams::default()).await;
    }
    wait_nothing_left(&env, &all_nodes).await;
    faulted.record("everything deleted; nothing left".into());
    stop.cancel();

    let (samples, maintenance_breaches) = maintenance_sampler.await.expect("the maintenance sampler");
    let plan_samples = plan_checker.await.expect("the plan checker");
    let host_breaches = claims.await.expect("the claims watch");
    let mut rebooted = BTreeSet::new();
    for r in rebooters {
        rebooted.extend(r.await.expect("a rebooter"));
    }
    let faulted = Arc::try_unwrap(faulted).ok().expect("the fault task is done");
    let log = faulted.log();
    let mut replicas = faulted.replicas.into_inner();
    let tail = replicas.tail_logs();
    let plan_breaches = breaches.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert!(
        maintenance_breaches.is_empty() && plan_breaches.is_empty() && host_breaches.is_empty(),
        "maintenances: {maintenance_breaches:#?}\nplans and budgets: {plan_breaches:#?}\nhosts: {host_breaches:#?}\n{tail}"
    );
    assert!(
        samples > 20 && plan_samples > 20,
        "the checkers ran ({samples}, {plan_samples} samples)"
    );
    assert_eq!(
        rebooted,
        plan_nodes.iter().cloned().collect(),
        "every plan node rebooted by a Job"
    );
    for id in replicas.identities() {
        assert!(replicas.is_running(&id), "{id} exited\n{tail}");
    }
    let expired = expired_watches(&replicas);
    assert!(expired > 0, "no replica saw a watch expire (410)");
    let terms = assert_writes_within_terms(&replicas, &lease_name, since);

    println!(
        "chaos storms seed {seed}: {} s of storms, settled after {:?}; {samples} maintenance samples, {plan_samples} plan samples; {} writes checked against {} lease terms ({:?}); {expired} watches expired",
        STORM.as_secs(),
        started.elapsed(),
        terms.checked.values().sum::<usize>(),
        terms.terms.len(),
        terms.checked,
    );
    for line in log {
        println!("chaos: {line}");
    }

    tear_down(replicas, &env.client, &lease_name).await;
    Arc::try_unwrap(env)
        .ok()
        .expect("the storms are done")
        .cleanup()
        .await;
}

/// Waits until no maintenance, Plan, SIPCluster or plan Job of the test is
/// left, no node carries a cordon, taint or maintenance lease, and no host
/// a SIPCluster's labels.
async fn wait_nothing_left(env: &TestEnv, nodes: &BTreeSet<String>) {
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    let node_api: Api<Node> = Api::all(env.client.clone());
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), "medik8s-leases");
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
    let hosts: Api<BareMetalHost> = Api::namespaced(env.client.clone(), &env.namespace);
    let plan_api = plans(env, &env.namespace);
    let sip_api = sips(env);
    wait_for("nothing of nodewarden's left", SETTLE, || async {
        let mut left = Vec::new();
        let all = ListParams::default();
        match maintenances.list(&all).await {
            Ok(l) => left.extend(
                l.items
                    .iter()
                    .filter(|m| nodes.contains(&m.spec.node_name))
                    .map(|m| format!("NodeMaintenance {}", m.name_any())),
            ),
            Err(e) => return Probe::NotYet(seen(e)),
        }
        match (plan_api.list(&all).await, sip_api.list(&all).await) {
            (Ok(p), Ok(s)) => {
                left.extend(p.items.iter().map(|p| format!("Plan {}", p.name_any())));
                left.extend(s.items.iter().map(|s| format!("SIPCluster {}", s.name_any())));
            }
            (Err(e), _) | (_, Err(e)) => return Probe::NotYet(seen(e)),
        }
        match jobs
            .list(&ListParams::default().labels("upgrade.cattle.io/plan"))
            .await
        {
            Ok(l) => left.extend(l.items.iter().map(|j| format!("Job {}", j.name_any()))),
            Err(e) => return Probe::NotYet(seen(e)),
        }
        match hosts
            .list(&ListParams::default().labels(labels::CLUSTER_NAME))
            .await
        {
            Ok(l) => left.extend(l.items.iter().map(|h| format!("labels on host {}", h.name_any()))),
            Err(e) => return Probe::NotYet(seen(e)),
        }
        for n in nodes {
            let node = match node_api.get(n).await {
                Ok(node) => node,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let spec = node.spec.clone().unwrap_or_default();
            if spec.unschedulable == Some(true) {
                left.push(format!("{n} cordoned"));
            }
            let taints: Vec<String> = spec
                .taints
                .unwrap_or_default()
                .into_iter()
                .map(|t| t.key)
                .collect();
            if !taints.is_empty() {
                left.push(format!("{n} tainted {taints:?}"));
            }
            if !node_is_ready(&node) {
                left.push(format!("{n} not Ready"));
            }
            if let Ok(Some(_)) = leases.get_opt(&format!("node-{n}")).await {
                left.push(format!("maintenance lease of {n}"));
            }
        }
        if left.is_empty() {
            Probe::Done(())
        } else {
            Probe::NotYet(format!("left: {left:?}"))
        }
    })
    .await;
}
