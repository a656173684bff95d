//! Where a rollout one failure domain at a time stands (`status.domain`);
//! [`crate::rollout::domains`] decides it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The failure domains of a rollout with `spec.rollout.topologyKey`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainStatus {
    /// The Node label whose values are the domains.
    #[serde(default)]
    pub key: String,
    /// The domain whose nodes are replaced now; unset when none is (the
    /// rollout is complete, or waits for the control plane). Nodes without
    /// the label are the domain "".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    /// Since when the current domain is (for the rollout's trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime>,
    /// Domains with no outdated node left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub done: Vec<String>,
    /// Domains still to go after the current one, in the order they go.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<String>,
}
