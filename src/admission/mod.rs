//! The validating admission webhook, served over TLS by every replica (not
//! only the leader: admission must not wait for a failover).
//!
//! - [`rules`]: what is allowed, as pure functions (NodeMaintenance in both
//!   groups with the Node Maintenance Operator's messages, ScalingGroups
//!   naming a NodeVersion).
//! - [`certs`]: the CA and serving certificate nodewarden makes for itself.
//! - [`server`]: the HTTPS endpoint, what it reads to decide, and the task
//!   that keeps the certificates (and the configuration's caBundle) current.
//! - [`review`]: the AdmissionReview as far as the rules read it, and the answer.
//! - [`limits`]: what any client that reaches the webhook may take of a
//!   replica (body size, time, connections and reviews at once).
//!
//! Reads are live (GET/LIST at the API server), not from the caches: two
//! NodeMaintenances created a moment apart must see each other, and
//! admission is rare enough for that to cost nothing. The static etcd pods
//! are read only for a control-plane node, by label in kube-system alone.

pub mod certs;
pub mod limits;
pub mod metrics;
pub mod review;
pub mod rules;
pub mod server;

use std::net::SocketAddr;
use std::time::Duration;

pub use certs::ServingNames;
pub use limits::Limits;

/// Who makes the webhook's certificates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CertSource {
    /// nodewarden: its own CA and serving certificate, renewed by the
    /// leader, and the configuration's caBundle kept current.
    #[default]
    Own,
    /// cert-manager: it writes the Secret (`tls.crt`, `tls.key`) and its CA
    /// injector the caBundle; nodewarden only serves what the Secret holds.
    CertManager,
}

/// The certificate Secret's name unless `--webhook-secret` says otherwise.
pub const WEBHOOK_SECRET: &str = "nodewarden-webhook-tls";
/// The ValidatingWebhookConfiguration's name unless `--webhook-configuration`
/// says otherwise.
pub const WEBHOOK_CONFIGURATION: &str = "nodewarden";

/// Where and how the webhook is served.
#[derive(Clone, Debug)]
pub struct AdmissionConfig {
    /// The HTTPS address (the Deployment's container port 9443).
    pub addr: SocketAddr,
    /// Namespace of the certificate Secret (the operator's own).
    pub namespace: String,
    /// Name of the certificate Secret.
    pub secret: String,
    /// The ValidatingWebhookConfiguration whose caBundle every replica keeps current.
    pub webhook_configuration: String,
    /// Names the serving certificate is valid for.
    pub names: ServingNames,
    /// Who makes the certificates.
    pub certificates: CertSource,
    /// Only Nodes matching this label selector count as the control plane
    /// whose quorum is guarded (the operator's --node-selector).
    pub node_selector: Option<String>,
    /// Where etcd's members run: the quorum rule applies only to a node
    /// that runs one (the operator's --etcd-on-control-plane).
    pub etcd: rules::EtcdPlacement,
    /// How often the Secret is read again (new certificate, renewal) and the
    /// caBundle checked.
    pub refresh: Duration,
}

impl AdmissionConfig {
    /// The in-cluster shape: Secret [`WEBHOOK_SECRET`], configuration
    /// [`WEBHOOK_CONFIGURATION`], a certificate for the Service `nodewarden-webhook`.
    pub fn in_namespace(addr: SocketAddr, namespace: &str) -> AdmissionConfig {
        let service = "nodewarden-webhook";
        AdmissionConfig {
            addr,
            namespace: namespace.to_string(),
            secret: WEBHOOK_SECRET.into(),
            webhook_configuration: WEBHOOK_CONFIGURATION.into(),
            names: ServingNames {
                dns: vec![
                    format!("{service}.{namespace}.svc"),
                    format!("{service}.{namespace}.svc.cluster.local"),
                    format!("{service}.{namespace}"),
                ],
                ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
            },
            certificates: CertSource::Own,
            node_selector: None,
            etcd: Default::default(),
            refresh: Duration::from_secs(10),
        }
    }
}
