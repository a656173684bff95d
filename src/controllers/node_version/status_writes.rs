//! Each NodeVersion's last status write, kept while the store catches up.

use std::collections::HashMap;

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::api::update::{NodeVersion, NodeVersionStatus};
use crate::runtime::store::Key;
use crate::runtime::workqueue::WorkQueue;

/// Each NodeVersion's last status write, carried out while the next pass
/// runs: a pass that waited for its write held up the next one (a write takes
/// 5 to 20 ms, and every step of a replacement waits for a pass). Passes of
/// one NodeVersion never overlap, and each waits for the last write before
/// its own, so writes land in order. A failed write queues the NodeVersion
/// again, whose next pass writes the status anew.
///
/// A pass builds on the status last written, not on the store's copy while
/// the store has not caught up with that write: built on a copy one write
/// behind, conditions took their transition times from it, each pass undid
/// the last one's, and every write woke the next pass (dozens of writes a
/// second, while nothing changed, in a rollout's busiest moments).
#[derive(Default)]
pub struct StatusWrites(std::sync::Mutex<HashMap<String, StatusWrite>>);

struct StatusWrite {
    status: NodeVersionStatus,
    state: WriteState,
}

enum WriteState {
    /// Being written; the task answers the resourceVersion written.
    InFlight(tokio::task::JoinHandle<Option<String>>),
    /// Written as this resourceVersion, at this time.
    Written(String, std::time::Instant),
}

/// How long a status written is preferred to a store that does not show it
/// yet (a watch lagging longer than this is no longer a lag).
const STORE_CATCHES_UP: std::time::Duration = std::time::Duration::from_secs(5);

impl StatusWrites {
    /// The status `nv` has now as far as this replica knows: its last write
    /// (once landed) while the store does not show it yet, else the store's.
    pub(super) async fn latest(&self, nv: &NodeVersion) -> NodeVersionStatus {
        let name = nv.name_any();
        let last = crate::runtime::sync::lock(&self.0).remove(&name);
        let Some(mut last) = last else {
            return nv.status_or_default();
        };
        if let WriteState::InFlight(task) = last.state {
            match task.await {
                Ok(Some(rv)) => last.state = WriteState::Written(rv, std::time::Instant::now()),
                _ => return nv.status_or_default(),
            }
        }
        match &last.state {
            WriteState::Written(rv, at)
                if nv.metadata.resource_version.as_ref() != Some(rv) && at.elapsed() < STORE_CATCHES_UP =>
            {
                let status = last.status.clone();
                crate::runtime::sync::lock(&self.0).insert(name, last);
                status
            }
            _ => nv.status_or_default(),
        }
    }

    /// Records a status written as `resource_version`.
    pub(super) fn written(&self, name: &str, status: NodeVersionStatus, resource_version: Option<String>) {
        if let Some(rv) = resource_version {
            let state = WriteState::Written(rv, std::time::Instant::now());
            crate::runtime::sync::lock(&self.0).insert(name.to_string(), StatusWrite { status, state });
        }
    }

    /// Writes `status` onto `nv` in the background (`base`: the status it
    /// was built on).
    pub(super) fn start(
        &self,
        client: Client,
        queue: &WorkQueue<Key<NodeVersion>>,
        nv: &NodeVersion,
        (base, status): (&NodeVersionStatus, NodeVersionStatus),
    ) {
        let name = nv.name_any();
        let (queue, key) = (queue.clone(), Key::<NodeVersion>::cluster(&name));
        let patch = json!({"status": merge_patch(base, &status)});
        let write_name = name.clone();
        let task = tokio::spawn(async move {
            let api: Api<NodeVersion> = Api::all(client);
            match api
                .patch_status(&write_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(written) => written.metadata.resource_version,
                Err(e) => {
                    tracing::warn!(nodeversion = %write_name, error = %e, "writing the rollout's status failed; looking again");
                    queue.add(key);
                    None
                }
            }
        });
        let state = WriteState::InFlight(task);
        crate::runtime::sync::lock(&self.0).insert(name, StatusWrite { status, state });
    }
}

/// `status` as a merge patch over `base`: a field `base` has and `status`
/// leaves out (an emptied list, a halt record gone or a field of it) is sent
/// as null, at every depth, since a merge patch keeps every field it does
/// not name.
fn merge_patch(base: &NodeVersionStatus, status: &NodeVersionStatus) -> serde_json::Value {
    let mut after = serde_json::to_value(status).unwrap_or_default();
    if let Ok(before) = serde_json::to_value(base) {
        clear_left_out(&before, &mut after);
    }
    after
}

/// Sets to null each field of `before` that `after` leaves out (objects
/// only: a merge patch replaces arrays whole).
fn clear_left_out(before: &serde_json::Value, after: &mut serde_json::Value) {
    let (serde_json::Value::Object(before), serde_json::Value::Object(fields)) = (before, after) else {
        return;
    };
    for (key, was) in before {
        match fields.get_mut(key) {
            Some(now) => clear_left_out(was, now),
            None => {
                fields.insert(key.clone(), serde_json::Value::Null);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_the_new_status_leaves_out_is_cleared() {
        let base: NodeVersionStatus = serde_json::from_value(json!({
            "outdated": [{"kind": "Node", "name": "a"}],
            "budget": 1,
            "halt": {"target": "img", "failedJoins": ["x"]},
        }))
        .expect("a status");
        let after: NodeVersionStatus = serde_json::from_value(json!({"budget": 2})).expect("a status");
        assert_eq!(
            merge_patch(&base, &after),
            json!({"budget": 2, "outdated": null, "halt": null, "activeclusterversionupgrade": false, "conditions": []}),
        );
        // Within an object kept: its fields left out are cleared too.
        let resumed: NodeVersionStatus =
            serde_json::from_value(json!({"budget": 1, "halt": {"target": "img", "forgiven": ["x"]}}))
                .expect("a status");
        assert_eq!(
            merge_patch(&base, &resumed)["halt"],
            json!({"target": "img", "forgiven": ["x"], "failedJoins": null}),
        );
    }

    #[tokio::test]
    async fn a_pass_builds_on_the_status_last_written_until_the_store_shows_it() {
        let nv_at = |rv: &str, budget: u32| -> NodeVersion {
            let mut nv: NodeVersion = serde_json::from_value(json!({
                "apiVersion": "update.edgeless.systems/v1alpha1",
                "kind": "NodeVersion",
                "metadata": {"name": "v", "resourceVersion": rv},
                "spec": {"image": "img"},
            }))
            .expect("a NodeVersion");
            nv.status = Some(NodeVersionStatus {
                budget,
                ..Default::default()
            });
            nv
        };
        let writes = StatusWrites::default();
        assert_eq!(
            writes.latest(&nv_at("1", 1)).await.budget,
            1,
            "nothing written: the store's"
        );
        let ours = NodeVersionStatus {
            budget: 7,
            ..Default::default()
        };
        writes.written("v", ours, Some("2".into()));
        assert_eq!(
            writes.latest(&nv_at("1", 1)).await.budget,
            7,
            "the store is a write behind: ours"
        );
        assert_eq!(
            writes.latest(&nv_at("2", 7)).await.budget,
            7,
            "the store shows our write"
        );
        assert_eq!(
            writes.latest(&nv_at("1", 1)).await.budget,
            1,
            "once the store caught up, it is the store's again"
        );
    }
}
