//! Library errors. Each error has a category: a short, stable word that becomes
//! the reason of the Kubernetes Event it causes and the label of the
//! `reconcile_errors_total` metric.

use std::time::Duration;

/// A stable classification of an error, used as Event reason and metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// The Kubernetes API server refused or failed a request.
    KubeApi,
    /// The API server answered 409: someone else changed the object first.
    Conflict,
    /// An object a reconcile needs is not there (yet).
    NotFound,
    /// The cluster holds an object nodewarden cannot act on as it is.
    InvalidObject,
    /// A cloud provider call failed.
    Cloud,
    /// This replica is not (or no longer) the leader.
    NotLeader,
    /// Serialization of an object failed.
    Serialization,
    /// A deadline passed.
    Timeout,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::KubeApi => "KubeApiError",
            Category::Conflict => "Conflict",
            Category::NotFound => "NotFound",
            Category::InvalidObject => "InvalidObject",
            Category::Cloud => "CloudError",
            Category::NotLeader => "NotLeader",
            Category::Serialization => "SerializationError",
            Category::Timeout => "Timeout",
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the nodewarden library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {}", kube_message(.0))]
    Kube(#[from] kube::Error),
    #[error("{kind} {name} not found")]
    NotFound { kind: &'static str, name: String },
    #[error("invalid {kind} {name}: {reason}")]
    InvalidObject {
        kind: &'static str,
        name: String,
        reason: String,
    },
    #[error("cloud: {0}")]
    Cloud(#[from] crate::cloud::CloudError),
    #[error("serialization: {0}")]
    Serialization(#[from] serde_json::Error),
    #[error("this replica is not the leader")]
    NotLeader,
    #[error("{what} did not finish within {after:?}")]
    Timeout { what: String, after: Duration },
}

/// The API server's answer in one line (kube's own message appends the
/// whole Status in Debug form).
fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} {}: {}", status.code, status.reason, status.message),
        other => other.to_string(),
    }
}

impl Error {
    pub fn category(&self) -> Category {
        match self {
            Error::Kube(kube::Error::Api(status)) if status.code == 409 => Category::Conflict,
            Error::Kube(kube::Error::Api(status)) if status.code == 404 => Category::NotFound,
            Error::Kube(_) => Category::KubeApi,
            Error::NotFound { .. } => Category::NotFound,
            Error::InvalidObject { .. } => Category::InvalidObject,
            Error::Cloud(_) => Category::Cloud,
            Error::Serialization(_) => Category::Serialization,
            Error::NotLeader => Category::NotLeader,
            Error::Timeout { .. } => Category::Timeout,
        }
    }
}

/// An error that knows its category (for Events and the error metric).
pub trait Categorized: std::error::Error + Send + Sync + 'static {
    fn category(&self) -> Category;
}

impl Categorized for Error {
    fn category(&self) -> Category {
        Error::category(self)
    }
}

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
}
