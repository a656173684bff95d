//! ARM's error answers as [`CloudError`]s: throttling and server failures
//! stay retryable (and so does a 409, ARM's "another operation is in
//! progress on this resource"), "not found" stays distinct, credentials and
//! role assignments are configuration.

use std::time::Duration;

use serde::Deserialize;

use super::super::CloudError;

/// How long one call may take by default: ARM answers in about a second;
/// a call that hangs must fail soon enough for the work queue's retry to be
/// the one in charge.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// ARM's envelope: `{"error":{"code":"…","message":"…"}}`.
#[derive(Debug, Default, Deserialize)]
struct Envelope {
    #[serde(default)]
    error: Body,
}

#[derive(Debug, Default, Deserialize)]
struct Body {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

/// Codes that ask callers to slow down.
const THROTTLING: [&str; 3] = [
    "TooManyRequests",
    "SubscriptionRequestsThrottled",
    "OperationNotAllowedThrottled",
];

/// An error answer of status `status` (ARM's code in `x-ms-error-code`
/// when the body has none) about `what`.
pub fn classify(
    status: u16,
    body: &str,
    header_code: Option<&str>,
    retry_after: Option<Duration>,
    what: &str,
) -> CloudError {
    let envelope: Envelope = serde_json::from_str(body).unwrap_or_default();
    let code = match envelope.error.code.as_str() {
        "" => header_code.unwrap_or_default().to_string(),
        code => code.to_string(),
    };
    let said = match envelope.error.message.as_str() {
        "" => body.trim().chars().take(300).collect::<String>(),
        message => message.to_string(),
    };
    let message = format!("{what}: {code}: {said}");
    if status == 429 || THROTTLING.contains(&code.as_str()) {
        return CloudError::Throttled { retry_after };
    }
    match status {
        404 => CloudError::NotFound {
            what: what.to_string(),
        },
        401 => CloudError::Config(format!("ARM refused the credentials: {message}")),
        403 => CloudError::Config(format!("ARM refused the permission: {message}")),
        409 | 500.. => CloudError::Server { status, message },
        _ => CloudError::Rejected { status, message },
    }
}

/// A long-running operation that ended other than `Succeeded`.
pub fn operation_failed(status: &str, code: &str, message: &str, what: &str) -> CloudError {
    let message = format!("{what}: the operation ended {status}: {code}: {message}");
    match code {
        "InternalExecutionError" | "InternalOperationError" | "RetryableError" => {
            CloudError::Server { status: 500, message }
        }
        _ => CloudError::Rejected { status: 400, message },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arm_errors_map_to_what_a_caller_does_next() {
        let body = |code: &str| format!(r#"{{"error":{{"code":"{code}","message":"words"}}}}"#);
        let cases = [
            (404, body("ResourceNotFound"), "not_found"),
            (429, body("TooManyRequests"), "throttled"),
            (409, body("OperationNotAllowed"), "server"),
            (503, body("ServiceUnavailable"), "server"),
            (401, body("AuthenticationFailed"), "config"),
            (403, body("AuthorizationFailed"), "config"),
            (400, body("InvalidParameter"), "rejected"),
            (412, body("PreconditionFailed"), "rejected"),
        ];
        for (status, body, kind) in cases {
            let e = classify(status, &body, None, None, "scale set w");
            assert_eq!(e.kind().as_str(), kind, "{status} {body}");
        }
        let from_header = classify(400, "", Some("InvalidParameter"), None, "w");
        assert!(
            from_header.to_string().contains("InvalidParameter"),
            "{from_header}"
        );
        let throttled = classify(
            200,
            &body("SubscriptionRequestsThrottled"),
            None,
            Some(Duration::from_secs(3)),
            "w",
        );
        assert_eq!(throttled.retry_after(), Some(Duration::from_secs(3)));
        assert!(operation_failed("Failed", "RetryableError", "m", "w").retryable());
        assert!(!operation_failed("Failed", "QuotaExceeded", "m", "w").retryable());
    }
}
