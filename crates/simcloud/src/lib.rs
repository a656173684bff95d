//! The simulated cloud, run as the `nodewarden-simcloud` binary: a separate
//! process that behaves like a cloud provider's API, for tests and demos of
//! node rollouts without a cloud.
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
//! A crate of its own, apart from the operator: it speaks the protocol of
//! [`nodewarden_simwire`] (and converts its model to it), the operator's
//! `sim` provider imports nothing from here, and this crate nothing from the
//! operator. The process around it (flags, the Kubernetes client, the HTTP
//! server and its connection limits, logging, signals) is the
//! `nodewarden-simcloud` binary of the root package.
//!
//! - [`config`]: the groups file; [`model`]: state and rules, no IO;
//!   [`faults`]: how injected faults are decided; [`persist`]: the state
//!   file; [`store`]: the running state; [`open`]: the state a start begins
//!   with; [`server`]: the HTTP API; [`joiner`] and [`nodes`]: Node creation.
#![warn(missing_docs)]

pub mod config;
pub mod faults;
pub mod joiner;
pub mod model;
pub mod nodes;
pub mod persist;
pub mod server;
pub mod store;

use std::path::Path;
use std::sync::Arc;

use config::{ConfigError, SimConfig};
use model::Cloud;
use persist::PersistError;
use store::SimStore;

/// Why the sim-cloud could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimCloudError {
    /// The groups file is missing or invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The state file cannot be read or written.
    #[error(transparent)]
    State(#[from] PersistError),
}

/// The state a sim-cloud starts serving with.
pub struct Opened {
    /// The running state, saved to the state file on every change.
    pub store: Arc<SimStore>,
    /// True when the state came from the state file (a restart).
    pub restored: bool,
    /// How many instances it has (Terminated ones too).
    pub instances: usize,
}

/// The cloud of the state file at `state` (a fresh one when there is none
/// yet) with the groups of the file at `config` applied, saved when that
/// changed anything or the cloud is fresh.
pub fn open(config: &Path, state: &Path) -> Result<Opened, SimCloudError> {
    let config = SimConfig::load(config)?;
    let restored = persist::load(state)?;
    let fresh = restored.is_none();
    let mut cloud = restored.unwrap_or_else(Cloud::default);
    if cloud.apply_config(&config, model::now()) || fresh {
        persist::save(state, &cloud)?;
    }
    let instances = cloud.instances.len();
    Ok(Opened {
        store: Arc::new(SimStore::new(cloud, state.to_path_buf())),
        restored: !fresh,
        instances,
    })
}
