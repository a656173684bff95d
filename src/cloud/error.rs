//! Errors of cloud provider calls. Every provider maps its API's failures onto
//! these variants, so callers decide "retry or not" and "gone or not yet"
//! without knowing which cloud they talk to.

use std::time::Duration;

use crate::runtime::error::{Categorized, Category};

/// Why a cloud provider call failed, in terms every provider can map onto.
/// [`CloudError::retryable`] is the one question most callers ask.
#[derive(Clone, Debug, thiserror::Error)]
pub enum CloudError {
    /// The cloud has no record of the thing asked about. Deliberately not a
    /// state: see [`super::CloudProvider::node_state`].
    #[error("{what} not found in the cloud")]
    NotFound {
        /// What was looked for (an instance, a group, a call's path).
        what: String,
    },
    /// The cloud asked us to slow down (HTTP 429, quota per second, ...).
    #[error("the cloud throttled the request (retry after {retry_after:?})")]
    Throttled {
        /// How long the cloud asked us to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// The cloud failed on its side (HTTP 5xx).
    #[error("the cloud failed the request with status {status}: {message}")]
    Server {
        /// The HTTP status (or the closest one to the cloud's error code).
        status: u16,
        /// The cloud's own words.
        message: String,
    },
    /// The request did not reach the cloud or its answer did not come back
    /// (connection refused or reset). Whether it took effect is unknown.
    #[error("cannot reach the cloud: {0}")]
    Transport(String),
    /// No answer within the provider's timeout. Whether it took effect is unknown.
    #[error("no answer from the cloud within {after:?}")]
    Timeout {
        /// The timeout that ran out.
        after: Duration,
    },
    /// The cloud refused the request as it is (HTTP 4xx other than 404 and
    /// 429): asking again unchanged will not help.
    #[error("the cloud rejected the request with status {status}: {message}")]
    Rejected {
        /// The HTTP status (or the closest one to the cloud's error code).
        status: u16,
        /// The cloud's own words.
        message: String,
    },
    /// The provider ID is not one of this provider's.
    #[error("provider ID {provider_id:?} is not valid here: {reason}")]
    InvalidProviderId {
        /// The provider ID as given.
        provider_id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cloud's answer could not be understood.
    #[error("unexpected answer from the cloud: {0}")]
    InvalidResponse(String),
    /// The provider is set up wrongly (endpoint, credentials, region).
    #[error("the cloud provider is misconfigured: {0}")]
    Config(String),
    /// An earlier capacity change has had no answer and may still be
    /// carried out: this one waits until it shows or cannot anymore.
    #[error(
        "{change} has had no answer for {waited:?} and may still be carried out; no other capacity change is sent before it shows or {limit:?} have passed"
    )]
    ChangeInDoubt {
        /// The change in doubt, in words.
        change: String,
        /// How long ago it was sent.
        waited: Duration,
        /// How long it may still land.
        limit: Duration,
    },
    /// The provider cannot do this at all (e.g. a bare-metal pool has no image to set).
    #[error("the {provider} provider cannot {operation}")]
    Unsupported {
        /// The provider's [`name`](super::CloudProvider::name).
        provider: String,
        /// What it cannot do, as a verb phrase: "set a group image".
        operation: &'static str,
    },
}

/// Every cloud failure's category for Events and the error metric.
pub const CATEGORY: Category = Category::App("CloudError");

/// A [`CloudError`]'s variant without its details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CloudErrorKind {
    /// [`CloudError::NotFound`]
    NotFound,
    /// [`CloudError::Throttled`]
    Throttled,
    /// [`CloudError::Server`]
    Server,
    /// [`CloudError::Transport`]
    Transport,
    /// [`CloudError::Timeout`]
    Timeout,
    /// [`CloudError::Rejected`]
    Rejected,
    /// [`CloudError::InvalidProviderId`]
    InvalidProviderId,
    /// [`CloudError::InvalidResponse`]
    InvalidResponse,
    /// [`CloudError::Config`]
    Config,
    /// [`CloudError::ChangeInDoubt`]
    ChangeInDoubt,
    /// [`CloudError::Unsupported`]
    Unsupported,
}

impl CloudErrorKind {
    /// The kind in snake case, as the `cloud_errors` metric labels it:
    /// `not_found`, `throttled`, ...
    pub fn as_str(self) -> &'static str {
        match self {
            CloudErrorKind::NotFound => "not_found",
            CloudErrorKind::Throttled => "throttled",
            CloudErrorKind::Server => "server",
            CloudErrorKind::Transport => "transport",
            CloudErrorKind::Timeout => "timeout",
            CloudErrorKind::Rejected => "rejected",
            CloudErrorKind::InvalidProviderId => "invalid_provider_id",
            CloudErrorKind::InvalidResponse => "invalid_response",
            CloudErrorKind::Config => "config",
            CloudErrorKind::ChangeInDoubt => "change_in_doubt",
            CloudErrorKind::Unsupported => "unsupported",
        }
    }
}

impl std::fmt::Display for CloudErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl CloudError {
    /// Whether trying the same call again later can succeed.
    pub fn retryable(&self) -> bool {
        match self {
            CloudError::Throttled { .. }
            | CloudError::Server { .. }
            | CloudError::Transport(_)
            | CloudError::Timeout { .. }
            | CloudError::ChangeInDoubt { .. } => true,
            CloudError::NotFound { .. }
            | CloudError::Rejected { .. }
            | CloudError::InvalidProviderId { .. }
            | CloudError::InvalidResponse(_)
            | CloudError::Config(_)
            | CloudError::Unsupported { .. } => false,
        }
    }

    /// How long the cloud asked us to wait, when it said so.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CloudError::Throttled { retry_after } => *retry_after,
            _ => None,
        }
    }

    /// True when the cloud has no record of what was asked about.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CloudError::NotFound { .. })
    }

    /// The variant without its details, e.g. for a metric label.
    pub fn kind(&self) -> CloudErrorKind {
        match self {
            CloudError::NotFound { .. } => CloudErrorKind::NotFound,
            CloudError::Throttled { .. } => CloudErrorKind::Throttled,
            CloudError::Server { .. } => CloudErrorKind::Server,
            CloudError::Transport(_) => CloudErrorKind::Transport,
            CloudError::Timeout { .. } => CloudErrorKind::Timeout,
            CloudError::Rejected { .. } => CloudErrorKind::Rejected,
            CloudError::InvalidProviderId { .. } => CloudErrorKind::InvalidProviderId,
            CloudError::InvalidResponse(_) => CloudErrorKind::InvalidResponse,
            CloudError::Config(_) => CloudErrorKind::Config,
            CloudError::ChangeInDoubt { .. } => CloudErrorKind::ChangeInDoubt,
            CloudError::Unsupported { .. } => CloudErrorKind::Unsupported,
        }
    }

    /// Every cloud failure is one category for Events and the error metric;
    /// the variant is in the message.
    pub fn category(&self) -> Category {
        CATEGORY
    }
}

impl Categorized for CloudError {
    fn category(&self) -> Category {
        CloudError::category(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transient_failures_are_retryable_and_refusals_are_not() {
        let retryable = [
            CloudError::Throttled { retry_after: None },
            CloudError::Server {
                status: 503,
                message: String::new(),
            },
            CloudError::Transport("reset".into()),
            CloudError::Timeout {
                after: Duration::from_secs(1),
            },
        ];
        let final_ = [
            CloudError::NotFound { what: "x".into() },
            CloudError::Rejected {
                status: 400,
                message: String::new(),
            },
            CloudError::InvalidResponse("x".into()),
            CloudError::Config("x".into()),
            CloudError::InvalidProviderId {
                provider_id: "x".into(),
                reason: "y".into(),
            },
            CloudError::Unsupported {
                provider: "metal".into(),
                operation: "set a group image",
            },
        ];
        assert!(retryable.iter().all(CloudError::retryable));
        assert!(!final_.iter().any(CloudError::retryable));
        assert!(
            retryable
                .iter()
                .chain(&final_)
                .all(|e| Categorized::category(e) == CATEGORY)
        );
    }

    #[test]
    fn only_throttling_carries_a_retry_after() {
        let throttled = CloudError::Throttled {
            retry_after: Some(Duration::from_secs(2)),
        };
        assert_eq!(throttled.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(CloudError::Transport("x".into()).retry_after(), None);
        assert!(CloudError::NotFound { what: "x".into() }.is_not_found());
    }
}
