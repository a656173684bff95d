//! AutoscalingStrategy: whether the cluster-autoscaler may run, and its
//! command line. The rollout pauses it (enabled=false scales its Deployment
//! to 0) while any node is not up to date, so it cannot fight the replacement
//! over group sizes. As in Constellation, the strategy owns the command of the
//! Deployment's first container: the binary, `autoscalerExtraArgs`, and one
//! `--nodes=min:max:name` per autoscaled worker ScalingGroup.

// kube's printcolumn(...) entries repeat keys such as type_ by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The cluster-autoscaler Deployment and whether it should run.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "AutoscalingStrategy",
    doc = "Whether the cluster-autoscaler may run (paused while nodes are replaced)",
    plural = "autoscalingstrategies",
    status = "AutoscalingStrategyStatus",
    printcolumn(name = "Deployment", type_ = "string", json_path = ".spec.deploymentName"),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.deploymentNamespace",
        priority = "1"
    ),
    printcolumn(
        name = "Enabled",
        type_ = "boolean",
        json_path = ".spec.enabled",
        description = "whether the autoscaler should run"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.replicas",
        description = "the autoscaler Deployment's replicas"
    ),
    printcolumn(
        name = "Configured",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"AutoscalerConfigured\")].status",
        description = "whether the autoscaler's command line is what the strategy and the ScalingGroups ask for"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStrategySpec {
    /// Whether the cluster-autoscaler should run (1 replica) or not (0).
    pub enabled: bool,
    /// The cluster-autoscaler's Deployment.
    #[x_kube(validation = kube::core::Rule::new("self != ''")
        .message("spec.deploymentName must not be empty"))]
    pub deployment_name: String,
    /// The namespace of that Deployment.
    #[x_kube(validation = kube::core::Rule::new("self != ''")
        .message("spec.deploymentNamespace must not be empty"))]
    pub deployment_namespace: String,
    /// Extra `--key=value` arguments for the cluster-autoscaler (keys are flag
    /// names without dashes; `--nodes` comes from the ScalingGroups).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = kube::core::Rule::new("self.all(k, k != '' && !k.startsWith('-') && k != 'nodes')")
        .message("spec.autoscalerExtraArgs: keys are flag names without leading dashes, and --nodes comes from the ScalingGroups"))]
    pub autoscaler_extra_args: BTreeMap<String, String>,
}

/// What the autoscaling strategy controller last saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStrategyStatus {
    /// Whether the cluster-autoscaler is running.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enabled: bool,
    /// The cluster-autoscaler Deployment's replicas.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub replicas: i32,
    /// `AutoscalerConfigured`: whether the Deployment runs the command line
    /// asked for, naming any ScalingGroup left out and the field why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

impl AutoscalingStrategySpec {
    /// The autoscaler's command-line arguments from `autoscalerExtraArgs`, as
    /// `--key=value`, in key order (stable, so the Deployment is not
    /// rewritten for nothing).
    pub fn extra_args(&self) -> Vec<String> {
        self.autoscaler_extra_args
            .iter()
            .map(|(k, v)| format!("--{k}={v}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spec_parses_and_renders_arguments_in_order() {
        let spec: AutoscalingStrategySpec = serde_json::from_value(json!({
            "enabled": true,
            "deploymentName": "cluster-autoscaler",
            "deploymentNamespace": "kube-system",
            "autoscalerExtraArgs": {"v": "2", "cloud-provider": "gce", "logtostderr": "true"},
        }))
        .expect("parses");
        assert_eq!(
            spec.extra_args(),
            ["--cloud-provider=gce", "--logtostderr=true", "--v=2"]
        );
    }

    #[test]
    fn status_omits_zero_values_like_go() {
        let json = serde_json::to_value(AutoscalingStrategyStatus::default()).expect("serializable");
        assert_eq!(json, json!({}));
        let json = serde_json::to_value(AutoscalingStrategyStatus {
            enabled: true,
            replicas: 1,
            conditions: Vec::new(),
        })
        .expect("serializable");
        assert_eq!(json, json!({"enabled": true, "replicas": 1}));
    }
}
