//! Constellation's README examples of its node operator's kinds
//! (`manifests/samples/update-*.yaml`): their names are fixed and
//! cluster-wide, so the tests that apply them take turns ([`lock`]); a
//! sample is applied unchanged but for its placeholders, then given the
//! test's run label so that only the test's operator acts on it.

use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::Duration;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use nodewarden::api::update::{AutoscalingStrategy, JoiningNode, NodeVersion, PendingNode, ScalingGroup};
use serde_json::json;

use super::{Probe, RUN_LABEL, TestEnv, seen, wait_for};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Held by every test that applies a sample, for as long as its objects live.
pub fn lock() -> &'static tokio::sync::Mutex<()> {
    static LOCK: LazyLock<tokio::sync::Mutex<()>> = LazyLock::new(|| tokio::sync::Mutex::new(()));
    &LOCK
}

/// The path of `manifests/samples/<file>`.
pub fn path(file: &str) -> PathBuf {
    crate::repo().join("manifests/samples").join(file)
}

/// The dynamic API of one of the group's kinds.
pub fn dynamic_api(client: &Client, kind: &str) -> Api<DynamicObject> {
    let ar = match kind {
        "NodeVersion" => ApiResource::erase::<NodeVersion>(&()),
        "ScalingGroup" => ApiResource::erase::<ScalingGroup>(&()),
        "PendingNode" => ApiResource::erase::<PendingNode>(&()),
        "AutoscalingStrategy" => ApiResource::erase::<AutoscalingStrategy>(&()),
        "JoiningNode" => ApiResource::erase::<JoiningNode>(&()),
        other => panic!("kind {other} is not in update.edgeless.systems"),
    };
    Api::all_with(client.clone(), &ar)
}

/// Deletes `name` and waits until it is gone.
pub async fn delete_and_wait(api: &Api<DynamicObject>, name: &str) {
    let _ = api.delete(name, &DeleteParams::default()).await;
    wait_for(&format!("{name} to be gone"), TIMEOUT, || async {
        match api.get_opt(name).await {
            Ok(None) => Probe::Done(()),
            Ok(Some(_)) => Probe::NotYet("still there".into()),
            Err(e) => Probe::NotYet(seen(e)),
        }
    })
    .await;
}

/// Applies the sample `file` with its placeholders replaced by `fills`
/// (strict validation: a field the CRD lacks fails it), labelled for the
/// test; returns (kind, name). Hold [`lock`] meanwhile.
pub async fn apply(env: &TestEnv, file: &str, fills: &[(&str, &str)]) -> (String, String) {
    let mut text = std::fs::read_to_string(path(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    for (placeholder, value) in fills {
        text = text.replace(placeholder, value);
    }
    assert!(
        !text.contains('<'),
        "{file}: a placeholder left unfilled:\n{text}"
    );
    let sample: DynamicObject = serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let kind = sample.types.as_ref().map(|t| t.kind.clone()).unwrap_or_default();
    let name = sample.name_any();
    let api = dynamic_api(&env.client, &kind);
    delete_and_wait(&api, &name).await; // left over from an interrupted run
    let params = PatchParams::apply("nodewarden-samples").validation_strict();
    api.patch(&name, &params, &Patch::Apply(&sample))
        .await
        .unwrap_or_else(|e| panic!("{file} must apply unchanged: {e}"));
    let label = json!({"metadata": {"labels": {RUN_LABEL: env.id}}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap_or_else(|e| panic!("labelling {file}'s {kind} {name}: {e}"));
    (kind, name)
}
