//! The AutoscalingStrategy controller: pauses the cluster-autoscaler while
//! nodes are replaced (the rollout flips `spec.enabled`) by scaling its
//! Deployment to 0, and restores the replica count it had afterwards.
//!
//! The count the Deployment had before it was paused is remembered in
//! `status.replicas`, written *before* the Deployment is scaled down, and
//! never overwritten by 0: a crash between the two writes, or a repeated
//! reconcile, cannot lose it. While enabled, `status.replicas` follows the
//! Deployment, so a later pause remembers the current count.
//!
//! [`plan`] (pure, table tested) turns what the stores show into ordered
//! [`Step`]s; `reconcile` only carries them out, each write conditioned on
//! the resourceVersion it was computed from.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::runtime::events::Recorder;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::{App, event, spawn_event};
use crate::api::conditions::set_condition;
use crate::api::update::{
    AutoscalingStrategy, AutoscalingStrategySpec, AutoscalingStrategyStatus, ScalingGroup,
};
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, Source, always, changed};
use crate::runtime::store::{Key, ObjectKey, Store};

/// Index of AutoscalingStrategy stores: `namespace/name` of the Deployment.
pub const DEPLOYMENT_INDEX: &str = "deployment";
/// Replicas restored when none were remembered.
pub const DEFAULT_REPLICAS: i32 = 1;
/// How often a strategy whose Deployment is missing looks again.
pub const MISSING_REQUEUE: Duration = Duration::from_secs(30);
/// The binary the command starts with when the container names none (the
/// path in the upstream cluster-autoscaler image, and Constellation's).
pub const DEFAULT_BINARY: &str = "./cluster-autoscaler";
/// Condition: the Deployment runs the command line asked for.
pub const CONFIGURED: &str = "AutoscalerConfigured";

/// One write, in the order they must happen.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Patch the strategy's status.
    Status(AutoscalingStrategyStatus),
    /// Set the Deployment's `spec.replicas`.
    Scale(i32),
    /// Set the command of one container of the Deployment.
    Command {
        /// The container's name.
        container: String,
        /// Its whole command, binary first.
        command: Vec<String>,
    },
}

/// What a reconcile does: its writes and what it asks for next.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The writes, in order.
    pub steps: Vec<Step>,
    /// The Deployment is missing: look again later.
    pub requeue: Option<Duration>,
}

/// What the plan reads of the autoscaler Deployment.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoscalerDeployment {
    /// `spec.replicas` (the API server's default is 1).
    pub replicas: i32,
    /// The first container's name and command; None when it has no container.
    pub container: Option<(String, Vec<String>)>,
}

impl AutoscalerDeployment {
    /// Reads what the plan needs of `d`.
    pub fn of(d: &Deployment) -> Self {
        let spec = d.spec.as_ref();
        AutoscalerDeployment {
            replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
            container: spec
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .map(|c| (c.name.clone(), c.command.clone().unwrap_or_default())),
        }
    }
}

/// The autoscaler's arguments the strategy and the ScalingGroups ask for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AutoscalerArgs {
    /// `--key=value` and `--nodes=min:max:name`, sorted (stable, so the
    /// Deployment is not rewritten for nothing).
    pub args: Vec<String>,
    /// The ScalingGroups given to the autoscaler.
    pub groups: Vec<String>,
    /// ScalingGroups that ask for autoscaling but cannot be given, with the
    /// field that keeps them out.
    pub left_out: Vec<(String, String)>,
}

/// The arguments for `spec` and the ScalingGroups (name, spec). Control-plane
/// groups are never autoscaled; an autoscaled worker group needs
/// `autoscalerGroupName` and `max` (an unset `min` is 0).
pub fn autoscaler_args(
    spec: &AutoscalingStrategySpec,
    groups: &[(String, &crate::api::update::ScalingGroupSpec)],
) -> AutoscalerArgs {
    let mut out = AutoscalerArgs {
        args: spec.extra_args(),
        ..AutoscalerArgs::default()
    };
    let mut groups: Vec<_> = groups.iter().filter(|(_, g)| g.autoscaling).collect();
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, g) in groups {
        let max = match (g.is_control_plane(), g.autoscaler_group_name.is_empty(), g.max) {
            (true, _, _) => Err("spec.role is ControlPlane, which is never autoscaled"),
            (_, true, _) => Err("spec.autoscalerGroupName is empty"),
            (_, _, None) => Err("spec.max is unset"),
            (_, _, Some(max)) => Ok(max),
        };
        match max {
            Ok(max) => {
                let min = g.min.unwrap_or(0);
                out.args
                    .push(format!("--nodes={min}:{max}:{}", g.autoscaler_group_name));
                out.groups.push(name.clone());
            }
            Err(why) => out.left_out.push((name.clone(), why.to_string())),
        }
    }
    out.args.sort();
    out
}

/// The whole command: the binary the container already names (or
/// [`DEFAULT_BINARY`]), then `args`.
pub fn command_line(current: &[String], args: &[String]) -> Vec<String> {
    let binary = current.first().map_or(DEFAULT_BINARY, String::as_str);
    std::iter::once(binary.to_string())
        .chain(args.iter().cloned())
        .collect()
}

/// What one reconcile reads.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// The strategy's spec.
    pub spec: &'a AutoscalingStrategySpec,
    /// The strategy's generation, for the condition.
    pub generation: Option<i64>,
    /// The strategy's status, if any was written.
    pub status: Option<&'a AutoscalingStrategyStatus>,
    /// The Deployment, None when it does not exist.
    pub deployment: Option<&'a AutoscalerDeployment>,
    /// What the arguments should be.
    pub wanted: &'a AutoscalerArgs,
    /// For the condition's transition time.
    pub now: Timestamp,
}

/// The writes that bring the Deployment and the status in line with the
/// spec and the ScalingGroups.
///
/// Pausing remembers the count first, then scales; resuming scales first,
/// then reports. The command is set before either, so a resumed autoscaler
/// starts with the groups it is meant to have.
pub fn plan(f: &Facts) -> Plan {
    let prev = f.status.cloned().unwrap_or_default();
    let remembered = (prev.replicas > 0).then_some(prev.replicas);
    let mut conditions = prev.conditions.clone();
    let mut configured = |status: bool, reason: &str, message: String| {
        set_condition(
            &mut conditions,
            CONFIGURED,
            status,
            reason,
            message,
            f.generation,
            f.now,
        );
    };
    let Some(deployment) = f.deployment else {
        // Nothing to scale; the status says the autoscaler is not running and
        // keeps what it remembers.
        configured(
            false,
            "DeploymentMissing",
            format!(
                "spec.deploymentName: Deployment {}/{} not found",
                f.spec.deployment_namespace, f.spec.deployment_name
            ),
        );
        let next = AutoscalingStrategyStatus {
            enabled: false,
            replicas: prev.replicas,
            conditions,
        };
        return Plan {
            steps: status_step(&prev, f.status.is_some(), next),
            requeue: Some(MISSING_REQUEUE),
        };
    };
    let (status, reason, message, command) = configuration(f, deployment);
    configured(status, reason, message);
    let mut steps: Vec<Step> = command.into_iter().collect();
    let current = deployment.replicas;
    let (next, scale) = if f.spec.enabled {
        let target = if current > 0 {
            current
        } else {
            remembered.unwrap_or(DEFAULT_REPLICAS)
        };
        (
            AutoscalingStrategyStatus {
                enabled: true,
                replicas: target,
                conditions,
            },
            (current != target).then_some(Step::Scale(target)),
        )
    } else {
        (
            AutoscalingStrategyStatus {
                enabled: false,
                replicas: remembered.unwrap_or(current.max(0)),
                conditions,
            },
            (current != 0).then_some(Step::Scale(0)),
        )
    };
    let report = status_step(&prev, f.status.is_some(), next);
    // Resuming scales before it reports; pausing reports (remembers the
    // count) before it scales.
    if f.spec.enabled {
        steps.extend(scale);
        steps.extend(report);
    } else {
        steps.extend(report);
        steps.extend(scale);
    }
    Plan { steps, requeue: None }
}

/// The Configured condition (status, reason, message) for an existing
/// Deployment, and the change of the container's command it needs, if any.
fn configuration(f: &Facts, deployment: &AutoscalerDeployment) -> (bool, &'static str, String, Option<Step>) {
    let Some((name, current)) = &deployment.container else {
        let message = format!(
            "Deployment {}/{} has no container to run the autoscaler in",
            f.spec.deployment_namespace, f.spec.deployment_name
        );
        return (false, "NoContainer", message, None);
    };
    let command = command_line(current, &f.wanted.args);
    let change = (*current != command).then(|| Step::Command {
        container: name.clone(),
        command,
    });
    if f.wanted.left_out.is_empty() {
        return (true, "Configured", given(&f.wanted.groups), change);
    }
    let why: Vec<String> = f
        .wanted
        .left_out
        .iter()
        .map(|(group, why)| format!("ScalingGroup {group}: {why}"))
        .collect();
    let message = format!(
        "left out of the autoscaler: {}; {}",
        why.join("; "),
        given(&f.wanted.groups)
    );
    (false, "GroupsLeftOut", message, change)
}

fn given(groups: &[String]) -> String {
    if groups.is_empty() {
        "no ScalingGroup is given to the autoscaler".to_string()
    } else {
        format!("--nodes for ScalingGroups {}", groups.join(", "))
    }
}

fn status_step(
    prev: &AutoscalingStrategyStatus,
    had_status: bool,
    next: AutoscalingStrategyStatus,
) -> Vec<Step> {
    if had_status && *prev == next {
        Vec::new()
    } else {
        vec![Step::Status(next)]
    }
}

fn deployment_key(s: &AutoscalingStrategy) -> String {
    format!("{}/{}", s.spec.deployment_namespace, s.spec.deployment_name)
}

/// Adds the Deployment index to an AutoscalingStrategy store (the reconciler's
/// constructor does this for its own store).
pub fn index_by_deployment(store: &Store<AutoscalingStrategy>) {
    store.add_index(DEPLOYMENT_INDEX, |s: &AutoscalingStrategy| {
        vec![deployment_key(s)]
    });
}

/// The AutoscalingStrategies that manage `deployment` (for watching Deployments).
pub fn keys_for_deployment(
    store: &Store<AutoscalingStrategy>,
    deployment: &Deployment,
) -> Vec<Key<AutoscalingStrategy>> {
    let key = format!(
        "{}/{}",
        deployment.namespace().unwrap_or_default(),
        deployment.name_any()
    );
    store.keys_by_index(DEPLOYMENT_INDEX, &key)
}

/// What of a ScalingGroup the autoscaler's command line depends on.
fn autoscaling_view(g: &ScalingGroup) -> (bool, Option<i32>, Option<i32>, String, bool) {
    let s = &g.spec;
    (
        s.autoscaling,
        s.min,
        s.max,
        s.autoscaler_group_name.clone(),
        s.is_control_plane(),
    )
}

/// The AutoscalingStrategy controller: its strategies, the autoscaler
/// Deployments they name (Deployments are few), and the ScalingGroups whose
/// autoscaling settings make up the command line (a change requeues every
/// strategy; there is normally one).
pub fn register(manager: &mut Manager, app: &App) {
    let mut c = manager.controller::<AutoscalingStrategy>("autoscalingstrategy", &app.objects);
    let strategies = c.store();
    let by_deployment = strategies.clone();
    let deployments = c.watches(&Source::all(), always(), move |d: &Deployment| {
        keys_for_deployment(&by_deployment, d)
    });
    let every_strategy = strategies.clone();
    let groups = c.watches(
        &app.objects,
        changed(autoscaling_view),
        move |_: &ScalingGroup| every_strategy.keys(),
    );
    c.on_failure(app.report_failures());
    c.register(AutoscalingStrategyReconciler::new(
        app.client.clone(),
        app.leader.clone(),
        app.recorder.clone(),
        strategies,
        deployments,
        groups,
    ));
}

/// Reconciles AutoscalingStrategies (key: the strategy's name).
pub struct AutoscalingStrategyReconciler {
    client: Client,
    leader: LeaderHandle,
    recorder: Recorder,
    deployments: Store<Deployment>,
    groups: Store<ScalingGroup>,
}

impl AutoscalingStrategyReconciler {
    /// `deployments` must hold the autoscaler Deployments (a reflector of
    /// Deployments, possibly limited to their namespace), `groups` the
    /// ScalingGroups. Adds the Deployment index to `strategies`, for
    /// [`keys_for_deployment`].
    pub fn new(
        client: Client,
        leader: LeaderHandle,
        recorder: Recorder,
        strategies: Store<AutoscalingStrategy>,
        deployments: Store<Deployment>,
        groups: Store<ScalingGroup>,
    ) -> Self {
        index_by_deployment(&strategies);
        AutoscalingStrategyReconciler {
            client,
            leader,
            recorder,
            deployments,
            groups,
        }
    }
}

/// The object versions the next write is conditioned on: each write's
/// answer gives the next.
struct Versions {
    strategy: Option<String>,
    deployment: Option<String>,
}

impl AutoscalingStrategyReconciler {
    async fn apply(
        &self,
        strategy: &AutoscalingStrategy,
        step: &Step,
        versions: &mut Versions,
    ) -> Result<()> {
        let spec = &strategy.spec;
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &spec.deployment_namespace);
        let target = format!("{}/{}", spec.deployment_namespace, spec.deployment_name);
        match step {
            Step::Status(status) => {
                // Conditioned on the version the plan was computed from:
                // a remembered count is never replaced on a stale view.
                // Explicit values: the type omits false and 0, which a
                // merge patch would read as "leave as is".
                let patch = json!({
                    "metadata": {"resourceVersion": versions.strategy},
                    "status": {
                        "enabled": status.enabled,
                        "replicas": status.replicas,
                        "conditions": status.conditions,
                    },
                });
                let strategies: Api<AutoscalingStrategy> = Api::all(self.client.clone());
                let patched = strategies
                    .patch_status(
                        &strategy.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
                versions.strategy = patched.resource_version();
            }
            Step::Scale(replicas) => {
                let patch = json!({
                    "metadata": {"resourceVersion": versions.deployment},
                    "spec": {"replicas": replicas},
                });
                self.leader.ensure_leader()?;
                let patched = deployments
                    .patch(
                        &spec.deployment_name,
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await?;
                versions.deployment = patched.resource_version();
                tracing::info!(strategy = %strategy.name_any(), deployment = %target, replicas, "scaled the autoscaler");
            }
            Step::Command { container, command } => {
                // Strategic merge: the container is matched by name and
                // only its command is replaced; the rest stays as written.
                let patch = json!({
                    "metadata": {"resourceVersion": versions.deployment},
                    "spec": {"template": {"spec": {"containers": [
                        {"name": container, "command": command},
                    ]}}},
                });
                self.leader.ensure_leader()?;
                let patched = deployments
                    .patch(
                        &spec.deployment_name,
                        &PatchParams::default(),
                        &Patch::Strategic(&patch),
                    )
                    .await?;
                versions.deployment = patched.resource_version();
                let note = format!("{target} runs {}", command.join(" "));
                tracing::info!(strategy = %strategy.name_any(), deployment = %target, command = %command.join(" "), "configured the autoscaler");
                let e = event(EventType::Normal, "AutoscalerConfigured", "Configure", &note);
                spawn_event(&self.recorder, e, strategy.object_ref(&()));
            }
        }
        Ok(())
    }
}

impl Reconciler for AutoscalingStrategyReconciler {
    type Object = AutoscalingStrategy;
    type Error = Error;

    async fn reconcile(
        &self,
        _key: &Key<AutoscalingStrategy>,
        strategy: Option<Arc<AutoscalingStrategy>>,
    ) -> Result<Action> {
        let Some(strategy) = strategy else {
            return Ok(Action::Done);
        };
        if strategy.metadata.deletion_timestamp.is_some() {
            return Ok(Action::Done);
        }
        if !self.deployments.is_synced() || !self.groups.is_synced() {
            // "Missing" would be a guess until the first list arrived.
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let spec = &strategy.spec;
        let deployment = self.deployments.get(&ObjectKey::new(
            Some(&spec.deployment_namespace),
            &spec.deployment_name,
        ));
        let groups = self.groups.list();
        let group_specs: Vec<_> = groups.iter().map(|g| (g.name_any(), &g.spec)).collect();
        let wanted = autoscaler_args(spec, &group_specs);
        let seen = deployment.as_deref().map(AutoscalerDeployment::of);
        let plan = plan(&Facts {
            spec,
            generation: strategy.metadata.generation,
            status: strategy.status.as_ref(),
            deployment: seen.as_ref(),
            wanted: &wanted,
            now: Timestamp::now(),
        });
        let mut versions = Versions {
            strategy: strategy.resource_version(),
            deployment: deployment.as_deref().and_then(|d| d.resource_version()),
        };
        for step in &plan.steps {
            self.apply(&strategy, step, &mut versions).await?;
        }
        Ok(plan.requeue.map_or(Action::Done, Action::RequeueAfter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::update::{NodeRole, ScalingGroupSpec};

    fn st(enabled: bool, replicas: i32) -> AutoscalingStrategyStatus {
        AutoscalingStrategyStatus {
            enabled,
            replicas,
            conditions: Vec::new(),
        }
    }

    fn spec(enabled: bool) -> AutoscalingStrategySpec {
        AutoscalingStrategySpec {
            enabled,
            deployment_name: "cluster-autoscaler".into(),
            deployment_namespace: "kube-system".into(),
            autoscaler_extra_args: Default::default(),
        }
    }

    fn deployment(replicas: i32) -> AutoscalerDeployment {
        AutoscalerDeployment {
            replicas,
            container: Some(("ca".into(), vec![DEFAULT_BINARY.into()])),
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000).expect("a time")
    }

    /// The plan's steps with the conditions left out (checked separately).
    fn steps(enabled: bool, replicas: Option<i32>, status: Option<AutoscalingStrategyStatus>) -> Plan {
        let spec = spec(enabled);
        let seen = replicas.map(deployment);
        // Statuses in the table carry the condition a previous reconcile set.
        let status = status.map(|mut s| {
            s.conditions = plan(&Facts {
                spec: &spec,
                generation: Some(1),
                status: None,
                deployment: seen.as_ref(),
                wanted: &AutoscalerArgs::default(),
                now: now(),
            })
            .steps
            .iter()
            .find_map(|step| match step {
                Step::Status(s) => Some(s.conditions.clone()),
                _ => None,
            })
            .unwrap_or_default();
            s
        });
        let mut got = plan(&Facts {
            spec: &spec,
            generation: Some(1),
            status: status.as_ref(),
            deployment: seen.as_ref(),
            wanted: &AutoscalerArgs::default(),
            now: now(),
        });
        for step in &mut got.steps {
            if let Step::Status(s) = step {
                s.conditions.clear();
            }
        }
        got
    }

    #[test]
    fn plans() {
        use Step::{Scale, Status};
        // (name, spec.enabled, deployment replicas, status, steps, requeue)
        type Case = (
            &'static str,
            bool,
            Option<i32>,
            Option<AutoscalingStrategyStatus>,
            Vec<Step>,
            bool,
        );
        let cases: Vec<Case> = vec![
            (
                "pause remembers first, then scales",
                false,
                Some(2),
                None,
                vec![Status(st(false, 2)), Scale(0)],
                false,
            ),
            (
                "pause keeps an earlier memory",
                false,
                Some(3),
                Some(st(false, 2)),
                vec![Scale(0)],
                false,
            ),
            (
                "paused and scaled: nothing to do",
                false,
                Some(0),
                Some(st(false, 2)),
                vec![],
                false,
            ),
            (
                "a remembered count is never overwritten by 0",
                false,
                Some(0),
                Some(st(true, 2)),
                vec![Status(st(false, 2))],
                false,
            ),
            (
                "enabled status follows the deployment, then pauses",
                false,
                Some(4),
                Some(st(true, 4)),
                vec![Status(st(false, 4)), Scale(0)],
                false,
            ),
            (
                "paused at 0 with nothing remembered",
                false,
                Some(0),
                None,
                vec![Status(st(false, 0))],
                false,
            ),
            (
                "resume restores the memory, scaling first",
                true,
                Some(0),
                Some(st(false, 2)),
                vec![Scale(2), Status(st(true, 2))],
                false,
            ),
            (
                "resume without memory starts one",
                true,
                Some(0),
                None,
                vec![Scale(1), Status(st(true, 1))],
                false,
            ),
            (
                "running: the status follows the deployment",
                true,
                Some(3),
                Some(st(true, 2)),
                vec![Status(st(true, 3))],
                false,
            ),
            (
                "running and reported: nothing to do",
                true,
                Some(2),
                Some(st(true, 2)),
                vec![],
                false,
            ),
            (
                "missing deployment: not running, memory kept, look again",
                true,
                None,
                Some(st(true, 2)),
                vec![Status(st(false, 2))],
                true,
            ),
            (
                "missing deployment, already reported",
                false,
                None,
                Some(st(false, 2)),
                vec![],
                true,
            ),
            (
                "missing deployment, no status yet",
                false,
                None,
                None,
                vec![Status(st(false, 0))],
                true,
            ),
        ];
        for (name, enabled, replicas, status, want, requeue) in cases {
            let got = steps(enabled, replicas, status);
            assert_eq!(got.steps, want, "{name}");
            assert_eq!(got.requeue.is_some(), requeue, "{name}");
        }
    }

    fn group(
        autoscaling: bool,
        name: &str,
        min: Option<i32>,
        max: Option<i32>,
        role: NodeRole,
    ) -> ScalingGroupSpec {
        ScalingGroupSpec {
            autoscaling,
            autoscaler_group_name: name.into(),
            min,
            max,
            role,
            ..ScalingGroupSpec::default()
        }
    }

    #[test]
    fn arguments_follow_the_strategy_and_the_groups() {
        use NodeRole::{ControlPlane, Worker};
        let mut strategy = spec(true);
        strategy.autoscaler_extra_args = [("v", "2"), ("cloud-provider", "aws")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        // (name, groups, args, given, left out)
        type Case = (
            &'static str,
            Vec<(&'static str, ScalingGroupSpec)>,
            Vec<&'static str>,
            Vec<&'static str>,
            Vec<(&'static str, &'static str)>,
        );
        let cases: Vec<Case> = vec![
            (
                "no groups: the extra args alone",
                vec![],
                vec!["--cloud-provider=aws", "--v=2"],
                vec![],
                vec![],
            ),
            (
                "an autoscaled worker group, min unset is 0",
                vec![("workers", group(true, "asg-w", None, Some(5), Worker))],
                vec!["--cloud-provider=aws", "--nodes=0:5:asg-w", "--v=2"],
                vec!["workers"],
                vec![],
            ),
            (
                "groups without autoscaling are not mentioned",
                vec![
                    ("b", group(true, "asg-b", Some(1), Some(3), Worker)),
                    ("a", group(false, "asg-a", Some(1), Some(3), Worker)),
                ],
                vec!["--cloud-provider=aws", "--nodes=1:3:asg-b", "--v=2"],
                vec!["b"],
                vec![],
            ),
            (
                "control planes, unnamed and unbounded groups are left out, naming the field",
                vec![
                    ("cp", group(true, "asg-cp", Some(1), Some(3), ControlPlane)),
                    ("unnamed", group(true, "", Some(1), Some(3), Worker)),
                    ("unbounded", group(true, "asg-u", Some(1), None, Worker)),
                    ("w", group(true, "asg-w", Some(2), Some(9), Worker)),
                ],
                vec!["--cloud-provider=aws", "--nodes=2:9:asg-w", "--v=2"],
                vec!["w"],
                vec![
                    ("cp", "spec.role is ControlPlane, which is never autoscaled"),
                    ("unbounded", "spec.max is unset"),
                    ("unnamed", "spec.autoscalerGroupName is empty"),
                ],
            ),
        ];
        for (name, groups, args, given, left_out) in cases {
            let specs: Vec<_> = groups.iter().map(|(n, g)| (n.to_string(), g)).collect();
            let got = autoscaler_args(&strategy, &specs);
            assert_eq!(got.args, args, "{name}");
            assert_eq!(got.groups, given, "{name}");
            let left: Vec<(&str, &str)> = got
                .left_out
                .iter()
                .map(|(g, w)| (g.as_str(), w.as_str()))
                .collect();
            assert_eq!(left, left_out, "{name}");
        }
    }

    #[test]
    fn the_command_keeps_the_binary_and_sets_the_condition() {
        let strategy = spec(true);
        let given = AutoscalerArgs {
            args: vec!["--nodes=0:5:asg-w".into()],
            groups: vec!["workers".into()],
            left_out: vec![],
        };
        let d = AutoscalerDeployment {
            replicas: 1,
            container: Some(("ca".into(), vec!["/usr/local/bin/ca".into(), "--stale".into()])),
        };
        let facts = Facts {
            spec: &strategy,
            generation: Some(4),
            status: None,
            deployment: Some(&d),
            wanted: &given,
            now: now(),
        };
        let got = plan(&facts);
        assert_eq!(
            got.steps[0],
            Step::Command {
                container: "ca".into(),
                command: vec!["/usr/local/bin/ca".into(), "--nodes=0:5:asg-w".into()],
            }
        );
        let Step::Status(status) = &got.steps[1] else {
            panic!("a status step follows: {:?}", got.steps);
        };
        let c = &status.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            (CONFIGURED, "True", "Configured")
        );
        assert_eq!(c.observed_generation, Some(4));
        assert_eq!(c.message, "--nodes for ScalingGroups workers");

        // A container without a command gets the upstream image's binary.
        assert_eq!(
            command_line(&[], &given.args),
            [DEFAULT_BINARY, "--nodes=0:5:asg-w"]
        );

        // A group left out turns the condition False, naming the group and field.
        let partial = AutoscalerArgs {
            left_out: vec![("big".into(), "spec.max is unset".into())],
            ..given.clone()
        };
        let got = plan(&Facts {
            wanted: &partial,
            ..facts.clone()
        });
        let status = got.steps.iter().find_map(|s| match s {
            Step::Status(s) => Some(s),
            _ => None,
        });
        let c = &status.expect("a status step").conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "GroupsLeftOut"));
        assert_eq!(
            c.message,
            "left out of the autoscaler: ScalingGroup big: spec.max is unset; --nodes for ScalingGroups workers"
        );

        // Without a Deployment the condition names the field.
        let got = plan(&Facts {
            deployment: None,
            ..facts
        });
        let Step::Status(status) = &got.steps[0] else {
            panic!("a status step: {:?}", got.steps);
        };
        assert_eq!(status.conditions[0].reason, "DeploymentMissing");
        assert_eq!(
            status.conditions[0].message,
            "spec.deploymentName: Deployment kube-system/cluster-autoscaler not found"
        );
    }

    #[test]
    fn plans_are_idempotent() {
        // Carrying out a plan and planning again yields nothing to do.
        let wanted = AutoscalerArgs {
            args: vec!["--nodes=1:4:asg".into(), "--v=2".into()],
            groups: vec!["g".into()],
            left_out: vec![],
        };
        for (enabled, replicas, status) in [
            (false, 2, None),
            (false, 5, Some(st(false, 2))),
            (true, 0, Some(st(false, 3))),
            (true, 0, None),
            (true, 2, Some(st(false, 7))),
        ] {
            let strategy = spec(enabled);
            let mut d = deployment(replicas);
            let mut status = status;
            let first = plan(&Facts {
                spec: &strategy,
                generation: Some(1),
                status: status.as_ref(),
                deployment: Some(&d),
                wanted: &wanted,
                now: now(),
            });
            for step in first.steps {
                match step {
                    Step::Scale(n) => d.replicas = n,
                    Step::Status(s) => status = Some(s),
                    Step::Command { container, command } => d.container = Some((container, command)),
                }
            }
            let again = plan(&Facts {
                spec: &strategy,
                generation: Some(1),
                status: status.as_ref(),
                deployment: Some(&d),
                wanted: &wanted,
                now: Timestamp::from_second(2_000).expect("a time"),
            });
            assert!(again.steps.is_empty(), "{enabled} {replicas}: {:?}", again.steps);
        }
    }

    #[test]
    fn deployments_map_to_their_strategies() {
        let store: crate::runtime::store::Writer<AutoscalingStrategy> = crate::runtime::store::Writer::new();
        index_by_deployment(&store);
        let strategy = AutoscalingStrategy::new(
            "autoscaler",
            crate::api::update::AutoscalingStrategySpec {
                enabled: true,
                deployment_name: "cluster-autoscaler".into(),
                deployment_namespace: "kube-system".into(),
                autoscaler_extra_args: Default::default(),
            },
        );
        store.insert(ObjectKey::cluster("autoscaler"), std::sync::Arc::new(strategy));
        let mut d = Deployment::default();
        d.metadata.name = Some("cluster-autoscaler".into());
        d.metadata.namespace = Some("kube-system".into());
        assert_eq!(keys_for_deployment(&store, &d), [Key::cluster("autoscaler")]);
        d.metadata.namespace = Some("default".into());
        assert!(keys_for_deployment(&store, &d).is_empty());
    }
}
