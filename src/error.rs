//! Library errors. Each error has a category: a short, stable word. Every
//! controller reports a failed reconcile as a Warning Event on its object with
//! the category as reason (`App::report_failures`; a 409 conflict is routine
//! and emits none), and counts it in `nodewarden_reconcile_errors_total` under
//! the category label.

use std::time::Duration;

pub use crate::runtime::error::{Categorized, Category, Retry};

/// nodewarden's own error categories, beside the runtime's.
pub mod category {
    use super::Category;

    /// A cloud provider call failed.
    pub use crate::cloud::error::CATEGORY as CLOUD;
    /// A drained node runs pods again (bound after its drain): not deleted yet.
    pub const DRAIN_INCOMPLETE: Category = Category::App("DrainIncomplete");
    /// etcd refused or failed a request, or could not be reached.
    pub use crate::etcd::CATEGORY as ETCD;
}

/// Errors of the nodewarden library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed (the API server's answer, or no answer).
    #[error("kubernetes API: {}", kube_message(.0))]
    Kube(#[from] kube::Error),
    /// An object the reconcile needs is not there.
    #[error("{kind} {name} not found")]
    NotFound {
        /// The object's kind, e.g. "Node".
        kind: &'static str,
        /// The object's name.
        name: String,
    },
    /// An object nodewarden cannot act on as it is; not retried until it changes.
    #[error("invalid {kind} {name}: {reason}")]
    InvalidObject {
        /// The object's kind.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// What is wrong with it, naming the field.
        reason: String,
    },
    /// A cloud provider call failed.
    #[error("cloud: {0}")]
    Cloud(#[from] crate::cloud::CloudError),
    /// An object did not serialize or deserialize.
    #[error("serialization: {0}")]
    Serialization(#[from] serde_json::Error),
    /// This replica lost (or never held) the leader lease, so it must not act.
    #[error("this replica is not the leader")]
    NotLeader,
    /// A drained node runs evictable pods again (bound after its drain ended,
    /// by a scheduler that had not seen the cordon): it is not deleted until
    /// they are gone.
    #[error("node {node} runs pods bound after its drain ({}); evicting them before it is deleted", .pods.join(", "))]
    PodsLeft {
        /// The node.
        node: String,
        /// The pods, as namespace/name.
        pods: Vec<String>,
    },
    /// An object changed since the reconcile judged it (seen in a newer
    /// read than the one it decided on); retried on fresh state.
    #[error("{kind} {name} changed since it was read: {reason}")]
    Changed {
        /// The object's kind.
        kind: &'static str,
        /// The object's name (namespace/name when namespaced).
        name: String,
        /// What changed.
        reason: String,
    },
    /// An etcd call failed (reaching etcd, or its answer).
    #[error(transparent)]
    Etcd(#[from] crate::etcd::EtcdError),
    /// Something the reconcile waited for did not finish in time.
    #[error("{what} did not finish within {after:?}")]
    Timeout {
        /// What did not finish.
        what: String,
        /// How long it was given.
        after: Duration,
    },
}

impl From<crate::runtime::lease::LeaseError> for Error {
    fn from(e: crate::runtime::lease::LeaseError) -> Self {
        use crate::runtime::lease::LeaseError;
        match e {
            LeaseError::Kube(e) => Error::Kube(e),
            LeaseError::Timeout { lease, after } => Error::Timeout {
                what: format!("lease {lease}"),
                after,
            },
            LeaseError::NoResourceVersion { lease } => Error::InvalidObject {
                kind: "Lease",
                name: lease,
                reason: "it has no metadata.resourceVersion".into(),
            },
        }
    }
}

impl From<crate::runtime::leader::NotLeader> for Error {
    fn from(_: crate::runtime::leader::NotLeader) -> Self {
        Error::NotLeader
    }
}

/// The API server's answer in one line (kube's own message appends the
/// whole Status in Debug form).
fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} {}: {}", status.code, status.reason, status.message),
        other => other.to_string(),
    }
}

/// A write the fence refused or abandoned (`runtime::fence`): this replica
/// does not lead, whatever the reconcile was about.
fn fenced(e: &kube::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.is::<crate::runtime::fence::FenceError>() {
            return true;
        }
        source = err.source();
    }
    false
}

impl Error {
    /// The error's category (a 409 is a Conflict and a 404 NotFound, whichever
    /// variant carries it).
    pub fn category(&self) -> Category {
        match self {
            Error::Kube(kube::Error::Api(status)) if status.code == 409 => Category::Conflict,
            Error::Kube(kube::Error::Api(status)) if status.code == 404 => Category::NotFound,
            Error::Kube(e) if fenced(e) => Category::NotLeader,
            Error::Kube(_) => Category::KubeApi,
            Error::NotFound { .. } => Category::NotFound,
            Error::InvalidObject { .. } => Category::InvalidObject,
            Error::Cloud(_) => category::CLOUD,
            Error::Serialization(_) => Category::Serialization,
            Error::NotLeader => Category::NotLeader,
            Error::Timeout { .. } => Category::Timeout,
            Error::Changed { .. } => Category::Conflict,
            Error::PodsLeft { .. } => category::DRAIN_INCOMPLETE,
            Error::Etcd(_) => category::ETCD,
        }
    }
}

impl Categorized for Error {
    fn category(&self) -> Category {
        Error::category(self)
    }

    /// A throttled cloud is retried no sooner than it asked; an object that
    /// is invalid as it is, or a cloud request refused as it is, waits for
    /// the next change instead of being retried unchanged.
    fn retry(&self) -> Retry {
        match self {
            Error::Cloud(e) => match e.retry_after() {
                Some(after) => Retry::After(after),
                // Not found may be the cloud's eventual consistency after a create.
                None if e.retryable() || e.is_not_found() => Retry::Backoff,
                None => Retry::Never,
            },
            Error::InvalidObject { .. } => Retry::Never,
            _ => Retry::Backoff,
        }
    }
}

/// A Result whose error is, by default, the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_errors_read_as_one_line_with_code_reason_and_message() {
        let status = kube::core::Status::failure("nodes \"n1\" not found", "NotFound").with_code(404);
        let e = Error::Kube(kube::Error::Api(Box::new(status)));
        assert_eq!(
            e.to_string(),
            "kubernetes API: 404 NotFound: nodes \"n1\" not found"
        );
        assert_eq!(e.category(), Category::NotFound);
    }

    #[test]
    fn a_write_the_fence_stopped_is_not_leader() {
        use crate::runtime::fence::FenceError;
        let refused = FenceError::Lapsed {
            method: http::Method::POST,
            path: "/api/v1/namespaces/a/pods/p/eviction".into(),
        };
        let e = Error::Kube(kube::Error::Service(Box::new(refused)));
        assert_eq!(e.category(), Category::NotLeader);
        let other = Error::Kube(kube::Error::Service("connection reset".into()));
        assert_eq!(other.category(), Category::KubeApi);
    }
}
