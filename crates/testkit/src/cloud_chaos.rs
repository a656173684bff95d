//! The chaos rollout, on any cloud: while three `nodewarden run` replicas
//! roll the nodes, the leader is SIGKILLed with an instance on its way, and
//! then the cloud (a fake's process) is paused by SIGSTOP. The outage must
//! show in the NodeVersion's Degraded condition and the leader's cloud
//! error metric, and the rollout must resume after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use nodewarden::api::update::{NodeVersion, PendingNode, condition, reason};

use super::TestEnv;
use super::replicas::{Replicas, SYSTEM_NAMESPACE, holder, wait_for_new_leader};
use super::rollout::runs_image;

/// What the faults showed while they lasted.
#[derive(Debug)]
pub struct Seen {
    /// The message of Degraded=True CloudError, when the NodeVersion said it.
    pub degraded: Option<String>,
    /// The leader's `nodewarden_cloud_errors_total`, summed.
    pub cloud_errors: f64,
}

/// The faults, as a task: the leader of `lease_name` SIGKILLed (and
/// restarted) once 2 nodes run `image` with a join in flight, then the
/// process `cloud_pid` stopped for `outage` once 5 do.
pub fn spawn_faults(
    env: &TestEnv,
    replicas: Arc<tokio::sync::Mutex<Replicas>>,
    lease_name: &str,
    image: &str,
    cloud_pid: u32,
    outage: Duration,
) -> tokio::task::JoinHandle<Seen> {
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    let (lease_name, image, version) = (lease_name.to_string(), image.to_string(), env.name("version"));
    let (client, selector) = (env.client.clone(), env.run_selector());
    tokio::spawn(async move {
        let new_nodes = NewNodes {
            client: client.clone(),
            selector,
            image,
        };
        new_nodes.wait(2).await;
        let leader = holder(&leases, &lease_name).await.expect("a leader");
        let killed = Instant::now();
        replicas.lock().await.kill(&leader).await;
        let (next, took) = wait_for_new_leader(&leases, &lease_name, &leader, killed).await;
        replicas.lock().await.restart(&leader);
        println!("SIGKILL of leader {leader}: {next} took over after {took:?}");

        new_nodes.wait(5).await;
        signal(cloud_pid, "-STOP");
        let seen = watch_outage(&client, &version, &replicas, &leases, &lease_name, outage).await;
        signal(cloud_pid, "-CONT");
        println!("the cloud paused {outage:?}: {seen:?}");
        seen
    })
}

/// Nodes on the new image, with a join in flight.
struct NewNodes {
    client: kube::Client,
    selector: String,
    image: String,
}

impl NewNodes {
    /// Waits until `want` Nodes run the image and a join is in flight.
    async fn wait(&self, want: usize) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let pending: Api<PendingNode> = Api::all(self.client.clone());
        let params = ListParams::default().labels(&self.selector);
        loop {
            if let (Ok(list), Ok(joining)) = (nodes.list(&params).await, pending.list(&params).await)
                && list.items.iter().filter(|n| runs_image(n, &self.image)).count() >= want
                && joining.items.iter().any(|p| p.name_any().starts_with("join-"))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// What the NodeVersion and the leader's metrics say during the outage.
async fn watch_outage(
    client: &kube::Client,
    version: &str,
    replicas: &tokio::sync::Mutex<Replicas>,
    leases: &Api<Lease>,
    lease_name: &str,
    outage: Duration,
) -> Seen {
    let versions: Api<NodeVersion> = Api::all(client.clone());
    let paused = Instant::now();
    let mut seen = Seen {
        degraded: None,
        cloud_errors: 0.0,
    };
    while paused.elapsed() < outage {
        if seen.degraded.is_none()
            && let Ok(nv) = versions.get(version).await
        {
            seen.degraded = nv
                .status
                .unwrap_or_default()
                .rollout_conditions
                .into_iter()
                .find(|c| {
                    c.type_ == condition::DEGRADED && c.status == "True" && c.reason == reason::CLOUD_ERROR
                })
                .map(|c| c.message);
        }
        if let Some(leader) = holder(leases, lease_name).await
            && let Ok(scraped) = replicas.lock().await.scrape().await
            && let Some(text) = scraped.get(&leader)
        {
            seen.cloud_errors = cloud_errors(text);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen
}

/// The sum of `nodewarden_cloud_errors_total` over its series in a /metrics text.
pub fn cloud_errors(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("nodewarden_cloud_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends `signal` (`-STOP`, `-CONT`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("running kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// Three replicas of `nodewarden run` with `args` and `envs`, with the
/// lease `lease_name`, authenticated as nodewarden's ServiceAccount; waits
/// for a leader.
pub async fn start_replicas(
    env: &TestEnv,
    lease_name: &str,
    args: &[&str],
    envs: &[(String, String)],
) -> Replicas {
    let dir = super::replicas::replica_log_dir(&env.id);
    let kubeconfig = super::replicas::service_account_kubeconfig(&env.client, &dir).await;
    let shared = super::replicas::Shared {
        kubeconfig: &kubeconfig,
        lease_name,
        otlp_endpoint: "",
        extra: args,
        logs: &dir,
    };
    let replicas = Replicas::start_with_env(3, env, shared, envs);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    super::wait_for("a leader", Duration::from_secs(30), || async {
        match holder(&leases, lease_name).await {
            Some(h) => super::Probe::Done(h),
            None => super::Probe::NotYet("no holder".into()),
        }
    })
    .await;
    replicas
}
