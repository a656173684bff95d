//! A gRPC client of the upgrade-agent over its unix socket: one unary call,
//! HTTP/2 without TLS as the agent serves it, so hyper (there already) does
//! it; a new connection per call, as Constellation's operator makes one.

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;

use super::proto::{EXECUTE_UPDATE, ExecuteUpdateRequest, frame};
use crate::runtime::error::{Categorized, Category};

/// Where the agent's socket is mounted in nodewarden's pod (upstream's path).
pub const DEFAULT_SOCKET: &str = "/etc/constellation-upgrade-agent.sock";

/// Every agent failure's category for Events and the error metric.
pub const CATEGORY: Category = Category::App("UpgradeAgentError");

/// A call to the agent that failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The socket could not be reached (not mounted, no agent listening).
    #[error("upgrade-agent socket {socket}: {reason}")]
    Unreachable {
        /// The socket.
        socket: String,
        /// Why.
        reason: String,
    },
    /// HTTP/2 failed underneath the call.
    #[error("upgrade-agent call: {0}")]
    Transport(String),
    /// The agent answered with a gRPC error (kubeadm failed, say).
    #[error("upgrade-agent answered gRPC status {code}: {message}")]
    Status {
        /// The gRPC status code (13: Internal).
        code: u32,
        /// Its message.
        message: String,
    },
    /// No answer within the limit.
    #[error("upgrade-agent gave no answer within {0:?}")]
    Timeout(Duration),
}

impl Categorized for AgentError {
    fn category(&self) -> Category {
        CATEGORY
    }
}

/// The client (see the module docs).
#[derive(Clone, Debug)]
pub struct AgentClient {
    socket: PathBuf,
    timeout: Duration,
}

impl AgentClient {
    /// A client of the agent at `socket`, each call held to `timeout`
    /// (kubeadm's upgrade of the control plane takes minutes).
    pub fn new(socket: PathBuf, timeout: Duration) -> AgentClient {
        AgentClient { socket, timeout }
    }

    /// The socket, for messages.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// `upgrade.Update/ExecuteUpdate`: the agent installs the components
    /// and runs `kubeadm upgrade plan` and `apply`; Ok once it answered OK.
    pub async fn execute_update(&self, request: &ExecuteUpdateRequest) -> Result<(), AgentError> {
        tokio::time::timeout(self.timeout, self.call(request))
            .await
            .map_err(|_| AgentError::Timeout(self.timeout))?
    }

    async fn call(&self, request: &ExecuteUpdateRequest) -> Result<(), AgentError> {
        let stream =
            tokio::net::UnixStream::connect(&self.socket)
                .await
                .map_err(|e| AgentError::Unreachable {
                    socket: self.socket.display().to_string(),
                    reason: e.to_string(),
                })?;
        let transport = |e: hyper::Error| AgentError::Transport(e.to_string());
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(transport)?;
        let driving = tokio::spawn(connection);
        let body = Full::new(Bytes::from(frame(&request.encode_to_vec())));
        let http_request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://localhost{EXECUTE_UPDATE}"))
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(body)
            .map_err(|e| AgentError::Transport(e.to_string()))?;
        let answer = async {
            let response = sender.send_request(http_request).await.map_err(transport)?;
            let (parts, body) = response.into_parts();
            if parts.status != http::StatusCode::OK {
                return Err(AgentError::Transport(format!("HTTP status {}", parts.status)));
            }
            let collected = body.collect().await.map_err(transport)?;
            // A trailers-only answer carries the status in its headers.
            let trailers = collected.trailers().cloned().unwrap_or_default();
            grpc_status(&trailers).or_else(|_| grpc_status(&parts.headers))
        }
        .await;
        driving.abort();
        answer
    }
}

/// Ok for `grpc-status: 0`, else the status with its (percent-encoded) message.
fn grpc_status(headers: &HeaderMap) -> Result<(), AgentError> {
    let Some(code) = headers.get("grpc-status") else {
        return Err(AgentError::Transport("no grpc-status in the answer".into()));
    };
    let code: u32 = code
        .to_str()
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| AgentError::Transport(format!("grpc-status {code:?}")))?;
    if code == 0 {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(percent_decoded)
        .unwrap_or_default();
    Err(AgentError::Status { code, message })
}

/// gRPC's percent-encoding of `grpc-message` undone.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_as_grpc_sends_them() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (k, v) in pairs {
                map.insert(*k, v.parse().expect("a header value"));
            }
            map
        };
        assert!(grpc_status(&headers(&[("grpc-status", "0")])).is_ok());
        let failed = grpc_status(&headers(&[
            ("grpc-status", "13"),
            (
                "grpc-message",
                "unable to execute kubeadm upgrade plan: exit status 1%0Aoutput",
            ),
        ]));
        match failed {
            Err(AgentError::Status { code: 13, message }) => {
                assert_eq!(
                    message,
                    "unable to execute kubeadm upgrade plan: exit status 1\noutput"
                )
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            grpc_status(&headers(&[])),
            Err(AgentError::Transport(_))
        ));
        assert_eq!(percent_decoded("100%"), "100%");
        assert_eq!(percent_decoded("a%20b%zz"), "a b%zz");
    }
}
