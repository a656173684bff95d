//! The AutoscalingStrategy, ScalingGroup and JoiningNode controllers run
//! in-process (reflectors, controller, leader election) against the real
//! local control plane; the ScalingGroup controller against a real
//! `nodewarden-simcloud` child process.

use crate::support;

use crate::support::sim::{OwnedSimCloud, SimCloud};

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use crate::support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::ClusterResourceScope;
use kube::{Resource, ResourceExt};
use nodewarden::api::update::{AutoscalingStrategy, JoiningNode, NodeVersion, ScalingGroup, condition};
use nodewarden::cloud::CloudProvider;
use nodewarden::controllers::joining_node::COMPONENTS_ANNOTATION;
use nodewarden::controllers::{App, autoscaling_strategy, joining_node, pending_node, scaling_group};
use nodewarden::runtime::controller::ControllerConfig;
use nodewarden::runtime::leader::{LeaderElectionConfig, LeaderElector};
use nodewarden::runtime::manager::{Manager, Source};
use nodewarden::telemetry::Metrics;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const TIMEOUT: Duration = Duration::from_secs(60);

/// The controllers of one test, registered with a Manager as the operator
/// registers them (`controllers::*::register`), scoped to the test's run.
struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start(
        env: &TestEnv,
        name: &str,
        cloud: Option<Arc<dyn CloudProvider>>,
        register: impl FnOnce(&mut Manager, &App),
    ) -> Running {
        Self::start_with(env, name, cloud, register).0
    }

    /// Like `start`; also returns what `register` returns (a store, say).
    fn start_with<T>(
        env: &TestEnv,
        name: &str,
        cloud: Option<Arc<dyn CloudProvider>>,
        register: impl FnOnce(&mut Manager, &App) -> T,
    ) -> (Running, T) {
        let mut config = LeaderElectionConfig::new(env.namespace.clone(), name, format!("{}-{name}", env.id));
        config.lease_duration = Duration::from_secs(3);
        config.renew_deadline = Duration::from_secs(2);
        config.retry_period = Duration::from_millis(500);
        let elector = LeaderElector::new(env.client.clone(), config).expect("a valid election config");
        let metrics = Metrics::new();
        let mut manager = Manager::new(
            env.client.clone(),
            elector,
            ControllerConfig::default(),
            Arc::new(metrics.clone()),
        );
        let mut app = App::new(&manager, metrics);
        app.nodes = Source::labelled(Some(env.run_selector()));
        app.objects = Source::labelled(Some(env.run_selector()));
        app.cloud = cloud;
        let registered = register(&mut manager, &app);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(manager.run(shutdown.clone()));
        (Running { shutdown, task }, registered)
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }
}

fn run_labels(env: &TestEnv) -> BTreeMap<String, String> {
    BTreeMap::from([(RUN_LABEL.to_string(), env.id.clone())])
}

/// Deletes the test's objects of a kind the harness does not clean up.
async fn remove_labelled<K>(env: &TestEnv)
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope> + Clone + DeserializeOwned + Debug,
{
    let api: Api<K> = Api::all(env.client.clone());
    let _ = api
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&env.run_selector()),
        )
        .await;
}

/// The CRDs and a stand-in cluster-autoscaler Deployment, never scheduled
/// (other tests' nodes stay untouched).
async fn autoscaler_deployment(env: &TestEnv, replicas: i32) -> Api<Deployment> {
    support::install_crds(&env.client).await;
    env.create_deployment(
        "cluster-autoscaler",
        replicas,
        json!({"nodewarden.test/nowhere": "true"}),
    )
    .await;
    Api::namespaced(env.client.clone(), &env.namespace)
}

/// An enabled AutoscalingStrategy for that Deployment with `extra_args`.
async fn create_strategy(env: &TestEnv, extra_args: serde_json::Value) -> (Api<AutoscalingStrategy>, String) {
    let name = env.name("autoscaler");
    let api: Api<AutoscalingStrategy> = Api::all(env.client.clone());
    let strategy: AutoscalingStrategy = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "AutoscalingStrategy",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": {
            "enabled": true,
            "deploymentName": "cluster-autoscaler",
            "deploymentNamespace": env.namespace,
            "autoscalerExtraArgs": extra_args,
        },
    }))
    .expect("a strategy");
    api.create(&PostParams::default(), &strategy)
        .await
        .expect("creating the strategy");
    (api, name)
}

#[tokio::test]
async fn autoscaling_strategy_pauses_and_restores_the_deployment() {
    let env = TestEnv::new("small-autoscaling").await;
    let deployments = autoscaler_deployment(&env, 2).await;
    let run = Running::start(&env, "autoscaling", None, autoscaling_strategy::register);
    let (api, name) = create_strategy(&env, json!({})).await;

    // (spec.enabled, Deployment replicas, status.enabled, status.replicas)
    let expect = |enabled: bool, replicas: i32, status_enabled: bool, remembered: i32| {
        let (api, deployments, name) = (api.clone(), deployments.clone(), name.clone());
        async move {
            wait_for(
                &format!("enabled={enabled}: {replicas} replicas, status ({status_enabled}, {remembered})"),
                TIMEOUT,
                || async {
                    let d = match deployments.get("cluster-autoscaler").await {
                        Ok(d) => d,
                        Err(e) => return Probe::NotYet(seen(e)),
                    };
                    let s = match api.get(&name).await {
                        Ok(s) => s,
                        Err(e) => return Probe::NotYet(seen(e)),
                    };
                    let got_replicas = d.spec.and_then(|s| s.replicas);
                    let status = s.status.unwrap_or_default();
                    let got = (got_replicas, status.enabled, status.replicas);
                    if got == (Some(replicas), status_enabled, remembered) {
                        Probe::Done(())
                    } else {
                        Probe::NotYet(format!("{got:?}"))
                    }
                },
            )
            .await
        }
    };
    let set_enabled = |enabled: bool| {
        let (api, name) = (api.clone(), name.clone());
        async move {
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"enabled": enabled}})),
            )
            .await
            .expect("patching spec.enabled");
        }
    };

    expect(true, 2, true, 2).await;
    set_enabled(false).await;
    expect(false, 0, false, 2).await;
    set_enabled(true).await;
    expect(true, 2, true, 2).await;
    // Twice in a row changes nothing and loses nothing.
    set_enabled(false).await;
    expect(false, 0, false, 2).await;
    set_enabled(false).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    expect(false, 0, false, 2).await;
    set_enabled(true).await;
    expect(true, 2, true, 2).await;

    // A missing Deployment is no error: the status says it is not running.
    deployments
        .delete("cluster-autoscaler", &DeleteParams::default())
        .await
        .expect("deleting the deployment");
    wait_for("status.enabled false without a deployment", TIMEOUT, || async {
        match api.get(&name).await {
            Ok(s) if s.status.as_ref().is_some_and(|s| !s.enabled && s.replicas == 2) => Probe::Done(()),
            Ok(s) => Probe::NotYet(format!("{:?}", s.status)),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;

    run.stop().await;
    remove_labelled::<AutoscalingStrategy>(&env).await;
    env.cleanup().await;
}

/// A ScalingGroup of this run asking the autoscaler for `min..=max` nodes.
async fn create_autoscaled_group(
    env: &TestEnv,
    name: &str,
    asg: &str,
    min: i32,
    max: Option<i32>,
    role: &str,
) {
    let mut spec = json!({
        "nodeImage": "constellation-version",
        "groupId": format!("arn:aws:autoscaling:group/{asg}"),
        "autoscalerGroupName": asg,
        "autoscaling": true,
        "min": min,
        "role": role,
    });
    if let Some(max) = max {
        spec["max"] = json!(max);
    }
    let group: ScalingGroup = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "ScalingGroup",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": spec,
    }))
    .expect("a scaling group");
    Api::<ScalingGroup>::all(env.client.clone())
        .create(&PostParams::default(), &group)
        .await
        .expect("creating a scaling group");
}

#[tokio::test]
async fn autoscaling_strategy_writes_the_autoscaler_command_from_its_args_and_groups() {
    let env = TestEnv::new("small-autoscaler-args").await;
    let deployments = autoscaler_deployment(&env, 1).await;
    let (workers, unbounded, control) = (env.name("workers"), env.name("unbounded"), env.name("control"));
    create_autoscaled_group(&env, &workers, "asg-workers", 1, Some(5), "Worker").await;
    create_autoscaled_group(&env, &unbounded, "asg-more", 0, None, "Worker").await;
    create_autoscaled_group(&env, &control, "asg-control", 1, Some(3), "ControlPlane").await;
    let run = Running::start(&env, "autoscaler-args", None, autoscaling_strategy::register);
    let (api, name) = create_strategy(&env, json!({"v": "2", "cloud-provider": "aws"})).await;

    // The command, and the AutoscalerConfigured condition (status, reason, message).
    let expect = |command: Vec<String>, status: &'static str, reason: &'static str, message: String| {
        let (api, deployments, name) = (api.clone(), deployments.clone(), name.clone());
        async move {
            wait_for(&format!("command {command:?}, {reason}"), TIMEOUT, || async {
                let d = match deployments.get("cluster-autoscaler").await {
                    Ok(d) => d,
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                let s = match api.get(&name).await {
                    Ok(s) => s,
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                let container = d
                    .spec
                    .and_then(|s| s.template.spec)
                    .and_then(|p| p.containers.into_iter().next());
                let got_command = container
                    .as_ref()
                    .and_then(|c| c.command.clone())
                    .unwrap_or_default();
                let condition = s
                    .status
                    .unwrap_or_default()
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == autoscaling_strategy::CONFIGURED);
                let got = condition.map(|c| (c.status, c.reason, c.message, c.observed_generation));
                let want = Some((
                    status.to_string(),
                    reason.to_string(),
                    message.clone(),
                    s.metadata.generation,
                ));
                // The rest of the container is left as it was written.
                let image = container.map(|c| c.image).unwrap_or_default();
                if got_command == command && got == want && image.as_deref() == Some("registry.invalid/app:1")
                {
                    Probe::Done(())
                } else {
                    Probe::NotYet(format!("{got_command:?} {got:?} {image:?}"))
                }
            })
            .await
        }
    };
    let command = |nodes: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = ["--cloud-provider=aws", "--v=2"].map(String::from).to_vec();
        args.extend(nodes.iter().map(|n| n.to_string()));
        args.sort();
        std::iter::once(autoscaling_strategy::DEFAULT_BINARY.to_string())
            .chain(args)
            .collect()
    };

    // The control plane is never autoscaled; a group without max is left out,
    // and the condition names it and the field.
    expect(
        command(&["--nodes=1:5:asg-workers"]),
        "False",
        "GroupsLeftOut",
        format!(
            "left out of the autoscaler: ScalingGroup {control}: spec.role is ControlPlane, which is never autoscaled; \
             ScalingGroup {unbounded}: spec.max is unset; --nodes for ScalingGroups {workers}"
        ),
    )
    .await;
    env.wait_events("AutoscalingStrategy", &name, &["AutoscalerConfigured"])
        .await;

    let groups: Api<ScalingGroup> = Api::all(env.client.clone());
    let patch_group = |group: String, spec: serde_json::Value| {
        let groups = groups.clone();
        async move {
            groups
                .patch(
                    &group,
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": spec})),
                )
                .await
                .expect("patching a scaling group");
        }
    };
    // Bounding the group gives it to the autoscaler; the condition turns True.
    patch_group(unbounded.clone(), json!({"max": 4})).await;
    patch_group(control.clone(), json!({"autoscaling": false})).await;
    let mut both = [unbounded.clone(), workers.clone()];
    both.sort();
    expect(
        command(&["--nodes=1:5:asg-workers", "--nodes=0:4:asg-more"]),
        "True",
        "Configured",
        format!("--nodes for ScalingGroups {}", both.join(", ")),
    )
    .await;

    // A group that stops autoscaling leaves the command line; new extra args enter it.
    patch_group(workers.clone(), json!({"autoscaling": false})).await;
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"autoscalerExtraArgs": {"v": "4", "cloud-provider": "aws"}}})),
    )
    .await
    .expect("patching the extra args");
    let mut want = command(&["--nodes=0:4:asg-more"]);
    for arg in &mut want {
        if arg == "--v=2" {
            *arg = "--v=4".into();
        }
    }
    expect(
        want,
        "True",
        "Configured",
        format!("--nodes for ScalingGroups {unbounded}"),
    )
    .await;

    run.stop().await;
    remove_labelled::<AutoscalingStrategy>(&env).await;
    remove_labelled::<ScalingGroup>(&env).await;
    env.cleanup().await;
}

/// A sim-cloud with one empty worker group whose instances carry the
/// test's run label; the group's id. The state file lives as long as the
/// returned sim-cloud.
async fn sim_with_one_worker_group(env: &TestEnv) -> (OwnedSimCloud, String) {
    let group = env.name("workers");
    let config = format!(
        "groups:\n  - id: {group}\n    role: Worker\n    initialSize: 0\n    image: img-1\n    labels:\n      {RUN_LABEL}: {id}\n",
        id = env.id
    );
    (SimCloud::start_with_config(&config).await, group)
}

/// Discovery never creates a ScalingGroup the webhook would refuse: while
/// the NodeVersion its groups follow is missing it waits, says so in a
/// Warning Event on that NodeVersion, and creates the groups within seconds
/// of the NodeVersion appearing (not at the next 10-minute round).
#[tokio::test]
async fn discovery_waits_for_its_node_version_and_says_so() {
    let env = TestEnv::new("small-discovery").await;
    support::install_crds(&env.client).await;
    let (owned, group) = sim_with_one_worker_group(&env).await;
    let sim = owned.sim;
    let cloud: Arc<dyn CloudProvider> = Arc::new(sim.provider.clone());
    let nv_name = env.name("version");
    let run = Running::start(&env, "discovery", Some(cloud), |m, app| {
        scaling_group::register_discovery(m, app, nv_name.clone());
    });

    env.wait_events(
        "NodeVersion",
        &nv_name,
        &[scaling_group::REASON_NODE_VERSION_MISSING],
    )
    .await;
    let sgs: Api<ScalingGroup> = Api::all(env.client.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        sgs.get_opt(&group)
            .await
            .expect("reading ScalingGroups")
            .is_none(),
        "no ScalingGroup before its NodeVersion exists"
    );

    let nv: NodeVersion = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "NodeVersion",
        "metadata": {"name": nv_name, "labels": {RUN_LABEL: env.id}},
        "spec": {"image": "img-2"},
    }))
    .expect("a node version");
    Api::<NodeVersion>::all(env.client.clone())
        .create(&PostParams::default(), &nv)
        .await
        .expect("creating the node version");
    let created = std::time::Instant::now();
    wait_for("the discovered ScalingGroup", Duration::from_secs(10), || async {
        match sgs.get_opt(&group).await {
            Ok(Some(sg)) => Probe::Done(sg),
            Ok(None) => Probe::NotYet("not yet".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    println!(
        "ScalingGroup created {:?} after its NodeVersion",
        created.elapsed()
    );
    env.wait_events(
        "NodeVersion",
        &nv_name,
        &[scaling_group::REASON_SCALING_GROUPS_DISCOVERED],
    )
    .await;

    run.stop().await;
    remove_labelled::<ScalingGroup>(&env).await;
    remove_labelled::<NodeVersion>(&env).await;
    env.cleanup().await;
}

#[tokio::test]
async fn scaling_group_follows_its_node_version_image() {
    let env = TestEnv::new("small-scalinggroup").await;
    support::install_crds(&env.client).await;
    let (owned, group) = sim_with_one_worker_group(&env).await;
    let sim = owned.sim;
    let cloud: Arc<dyn CloudProvider> = Arc::new(sim.provider.clone());

    let (run, groups) = Running::start_with(&env, "scalinggroup", Some(cloud.clone()), |m, app| {
        scaling_group::register(m, app);
        m.store::<ScalingGroup>(&app.objects)
    });

    let nv_name = env.name("version");
    let versions: Api<NodeVersion> = Api::all(env.client.clone());
    let nv: NodeVersion = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1",
        "kind": "NodeVersion",
        "metadata": {"name": nv_name, "labels": {RUN_LABEL: env.id}},
        "spec": {"image": "img-2"},
    }))
    .expect("a node version");
    versions
        .create(&PostParams::default(), &nv)
        .await
        .expect("creating the node version");

    // Discovery creates the ScalingGroup of the cloud group, once.
    let created =
        scaling_group::discover_and_create(&env.client, cloud.as_ref(), &groups, &nv_name, &run_labels(&env))
            .await
            .expect("discovery");
    assert_eq!(created, std::slice::from_ref(&group));
    let sgs: Api<ScalingGroup> = Api::all(env.client.clone());
    let sg = sgs.get(&group).await.expect("the discovered ScalingGroup");
    assert_eq!(sg.spec.group_id, group);
    assert_eq!(sg.spec.node_image, nv_name);
    assert_eq!(sg.labels().get(RUN_LABEL), Some(&env.id));
    wait_for("the store sees the new ScalingGroup", TIMEOUT, || async {
        if groups
            .get(&nodewarden::runtime::store::ObjectKey::cluster(&group))
            .is_some()
        {
            Probe::Done(())
        } else {
            Probe::NotYet("not in the store".into())
        }
    })
    .await;
    let again =
        scaling_group::discover_and_create(&env.client, cloud.as_ref(), &groups, &nv_name, &run_labels(&env))
            .await
            .expect("discovery again");
    assert!(again.is_empty(), "{again:?}");

    let expect_image = |image: &'static str| {
        let (sgs, provider, group) = (sgs.clone(), sim.provider.clone(), group.clone());
        async move {
            wait_for(&format!("group and status on {image}"), TIMEOUT, || async {
                let cloud_image = match provider.group_image(&group).await {
                    Ok(i) => i,
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                let sg = match sgs.get(&group).await {
                    Ok(sg) => sg,
                    Err(e) => return Probe::NotYet(seen(e)),
                };
                let status = sg.status.unwrap_or_default();
                let outdated = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == condition::OUTDATED)
                    .map(|c| (c.status.clone(), c.observed_generation));
                let got = (
                    cloud_image.as_str(),
                    status.image_reference.as_str(),
                    outdated.clone(),
                );
                if got.0 == image
                    && got.1 == image
                    && outdated == Some(("False".into(), sg.metadata.generation))
                {
                    Probe::Done(())
                } else {
                    Probe::NotYet(format!("{got:?}"))
                }
            })
            .await
        }
    };
    expect_image("img-2").await;

    // A NodeVersion change reaches the groups following it.
    versions
        .patch(
            &nv_name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"image": "img-3"}})),
        )
        .await
        .expect("patching the image");
    expect_image("img-3").await;

    run.stop().await;
    sim.kill().await;
    remove_labelled::<ScalingGroup>(&env).await;
    remove_labelled::<NodeVersion>(&env).await;
    env.cleanup().await;
}

#[tokio::test]
async fn joining_node_annotates_its_node_and_goes_away() {
    let env = TestEnv::new("small-joiningnode").await;
    support::install_crds(&env.client).await;

    let run = Running::start(&env, "joiningnode", None, joining_node::register);

    let api: Api<JoiningNode> = Api::all(env.client.clone());
    let create = |name: String, node: String, deadline: Timestamp| {
        let (api, id) = (api.clone(), env.id.clone());
        async move {
            let jn: JoiningNode = serde_json::from_value(json!({
                "apiVersion": "update.edgeless.systems/v1alpha1",
                "kind": "JoiningNode",
                "metadata": {"name": name, "labels": {RUN_LABEL: id}},
                "spec": {
                    "name": node,
                    "componentsreference": "k8s-components-abc",
                    "deadline": deadline.to_string(),
                },
            }))
            .expect("a joining node");
            api.create(&PostParams::default(), &jn)
                .await
                .expect("creating a joining node");
        }
    };
    let gone = |name: String| {
        let api = api.clone();
        async move {
            wait_for(&format!("JoiningNode {name} deleted"), TIMEOUT, || async {
                match api.get_opt(&name).await {
                    Ok(None) => Probe::Done(()),
                    Ok(Some(_)) => Probe::NotYet("still there".into()),
                    Err(e) => Probe::NotYet(seen(e)),
                }
            })
            .await
        }
    };

    // Announced before the node exists (as the join service does).
    let node = env.name("node-0");
    // Whole seconds: the API server keeps no more (metav1.Time).
    let in_secs = |s: i64| Timestamp::from_second(Timestamp::now().as_second() + s).expect("a time");
    let later = in_secs(600);
    create(env.name("join"), node.clone(), later).await;
    // One whose node never comes: removed at its deadline.
    let soon = in_secs(4);
    create(env.name("never"), env.name("ghost"), soon).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for name in [env.name("join"), env.name("never")] {
        assert!(
            api.get_opt(&name)
                .await
                .expect("reading the joining node")
                .is_some(),
            "{name} kept while its node has not appeared and its deadline is ahead"
        );
    }

    let names = env.create_kwok_nodes(1, &[]).await;
    assert_eq!(names, std::slice::from_ref(&node));
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_for("the node annotated", TIMEOUT, || async {
        match nodes.get(&node).await {
            Ok(n) => match n.annotations().get(COMPONENTS_ANNOTATION) {
                Some(v) if v == "k8s-components-abc" => Probe::Done(()),
                other => Probe::NotYet(format!("{other:?}")),
            },
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    gone(env.name("join")).await;
    gone(env.name("never")).await;
    assert!(
        Timestamp::now() >= soon,
        "the expired JoiningNode went away at its deadline, not before"
    );

    run.stop().await;
    remove_labelled::<JoiningNode>(&env).await;
    env.cleanup().await;
}

/// A PendingNode written without a provider ID is a create under way (the
/// NodeVersion controller writes it before calling the cloud). Only once that
/// create is overdue does the PendingNode controller finish it, with the
/// PendingNode's name as idempotency key: one instance, never two.
#[tokio::test]
async fn pending_node_finishes_an_interrupted_create_once_it_is_overdue() {
    let env = TestEnv::new("small-pendingnode").await;
    support::install_crds(&env.client).await;
    let group = env.name("workers");
    let config = json!({"groups": [{
        "id": group, "role": "Worker", "initialSize": 0, "image": "img-1",
        "bootDelay": "200ms", "joinDelay": "200ms", "deleteDelay": "200ms",
        "labels": {RUN_LABEL: env.id},
    }]});
    let sim = SimCloud::start_with_config(&config.to_string()).await;
    let cloud: Arc<dyn CloudProvider> = Arc::new(sim.sim.provider.clone());

    let run = Running::start(&env, "pendingnode", Some(cloud), pending_node::register);

    // What a leader that died right after writing it leaves behind.
    let name = env.name("join");
    let api: Api<nodewarden::api::update::PendingNode> = Api::all(env.client.clone());
    let pn: nodewarden::api::update::PendingNode = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "PendingNode",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": {"providerID": "", "groupID": group, "nodeName": "", "goal": "Join",
                 "deadline": Timestamp::from_second(Timestamp::now().as_second() + 600).expect("a time").to_string()},
    }))
    .expect("a PendingNode");
    api.create(&PostParams::default(), &pn).await.expect("creating");
    let written = std::time::Instant::now();
    let instances = || async {
        sim.sim
            .provider
            .list_instances()
            .await
            .expect("listing instances")
            .into_iter()
            .filter(|i| i.instance.group == group)
            .count()
    };
    // Still within the create's grace: nobody asks the cloud twice.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        instances().await,
        0,
        "a create that may be under way is left alone"
    );

    let provider_id = wait_for("the interrupted create finished", TIMEOUT, || async {
        match api.get(&name).await {
            Ok(p) if !p.spec.provider_id.is_empty() => Probe::Done(p.spec.provider_id),
            Ok(_) => Probe::NotYet("no provider ID yet".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let waited = written.elapsed();
    assert!(
        waited >= Duration::from_secs(9),
        "finished only once overdue ({waited:?})"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(instances().await, 1, "one instance for {provider_id}");

    run.stop().await;
    remove_labelled::<nodewarden::api::update::PendingNode>(&env).await;
    sim.sim.kill().await;
    env.cleanup().await;
}

/// Without a cloud nothing can replace nodes: a NodeVersion says so in its
/// conditions (with its generation) and in one Warning Event, instead of
/// being ignored in silence; a new image gets the answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_version_without_a_cloud_says_that_none_is_configured() {
    use nodewarden::controllers::no_cloud;
    let env = TestEnv::new("no-cloud").await;
    let operator = env.start_operator(Default::default()).await;
    let name = env.name("version");
    let api: Api<NodeVersion> = Api::all(env.client.clone());
    let nv: NodeVersion = serde_json::from_value(json!({
        "apiVersion": "update.edgeless.systems/v1alpha1", "kind": "NodeVersion",
        "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
        "spec": {"image": "img-1"},
    }))
    .expect("a NodeVersion");
    api.create(&PostParams::default(), &nv).await.expect("creating");
    let wanted = (condition::DEGRADED, "True", "NoCloudProvider");
    let message = support::wait_for_condition(&api, &name, wanted, TIMEOUT).await;
    assert_eq!(message, no_cloud::MESSAGE);
    support::wait_for_condition(
        &api,
        &name,
        (condition::PROGRESSING, "False", "NoCloudProvider"),
        TIMEOUT,
    )
    .await;

    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"image": "img-2"}})),
    )
    .await
    .expect("a new image");
    wait_for("the conditions at generation 2", TIMEOUT, || async {
        match api.get(&name).await {
            Ok(nv) => {
                let conditions = nv.status.map(|s| s.rollout_conditions).unwrap_or_default();
                match conditions.iter().find(|c| c.type_ == condition::DEGRADED) {
                    Some(c) if c.observed_generation == Some(2) && c.reason == "NoCloudProvider" => {
                        Probe::Done(())
                    }
                    other => Probe::NotYet(format!("{other:?}")),
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.client.clone());
    wait_for("one NoCloudProvider Event", TIMEOUT, || async {
        match events
            .list(&ListParams::default().fields(&format!("regarding.name={name}")))
            .await
        {
            Ok(l) => {
                let reasons: Vec<String> = l.items.into_iter().filter_map(|e| e.reason).collect();
                match reasons.iter().filter(|r| *r == "NoCloudProvider").count() {
                    1 => Probe::Done(()),
                    _ => Probe::NotYet(format!("{reasons:?}")),
                }
            }
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
    operator.stop().await;
    env.cleanup().await;
}
