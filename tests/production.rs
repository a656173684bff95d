//! The production shape on the local control plane: three `nodewarden run`
//! processes authenticated as the ServiceAccount of manifests/rbac.yaml (and
//! nothing more), exporting traces to a Jaeger built from Go modules. A
//! rollout runs while the leader is killed twice; the invariant checker
//! watches throughout; then a SIGTERM handoff; then every replacement's trace
//! is read back from Jaeger.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Client, ResourceExt};
use nodewarden::api::update::PendingNode;
use serde_json::json;
use support::jaeger::{Jaeger, JaegerTrace};
use support::rollout::*;
use support::{Probe, TestEnv, wait_for};
use tokio::process::{Child, Command};

const SYSTEM_NAMESPACE: &str = "nodewarden-system";
const PHASES: [&str; 7] = [
    "create instance",
    "wait for join",
    "wait ready",
    "transfer labels",
    "drain",
    "delete instance",
    "delete node",
];

/// A kubeconfig that authenticates as nodewarden's ServiceAccount, bound only
/// to the roles of manifests/rbac.yaml.
async fn service_account_kubeconfig(client: &Client, dir: &Path) -> PathBuf {
    for file in ["namespace.yaml", "rbac.yaml"] {
        support::apply_manifest(
            client,
            &PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("manifests")
                .join(file),
        )
        .await;
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .create_token_request("nodewarden", &PostParams::default(), &request)
        .await
        .expect("a ServiceAccount token")
        .status
        .expect("a token in the status")
        .token;
    let admin = Kubeconfig::read_from(&support::control_plane().kubeconfig).expect("the admin kubeconfig");
    let cluster = admin.clusters.first().expect("a cluster").clone();
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "nodewarden", "user": {"token": token}}],
        "contexts": [{"name": "nodewarden", "context": {"cluster": cluster.name, "user": "nodewarden"}}],
        "current-context": "nodewarden",
    });
    let path = dir.join("nodewarden.kubeconfig");
    std::fs::write(&path, serde_json::to_string(&config).expect("json")).expect("writing the kubeconfig");
    path
}

/// One `nodewarden run` process, as one pod of the Deployment.
struct Replica {
    identity: String,
    child: Child,
}

struct Replicas {
    args: Vec<String>,
    /// Each replica's /metrics address (kept across restarts, like a pod's).
    http: BTreeMap<String, String>,
    envs: Vec<(String, String)>,
    logs: PathBuf,
    running: Vec<Replica>,
}

impl Replicas {
    fn spawn(&mut self, identity: &str) -> Replica {
        let http = self
            .http
            .entry(identity.to_string())
            .or_insert_with(|| {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
                listener.local_addr().expect("an address").to_string()
            })
            .clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{identity}.log")))
            .expect("a log file");
        let child = Command::new(env!("CARGO_BIN_EXE_nodewarden"))
            .arg("run")
            .args(&self.args)
            .args(["--identity", identity, "--http-addr", &http])
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting nodewarden run");
        Replica {
            identity: identity.to_string(),
            child,
        }
    }

    fn position(&self, identity: &str) -> usize {
        self.running
            .iter()
            .position(|r| r.identity == identity)
            .unwrap_or_else(|| panic!("{identity} is not one of the replicas"))
    }

    /// SIGKILL: no chance to release anything.
    async fn kill(&mut self, identity: &str) {
        let i = self.position(identity);
        let _ = self.running[i].child.start_kill();
        let _ = self.running[i].child.wait().await;
    }

    /// Starts a killed replica again under the same name (the kubelet
    /// restarting the container of the same pod).
    fn restart(&mut self, identity: &str) {
        let i = self.position(identity);
        self.running[i] = self.spawn(identity);
    }

    fn sigterm(&self, identity: &str) {
        let pid = self.running[self.position(identity)]
            .child
            .id()
            .expect("a running replica");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM {pid}");
    }

    fn tail_logs(&self) -> String {
        let mut out = String::new();
        for r in &self.running {
            let text =
                std::fs::read_to_string(self.logs.join(format!("{}.log", r.identity))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {} (last 15 lines)\n", r.identity));
            for l in &lines[lines.len().saturating_sub(15)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// How long until a replica other than `old` holds the lease.
async fn wait_for_new_leader(
    leases: &Api<Lease>,
    name: &str,
    old: &str,
    since: Instant,
) -> (String, Duration) {
    loop {
        if let Some(h) = holder(leases, name).await
            && h != old
        {
            return (h, since.elapsed());
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "no new leader after {old} in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_as_the_service_account_survive_two_leader_kills_with_one_trace_per_replacement() {
    let jaeger = Jaeger::start();
    let r = setup("ha", &[("cp", "ControlPlane", 3), ("workers", "Worker", 6)]).await;
    let env: &TestEnv = &r.env;
    workload(env, "web", 4).await;
    let initial = node_names(env).await;
    assert_eq!(initial.len(), 9);

    // Kept when the test fails: the replicas' logs are where a failure is explained.
    let dir = tempfile::Builder::new()
        .prefix(&format!("nodewarden-{}-", env.id))
        .tempdir()
        .expect("a temp dir")
        .keep();
    println!("replica logs in {}", dir.display());
    let dir = &dir;
    let kubeconfig = service_account_kubeconfig(&env.client, dir).await;
    let lease_name = format!("nodewarden-{}", env.id);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let mut replicas = Replicas {
        args: [
            "--kubeconfig",
            &kubeconfig.to_string_lossy(),
            "--lease-namespace",
            SYSTEM_NAMESPACE,
            "--lease-name",
            &lease_name,
            "--lease-duration",
            "3",
            "--renew-deadline",
            "2",
            "--retry-period",
            "0.5",
            "--node-selector",
            &env.run_selector(),
            "--object-selector",
            &env.run_selector(),
            "--sim-cloud",
            &r.sim.sim.addr,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        envs: vec![
            ("RUST_LOG".into(), "info".into()),
            ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), jaeger.otlp_endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/json".into()),
            ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
        ],
        http: BTreeMap::new(),
        logs: dir.to_path_buf(),
        running: Vec::new(),
    };
    for i in 0..3 {
        let replica = replicas.spawn(&format!("{}-replica-{i}", env.id));
        replicas.running.push(replica);
    }
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
            let pending: Api<PendingNode> = Api::all(client);
            let mut failovers = Vec::new();
            for replaced in [2, 5] {
                loop {
                    let list = nodes.list(&ListParams::default().labels(&selector)).await;
                    let joining = pending.list(&ListParams::default().labels(&selector)).await;
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
                failovers.push(took);
            }
            failovers
        })
    };

    let took = roll(&r, "img-2", 2).await;
    let failovers = killer.await.expect("the killer task");
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
    let value = |text: &str, series: &str| -> Option<f64> {
        text.lines()
            .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
            .and_then(|l| l[series.len()..].split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
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
            let mut scraped = BTreeMap::new();
            for (identity, addr) in &replicas.http {
                match support::jaeger::http_get(&format!("http://{addr}/metrics")).await {
                    Ok(text) => scraped.insert(identity.clone(), text),
                    Err(e) => return Probe::NotYet(format!("scraping {identity}: {e}")),
                };
            }
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
    let traces: Vec<JaegerTrace> = wait_for(
        "a replacement trace per replaced node in Jaeger",
        Duration::from_secs(30),
        || async {
            match jaeger.traces("nodewarden", "replace node").await {
                Ok(t) => {
                    let nodes: BTreeSet<String> = t
                        .iter()
                        .filter_map(|t| t.root("replace node"))
                        .filter_map(|s| s.tag_str("k8s.node.name").map(str::to_string))
                        .collect();
                    if nodes == initial {
                        Probe::Done(t)
                    } else {
                        Probe::NotYet(format!("traces for {nodes:?}"))
                    }
                }
                Err(e) => Probe::NotYet(e),
            }
        },
    )
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
        // phase with it; anything else must be complete.
        assert!(
            missing.is_empty() || instances.len() > 1,
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
