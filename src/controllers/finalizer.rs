//! Finalizers, written one way by every controller that holds one.
//!
//! A write sends the object's whole finalizer list in a merge patch that
//! carries the resourceVersion the object was read at: the API server
//! refuses it (409) when the object changed since, so a write made on a
//! stale read can never drop a finalizer someone else added meanwhile (a
//! merge patch replaces a list whole). The caller's client is the fenced one
//! (`App::client`): a replica that does not lead writes nothing.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::error::Result;

/// Does `obj` hold `finalizer`?
pub fn holds<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|f| f == finalizer)
}

/// `finalizers` with `finalizer` appended, unless it is there already.
pub fn with(finalizers: &[String], finalizer: &str) -> Vec<String> {
    let mut list = finalizers.to_vec();
    if !list.iter().any(|f| f == finalizer) {
        list.push(finalizer.to_string());
    }
    list
}

/// `finalizers` without any of `gone`, the others kept in their order.
pub fn without(finalizers: &[String], gone: &[&str]) -> Vec<String> {
    finalizers
        .iter()
        .filter(|f| !gone.contains(&f.as_str()))
        .cloned()
        .collect()
}

/// The merge patch that sets the finalizer list to `finalizers`, conditioned
/// on `resource_version` (the version the list was computed from).
pub fn list_patch(finalizers: &[String], resource_version: Option<String>) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": resource_version }
    })
}

/// Sets `obj`'s finalizers to `finalizers`, conditioned on the version `obj`
/// was read at.
pub async fn replace<K>(api: &Api<K>, obj: &K, finalizers: &[String]) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    patch_list(api, obj, finalizers).await?;
    Ok(())
}

/// Adds `finalizer` to `obj` as read. The update comes back through the
/// watch, so the caller's reconcile runs again on the object that holds it.
pub async fn add<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    replace(api, obj, &with(obj.finalizers(), finalizer)).await
}

/// Removes `finalizer` from `obj` as read; an object already gone has
/// nothing left to remove.
pub async fn remove<K>(api: &Api<K>, obj: &K, finalizer: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    match patch_list(api, obj, &without(obj.finalizers(), &[finalizer])).await {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The one write: the list as a merge patch on `obj`'s resourceVersion.
async fn patch_list<K>(api: &Api<K>, obj: &K, finalizers: &[String]) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = list_patch(finalizers, obj.resource_version());
    api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn adding_appends_once() {
        // (held, added, the list written)
        let table: &[(&[&str], &str, &[&str])] = &[
            (&[], "a.io/f", &["a.io/f"]),
            (&["other.io/keep"], "a.io/f", &["other.io/keep", "a.io/f"]),
            (
                &["a.io/f", "other.io/keep"],
                "a.io/f",
                &["a.io/f", "other.io/keep"],
            ),
        ];
        for (held, added, want) in table {
            assert_eq!(with(&list(held), added), list(want), "{held:?} + {added}");
        }
    }

    #[test]
    fn removing_keeps_everyone_elses_in_order() {
        // (held, removed, the list written)
        let table: &[(&[&str], &[&str], &[&str])] = &[
            (&["a.io/f"], &["a.io/f"], &[]),
            (
                &["x.io/1", "a.io/f", "y.io/2"],
                &["a.io/f"],
                &["x.io/1", "y.io/2"],
            ),
            (&["x.io/1"], &["a.io/f"], &["x.io/1"]),
            (
                &["a.io/f", "b.io/g", "x.io/1"],
                &["a.io/f", "b.io/g"],
                &["x.io/1"],
            ),
            (&[], &["a.io/f"], &[]),
        ];
        for (held, gone, want) in table {
            assert_eq!(without(&list(held), gone), list(want), "{held:?} - {gone:?}");
        }
    }

    #[test]
    fn the_patch_carries_the_whole_list_and_the_version_read() {
        assert_eq!(
            list_patch(&list(&["x.io/1", "a.io/f"]), Some("42".into())),
            json!({"metadata": {"finalizers": ["x.io/1", "a.io/f"], "resourceVersion": "42"}})
        );
        // An emptied list is written as empty, not left out (a merge patch
        // keeps what it does not name).
        assert_eq!(
            list_patch(&[], Some("7".into())),
            json!({"metadata": {"finalizers": [], "resourceVersion": "7"}})
        );
    }

    #[test]
    fn holding_is_by_exact_name() {
        let mut plan = crate::api::plan::Plan::new("p", Default::default());
        plan.metadata.finalizers = Some(list(&["nodewarden.dev/plan"]));
        assert!(holds(&plan, "nodewarden.dev/plan"));
        assert!(!holds(&plan, "nodewarden.dev/pla"));
        assert!(!holds(
            &crate::api::plan::Plan::new("q", Default::default()),
            "nodewarden.dev/plan"
        ));
    }
}
