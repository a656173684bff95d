//! Custom resource types. Types only: no IO happens here.

pub mod conditions;
pub mod metal3;
pub mod node_maintenance;
pub mod plan;
pub mod sip;
pub mod update;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The CustomResourceDefinition of every custom resource nodewarden defines,
/// in a stable order (what `nodewarden crds` prints and manifests/ holds).
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![
        node_maintenance::medik8s::NodeMaintenance::crd(),
        node_maintenance::kubevirt::NodeMaintenance::crd(),
        update::NodeVersion::crd(),
        update::ScalingGroup::crd(),
        update::PendingNode::crd(),
        update::AutoscalingStrategy::crd(),
        update::JoiningNode::crd(),
        plan::Plan::crd(),
        sip::SIPCluster::crd(),
    ]
}
