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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `format` in `v`'s schemas, anywhere below it.
    fn formats(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::String(f)) = m.get("format") {
                    out.insert(f.clone());
                }
                m.values().for_each(|v| formats(v, out));
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| formats(v, out)),
            _ => {}
        }
    }

    #[test]
    fn the_crds_use_only_formats_kubernetes_knows() {
        // Kubernetes warns at install about a format it does not know, such
        // as schemars' `uint32` for a u32: unsigned counts say int32.
        let mut seen = std::collections::BTreeSet::new();
        for crd in all_crds() {
            formats(
                &serde_json::to_value(&crd.spec).expect("a CRD as JSON"),
                &mut seen,
            );
        }
        let known = ["date-time", "int32", "int64"];
        let unknown: Vec<&String> = seen.iter().filter(|f| !known.contains(&f.as_str())).collect();
        assert!(
            unknown.is_empty(),
            "formats Kubernetes does not know: {unknown:?}"
        );
    }
}
