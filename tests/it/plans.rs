//! In-place upgrade Plans (`upgrade.cattle.io/v1`) against the real control
//! plane: the real Job controller runs the upgrade Jobs (and fails them at
//! their deadline), the real scheduler places their pods and kwok completes
//! them, the API server enforces PodDisruptionBudgets and the CRD's CEL rules.

use crate::support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::plans::*;
use crate::support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use nodewarden::api::plan::Plan;
use serde_json::{Value, json};

#[tokio::test]
async fn the_seed_plan_applies_unchanged_and_upgrades_its_nodes() {
    let env = TestEnv::new("plan-seed").await;
    support::install_crds(&env.client).await;
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "k3os-system"}})).expect("a namespace");
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating k3os-system: {e}"),
    }
    // Strict validation: an unknown or misspelt field would fail the apply.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("manifests/samples/upgrade-plan-k3os.yaml");
    let text = std::fs::read_to_string(&path).expect("reading the sample");
    let doc: Value =
        serde_norway::from_str(text.split("\n---\n").nth(1).expect("one document")).expect("yaml");
    let api = plans(&env, "k3os-system");
    let params = PatchParams::apply("plans-test").force().validation_strict();
    let applied: Plan = serde_json::from_value(doc.clone()).expect("a plan");
    api.patch("k3os-latest", &params, &Patch::Apply(&applied))
        .await
        .expect("seed 003's Plan applies");
    // Only this test's operator may see it: its run label (the spec stays the seed's).
    let label = json!({"metadata": {"labels": {RUN_LABEL: env.id}}});
    api.patch("k3os-latest", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("labelling");

    let nodes = env
        .create_kwok_nodes(
            2,
            &[
                ("plan.upgrade.cattle.io/k3os-latest", ""),
                ("k3os.io/mode", "local"),
            ],
        )
        .await;
    let live = env
        .create_kwok_nodes(
            1,
            &[
                ("plan.upgrade.cattle.io/k3os-latest", ""),
                ("k3os.io/mode", "live"),
            ],
        )
        .await;
    let operator = env.start_operator(Default::default()).await;
    let hash = wait_upgraded(&env, "k3os-system", "k3os-latest", &nodes, TIMEOUT).await;
    let p = api.get("k3os-latest").await.expect("the plan");
    let status = p.status.expect("a status");
    assert_eq!(
        status.latest_version.as_deref(),
        Some("v0.9.0-dev"),
        "version wins over channel"
    );
    assert_eq!(hash.len(), 56);
    // The live node is not selected; drained nodes are released (uncordoned).
    assert_ne!(
        node(&env, &live[0])
            .await
            .labels()
            .get("plan.upgrade.cattle.io/k3os-latest"),
        Some(&hash)
    );
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), "k3os-system");
    for n in &nodes {
        let lp = ListParams::default().labels(&format!("upgrade.cattle.io/node={n}"));
        let js = jobs.list(&lp).await.expect("listing jobs");
        assert_eq!(js.items.len(), 1, "one Job per node and hash");
        let job = &js.items[0];
        assert!(
            job.name_any().starts_with("apply-k3os-latest-on-"),
            "{}",
            job.name_any()
        );
        let pod = job
            .spec
            .as_ref()
            .and_then(|s| s.template.spec.clone())
            .expect("a pod spec");
        assert_eq!(
            pod.containers[0].image.as_deref(),
            Some("rancher/k3os:v0.9.0-dev")
        );
        wait_for(&format!("{n} uncordoned"), TIMEOUT, || async {
            if cordoned(&node(&env, n).await) {
                Probe::NotYet("cordoned".into())
            } else {
                Probe::Done(())
            }
        })
        .await;
    }
    wait_condition_in(&env, "k3os-system", "k3os-latest", "Complete", "True").await;
    delete_plan_and_wait(&env, "k3os-system", "k3os-latest").await;
    operator.stop().await;
    env.cleanup().await;
}

async fn wait_condition_in(env: &TestEnv, ns: &str, plan: &str, type_: &str, status: &str) {
    wait_for(&format!("{plan} {type_}={status}"), TIMEOUT, || async {
        match plans(env, ns).get(plan).await {
            Ok(p) => {
                let ok = p
                    .status
                    .iter()
                    .flat_map(|s| s.conditions.iter())
                    .any(|c| c.type_ == type_ && c.status == status);
                if ok {
                    Probe::Done(())
                } else {
                    Probe::NotYet(format!("{:?}", p.status))
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

#[tokio::test]
async fn bad_plans_are_refused_with_a_clear_message() {
    let env = TestEnv::new("plan-bad").await;
    support::install_crds(&env.client).await;
    let table = [
        (
            json!({"version": "v1", "upgrade": upgrade("x"), "drain": {"deleteEmptydirData": true, "deleteLocalData": true}}),
            "spec.drain cannot specify both deleteEmptydirData and deleteLocalData",
        ),
        (
            json!({"version": "v1", "upgrade": upgrade("x"), "postCompleteDelay": "-5s"}),
            "spec.postCompleteDelay is negative",
        ),
        (
            json!({"upgrade": upgrade("x")}),
            "cannot resolve plan: missing channel and version",
        ),
        (
            json!({"version": "", "channel": "", "upgrade": upgrade("x")}),
            "cannot resolve plan: missing channel and version",
        ),
        (
            json!({"version": "v1", "upgrade": upgrade("x"), "window": {"days": ["someday"]}}),
            "spec.window.days",
        ),
        (
            json!({"version": "v1", "upgrade": upgrade("x"), "window": {"days": ["mon"], "startTime": "25:00"}}),
            "spec.window.startTime",
        ),
        (json!({"version": "v1"}), "upgrade"),
        (
            json!({"version": "v1", "upgrade": upgrade("x"), "concurrency": -1}),
            "spec.concurrency must not be negative",
        ),
    ];
    for (i, (spec, want)) in table.into_iter().enumerate() {
        let err = create_plan(&env, &format!("bad-{i}"), json!({}), spec.clone())
            .await
            .expect_err(&format!("{spec} must be refused"));
        assert!(
            err.to_string().contains(want),
            "{spec}: {err} should say {want:?}"
        );
    }
    // A bad day is refused by its own message alone, reading as upstream's does.
    let err = create_plan(
        &env,
        "bad-day",
        json!({}),
        json!({"version": "v1", "upgrade": upgrade("x"), "window": {"days": ["someday"]}}),
    )
    .await
    .expect_err("a bad day is refused")
    .to_string();
    assert!(err.contains("invalid: spec.window.days"), "{err}");
    assert!(!err.contains("not checked"), "one cause only: {err}");
    // kured's windows upstream accepts: bare hours, no days, any case.
    for (i, window) in [
        json!({"startTime": "22", "endTime": "6"}),
        json!({"days": ["Sat", "su"], "startTime": "10pm", "endTime": "03:04am", "timeZone": "Europe/Berlin"}),
        json!({"days": ["0", "6"], "startTime": "22:00:00", "endTime": "6"}),
    ]
    .into_iter()
    .enumerate()
    {
        let spec = json!({"version": "v1", "upgrade": upgrade("x"), "window": window});
        create_plan(&env, &format!("window-{i}"), json!({}), spec.clone())
            .await
            .unwrap_or_else(|e| panic!("{spec} applies: {e}"));
    }
    // What CEL cannot see: an unknown time zone, a missing Secret.
    let _operator = env.start_operator(Default::default()).await;
    let spec = json!({"version": "v1", "upgrade": upgrade("x"), "window": {"days": ["mon"], "timeZone": "Mars/Olympus"}});
    create_plan(&env, "zone", json!({}), spec)
        .await
        .expect("creating");
    let m = wait_condition(&env, "zone", "Validated", "False", "Error").await;
    assert!(
        m.contains("spec.window is invalid") && m.contains("Mars/Olympus"),
        "{m}"
    );
    let spec =
        json!({"version": "v1", "upgrade": upgrade("x"), "secrets": [{"name": "missing", "path": "/s"}]});
    create_plan(&env, "secret", json!({}), spec)
        .await
        .expect("creating");
    let m = wait_condition(&env, "secret", "Validated", "False", "Error").await;
    assert!(m.contains("\"missing\" not found"), "{m}");
    for name in ["zone", "secret", "window-0", "window-1", "window-2"] {
        delete_plan_and_wait(&env, &env.namespace, name).await;
    }
    env.cleanup().await;
}

#[tokio::test]
async fn a_failed_job_holds_its_node_and_deleting_the_plan_undoes_only_its_cordons() {
    let env = TestEnv::new("plan-fail").await;
    let nodes = env.create_kwok_nodes(3, &[("upgrade-me", "yes")]).await;
    let nodes_api: Api<Node> = Api::all(env.client.clone());
    // A taint the upgrade pods do not tolerate: they stay Pending until the
    // Job's deadline fails the Job (the real Job controller's DeadlineExceeded).
    let taint = json!({"spec": {"taints": [{"key": "example.com/hold", "effect": "NoSchedule"}]}});
    for n in &nodes {
        nodes_api
            .patch(n, &PatchParams::default(), &Patch::Merge(&taint))
            .await
            .expect("tainting");
    }
    // An admin cordoned the first node before the plan ran.
    let cordon = json!({"spec": {"unschedulable": true}});
    nodes_api
        .patch(&nodes[0], &PatchParams::default(), &Patch::Merge(&cordon))
        .await
        .expect("admin cordon");
    let operator = env.start_operator(Default::default()).await;
    let spec = json!({
        "concurrency": 2, "version": "v2", "cordon": true, "jobActiveDeadlineSecs": 3,
        "nodeSelector": {"matchLabels": {"upgrade-me": "yes"}},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "failing", json!({}), spec)
        .await
        .expect("creating the plan");
    let message = wait_condition(&env, "failing", "Complete", "False", "JobFailed").await;
    // Upstream's words: "Job <ns>/<name> failed on Node <node>: <reason>: <message>".
    assert!(
        message.contains(&format!("Job {}/apply-failing-on-", env.namespace))
            && message.contains(" failed on Node ")
            && message.contains(": DeadlineExceeded: "),
        "{message}"
    );
    // Give the plan time to (wrongly) start the third node.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let p = plans(&env, &env.namespace)
        .get("failing")
        .await
        .expect("the plan");
    let status = p.status.expect("a status");
    assert_eq!(status.applying.len(), 2, "{status:?}");
    let failed: BTreeSet<&String> = status.applying.iter().collect();
    let untouched: Vec<&String> = nodes.iter().filter(|n| !failed.contains(n)).collect();
    assert_eq!(untouched.len(), 1);
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
    let lp = ListParams::default().labels(&format!("upgrade.cattle.io/node={}", untouched[0]));
    assert!(
        jobs.list(&lp).await.expect("jobs").items.is_empty(),
        "nothing else starts after a failure"
    );
    for n in &status.applying {
        assert!(cordoned(&node(&env, n).await), "failed node {n} stays cordoned");
    }
    delete_plan_and_wait(&env, &env.namespace, "failing").await;
    for n in &nodes {
        let c = cordoned(&node(&env, n).await);
        assert_eq!(c, n == &nodes[0], "{n}: only the admin's cordon remains");
    }
    operator.stop().await;
    env.cleanup().await;
}

/// A channel server: answers 302 to `<base>/<current version>`.
struct Channel {
    url: String,
    version: Arc<Mutex<String>>,
}

impl Channel {
    async fn start(version: &str) -> Channel {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding");
        let addr = listener.local_addr().expect("an address");
        let current = Arc::new(Mutex::new(version.to_string()));
        let v = current.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let version = v.lock().expect("the version").clone();
                let answer = format!(
                    "HTTP/1.1 302 Found\r\nLocation: https://releases.example/k3s/releases/tag/{version}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        Channel {
            url: format!("http://{addr}/v1-release/channels/stable"),
            version: current,
        }
    }

    fn set(&self, version: &str) {
        *self.version.lock().expect("the version") = version.to_string();
    }
}

#[tokio::test]
async fn a_channel_redirect_sets_the_version_and_a_new_one_reruns_the_plan() {
    let env = TestEnv::new("plan-channel").await;
    let channel = Channel::start("v1.2.3+k3s1").await;
    let nodes = env.create_kwok_nodes(2, &[("channel", "yes")]).await;
    let operator = env.start_operator(Default::default()).await;
    let spec = json!({
        "concurrency": 2, "channel": channel.url,
        "nodeSelector": {"matchLabels": {"channel": "yes"}},
        "upgrade": {"image": "rancher/k3s-upgrade"},
    });
    create_plan(&env, "k3s", json!({}), spec)
        .await
        .expect("creating the plan");
    let first = wait_upgraded(&env, &env.namespace, "k3s", &nodes, TIMEOUT).await;
    let p = plans(&env, &env.namespace).get("k3s").await.expect("the plan");
    assert_eq!(
        p.status.as_ref().and_then(|s| s.latest_version.as_deref()),
        Some("v1.2.3-k3s1")
    );
    let reason = p
        .status
        .iter()
        .flat_map(|s| s.conditions.iter())
        .find(|c| c.type_ == "LatestResolved")
        .map(|c| c.reason.clone());
    assert_eq!(reason.as_deref(), Some("Channel"));
    channel.set("v1.2.4+k3s1");
    wait_for("the channel's new version", TIMEOUT, || async {
        let p = plans(&env, &env.namespace).get("k3s").await.expect("the plan");
        match p.status.and_then(|s| s.latest_version) {
            Some(v) if v == "v1.2.4-k3s1" => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    let second = wait_upgraded(&env, &env.namespace, "k3s", &nodes, TIMEOUT).await;
    assert_ne!(first, second, "a new version is a new hash");
    let jobs: Api<Job> = Api::namespaced(env.client.clone(), &env.namespace);
    let lp = ListParams::default().labels("upgrade.cattle.io/plan=k3s,upgrade.cattle.io/version=v1.2.4-k3s1");
    assert_eq!(
        jobs.list(&lp).await.expect("jobs").items.len(),
        2,
        "every node ran the new version"
    );
    delete_plan_and_wait(&env, &env.namespace, "k3s").await;
    operator.stop().await;
    env.cleanup().await;
}

async fn put_secret(env: &TestEnv, name: &str, value: &str) {
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"token": value},
    }))
    .expect("a secret");
    let api: Api<Secret> = Api::namespaced(env.client.clone(), &env.namespace);
    let params = PatchParams::apply("plans-test").force();
    api.patch(name, &params, &Patch::Apply(&s))
        .await
        .expect("writing a secret");
}

#[tokio::test]
async fn a_changed_secret_reruns_the_plan_unless_its_updates_are_ignored() {
    let env = TestEnv::new("plan-secret").await;
    put_secret(&env, "watched", "a").await;
    put_secret(&env, "ignored", "a").await;
    let watched_nodes = env.create_kwok_nodes(1, &[("secret", "watched")]).await;
    let ignored_nodes = env.create_kwok_nodes(1, &[("secret", "ignored")]).await;
    let operator = env.start_operator(Default::default()).await;
    for (plan, secret, ignore) in [("watched", "watched", false), ("ignored", "ignored", true)] {
        let spec = json!({
            "version": "v1", "concurrency": 1,
            "nodeSelector": {"matchLabels": {"secret": plan}},
            "secrets": [{"name": secret, "path": "/run/secret", "ignoreUpdates": ignore}],
            "upgrade": upgrade("example.invalid/upgrade"),
        });
        create_plan(&env, plan, json!({}), spec)
            .await
            .expect("creating a plan");
    }
    let watched = wait_upgraded(&env, &env.namespace, "watched", &watched_nodes, TIMEOUT).await;
    let ignored = wait_upgraded(&env, &env.namespace, "ignored", &ignored_nodes, TIMEOUT).await;
    put_secret(&env, "watched", "b").await;
    put_secret(&env, "ignored", "b").await;
    let rerun = wait_for("the watched plan's new hash", TIMEOUT, || async {
        let p = plans(&env, &env.namespace)
            .get("watched")
            .await
            .expect("the plan");
        match p.status.and_then(|s| s.latest_hash) {
            Some(h) if h != watched => Probe::Done(h),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    wait_upgraded(&env, &env.namespace, "watched", &watched_nodes, TIMEOUT).await;
    let p = plans(&env, &env.namespace)
        .get("ignored")
        .await
        .expect("the plan");
    assert_eq!(
        p.status.and_then(|s| s.latest_hash),
        Some(ignored.clone()),
        "ignoreUpdates: same hash"
    );
    assert_ne!(rerun, watched);
    for plan in ["watched", "ignored"] {
        delete_plan_and_wait(&env, &env.namespace, plan).await;
    }
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_drain_a_pdb_blocks_fails_at_its_timeout_naming_the_pdb_and_goes_on_once_it_frees() {
    let env = TestEnv::new("plan-pdb").await;
    let nodes = env.create_kwok_nodes(2, &[("pdb-plan", "yes")]).await;
    env.create_deployment("guarded", 2, json!({"kubernetes.io/hostname": nodes[0]}))
        .await;
    wait_for("2 guarded pods Ready", TIMEOUT, || async {
        let d = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(env.client.clone(), &env.namespace)
            .get("guarded")
            .await;
        match d.map(|d| d.status.and_then(|s| s.ready_replicas).unwrap_or(0)) {
            Ok(2) => Probe::Done(()),
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await;
    create_pdb(&env, "never", "guarded", 0).await;
    let operator = env.start_operator(Default::default()).await;
    let spec = json!({
        "concurrency": 2, "version": "v2",
        "nodeSelector": {"matchLabels": {"pdb-plan": "yes"}},
        "drain": {"timeout": "5s", "force": true},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "blocked", json!({}), spec)
        .await
        .expect("creating the plan");
    let message = wait_condition(&env, "blocked", "Complete", "False", "DrainFailed").await;
    assert!(
        message.contains(&nodes[0]) && message.contains("never"),
        "names the node and the PDB: {message}"
    );
    assert!(
        cordoned(&node(&env, &nodes[0]).await),
        "the blocked node stays cordoned"
    );
    // The drain went on: once the budget allows, the node is drained and
    // upgraded (upstream's Job retries its drain the same way).
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(env.client.clone(), &env.namespace)
        .delete("never", &Default::default())
        .await
        .expect("deleting the budget");
    wait_upgraded(&env, &env.namespace, "blocked", &nodes[..1], TIMEOUT).await;
    delete_plan_and_wait(&env, &env.namespace, "blocked").await;
    assert!(
        !cordoned(&node(&env, &nodes[0]).await),
        "deleting the plan releases it"
    );
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn concurrency_and_the_health_gate_hold_across_eight_nodes() {
    let env = TestEnv::new("plan-eight").await;
    let nodes = env.create_kwok_nodes(8, &[("fleet", "eight")]).await;
    env.create_deployment("web", 6, json!({"fleet": "eight"})).await;
    create_pdb(&env, "web", "web", 1).await;
    let operator = env.start_operator(Default::default()).await;
    let spec = json!({
        "concurrency": 2, "version": "v2",
        "nodeSelector": {"matchLabels": {"fleet": "eight"}},
        "drain": {"timeout": "60s"},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "fleet", json!({}), spec)
        .await
        .expect("creating the plan");
    let breaches = Arc::new(Breaches::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let checker = tokio::spawn(check_plan(
        env.client.clone(),
        env.namespace.clone(),
        "fleet",
        nodes.clone(),
        breaches.clone(),
        stop.clone(),
    ));
    let rebooter = tokio::spawn(reboot_after_job(
        env.client.clone(),
        env.namespace.clone(),
        "fleet",
        stop.clone(),
    ));
    wait_upgraded(&env, &env.namespace, "fleet", &nodes, Duration::from_secs(240)).await;
    // The last node carries the hash as soon as its Job succeeds; the plan is
    // Complete only after its reboot and settle.
    wait_condition(&env, "fleet", "Complete", "True", "Complete").await;
    stop.cancel();
    let samples = checker.await.expect("the checker");
    let rebooted = rebooter.await.expect("the rebooter");
    assert_eq!(
        rebooted.len(),
        nodes.len(),
        "every node rebooted by its Job: {rebooted:?}"
    );
    let seen = breaches.0.lock().expect("breaches").clone();
    assert!(seen.is_empty(), "breaches: {seen:#?}");
    assert!(samples > 20, "the checker looked {samples} times");
    delete_plan_and_wait(&env, &env.namespace, "fleet").await;
    operator.stop().await;
    env.cleanup().await;
}

/// A window of every day from `from` to `to` hours off the current UTC hour.
fn window(from: i64, to: i64) -> serde_json::Value {
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    let at = |offset: i64| {
        let hour = (i64::from(now.hour()) + offset).rem_euclid(24);
        format!("{hour:02}:{:02}", now.minute())
    };
    json!({
        "days": ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"],
        "startTime": at(from), "endTime": at(to), "timeZone": "UTC",
    })
}

async fn patch_plan(env: &TestEnv, name: &str, spec: serde_json::Value) {
    plans(env, &env.namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .expect("patching the plan");
}

async fn set_taint(env: &TestEnv, node: &str, taints: serde_json::Value) {
    Api::<Node>::all(env.client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"taints": taints}})),
        )
        .await
        .expect("setting taints");
}

/// Upgrade pods do not tolerate it: they stay Pending, so the Job runs.
fn hold() -> serde_json::Value {
    json!([{"key": "example.com/hold", "effect": "NoSchedule"}])
}

async fn jobs_on(env: &TestEnv, node: &str) -> Vec<Job> {
    Api::<Job>::namespaced(env.client.clone(), &env.namespace)
        .list(&ListParams::default().labels(&format!("upgrade.cattle.io/node={node}")))
        .await
        .expect("listing jobs")
        .items
}

async fn wait_applying(env: &TestEnv, plan: &str, want: &[&str]) {
    wait_for(&format!("{plan} applying {want:?}"), TIMEOUT, || async {
        match plans(env, &env.namespace).get(plan).await {
            Ok(p) => {
                let applying = p.status.map(|s| s.applying).unwrap_or_default();
                match applying == want {
                    true => Probe::Done(()),
                    false => Probe::NotYet(format!("{applying:?}")),
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await
}

#[tokio::test]
async fn a_window_starts_nodes_only_inside_it_and_never_interrupts_a_running_job() {
    let env = TestEnv::new("plan-window").await;
    let nodes = env.create_kwok_nodes(2, &[("windowed", "yes")]).await;
    let operator = env.start_operator(Default::default()).await;
    let spec = json!({
        "version": "v2", "concurrency": 1,
        "nodeSelector": {"matchLabels": {"windowed": "yes"}},
        "window": window(3, 4),
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "windowed", json!({}), spec)
        .await
        .expect("creating the plan");
    let message = wait_condition(&env, "windowed", "Complete", "False", "Waiting").await;
    assert!(message.contains("outside the plan's window"), "{message}");
    tokio::time::sleep(Duration::from_secs(4)).await;
    for n in &nodes {
        assert!(
            jobs_on(&env, n).await.is_empty(),
            "{n}: nothing starts outside the window"
        );
    }

    // Open: the first node starts, its Job held Pending by a taint; then the
    // window closes while that Job runs.
    for n in &nodes {
        set_taint(&env, n, hold()).await;
    }
    patch_plan(&env, "windowed", json!({"window": window(-2, 2)})).await;
    let first = wait_for("a node applying", TIMEOUT, || async {
        match plans(&env, &env.namespace).get("windowed").await {
            Ok(p) => match p.status.map(|s| s.applying).unwrap_or_default().as_slice() {
                [one] => Probe::Done(one.clone()),
                other => Probe::NotYet(format!("{other:?}")),
            },
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let second = nodes
        .iter()
        .find(|n| **n != first)
        .expect("the other node")
        .clone();
    wait_for("the first node's Job", TIMEOUT, || async {
        match jobs_on(&env, &first).await.len() {
            1 => Probe::Done(()),
            n => Probe::NotYet(format!("{n} jobs")),
        }
    })
    .await;
    patch_plan(&env, "windowed", json!({"window": window(3, 4)})).await;
    for n in &nodes {
        set_taint(&env, n, json!(null)).await;
    }
    // The running Job finishes and its node is upgraded; the next waits.
    wait_upgraded(
        &env,
        &env.namespace,
        "windowed",
        std::slice::from_ref(&first),
        TIMEOUT,
    )
    .await;
    wait_applying(&env, "windowed", &[]).await;
    let message = wait_condition(&env, "windowed", "Complete", "False", "Waiting").await;
    assert!(
        message.contains("1/2 upgraded") && message.contains("window"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        jobs_on(&env, &second).await.is_empty(),
        "the window is closed: {second} waits"
    );

    patch_plan(&env, "windowed", json!({"window": window(-2, 2)})).await;
    wait_upgraded(&env, &env.namespace, "windowed", &nodes, TIMEOUT).await;
    delete_plan_and_wait(&env, &env.namespace, "windowed").await;
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn exclusive_plans_never_apply_at_the_same_time() {
    let env = TestEnv::new("plan-exclusive").await;
    let a = env.create_kwok_nodes(2, &[("exclusive", "a")]).await;
    let b = env.create_kwok_nodes(2, &[("exclusive", "b")]).await;
    let operator = env.start_operator(Default::default()).await;
    for name in ["a", "b"] {
        let spec = json!({
            "concurrency": 2, "version": "v2", "exclusive": true, "cordon": true,
            "nodeSelector": {"matchLabels": {"exclusive": name}},
            "upgrade": upgrade("example.invalid/upgrade"),
        });
        create_plan(&env, name, json!({}), spec)
            .await
            .expect("creating a plan");
    }
    let api = plans(&env, &env.namespace);
    let mut overlaps = Vec::new();
    let mut waited = BTreeSet::new();
    let started = std::time::Instant::now();
    loop {
        // One list: a consistent snapshot of both plans.
        let Ok(list) = api.list(&ListParams::default()).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let status = |name: &str| {
            list.items
                .iter()
                .find(|p| p.name_any() == name)
                .and_then(|p| p.status.clone())
                .unwrap_or_default()
        };
        let (sa, sb) = (status("a"), status("b"));
        if !sa.applying.is_empty() && !sb.applying.is_empty() {
            overlaps.push(format!("a {:?} and b {:?}", sa.applying, sb.applying));
        }
        for (name, s) in [("a", &sa), ("b", &sb)] {
            let waiting = s
                .conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.message.contains("exclusive plan"));
            if waiting {
                waited.insert(name);
            }
        }
        let done = |s: &nodewarden::api::plan::PlanStatus| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        };
        if done(&sa) && done(&sb) {
            break;
        }
        assert!(
            started.elapsed() < TIMEOUT,
            "both plans never completed: {sa:?} {sb:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(overlaps.is_empty(), "exclusive plans overlapped: {overlaps:#?}");
    assert_eq!(waited.len(), 1, "one plan waited, saying why: {waited:?}");
    wait_upgraded(&env, &env.namespace, "a", &a, TIMEOUT).await;
    wait_upgraded(&env, &env.namespace, "b", &b, TIMEOUT).await;
    for name in ["a", "b"] {
        delete_plan_and_wait(&env, &env.namespace, name).await;
    }
    operator.stop().await;
    env.cleanup().await;
}

#[tokio::test]
async fn a_node_leaving_the_selector_mid_way_is_released_and_its_job_deleted() {
    let env = TestEnv::new("plan-leave").await;
    let nodes = env.create_kwok_nodes(1, &[("leaving", "yes")]).await;
    let n = &nodes[0];
    set_taint(&env, n, hold()).await;
    let operator = env.start_operator(Default::default()).await;
    let spec = json!({
        "version": "v2", "cordon": true, "concurrency": 1,
        "nodeSelector": {"matchLabels": {"leaving": "yes"}},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "leaving", json!({}), spec)
        .await
        .expect("creating the plan");
    wait_for("its Job", TIMEOUT, || async {
        match jobs_on(&env, n).await.len() {
            1 => Probe::Done(()),
            k => Probe::NotYet(format!("{k} jobs")),
        }
    })
    .await;
    assert!(cordoned(&node(&env, n).await), "the plan cordoned it");
    Api::<Node>::all(env.client.clone())
        .patch(
            n,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"leaving": null}}})),
        )
        .await
        .expect("unlabelling the node");
    wait_applying(&env, "leaving", &[]).await;
    assert!(!cordoned(&node(&env, n).await), "the plan's cordon is undone");
    wait_for("its Job deleted", TIMEOUT, || async {
        let left: Vec<Job> = jobs_on(&env, n)
            .await
            .into_iter()
            .filter(|j| j.metadata.deletion_timestamp.is_none())
            .collect();
        match left.len() {
            0 => Probe::Done(()),
            k => Probe::NotYet(format!("{k} jobs")),
        }
    })
    .await;
    assert_ne!(
        node(&env, n)
            .await
            .labels()
            .get(&nodewarden::api::plan::node_label("leaving"))
            .map(String::as_str),
        plans(&env, &env.namespace)
            .get("leaving")
            .await
            .expect("the plan")
            .status
            .and_then(|s| s.latest_hash)
            .as_deref(),
        "never labelled upgraded"
    );
    delete_plan_and_wait(&env, &env.namespace, "leaving").await;
    operator.stop().await;
    env.cleanup().await;
}

/// The plan's progress, as `upgraded/selected`.
async fn progress(env: &TestEnv, plan: &str) -> Option<String> {
    plans(env, &env.namespace).get(plan).await.ok()?.status?.progress
}

async fn wait_progress(env: &TestEnv, plan: &str, want: &str) {
    wait_for(&format!("progress {want}"), TIMEOUT, || async {
        match progress(env, plan).await {
            Some(p) if p == want => Probe::Done(()),
            p => Probe::NotYet(format!("progress {p:?}")),
        }
    })
    .await;
}

// A pass keeps a tally of the selected nodes and updates it from the nodes
// that changed: every kind of change must reach it.
#[tokio::test]
async fn progress_follows_nodes_joining_leaving_upgraded_and_deleted() {
    let env = TestEnv::new("plan-tally").await;
    let pool = format!("tally-{}", env.id);
    let nodes = env.create_kwok_nodes(3, &[("pool", pool.as_str())]).await;
    let operator = env.start_operator(Default::default()).await;
    // Paused: only the tally moves the progress.
    let spec = json!({
        "version": "v2", "concurrency": 0,
        "nodeSelector": {"matchLabels": {"pool": pool}},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "tally", json!({}), spec)
        .await
        .expect("creating the plan");
    wait_progress(&env, "tally", "0/3").await;
    let hash = plans(&env, &env.namespace)
        .get("tally")
        .await
        .expect("the plan")
        .status
        .and_then(|s| s.latest_hash)
        .expect("a resolved hash");
    let label = |node: &str, key: &str, value: serde_json::Value| {
        let env = &env;
        let (node, key) = (node.to_string(), key.to_string());
        async move {
            Api::<Node>::all(env.client.clone())
                .patch(
                    &node,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"metadata": {"labels": {key: value}}})),
                )
                .await
                .expect("labelling a node");
        }
    };
    let hash_label = nodewarden::api::plan::node_label("tally");
    // Someone else labels a node upgraded to the plan's target.
    label(&nodes[0], &hash_label, json!(hash)).await;
    wait_progress(&env, "tally", "1/3").await;
    // A node leaves the selector.
    label(&nodes[1], "pool", json!(null)).await;
    wait_progress(&env, "tally", "1/2").await;
    // A new node joins it.
    let joined = env.create_kwok_nodes(1, &[("pool", pool.as_str())]).await;
    wait_progress(&env, "tally", "1/3").await;
    // The upgraded node is deleted.
    Api::<Node>::all(env.client.clone())
        .delete(&nodes[0], &DeleteParams::default())
        .await
        .expect("deleting a node");
    wait_progress(&env, "tally", "0/2").await;
    // The node that left comes back, already on an older hash.
    label(&nodes[1], &hash_label, json!("older")).await;
    label(&nodes[1], "pool", json!(pool)).await;
    wait_progress(&env, "tally", "0/3").await;
    // A new selector (a new generation) counts every node anew.
    patch_plan(
        &env,
        "tally",
        json!({"nodeSelector": {"matchLabels": {"pool": pool, "kubernetes.io/hostname": joined[0]}}}),
    )
    .await;
    wait_progress(&env, "tally", "0/1").await;
    delete_plan_and_wait(&env, &env.namespace, "tally").await;
    operator.stop().await;
    env.cleanup().await;
}

/// Seed 003's Plan, hashed by the System Upgrade Controller v0.20.1 (see
/// `upstream_hashes` in src/upgrade/hash.rs for how the value was had).
const SUC_SEED_HASH: &str = "867d9ef93211def3a0eb54ef368e8d3d130444f08a835c02a06a9358";

/// A cluster the System Upgrade Controller upgraded: two nodes carry its
/// hash label for seed 003's Plan, and on a third its Job still runs (with
/// `status.applying` naming it by its hostname label, as SUC leaves them;
/// the label differs from the node's name, as on clouds that name nodes by
/// their FQDN). nodewarden takes over without touching the upgraded nodes
/// and without a second Job, and keeps `status.applying` in upstream's terms.
#[tokio::test]
async fn takeover_from_the_system_upgrade_controller_reruns_nothing() {
    let env = TestEnv::new("plan-takeover").await;
    support::install_crds(&env.client).await;
    let label = "plan.upgrade.cattle.io/k3os-latest";
    let done = env
        .create_kwok_nodes(2, &[(label, SUC_SEED_HASH), ("k3os.io/mode", "local")])
        .await;
    let running = env
        .create_kwok_nodes(1, &[(label, ""), ("k3os.io/mode", "local")])
        .await;
    let busy = running[0].clone();
    let busy_host = format!("{busy}-host");
    // Its Job's pod stays Pending until the test lifts this taint; its
    // drain container had cordoned the node.
    set_taint(&env, &busy, hold()).await;
    Api::<Node>::all(env.client.clone())
        .patch(
            &busy,
            &PatchParams::default(),
            &Patch::Merge(&json!({
                "metadata": {"labels": {"kubernetes.io/hostname": busy_host}},
                "spec": {"unschedulable": true},
            })),
        )
        .await
        .expect("cordoning as SUC's drain did");
    let seed = json!({
        "concurrency": 1,
        "channel": "https://github.com/rancher/k3os/releases/latest",
        "version": "v0.9.0-dev",
        "nodeSelector": {"matchExpressions": [
            {"key": label, "operator": "Exists"},
            {"key": "k3os.io/mode", "operator": "NotIn", "values": ["live"]},
        ]},
        "drain": {"force": true},
        "upgrade": {"image": "rancher/k3os", "command": ["k3os", "--debug"], "args": ["upgrade"]},
    });
    create_plan(&env, "k3os-latest", json!({}), seed)
        .await
        .expect("creating the plan");
    // What SUC's status handler and generating handler wrote.
    plans(&env, &env.namespace)
        .patch_status(
            "k3os-latest",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {
                "latestVersion": "v0.9.0-dev", "latestHash": SUC_SEED_HASH, "applying": [busy_host],
            }})),
        )
        .await
        .expect("writing SUC's status");
    // SUC's Job, as it names and labels it.
    let job_name =
        nodewarden::upgrade::safe_concat_name(&["apply", "k3os-latest", "on", &busy, "with", SUC_SEED_HASH]);
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": job_name, "labels": {
            "upgrade.cattle.io/controller": "system-upgrade-controller",
            "upgrade.cattle.io/plan": "k3os-latest",
            "upgrade.cattle.io/node": busy,
            "upgrade.cattle.io/version": "v0.9.0-dev",
            label: SUC_SEED_HASH,
            // The test operator's scope (a real one sees every Job).
            RUN_LABEL: env.id,
        }},
        "spec": {"backoffLimit": 2, "template": {
            "metadata": {"labels": {"upgrade.cattle.io/plan": "k3os-latest", "upgrade.cattle.io/node": busy}},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"kubernetes.io/hostname": busy_host},
                "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "upgrade", "image": "rancher/k3os:v0.9.0-dev"}],
            },
        }},
    }))
    .expect("a job");
    Api::<Job>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &job)
        .await
        .expect("creating SUC's job");

    let operator = env.start_operator(Default::default()).await;
    // nodewarden's own hash is upstream's.
    wait_for("nodewarden's status on the plan", TIMEOUT, || async {
        match plans(&env, &env.namespace).get("k3os-latest").await {
            Ok(p) => {
                let s = p.status.unwrap_or_default();
                let mine = s.observed_generation.is_some() && s.latest_hash.as_deref() == Some(SUC_SEED_HASH);
                match mine && s.progress.as_deref() == Some("2/3") {
                    true => Probe::Done(()),
                    false => Probe::NotYet(format!("{s:?}")),
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let status = plans(&env, &env.namespace)
        .get("k3os-latest")
        .await
        .expect("the plan")
        .status
        .unwrap_or_default();
    assert_eq!(
        status.applying,
        vec![busy_host.clone()],
        "upstream's terms: hostname label values"
    );
    let untouched =
        |n: &Node| !cordoned(n) && n.labels().get(label).map(String::as_str) == Some(SUC_SEED_HASH);
    for n in &done {
        assert!(untouched(&node(&env, n).await), "{n} is left alone");
        assert!(jobs_on(&env, n).await.is_empty(), "no Job on {n}");
    }
    assert_eq!(jobs_on(&env, &busy).await.len(), 1, "SUC's Job is not duplicated");
    let maintenances = env
        .client
        .request::<Value>(
            http::Request::get("/apis/nodemaintenance.medik8s.io/v1beta1/nodemaintenances")
                .body(Vec::new())
                .expect("a request"),
        )
        .await
        .expect("listing NodeMaintenances");
    let mine: Vec<&Value> = maintenances["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| {
            m["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.contains(&env.namespace))
        })
        .collect();
    assert!(mine.is_empty(), "nothing is drained: {mine:?}");

    // SUC's Job finishes: nodewarden labels its node and the plan completes.
    set_taint(&env, &busy, json!(null)).await;
    let all: Vec<String> = done.iter().chain(running.iter()).cloned().collect();
    let hash = wait_upgraded(&env, &env.namespace, "k3os-latest", &all, TIMEOUT).await;
    assert_eq!(hash, SUC_SEED_HASH);
    wait_condition_in(&env, &env.namespace, "k3os-latest", "Complete", "True").await;
    assert_eq!(jobs_on(&env, &busy).await.len(), 1, "still the one Job");
    // Upstream uncordons once its Job completed; so does nodewarden for it.
    wait_for("the taken-over node uncordoned", TIMEOUT, || async {
        match cordoned(&node(&env, &busy).await) {
            false => Probe::Done(()),
            true => Probe::NotYet("cordoned".into()),
        }
    })
    .await;
    for n in &done {
        assert!(untouched(&node(&env, n).await), "{n} is left alone");
        assert!(jobs_on(&env, n).await.is_empty(), "no Job on {n}");
    }
    delete_plan_and_wait(&env, &env.namespace, "k3os-latest").await;
    operator.stop().await;
    env.cleanup().await;
}

/// Upstream's `concurrency` defaults to 0, which selects no node: a Plan
/// without it starts nothing, and nodewarden's condition says why.
#[tokio::test]
async fn a_plan_without_concurrency_starts_nothing_and_says_why() {
    let env = TestEnv::new("plan-noconc").await;
    let nodes = env.create_kwok_nodes(2, &[("noconc", "yes")]).await;
    let operator = env.start_operator(Default::default()).await;
    let spec = json!({
        "version": "v2", "cordon": true,
        "nodeSelector": {"matchLabels": {"noconc": "yes"}},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "idle", json!({}), spec)
        .await
        .expect("creating the plan");
    let message = wait_condition(&env, "idle", "Complete", "False", "Waiting").await;
    assert!(message.contains("concurrency"), "{message}");
    let p = plans(&env, &env.namespace).get("idle").await.expect("the plan");
    assert!(p.status.expect("a status").applying.is_empty());
    for n in &nodes {
        assert!(!cordoned(&node(&env, n).await), "{n} untouched");
        assert!(jobs_on(&env, n).await.is_empty(), "no Job on {n}");
    }
    // Setting it starts the plan.
    patch_plan(&env, "idle", json!({"concurrency": 2})).await;
    wait_upgraded(&env, &env.namespace, "idle", &nodes, TIMEOUT).await;
    delete_plan_and_wait(&env, &env.namespace, "idle").await;
    operator.stop().await;
    env.cleanup().await;
}

/// A pod of the test bound to `node` (kwok runs it): bare, unless `owned`
/// names a ReplicaSet-like controller; `empty_dir` gives it scratch space.
async fn pod_on(env: &TestEnv, name: &str, node: &str, app: &str, empty_dir: bool) {
    let mut spec = json!({
        "nodeName": node,
        "containers": [{"name": "c", "image": "example.invalid/app"}],
        "tolerations": [{"operator": "Exists"}],
    });
    if empty_dir {
        spec["volumes"] = json!([{"name": "scratch", "emptyDir": {}}]);
    }
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": spec,
    }))
    .expect("a pod");
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.namespace)
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating a pod");
}

async fn pod_exists(env: &TestEnv, name: &str) -> bool {
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), &env.namespace)
        .get_opt(name)
        .await
        .expect("reading a pod")
        .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
}

/// The Plan's drain options mean what they mean to `kubectl drain`, as
/// upstream runs it: one node and Plan per option.
#[tokio::test]
async fn drain_options_are_honoured_as_kubectl_drain_honours_them() {
    let env = TestEnv::new("plan-drainopts").await;
    let cases = ["strict", "forced", "selector", "noevict", "keepdirs"];
    let mut nodes = std::collections::BTreeMap::new();
    for case in cases {
        let n = env.create_kwok_nodes(1, &[("drainopts", case)]).await;
        nodes.insert(case, n[0].clone());
    }
    pod_on(&env, "bare-strict", &nodes["strict"], "strict", false).await;
    pod_on(&env, "bare-forced", &nodes["forced"], "forced", false).await;
    pod_on(&env, "web", &nodes["selector"], "web", false).await;
    pod_on(&env, "other", &nodes["selector"], "other", false).await;
    pod_on(&env, "guarded", &nodes["noevict"], "guarded", false).await;
    pod_on(&env, "scratch", &nodes["keepdirs"], "scratch", true).await;
    create_pdb(&env, "never", "guarded", 0).await;
    let operator = env.start_operator(Default::default()).await;
    let drains = [
        ("strict", json!({})),
        ("forced", json!({"force": true})),
        (
            "selector",
            json!({"force": true, "podSelector": {"matchLabels": {"app": "web"}}}),
        ),
        (
            "noevict",
            json!({"force": true, "disableEviction": true, "gracePeriod": 0}),
        ),
        ("keepdirs", json!({"force": true, "deleteEmptydirData": false})),
    ];
    for (case, drain) in drains {
        let spec = json!({
            "concurrency": 1, "version": "v2", "drain": drain,
            "nodeSelector": {"matchLabels": {"drainopts": case}},
            "upgrade": upgrade("example.invalid/upgrade"),
        });
        create_plan(&env, case, json!({}), spec)
            .await
            .expect("creating a plan");
    }
    let blocked = |plan: &'static str, pod: &'static str, why: &'static str| {
        let env = &env;
        async move {
            wait_for(&format!("{plan} blocked by {pod}"), TIMEOUT, || async {
                let p = match plans(env, &env.namespace).get(plan).await {
                    Ok(p) => p,
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                let message = p
                    .status
                    .iter()
                    .flat_map(|s| s.conditions.iter())
                    .find(|c| c.type_ == "Complete")
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                match message.contains(why) && message.contains(pod) {
                    true => Probe::Done(()),
                    false => Probe::NotYet(message),
                }
            })
            .await
        }
    };
    // force false: the bare pod blocks, is named, and nothing is evicted.
    blocked(
        "strict",
        "bare-strict",
        "cannot delete Pods that declare no controller",
    )
    .await;
    // kubectl drain's way: the node cordoned, and nothing of NodeMaintenance's
    // own (its drain taint, the remediation label, the medik8s Lease).
    let strict = node(&env, &nodes["strict"]).await;
    assert!(cordoned(&strict), "the strict plan's node is cordoned");
    let taints: Vec<String> = strict
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert!(!taints.iter().any(|t| t.starts_with("medik8s.io/")), "{taints:?}");
    assert!(
        !strict
            .labels()
            .contains_key("remediation.medik8s.io/exclude-from-remediation"),
        "{:?}",
        strict.labels()
    );
    let lease_namespace =
        nodewarden::controllers::node_maintenance::MaintenanceConfig::default().lease_namespace;
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(env.client.clone(), &lease_namespace)
            .get_opt(&format!("node-{}", nodes["strict"]))
            .await
            .expect("reading the node's Lease");
    assert!(lease.is_none(), "no medik8s Lease for a Plan's drain: {lease:?}");
    // deleteEmptydirData false: the emptyDir pod blocks, named.
    blocked("keepdirs", "scratch", "cannot delete Pods with local storage").await;
    // force true: evicted, and the node upgraded.
    // podSelector: only the selected pod goes.
    // disableEviction: deleted although a budget forbids any eviction.
    for case in ["forced", "selector", "noevict"] {
        wait_upgraded(&env, &env.namespace, case, &[nodes[case].clone()], TIMEOUT).await;
    }
    assert!(!pod_exists(&env, "bare-forced").await, "force: the bare pod went");
    assert!(
        !pod_exists(&env, "web").await,
        "podSelector: the selected pod went"
    );
    assert!(
        pod_exists(&env, "other").await,
        "podSelector: the other pod stays"
    );
    assert!(
        !pod_exists(&env, "guarded").await,
        "disableEviction: deleted past the budget"
    );
    // The blocked drains removed nothing and started no Job.
    for (case, pod) in [("strict", "bare-strict"), ("keepdirs", "scratch")] {
        assert!(pod_exists(&env, pod).await, "{pod} is not evicted");
        assert!(
            jobs_on(&env, &nodes[case]).await.is_empty(),
            "no Job on the {case} node"
        );
    }
    for case in cases {
        delete_plan_and_wait(&env, &env.namespace, case).await;
    }
    operator.stop().await;
    env.cleanup().await;
}

/// The k3s/rke2 pair: servers first, and agents whose `prepare` waits for
/// the servers. An agent's prepare runs before it is cordoned or drained
/// (upstream's order), so agents stay in service while they wait; a prepare
/// that runs past its Job's deadline is reported and run again.
#[tokio::test]
async fn a_server_and_agent_pair_drains_no_agent_before_its_prepare_finished() {
    let env = TestEnv::new("plan-pair").await;
    let servers = env.create_kwok_nodes(1, &[("k3s-role", "server")]).await;
    let agents = env.create_kwok_nodes(2, &[("k3s-role", "agent")]).await;
    // The agents' prepare "waits for the servers": its pods stay Pending
    // until the test lifts this taint.
    for a in &agents {
        set_taint(&env, a, hold()).await;
    }
    let operator = env.start_operator(Default::default()).await;
    let server = json!({
        "concurrency": 1, "version": "v2", "cordon": true,
        "nodeSelector": {"matchLabels": {"k3s-role": "server"}},
        "upgrade": upgrade("example.invalid/k3s-upgrade"),
    });
    let agent = json!({
        "concurrency": 1, "version": "v2", "drain": {"force": true},
        "jobActiveDeadlineSecs": 3,
        "nodeSelector": {"matchLabels": {"k3s-role": "agent"}},
        "prepare": {"image": "example.invalid/k3s-upgrade", "args": ["prepare", "k3s-server"]},
        "upgrade": upgrade("example.invalid/k3s-upgrade"),
    });
    create_plan(&env, "k3s-server", json!({}), server)
        .await
        .expect("creating the server plan");
    create_plan(&env, "k3s-agent", json!({}), agent)
        .await
        .expect("creating the agent plan");
    wait_upgraded(&env, &env.namespace, "k3s-server", &servers, TIMEOUT).await;
    // A prepare past its deadline fails, is reported, and runs again.
    wait_for("a failed prepare reported", TIMEOUT, || async {
        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(env.client.clone(), &env.namespace)
            .list(&ListParams::default())
            .await;
        match events {
            Ok(list) => {
                let failed = list.items.iter().any(|e| {
                    e.reason.as_deref() == Some("JobFailed")
                        && e.involved_object.name.as_deref() == Some("k3s-agent")
                });
                match failed {
                    true => Probe::Done(()),
                    false => Probe::NotYet(format!("{} events", list.items.len())),
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let p = plans(&env, &env.namespace)
        .get("k3s-agent")
        .await
        .expect("the agent plan");
    let status = p.status.expect("a status");
    assert_eq!(status.applying.len(), 1, "{status:?}");
    assert!(
        status.nodes.iter().all(|r| r.phase == "Preparing"),
        "still preparing: {:?}",
        status.nodes
    );
    for a in &agents {
        assert!(
            !cordoned(&node(&env, a).await),
            "{a} stays in service while its prepare waits"
        );
        assert!(
            jobs_on(&env, a)
                .await
                .iter()
                .all(|j| j.name_any().starts_with("prepare-")),
            "no upgrade Job on {a} yet"
        );
    }
    // The servers are done: the agents' prepare may finish (no deadline now).
    patch_plan(&env, "k3s-agent", json!({"jobActiveDeadlineSecs": 0})).await;
    for a in &agents {
        set_taint(&env, a, json!(null)).await;
    }
    wait_upgraded(&env, &env.namespace, "k3s-agent", &agents, TIMEOUT).await;
    for a in &agents {
        let jobs = jobs_on(&env, a).await;
        let prepared = jobs
            .iter()
            .filter(|j| j.name_any().starts_with("prepare-"))
            .filter_map(|j| j.status.as_ref()?.completion_time.clone())
            .map(|t| t.0)
            .max()
            .expect("a completed prepare Job");
        let applied = jobs
            .iter()
            .find(|j| j.name_any().starts_with("apply-"))
            .and_then(|j| j.metadata.creation_timestamp.clone())
            .expect("an upgrade Job")
            .0;
        assert!(
            prepared <= applied,
            "{a}: prepared at {prepared}, upgrade Job at {applied}"
        );
    }
    delete_plan_and_wait(&env, &env.namespace, "k3s-agent").await;
    delete_plan_and_wait(&env, &env.namespace, "k3s-server").await;
    operator.stop().await;
    env.cleanup().await;
}

/// Upstream recreates a failed Job once its TTL removed it, and reports
/// each failure: the node stays cordoned meanwhile and the upgrade runs
/// again until it succeeds.
#[tokio::test]
async fn a_failed_job_is_made_again_once_its_ttl_removed_it() {
    let env = TestEnv::new("plan-retry").await;
    let nodes = env.create_kwok_nodes(1, &[("retry", "yes")]).await;
    let n = nodes[0].clone();
    // Its pods stay Pending, so the Job fails at its deadline.
    set_taint(&env, &n, hold()).await;
    let mut config = env.operator_config(Default::default(), None, "operator");
    config.plans.jobs.ttl_after_finished_secs = 2;
    let operator = env.start_operator_from(config).await;
    let spec = json!({
        "concurrency": 1, "version": "v2", "cordon": true, "jobActiveDeadlineSecs": 2,
        "nodeSelector": {"matchLabels": {"retry": "yes"}},
        "upgrade": upgrade("example.invalid/upgrade"),
    });
    create_plan(&env, "retry", json!({}), spec)
        .await
        .expect("creating the plan");
    let message = wait_condition(&env, "retry", "Complete", "False", "JobFailed").await;
    assert!(message.contains(" failed on Node "), "{message}");
    // Each failed Job is removed by its TTL and made again: two Jobs of the
    // same name, one after the other, the node cordoned all along.
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    wait_for("a second Job after the first failed", TIMEOUT, || {
        let seen = seen.clone();
        let env = &env;
        let n = n.clone();
        async move {
            for j in jobs_on(env, &n).await {
                if let Some(uid) = j.metadata.uid.clone() {
                    seen.lock().expect("the set").insert(uid);
                }
            }
            let count = seen.lock().expect("the set").len();
            match count >= 2 {
                true => Probe::Done(()),
                false => Probe::NotYet(format!("{count} Jobs seen")),
            }
        }
    })
    .await;
    assert!(
        cordoned(&node(&env, &n).await),
        "the node stays cordoned between tries"
    );
    // The cause goes away: the next try succeeds.
    patch_plan(&env, "retry", json!({"jobActiveDeadlineSecs": 0})).await;
    set_taint(&env, &n, json!(null)).await;
    wait_upgraded(&env, &env.namespace, "retry", &nodes, TIMEOUT).await;
    delete_plan_and_wait(&env, &env.namespace, "retry").await;
    operator.stop().await;
    env.cleanup().await;
}

/// What `kubectl get plans` prints for plan `name`: each column's name and
/// cell, from the API server's table (the CRD's printer columns).
async fn printed_columns(env: &TestEnv, name: &str) -> std::collections::BTreeMap<String, String> {
    let path = format!(
        "/apis/upgrade.cattle.io/v1/namespaces/{}/plans/{name}",
        env.namespace
    );
    let request = http::Request::get(path)
        .header(
            http::header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io",
        )
        .body(Vec::new())
        .expect("a request");
    let table: Value = env.client.request(request).await.expect("the plan as a table");
    let names = table["columnDefinitions"].as_array().cloned().unwrap_or_default();
    let cells = table["rows"][0]["cells"].as_array().cloned().unwrap_or_default();
    names
        .iter()
        .zip(cells)
        .map(|(c, v)| {
            // A column whose JSONPath matches nothing is null (kubectl: <none>).
            let cell = match v {
                Value::Null => String::new(),
                Value::String(s) => s,
                other => other.to_string(),
            };
            (c["name"].as_str().unwrap_or_default().to_string(), cell)
        })
        .collect()
}

/// A Plan whose Job fails (`args: ["exit 1"]`) shows the failure in the
/// Message column of `kubectl get plans`; edited to `["exit 0"]` (the same
/// hash: upstream's hash leaves args out) its failed Job is made again with
/// the edit at once, not after the Job's TTL, and the plan completes with
/// nothing in the Message column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_plan_edited_to_a_working_one_runs_again_at_once() {
    let env = TestEnv::new("plan-edit").await;
    let nodes = env.create_kwok_nodes(1, &[("edit", "yes")]).await;
    let mut config = env.operator_config(Default::default(), None, "operator");
    // The first failed pod fails the Job; its TTL (15 min) is not waited for.
    config.plans.jobs.backoff_limit = 0;
    config.plans.jobs.ttl_after_finished_secs = 900;
    let operator = env.start_operator_from(config).await;
    let spec = json!({
        "concurrency": 1, "version": "v2", "cordon": true,
        "nodeSelector": {"matchLabels": {"edit": "yes"}},
        "upgrade": {"image": "example.invalid/upgrade", "command": ["sh", "-c"], "args": ["exit 1"]},
    });
    create_plan(&env, "edit", json!({}), spec)
        .await
        .expect("creating the plan");
    let failure = wait_condition(&env, "edit", "Complete", "False", "JobFailed").await;
    assert!(failure.contains(" failed on Node "), "{failure}");
    let columns = printed_columns(&env, "edit").await;
    assert_eq!(
        columns.get("Message"),
        Some(&failure),
        "kubectl get plans shows the failure: {columns:?}"
    );
    let failed_job = jobs_on(&env, &nodes[0]).await;
    assert_eq!(failed_job.len(), 1, "one failed Job");

    patch_plan(&env, "edit", json!({"upgrade": {"args": ["exit 0"]}})).await;
    wait_upgraded(&env, &env.namespace, "edit", &nodes, Duration::from_secs(60)).await;
    wait_condition(&env, "edit", "Complete", "True", "Complete").await;
    let jobs = jobs_on(&env, &nodes[0]).await;
    assert!(
        jobs.iter().all(|j| j.metadata.uid != failed_job[0].metadata.uid),
        "the failed Job was replaced, not waited out"
    );
    assert!(
        jobs.iter().any(|j| j.spec.as_ref().is_some_and(|s| {
            s.template
                .spec
                .as_ref()
                .is_some_and(|p| p.containers[0].args.as_deref() == Some(&["exit 0".to_string()][..]))
        })),
        "the new Job runs the edit"
    );
    let columns = printed_columns(&env, "edit").await;
    assert_eq!(
        columns.get("Message").map(String::as_str),
        Some(""),
        "{columns:?}"
    );
    assert_eq!(
        columns.get("Complete").map(String::as_str),
        Some("True"),
        "{columns:?}"
    );
    delete_plan_and_wait(&env, &env.namespace, "edit").await;
    operator.stop().await;
    env.cleanup().await;
}
