//! One controller per file; each splits pure decisions from thin IO.

pub mod autoscaling_strategy;
pub mod joining_node;
pub mod node_maintenance;
pub mod node_version;
pub mod pending_node;
pub mod replacement_trace;
pub mod rollout;
pub mod scaling_group;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};

/// Is the Node's Ready condition True?
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Deletes `name`; an object that is already gone counts as deleted.
/// Returns whether this call deleted it (false: it was gone already).
pub async fn delete_if_present<K>(
    api: &Api<K>,
    name: &str,
    params: &DeleteParams,
) -> crate::error::Result<bool>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}
