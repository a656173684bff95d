//! `nodewarden sim-cloud`: a separate process that behaves like a cloud
//! provider's API, for tests and demos of node rollouts without a cloud.
//!
//! It has scaling groups with an image; instances that boot after a delay
//! and then join as kwok Nodes (kwok plays their kubelet); deletes that take
//! time; and injectable faults (errors, throttling, lost answers, instances
//! that never join or fail to boot). Its state is written to a file after
//! every change and read back on start, so it survives restarts of the
//! operator and of itself, timers included. It is a test double of a cloud,
//! not of Kubernetes: it creates the Nodes of joining instances, as kubelets
//! would, but never deletes a Node — that is the operator's job, as in
//! Constellation.
//!
//! Its own module tree, apart from the providers in [`crate::cloud`]: it
//! speaks the protocol of [`crate::cloud::sim::wire`] (and converts its model
//! to it), while the `sim` provider imports nothing from here.
//!
//! - [`config`]: the groups file; [`model`]: state and rules, no IO;
//!   [`faults`]: how injected faults are decided; [`persist`]: the state
//!   file; [`store`]: the running state; [`server`]: the HTTP API;
//!   [`joiner`] and [`nodes`]: Node creation.

pub mod config;
pub mod faults;
pub mod joiner;
pub mod model;
pub mod nodes;
pub mod persist;
pub mod server;
pub mod store;

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use config::{ConfigError, SimConfig};
use model::Cloud;
use persist::PersistError;
use store::SimStore;

/// Flags of `nodewarden sim-cloud`.
#[derive(Clone, Debug, clap::Args)]
pub struct SimCloudArgs {
    /// YAML file with the scaling groups (id, role, initialSize, image, delays, labels).
    #[arg(long)]
    pub config: PathBuf,
    /// JSON file holding the cloud's state: rewritten on every change, reloaded on start.
    #[arg(long)]
    pub state: PathBuf,
    /// Address of the HTTP API (port 0 picks a free port). The bound address is
    /// printed as the first line on stdout: `listening on 127.0.0.1:34567`.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Kubeconfig of the cluster the instances join (default: in-cluster, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Why the sim-cloud could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimCloudError {
    /// The groups file is missing or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The state file cannot be read or written.
    #[error(transparent)]
    State(#[from] PersistError),
    /// No Kubernetes client for the cluster the instances join.
    #[error(transparent)]
    Client(#[from] crate::client::ClientError),
    /// The HTTP API's address cannot be bound.
    #[error("listening on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding it failed.
        source: std::io::Error,
    },
}

/// Runs the sim-cloud until `shutdown` is cancelled. Nothing needs saving on
/// the way out: every change was saved when it was made.
pub async fn run(args: SimCloudArgs, shutdown: CancellationToken) -> Result<(), SimCloudError> {
    let config = SimConfig::load(&args.config)?;
    let restored = persist::load(&args.state)?;
    let fresh = restored.is_none();
    let mut cloud = restored.unwrap_or_else(Cloud::default);
    if cloud.apply_config(&config, model::now()) || fresh {
        persist::save(&args.state, &cloud)?;
    }
    let client = crate::client::build(args.kubeconfig.as_deref()).await?;
    let instances = cloud.instances.len();
    let sim = Arc::new(SimStore::new(cloud, args.state.clone()));
    let (addr, serve) = server::bind(args.listen, sim.clone(), shutdown.clone())
        .await
        .map_err(|source| SimCloudError::Listen {
            addr: args.listen,
            source,
        })?;
    // The first line on stdout is the contract with whoever started us.
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, state = %args.state.display(), instances, restored = !fresh, "sim-cloud serving");
    let joiner = tokio::spawn(joiner::run(sim, client, shutdown.clone()));
    serve.await;
    let _ = joiner.await;
    Ok(())
}
