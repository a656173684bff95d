//! In-place upgrade Plans in the production shape: three `nodewarden run`
//! processes as the ServiceAccount of manifests/base/rbac.yaml, traces exported
//! to Jaeger. The leader is SIGKILLed twice while two nodes apply; checkers
//! watch the plan, its drains and Jobs, the nodes and a PDB throughout; then
//! every node upgrade's trace is read back from Jaeger and the metrics from
//! the replicas.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::jaeger::{Jaeger, JaegerTrace};
use crate::support::plans::*;
use crate::support::replicas::*;
use crate::support::{Probe, TestEnv, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams};
use nodewarden::api::plan::Plan;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PLAN: &str = "fleet";
const PHASES: [&str; 4] = ["drain", "job", "wait ready", "uncordon"];

/// Waits until both applying nodes run their Jobs, nothing being drained
/// or released and no node finished in the last second: the moment "two
/// nodes apply". With `after` nodes upgraded at
/// least, so the kills land in different waves.
async fn two_applying(plans: &Api<Plan>, after: usize) {
    let since = Instant::now();
    loop {
        if let Ok(p) = plans.get(PLAN).await
            && let Some(s) = p.status
        {
            let upgraded = s
                .progress
                .as_deref()
                .and_then(|p| p.split('/').next())
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            let phases: Vec<&str> = s.nodes.iter().map(|n| n.phase.as_str()).collect();
            // Not in the instant a node was finished: a kill between that
            // status write and the flush after it would take the node's root
            // span along (a known loss, as for replacements; see docs/reference.md, "Traces").
            let settled = s.last_completion_time.as_ref().is_none_or(|t| {
                jiff::Timestamp::now().duration_since(t.0) > jiff::SignedDuration::from_secs(1)
            });
            if s.applying.len() == 2
                && settled
                && upgraded >= after
                // Both Jobs running: no eviction in flight, whose record a
                // kill could leave in the PDB's disruptedPods for the API
                // server's 2 minutes, failing the next drain.
                && phases.iter().all(|p| *p == "Upgrading")
            {
                return;
            }
        }
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "two nodes never applied at once (after {after} upgraded)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How many of the Plan's `total` nodes neither finished nor apply now.
async fn unstarted(plans: &Api<Plan>, total: usize) -> usize {
    let status = plans
        .get(PLAN)
        .await
        .expect("reading the plan")
        .status
        .unwrap_or_default();
    let upgraded = status
        .progress
        .as_deref()
        .and_then(|p| p.split('/').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    total.saturating_sub(upgraded + status.applying.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_upgrade_in_place_through_two_leader_kills_with_one_trace_per_node() {
    let jaeger = Jaeger::start();
    let env = TestEnv::new("plan-ha").await;
    support::install_crds(&env.client).await;
    let nodes = env.create_kwok_nodes(6, &[("fleet", "ha")]).await;
    env.create_deployment("web", 4, json!({"fleet": "ha"})).await;
    create_pdb(&env, "web", "web", 1).await;

    // Kept when the test fails: the replicas' logs are where a failure is explained.
    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let replicas = Replicas::start(
        3,
        &env,
        &kubeconfig,
        &lease_name,
        &jaeger.otlp_endpoint,
        &replica_plan_flags(&env.namespace),
        &dir,
    );
    wait_for("a leader", Duration::from_secs(30), || async {
        match holder(&leases, &lease_name).await {
            Some(h) => Probe::Done(h),
            None => Probe::NotYet("no holder".into()),
        }
    })
    .await;

    let spec = json!({
        "concurrency": 2, "version": "v2",
        "nodeSelector": {"matchLabels": {"fleet": "ha"}},
        "drain": {"timeout": "60s"},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, PLAN, json!({}), spec)
        .await
        .expect("creating the plan");
    let stop = CancellationToken::new();
    let breaches = Arc::new(Breaches::default());
    let checker = tokio::spawn(check_plan(
        env.client.clone(),
        env.namespace.clone(),
        PLAN,
        nodes.clone(),
        breaches.clone(),
        stop.clone(),
    ));
    let recorder = tokio::spawn(record_jobs(
        env.client.clone(),
        env.namespace.clone(),
        PLAN,
        stop.clone(),
    ));
    let rebooter = tokio::spawn(reboot_after_job(
        env.client.clone(),
        env.namespace.clone(),
        PLAN,
        stop.clone(),
    ));

    // SIGKILL the leader twice, each time while two nodes apply.
    let replicas = Arc::new(tokio::sync::Mutex::new(replicas));
    let killer = {
        let (replicas, leases, lease_name) = (replicas.clone(), leases.clone(), lease_name.clone());
        let plans = plans(&env, &env.namespace);
        tokio::spawn(async move {
            let mut failovers = Vec::new();
            let mut unstarted_at_last_kill = 0;
            for after in [0, 2] {
                two_applying(&plans, after).await;
                unstarted_at_last_kill = unstarted(&plans, 6).await;
                let leader = holder(&leases, &lease_name).await.expect("a leader");
                let killed = Instant::now();
                replicas.lock().await.kill(&leader).await;
                let (next, took) = wait_for_new_leader(&leases, &lease_name, &leader, killed).await;
                replicas.lock().await.restart(&leader);
                println!("SIGKILL of leader {leader} while two nodes apply: {next} took over after {took:?}");
                failovers.push(took);
            }
            (failovers, unstarted_at_last_kill)
        })
    };

    let started = Instant::now();
    wait_upgraded(&env, &env.namespace, PLAN, &nodes, Duration::from_secs(240)).await;
    wait_condition(&env, PLAN, "Complete", "True", "Complete").await;
    let took = started.elapsed();
    let (failovers, unstarted_at_last_kill) = killer.await.expect("the killer");
    stop.cancel();
    let samples = checker.await.expect("the checker");
    let jobs = recorder.await.expect("the job recorder");
    let rebooted = rebooter.await.expect("the rebooter");
    let replicas = Arc::try_unwrap(replicas)
        .ok()
        .expect("the killer is done")
        .into_inner();
    let seen = breaches.0.lock().expect("breaches").clone();
    assert!(seen.is_empty(), "breaches: {seen:#?}\n{}", replicas.tail_logs());
    assert!(samples > 20, "the checker looked {samples} times");
    assert_eq!(rebooted.len(), nodes.len(), "every node rebooted: {rebooted:?}");
    let expected: BTreeSet<String> = nodes.iter().cloned().collect();
    assert_eq!(
        jobs.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "a Job per node"
    );
    for (node, uids) in &jobs {
        assert_eq!(uids.len(), 1, "{node}: one Job created, saw {uids:?}");
    }
    println!("6 nodes, concurrency 2, two leader kills: upgraded in {took:?}; failovers {failovers:?}");

    // Metrics: the leader's node counts; the Job durations somewhere.
    let leader = holder(&leases, &lease_name).await.expect("a leader");
    let ns = &env.namespace;
    let series = |state: &str| {
        format!("nodewarden_plan_nodes{{plan_namespace=\"{ns}\",plan=\"{PLAN}\",state=\"{state}\"}}")
    };
    let finished = [
        ("upgraded", 6.0),
        ("due", 0.0),
        ("applying", 0.0),
        ("failed", 0.0),
    ];
    let scraped: BTreeMap<String, String> = wait_for(
        "the leader's plan gauges to show the finished plan",
        Duration::from_secs(15),
        || async {
            let scraped = match replicas.scrape().await {
                Ok(s) => s,
                Err(e) => return Probe::NotYet(e),
            };
            let wrong: Vec<String> = finished
                .iter()
                .filter(|(state, want)| metric_value(&scraped[&leader], &series(state)) != Some(*want))
                .map(|(state, want)| format!("{state}: not {want}"))
                .collect();
            match wrong.is_empty() {
                true => Probe::Done(scraped),
                false => Probe::NotYet(wrong.join("; ")),
            }
        },
    )
    .await;
    let jobs_observed: f64 = scraped
        .values()
        .filter_map(|t| {
            metric_value(
                t,
                "nodewarden_plan_job_duration_seconds_count{result=\"succeeded\"}",
            )
        })
        .sum();
    // A SIGKILLed replica takes what it observed along (as a scraper would
    // see: its counters start again at zero). What must be there: each Job
    // observed at most once, and every Job that started after the last kill
    // observed by a replica alive now.
    assert!(
        (unstarted_at_last_kill as f64..=6.0).contains(&jobs_observed),
        "Job durations observed across the replicas: {jobs_observed}, \
         want at least the {unstarted_at_last_kill} Jobs started after the last kill and at most 6"
    );

    // Traces: exactly one per node upgrade, each with its phases, at least
    // one written by two replicas.
    let traces: Vec<JaegerTrace> = jaeger
        .wait_node_traces("nodewarden", "upgrade node", &expected)
        .await;
    let mut crossed = Vec::new();
    for node in &nodes {
        let found: Vec<&JaegerTrace> = traces
            .iter()
            .filter(|t| {
                t.root("upgrade node")
                    .is_some_and(|r| r.tag_str("k8s.node.name") == Some(node))
            })
            .collect();
        assert_eq!(found.len(), 1, "{node} has {} upgrade traces", found.len());
        let t = found[0];
        let root = t.root("upgrade node").expect("a root");
        assert_eq!(root.tag_str("nodewarden.version"), Some("v2"));
        assert_eq!(
            root.tag_str("nodewarden.plan"),
            Some(format!("{ns}/{PLAN}").as_str())
        );
        assert!(
            root.tag("nodewarden.hash").is_some(),
            "{node}: root lacks the hash"
        );
        let ops = t.operations();
        let missing: Vec<&str> = PHASES.iter().copied().filter(|p| !ops.contains(p)).collect();
        let instances = t.instances();
        if instances.len() > 1 {
            crossed.push((node.clone(), instances.clone()));
        }
        // A replica killed between a phase and its flush may take that
        // phase with it; anything else must be complete.
        assert!(
            missing.is_empty() || instances.len() > 1,
            "{node}: phases missing {missing:?} (spans {ops:?}, from {instances:?})"
        );
    }
    println!("upgrade traces that crossed a leader change: {crossed:?}");
    assert!(
        !crossed.is_empty(),
        "at least one upgrade trace spans two replicas"
    );

    delete_plan_and_wait(&env, &env.namespace, PLAN).await;
    drop(replicas);
    // Passed: the logs are not needed any more.
    let _ = std::fs::remove_dir_all(&dir);
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    env.cleanup().await;
}
