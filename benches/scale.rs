//! Scale, side by side with the Node Maintenance Operator: thousands of kwok
//! Nodes with pods bound to them, watched by one `nodewarden run` process
//! (production's flags, its ServiceAccount) and by the peer's manager
//! (v0.17.0, built from its Go module) at the same time.
//!
//! For each point (nodes, pods) it reports, per process:
//! - time to serve: from the process's start until a NodeMaintenance created
//!   at that moment (on a node without pods) has Succeeded;
//! - RSS once serving, and after a steady period of kwok's heartbeats, with
//!   the CPU used per minute over that period;
//! - under churn (Node label changes at a fixed rate on top of the
//!   heartbeats, with a paused Plan selecting every node so Node events are
//!   nodewarden's work), the queue wait — watch event to reconcile start —
//!   p50 and p99, read from nodewarden's `nodewarden_workqueue_queue_duration_seconds`
//!   histograms (client-go's decade buckets: a quantile is interpolated
//!   within its bucket, and the bucket's bound is printed beside it).
//!
//! `cargo bench --bench scale` (`just bench-scale`, on a control plane of its
//! own) runs 1,000 and 5,000 nodes with 4 pods each, 5 minutes steady and
//! 60 s of churn at 60 Node updates a second; it prints one table and writes
//! it as JSON and as an SVG chart to `.run/bench-scale/`.
//! `NODEWARDEN_SCALE_NODES="500 2000"` and `NODEWARDEN_SCALE_STEADY=60`
//! change the points and the steady period. Under `cargo test` (`just test`)
//! it runs 100 nodes with 2 pods each, 5 s steady and 5 s of churn, so the
//! command cannot rot (its figures mean nothing at that size).

use nodewarden_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::nmo::{Nmo, maintenances, release_peer_finalizers};
use support::plans::{create_plan, replica_plan_flags, upgrade};
use support::procstat::cpu_seconds;
use support::replicas::*;
use support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};

/// API calls in flight while the bench fills the cluster.
const FILL_CONCURRENCY: usize = 48;
const SERVE_TIMEOUT: Duration = Duration::from_secs(600);

/// One size measured.
#[derive(Clone, Debug)]
struct Point {
    nodes: usize,
    pods_per_node: usize,
}

/// How long each phase lasts.
#[derive(Clone, Debug)]
struct Phases {
    steady: Duration,
    churn: Duration,
    churn_per_second: u32,
}

/// One process's figures at one point.
#[derive(Clone, Debug, Default)]
struct Figures {
    serve_s: f64,
    rss_serving_mb: f64,
    rss_steady_mb: f64,
    peak_rss_mb: f64,
    cpu_s_per_min: f64,
}

/// Queue waits under churn.
#[derive(Clone, Debug, Default)]
struct Churn {
    updates: usize,
    per_second: f64,
    reconciles: u64,
    p50_s: f64,
    p50_bound_s: f64,
    p99_s: f64,
    p99_bound_s: f64,
    cpu_s_per_min: f64,
}

/// kube-apiserver restarted (SIGKILL, etcd kept) under nodewarden.
#[derive(Clone, Debug, Default)]
struct Restart {
    /// From the kill until the API server answered again (cluster.sh).
    down_s: f64,
    /// From the API server answering until every reflector had a watch open again.
    rewatched_s: f64,
    /// From the API server answering until a NodeMaintenance created then had Succeeded.
    served_s: f64,
    /// Reflectors that listed again (a relist), by resource.
    relisted: Vec<String>,
    /// 410 answers the reflectors got meanwhile.
    expired: u64,
    reflectors: usize,
    peak_rss_mb: f64,
    peer_peak_rss_mb: f64,
}

/// `/proc/<pid>/status` field in kB, as MB.
fn status_mb(pid: u32, field: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Runs `count` futures made by `make`, `FILL_CONCURRENCY` at a time.
async fn fill<F, Fut>(count: usize, make: F)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter((0..count).map(make))
        .buffer_unordered(FILL_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}

/// Grows the cluster to `point`: nodes labelled `bench=scale`, and pods
/// bound to them directly (kwok runs them; the scheduler is not measured).
async fn grow(env: &TestEnv, point: &Point, names: &mut Vec<String>) {
    let started = Instant::now();
    let first = names.len();
    let new: Vec<String> = (first..point.nodes)
        .map(|i| env.name(&format!("scale-{i}")))
        .collect();
    fill(new.len(), |i| {
        let name = new[i].clone();
        async move { env.create_kwok_node(&name, &[("bench", "scale")]).await }
    })
    .await;
    // Pods are admitted only once the namespace's default ServiceAccount exists.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(env.client.clone(), &env.namespace);
    wait_for("the default ServiceAccount", SERVE_TIMEOUT, || async {
        match accounts.get_opt("default").await {
            Ok(Some(_)) => Probe::Done(()),
            Ok(None) => Probe::NotYet("not yet".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &env.namespace);
    let pods = &pods;
    fill(new.len() * point.pods_per_node, |i| {
        let node = new[i / point.pods_per_node].clone();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-{}", i % point.pods_per_node), "labels": {"app": "scale"}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
                "tolerations": [{"operator": "Exists"}],
            },
        }))
        .expect("a pod");
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .map(drop)
                .unwrap_or_else(|e| panic!("creating a pod: {e}"));
        }
    })
    .await;
    names.extend(new);
    let not_running = ListParams::default().fields("status.phase!=Running").limit(1);
    wait_for("every pod Running", SERVE_TIMEOUT, || async {
        match pods.list(&not_running).await {
            Ok(l) if l.items.is_empty() => Probe::Done(()),
            Ok(_) => Probe::NotYet("pods not Running yet".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    println!(
        "scale: {} nodes, {} pods created and Running in {:.1?}",
        point.nodes,
        point.nodes * point.pods_per_node,
        started.elapsed()
    );
}

/// A NodeMaintenance of `node`, labelled for nodewarden (`ours`) or not
/// (nodewarden's object selector then leaves it to the peer).
fn maintenance(env: &TestEnv, name: &str, node: &str, ours: bool) -> DynamicObject {
    let labels = if ours {
        json!({RUN_LABEL: env.id})
    } else {
        json!({})
    };
    serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "reason": "bench: time to serve"},
    }))
    .expect("a NodeMaintenance")
}

/// Creates the maintenance and waits until it has Succeeded; seconds since `started`.
async fn serve_time(env: &TestEnv, nm: &DynamicObject, started: Instant) -> f64 {
    let api = maintenances(env);
    api.create(&PostParams::default(), nm)
        .await
        .expect("creating a NodeMaintenance");
    let name = nm.metadata.name.clone().unwrap_or_default();
    wait_for(&format!("{name} Succeeded"), SERVE_TIMEOUT, || async {
        match api.get(&name).await {
            Ok(m) if m.data["status"]["phase"] == "Succeeded" => Probe::Done(()),
            Ok(m) => Probe::NotYet(format!("phase {}", m.data["status"]["phase"])),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    started.elapsed().as_secs_f64()
}

/// Deletes a maintenance and waits until it is gone (its node uncordoned).
async fn end_maintenance(env: &TestEnv, name: &str, peer: bool) {
    let api = maintenances(env);
    let _ = api.delete(name, &DeleteParams::default()).await;
    if peer {
        release_peer_finalizers(env).await;
    }
    wait_for(&format!("{name} gone"), SERVE_TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(m)) => Probe::NotYet(format!("finalizers {:?}", m.metadata.finalizers)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
}

/// `workqueue_queue_duration_seconds` buckets: queue → (le → cumulative count).
type Buckets = BTreeMap<String, BTreeMap<u64, (f64, u64)>>;

fn queue_buckets(metrics: &str) -> Buckets {
    let mut out = Buckets::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("nodewarden_workqueue_queue_duration_seconds_bucket{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
        };
        let (Some(name), Some(le)) = (label("name"), label("le")) else {
            continue;
        };
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap_or(f64::INFINITY)
        };
        let count = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        out.entry(name)
            .or_default()
            .insert(bound.to_bits(), (bound, count));
    }
    out
}

/// The quantile `q` of the observations between two scrapes, summed over
/// queues: (interpolated, upper bound of its bucket, observations).
fn quantile(before: &Buckets, after: &Buckets, q: f64) -> (f64, f64, u64) {
    let mut delta: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for (queue, buckets) in after {
        for (key, (bound, count)) in buckets {
            let was = before.get(queue).and_then(|b| b.get(key)).map_or(0, |(_, c)| *c);
            let entry = delta.entry(*key).or_insert((*bound, 0));
            entry.1 += count.saturating_sub(was);
        }
    }
    let mut ordered: Vec<(f64, u64)> = delta.into_values().collect();
    ordered.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = ordered.last().map_or(0, |(_, c)| *c);
    if total == 0 {
        return (f64::NAN, f64::NAN, 0);
    }
    let rank = q * total as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for (bound, cumulative) in ordered {
        if cumulative as f64 >= rank {
            if bound.is_infinite() {
                return (lower, bound, total);
            }
            let within = (cumulative - below).max(1) as f64;
            let at = lower + (bound - lower) * ((rank - below as f64) / within);
            return (at, bound, total);
        }
        (lower, below) = (bound, cumulative);
    }
    (f64::NAN, f64::NAN, total)
}

/// Label changes on the nodes at `per_second` for `period`; how many were made.
async fn churn(env: &TestEnv, names: &[String], period: Duration, per_second: u32) -> usize {
    let nodes: Api<Node> = Api::all(env.client.clone());
    let done = Arc::new(AtomicUsize::new(0));
    let mut tick = tokio::time::interval(Duration::from_secs(1) / per_second);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let end = Instant::now() + period;
    let limit = Arc::new(tokio::sync::Semaphore::new(FILL_CONCURRENCY));
    let mut i = 0usize;
    while Instant::now() < end {
        tick.tick().await;
        let name = names[i % names.len()].clone();
        let patch = json!({"metadata": {"labels": {"bench-churn": (i % 7).to_string()}}});
        let (nodes, done, permit) = (nodes.clone(), done.clone(), limit.clone().acquire_owned().await);
        tokio::spawn(async move {
            let _permit = permit;
            if nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
        i += 1;
    }
    // Let the last patches land.
    let _ = limit.acquire_many(FILL_CONCURRENCY as u32).await;
    done.load(Ordering::Relaxed)
}

/// One `nodewarden_reflector_<family>_total` counter per reflector (`resource selector`).
fn reflector_counters(metrics: &str, family: &str) -> BTreeMap<String, u64> {
    let prefix = format!("nodewarden_reflector_{family}_total{{");
    metrics
        .lines()
        .filter_map(|line| {
            let (labels, value) = line.strip_prefix(&prefix)?.split_once("} ")?;
            Some((labels.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

/// The resource a reflector's label text names.
fn resource_of(labels: &str) -> String {
    labels
        .split(',')
        .find_map(|kv| kv.strip_prefix("resource=\""))
        .map_or(labels, |v| v.trim_end_matches('"'))
        .to_string()
}

/// Restarts kube-apiserver under both processes; nodewarden's reflectors
/// tell when they watch again and whether they listed again.
async fn restart_apiserver(
    env: &TestEnv,
    addr: &str,
    ours_pid: u32,
    theirs_pid: u32,
    idle: &str,
    n: usize,
) -> Restart {
    let before = scrape(addr).await;
    let (watches, lists, expired) = (
        reflector_counters(&before, "watches"),
        reflector_counters(&before, "lists"),
        reflector_counters(&before, "expired"),
    );
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let (mut ours, mut theirs) = (0f64, 0f64);
            while sampling.load(Ordering::Relaxed) {
                ours = ours.max(status_mb(ours_pid, "VmRSS:"));
                theirs = theirs.max(status_mb(theirs_pid, "VmRSS:"));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (ours, theirs)
        })
    };
    let killed = Instant::now();
    tokio::task::spawn_blocking(|| support::control_plane().restart_apiserver())
        .await
        .expect("restarting kube-apiserver");
    let up = Instant::now();
    let name = env.name(&format!("after-restart-{n}"));
    let marker = maintenance(env, &name, idle, true);
    let served = serve_time(env, &marker, up);
    let rewatched = async {
        wait_for("every reflector watching again", SERVE_TIMEOUT, || async {
            let now = reflector_counters(&scrape(addr).await, "watches");
            let behind: Vec<&String> = watches
                .iter()
                .filter(|(k, v)| now.get(*k).is_none_or(|w| w <= v))
                .map(|(k, _)| k)
                .collect();
            if behind.is_empty() {
                Probe::Done(up.elapsed().as_secs_f64())
            } else {
                Probe::NotYet(format!("not watching again: {behind:?}"))
            }
        })
        .await
    };
    let (served_s, rewatched_s) = tokio::join!(served, rewatched);
    end_maintenance(env, &name, false).await;
    sampling.store(false, Ordering::Relaxed);
    let (peak, peer_peak) = sampler.await.unwrap_or_default();
    let after = scrape(addr).await;
    let relisted = reflector_counters(&after, "lists")
        .into_iter()
        .filter(|(k, v)| lists.get(k).is_some_and(|was| v > was))
        .map(|(k, _)| resource_of(&k))
        .collect();
    let expired_now: u64 = reflector_counters(&after, "expired").values().sum();
    Restart {
        down_s: (up - killed).as_secs_f64(),
        rewatched_s,
        served_s,
        relisted,
        expired: expired_now.saturating_sub(expired.values().sum()),
        reflectors: watches.len(),
        peak_rss_mb: peak,
        peer_peak_rss_mb: peer_peak,
    }
}

async fn scrape(addr: &str) -> String {
    support::jaeger::http_get(&format!("http://{addr}/metrics"))
        .await
        .unwrap_or_default()
}

/// Both processes at one point.
async fn measure(
    env: &TestEnv,
    point: &Point,
    phases: &Phases,
    names: &[String],
    dir: &Path,
    restart: bool,
) -> (Figures, Figures, Churn, Option<Restart>) {
    let idle = [env.name("scale-idle-0"), env.name("scale-idle-1")];
    let n = point.nodes;

    // nodewarden: started, serving, then the peer beside it.
    let kubeconfig = service_account_kubeconfig(&env.client, dir).await;
    let lease_name = env.name(&format!("lease-{n}"));
    let flags = replica_plan_flags(&env.namespace);
    let started = Instant::now();
    let replicas = Replicas::start_default_election(
        1,
        env,
        &kubeconfig,
        &lease_name,
        "http://127.0.0.1:9",
        &flags,
        dir,
    );
    let identity = replicas.identities()[0].clone();
    let ours_pid = replicas.pid(&identity).expect("nodewarden runs");
    let addr = replicas.http[&identity].clone();
    let mut ours = Figures {
        serve_s: serve_time(
            env,
            &maintenance(env, &env.name(&format!("serve-{n}")), &idle[0], true),
            started,
        )
        .await,
        ..Figures::default()
    };
    ours.rss_serving_mb = status_mb(ours_pid, "VmRSS:");
    end_maintenance(env, &env.name(&format!("serve-{n}")), false).await;

    let started = Instant::now();
    let nmo = Nmo::start(dir);
    let theirs_pid = nmo.pid().expect("the peer runs");
    let peer_nm = format!("scale-peer-serve-{}-{n}", env.id);
    let mut theirs = Figures {
        serve_s: serve_time(env, &maintenance(env, &peer_nm, &idle[1], false), started).await,
        ..Figures::default()
    };
    theirs.rss_serving_mb = status_mb(theirs_pid, "VmRSS:");
    end_maintenance(env, &peer_nm, true).await;

    // Steady: heartbeats only.
    let (ours_cpu, theirs_cpu) = (cpu_seconds(ours_pid), cpu_seconds(theirs_pid));
    tokio::time::sleep(phases.steady).await;
    let minutes = phases.steady.as_secs_f64() / 60.0;
    ours.cpu_s_per_min = (cpu_seconds(ours_pid) - ours_cpu) / minutes;
    theirs.cpu_s_per_min = (cpu_seconds(theirs_pid) - theirs_cpu) / minutes;
    ours.rss_steady_mb = status_mb(ours_pid, "VmRSS:");
    theirs.rss_steady_mb = status_mb(theirs_pid, "VmRSS:");

    // Churn: a paused Plan over every node makes Node events nodewarden's work.
    let plan = format!("churn-{n}");
    create_plan(
        env,
        &plan,
        json!({}),
        json!({
            "concurrency": 0,
            "nodeSelector": {"matchLabels": {"bench": "scale"}},
            "serviceAccountName": "default",
            "version": "v1",
            "upgrade": upgrade("registry.invalid/upgrade"),
        }),
    )
    .await
    .expect("creating the churn Plan");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = queue_buckets(&scrape(&addr).await);
    let cpu_before = cpu_seconds(ours_pid);
    let churned = Instant::now();
    let updates = churn(env, names, phases.churn, phases.churn_per_second).await;
    let took = churned.elapsed();
    // Reconciles started by the last events.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = queue_buckets(&scrape(&addr).await);
    let (p50, p50_bound, reconciles) = quantile(&before, &after, 0.5);
    let (p99, p99_bound, _) = quantile(&before, &after, 0.99);
    let churn = Churn {
        updates,
        per_second: updates as f64 / took.as_secs_f64(),
        reconciles,
        p50_s: p50,
        p50_bound_s: p50_bound,
        p99_s: p99,
        p99_bound_s: p99_bound,
        cpu_s_per_min: (cpu_seconds(ours_pid) - cpu_before) / (took.as_secs_f64() / 60.0),
    };
    ours.peak_rss_mb = status_mb(ours_pid, "VmHWM:");
    theirs.peak_rss_mb = status_mb(theirs_pid, "VmHWM:");
    let _ = support::plans::plans(env, &env.namespace)
        .delete(&plan, &DeleteParams::default())
        .await;
    let restarted = if restart {
        Some(restart_apiserver(env, &addr, ours_pid, theirs_pid, &idle[0], n).await)
    } else {
        None
    };
    drop(nmo);
    drop(replicas);
    release_peer_finalizers(env).await;
    (ours, theirs, churn, restarted)
}

fn ms(s: f64) -> String {
    if s.is_nan() {
        "n/a".into()
    } else {
        format!("{:.2} ms", s * 1000.0)
    }
}

fn bound(s: f64) -> String {
    if s.is_infinite() { "+Inf".into() } else { ms(s) }
}

/// The run as one Markdown table: nodewarden beside the peer, ratios from this run.
fn table_lines(
    rows: &[(Point, Figures, Figures, Churn)],
    restarted: Option<&(usize, Restart)>,
    phases: &Phases,
    command: &str,
) -> Vec<String> {
    let mut lines = vec![
        format!("| figure | nodewarden | Node Maintenance Operator v0.17.0 | peer ÷ nodewarden | command |"),
        "|---|---|---|---|---|".to_string(),
    ];
    let ratio = |a: f64, b: f64| format!("{:.1} ×", b / a.max(1e-9));
    for (p, ours, theirs, churn) in rows {
        let at = format!("{} nodes, {} pods", p.nodes, p.nodes * p.pods_per_node);
        let mut pair = |what: &str, a: f64, b: f64, unit: &str| {
            lines.push(format!(
                "| {at}: {what} | {a:.1} {unit} | {b:.1} {unit} | {} | `{command}` |",
                ratio(a, b)
            ));
        };
        pair(
            "time to serve (start → first NodeMaintenance Succeeded)",
            ours.serve_s,
            theirs.serve_s,
            "s",
        );
        pair(
            "RSS once serving",
            ours.rss_serving_mb,
            theirs.rss_serving_mb,
            "MB",
        );
        pair(
            &format!("RSS after {} s of heartbeats", phases.steady.as_secs()),
            ours.rss_steady_mb,
            theirs.rss_steady_mb,
            "MB",
        );
        pair("peak RSS (VmHWM)", ours.peak_rss_mb, theirs.peak_rss_mb, "MB");
        pair(
            "CPU per minute, steady",
            ours.cpu_s_per_min,
            theirs.cpu_s_per_min,
            "s",
        );
        lines.push(format!(
            "| {at}: watch event → reconcile start under {:.0} Node updates/s ({} reconciles) | p50 {}, p99 {} | | | `{command}` |",
            churn.per_second,
            churn.reconciles,
            ms(churn.p50_s),
            ms(churn.p99_s),
        ));
    }
    if let Some((nodes, r)) = restarted {
        lines.push(format!(
            "| {nodes} nodes: kube-apiserver restarted → every reflector watching again / a new NodeMaintenance served | {:.2} s / {:.2} s after it answered (down {:.1} s); relisted: {}; peak RSS {:.1} MB | peak RSS {:.1} MB | | `{command}` |",
            r.rewatched_s,
            r.served_s,
            r.down_s,
            if r.relisted.is_empty() { "none".to_string() } else { r.relisted.join(", ") },
            r.peak_rss_mb,
            r.peer_peak_rss_mb,
        ));
    }
    lines
}

fn row(point: &Point, ours: &Figures, theirs: &Figures, churn: &Churn) -> Value {
    json!({
        "nodes": point.nodes,
        "pods": point.nodes * point.pods_per_node,
        "nodewarden": figures_json(ours),
        "node_maintenance_operator": figures_json(theirs),
        "rss_ratio_peer_over_nodewarden": theirs.rss_steady_mb / ours.rss_steady_mb.max(1e-9),
        "churn": {
            "node_updates": churn.updates,
            "node_updates_per_second": churn.per_second,
            "reconciles": churn.reconciles,
            "queue_wait_p50_seconds": churn.p50_s,
            "queue_wait_p50_bucket_bound_seconds": churn.p50_bound_s,
            "queue_wait_p99_seconds": churn.p99_s,
            "queue_wait_p99_bucket_bound_seconds": churn.p99_bound_s,
            "nodewarden_cpu_seconds_per_minute": churn.cpu_s_per_min,
        },
    })
}

fn figures_json(f: &Figures) -> Value {
    json!({
        "time_to_serve_seconds": f.serve_s,
        "rss_serving_mb": f.rss_serving_mb,
        "rss_steady_mb": f.rss_steady_mb,
        "peak_rss_mb": f.peak_rss_mb,
        "cpu_seconds_per_minute_steady": f.cpu_s_per_min,
    })
}

/// A bar chart of steady RSS per point, nodewarden beside the peer.
fn chart(rows: &[(Point, Figures, Figures, Churn)]) -> String {
    let max = rows
        .iter()
        .map(|(_, a, b, _)| a.rss_steady_mb.max(b.rss_steady_mb))
        .fold(1.0, f64::max);
    let (width, height, bar) = (120 + 160 * rows.len(), 320.0, 50.0);
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="360" font-family="sans-serif" font-size="12">
<text x="10" y="20" font-size="14">RSS after steady heartbeats (MB): nodewarden vs Node Maintenance Operator v0.17.0</text>
<rect x="10" y="30" width="12" height="12" fill="#2a7"/><text x="28" y="41">nodewarden</text>
<rect x="120" y="30" width="12" height="12" fill="#c63"/><text x="138" y="41">Node Maintenance Operator</text>
"##
    );
    for (i, (point, ours, theirs, _)) in rows.iter().enumerate() {
        let x = 60.0 + 160.0 * i as f64;
        for (j, (mb, colour)) in [(ours.rss_steady_mb, "#2a7"), (theirs.rss_steady_mb, "#c63")]
            .into_iter()
            .enumerate()
        {
            let h = (height - 80.0) * mb / max;
            let bx = x + j as f64 * (bar + 6.0);
            let y = height - h;
            svg.push_str(&format!(
                r#"<rect x="{bx:.0}" y="{y:.0}" width="{bar}" height="{h:.0}" fill="{colour}"/><text x="{bx:.0}" y="{:.0}">{mb:.0}</text>
"#,
                y - 4.0
            ));
        }
        svg.push_str(&format!(
            r#"<text x="{x:.0}" y="{:.0}">{} nodes, {} pods</text>
"#,
            height + 20.0,
            point.nodes,
            point.nodes * point.pods_per_node
        ));
    }
    svg.push_str("</svg>\n");
    svg
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let points: Vec<Point> = match std::env::var("NODEWARDEN_SCALE_NODES") {
        Ok(v) => v
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .map(|nodes| Point {
                nodes,
                pods_per_node: 4,
            })
            .collect(),
        Err(_) if full => vec![
            Point {
                nodes: 1000,
                pods_per_node: 4,
            },
            Point {
                nodes: 5000,
                pods_per_node: 4,
            },
        ],
        Err(_) => vec![Point {
            nodes: 100,
            pods_per_node: 2,
        }],
    };
    let steady = std::env::var("NODEWARDEN_SCALE_STEADY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 300 } else { 5 });
    let phases = Phases {
        steady: Duration::from_secs(steady),
        churn: Duration::from_secs(if full { 60 } else { 5 }),
        churn_per_second: if full { 60 } else { 50 },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let command = if full {
        "cargo bench --bench scale"
    } else {
        "cargo test --bench scale"
    };
    runtime.block_on(run(points, phases, command));
}

async fn run(points: Vec<Point>, phases: Phases, command: &str) {
    let env = TestEnv::new("scale").await;
    support::install_crds(&env.client).await;
    let dir = replica_log_dir(&env.id);
    for idle in [env.name("scale-idle-0"), env.name("scale-idle-1")] {
        env.create_kwok_node(&idle, &[("bench", "scale-idle")]).await;
    }
    let mut names = Vec::new();
    let mut rows = Vec::new();
    let mut restarted = None;
    let last = points.len().saturating_sub(1);
    for (i, point) in points.into_iter().enumerate() {
        grow(&env, &point, &mut names).await;
        let (ours, theirs, churn, restart) = measure(&env, &point, &phases, &names, &dir, i == last).await;
        if let Some(r) = restart {
            println!(
                "scale: kube-apiserver restarted at {} nodes: down {:.1} s; every reflector ({}) watching again {:.2} s after it answered, a new NodeMaintenance served after {:.2} s; relisted: {}; 410s: {}; peak RSS meanwhile {:.1} MB (peer {:.1} MB)",
                point.nodes,
                r.down_s,
                r.reflectors,
                r.rewatched_s,
                r.served_s,
                if r.relisted.is_empty() {
                    "none".to_string()
                } else {
                    r.relisted.join(", ")
                },
                r.expired,
                r.peak_rss_mb,
                r.peer_peak_rss_mb,
            );
            restarted = Some((point.nodes, r));
        }
        println!(
            "scale: {} nodes, {} pods: nodewarden serves after {:.1} s, RSS {:.1} MB serving, {:.1} MB after {} s steady (peak {:.1}), {:.2} CPU s/min; peer serves after {:.1} s, RSS {:.1} MB serving, {:.1} MB steady (peak {:.1}), {:.2} CPU s/min; peer/nodewarden RSS {:.1} ×",
            point.nodes,
            point.nodes * point.pods_per_node,
            ours.serve_s,
            ours.rss_serving_mb,
            ours.rss_steady_mb,
            phases.steady.as_secs(),
            ours.peak_rss_mb,
            ours.cpu_s_per_min,
            theirs.serve_s,
            theirs.rss_serving_mb,
            theirs.rss_steady_mb,
            theirs.peak_rss_mb,
            theirs.cpu_s_per_min,
            theirs.rss_steady_mb / ours.rss_steady_mb.max(1e-9),
        );
        println!(
            "scale: {} nodes churning ({} Node updates, {:.0}/s, plus heartbeats): {} reconciles, queue wait p50 {} (bucket ≤ {}), p99 {} (bucket ≤ {}); nodewarden {:.2} CPU s/min",
            point.nodes,
            churn.updates,
            churn.per_second,
            churn.reconciles,
            ms(churn.p50_s),
            bound(churn.p50_bound_s),
            ms(churn.p99_s),
            bound(churn.p99_bound_s),
            churn.cpu_s_per_min,
        );
        rows.push((point, ours, theirs, churn));
    }
    for line in table_lines(&rows, restarted.as_ref(), &phases, command) {
        println!("scale: {line}");
    }
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".run/bench-scale");
    std::fs::create_dir_all(&out).expect("an output directory");
    let table: Vec<Value> = rows.iter().map(|(p, a, b, c)| row(p, a, b, c)).collect();
    let report = json!({
        "command": command,
        "steady_seconds": phases.steady.as_secs(),
        "churn_seconds": phases.churn.as_secs(),
        "points": table,
        "apiserver_restart": restarted.as_ref().map(|(nodes, r)| json!({
            "nodes": nodes,
            "apiserver_down_seconds": r.down_s,
            "every_reflector_watching_again_seconds": r.rewatched_s,
            "new_maintenance_served_seconds": r.served_s,
            "reflectors": r.reflectors,
            "relisted_resources": r.relisted,
            "watch_expired_410": r.expired,
            "nodewarden_peak_rss_mb": r.peak_rss_mb,
            "peer_peak_rss_mb": r.peer_peak_rss_mb,
        })),
    });
    std::fs::write(
        out.join("scale.json"),
        serde_json::to_string_pretty(&report).unwrap_or_default(),
    )
    .expect("writing scale.json");
    std::fs::write(out.join("scale.svg"), chart(&rows)).expect("writing scale.svg");
    println!("scale: wrote {}/scale.json and scale.svg", out.display());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = maintenances(&env)
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&env.run_selector()),
        )
        .await;
    env.cleanup().await;
}
