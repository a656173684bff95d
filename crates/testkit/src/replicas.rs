//! nodewarden as it runs in production: `nodewarden run` processes (the
//! replicas of one Deployment) authenticated as the ServiceAccount of
//! manifests/base/rbac.yaml and nothing more, killed, restarted and stopped the
//! way a kubelet does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;
use tokio::process::{Child, Command};

use super::proxy::TcpProxy;

/// Where manifests/ puts nodewarden (and its ServiceAccount and leases).
pub const SYSTEM_NAMESPACE: &str = "nodewarden-system";

/// A kubeconfig that authenticates as nodewarden's ServiceAccount, bound only
/// to the roles of manifests/base/rbac.yaml.
pub async fn service_account_kubeconfig(client: &Client, dir: &Path) -> PathBuf {
    let token = service_account_token(client).await;
    let path = dir.join("nodewarden.kubeconfig");
    write_token_kubeconfig(&path, &token, None);
    path
}

/// Applies manifests/base's namespace: a fresh control plane has none until
/// a test applies it, and which test runs first is up to the harness.
pub async fn ensure_system_namespace(client: &Client) {
    super::apply_manifest(client, &crate::repo().join("manifests/base/namespace.yaml")).await;
}

/// Applies manifests/base's namespace and RBAC and returns a fresh token of
/// nodewarden's ServiceAccount (each token has its own credential id, which
/// the audit log records with every request).
pub async fn service_account_token(client: &Client) -> String {
    ensure_system_namespace(client).await;
    super::apply_manifest(client, &crate::repo().join("manifests/base/rbac.yaml")).await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), SYSTEM_NAMESPACE)
        .create_token_request("nodewarden", &PostParams::default(), &request)
        .await
        .expect("a ServiceAccount token")
        .status
        .expect("a token in the status")
        .token
        .expect("a token")
}

/// Writes a kubeconfig for `token`, to the API server or, with `server`, to
/// that URL instead (a proxy in front of it: the certificate names 127.0.0.1).
pub fn write_token_kubeconfig(path: &Path, token: &str, server: Option<String>) {
    let admin = Kubeconfig::read_from(&super::control_plane().kubeconfig).expect("the admin kubeconfig");
    let mut cluster = admin.clusters.first().expect("a cluster").clone();
    if let (Some(server), Some(c)) = (server, cluster.cluster.as_mut()) {
        c.server = Some(server);
    }
    let config = json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": "nodewarden", "user": {"token": token}}],
        "contexts": [{"name": "nodewarden", "context": {"cluster": cluster.name, "user": "nodewarden"}}],
        "current-context": "nodewarden",
    });
    std::fs::write(path, serde_json::to_string(&config).expect("json")).expect("writing the kubeconfig");
}

/// The `jti` claim of a ServiceAccount token: the audit log's
/// `authentication.kubernetes.io/credential-id` is `JTI=<it>`.
pub fn token_id(token: &str) -> String {
    use base64::Engine;
    let payload = token.split('.').nth(1).expect("a JWT has a payload");
    let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .expect("a base64url payload");
    let claims: serde_json::Value = serde_json::from_slice(&claims).expect("JSON claims");
    claims["jti"].as_str().expect("a jti claim").to_string()
}

/// The identity (and pod name) of the test's replica `i`.
fn replica_identity(env: &super::TestEnv, i: usize) -> String {
    format!("{}-replica-{i}", env.id)
}

/// A replica's own way to the API server: its own token (the audit log
/// tells it from the others by the token's id) through its own proxy (so it
/// alone can be cut off while its process lives on).
pub struct OwnLink {
    pub proxy: TcpProxy,
    pub kubeconfig: PathBuf,
    pub token_id: String,
}

/// In `extra_env` of [`Replicas::start_with_env`]: every replica serves the
/// admission webhook on a loopback port of its own (see `Replicas::webhook`).
pub const SERVE_WEBHOOK: &str = "NODEWARDEN_TEST_SERVE_WEBHOOK";

/// A directory for the replicas' logs and kubeconfig, kept after the test
/// (a failure is explained there) and printed.
pub fn replica_log_dir(run_id: &str) -> PathBuf {
    let dir = tempfile::Builder::new()
        .prefix(&format!("nodewarden-{run_id}-"))
        .tempdir()
        .expect("a temp dir")
        .keep();
    println!("replica logs in {}", dir.display());
    dir
}

/// One `nodewarden run` process, as one pod of the Deployment.
pub struct Replica {
    identity: String,
    child: Child,
}

/// The election timings of test replicas: a 3 s lease, renewed within 2 s,
/// tried every 0.5 s (production's defaults are 15, 10 and 2).
pub const TEST_ELECTION: [&str; 6] = [
    "--lease-duration",
    "3",
    "--renew-deadline",
    "2",
    "--retry-period",
    "0.5",
];

/// What every replica of a test shares: its kubeconfig, its lease, where
/// its traces go, the arguments added to `nodewarden run`, where it logs.
pub struct Shared<'a> {
    pub kubeconfig: &'a Path,
    pub lease_name: &'a str,
    pub otlp_endpoint: &'a str,
    pub extra: &'a [&'a str],
    pub logs: &'a Path,
}

pub struct Replicas {
    pub args: Vec<String>,
    /// The election flags; empty for production's defaults.
    pub election: Vec<String>,
    /// The kubeconfig of every replica without a link of its own.
    pub kubeconfig: PathBuf,
    /// Replicas with their own token and proxy, by identity.
    pub links: BTreeMap<String, OwnLink>,
    /// Each replica's /metrics address (kept across restarts, like a pod's).
    pub http: BTreeMap<String, String>,
    pub envs: Vec<(String, String)>,
    pub logs: PathBuf,
    pub running: Vec<Replica>,
    /// Each replica's webhook port, when they serve the admission webhook
    /// (kept across restarts, like a pod's).
    pub webhook: Option<BTreeMap<String, u16>>,
}

impl Replicas {
    /// `count` replicas sharing one lease (3 s, renew 2 s, retry 0.5 s),
    /// scoped to the test's nodes and objects, exporting traces to
    /// `otlp_endpoint`; `extra` arguments go to every `nodewarden run`.
    pub fn start(
        count: usize,
        env: &super::TestEnv,
        kubeconfig: &Path,
        lease_name: &str,
        otlp_endpoint: &str,
        extra: &[&str],
        logs: &Path,
    ) -> Replicas {
        Replicas::start_with_env(
            count,
            env,
            Shared {
                kubeconfig,
                lease_name,
                otlp_endpoint,
                extra,
                logs,
            },
            &[],
        )
    }

    /// As [`Replicas::start`], with `extra_env` set in every replica's
    /// environment (after the defaults, so it wins).
    pub fn start_with_env(
        count: usize,
        env: &super::TestEnv,
        shared: Shared,
        extra_env: &[(String, String)],
    ) -> Replicas {
        let Shared {
            kubeconfig,
            lease_name,
            otlp_endpoint,
            extra,
            logs,
        } = shared;
        let mut replicas = Replicas::new(env, kubeconfig, lease_name, otlp_endpoint, extra, extra_env, logs);
        replicas.spawn_all(count, env);
        replicas
    }

    /// As [`Replicas::start`] with production's election timings (no
    /// election flags): for measuring failover as users will see it.
    pub fn start_default_election(
        count: usize,
        env: &super::TestEnv,
        kubeconfig: &Path,
        lease_name: &str,
        otlp_endpoint: &str,
        extra: &[&str],
        logs: &Path,
    ) -> Replicas {
        let mut replicas = Replicas::new(env, kubeconfig, lease_name, otlp_endpoint, extra, &[], logs);
        replicas.election.clear();
        replicas.spawn_all(count, env);
        replicas
    }

    fn spawn_all(&mut self, count: usize, env: &super::TestEnv) {
        for i in 0..count {
            let replica = self.spawn(&replica_identity(env, i));
            self.running.push(replica);
        }
    }

    /// As [`Replicas::start`], each replica with a link of its own
    /// ([`OwnLink`]): a token of nodewarden's ServiceAccount and a proxy.
    pub async fn start_linked(
        count: usize,
        env: &super::TestEnv,
        lease_name: &str,
        otlp_endpoint: &str,
        extra: &[&str],
        logs: &Path,
    ) -> Replicas {
        let mut replicas = Replicas::new(
            env,
            &logs.join("unused.kubeconfig"),
            lease_name,
            otlp_endpoint,
            extra,
            &[],
            logs,
        );
        let apiserver = super::control_plane().apiserver_addr();
        for i in 0..count {
            let identity = replica_identity(env, i);
            let token = service_account_token(&env.client).await;
            let proxy = TcpProxy::start(apiserver.clone()).await;
            let kubeconfig = logs.join(format!("{identity}.kubeconfig"));
            write_token_kubeconfig(
                &kubeconfig,
                &token,
                Some(format!("https://127.0.0.1:{}", proxy.port)),
            );
            let link = OwnLink {
                proxy,
                kubeconfig,
                token_id: token_id(&token),
            };
            replicas.links.insert(identity.clone(), link);
            let replica = replicas.spawn(&identity);
            replicas.running.push(replica);
        }
        replicas
    }

    /// The replicas' shared settings; none started yet.
    fn new(
        env: &super::TestEnv,
        kubeconfig: &Path,
        lease_name: &str,
        otlp_endpoint: &str,
        extra: &[&str],
        extra_env: &[(String, String)],
        logs: &Path,
    ) -> Replicas {
        let selector = env.run_selector();
        let common = [
            "--lease-namespace",
            SYSTEM_NAMESPACE,
            "--lease-name",
            lease_name,
            "--node-selector",
            &selector,
            "--object-selector",
            &selector,
        ]
        .map(String::from);
        Replicas {
            args: common
                .into_iter()
                .chain(extra.iter().map(|s| s.to_string()))
                .collect(),
            election: TEST_ELECTION.map(String::from).to_vec(),
            kubeconfig: kubeconfig.to_path_buf(),
            links: BTreeMap::new(),
            envs: vec![
                ("RUST_LOG".into(), "info".into()),
                ("OTEL_EXPORTER_OTLP_ENDPOINT".into(), otlp_endpoint.into()),
                ("OTEL_EXPORTER_OTLP_PROTOCOL".into(), "http/json".into()),
                ("OTEL_BSP_SCHEDULE_DELAY".into(), "200".into()),
            ]
            .into_iter()
            .chain(extra_env.iter().cloned())
            .collect(),
            http: BTreeMap::new(),
            logs: logs.to_path_buf(),
            running: Vec::new(),
            webhook: extra_env
                .iter()
                .any(|(k, _)| k == SERVE_WEBHOOK)
                .then(BTreeMap::new),
        }
    }

    /// Every replica's /metrics text, by identity.
    pub async fn scrape(&self) -> Result<BTreeMap<String, String>, String> {
        let mut scraped = BTreeMap::new();
        for (identity, addr) in &self.http {
            let text = super::jaeger::http_get(&format!("http://{addr}/metrics"))
                .await
                .map_err(|e| format!("scraping {identity}: {e}"))?;
            scraped.insert(identity.clone(), text);
        }
        Ok(scraped)
    }

    pub fn spawn(&mut self, identity: &str) -> Replica {
        let http = self
            .http
            .entry(identity.to_string())
            .or_insert_with(|| {
                let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
                listener.local_addr().expect("an address").to_string()
            })
            .clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{identity}.log")))
            .expect("a log file");
        let webhook: Vec<String> = match self.webhook.as_mut() {
            Some(ports) => {
                let port = *ports
                    .entry(identity.to_string())
                    .or_insert_with(super::admission::free_port);
                vec!["--webhook-addr".into(), format!("127.0.0.1:{port}")]
            }
            None => Vec::new(),
        };
        let kubeconfig = self
            .links
            .get(identity)
            .map_or(&self.kubeconfig, |l| &l.kubeconfig);
        let child = Command::new(crate::nodewarden_binary())
            .arg("run")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(&self.args)
            .args(&self.election)
            .args(["--identity", identity, "--http-addr", &http])
            .args(&webhook)
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting nodewarden run");
        Replica {
            identity: identity.to_string(),
            child,
        }
    }

    /// The identities of the replicas (running or killed).
    pub fn identities(&self) -> Vec<String> {
        self.running.iter().map(|r| r.identity.clone()).collect()
    }

    pub fn position(&self, identity: &str) -> usize {
        self.running
            .iter()
            .position(|r| r.identity == identity)
            .unwrap_or_else(|| panic!("{identity} is not one of the replicas"))
    }

    /// SIGKILL: no chance to release anything.
    pub async fn kill(&mut self, identity: &str) {
        let i = self.position(identity);
        let _ = self.running[i].child.start_kill();
        let _ = self.running[i].child.wait().await;
    }

    /// Waits until the replica's process has exited (after a SIGTERM).
    pub async fn wait_exit(&mut self, identity: &str) {
        let i = self.position(identity);
        let _ = self.running[i].child.wait().await;
    }

    /// The replica's process id (None once it exited).
    pub fn pid(&self, identity: &str) -> Option<u32> {
        self.running[self.position(identity)].child.id()
    }

    /// Whether the replica's process is still alive.
    pub fn is_running(&mut self, identity: &str) -> bool {
        let i = self.position(identity);
        matches!(self.running[i].child.try_wait(), Ok(None))
    }

    /// Starts a killed replica again under the same name (the kubelet
    /// restarting the container of the same pod).
    pub fn restart(&mut self, identity: &str) {
        let i = self.position(identity);
        self.running[i] = self.spawn(identity);
    }

    pub fn sigterm(&self, identity: &str) {
        let pid = self.running[self.position(identity)]
            .child
            .id()
            .expect("a running replica");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -TERM {pid}");
    }

    pub fn tail_logs(&self) -> String {
        let mut out = String::new();
        for r in &self.running {
            let text =
                std::fs::read_to_string(self.logs.join(format!("{}.log", r.identity))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {} (last 15 lines)\n", r.identity));
            for l in &lines[lines.len().saturating_sub(15)..] {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

pub async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

/// How long until a replica other than `old` holds the lease.
pub async fn wait_for_new_leader(
    leases: &Api<Lease>,
    name: &str,
    old: &str,
    since: Instant,
) -> (String, Duration) {
    loop {
        if let Some(h) = holder(leases, name).await
            && h != old
        {
            return (h, since.elapsed());
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "no new leader after {old} in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of `series` (its full name and labels) in a /metrics text.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l[series.len()..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
}
