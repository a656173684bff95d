//! Custom resource types. Types only: no IO happens here.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The CustomResourceDefinition of every custom resource nodewarden defines,
/// in a stable order (what `nodewarden crds` prints and manifests/ holds).
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    Vec::new()
}
