//! Building the Kubernetes client nodewarden uses.
//!
//! kube's built-in retry of 429/503/504 is switched off: nodewarden retries
//! through its own work queue and backoffs, and a 429 from the Eviction API
//! means "a PodDisruptionBudget says no" — retrying that inside one call would
//! hide the answer for minutes.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file given could not be read or used.
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file given.
        path: String,
        /// What was wrong with it.
        source: kube::config::KubeconfigError,
    },
    /// No configuration found in the environment (in-cluster, $KUBECONFIG, ~/.kube/config).
    #[error("loading Kubernetes client configuration: {0}")]
    Config(#[from] kube::config::InferConfigError),
    /// The configuration was found but the client could not be built from it.
    #[error("building the Kubernetes client: {0}")]
    Build(#[from] kube::Error),
}

/// A client from `kubeconfig`, or else from the environment (in-cluster,
/// $KUBECONFIG, ~/.kube/config).
pub async fn build(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?
        }
        None => Config::infer().await?,
    };
    from_config(config)
}

/// A client from `config`, with kube's hidden retries switched off.
pub fn from_config(mut config: Config) -> Result<Client, ClientError> {
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}
