//! Test harness for integration tests against the real local control plane
//! (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok).
//!
//! One control plane serves a whole test run: the first test to ask starts it
//! with `e2e/controlplane/cluster.sh up` (a no-op when `just test` or the user
//! already started it) and every test after that reuses it. Each test gets its
//! own client, its own namespace and a run id that labels every cluster-scoped
//! object it creates, so tests run in parallel without touching each other.
#![allow(dead_code)] // Each test binary uses a different part of the harness.

pub mod jaeger;
pub mod manifests;
pub mod rollout;
pub mod sim;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Label put on every object a test creates outside its namespace.
pub const RUN_LABEL: &str = "nodewarden.test/run";

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

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

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
        let status = Command::new(repo().join("e2e/controlplane/cluster.sh"))
            .arg("restart-apiserver")
            .env("NODEWARDEN_RUN_DIR", &self.0.run_dir)
            .env("NODEWARDEN_API_ONLY", "1")
            .status()
            .expect("running cluster.sh restart-apiserver");
        assert!(status.success(), "cluster.sh restart-apiserver failed");
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

/// One test's view of the cluster: a client, a namespace of its own and a run
/// id that no other test shares.
pub struct TestEnv {
    pub client: Client,
    pub id: String,
    pub namespace: String,
    cleaned: bool,
    nodes_created: std::sync::atomic::AtomicUsize,
}

impl TestEnv {
    /// Creates the test's namespace. `test` is a short name for humans; a random
    /// suffix keeps parallel and repeated runs apart.
    pub async fn new(test: &str) -> TestEnv {
        let cp = control_plane();
        let client = cp.client().await;
        let slug: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(30)
            .collect();
        let id = format!(
            "{}-{:06x}",
            slug.trim_matches('-'),
            rand::random::<u32>() & 0xff_ffff
        );
        let namespace = format!("t-{id}");
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": {"name": namespace, "labels": {RUN_LABEL: id}}
        }))
        .expect("a namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        TestEnv {
            client,
            id,
            namespace,
            cleaned: false,
            nodes_created: Default::default(),
        }
    }

    /// A name for a cluster-scoped object that no other test can pick.
    pub fn name(&self, what: &str) -> String {
        format!("{}-{what}", self.id)
    }

    /// The label selector matching everything this test created outside its namespace.
    pub fn run_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.id)
    }

    /// Creates `count` Nodes that kwok will run (it marks them Ready and runs
    /// their pods), labelled with the run id and `labels`. Returns their names.
    pub async fn create_kwok_nodes(&self, count: usize, labels: &[(&str, &str)]) -> Vec<String> {
        let mut names = Vec::with_capacity(count);
        for _ in 0..count {
            let i = self
                .nodes_created
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let name = self.name(&format!("node-{i}"));
            self.create_kwok_node(&name, labels).await;
            names.push(name);
        }
        names
    }

    /// Creates one kwok Node named `name` (see `create_kwok_nodes`).
    pub async fn create_kwok_node(&self, name: &str, labels: &[(&str, &str)]) {
        self.create_kwok_node_with(name, labels, &format!("kwok://{name}"))
            .await
    }

    /// A kwok node with the given provider ID (e.g. a sim-cloud instance's).
    pub async fn create_kwok_node_with(&self, name: &str, labels: &[(&str, &str)], provider_id: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        {
            let mut all_labels: BTreeMap<String, String> = labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            all_labels.insert(RUN_LABEL.into(), self.id.clone());
            all_labels.insert("kubernetes.io/hostname".into(), name.to_string());
            all_labels.insert("kubernetes.io/os".into(), "linux".into());
            all_labels.insert("kubernetes.io/arch".into(), "amd64".into());
            all_labels.insert("type".into(), "kwok".into());
            let node: Node = serde_json::from_value(json!({
                "metadata": {
                    "name": name,
                    "labels": all_labels,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"providerID": provider_id},
                "status": {
                    "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
                    "nodeInfo": {"kubeletVersion": "fake", "architecture": "amd64", "operatingSystem": "linux"},
                },
            }))
            .expect("a node");
            nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("creating a kwok node");
        }
    }

    /// Creates a Deployment `name` of `replicas` pods (labelled `app: name`) in
    /// the test's namespace, placed by `node_selector`.
    pub async fn create_deployment(&self, name: &str, replicas: i32, node_selector: serde_json::Value) {
        let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "nodeSelector": node_selector,
                        "containers": [{"name": "c", "image": "registry.invalid/app:1"}],
                    },
                },
            },
        }))
        .expect("a deployment");
        Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &deployment)
            .await
            .expect("creating a deployment");
    }

    /// Deletes the test's namespace and every cluster-scoped object carrying its run label.
    pub async fn cleanup(mut self) {
        self.cleaned = true;
        cleanup(&self.client, &self.id, &self.namespace).await;
    }
}

async fn cleanup(client: &Client, id: &str, namespace: &str) {
    let selector = format!("{RUN_LABEL}={id}");
    remove_all::<nodewarden::api::node_maintenance::medik8s::NodeMaintenance>(client, &selector).await;
    remove_all::<nodewarden::api::node_maintenance::kubevirt::NodeMaintenance>(client, &selector).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let _ = nodes
        .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&selector))
        .await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(namespace, &DeleteParams::default())
        .await;
}

/// Deletes every `K` matching `selector`, dropping finalizers first (the
/// operator that would remove them may be gone already).
async fn remove_all<K>(client: &Client, selector: &str)
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let Ok(list) = api.list(&ListParams::default().labels(selector)).await else {
        return;
    };
    for obj in list.items {
        let name = obj.meta().name.clone().unwrap_or_default();
        let patch = json!({"metadata": {"finalizers": null}});
        let _ = api
            .patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await;
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}

impl Drop for TestEnv {
    /// A test that panicked before `cleanup` still leaves the shared cluster clean.
    fn drop(&mut self) {
        if self.cleaned {
            return;
        }
        let (id, namespace) = (self.id.clone(), self.namespace.clone());
        // A thread with its own runtime: Drop may run inside (or outside) the
        // test's runtime, and the test's client may be tied to that runtime.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async {
                let client = control_plane().client().await;
                cleanup(&client, &id, &namespace).await;
            });
        })
        .join();
    }
}

/// What a probe saw: done with a value, or not yet, with a description of
/// what it saw (reported if the wait times out).
pub enum Probe<T> {
    Done(T),
    NotYet(String),
}

/// Polls `probe` until it is done or `timeout` passes; on timeout panics with
/// `what` and the last thing the probe saw.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Probe<T>>,
{
    let start = Instant::now();
    loop {
        let last = match probe().await {
            Probe::Done(value) => return value,
            Probe::NotYet(seen) => seen,
        };
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A probe result from a Kubernetes call: API errors count as "not yet" and
/// are reported as what was seen.
pub fn seen<E: Debug>(err: E) -> String {
    format!("error: {err:?}")
}

#[allow(unused_imports)] // Not every test binary checks node readiness.
pub use nodewarden::controllers::node_is_ready;

#[allow(unused_imports)] // Not every test binary applies manifests.
pub use manifests::apply_manifest;

/// A TCP proxy on loopback in front of the API server that a test can cut
/// (every open connection dropped, new ones refused), stall (connections stay
/// open but nothing is forwarded) and restore: a client cut off from the API
/// server while the server itself keeps running.
pub struct TcpProxy {
    pub port: u16,
    links: Arc<Links>,
    accept_task: tokio::task::JoinHandle<()>,
}

/// The link state for new connections, and each open connection's own.
struct Links {
    default: std::sync::Mutex<Link>,
    open: std::sync::Mutex<Vec<tokio::sync::watch::Sender<Link>>>,
}

impl Links {
    fn default_link(&self) -> Link {
        *self.default.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets every open connection's link (and, if `also_new`, new ones').
    fn set(&self, link: Link, also_new: bool) {
        if also_new {
            *self.default.lock().unwrap_or_else(|e| e.into_inner()) = link;
        }
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|l| !l.is_closed());
        for l in open.iter() {
            l.send_replace(link);
        }
    }
}

/// The state of a `TcpProxy`'s link to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Up,
    Cut,
    Stalled,
}

impl TcpProxy {
    pub async fn start(target: String) -> TcpProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a proxy port");
        let port = listener.local_addr().expect("a bound address").port();
        let links = Arc::new(Links {
            default: std::sync::Mutex::new(Link::Up),
            open: std::sync::Mutex::default(),
        });
        let accepting = links.clone();
        let accept_task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let initial = accepting.default_link();
                if initial == Link::Cut {
                    continue; // refused: dropped at once
                }
                let (link, rx) = tokio::sync::watch::channel(initial);
                accepting
                    .open
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(link);
                tokio::spawn(forward(inbound, target.clone(), rx));
            }
        });
        TcpProxy {
            port,
            links,
            accept_task,
        }
    }

    /// Drops every open connection and refuses new ones until `restore`.
    pub fn cut(&self) {
        self.links.set(Link::Cut, true);
    }

    /// Keeps every connection open, and accepts new ones, but forwards nothing
    /// in either direction until `restore` (requests hang instead of failing).
    /// `cut` still drops them all.
    pub fn stall(&self) {
        self.links.set(Link::Stalled, true);
    }

    /// Stalls the connections open now, for good (a half-dead TCP
    /// connection), while new connections pass: what a client sees when a
    /// load balancer or NAT silently drops its long-lived watch.
    pub fn stall_open_connections(&self) {
        self.links.set(Link::Stalled, false);
    }

    /// Forwards again: new connections after a cut; after a stall, the held
    /// connections resume where they stopped, nothing lost.
    pub fn restore(&self) {
        self.links.set(Link::Up, true);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.links.set(Link::Cut, true);
    }
}

/// Why a forwarded connection ended early: the proxy cut it (or was dropped).
fn cut_off() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "cut by the proxy")
}

/// Waits out a stall. Ok once the link is up, Err once it is cut.
async fn passable(link: &mut tokio::sync::watch::Receiver<Link>) -> std::io::Result<()> {
    match link.wait_for(|l| *l != Link::Stalled).await {
        Ok(l) if *l == Link::Up => Ok(()),
        _ => Err(cut_off()),
    }
}

/// Resolves once the link is cut (or the proxy is gone).
async fn severed(link: &mut tokio::sync::watch::Receiver<Link>) {
    let _ = link.wait_for(|l| *l == Link::Cut).await;
}

/// Forwards one accepted connection to `target` until either side closes or
/// the link is cut. A connection accepted during a stall is not even passed on
/// until the stall ends.
async fn forward(
    inbound: tokio::net::TcpStream,
    target: String,
    mut link: tokio::sync::watch::Receiver<Link>,
) {
    if passable(&mut link).await.is_err() {
        return;
    }
    let Ok(outbound) = tokio::net::TcpStream::connect(&target).await else {
        return;
    };
    let (from_client, to_client) = inbound.into_split();
    let (from_server, to_server) = outbound.into_split();
    // The first error (or cut) ends both directions and drops both sockets.
    let _ = tokio::try_join!(
        pump(from_client, to_server, link.clone()),
        pump(from_server, to_client, link),
    );
}

/// Copies one direction, passing EOF on as a write shutdown. Bytes read while
/// the link is stalled are held until it is up again.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut link: tokio::sync::watch::Receiver<Link>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => read?,
            () = severed(&mut link) => return Err(cut_off()),
        };
        passable(&mut link).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        tokio::select! {
            written = to.write_all(&buf[..n]) => written?,
            () = severed(&mut link) => return Err(cut_off()),
        }
    }
}

/// Installs (server-side apply, idempotent) every CRD nodewarden defines and
/// waits until the API server serves them.
pub async fn install_crds(client: &Client) {
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

/// An operator run in-process for one test, scoped to the test's nodes and
/// objects (its run label), with a leader lease in the test's namespace.
pub struct RunningOperator {
    pub shutdown: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl TestEnv {
    pub async fn start_operator(
        &self,
        maintenance: nodewarden::controllers::node_maintenance::MaintenanceConfig,
    ) -> RunningOperator {
        self.start_operator_with(maintenance, None, "operator").await
    }

    /// An operator with a cloud (rolling replacement) and an identity of its
    /// own (several may run, as replicas of one deployment).
    pub async fn start_operator_with(
        &self,
        maintenance: nodewarden::controllers::node_maintenance::MaintenanceConfig,
        cloud: Option<std::sync::Arc<dyn nodewarden::cloud::CloudProvider>>,
        identity: &str,
    ) -> RunningOperator {
        // Logs of the operator under test (RUST_LOG picks the level).
        nodewarden::telemetry::init_logging(false, None);
        install_crds(&self.client).await;
        let mut leader = nodewarden::runtime::leader::LeaderElectionConfig::new(
            self.namespace.clone(),
            "nodewarden",
            format!("{}-{identity}", self.id),
        );
        leader.lease_duration = Duration::from_secs(3);
        leader.renew_deadline = Duration::from_secs(2);
        leader.retry_period = Duration::from_millis(500);
        let config = nodewarden::operator::OperatorConfig {
            leader,
            http_addr: "127.0.0.1:0".parse().expect("an address"),
            node_selector: Some(self.run_selector()),
            object_selector: Some(self.run_selector()),
            maintenance,
            workers: 8,
            cloud,
            discover_scaling_groups: None,
        };
        let client = control_plane().client().await;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = nodewarden::operator::run(client, config, stop).await {
                panic!("the operator failed: {e}");
            }
        });
        RunningOperator { shutdown, task }
    }
}

impl RunningOperator {
    /// Graceful stop (as on SIGTERM).
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(20), self.task).await;
    }
}
