//! NodeVersion: the image and Kubernetes components every node should run
//! (Constellation's only user-controlled kind). Changing `spec.image` or
//! `spec.kubernetesComponentsReference` starts a rolling replacement of every
//! node of the scaling groups that name this NodeVersion.

// kube's printcolumn(...) entries repeat keys such as type_ by design.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::rollout::Rollout;

/// The desired image and components of the nodes; `rollout` says how fast to get there.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "update.edgeless.systems",
    version = "v1alpha1",
    kind = "NodeVersion",
    doc = "The image and Kubernetes components every node should run, and how fast to get there",
    plural = "nodeversions",
    status = "NodeVersionStatus",
    printcolumn(name = "Image", type_ = "string", json_path = ".spec.image"),
    printcolumn(
        name = "Progress",
        type_ = "string",
        json_path = ".status.progress",
        description = "nodes up to date / all nodes"
    ),
    printcolumn(
        name = "Outdated",
        type_ = "integer",
        json_path = ".status.outdatedNodes",
        description = "nodes still on an old image or components"
    ),
    printcolumn(
        name = "Rollout",
        type_ = "string",
        json_path = ".status.rolloutConditions[?(@.type=='Progressing')].reason"
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = ".status.rolloutConditions[?(@.type=='Degraded')].status"
    ),
    printcolumn(
        name = "Replacing",
        type_ = "integer",
        json_path = ".status.replacing",
        priority = "1",
        description = "replacements in flight"
    ),
    printcolumn(
        name = "Version",
        type_ = "string",
        json_path = ".spec.imageVersion",
        priority = "1"
    ),
    printcolumn(
        name = "Kubernetes",
        type_ = "string",
        json_path = ".spec.kubernetesClusterVersion",
        priority = "1"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NodeVersionSpec {
    /// The image every node should boot: a GCP image path, an Azure gallery image version, an AWS AMI.
    #[x_kube(validation = kube::core::Rule::new("self != ''").message("spec.image must not be empty"))]
    pub image: String,
    /// The CSP-independent version of that image (for humans and tooling).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_version: String,
    /// The ConfigMap (in kube-system) of the Kubernetes components every node should run.
    // A node annotated with other components is replaced, exactly like one on an old image.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubernetes_components_reference: String,
    /// The Kubernetes version the cluster advertises.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubernetes_cluster_version: String,
    /// How fast the rollout may go (nodewarden only). Each field left out
    /// takes the operator's default (`--rollout-*`), else Constellation's
    /// behaviour: one node at a time.
    #[serde(default, skip_serializing_if = "Rollout::is_unset")]
    pub rollout: Rollout,
    /// Nodes replaced at once: the surge when spec.rollout.maxSurge is
    /// unset. Unset or 0: the operator's default, else 1. (A field of a
    /// Constellation branch that never merged; its releases replace one
    /// node at a time.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // int32: the API server knows no "uint32" format (and warns on every apply).
    #[schemars(extend("format" = "int32"))]
    pub max_node_budget: Option<u32>,
}

impl NodeVersionSpec {
    /// This NodeVersion's own settings: `rollout`, with maxNodeBudget
    /// standing in for an unset maxSurge.
    pub fn own_rollout(&self) -> Rollout {
        let budget = self
            .max_node_budget
            .filter(|n| *n > 0)
            .and_then(|n| i32::try_from(n).ok())
            .map(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int);
        Rollout {
            max_surge: self.rollout.max_surge.clone().or(budget),
            ..self.rollout.clone()
        }
    }

    /// The settings in force: this NodeVersion's, each unset one the
    /// operator's (`defaults`).
    pub fn rollout_in_force(&self, defaults: &Rollout) -> Rollout {
        self.own_rollout().over(defaults)
    }

    /// The rollout's limits over `total` nodes with the settings in force.
    pub fn rollout_limits(&self, total: usize, defaults: &Rollout) -> super::rollout::RolloutLimits {
        self.rollout_in_force(defaults).limits_for(total, 1)
    }
}

/// What the rollout controller saw at its last reconcile.
// The object lists are Constellation's (kept so its tooling keeps working);
// the counts, `progress` and the conditions are what a human reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeVersionStatus {
    /// Nodes on an outdated image or components.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outdated: Vec<ObjectReference>,
    /// Nodes on the desired image and components, with their labels settled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub up_to_date: Vec<ObjectReference>,
    /// Outdated nodes that hand their labels to an heir before they are removed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub donors: Vec<ObjectReference>,
    /// Up-to-date nodes that still have to inherit their donor's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heirs: Vec<ObjectReference>,
    /// New up-to-date nodes that will be paired with a donor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mints: Vec<ObjectReference>,
    /// Nodes whose image or components annotation is not set yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_annotation: Vec<ObjectReference>,
    /// PendingNodes: instances joining or leaving the cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<ObjectReference>,
    /// Nodes created as replacements that are no longer needed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub obsolete: Vec<ObjectReference>,
    /// Nodes the operator cannot handle (no providerID, unknown scaling group, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invalid: Vec<ObjectReference>,
    /// How many more replacement nodes may be created right now.
    #[serde(default)]
    // int32: the API server knows no "uint32" format (and warns on every apply).
    #[schemars(extend("format" = "int32"))]
    pub budget: u32,
    /// Constellation's one condition, `Outdated`, with its reasons and
    /// messages: its CLI (`constellation status`, `upgrade check`) requires
    /// exactly one and shows its message as the cluster's status.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// nodewarden's conditions, each with its observedGeneration:
    /// Progressing, Degraded and RolloutSettings (which settings are in
    /// force and where each comes from).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rollout_conditions: Vec<Condition>,
    /// Whether a Kubernetes version upgrade is under way (Constellation's lowercase name).
    #[serde(default, rename = "activeclusterversionupgrade")]
    pub active_cluster_version_upgrade: bool,
    /// Nodes governed by this NodeVersion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub nodes: Option<u32>,
    /// Of those, nodes on the desired image and components.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub up_to_date_nodes: Option<u32>,
    /// Of those, nodes still to be replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub outdated_nodes: Option<u32>,
    /// Replacements in flight (instances created or nodes being drained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int32"))]
    pub replacing: Option<u32>,
    /// Up-to-date nodes of all nodes, e.g. "7/12" (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The full length of each non-empty node list above, by its JSON name:
    /// the lists name at most their first 100 entries, so that the object
    /// stays far below etcd's size limit at thousands of nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "counts_by_name")]
    pub list_totals: BTreeMap<String, u32>,
    /// New nodes of the target given up in a row, and whether the rollout
    /// halted on them (`spec.rollout.haltAfterFailedJoins`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt: Option<super::RolloutHalt>,
    /// The wave under way (`spec.rollout.waves`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave: Option<super::WaveStatus>,
    /// The failure domains, one at a time (`spec.rollout.topologyKey`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<super::DomainStatus>,
}

/// A map of counts. schemars says `format: uint32` for a u32, a format
/// Kubernetes does not know (it warns at every install): int32 it knows.
fn counts_by_name(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "additionalProperties": {"type": "integer", "format": "int32", "minimum": 0}
    })
}

/// The node lists of [`NodeVersionStatus`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusList {
    /// `outdated`
    Outdated,
    /// `upToDate`
    UpToDate,
    /// `donors`
    Donors,
    /// `heirs`
    Heirs,
    /// `mints`
    Mints,
    /// `pending`
    Pending,
    /// `invalid`
    Invalid,
}

impl StatusList {
    /// The list's JSON name, the key of `listTotals`.
    pub fn json_name(self) -> &'static str {
        match self {
            StatusList::Outdated => "outdated",
            StatusList::UpToDate => "upToDate",
            StatusList::Donors => "donors",
            StatusList::Heirs => "heirs",
            StatusList::Mints => "mints",
            StatusList::Pending => "pending",
            StatusList::Invalid => "invalid",
        }
    }
}

impl NodeVersionStatus {
    /// Sets `list` to the first `limit` of `entries` and records in
    /// `listTotals` how many there are in all.
    pub fn set_list(
        &mut self,
        list: StatusList,
        limit: usize,
        entries: impl Iterator<Item = ObjectReference>,
    ) {
        let mut listed = Vec::new();
        let mut total = 0u32;
        for entry in entries {
            if listed.len() < limit {
                listed.push(entry);
            }
            total = total.saturating_add(1);
        }
        *match list {
            StatusList::Outdated => &mut self.outdated,
            StatusList::UpToDate => &mut self.up_to_date,
            StatusList::Donors => &mut self.donors,
            StatusList::Heirs => &mut self.heirs,
            StatusList::Mints => &mut self.mints,
            StatusList::Pending => &mut self.pending,
            StatusList::Invalid => &mut self.invalid,
        } = listed;
        let name = list.json_name().to_string();
        if total == 0 {
            self.list_totals.remove(&name);
        } else {
            self.list_totals.insert(name, total);
        }
    }
}

/// The node counts a human reads in `kubectl get nodeversions`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// Nodes governed by the NodeVersion.
    pub nodes: u32,
    /// Of those, nodes on the desired image and components.
    pub up_to_date: u32,
    /// Of those, nodes still to be replaced.
    pub outdated: u32,
    /// Replacements in flight.
    pub replacing: u32,
}

impl NodeVersionStatus {
    /// Sets `nodes`, `upToDateNodes`, `outdatedNodes`, `replacing` and
    /// `progress` together, so they never disagree.
    pub fn set_counts(&mut self, counts: NodeCounts) {
        self.nodes = Some(counts.nodes);
        self.up_to_date_nodes = Some(counts.up_to_date);
        self.outdated_nodes = Some(counts.outdated);
        self.replacing = Some(counts.replacing);
        self.progress = Some(progress(counts.up_to_date, counts.nodes));
    }
}

/// "up to date/all", e.g. "7/12".
pub fn progress(up_to_date: u32, nodes: u32) -> String {
    format!("{up_to_date}/{nodes}")
}

impl NodeVersion {
    /// The status, or an empty one when the controller has not written it yet.
    pub fn status_or_default(&self) -> NodeVersionStatus {
        self.status.clone().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_name_their_first_entries_and_keep_the_total() {
        let node = |i: usize| ObjectReference {
            name: Some(format!("node-{i}")),
            ..Default::default()
        };
        let mut status = NodeVersionStatus::default();
        status.set_list(StatusList::Outdated, 3, (0..5).map(node));
        status.set_list(StatusList::Heirs, 3, (0..2).map(node));
        assert_eq!(status.outdated, (0..3).map(node).collect::<Vec<_>>());
        assert_eq!(status.heirs.len(), 2);
        let totals = json!(status.list_totals);
        assert_eq!(totals, json!({"outdated": 5, "heirs": 2}));
        // An emptied list drops its total, and an empty map is not written.
        status.set_list(StatusList::Outdated, 3, std::iter::empty());
        status.set_list(StatusList::Heirs, 3, std::iter::empty());
        assert!(status.outdated.is_empty());
        let written = serde_json::to_value(&status).expect("serializable");
        assert!(written.get("listTotals").is_none(), "{written}");
    }

    #[test]
    fn status_keeps_constellation_json_names() {
        let node = |name: &str| ObjectReference {
            kind: Some("Node".into()),
            name: Some(name.into()),
            ..Default::default()
        };
        let mut status = NodeVersionStatus {
            up_to_date: vec![node("a")],
            awaiting_annotation: vec![node("b")],
            budget: 2,
            active_cluster_version_upgrade: true,
            ..Default::default()
        };
        status.set_counts(NodeCounts {
            nodes: 12,
            up_to_date: 7,
            outdated: 5,
            replacing: 2,
        });
        let json = serde_json::to_value(&status).expect("serializable");
        assert_eq!(json["upToDate"][0]["name"], "a");
        assert_eq!(json["awaitingAnnotation"][0]["name"], "b");
        assert_eq!(json["budget"], 2);
        assert_eq!(json["activeclusterversionupgrade"], true);
        assert_eq!(json["conditions"], json!([]));
        assert_eq!(json["progress"], "7/12");
        assert_eq!(json["upToDateNodes"], 7);
        assert_eq!(json["outdatedNodes"], 5);
        assert_eq!(json["replacing"], 2);
        assert!(
            json.get("outdated").is_none(),
            "empty lists are omitted, as in Go"
        );
    }

    #[test]
    fn progress_reads_up_to_date_of_all() {
        for (up, all, want) in [(7, 12, "7/12"), (0, 0, "0/0"), (3, 3, "3/3")] {
            assert_eq!(progress(up, all), want);
        }
    }

    #[test]
    fn constellation_spec_parses_and_keeps_its_names() {
        let spec: NodeVersionSpec = serde_json::from_value(json!({
            "image": "projects/constellation-images/global/images/x",
            "imageVersion": "v2.3.0",
            "kubernetesComponentsReference": "k8s-components-abc",
            "kubernetesClusterVersion": "v1.31.1",
        }))
        .expect("Constellation's spec parses");
        assert_eq!(spec.rollout, Rollout::default());
        let back = serde_json::to_value(&spec).expect("serializable");
        assert_eq!(back["kubernetesComponentsReference"], "k8s-components-abc");
        assert_eq!(back["kubernetesClusterVersion"], "v1.31.1");
        assert_eq!(back["imageVersion"], "v2.3.0");
    }
}
