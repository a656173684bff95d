//! What the runtime needs to know about a reconcile's error: its category
//! (a stable word for logs, metrics and Event reasons) and how to retry it.
//! The application's error types implement [`Categorized`]; the runtime
//! knows nothing else about them.

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
    /// This replica is not (or no longer) the leader.
    NotLeader,
    /// Serialization of an object failed.
    Serialization,
    /// A deadline passed (including a reconcile that ran past its timeout).
    Timeout,
    /// The reconcile panicked (a bug; caught, counted and retried).
    Panic,
    /// A category of the application's own (a cloud, a drain, etcd): its
    /// word for Events and metrics, in the same CamelCase.
    App(&'static str),
}

impl Category {
    /// The category as it appears in Events (reason) and metrics (label).
    pub fn as_str(self) -> &'static str {
        match self {
            Category::KubeApi => "KubeApiError",
            Category::Conflict => "Conflict",
            Category::NotFound => "NotFound",
            Category::InvalidObject => "InvalidObject",
            Category::NotLeader => "NotLeader",
            Category::Serialization => "SerializationError",
            Category::Timeout => "Timeout",
            Category::Panic => "Panic",
            Category::App(word) => word,
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the controller retries a failed reconcile (controller-runtime's
/// TerminalError / RequeueAfter, kube-runtime's error_policy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// The queue's rate limiter decides: per-key exponential backoff and the
    /// shared token bucket.
    Backoff,
    /// Not sooner than this (the other side said when, e.g. a throttled
    /// cloud's Retry-After); never sooner than the backoff either.
    After(Duration),
    /// Trying again unchanged cannot help: wait for the next change of the
    /// object (an event re-queues it).
    Never,
}

/// An error that knows its category (for Events and the error metric) and
/// how it should be retried.
pub trait Categorized: std::error::Error + Send + Sync + 'static {
    /// The error's category.
    fn category(&self) -> Category;

    /// How to retry; by default the queue's backoff.
    fn retry(&self) -> Retry {
        Retry::Backoff
    }
}
