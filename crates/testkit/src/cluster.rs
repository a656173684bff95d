//! The control planes tests run against: the one every test shares (started
//! on first use) and private ones for tests that restart the API server; a
//! client for either, straight or through a `TcpProxy`; etcd compaction; and
//! nodewarden's CRDs installed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::proxy::TcpProxy;
use super::wait::{Probe, seen, wait_for};

/// The running control plane shared by all tests of this process.
pub struct ControlPlane {
    pub run_dir: PathBuf,
    pub kubeconfig: PathBuf,
    pub etcd_endpoint: String,
}

/// Starts the control plane on first use (or finds it running) and returns it.
pub fn control_plane() -> &'static ControlPlane {
    static CONTROL_PLANE: OnceLock<ControlPlane> = OnceLock::new();
    CONTROL_PLANE.get_or_init(|| {
        let run_dir = std::env::var_os("NODEWARDEN_RUN_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(".run/cluster"));
        ControlPlane::up(&run_dir, false)
    })
}

use crate::repo;

impl ControlPlane {
    /// Runs `cluster.sh up` for `run_dir` (relative to the repository).
    fn up(run_dir: &Path, api_only: bool) -> ControlPlane {
        let run_dir = repo().join(run_dir);
        let status = Command::new(repo().join("e2e/controlplane/cluster.sh"))
            .arg("up")
            .env("NODEWARDEN_RUN_DIR", &run_dir)
            .env("NODEWARDEN_API_ONLY", if api_only { "1" } else { "0" })
            .stdout(std::process::Stdio::null())
            .status()
            .expect("running e2e/controlplane/cluster.sh up");
        assert!(status.success(), "cluster.sh up failed (see its output above)");
        let etcd_port = std::fs::read_to_string(run_dir.join("etcd-port"))
            .expect("the run directory records etcd's port");
        ControlPlane {
            kubeconfig: run_dir.join("kubeconfig"),
            etcd_endpoint: format!("127.0.0.1:{}", etcd_port.trim()),
            run_dir,
        }
    }
}

/// An etcd + kube-apiserver of a test's own, for tests that restart the API
/// server and must not disturb the tests sharing the common control plane.
/// Stopped when dropped.
pub struct PrivateControlPlane(pub ControlPlane);

impl PrivateControlPlane {
    /// Blocking (runs a script): call it from `spawn_blocking` in async tests.
    pub fn start(name: &str) -> PrivateControlPlane {
        PrivateControlPlane(ControlPlane::up(Path::new(&format!(".run/private-{name}")), true))
    }

    /// Kills kube-apiserver (SIGKILL) and starts it again on the same port.
    pub fn restart_apiserver(&self) {
        self.0.restart_apiserver();
    }
}

impl Drop for PrivateControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("e2e/controlplane/cluster.sh"))
            .arg("down")
            .env("NODEWARDEN_RUN_DIR", &self.0.run_dir)
            .status();
    }
}

impl ControlPlane {
    /// Kills kube-apiserver (SIGKILL) and starts it again on the same port,
    /// etcd and every other component kept. Blocking (runs a script). On the
    /// shared control plane only a test binary of its own may do this.
    pub fn restart_apiserver(&self) {
        let status = Command::new(repo().join("e2e/controlplane/cluster.sh"))
            .arg("restart-apiserver")
            .env("NODEWARDEN_RUN_DIR", &self.run_dir)
            .status()
            .expect("running cluster.sh restart-apiserver");
        assert!(status.success(), "cluster.sh restart-apiserver failed");
    }

    /// The API server's audit log: every write by nodewarden's
    /// ServiceAccount, one JSON event a line (see cluster.sh).
    pub fn audit_log(&self) -> PathBuf {
        self.run_dir.join("audit.log")
    }

    /// A fresh admin client (each test builds its own: clients hold tasks on the
    /// runtime that created them).
    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("reading the kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("loading the kubeconfig");
        nodewarden::client::from_config(config).expect("building a client")
    }

    /// A client whose connections go through `proxy` instead of straight to
    /// the API server (the certificate names 127.0.0.1, so TLS still verifies).
    pub async fn client_via(&self, proxy: &TcpProxy) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig).expect("reading the kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("loading the kubeconfig");
        config.cluster_url = format!("https://127.0.0.1:{}", proxy.port)
            .parse()
            .expect("a proxy URL");
        nodewarden::client::from_config(config).expect("building a client")
    }

    /// The API server's loopback address.
    pub fn apiserver_addr(&self) -> String {
        let port = std::fs::read_to_string(self.run_dir.join("apiserver-port"))
            .expect("the run directory records the API server's port");
        format!("127.0.0.1:{}", port.trim())
    }

    /// Compacts etcd's history up to its current revision, so any older
    /// resourceVersion of a resource served without the watch cache
    /// (ConfigMaps, see cluster.sh) gets 410 Gone. Returns the revision.
    pub async fn compact_etcd(&self) -> i64 {
        let range = etcd_post(&self.etcd_endpoint, "/v3/kv/range", &json!({"key": "AA=="})).await;
        let revision: i64 = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("etcd range answer without header.revision: {range}"));
        let answer = etcd_post(
            &self.etcd_endpoint,
            "/v3/kv/compaction",
            &json!({"revision": revision.to_string(), "physical": true}),
        )
        .await;
        assert!(answer.get("error").is_none(), "etcd compaction failed: {answer}");
        revision
    }
}

/// A POST with a JSON body to etcd's v3 HTTP gateway.
async fn etcd_post(endpoint: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(endpoint)
        .await
        .expect("connecting to etcd");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .expect("writing to etcd");
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .expect("reading from etcd");
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "etcd {path}: {head}\n{body}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("etcd {path} answered {body}: {e}"))
}

/// Installs (server-side apply, idempotent) every CRD nodewarden defines and
/// waits until the API server serves them; also metal3's BareMetalHost CRD,
/// since every test operator serves SIPClusters.
pub async fn install_crds(client: &Client) {
    install_own_crds(client).await;
    super::metal3::install_metal3_crd(client).await;
}

/// Installs every CRD nodewarden defines (server-side apply, idempotent) and
/// waits until the API server serves them; nothing of other projects.
pub async fn install_own_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in nodewarden::api::all_crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let params = kube::api::PatchParams::apply("nodewarden-tests").force();
        crds.patch(&name, &params, &kube::api::Patch::Apply(&crd))
            .await
            .expect("applying a CRD");
        wait_for(
            &format!("CRD {name} established"),
            Duration::from_secs(30),
            || async {
                match crds.get(&name).await {
                    Ok(c) => {
                        let established =
                            c.status
                                .as_ref()
                                .and_then(|s| s.conditions.as_ref())
                                .is_some_and(|cs| {
                                    cs.iter().any(|c| c.type_ == "Established" && c.status == "True")
                                });
                        if established {
                            Probe::Done(())
                        } else {
                            Probe::NotYet("not established".into())
                        }
                    }
                    Err(e) => Probe::NotYet(seen(e)),
                }
            },
        )
        .await;
    }
}
