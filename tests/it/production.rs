//! The production shape on the local control plane: three `nodewarden run`
//! processes authenticated as the ServiceAccount of manifests/base/rbac.yaml (and
//! nothing more), exporting traces to a Jaeger built from Go modules. A
//! rollout runs while the leader is killed twice; the invariant checker
//! watches throughout; then a SIGTERM handoff; then every replacement's trace
//! is read back from Jaeger.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::support::jaeger::{Jaeger, JaegerTrace};
use crate::support::replicas::*;
use crate::support::rollout::*;
use crate::support::{Probe, TestEnv, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use nodewarden::api::update::PendingNode;
use nodewarden_timeline as timeline;

const PHASES: [&str; 7] = [
    "create instance",
    "wait for join",
    "wait ready",
    "transfer labels",
    "drain",
    "delete instance",
    "delete node",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_as_the_service_account_survive_two_leader_kills_with_one_trace_per_replacement() {
    let jaeger = Jaeger::start();
    let r = setup("ha", &[("cp", "ControlPlane", 3), ("workers", "Worker", 6)]).await;
    let env: &TestEnv = &r.env;
    workload(env, "web", 4).await;
    let initial = node_names(env).await;
    assert_eq!(initial.len(), 9);

    let dir = replica_log_dir(&env.id);
    let dir = &dir;
    let kubeconfig = service_account_kubeconfig(&env.client, dir).await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let replicas = Replicas::start(
        3,
        env,
        &kubeconfig,
        &lease_name,
        &jaeger.otlp_endpoint,
        &["--sim-cloud", &r.sim.sim.addr],
        dir,
    );
    let first = wait_for("a leader", Duration::from_secs(30), || async {
        match holder(&leases, &lease_name).await {
            Some(h) => Probe::Done(h),
            None => Probe::NotYet("no holder".into()),
        }
    })
    .await;

    let checker = Checker::start(env, 9, 2);

    // Kill the leader (SIGKILL) twice mid-rollout, each time while an
    // instance is on its way: that replacement's trace must cross the change.
    let replicas = Arc::new(tokio::sync::Mutex::new(replicas));
    let killer = {
        let (replicas, leases, lease_name, client, selector) = (
            replicas.clone(),
            leases.clone(),
            lease_name.clone(),
            env.client.clone(),
            env.run_selector(),
        );
        tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(client.clone());
            let pending: Api<PendingNode> = Api::all(client.clone());
            let mut failovers = Vec::new();
            for replaced in [2, 5] {
                loop {
                    let list = nodes.list(&ListParams::default().labels(&selector)).await;
                    let joining = pending.list(&ListParams::default().labels(&selector)).await;
                    // Also while drained nodes are being retired: a replacement's
                    // root span goes out before its old Node is deleted.
                    if let (Ok(list), Ok(joining)) = (list, joining)
                        && list.items.iter().filter(|n| runs_image(n, "img-2")).count() >= replaced
                        && joining.items.iter().any(|p| p.name_any().starts_with("join-"))
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let leader = holder(&leases, &lease_name).await.expect("a leader");
                let killed = Instant::now();
                replicas.lock().await.kill(&leader).await;
                let (next, took) = wait_for_new_leader(&leases, &lease_name, &leader, killed).await;
                replicas.lock().await.restart(&leader);
                println!("SIGKILL of leader {leader}: {next} took over after {took:?}");
                failovers.push((leader, took));
            }
            failovers
        })
    };

    let took = roll(&r, "img-2", 2).await;
    let (killed, failovers): (BTreeSet<String>, Vec<Duration>) =
        killer.await.expect("the killer task").into_iter().unzip();
    assert_no_leak(&r).await;
    wait_none_left::<nodewarden::api::node_maintenance::medik8s::NodeMaintenance>(env).await;
    wait_none_left::<PendingNode>(env).await;
    let found = checker.finish().await;
    let replicas = Arc::try_unwrap(replicas)
        .ok()
        .expect("the killer is done")
        .into_inner();
    assert!(
        found.is_empty(),
        "invariants breached: {found:#?}\n{}",
        replicas.tail_logs()
    );
    println!(
        "rollout of 9 nodes (maxSurge 2) with two leader kills: {took:?}; first leader {first}; failovers {failovers:?}"
    );

    // Metrics: the leader's view of the finished rollout, with exemplars.
    let leader = holder(&leases, &lease_name).await.expect("a leader");
    let nv = env.name("version");
    let value = metric_value;
    let finished = [
        (
            format!("nodewarden_nodes{{nodeversion=\"{nv}\",state=\"up_to_date\"}}"),
            9.0,
        ),
        (
            format!("nodewarden_nodes{{nodeversion=\"{nv}\",state=\"outdated\"}}"),
            0.0,
        ),
        (
            format!("nodewarden_rollout_progress_ratio{{nodeversion=\"{nv}\"}}"),
            1.0,
        ),
    ];
    // The leader's last reconcile may still be running when the test sees
    // the last node go: poll until its gauges show the finished rollout.
    let scraped: BTreeMap<String, String> = wait_for(
        "the leader's gauges to show the finished rollout",
        Duration::from_secs(15),
        || async {
            let scraped = match replicas.scrape().await {
                Ok(s) => s,
                Err(e) => return Probe::NotYet(e),
            };
            let wrong: Vec<String> = finished
                .iter()
                .filter(|(series, want)| value(&scraped[&leader], series) != Some(*want))
                .map(|(series, want)| {
                    format!("{series} is {:?}, not {want}", value(&scraped[&leader], series))
                })
                .collect();
            if wrong.is_empty() {
                Probe::Done(scraped)
            } else {
                Probe::NotYet(wrong.join("; "))
            }
        },
    )
    .await;
    for (identity, text) in &scraped {
        let want = if *identity == leader { 1.0 } else { 0.0 };
        assert_eq!(
            value(text, "nodewarden_leader"),
            Some(want),
            "{identity}'s leader gauge"
        );
    }
    let at_leader = &scraped[&leader];
    let counted = |prefix: &str| -> f64 {
        scraped
            .values()
            .flat_map(|t| t.lines())
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    assert!(
        counted(
            "nodewarden_cloud_request_duration_seconds_count{provider=\"sim\",operation=\"create_node\"}"
        ) >= 1.0
    );
    assert!(counted("nodewarden_drain_duration_seconds_count{result=\"succeeded\"}") >= 1.0);
    assert!(counted("nodewarden_replacements_total") >= 1.0);
    assert!(
        at_leader
            .lines()
            .any(|l| l.starts_with("nodewarden_reconcile_duration_seconds_bucket")
                && l.contains("# {trace_id=\"")),
        "reconcile histogram buckets carry trace-id exemplars"
    );

    // Graceful handoff: SIGTERM releases the lease for a standby at once.
    let leader = holder(&leases, &lease_name).await.expect("a leader");
    let asked = Instant::now();
    replicas.sigterm(&leader);
    let (next, handoff) = wait_for_new_leader(&leases, &lease_name, &leader, asked).await;
    println!("SIGTERM of leader {leader}: {next} took over after {handoff:?}");
    assert!(
        handoff < Duration::from_secs(3),
        "a released lease is taken at once, not after expiry"
    );

    // Traces: exactly one per replaced node, every phase present, one that
    // crossed a leader change, each linked to the rollout's trace.
    let traces: Vec<JaegerTrace> = jaeger
        .wait_node_traces("nodewarden", "replace node", &initial)
        .await;
    let mut per_node: BTreeMap<String, Vec<&JaegerTrace>> = BTreeMap::new();
    for t in &traces {
        let root = t.root("replace node").expect("a root span");
        per_node
            .entry(root.tag_str("k8s.node.name").unwrap_or_default().to_string())
            .or_default()
            .push(t);
    }
    let rollouts = jaeger
        .traces("nodewarden", "rollout")
        .await
        .expect("rollout traces");
    let rollout_ids: BTreeSet<&str> = rollouts
        .iter()
        .filter(|t| t.root("rollout").is_some())
        .map(|t| t.trace_id.as_str())
        .collect();
    assert_eq!(rollout_ids.len(), 1, "one rollout trace");

    // The timeline page from the same answers: a row per replaced node and
    // the leader kills visible as changes of the replica sending spans.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64;
    let mut answers = Vec::new();
    for operation in ["replace node", "rollout"] {
        let uri = format!(
            "{}{}",
            jaeger.query,
            timeline::traces_query("nodewarden", operation, 0, now, 10_000)
        );
        let body = support::jaeger::http_get(&uri).await.expect("Jaeger's answer");
        answers.extend(timeline::parse_traces(&body).expect("traces in Jaeger's answer"));
    }
    let drawn = timeline::build(&answers, &timeline::Options::default());
    let rows: BTreeSet<String> = drawn.rows.iter().map(|r| r.node.clone()).collect();
    assert_eq!(
        (drawn.rows.len(), &rows),
        (initial.len(), &initial),
        "a timeline row per replaced node"
    );
    assert!(
        !drawn.leader_changes.is_empty(),
        "the timeline marks a leader change: {:?}",
        drawn.leader_changes
    );
    let changes: Vec<String> = drawn
        .leader_changes
        .iter()
        .map(|c| format!("{} → {}", c.from, c.to))
        .collect();
    println!("timeline: {} rows, leader changes {changes:?}", drawn.rows.len());
    let mut crossed = Vec::new();
    for (node, found) in &per_node {
        assert_eq!(found.len(), 1, "{node} has {} replacement traces", found.len());
        let t = found[0];
        let root = t.root("replace node").expect("a root");
        for key in [
            "nodewarden.heir",
            "nodewarden.scaling_group",
            "nodewarden.role",
            "nodewarden.image.old",
            "nodewarden.image.new",
        ] {
            assert!(root.tag(key).is_some(), "{node}: root span lacks {key}");
        }
        assert_eq!(root.tag_str("nodewarden.image.old"), Some("img-1"));
        assert_eq!(root.tag_str("nodewarden.image.new"), Some("img-2"));
        assert!(
            root.references
                .iter()
                .any(|r| rollout_ids.contains(r.trace_id.as_str()) && r.trace_id != t.trace_id),
            "{node}: the replacement links to the rollout trace"
        );
        let ops = t.operations();
        let missing: Vec<&str> = PHASES.iter().copied().filter(|p| !ops.contains(p)).collect();
        let instances = t.instances();
        if instances.len() > 1 {
            crossed.push((node.clone(), instances.clone(), missing.clone()));
        }
        // A replica killed between a phase and its flush may take that one
        // phase with it; anything else must be complete. The last phase,
        // "delete node", is flushed right after the deletion, but a replica
        // SIGKILLed within those milliseconds takes it along and no other
        // replica has anything left to send.
        let last_lost_to_a_kill = missing == ["delete node"]
            && instances.len() == 1
            && instances.iter().all(|i| killed.contains(i.as_str()));
        assert!(
            missing.is_empty() || instances.len() > 1 || last_lost_to_a_kill,
            "{node}: phases missing {missing:?} (spans {ops:?}, from {instances:?})"
        );
        assert_eq!(
            t.spans
                .iter()
                .filter(|s| s.operation_name == "replace node")
                .count(),
            1,
            "{node}: one root span"
        );
    }
    println!("replacement traces that crossed a leader change: {crossed:?}");
    assert!(
        !crossed.is_empty(),
        "at least one replacement trace spans two replicas"
    );
    let evictions: usize = traces
        .iter()
        .flat_map(|t| t.spans.iter())
        .filter(|s| s.operation_name == "drain")
        .map(|s| s.logs.len())
        .sum();
    assert!(
        evictions >= 4,
        "drain spans carry the evictions as events ({evictions})"
    );

    drop(replicas);
    // Passed: the logs are not needed any more.
    let _ = std::fs::remove_dir_all(dir);
    let _ = leases.delete(&lease_name, &DeleteParams::default()).await;
    let Rollout { env, sim, .. } = r;
    sim.sim.kill().await;
    env.cleanup().await;
}
