//! AWS's error answers as [`CloudError`]s: throttling, server and transport
//! failures stay retryable, "not found" stays distinct, credentials and
//! region problems are configuration.

use super::super::CloudError;

/// How long one call may take by default:
/// AWS answers these APIs within a second or two, and a call that hangs
/// must fail soon enough for the work queue's retry to be the one in charge.
pub const DEFAULT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The error codes AWS uses to ask callers to slow down.
const THROTTLING: [&str; 7] = [
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "TooManyRequestsException",
    "SlowDown",
    "EC2ThrottledException",
];

/// Error codes that mean the credentials or the region are wrong.
const CONFIG: [&str; 6] = [
    "AuthFailure",
    "UnauthorizedOperation",
    "InvalidClientTokenId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "MissingAuthenticationToken",
];

/// An AWS error answer by its HTTP status and code.
pub fn classify(status: u16, code: &str, message: &str, what: &str) -> CloudError {
    let message = format!("{what}: {code}: {message}");
    if THROTTLING.contains(&code) || status == 429 {
        return CloudError::Throttled { retry_after: None };
    }
    if code.ends_with(".NotFound")
        || code.ends_with("NotFound")
        || message.to_lowercase().contains("not found")
    {
        return CloudError::NotFound {
            what: what.to_string(),
        };
    }
    if CONFIG.contains(&code) {
        return CloudError::Config(message);
    }
    match status {
        500.. => CloudError::Server { status, message },
        _ => CloudError::Rejected { status, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::error::CloudErrorKind;

    #[test]
    fn aws_answers_map_to_our_kinds() {
        for (status, code, message, kind, retryable) in [
            (
                400,
                "Throttling",
                "Rate exceeded",
                CloudErrorKind::Throttled,
                true,
            ),
            (503, "RequestLimitExceeded", "", CloudErrorKind::Throttled, true),
            (
                400,
                "InvalidInstanceID.NotFound",
                "",
                CloudErrorKind::NotFound,
                false,
            ),
            (
                400,
                "ValidationError",
                "Instance Id not found - No managed instance found",
                CloudErrorKind::NotFound,
                false,
            ),
            (401, "AuthFailure", "", CloudErrorKind::Config, false),
            (500, "InternalError", "", CloudErrorKind::Server, true),
            (
                400,
                "ValidationError",
                "DesiredCapacity above MaxSize",
                CloudErrorKind::Rejected,
                false,
            ),
        ] {
            let e = classify(status, code, message, "x");
            assert_eq!(e.kind(), kind, "{code} {message}");
            assert_eq!(e.retryable(), retryable, "{code}");
        }
    }
}
