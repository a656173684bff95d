//! Building the Kubernetes client nodewarden uses.
//!
//! kube's built-in retry of 429/503/504 is switched off: nodewarden retries
//! through its own work queue and backoffs, and a 429 from the Eviction API
//! means "a PodDisruptionBudget says no" — retrying that inside one call would
//! hide the answer for minutes.

use std::path::Path;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::{BoxError, ServiceBuilder};

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

/// A client from `config`: kube's own stack, less its hidden retries, on
/// connections that send each request at once.
///
/// kube leaves Nagle's algorithm on: a request's last small segment may then
/// wait for the API server to acknowledge the one before, which Linux delays
/// by up to 40 ms. Go's net package, and so client-go, sets TCP_NODELAY on
/// every connection; so does this client.
pub fn from_config(mut config: Config) -> Result<Client, ClientError> {
    if config.proxy_url.is_some() {
        // Through a proxy: kube's own connectors (they speak to proxies).
        config.default_retry = false;
        return Ok(Client::try_from(config)?);
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let tls = config.rustls_https_connector_with_connector(tcp)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}
