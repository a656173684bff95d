//! How much of a replica any client that reaches the webhook can take: the
//! body it may send, the time it may take, the connections and reviews it
//! may hold at once. The shipped Deployment allows 512 Mi and the webhook's
//! failurePolicy is Fail, so a replica the webhook lets run out of memory
//! refuses every write of nodewarden's kinds while it restarts.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Body;

use super::metrics::WebhookRefusal;
use crate::http::ConnLimits;

/// The largest request body read. kube-apiserver takes request bodies of up
/// to 3 MiB (twice etcd's 1.5 MiB request limit, JSON being larger than the
/// stored protobuf), and the AdmissionReview of an UPDATE carries the object
/// twice (old and new), plus well under 1 MiB of the rest: 7 MiB, the limit
/// of controller-runtime's webhook server too. Nothing the API server sends
/// is larger; anything larger is refused with 413.
pub const MAX_BODY_BYTES: usize = 7 * 1024 * 1024;

/// A TLS handshake's time. kube-apiserver finishes one in milliseconds; a
/// connection that has not after 10 s is held by someone else.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The request head's time to arrive (and a kept-alive connection's time
/// idle): kube-apiserver sends the head at once.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The body's time to arrive once its head did: 7 MiB take well under a
/// second inside a cluster.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// A whole review's time (its body, the reads the rules need, the answer).
/// kube-apiserver waits at most 30 s (the longest `timeoutSeconds`; the
/// shipped configuration says 5), so a later answer reaches nobody.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections at once. kube-apiserver keeps a few per instance, so a few
/// hundred leave room for a busy control plane while bounding what a flood
/// holds: each connection's TLS and HTTP buffers (about 100 KiB at most,
/// some 25 MiB in all) and a file descriptor.
pub const MAX_CONNECTIONS: usize = 256;

/// Reviews at once, from the head's arrival to the answer. Each may hold a
/// body of up to [`MAX_BODY_BYTES`], so 8 bound the bodies held to 56 MiB;
/// a review takes milliseconds, so 8 at once answer hundreds a second.
/// Past them the answer is 429 with `Retry-After: 1`, which the client
/// kube-apiserver calls webhooks with (client-go's) waits out and retries.
pub const MAX_IN_FLIGHT: usize = 8;

/// The webhook's limits; [`Limits::default`] is what production runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body read (413 past it).
    pub max_body_bytes: usize,
    /// A TLS handshake's time.
    pub handshake_timeout: Duration,
    /// The body's time to arrive once its head did (408 past it).
    pub body_timeout: Duration,
    /// A whole review's time (503 past it).
    pub request_timeout: Duration,
    /// Reviews at once (429 past it).
    pub max_in_flight: usize,
    /// Every connection's limits: how many at once, the head's time and size,
    /// the write timeout.
    pub conn: ConnLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: MAX_BODY_BYTES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            max_in_flight: MAX_IN_FLIGHT,
            conn: ConnLimits {
                max_connections: MAX_CONNECTIONS,
                header_read_timeout: HEADER_READ_TIMEOUT,
                // kube-apiserver's heads are a few hundred bytes.
                max_header_bytes: 16 * 1024,
                // Bodies arrive in TLS records of 16 KiB at most.
                read_buffer_bytes: 64 * 1024,
                write_timeout: Duration::from_secs(10),
            },
        }
    }
}

/// Why the webhook answers a request with an error (or not at all).
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// The body is over the limit: declared so, or found so while reading.
    #[error(
        "the request body is over the webhook's limit of {limit} bytes (an AdmissionReview from kube-apiserver is never that large)"
    )]
    BodyTooLarge {
        /// The limit.
        limit: usize,
    },
    /// Every review slot is taken.
    #[error("{max} reviews are in progress on this replica; retry in a second")]
    Busy {
        /// Reviews at once.
        max: usize,
    },
    /// The body did not arrive in time.
    #[error("the request body did not arrive within {0:?}")]
    BodyTimeout(Duration),
    /// The review took too long (a slow API server, most likely).
    #[error("the review took longer than {0:?}")]
    RequestTimeout(Duration),
    /// The body could not be read (the connection broke).
    #[error("reading the request body: {0}")]
    BodyUnreadable(String),
    /// The body is no AdmissionReview the webhook can answer.
    #[error("not an AdmissionReview: {0}")]
    NotAReview(#[from] serde_json::Error),
}

impl Refusal {
    /// The HTTP status of the answer.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Busy { .. } => StatusCode::TOO_MANY_REQUESTS,
            Refusal::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Refusal::RequestTimeout(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::BodyUnreadable(_) | Refusal::NotAReview(_) => StatusCode::BAD_REQUEST,
        }
    }

    /// The metric's reason.
    pub fn reason(&self) -> WebhookRefusal {
        match self {
            Refusal::BodyTooLarge { .. } => WebhookRefusal::BodyTooLarge,
            Refusal::Busy { .. } => WebhookRefusal::TooManyRequests,
            Refusal::BodyTimeout(_) => WebhookRefusal::BodyTimeout,
            Refusal::RequestTimeout(_) => WebhookRefusal::RequestTimeout,
            Refusal::BodyUnreadable(_) | Refusal::NotAReview(_) => WebhookRefusal::BadRequest,
        }
    }
}

/// Refuses a body whose declared length (its Content-Length, which hyper
/// reports as the exact size) is over `limit`, before a byte of it is read.
pub fn check_declared<B: Body>(body: &B, limit: usize) -> Result<(), Refusal> {
    match body.size_hint().exact() {
        Some(declared) if declared > limit as u64 => Err(Refusal::BodyTooLarge { limit }),
        _ => Ok(()),
    }
}

/// The whole body, read while it stays within `limit`: never more than
/// `limit` bytes and one chunk are held. One buffer of the declared length
/// (or `limit` when undeclared: its pages are only touched as bytes arrive)
/// is filled, never grown, so no copy doubles what a body takes.
pub async fn read_body<B>(body: B, limit: usize) -> Result<Vec<u8>, Refusal>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    check_declared(&body, limit)?;
    let declared = body.size_hint().exact().and_then(|n| usize::try_from(n).ok());
    let mut buffer = Vec::with_capacity(declared.unwrap_or(limit).min(limit));
    let mut body = std::pin::pin!(Limited::new(body, limit));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                Refusal::BodyTooLarge { limit }
            } else {
                Refusal::BodyUnreadable(e.to_string())
            }
        })?;
        if let Ok(data) = frame.into_data() {
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};
    use hyper::body::Frame;

    /// A body of `chunks` chunks of `size` bytes, its length undeclared (as
    /// with chunked transfer encoding).
    fn undeclared(
        chunks: usize,
        size: usize,
    ) -> StreamBody<impl futures::Stream<Item = Result<Frame<Bytes>, std::io::Error>>> {
        let chunk = Bytes::from(vec![b' '; size]);
        StreamBody::new(futures::stream::iter(
            (0..chunks).map(move |_| Ok(Frame::data(chunk.clone()))),
        ))
    }

    #[tokio::test]
    async fn a_body_within_the_limit_is_read_whole() {
        let body = read_body(Full::new(Bytes::from_static(b"{\"a\":1}")), 100)
            .await
            .expect("a small body");
        assert_eq!(body, b"{\"a\":1}");
        let body = read_body(undeclared(10, 10), 100)
            .await
            .expect("exactly the limit");
        assert_eq!(body.len(), 100);
    }

    #[tokio::test]
    async fn a_declared_length_over_the_limit_is_refused_unread() {
        let refusal =
            check_declared(&Full::new(Bytes::from(vec![0u8; 101])), 100).expect_err("101 bytes declared");
        assert_eq!(refusal.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            check_declared(&undeclared(1000, 1000), 100).is_ok(),
            "undeclared: read to find out"
        );
    }

    #[tokio::test]
    async fn an_undeclared_body_is_cut_off_at_the_limit() {
        let refusal = read_body(undeclared(1_000_000, 1000), 100_000)
            .await
            .expect_err("a gigabyte undeclared");
        assert!(
            matches!(refusal, Refusal::BodyTooLarge { limit: 100_000 }),
            "{refusal:?}"
        );
        assert_eq!(refusal.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(refusal.reason(), WebhookRefusal::BodyTooLarge);
        assert!(refusal.to_string().contains("100000 bytes"), "{refusal}");
    }

    #[test]
    fn every_refusal_answers_with_its_status_and_reason() {
        let not_json = serde_json::from_slice::<serde_json::Value>(b"{").expect_err("not JSON");
        for (refusal, status, reason) in [
            (Refusal::Busy { max: 8 }, 429, WebhookRefusal::TooManyRequests),
            (
                Refusal::BodyTimeout(BODY_TIMEOUT),
                408,
                WebhookRefusal::BodyTimeout,
            ),
            (
                Refusal::RequestTimeout(REQUEST_TIMEOUT),
                503,
                WebhookRefusal::RequestTimeout,
            ),
            (
                Refusal::BodyUnreadable("reset".into()),
                400,
                WebhookRefusal::BadRequest,
            ),
            (Refusal::from(not_json), 400, WebhookRefusal::BadRequest),
        ] {
            assert_eq!(refusal.status().as_u16(), status, "{refusal}");
            assert_eq!(refusal.reason(), reason, "{refusal}");
        }
    }
}
