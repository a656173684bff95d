//! Rolling replacement against its ideal: 30 sim-cloud nodes in one worker
//! group rolled to a new image by one `nodewarden run` process (release
//! build under `cargo bench`, its ServiceAccount) at maxSurge 1, 3 and 10.
//!
//! The ideal is what the simulated cloud alone makes a rollout cost: each
//! wave of `maxSurge` new instances boots (`bootDelay`) and joins
//! (`joinDelay`) before the nodes they replace can go, so
//! `ideal = ceil(nodes / maxSurge) × (bootDelay + joinDelay)`. The nodes
//! carry no pods, so a drain is only nodewarden's own round trip (its
//! NodeMaintenance), and the cloud's `deleteDelay` runs after the Node is
//! gone, off the critical path: everything above the ideal is nodewarden's
//! overhead (watch → plan → cloud call → status), printed per wave.
//! Spans go to a Jaeger (built from Go modules), as in production, so the
//! export of each step's spans is part of the time measured.
//! The invariant checker watches every rollout: a bench run that breaks the
//! surge budget fails. Each rollout starts with nodewarden at rest (no cloud
//! call for 2.5 s), as a rollout in a running cluster does: the cloud ration
//! is full then. Where the machine's time went is printed per rollout:
//! every program's CPU seconds, how often the cores were saturated, and
//! kube-apiserver's own CPU profile (saved beside the timelines, read with
//! `go tool pprof -top`).
//!
//! `cargo bench --bench rollout` (`just bench-rollout`) prints one line per
//! surge and writes `.run/bench-rollout/rollout.json`. Under `cargo test`
//! (`just test`) it rolls 6 nodes at maxSurge 1 and 3 with shorter delays,
//! so the command cannot rot.

use nodewarden_testkit as support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::jaeger::Jaeger;
use support::procstat::{
    BusySampler, CpuSnapshot, apiserver_cpu_profile, apiserver_profile_shares, describe, json_by_program,
    saturated_share,
};
use support::replicas::*;
use support::rollout::{Checker, create_node_version, roll_nodes};
use support::sim::SimCloud;
use support::{Probe, RUN_LABEL, TestEnv, node_is_ready, seen, wait_for};

/// The simulated cloud's delays and the rollouts to time.
struct Scenario {
    nodes: usize,
    boot: Duration,
    join: Duration,
    delete: Duration,
    surges: Vec<usize>,
}

impl Scenario {
    fn ideal(&self, surge: usize) -> Duration {
        (self.boot + self.join) * self.waves(surge) as u32
    }

    fn waves(&self, surge: usize) -> usize {
        self.nodes.div_ceil(surge.max(1))
    }
}

/// One rollout's figures.
struct Timed {
    surge: usize,
    took: Duration,
    ideal: Duration,
    peak_surge: usize,
    /// Calls to the cloud during the rollout, by operation, per replaced node.
    cloud_calls_per_node: BTreeMap<&'static str, f64>,
    /// CPU seconds each program on the machine used during the rollout.
    cpu_by_program: Vec<(String, f64)>,
    /// The machine's busy fraction in each tenth of a second of the rollout.
    busy: Vec<f64>,
}

/// Every call to the cloud the replicas made so far, by operation (their
/// `/metrics`): the cloud's call budget is shared by every controller, and a
/// rollout at a high surge spends it.
async fn cloud_calls(replicas: &Replicas) -> BTreeMap<&'static str, f64> {
    const OPERATIONS: [&str; 9] = [
        "create_node",
        "delete_node",
        "node_state",
        "node_states",
        "node_image",
        "node_group",
        "group_image",
        "set_group_image",
        "list_groups",
    ];
    let texts = replicas.scrape().await.unwrap_or_default();
    OPERATIONS
        .into_iter()
        .map(|op| {
            let series = format!(
                "nodewarden_cloud_request_duration_seconds_count{{provider=\"sim\",operation=\"{op}\"}}"
            );
            (op, texts.values().filter_map(|t| metric_value(t, &series)).sum())
        })
        .collect()
}

/// Waits until the replicas have made no cloud call for [`REST`]: a rollout
/// begins with nodewarden at rest, its cloud ration full again (the nodes'
/// first image reads, or the last rollout's leaving instances, spend it).
async fn at_rest(replicas: &Replicas) {
    let started = std::time::Instant::now();
    let mut last = cloud_calls(replicas).await;
    let mut quiet_since = std::time::Instant::now();
    while quiet_since.elapsed() < REST && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = cloud_calls(replicas).await;
        if now != last {
            (last, quiet_since) = (now, std::time::Instant::now());
        }
    }
}

/// A quiet spell long enough for the default cloud ration (bursts of 20 at
/// 10 a second) to fill again.
const REST: Duration = Duration::from_millis(2500);

/// Programs named in the CPU breakdown, most CPU first.
const CPU_PROGRAMS_SHOWN: usize = 7;

impl Timed {
    fn ratio(&self) -> f64 {
        self.took.as_secs_f64() / self.ideal.as_secs_f64().max(1e-9)
    }

    /// Where the machine's time went during the rollout, per program.
    fn cpu_line(&self) -> String {
        describe(&self.cpu_by_program, self.took, &self.busy, CPU_PROGRAMS_SHOWN)
    }

    fn overhead_per_wave(&self, scenario: &Scenario) -> Duration {
        self.took.saturating_sub(self.ideal) / scenario.waves(self.surge) as u32
    }
}

fn millis(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// Waits until nodewarden has judged every node up to date (its status),
/// so a rollout starts from a settled NodeVersion.
async fn settled(env: &TestEnv, total: usize) {
    let api: Api<nodewarden::api::update::NodeVersion> = Api::all(env.client.clone());
    let name = env.name("version");
    wait_for("the NodeVersion settled", Duration::from_secs(120), || async {
        match api.get(&name).await {
            Ok(nv) => {
                let status = serde_json::to_value(&nv.status).unwrap_or_default();
                let up = status["upToDateNodes"].as_u64().unwrap_or(0) as usize;
                if up == total {
                    Probe::Done(())
                } else {
                    Probe::NotYet(format!("{up} of {total} up to date"))
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The rollout that began at `began` (µs) as `nodewarden-timeline` draws it:
/// a page to look at where each wave's time went.
async fn write_timeline(jaeger: &Jaeger, began: u64, page: &std::path::Path) {
    use nodewarden::telemetry::trace::{REPLACE_NODE, ROLLOUT};
    use nodewarden_timeline as timeline;
    let mut traces = Vec::new();
    for operation in [REPLACE_NODE, ROLLOUT] {
        let query = timeline::traces_query("nodewarden", operation, began, now_micros(), 10_000);
        match support::jaeger::http_get(&format!("{}{query}", jaeger.query)).await {
            Ok(body) => traces.extend(timeline::parse_traces(&body).unwrap_or_default()),
            Err(e) => println!("rollout: no timeline from Jaeger: {e}"),
        }
    }
    let drawn = timeline::build(&traces, &timeline::Options::default());
    if let Err(e) = std::fs::write(page, timeline::render(&drawn)) {
        println!("rollout: writing {}: {e}", page.display());
    }
}

async fn run(scenario: Scenario, command: &str) {
    let env = TestEnv::new("bench-rollout").await;
    support::install_crds(&env.client).await;
    let group = env.name("workers");
    let config = json!({"groups": [{
        "id": group, "role": "Worker", "initialSize": scenario.nodes, "image": "img-0",
        "bootDelay": millis(scenario.boot), "joinDelay": millis(scenario.join),
        "deleteDelay": millis(scenario.delete), "labels": {RUN_LABEL: env.id},
    }]});
    let sim = SimCloud::start_with_config(&config.to_string()).await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    let selector = env.run_selector();
    wait_for("the initial nodes Ready", Duration::from_secs(120), || async {
        match nodes.list(&ListParams::default().labels(&selector)).await {
            Ok(l) if l.items.iter().filter(|n| node_is_ready(n)).count() == scenario.nodes => Probe::Done(()),
            Ok(l) => Probe::NotYet(format!("{} nodes", l.items.len())),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    create_node_version(&env, &[(group.clone(), "Worker")], "img-0").await;

    // Traced as in production: each span step waits for its export to a
    // collector that answers.
    let jaeger = Jaeger::start();
    let dir = replica_log_dir(&env.id);
    let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
    // NODEWARDEN_REPLICA_LOG=debug shows where a wave's time goes.
    let log = std::env::var("NODEWARDEN_REPLICA_LOG").unwrap_or_else(|_| "info".into());
    let replicas = Replicas::start_with_env(
        1,
        &env,
        Shared {
            kubeconfig: &kubeconfig,
            lease_name: &format!("nodewarden-{}", env.id),
            otlp_endpoint: &jaeger.otlp_endpoint,
            extra: &["--sim-cloud", &sim.sim.addr],
            logs: &dir,
        },
        &[("RUST_LOG".into(), log)],
    );
    settled(&env, scenario.nodes).await;

    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".run/bench-rollout");
    std::fs::create_dir_all(&out).expect("an output directory");
    let mut timed = Vec::new();
    for (i, &surge) in scenario.surges.iter().enumerate() {
        at_rest(&replicas).await;
        let checker = Checker::start_with_sim(&env, scenario.nodes, surge, &sim.sim.provider);
        let image = format!("img-{}", i + 1);
        let began = now_micros();
        let calls_before = cloud_calls(&replicas).await;
        let (cpu_before, sampler) = (CpuSnapshot::take(), BusySampler::start());
        // The API server's own profile over the rollout's ideal time (at most
        // 50 s: a request may last a minute): what a wave's round trips cost.
        let profile_seconds = scenario.ideal(surge).as_secs().clamp(1, 50);
        let profile = {
            let client = env.client.clone();
            tokio::spawn(async move { apiserver_cpu_profile(&client, profile_seconds).await })
        };
        let took = roll_nodes(&env, scenario.nodes, &image, Some(surge)).await;
        let (cpu_by_program, busy) = (CpuSnapshot::take().used_since(&cpu_before), sampler.stop());
        let calls = cloud_calls(&replicas).await;
        let per_node: BTreeMap<&str, f64> = calls
            .iter()
            .map(|(op, n)| {
                (
                    *op,
                    (n - calls_before.get(op).copied().unwrap_or(0.0)) / scenario.nodes as f64,
                )
            })
            .filter(|(_, n)| *n > 0.0)
            .collect();
        let peak_surge = checker.peak_surge();
        let breaches = checker.finish().await;
        assert!(
            breaches.is_empty(),
            "invariants breached at maxSurge {surge}: {breaches:#?}\n{}",
            replicas.tail_logs()
        );
        let t = Timed {
            surge,
            took,
            ideal: scenario.ideal(surge),
            peak_surge,
            cloud_calls_per_node: per_node,
            cpu_by_program,
            busy,
        };
        // A breakdown that misses the operator measured nothing.
        assert!(
            t.cpu_by_program.iter().any(|(p, _)| p == "nodewarden run"),
            "no CPU time of nodewarden run in {:?}",
            t.cpu_by_program
        );
        println!("rollout: maxSurge {surge}: {}", t.cpu_line());
        let file = out.join(format!("kube-apiserver-cpu-surge-{surge}.pprof"));
        // The local control plane serves profiles and `go` built it: a
        // profile that cannot be had or read is a broken bench.
        let shares = profile
            .await
            .map_err(|e| e.to_string())
            .and_then(|p| p)
            .and_then(|bytes| std::fs::write(&file, bytes).map_err(|e| e.to_string()))
            .and_then(|()| apiserver_profile_shares(&file))
            .unwrap_or_else(|e| panic!("kube-apiserver's CPU profile at maxSurge {surge}: {e}"));
        println!(
            "rollout: maxSurge {surge}: kube-apiserver CPU profile over its first {profile_seconds} s, {shares} (go tool pprof -top {})",
            file.display()
        );
        println!(
            "rollout: maxSurge {surge}: cloud calls per replaced node: {:.1} ({})",
            t.cloud_calls_per_node.values().sum::<f64>(),
            t.cloud_calls_per_node
                .iter()
                .map(|(op, n)| format!("{op} {n:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!(
            "rollout: {} nodes at maxSurge {surge}: {:.1} s, ideal {:.1} s ({} waves of boot {:?} + join {:?}): {:.3} × ideal, {:.0} ms overhead per wave; most nodes in flight at once {}",
            scenario.nodes,
            t.took.as_secs_f64(),
            t.ideal.as_secs_f64(),
            scenario.waves(surge),
            scenario.boot,
            scenario.join,
            t.ratio(),
            t.overhead_per_wave(&scenario).as_secs_f64() * 1000.0,
            t.peak_surge,
        );
        timed.push(t);
        settled(&env, scenario.nodes).await;
        let page = out.join(format!("timeline-surge-{surge}.html"));
        write_timeline(&jaeger, began, &page).await;
    }

    let rows: Vec<Value> = timed
        .iter()
        .map(|t| {
            json!({
                "max_surge": t.surge,
                "seconds": t.took.as_secs_f64(),
                "ideal_seconds": t.ideal.as_secs_f64(),
                "ratio_to_ideal": t.ratio(),
                "overhead_per_wave_seconds": t.overhead_per_wave(&scenario).as_secs_f64(),
                "peak_surge_seen": t.peak_surge,
                "cloud_calls_per_node": t.cloud_calls_per_node,
                "cpu_seconds_by_program": json_by_program(&t.cpu_by_program, CPU_PROGRAMS_SHOWN),
                "machine_saturated_share": saturated_share(&t.busy),
            })
        })
        .collect();
    let report = json!({
        "command": command,
        "nodes": scenario.nodes,
        "boot_delay_seconds": scenario.boot.as_secs_f64(),
        "join_delay_seconds": scenario.join.as_secs_f64(),
        "delete_delay_seconds": scenario.delete.as_secs_f64(),
        "rollouts": rows,
    });
    std::fs::write(
        out.join("rollout.json"),
        serde_json::to_string_pretty(&report).unwrap_or_default(),
    )
    .expect("writing rollout.json");
    println!(
        "rollout: wrote {}/rollout.json and timeline-surge-N.html",
        out.display()
    );
    drop(replicas);
    sim.sim.kill().await;
    if std::env::var_os("NODEWARDEN_KEEP_LOGS").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    env.cleanup().await;
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let scenario = if full {
        Scenario {
            nodes: 30,
            boot: Duration::from_secs(2),
            join: Duration::from_secs(1),
            delete: Duration::from_secs(1),
            surges: vec![1, 3, 10],
        }
    } else {
        Scenario {
            nodes: 6,
            boot: Duration::from_millis(1000),
            join: Duration::from_millis(500),
            delete: Duration::from_millis(500),
            surges: vec![1, 3],
        }
    };
    // NODEWARDEN_ROLLOUT_SURGES=1,3 times only those surges (to look at one).
    if let Ok(surges) = std::env::var("NODEWARDEN_ROLLOUT_SURGES") {
        let mut scenario = scenario;
        scenario.surges = surges.split(',').filter_map(|s| s.trim().parse().ok()).collect();
        return run_main(scenario, full);
    }
    run_main(scenario, full)
}

fn run_main(scenario: Scenario, full: bool) {
    let command = if full {
        "cargo bench --bench rollout"
    } else {
        "cargo test --bench rollout"
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(run(scenario, command));
}
