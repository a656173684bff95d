//! The NodeVersion controller of an operator started without a cloud: it
//! cannot replace nodes, so every NodeVersion says so in its conditions
//! (and once in an Event) instead of being ignored in silence.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use super::{App, event, spawn_event};
use crate::api::conditions::set_condition;
use crate::api::update::{NodeVersion, condition, reason};
use crate::error::{Error, Result};
use crate::runtime::controller::{Action, Reconciler};
use crate::runtime::manager::Manager;
use crate::runtime::store::Key;

/// What the conditions say while no cloud is configured.
pub const MESSAGE: &str = "no cloud provider is configured: nodewarden runs without --cloud \
    (aws or sim), so nodes of this NodeVersion are not replaced; restart it with a cloud \
    (manifests/aws or manifests/sim)";

/// Registers the controller; only for an operator without a cloud.
pub fn register(manager: &mut Manager, app: &App) {
    let mut c = manager.controller::<NodeVersion>("nodeversion", &app.objects);
    c.on_failure(app.report_failures());
    c.register(NoCloudReconciler {
        client: app.client.clone(),
        recorder: app.recorder.clone(),
    });
}

/// Progressing=False and Degraded=True, both for the reason NoCloudProvider.
/// Returns None when `existing` says so already (nothing to write).
pub fn no_cloud_conditions(
    existing: &[Condition],
    generation: Option<i64>,
    now: Timestamp,
) -> Option<Vec<Condition>> {
    let mut conditions = existing.to_vec();
    for (type_, status) in [(condition::PROGRESSING, false), (condition::DEGRADED, true)] {
        set_condition(
            &mut conditions,
            type_,
            status,
            reason::NO_CLOUD_PROVIDER,
            MESSAGE,
            generation,
            now,
        );
    }
    (conditions != existing).then_some(conditions)
}

/// `conditions` as Constellation's CLI needs them: exactly one, Outdated
/// (the one there, or Unknown for reason NoCloudProvider).
pub fn upstream_conditions(
    conditions: &[Condition],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    match conditions.iter().find(|c| c.type_ == condition::OUTDATED) {
        Some(outdated) => vec![outdated.clone()],
        None => vec![Condition {
            type_: condition::OUTDATED.to_string(),
            status: "Unknown".to_string(),
            reason: reason::NO_CLOUD_PROVIDER.to_string(),
            message: MESSAGE.to_string(),
            observed_generation: generation,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        }],
    }
}

/// Writes the NoCloudProvider conditions on every NodeVersion.
pub struct NoCloudReconciler {
    client: Client,
    recorder: Recorder,
}

impl Reconciler for NoCloudReconciler {
    type Object = NodeVersion;
    type Error = Error;

    async fn reconcile(&self, _key: &Key<NodeVersion>, nv: Option<Arc<NodeVersion>>) -> Result<Action> {
        let Some(nv) = nv else {
            return Ok(Action::Done);
        };
        let status = nv.status.clone().unwrap_or_default();
        let existing = status.rollout_conditions;
        let now = Timestamp::now();
        // Constellation's CLI reads exactly one condition: only Outdated
        // stays in `conditions` (an older nodewarden wrote more there), and
        // a NodeVersion without one gets it, Unknown (nothing compares nodes).
        let upstream = upstream_conditions(&status.conditions, nv.metadata.generation, now);
        let rollout = no_cloud_conditions(&existing, nv.metadata.generation, now);
        if rollout.is_none() && upstream == status.conditions {
            return Ok(Action::Done);
        }
        let conditions = rollout.unwrap_or_else(|| existing.clone());
        let first = !existing.iter().any(|c| c.reason == reason::NO_CLOUD_PROVIDER);
        Api::<NodeVersion>::all(self.client.clone())
            .patch_status(
                &nv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"rolloutConditions": conditions, "conditions": upstream}})),
            )
            .await?;
        if first {
            let event = event(EventType::Warning, reason::NO_CLOUD_PROVIDER, "Rollout", MESSAGE);
            spawn_event(&self.recorder, event, nv.object_ref(&()));
        }
        Ok(Action::Done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(seconds).expect("a timestamp")
    }

    #[test]
    fn constellations_cli_finds_exactly_one_condition_without_a_cloud() {
        let fresh = upstream_conditions(&[], Some(2), at(5));
        assert_eq!(fresh.len(), 1);
        assert_eq!(
            (
                fresh[0].type_.as_str(),
                fresh[0].status.as_str(),
                fresh[0].reason.as_str()
            ),
            (condition::OUTDATED, "Unknown", reason::NO_CLOUD_PROVIDER)
        );
        let mut older = fresh.clone();
        older[0].status = "True".into();
        older.push(Condition {
            type_: condition::PROGRESSING.into(),
            ..older[0].clone()
        });
        let kept = upstream_conditions(&older, Some(3), at(9));
        assert_eq!(
            kept,
            vec![older[0].clone()],
            "the Outdated there is kept, the rest dropped"
        );
    }

    #[test]
    fn conditions_say_why_nothing_moves_and_are_written_once_per_generation() {
        let set = no_cloud_conditions(&[], Some(1), at(10)).expect("written the first time");
        let by_type = |cs: &[Condition], t: &str| {
            cs.iter()
                .find(|c| c.type_ == t)
                .map(|c| (c.status.clone(), c.reason.clone(), c.observed_generation))
        };
        let no_cloud = reason::NO_CLOUD_PROVIDER.to_string();
        assert_eq!(
            by_type(&set, condition::PROGRESSING),
            Some(("False".into(), no_cloud.clone(), Some(1)))
        );
        assert_eq!(
            by_type(&set, condition::DEGRADED),
            Some(("True".into(), no_cloud.clone(), Some(1)))
        );
        // Same generation later: nothing to write.
        assert_eq!(no_cloud_conditions(&set, Some(1), at(20)), None);
        // A new generation: written again with it.
        let next = no_cloud_conditions(&set, Some(2), at(30)).expect("a new generation is written");
        assert_eq!(
            by_type(&next, condition::DEGRADED),
            Some(("True".into(), no_cloud, Some(2)))
        );
    }
}
