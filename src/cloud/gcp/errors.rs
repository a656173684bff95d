//! Compute's error answers as [`CloudError`]s: rate limits and server
//! failures stay retryable, "not found" stays distinct, credentials and
//! permissions are configuration. The same for a failed operation's errors.

use std::time::Duration;

use serde::Deserialize;

use super::super::CloudError;

/// How long one call may take by default: Compute answers in well under a
/// second; a call that hangs must fail soon enough for the work queue's
/// retry to be the one in charge.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Compute's error envelope: `{"error":{"code":404,"message":…,"errors":[{"reason":…}]}}`.
#[derive(Debug, Default, Deserialize)]
struct Envelope {
    #[serde(default)]
    error: Body,
}

#[derive(Debug, Default, Deserialize)]
struct Body {
    #[serde(default)]
    message: String,
    #[serde(default)]
    errors: Vec<Item>,
    #[serde(default)]
    status: String,
}

#[derive(Debug, Default, Deserialize)]
struct Item {
    #[serde(default)]
    reason: String,
}

/// Reasons that ask callers to slow down.
const THROTTLING: [&str; 3] = [
    "rateLimitExceeded",
    "userRateLimitExceeded",
    "RATE_LIMIT_EXCEEDED",
];
/// Reasons of a 403 that mean the service account lacks a permission (a
/// 403 for a quota is the request's problem, not the setup's).
const PERMISSION: [&str; 5] = [
    "forbidden",
    "insufficientPermissions",
    "accessNotConfigured",
    "authError",
    "PERMISSION_DENIED",
];

/// An error answer of status `status` with body `body` about `what`.
pub fn classify(status: u16, body: &str, retry_after: Option<Duration>, what: &str) -> CloudError {
    let envelope: Envelope = serde_json::from_str(body).unwrap_or_default();
    let reasons: Vec<&str> = envelope.error.errors.iter().map(|e| e.reason.as_str()).collect();
    let said = if envelope.error.message.is_empty() {
        body.trim().chars().take(300).collect()
    } else {
        envelope.error.message.clone()
    };
    let message = format!("{what}: {said}");
    by_status(
        status,
        &reasons,
        &envelope.error.status,
        message,
        retry_after,
        what,
    )
}

fn by_status(
    status: u16,
    reasons: &[&str],
    rpc_status: &str,
    message: String,
    retry_after: Option<Duration>,
    what: &str,
) -> CloudError {
    let permission = rpc_status == "PERMISSION_DENIED"
        || reasons.is_empty()
        || reasons.iter().any(|r| PERMISSION.contains(r));
    if status == 429 || reasons.iter().any(|r| THROTTLING.contains(r)) {
        return CloudError::Throttled { retry_after };
    }
    match status {
        404 => CloudError::NotFound {
            what: what.to_string(),
        },
        401 => CloudError::Config(format!("Compute refused the credentials: {message}")),
        403 if permission => CloudError::Config(format!("Compute refused the permission: {message}")),
        500.. => CloudError::Server { status, message },
        _ => CloudError::Rejected { status, message },
    }
}

/// One error of a failed operation (`error.errors[]`).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OperationError {
    /// Compute's code, e.g. `RESOURCE_ALREADY_EXISTS`, `QUOTA_EXCEEDED`.
    #[serde(default)]
    pub code: String,
    /// Its words.
    #[serde(default)]
    pub message: String,
}

/// A failed operation's errors, with the HTTP status the operation says
/// (`httpErrorStatusCode`; 400 when it says none), about `what`.
pub fn operation_failed(status: Option<u16>, errors: &[OperationError], what: &str) -> CloudError {
    let codes: Vec<&str> = errors.iter().map(|e| e.code.as_str()).collect();
    let said: Vec<String> = errors
        .iter()
        .map(|e| format!("{}: {}", e.code, e.message))
        .collect();
    let message = format!("{what}: {}", said.join("; "));
    if codes.iter().any(|c| c.contains("NOT_FOUND")) {
        return CloudError::NotFound {
            what: what.to_string(),
        };
    }
    let status = status.unwrap_or(400);
    by_status(status, &codes, "", message, None, what)
}

/// Whether a failed operation failed because its resource exists already.
pub fn already_exists(errors: &[OperationError]) -> bool {
    errors
        .iter()
        .any(|e| e.code == "RESOURCE_ALREADY_EXISTS" || e.code == "ALREADY_EXISTS")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::error::CloudErrorKind;

    fn envelope(code: u16, reason: &str) -> String {
        format!(
            r#"{{"error":{{"code":{code},"message":"m","errors":[{{"domain":"global","reason":"{reason}","message":"m"}}]}}}}"#
        )
    }

    #[test]
    fn compute_answers_map_to_our_kinds() {
        for (status, reason, kind, retryable) in [
            (404, "notFound", CloudErrorKind::NotFound, false),
            (429, "rateLimitExceeded", CloudErrorKind::Throttled, true),
            (403, "rateLimitExceeded", CloudErrorKind::Throttled, true),
            (403, "userRateLimitExceeded", CloudErrorKind::Throttled, true),
            (403, "forbidden", CloudErrorKind::Config, false),
            (401, "authError", CloudErrorKind::Config, false),
            (503, "backendError", CloudErrorKind::Server, true),
            (500, "internalError", CloudErrorKind::Server, true),
            (409, "alreadyExists", CloudErrorKind::Rejected, false),
            (400, "invalid", CloudErrorKind::Rejected, false),
        ] {
            let e = classify(status, &envelope(status, reason), None, "x");
            assert_eq!(e.kind(), kind, "{status} {reason}");
            assert_eq!(e.retryable(), retryable, "{status} {reason}");
        }
        let e = classify(502, "<html>bad gateway</html>", None, "x");
        assert_eq!(e.kind(), CloudErrorKind::Server);
        assert!(e.to_string().contains("bad gateway"), "{e}");
    }

    #[test]
    fn operation_errors_map_by_code_and_status() {
        let err = |code: &str| {
            vec![OperationError {
                code: code.into(),
                message: "m".into(),
            }]
        };
        assert_eq!(
            operation_failed(None, &err("RESOURCE_NOT_FOUND"), "x").kind(),
            CloudErrorKind::NotFound
        );
        assert_eq!(
            operation_failed(Some(403), &err("QUOTA_EXCEEDED"), "x").kind(),
            CloudErrorKind::Rejected
        );
        assert_eq!(
            operation_failed(Some(403), &err("PERMISSION_DENIED"), "x").kind(),
            CloudErrorKind::Config
        );
        assert_eq!(
            operation_failed(None, &err("QUOTA_EXCEEDED"), "x").kind(),
            CloudErrorKind::Rejected
        );
        assert_eq!(
            operation_failed(Some(503), &err("ZONE_RESOURCE_POOL_EXHAUSTED"), "x").kind(),
            CloudErrorKind::Server
        );
        assert!(already_exists(&err("RESOURCE_ALREADY_EXISTS")));
        assert!(!already_exists(&err("QUOTA_EXCEEDED")));
    }
}
