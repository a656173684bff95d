//! The Node Maintenance Operator v0.17.0 (the pinned peer, built from its Go
//! module by `e2e/nmo/build.sh`), run out of cluster with the admin
//! kubeconfig, its webhook server up (it will not start without one) but
//! registered with no one: for the benches that measure nodewarden beside it.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use nodewarden::api::node_maintenance::medik8s::NodeMaintenance;
use serde_json::json;

use super::{TestEnv, control_plane};

/// The finalizer the peer puts on every NodeMaintenance it touches.
pub const PEER_FINALIZER: &str = "foregroundDeleteNodeMaintenance";

/// The peer's manager process; killed when dropped.
pub struct Nmo {
    pub child: tokio::process::Child,
}

impl Nmo {
    /// Builds (or finds in the cache) and starts the peer's manager, logging
    /// to `dir/nmo.log`. It serves every NodeMaintenance of the cluster.
    pub fn start(dir: &Path) -> Nmo {
        let repo = crate::repo();
        let out = std::process::Command::new(repo.join("e2e/nmo/build.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("running e2e/nmo/build.sh");
        assert!(out.status.success(), "e2e/nmo/build.sh failed");
        let bin_dir = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        let tmp = dir.join("nmo-tmp");
        webhook_certs(&tmp);
        let log = std::fs::File::create(dir.join("nmo.log")).expect("a log file");
        let free = super::admission::free_port;
        let child = tokio::process::Command::new(PathBuf::from(bin_dir).join("nmo-manager"))
            .arg("--kubeconfig")
            .arg(&control_plane().kubeconfig)
            .args(["--health-probe-bind-address", &format!("127.0.0.1:{}", free())])
            .args(["--metrics-bind-address", "0"])
            .args(["--zap-devel=false", "--zap-log-level", "info"])
            .env("TMPDIR", &tmp)
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting the Node Maintenance Operator");
        Nmo { child }
    }

    /// Its process id (None once it exited).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// A self-signed certificate where the peer's webhook server looks by
/// default (`$TMPDIR/k8s-webhook-server/serving-certs`): it must start, and
/// no webhook configuration points at it.
fn webhook_certs(tmp: &Path) {
    let dir = tmp.join("k8s-webhook-server/serving-certs");
    std::fs::create_dir_all(&dir).expect("a cert dir");
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=nmo",
        ])
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .stderr(Stdio::null())
        .status()
        .expect("running openssl");
    assert!(status.success(), "openssl made no certificate");
}

/// NodeMaintenances read untyped: the peer writes status fields of its own.
pub fn maintenances(env: &TestEnv) -> Api<DynamicObject> {
    Api::all_with(env.client.clone(), &ApiResource::erase::<NodeMaintenance>(&()))
}

/// The peer serves every NodeMaintenance of the cluster, not only ours:
/// once it is stopped, its finalizer must not hold any it touched. (With
/// nodewarden running, nodewarden removes it itself as it finishes them:
/// `tests/it/node_maintenance.rs`; the benches clean up with neither running.)
pub async fn release_peer_finalizers(env: &TestEnv) {
    let api = maintenances(env);
    let Ok(list) = api.list(&ListParams::default()).await else {
        return;
    };
    for m in list.items {
        let finalizers = m.metadata.finalizers.clone().unwrap_or_default();
        if finalizers.iter().any(|f| f == PEER_FINALIZER) {
            let kept: Vec<&String> = finalizers.iter().filter(|f| *f != PEER_FINALIZER).collect();
            let patch =
                json!({"metadata": {"finalizers": kept, "resourceVersion": m.metadata.resource_version}});
            let name = m.metadata.name.clone().unwrap_or_default();
            let _ = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
    }
}
