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
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::App;
use crate::api::update::{AutoscalingStrategy, AutoscalingStrategyStatus};
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::leader::LeaderHandle;
use crate::runtime::manager::{Manager, Source, always};
use crate::runtime::store::{Key, ObjectKey, Store};

/// Index of AutoscalingStrategy stores: `namespace/name` of the Deployment.
pub const DEPLOYMENT_INDEX: &str = "deployment";
/// Replicas restored when none were remembered.
pub const DEFAULT_REPLICAS: i32 = 1;
/// How often a strategy whose Deployment is missing looks again.
pub const MISSING_REQUEUE: Duration = Duration::from_secs(30);

/// One write, in the order they must happen.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Patch the strategy's status.
    Status(AutoscalingStrategyStatus),
    /// Set the Deployment's `spec.replicas`.
    Scale(i32),
}

/// What a reconcile does: its writes and what it asks for next.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The writes, in order.
    pub steps: Vec<Step>,
    /// The Deployment is missing: look again later.
    pub requeue: Option<Duration>,
}

/// The writes that bring the Deployment and the status in line with `enabled`.
///
/// `deployment_replicas`: the Deployment's `spec.replicas` (None when the
/// Deployment does not exist). Pausing remembers the count first, then
/// scales; resuming scales first, then reports.
pub fn plan(
    enabled: bool,
    deployment_replicas: Option<i32>,
    status: Option<&AutoscalingStrategyStatus>,
) -> Plan {
    let prev = status.cloned().unwrap_or_default();
    let remembered = (prev.replicas > 0).then_some(prev.replicas);
    let Some(current) = deployment_replicas else {
        // Nothing to scale; the status says the autoscaler is not running and
        // keeps what it remembers.
        let next = AutoscalingStrategyStatus {
            enabled: false,
            replicas: prev.replicas,
        };
        return Plan {
            steps: status_step(&prev, status.is_some(), next),
            requeue: Some(MISSING_REQUEUE),
        };
    };
    let mut steps = Vec::new();
    if enabled {
        let target = if current > 0 {
            current
        } else {
            remembered.unwrap_or(DEFAULT_REPLICAS)
        };
        if current != target {
            steps.push(Step::Scale(target));
        }
        let next = AutoscalingStrategyStatus {
            enabled: true,
            replicas: target,
        };
        steps.extend(status_step(&prev, status.is_some(), next));
    } else {
        let remember = remembered.unwrap_or(current.max(0));
        let next = AutoscalingStrategyStatus {
            enabled: false,
            replicas: remember,
        };
        steps.extend(status_step(&prev, status.is_some(), next));
        if current != 0 {
            steps.push(Step::Scale(0));
        }
    }
    Plan { steps, requeue: None }
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

/// The Deployment's desired replicas (the API server's default is 1).
fn replicas_of(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1)
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

/// The AutoscalingStrategy controller: its strategies, and the autoscaler
/// Deployments they name (Deployments are few).
pub fn register(manager: &mut Manager, app: &App) {
    let mut c = manager.controller::<AutoscalingStrategy>("autoscalingstrategy", &app.objects);
    let strategies = c.store();
    let by_deployment = strategies.clone();
    let deployments = c.watches(&Source::all(), always(), move |d: &Deployment| {
        keys_for_deployment(&by_deployment, d)
    });
    c.on_failure(app.report_failures());
    c.register(AutoscalingStrategyReconciler::new(
        app.client.clone(),
        app.leader.clone(),
        strategies,
        deployments,
    ));
}

/// Reconciles AutoscalingStrategies (key: the strategy's name).
pub struct AutoscalingStrategyReconciler {
    client: Client,
    leader: LeaderHandle,
    deployments: Store<Deployment>,
}

impl AutoscalingStrategyReconciler {
    /// `deployments` must hold the autoscaler Deployments (a reflector of
    /// Deployments, possibly limited to their namespace). Adds the
    /// Deployment index to `strategies`, for [`keys_for_deployment`].
    pub fn new(
        client: Client,
        leader: LeaderHandle,
        strategies: Store<AutoscalingStrategy>,
        deployments: Store<Deployment>,
    ) -> Self {
        index_by_deployment(&strategies);
        AutoscalingStrategyReconciler {
            client,
            leader,
            deployments,
        }
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
        if !self.deployments.is_synced() {
            // "Missing" would be a guess until the first list arrived.
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let spec = &strategy.spec;
        let deployment = self.deployments.get(&ObjectKey::new(
            Some(&spec.deployment_namespace),
            &spec.deployment_name,
        ));
        let plan = plan(
            spec.enabled,
            deployment.as_deref().map(replicas_of),
            strategy.status.as_ref(),
        );
        let strategies: Api<AutoscalingStrategy> = Api::all(self.client.clone());
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &spec.deployment_namespace);
        let mut strategy_version = strategy.resource_version();
        for step in &plan.steps {
            match step {
                Step::Status(status) => {
                    // Conditioned on the version the plan was computed from:
                    // a remembered count is never replaced on a stale view.
                    // Explicit values: the type omits false and 0, which a
                    // merge patch would read as "leave as is".
                    let patch = json!({
                        "metadata": {"resourceVersion": strategy_version},
                        "status": {"enabled": status.enabled, "replicas": status.replicas},
                    });
                    let patched = strategies
                        .patch_status(
                            &strategy.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await?;
                    strategy_version = patched.resource_version();
                }
                Step::Scale(replicas) => {
                    let Some(d) = deployment.as_deref() else {
                        continue;
                    };
                    let patch = json!({
                        "metadata": {"resourceVersion": d.resource_version()},
                        "spec": {"replicas": replicas},
                    });
                    self.leader.ensure_leader()?;
                    deployments
                        .patch(&d.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                    tracing::info!(
                        strategy = %strategy.name_any(),
                        deployment = %format!("{}/{}", spec.deployment_namespace, spec.deployment_name),
                        replicas,
                        "scaled the autoscaler"
                    );
                }
            }
        }
        Ok(plan.requeue.map_or(Action::Done, Action::RequeueAfter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(enabled: bool, replicas: i32) -> AutoscalingStrategyStatus {
        AutoscalingStrategyStatus { enabled, replicas }
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
        for (name, enabled, replicas, status, steps, requeue) in cases {
            let got = plan(enabled, replicas, status.as_ref());
            assert_eq!(got.steps, steps, "{name}");
            assert_eq!(got.requeue.is_some(), requeue, "{name}");
        }
    }

    #[test]
    fn plans_are_idempotent() {
        // Carrying out a plan and planning again yields nothing to do.
        for (enabled, replicas, status) in [
            (false, 2, None),
            (false, 5, Some(st(false, 2))),
            (true, 0, Some(st(false, 3))),
            (true, 0, None),
            (true, 2, Some(st(false, 7))),
        ] {
            let first = plan(enabled, Some(replicas), status.as_ref());
            let (mut replicas, mut status) = (replicas, status);
            for step in first.steps {
                match step {
                    Step::Scale(n) => replicas = n,
                    Step::Status(s) => status = Some(s),
                }
            }
            let again = plan(enabled, Some(replicas), status.as_ref());
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
