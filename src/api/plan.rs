//! Plan: an in-place upgrade of the nodes a selector picks, one Job per node
//! (the System Upgrade Controller's API, `upgrade.cattle.io/v1`, with its JSON
//! names, so existing Plans apply unchanged).
//!
//! Beyond upstream: every bad spec upstream only logs is rejected at
//! admission (CEL) where a rule can say it, conditions carry
//! observedGeneration, and the status names, per applying node, the phase it
//! is in and since when.

// kube's printcolumn(...) entries repeat keys such as type_ by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvFromSource, EnvVar, LocalObjectReference, SecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The label on a Node that records the plan hash last applied to it
/// (`disabled`: never apply this plan here).
pub fn node_label(plan: &str) -> String {
    format!("plan.upgrade.cattle.io/{plan}")
}

/// Value of [`node_label`] that opts a node out of the plan.
pub const DISABLED: &str = "disabled";

/// A Go duration such as `90s`, `1m30s` or `2h` (no sign: negative delays are rejected).
const DURATION: &str = "^([0-9]+(\\\\.[0-9]+)?(ns|us|ms|s|m|h))+$";

/// An upgrade to apply to every node `nodeSelector` picks, at most `concurrency` at once.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "upgrade.cattle.io",
    version = "v1",
    kind = "Plan",
    doc = "An in-place upgrade applied node by node through Jobs",
    plural = "plans",
    namespaced,
    status = "PlanStatus",
    // Upstream's columns first, in its order (scripts read them by position).
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.upgrade.image"),
    printcolumn(name = "Channel", type_ = "string", json_path = ".spec.channel"),
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(
        name = "Complete",
        type_ = "string",
        json_path = ".status.conditions[?(@.type=='Complete')].status"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        json_path = ".status.conditions[?(@.message!='')].message"
    ),
    printcolumn(
        name = "Applying",
        type_ = "string",
        priority = "10",
        json_path = ".status.applying"
    ),
    printcolumn(
        name = "Upgraded",
        type_ = "string",
        json_path = ".status.progress",
        description = "nodes on the latest hash / nodes selected"
    ),
    printcolumn(
        name = "Latest",
        type_ = "string",
        priority = "1",
        json_path = ".status.latestVersion",
        description = "the version resolved (the channel's answer, or spec.version)"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = kube::core::Rule::new("(has(self.version) && self.version != '') || (has(self.channel) && self.channel != '')").message("cannot resolve plan: missing channel and version"))]
#[serde(rename_all = "camelCase")]
pub struct PlanSpec {
    /// The most nodes applying this plan at once (unset or 0: none starts, as upstream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self >= 0").message("spec.concurrency must not be negative"))]
    pub concurrency: Option<i64>,
    /// Which nodes the plan applies to (nodes also need `kubernetes.io/hostname`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// The ServiceAccount of the Job pods (the namespace's default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// A URL answering 302 whose Location's last path element is the version
    /// (`+` becomes `-`); polled while `version` is unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = kube::core::Rule::new("self == '' || self.startsWith('http://') || self.startsWith('https://')").message("spec.channel must be an http(s) URL"))]
    pub channel: Option<String>,
    /// The version to apply; when set the channel is not polled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Secrets mounted into the Job pods; their contents are part of the plan's hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretSpec>,
    /// A container run before the upgrade one (an init container of the Job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepare: Option<ContainerSpec>,
    /// The upgrade container; must be specified.
    pub upgrade: ContainerSpec,
    /// Cordon the node before the upgrade (implied by `drain`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordon: Option<bool>,
    /// Drain the node before the upgrade (nodewarden's drain: PodDisruptionBudgets honoured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
    /// Taints the Job pods tolerate, besides `node.kubernetes.io/unschedulable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// PriorityClass of the Job pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Pull secrets of the Job pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// activeDeadlineSeconds of the Jobs (0: none; unset: the operator's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_active_deadline_secs: Option<i64>,
    /// Exclusive plans never apply at the same time as each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive: Option<bool>,
    /// When new nodes may start (a running Job is not interrupted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowSpec>,
    /// Wait this long after a node completes before starting the next (Go duration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    #[x_kube(validation = kube::core::Rule::new("!self.startsWith('-')").message("spec.postCompleteDelay is negative"))]
    #[x_kube(validation = kube::core::Rule::new(format!("self.startsWith('-') || self.matches('{DURATION}')")).message("spec.postCompleteDelay must be a duration such as 30s or 5m"))]
    pub post_complete_delay: Option<String>,
    /// Labels set on a node when its upgrade succeeded; values may use
    /// `$(LATEST_VERSION)` and `$(LATEST_HASH)`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub post_complete_labels: BTreeMap<String, String>,
}

/// A Secret mounted into the Job pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretSpec {
    /// The Secret, in the plan's namespace.
    pub name: String,
    /// Where it is mounted in the containers.
    pub path: String,
    /// Leave its contents out of the hash: a change does not re-run the plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_updates: Option<bool>,
    /// File mode of the mounted keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<i32>,
}

/// A container of the Job: an image without a tag runs the plan's version as tag.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerSpec {
    /// The image.
    pub image: String,
    /// Its entrypoint.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub envs: Vec<EnvVar>,
    /// Environment from ConfigMaps and Secrets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_from: Vec<EnvFromSource>,
    /// Host paths mounted into the container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeSpec>,
    /// Replaces the default (privileged, CAP_SYS_BOOT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<SecurityContext>,
}

/// A host path mounted into a container.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSpec {
    /// The volume's name in the pod.
    pub name: String,
    /// The path on the host.
    pub source: String,
    /// Where it is mounted in the container.
    pub destination: String,
}

/// How to drain a node before its upgrade (kubectl drain's options).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[x_kube(validation = kube::core::Rule::new("!(has(self.deleteEmptydirData) && has(self.deleteLocalData))").message("spec.drain cannot specify both deleteEmptydirData and deleteLocalData"))]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// A drain not done after this long fails: nanoseconds, or a Go duration
    /// string. The plan then reports the pods and PodDisruptionBudgets that
    /// block it and starts no other node; the drain goes on, and when it
    /// finishes the plan continues (upstream's Job retries its drain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<IntOrString>,
    /// Termination grace period of evicted pods, in seconds (kubectl's default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<i32>,
    /// Evict pods with emptyDir volumes (their data is lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_emptydir_data: Option<bool>,
    /// The older name of deleteEmptydirData.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_local_data: Option<bool>,
    /// Leave DaemonSet pods in place (they would come straight back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_daemon_sets: Option<bool>,
    /// Also evict pods no controller manages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub force: Option<bool>,
    /// Delete instead of evict (bypasses PodDisruptionBudgets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_eviction: Option<bool>,
    /// kubectl's skip-wait-for-delete-timeout, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_wait_for_delete_timeout: Option<i64>,
    /// Only pods this selects are drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
}

/// When new nodes may start.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowSpec {
    /// Days of the week (`mon`, `monday`, `1`, ...); none: the window never
    /// opens (kured's meaning, which upstream uses).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "weekdays")]
    pub days: Vec<String>,
    /// Start of the window, e.g. `22:00`, `22` or `10pm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = kube::core::Rule::new(format!("self.matches('{TIME_OF_DAY}')")).message("spec.window.startTime must be a time of day such as 22:00, 22:00:00, 22 or 10pm"))]
    pub start_time: Option<String>,
    /// End of the window (before the start: the window spans midnight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = kube::core::Rule::new(format!("self.matches('{TIME_OF_DAY}')")).message("spec.window.endTime must be a time of day such as 06:00, 06:00:00, 6 or 6am"))]
    pub end_time: Option<String>,
    /// IANA time zone of the window (UTC when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
}

/// Window days: at most 7 of the names kured knows (any case). Checked by
/// a rule, not an enum, so a bad day is refused with its own message alone
/// (a schema error would skip the Plan's other rules and say so too).
fn weekdays(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "maxItems": 7,
        "items": {
            "type": "string",
            "maxLength": 16,
            "x-kubernetes-validations": [{
                "rule": "self.lowerAscii() in ['', '0', 'su', 'sun', 'sunday', '1', 'mo', 'mon', 'monday', '2', 'tu', 'tue', 'tuesday', '3', 'we', 'wed', 'wednesday', '4', 'th', 'thu', 'thursday', '5', 'fr', 'fri', 'friday', '6', 'sa', 'sat', 'saturday']",
                "message": "spec.window.days: Invalid weekday (sunday to saturday, su, sun or 0 to 6)"
            }]
        }
    })
}

/// 24-hour `H:MM[:SS]` or 12-hour `H[:MM][am|pm]`.
const TIME_OF_DAY: &str = "^(([01]?[0-9]|2[0-3])(:[0-5][0-9](:[0-5][0-9])?)?|(0?[0-9]|1[0-2])(am|pm)|(0[0-9]|1[0-2]):[0-5][0-9](am|pm))$";

/// What the plan controller last saw and did.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlanStatus {
    /// The version resolved from `version` or the channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_version: Option<String>,
    /// The hash nodes are labelled with once upgraded to `latestVersion`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_hash: Option<String>,
    /// The nodes applying the plan now; a node is listed here before any
    /// step is taken on it, so the list is never longer than `concurrency`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applying: Vec<String>,
    /// LatestResolved, Validated and Complete, each with its observedGeneration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Per applying node: its phase, since when, and its upgrade's trace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeUpgrade>,
    /// When the last node completed (postCompleteDelay counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_completion_time: Option<Time>,
    /// Nodes on the latest hash of nodes selected, e.g. "3/8" (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One node's upgrade while it applies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeUpgrade {
    /// The node.
    pub name: String,
    /// The hash it is being upgraded to.
    pub hash: String,
    /// Where it is: Cordoning, Draining, Upgrading, WaitingReady, Failed.
    pub phase: String,
    /// When it started applying.
    pub started: Time,
    /// When it entered its phase.
    pub phase_since: Time,
    /// What it waits for or why it failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// W3C traceparent of its `upgrade node` span (survives a leader change).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub traceparent: String,
}

impl Plan {
    /// `namespace/name`, the plan's identity in owners, leases and labels.
    pub fn key(&self) -> String {
        format!(
            "{}/{}",
            self.metadata.namespace.as_deref().unwrap_or_default(),
            self.metadata.name.as_deref().unwrap_or_default()
        )
    }
}

/// Labels on a Plan's Jobs and pods (upstream's names).
pub mod labels {
    /// The plan a Job applies.
    pub const PLAN: &str = "upgrade.cattle.io/plan";
    /// The node a Job upgrades.
    pub const NODE: &str = "upgrade.cattle.io/node";
    /// The version a Job applies.
    pub const VERSION: &str = "upgrade.cattle.io/version";
    /// Whether the Job's plan is exclusive.
    pub const EXCLUSIVE: &str = "upgrade.cattle.io/exclusive";
    /// The controller that made the Job.
    pub const CONTROLLER: &str = "upgrade.cattle.io/controller";
    /// On a Plan's NodeMaintenances: the plan's namespace (its name is in [`PLAN`]).
    pub const PLAN_NAMESPACE: &str = "nodewarden.dev/plan-namespace";
}
