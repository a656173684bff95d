//! metal3's genuine BareMetalHost CRD (`baremetalhosts.metal3.io`,
//! `metal3.io/v1alpha1`), as shipped in the Go module
//! github.com/metal3-io/baremetal-operator pinned by e2e/metal3/go.mod:
//! `e2e/metal3/crd.sh` downloads it into the Go module cache (verified by
//! e2e/metal3/go.sum) and prints its path; the tests install it as a user
//! would, with server-side apply.
//!
//! Its status is a subresource and requires `errorCount` (defaulted),
//! `errorMessage`, `operationalStatus`, `poweredOn` and `provisioning.{ID,
//! state}`: a test playing metal3 writes all of them through `/status`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::core::GroupVersionKind;
use kube::discovery::pinned_kind;

use super::manifests::apply_manifest;
use super::wait::{Probe, seen, wait_for};

/// The CRD's name.
pub const CRD_NAME: &str = "baremetalhosts.metal3.io";

/// The path of the genuine CRD YAML in the Go module cache (from
/// `e2e/metal3/crd.sh`, run once per test process). Blocking: the first call
/// may download the module (under 1 MB).
pub fn crd_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let script = crate::repo().join("e2e/metal3/crd.sh");
        let out = Command::new(&script)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
        assert!(
            out.status.success(),
            "e2e/metal3/crd.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).expect("crd.sh prints a UTF-8 path");
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(
            path.is_file(),
            "e2e/metal3/crd.sh printed {path:?}, which is not a file"
        );
        path
    })
}

/// Installs (server-side apply, idempotent) metal3's genuine BareMetalHost
/// CRD and waits until it is Established and discovery serves the kind, so
/// BareMetalHosts can be applied right after.
pub async fn install_metal3_crd(client: &kube::Client) {
    let path = tokio::task::spawn_blocking(crd_path)
        .await
        .expect("locating metal3's BareMetalHost CRD");
    apply_manifest(client, path).await;

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let gvk = GroupVersionKind::gvk("metal3.io", "v1alpha1", "BareMetalHost");
    wait_for(
        &format!("CRD {CRD_NAME} established and served"),
        Duration::from_secs(30),
        || async {
            let crd = match crds.get(CRD_NAME).await {
                Ok(crd) => crd,
                Err(e) => return Probe::NotYet(seen(e)),
            };
            let established = crd
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"));
            if !established {
                return Probe::NotYet("not established".into());
            }
            match pinned_kind(client, &gvk).await {
                Ok(_) => Probe::Done(()),
                Err(e) => Probe::NotYet(format!("established, not yet in discovery: {e}")),
            }
        },
    )
    .await;
}
