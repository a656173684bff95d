//! The `nodewarden` binary: the operator (the tools are binaries of their own).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nodewarden::admission::limits;
use nodewarden::api::update::Rollout;
use nodewarden::api::update::rollout::scaled_int_or_percent;
use nodewarden::cloud::metered::Ration;
use nodewarden::controllers::BareMetal;
use nodewarden::controllers::node_maintenance::MaintenanceConfig;
use nodewarden::controllers::plan::PlanConfig;
use nodewarden::operator::{self, OperatorConfig};
use nodewarden::runtime::leader::LeaderElectionConfig;
use nodewarden::upgrade::job::{self, JobDefaults};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "nodewarden",
    version,
    about = "Keeps every Kubernetes node on the OS image and Kubernetes version its operators asked for"
)]
struct Cli {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true, env = "NODEWARDEN_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator (every replica watches; the elected leader acts).
    Run(Box<RunArgs>),
    /// Print the CustomResourceDefinition YAML of every resource nodewarden defines.
    Crds,
    /// The way back to the upstream operators, once nodewarden's pods are
    /// gone: nodewarden's finalizers, annotations and labels removed from
    /// every object, its own drains ended and their node changes undone,
    /// maintenances others made left running for the Node Maintenance
    /// Operator, its Lease and webhook Secret deleted.
    Handover {
        /// The kubeconfig (default: in-cluster, then KUBECONFIG, then ~/.kube/config).
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<std::path::PathBuf>,
        /// nodewarden's namespace (its Lease and webhook Secret).
        #[arg(long, default_value = "nodewarden-system")]
        namespace: String,
        /// The leader Lease's name (nodewarden's --lease-name).
        #[arg(long, default_value = operator::LEASE_NAME)]
        lease_name: String,
        /// The webhook Secret's name (nodewarden's --webhook-secret).
        #[arg(long, default_value = nodewarden::admission::WEBHOOK_SECRET)]
        webhook_secret: String,
        /// Only Nodes matching this label selector (nodewarden's --node-selector).
        #[arg(long)]
        node_selector: Option<String>,
        /// Only objects matching this label selector (nodewarden's --object-selector).
        #[arg(long)]
        object_selector: Option<String>,
    },
    /// Relay a socket of the pod to Constellation's upgrade-agent socket on
    /// the node (root's): the chart's sidecar, run as root with no
    /// capability, so nodewarden runs as 65532.
    RelayUpgradeAgent {
        /// The pod's socket (in a volume nodewarden mounts too).
        #[arg(long)]
        listen: std::path::PathBuf,
        /// The node's upgrade-agent socket (a hostPath).
        #[arg(long)]
        to: std::path::PathBuf,
    },
    /// Copy the control plane's etcd certificates (ca.crt, peer.crt,
    /// peer.key) from a host directory into the pod, readable by its group:
    /// the chart's init container, run as root, so nodewarden runs as 65532.
    CopyEtcdPki {
        /// The host's directory (a hostPath of /etc/kubernetes/pki/etcd).
        #[arg(long)]
        from: std::path::PathBuf,
        /// The pod's directory (an emptyDir).
        #[arg(long)]
        to: std::path::PathBuf,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Namespace of the leader-election Lease (in a pod: its own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "nodewarden-system")]
    lease_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = operator::LEASE_NAME)]
    lease_name: String,
    /// This replica's identity in the Lease (in a pod: the pod name). Default: hostname and pid.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long a lease is valid without renewal (seconds).
    #[arg(long, default_value_t = 15.0)]
    lease_duration: f64,
    /// The leader stops acting when it could not renew for this long (seconds).
    #[arg(long, default_value_t = 10.0)]
    renew_deadline: f64,
    /// Interval between acquire and renew attempts (seconds).
    #[arg(long, default_value_t = 2.0)]
    retry_period: f64,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "NODEWARDEN_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// Manage only Nodes matching this label selector (run beside other node tools).
    #[arg(long, env = "NODEWARDEN_NODE_SELECTOR")]
    node_selector: Option<String>,
    /// Handle only nodewarden objects (NodeMaintenance, ...) matching this label selector.
    #[arg(long, env = "NODEWARDEN_OBJECT_SELECTOR")]
    object_selector: Option<String>,
    /// Nodes in maintenance at once (unset: no limit).
    #[arg(long, env = "NODEWARDEN_MAX_CONCURRENT_MAINTENANCE")]
    max_concurrent_maintenance: Option<usize>,
    /// Namespace of the per-node maintenance leases other remediation tools respect.
    #[arg(long, default_value = "medik8s-leases")]
    maintenance_lease_namespace: String,
    /// Workers per controller.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Replace outdated nodes through the simulated cloud at this address
    /// (`nodewarden-simcloud`); without a cloud only maintenance runs.
    #[arg(long, env = "NODEWARDEN_SIM_CLOUD")]
    sim_cloud: Option<String>,
    /// The cloud that replaces nodes: `sim` (needs --sim-cloud), `aws`, `gcp`,
    /// `azure`, or `none` (default: `sim` when --sim-cloud is given, else none).
    #[arg(long, env = "NODEWARDEN_CLOUD", value_parser = ["sim", "aws", "gcp", "azure", "none"])]
    cloud: Option<String>,
    /// Cloud calls a second, shared by every controller: keep it under the
    /// account's API quota (a rollout at a high surge is paced by it).
    #[arg(long, env = "NODEWARDEN_CLOUD_QPS", default_value_t = nodewarden::cloud::metered::DEFAULT_QPS)]
    cloud_qps: f64,
    /// Cloud calls at once after a quiet spell (the ration's burst).
    #[arg(long, env = "NODEWARDEN_CLOUD_BURST", default_value_t = nodewarden::cloud::metered::DEFAULT_BURST)]
    cloud_burst: u32,
    /// AWS: the cluster's `constellation-uid` tag value (its Auto Scaling
    /// groups). Required with `--cloud aws`.
    #[arg(long, env = "NODEWARDEN_AWS_CLUSTER_UID")]
    aws_cluster_uid: Option<String>,
    /// AWS: another endpoint for every service (moto, LocalStack);
    /// AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> work too.
    #[arg(long, env = "NODEWARDEN_AWS_ENDPOINT")]
    aws_endpoint: Option<String>,
    /// AWS: how long one API call may take before it counts as failed (seconds).
    #[arg(long, env = "NODEWARDEN_AWS_CALL_TIMEOUT", default_value_t = 10.0)]
    aws_call_timeout: f64,
    /// AWS: the region of the cluster's Auto Scaling groups. Required with
    /// `--cloud aws`; AWS_REGION or AWS_DEFAULT_REGION serve too (never a
    /// default: another region would hold other groups).
    #[arg(long, env = "NODEWARDEN_AWS_REGION")]
    aws_region: Option<String>,
    /// GCP: the cluster's `constellation-uid` label value (on its managed
    /// instance groups' templates). Required with `--cloud gcp`.
    #[arg(long, env = "NODEWARDEN_GCP_CLUSTER_UID")]
    gcp_cluster_uid: Option<String>,
    /// GCP: the project of the cluster's instance groups; else the service
    /// account key's, else the metadata server's.
    #[arg(long, env = "NODEWARDEN_GCP_PROJECT")]
    gcp_project: Option<String>,
    /// GCP: another Compute endpoint (a fake); else Google's.
    #[arg(long, env = "NODEWARDEN_GCP_ENDPOINT")]
    gcp_endpoint: Option<String>,
    /// GCP: how long one API call may take before it counts as failed (seconds).
    #[arg(long, env = "NODEWARDEN_GCP_CALL_TIMEOUT", default_value_t = 10.0)]
    gcp_call_timeout: f64,
    /// Azure: the cluster's `constellation-uid` tag value (on its VM scale
    /// sets). Required with `--cloud azure`.
    #[arg(long, env = "NODEWARDEN_AZURE_CLUSTER_UID")]
    azure_cluster_uid: Option<String>,
    /// Azure: the subscription of the cluster's scale sets. Required with
    /// `--cloud azure`; AZURE_SUBSCRIPTION_ID serves too.
    #[arg(long, env = "NODEWARDEN_AZURE_SUBSCRIPTION")]
    azure_subscription: Option<String>,
    /// Azure: the resource group of the cluster's scale sets. Required with
    /// `--cloud azure`.
    #[arg(long, env = "NODEWARDEN_AZURE_RESOURCE_GROUP")]
    azure_resource_group: Option<String>,
    /// Azure: another Resource Manager endpoint (a fake); else ARM's.
    #[arg(long, env = "NODEWARDEN_AZURE_ENDPOINT")]
    azure_endpoint: Option<String>,
    /// Azure: how long one API call may take before it counts as failed (seconds).
    #[arg(long, env = "NODEWARDEN_AZURE_CALL_TIMEOUT", default_value_t = 15.0)]
    azure_call_timeout: f64,
    /// Create ScalingGroups following this NodeVersion for cloud groups without one.
    #[arg(long, env = "NODEWARDEN_DISCOVER_SCALING_GROUPS")]
    discover_scaling_groups: Option<String>,
    /// etcd client URLs (comma-separated, e.g. https://10.0.0.2:2379): before
    /// a control-plane node is retired its etcd member is removed through
    /// them. Unset: etcd is found as Constellation finds it, on the
    /// control-plane nodes' InternalIPs at --etcd-client-port with the
    /// certificates of --etcd-pki-dir (see --etcd-on-control-plane).
    #[arg(long, env = "NODEWARDEN_ETCD_ENDPOINTS", value_delimiter = ',')]
    etcd_endpoints: Vec<String>,
    /// The control plane's etcd certificates (kubeadm's ca.crt, peer.crt,
    /// peer.key), used when --etcd-endpoints is unset.
    #[arg(long, env = "NODEWARDEN_ETCD_PKI_DIR", default_value = nodewarden::etcd::access::DEFAULT_PKI_DIR)]
    etcd_pki_dir: std::path::PathBuf,
    /// etcd's client port on the control-plane nodes, used when
    /// --etcd-endpoints is unset.
    #[arg(long, env = "NODEWARDEN_ETCD_CLIENT_PORT", default_value_t = nodewarden::etcd::access::DEFAULT_CLIENT_PORT)]
    etcd_client_port: u16,
    /// The CA of etcd's serving certificates (PEM file; default: ca.crt of
    /// --etcd-pki-dir without --etcd-endpoints).
    #[arg(long, env = "NODEWARDEN_ETCD_CA")]
    etcd_ca: Option<std::path::PathBuf>,
    /// nodewarden's etcd client certificate (PEM file; default: peer.crt of
    /// --etcd-pki-dir without --etcd-endpoints).
    #[arg(long, env = "NODEWARDEN_ETCD_CERT")]
    etcd_cert: Option<std::path::PathBuf>,
    /// The key of --etcd-cert (PEM file; default: peer.key of --etcd-pki-dir
    /// without --etcd-endpoints).
    #[arg(long, env = "NODEWARDEN_ETCD_KEY")]
    etcd_key: Option<std::path::PathBuf>,
    /// How long one etcd call may take (seconds).
    #[arg(long, env = "NODEWARDEN_ETCD_TIMEOUT", default_value_t = 5.0)]
    etcd_timeout: f64,
    /// Constellation's upgrade-agent socket (mounted from the node's
    /// /run/constellation-upgrade-agent.sock): a NodeVersion's new
    /// kubernetesClusterVersion is sent there to upgrade the control plane
    /// in place before nodes are replaced. Unset: off (Kubernetes versions
    /// come with new nodes only).
    #[arg(long, env = "NODEWARDEN_UPGRADE_AGENT_SOCKET")]
    upgrade_agent_socket: Option<std::path::PathBuf>,
    /// How long the upgrade-agent's kubeadm upgrade may take (seconds).
    #[arg(long, env = "NODEWARDEN_UPGRADE_AGENT_TIMEOUT", default_value_t = 1800.0)]
    upgrade_agent_timeout: f64,
    /// Serve SIPClusters over metal3 BareMetalHosts: auto (once metal3's API
    /// is installed, also when that happens after the start), on (it must
    /// be installed: /readyz waits for it) or off.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    sip: String,
    /// The surge of a rollout whose NodeVersion sets neither
    /// spec.rollout.maxSurge nor spec.maxNodeBudget: a count or a percentage.
    /// Settings given here survive a client writing the NodeVersion back
    /// without `rollout` (the constellation CLI's `apply`).
    #[arg(long, value_parser = int_or_percent)]
    rollout_max_surge: Option<IntOrString>,
    /// maxUnavailable of a rollout whose NodeVersion sets none.
    #[arg(long, value_parser = int_or_percent)]
    rollout_max_unavailable: Option<IntOrString>,
    /// controlPlaneFirst of a rollout whose NodeVersion sets none.
    #[arg(long, action = clap::ArgAction::Set)]
    rollout_control_plane_first: Option<bool>,
    /// joinTimeout of a rollout whose NodeVersion sets none (e.g. 30m).
    #[arg(long, value_parser = go_duration)]
    rollout_join_timeout: Option<String>,
    /// drainTimeout of a rollout whose NodeVersion sets none (e.g. 1h).
    #[arg(long, value_parser = go_duration)]
    rollout_drain_timeout: Option<String>,
    /// haltAfterFailedJoins of a rollout whose NodeVersion sets none
    /// (default 3; 0 never halts).
    #[arg(long)]
    rollout_halt_after_failed_joins: Option<u32>,
    /// haltAfterUnreadyPods of a rollout whose NodeVersion sets none
    /// (default 3; 0 never halts).
    #[arg(long)]
    rollout_halt_after_unready_pods: Option<u32>,
    /// podReadyTimeout of a rollout whose NodeVersion sets none (default 5m).
    #[arg(long, value_parser = go_duration)]
    rollout_pod_ready_timeout: Option<String>,
    /// waves of a rollout whose NodeVersion sets none: sizes, comma
    /// separated (e.g. 1,10%,100%: one node, a tenth, then the rest).
    #[arg(long, value_parser = int_or_percent, value_delimiter = ',')]
    rollout_waves: Option<Vec<IntOrString>>,
    /// soakTime of a rollout whose NodeVersion sets none (e.g. 10m).
    #[arg(long, value_parser = go_duration)]
    rollout_soak_time: Option<String>,
    /// topologyKey of a rollout whose NodeVersion sets none: the Node label
    /// whose values are failure domains, replaced one at a time (e.g.
    /// topology.kubernetes.io/zone).
    #[arg(long, value_parser = label_key)]
    rollout_topology_key: Option<String>,
    /// Watch upgrade Plans in this namespace only (default: all namespaces).
    #[arg(long, env = "NODEWARDEN_PLAN_NAMESPACE")]
    plan_namespace: Option<String>,
    /// How often a Plan's channel is asked for the latest version: seconds,
    /// or a duration such as 15m (upstream's SYSTEM_UPGRADE_PLAN_POLLING_INTERVAL).
    #[arg(long, env = "SYSTEM_UPGRADE_PLAN_POLLING_INTERVAL", default_value = "900", value_parser = seconds_or_duration)]
    plan_channel_poll: Duration,
    /// How long a node must stay Ready after its upgrade before the next starts (seconds).
    #[arg(long, default_value_t = 10.0)]
    plan_settle: f64,
    /// activeDeadlineSeconds of upgrade Jobs whose Plan sets none.
    #[arg(
        long,
        env = "SYSTEM_UPGRADE_JOB_ACTIVE_DEADLINE_SECONDS",
        default_value_t = 600
    )]
    plan_job_deadline: i64,
    /// Retries of a failed upgrade pod before its Job fails.
    #[arg(long, env = "SYSTEM_UPGRADE_JOB_BACKOFF_LIMIT", default_value_t = 2)]
    plan_job_backoff_limit: i32,
    /// How long a finished upgrade Job stays (seconds; at least a minute past
    /// the Plan's postCompleteDelay).
    #[arg(
        long,
        env = "SYSTEM_UPGRADE_JOB_TTL_SECONDS_AFTER_FINISH",
        default_value_t = 900
    )]
    plan_job_ttl: i32,
    /// Whether the upgrade container is privileged when its Plan gives no
    /// securityContext.
    #[arg(long, env = "SYSTEM_UPGRADE_JOB_PRIVILEGED", default_value_t = true, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    plan_job_privileged: bool,
    /// The imagePullPolicy of the Jobs' containers.
    #[arg(
        long,
        env = "SYSTEM_UPGRADE_JOB_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent",
        value_parser = ["IfNotPresent", "Always", "Never"]
    )]
    plan_job_image_pull_policy: String,
    /// The most activeDeadlineSeconds an upgrade Job gets (0: no maximum).
    #[arg(
        long,
        env = "SYSTEM_UPGRADE_JOB_ACTIVE_DEADLINE_SECONDS_MAX",
        default_value_t = 0
    )]
    plan_job_deadline_max: i64,
    /// The upgrade Jobs' `upgrade.cattle.io/controller` label: the System
    /// Upgrade Controller's name, so tools that select its Jobs find them.
    #[arg(long, env = "SYSTEM_UPGRADE_CONTROLLER_NAME", default_value = job::UPSTREAM_CONTROLLER)]
    plan_controller_name: String,
    /// The upgrade Jobs' podReplacementPolicy.
    #[arg(
        long,
        env = "SYSTEM_UPGRADE_JOB_POD_REPLACEMENT_POLICY",
        default_value = "TerminatingOrFailed",
        value_parser = ["TerminatingOrFailed", "Failed"]
    )]
    plan_job_pod_replacement_policy: String,
    /// Serve the validating admission webhook (HTTPS) on this address, e.g.
    /// 0.0.0.0:9443; unset: no webhook.
    #[arg(long, env = "NODEWARDEN_WEBHOOK_ADDR")]
    webhook_addr: Option<SocketAddr>,
    /// The webhook's Secret (CA and serving certificate, made by nodewarden).
    #[arg(long, default_value = nodewarden::admission::WEBHOOK_SECRET)]
    webhook_secret: String,
    /// Who makes the webhook's certificates: `own` (nodewarden: CA, renewal,
    /// caBundle) or `cert-manager` (it fills the Secret and the caBundle).
    #[arg(long, default_value = "own", value_parser = ["own", "cert-manager"])]
    webhook_certs: String,
    /// Where etcd's members run, for the webhook's quorum rule and the
    /// removal of a retired control-plane node's member: `auto` (where a
    /// static pod `kube-system/etcd-<node>`, label `component=etcd`, runs, as
    /// kubeadm and RKE2 make them), `true` (on every control-plane node: etcd
    /// without a pod, such as k3s's) or `false` (external etcd: no maintenance
    /// is refused for quorum, no member is removed).
    #[arg(long, env = "NODEWARDEN_ETCD_ON_CONTROL_PLANE", default_value = "auto")]
    etcd_on_control_plane: nodewarden::admission::rules::EtcdPlacement,
    /// The ValidatingWebhookConfiguration whose caBundle nodewarden keeps current.
    #[arg(long, default_value = nodewarden::admission::WEBHOOK_CONFIGURATION)]
    webhook_configuration: String,
    /// How long a webhook client may take to finish its TLS handshake (seconds).
    #[arg(long, env = "NODEWARDEN_WEBHOOK_HANDSHAKE_TIMEOUT", default_value_t = limits::HANDSHAKE_TIMEOUT.as_secs_f64())]
    webhook_handshake_timeout: f64,
    /// How long one webhook review may take, from its body to the answer
    /// (seconds; kube-apiserver waits 30 at most).
    #[arg(long, env = "NODEWARDEN_WEBHOOK_REQUEST_TIMEOUT", default_value_t = limits::REQUEST_TIMEOUT.as_secs_f64())]
    webhook_request_timeout: f64,
    /// Webhook connections at once; past it a new one is closed at once.
    #[arg(long, env = "NODEWARDEN_WEBHOOK_MAX_CONNECTIONS", default_value_t = limits::MAX_CONNECTIONS)]
    webhook_max_connections: usize,
    /// Webhook reviews at once (each may hold a body of up to 7 MiB); past
    /// it the answer is 429 with Retry-After: 1.
    #[arg(long, env = "NODEWARDEN_WEBHOOK_MAX_IN_FLIGHT", default_value_t = limits::MAX_IN_FLIGHT)]
    webhook_max_in_flight: usize,
    /// Path of a kubeconfig (default: in-cluster config, then $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
}

/// One malloc arena in glibc builds. glibc gives threads arenas of their own
/// and each keeps the pages freed after a list of thousands of Nodes: at
/// 5,000 Nodes a standby held 73 MB RSS with the default and 62 MB with one
/// arena (docs/performance.md). The threads are few, so one arena's lock
/// costs little. musl (the image) has no arenas.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt takes two integers; it runs before any other thread.
    unsafe {
        // Best effort: a C library that refuses keeps its default.
        let _ = libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// A failure ends the process with one line on stderr: the error and its
/// causes, joined by ": ", so a crash-looping Pod's last log line says it all.
fn main() -> std::process::ExitCode {
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("nodewarden: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn start() -> anyhow::Result<()> {
    one_malloc_arena();
    let cli = Cli::parse();
    match cli.command {
        Command::Run(mut args) => {
            let identity = args.identity.take().unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
                format!("{}-{}", host.trim(), std::process::id())
            });
            let tracer = nodewarden::telemetry::trace::init(&identity)?;
            nodewarden::telemetry::init_logging(cli.log_json, tracer);
            let result = tokio::runtime::Runtime::new()
                .context("starting the async runtime")?
                .block_on(run(*args, identity));
            // Spans still buffered go out before the process ends.
            nodewarden::telemetry::trace::shutdown();
            result
        }
        Command::Crds => print_crds(),
        Command::CopyEtcdPki { from, to } => copy_etcd_pki(&from, &to),
        Command::Handover {
            kubeconfig,
            namespace,
            lease_name,
            webhook_secret,
            node_selector,
            object_selector,
        } => {
            let scope = nodewarden::handover::Scope {
                nodes: node_selector,
                objects: object_selector,
            };
            let own = nodewarden::handover::OwnState {
                namespace,
                lease: lease_name,
                secret: webhook_secret,
            };
            tokio::runtime::Runtime::new()
                .context("starting the async runtime")?
                .block_on(handover(kubeconfig, scope, own))
        }
        Command::RelayUpgradeAgent { listen, to } => {
            nodewarden::telemetry::init_logging(cli.log_json, None);
            tokio::runtime::Runtime::new()
                .context("starting the async runtime")?
                .block_on(nodewarden::upgrade_agent::relay::relay(&listen, to))
                .with_context(|| format!("relaying {} to the upgrade-agent", listen.display()))
        }
    }
}

/// The cloud `--cloud` names (sim by default when --sim-cloud is given).
async fn cloud(
    args: &RunArgs,
) -> anyhow::Result<Option<std::sync::Arc<dyn nodewarden::cloud::CloudProvider>>> {
    use nodewarden::cloud::aws::AwsProvider;
    use nodewarden::cloud::sim::SimProvider;
    let which = args
        .cloud
        .clone()
        .unwrap_or_else(|| if args.sim_cloud.is_some() { "sim" } else { "none" }.into());
    Ok(match which.as_str() {
        "sim" => {
            let endpoint = args
                .sim_cloud
                .as_deref()
                .context("--cloud sim needs --sim-cloud")?;
            Some(std::sync::Arc::new(
                SimProvider::new(endpoint).context("configuring the sim cloud")?,
            ))
        }
        "aws" => Some(std::sync::Arc::new(
            AwsProvider::new(aws_config(args)?)
                .await
                .context("configuring the aws cloud")?,
        )),
        "gcp" => Some(std::sync::Arc::new(
            nodewarden::cloud::gcp::GcpProvider::new(gcp_config(args)?)
                .await
                .context("configuring the gcp cloud")?,
        )),
        "azure" => Some(std::sync::Arc::new(
            nodewarden::cloud::azure::AzureProvider::new(azure_config(args)?)
                .context("configuring the azure cloud")?,
        )),
        _ => None,
    })
}

/// The AWS settings nodewarden cannot guess, each refused at start with one
/// line naming where to set it when it is missing or empty: a wrong guess
/// (another region, every group of the account) would act on the wrong nodes.
fn aws_config(args: &RunArgs) -> anyhow::Result<nodewarden::cloud::aws::AwsConfig> {
    let given = |value: Option<String>| value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let cluster_uid = given(args.aws_cluster_uid.clone()).context(
        "--cloud aws needs the value of the cluster's Auto Scaling groups' constellation-uid tag: \
         set --aws-cluster-uid or NODEWARDEN_AWS_CLUSTER_UID",
    )?;
    let region = given(args.aws_region.clone())
        .or_else(|| given(std::env::var("AWS_REGION").ok()))
        .or_else(|| given(std::env::var("AWS_DEFAULT_REGION").ok()))
        .context(
            "--cloud aws needs the region of the cluster's Auto Scaling groups: \
             set --aws-region, NODEWARDEN_AWS_REGION or AWS_REGION",
        )?;
    Ok(nodewarden::cloud::aws::AwsConfig {
        cluster_uid,
        endpoint: args.aws_endpoint.clone(),
        region,
        static_credentials: None,
        call_timeout: Some(seconds(args.aws_call_timeout, "aws-call-timeout")?),
    })
}

/// The GCP settings nodewarden cannot guess (see [`aws_config`]); the
/// project may come from the credentials.
fn gcp_config(args: &RunArgs) -> anyhow::Result<nodewarden::cloud::gcp::GcpConfig> {
    let given = |value: Option<String>| value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let cluster_uid = given(args.gcp_cluster_uid.clone()).context(
        "--cloud gcp needs the value of the cluster's instance templates' constellation-uid label: \
         set --gcp-cluster-uid or NODEWARDEN_GCP_CLUSTER_UID",
    )?;
    Ok(nodewarden::cloud::gcp::GcpConfig {
        cluster_uid,
        project: given(args.gcp_project.clone()),
        endpoint: given(args.gcp_endpoint.clone()),
        credentials: None,
        call_timeout: Some(seconds(args.gcp_call_timeout, "gcp-call-timeout")?),
    })
}

/// The Azure settings nodewarden cannot guess (see [`aws_config`]).
fn azure_config(args: &RunArgs) -> anyhow::Result<nodewarden::cloud::azure::AzureConfig> {
    let given = |value: Option<String>| value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let cluster_uid = given(args.azure_cluster_uid.clone()).context(
        "--cloud azure needs the value of the cluster's scale sets' constellation-uid tag: \
         set --azure-cluster-uid or NODEWARDEN_AZURE_CLUSTER_UID",
    )?;
    let subscription = given(args.azure_subscription.clone())
        .or_else(|| given(std::env::var("AZURE_SUBSCRIPTION_ID").ok()))
        .context(
            "--cloud azure needs the subscription of the cluster's scale sets: \
             set --azure-subscription, NODEWARDEN_AZURE_SUBSCRIPTION or AZURE_SUBSCRIPTION_ID",
        )?;
    let resource_group = given(args.azure_resource_group.clone()).context(
        "--cloud azure needs the resource group of the cluster's scale sets: \
         set --azure-resource-group or NODEWARDEN_AZURE_RESOURCE_GROUP",
    )?;
    Ok(nodewarden::cloud::azure::AzureConfig {
        cluster_uid,
        subscription,
        resource_group,
        endpoint: given(args.azure_endpoint.clone()),
        call_timeout: Some(seconds(args.azure_call_timeout, "azure-call-timeout")?),
        ..Default::default()
    })
}

fn seconds(s: f64, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .with_context(|| format!("--{flag} must be a non-negative number of seconds"))
}

/// The webhook's limits: production's, with the flags' values.
fn webhook_limits(args: &RunArgs) -> anyhow::Result<limits::Limits> {
    anyhow::ensure!(
        args.webhook_max_connections > 0 && args.webhook_max_in_flight > 0,
        "--webhook-max-connections and --webhook-max-in-flight must be positive"
    );
    let mut l = limits::Limits {
        handshake_timeout: seconds(args.webhook_handshake_timeout, "webhook-handshake-timeout")?,
        request_timeout: seconds(args.webhook_request_timeout, "webhook-request-timeout")?,
        max_in_flight: args.webhook_max_in_flight,
        ..Default::default()
    };
    l.conn.max_connections = args.webhook_max_connections;
    Ok(l)
}

/// This replica's part in the leader election, from the `--lease-*`,
/// `--renew-deadline` and `--retry-period` flags.
fn leader_election(args: &RunArgs, identity: String) -> anyhow::Result<LeaderElectionConfig> {
    let mut leader =
        LeaderElectionConfig::new(args.lease_namespace.clone(), args.lease_name.clone(), identity);
    leader.lease_duration = seconds(args.lease_duration, "lease-duration")?;
    leader.renew_deadline = seconds(args.renew_deadline, "renew-deadline")?;
    leader.retry_period = seconds(args.retry_period, "retry-period")?;
    Ok(leader)
}

/// The admission webhook `--webhook-addr` asks for, if it does.
fn admission(args: &RunArgs) -> Option<nodewarden::admission::AdmissionConfig> {
    args.webhook_addr.map(|addr| {
        let mut a = nodewarden::admission::AdmissionConfig::in_namespace(addr, &args.lease_namespace);
        a.secret = args.webhook_secret.clone();
        a.webhook_configuration = args.webhook_configuration.clone();
        a.node_selector = args.node_selector.clone();
        a.etcd = args.etcd_on_control_plane;
        if args.webhook_certs == "cert-manager" {
            a.certificates = nodewarden::admission::CertSource::CertManager;
        }
        a
    })
}

/// How etcd is reached: the endpoints given, else found on the control
/// plane, unless it is external.
fn etcd(args: &RunArgs) -> anyhow::Result<nodewarden::etcd::EtcdSetup> {
    use nodewarden::admission::rules::EtcdPlacement;
    use nodewarden::etcd::{Discovery, EtcdClient, EtcdConfig, EtcdSetup};
    let timeout = seconds(args.etcd_timeout, "etcd-timeout")?;
    if !args.etcd_endpoints.is_empty() {
        let client = EtcdClient::new(EtcdConfig {
            endpoints: args.etcd_endpoints.clone(),
            ca: args.etcd_ca.clone(),
            cert: args.etcd_cert.clone(),
            key: args.etcd_key.clone(),
            timeout,
        })?;
        return Ok(EtcdSetup::Endpoints(std::sync::Arc::new(client)));
    }
    if args.etcd_on_control_plane == EtcdPlacement::External {
        return Ok(EtcdSetup::External);
    }
    let defaults = Discovery::in_dir(&args.etcd_pki_dir);
    Ok(EtcdSetup::Discover(Discovery {
        placement: args.etcd_on_control_plane,
        client_port: args.etcd_client_port,
        ca: args.etcd_ca.clone().unwrap_or(defaults.ca),
        cert: args.etcd_cert.clone().unwrap_or(defaults.cert),
        key: args.etcd_key.clone().unwrap_or(defaults.key),
        timeout,
    }))
}

/// How upgrade Plans are run, from the `--plan-*` flags.
fn plans(args: &RunArgs) -> anyhow::Result<PlanConfig> {
    Ok(PlanConfig {
        namespace: args.plan_namespace.clone(),
        channel_poll: args.plan_channel_poll,
        settle: seconds(args.plan_settle, "plan-settle")?,
        jobs: JobDefaults {
            active_deadline_secs: args.plan_job_deadline,
            backoff_limit: args.plan_job_backoff_limit,
            ttl_after_finished_secs: args.plan_job_ttl,
            privileged: args.plan_job_privileged,
            image_pull_policy: args.plan_job_image_pull_policy.clone(),
            active_deadline_max_secs: args.plan_job_deadline_max,
            controller_name: args.plan_controller_name.clone(),
            pod_replacement_policy: args.plan_job_pod_replacement_policy.clone(),
        },
        ..Default::default()
    })
}

async fn run(args: RunArgs, identity: String) -> anyhow::Result<()> {
    let cloud = cloud(&args).await?;
    let admission = admission(&args);
    let webhook_limits = webhook_limits(&args)?;
    let leader = leader_election(&args, identity)?;
    let client = nodewarden::client::build(args.kubeconfig.as_deref()).await?;
    // Checked once the client is built: a missing kubeconfig is reported first.
    let cloud_ration = Ration::new(args.cloud_qps, args.cloud_burst)
        .context("--cloud-qps and --cloud-burst must be positive")?;
    let etcd = etcd(&args)?;
    let plans = plans(&args)?;
    let config = OperatorConfig {
        leader,
        http_addr: args.http_addr,
        node_selector: args.node_selector,
        object_selector: args.object_selector,
        maintenance: MaintenanceConfig {
            max_concurrent: args.max_concurrent_maintenance,
            lease_namespace: args.maintenance_lease_namespace,
        },
        workers: args.workers,
        cloud,
        cloud_ration,
        discover_scaling_groups: args.discover_scaling_groups,
        etcd,
        upgrade_agent: match &args.upgrade_agent_socket {
            Some(socket) => Some(nodewarden::upgrade_agent::AgentClient::new(
                socket.clone(),
                seconds(args.upgrade_agent_timeout, "upgrade-agent-timeout")?,
            )),
            None => None,
        },
        admission,
        webhook_limits,
        bare_metal: match args.sip.as_str() {
            "on" => BareMetal::On,
            "off" => BareMetal::Off,
            _ => BareMetal::WhenInstalled,
        },
        rollout: Rollout {
            max_surge: args.rollout_max_surge,
            max_unavailable: args.rollout_max_unavailable,
            control_plane_first: args.rollout_control_plane_first,
            join_timeout: args.rollout_join_timeout,
            drain_timeout: args.rollout_drain_timeout,
            halt_after_failed_joins: args.rollout_halt_after_failed_joins,
            halt_after_unready_pods: args.rollout_halt_after_unready_pods,
            pod_ready_timeout: args.rollout_pod_ready_timeout,
            waves: args.rollout_waves,
            soak_time: args.rollout_soak_time,
            topology_key: args.rollout_topology_key,
        },
        plans,
    };
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        nodewarden::signal::wait().await;
        tracing::info!("signal received: shutting down gracefully");
        signals.cancel();
    });
    operator::run(client, config, shutdown).await?;
    Ok(())
}

fn print_crds() -> anyhow::Result<()> {
    let mut out = String::new();
    for crd in nodewarden::api::all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&crd).context("serializing a CRD to YAML")?);
    }
    print!("{out}");
    Ok(())
}

/// A count (`3`) or a percentage (`25%`), as `spec.rollout` takes them.
fn int_or_percent(s: &str) -> Result<IntOrString, String> {
    let value = match s.parse::<i32>() {
        Ok(n) => IntOrString::Int(n),
        Err(_) => IntOrString::String(s.to_string()),
    };
    match scaled_int_or_percent(&value, 100, true) {
        Some(_) => Ok(value),
        None => Err(format!(
            "{s:?} is neither a count (0 or more) nor a percentage such as 25%"
        )),
    }
}

/// A duration such as `90s`, `30m` or `1h30m`, as `spec.rollout` takes them.
fn go_duration(s: &str) -> Result<String, String> {
    match nodewarden::api::node_maintenance::parse_duration(s) {
        Some(_) => Ok(s.to_string()),
        None => Err(format!("{s:?} is not a duration such as 90s, 30m or 1h30m")),
    }
}

/// A Node label key such as `topology.kubernetes.io/zone`.
fn label_key(s: &str) -> Result<String, String> {
    match nodewarden::api::update::rollout::is_label_key(s) {
        true => Ok(s.to_string()),
        false => Err(format!(
            "{s:?} is not a label key such as topology.kubernetes.io/zone"
        )),
    }
}

/// Seconds (`900`, `2.5`) or a duration (`15m`, `1h30m`).
fn seconds_or_duration(s: &str) -> Result<Duration, String> {
    let parsed = match s.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).ok(),
        Err(_) => nodewarden::api::node_maintenance::parse_duration(s),
    };
    parsed.ok_or_else(|| format!("{s:?} is neither a number of seconds nor a duration such as 15m"))
}

/// `nodewarden copy-etcd-pki`: says what it copied, or that there was nothing.
fn copy_etcd_pki(from: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    let copied = nodewarden::etcd::access::copy_pki(from, to).with_context(|| {
        format!(
            "copying the etcd certificates from {} to {}",
            from.display(),
            to.display()
        )
    })?;
    if copied == 0 {
        println!(
            "no etcd certificates in {}: not a control-plane node; a stacked member is reported unreachable if this replica leads",
            from.display()
        );
    } else {
        println!(
            "copied {copied} etcd certificate files from {} to {}",
            from.display(),
            to.display()
        );
    }
    Ok(())
}

/// `nodewarden handover`: says each change, then that nothing is left.
async fn handover(
    kubeconfig: Option<std::path::PathBuf>,
    scope: nodewarden::handover::Scope,
    own: nodewarden::handover::OwnState,
) -> anyhow::Result<()> {
    let client = nodewarden::client::build(kubeconfig.as_deref()).await?;
    let report = nodewarden::handover::hand_over_retrying(&client, &scope, &own, 6)
        .await
        .context("handing over (run it again: every step is repeatable)")?;
    for line in &report.done {
        println!("{line}");
    }
    println!(
        "handed over: {} changes; nothing of nodewarden's is left on any object",
        report.done.len()
    );
    Ok(())
}
