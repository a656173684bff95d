//! A client that writes only while this replica leads.
//!
//! Checking [`LeaderHandle::is_leader`] before a write leaves a gap: the
//! request can wait for a connection (a reconnect through a cut network, a
//! starved process) and reach the API server after the lease term ended,
//! when another replica may already act. The chaos runs saw exactly that:
//! evictions and Events by a replica whose connections had just dropped,
//! arriving 4 s after its last renewal with a 3 s lease.
//!
//! So every write (anything but GET, HEAD, OPTIONS and a watch) of the
//! controllers' client is refused at once when this replica does not lead,
//! and abandoned when its leadership lapses before the request is answered:
//! the replica stops acting by its renew deadline, before its lease can
//! expire for anyone else. The election's own Lease writes use the unfenced
//! client.
//!
//! What the fence cannot do is recall a request already on the wire: a write
//! sent just before leadership lapsed may still reach the API server later,
//! after a successor acted. Safety rests on the writes themselves: each write
//! whose late arrival could do harm is conditional (a resourceVersion
//! precondition, a create of a fixed name, a delete with preconditions, a
//! cloud call keyed by the object it serves), so the API server or the cloud
//! refuses it when it lands after someone else acted; the others are harmless
//! when late, and `controllers::write_guards` lists every write with the
//! reason.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use kube::Client;
use kube::client::Body;

use super::leader::LeaderHandle;

/// Why a write was not made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FenceError {
    /// This replica does not lead (or its leadership lapsed).
    #[error("{method} {path} refused: this replica does not lead")]
    NotLeader {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
    },
    /// Leadership lapsed before the API server answered.
    #[error("{method} {path} abandoned: this replica's leadership lapsed before the answer")]
    Lapsed {
        /// The request's method.
        method: Method,
        /// The request's path.
        path: String,
    },
}

/// Whether the request changes something (reads and watches do not).
pub fn is_write(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// `client`, with every write bound to `leader`'s term (see the module docs).
pub fn fenced(client: Client, leader: LeaderHandle) -> Client {
    let namespace = client.default_namespace().to_string();
    Client::new(Fenced { client, leader }, namespace)
}

/// The service behind a fenced client.
#[derive(Clone)]
struct Fenced {
    client: Client,
    leader: LeaderHandle,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, tower::BoxError>> + Send>>;

impl tower::Service<Request<Body>> for Fenced {
    type Response = Response<Body>;
    type Error = tower::BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // `Client::send` waits for the inner service itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        if !is_write(request.method()) {
            return Box::pin(async move { client.send(request).await.map_err(Into::into) });
        }
        let (method, path) = (request.method().clone(), request.uri().path().to_string());
        let Some(until) = self.leader.valid_until() else {
            return Box::pin(async move { Err(FenceError::NotLeader { method, path }.into()) });
        };
        Box::pin(async move {
            match tokio::time::timeout_at(until, client.send(request)).await {
                Ok(answer) => answer.map_err(Into::into),
                Err(_) => Err(FenceError::Lapsed { method, path }.into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_reads_and_watches_pass_unfenced() {
        for (method, write) in [
            (Method::GET, false),
            (Method::HEAD, false),
            (Method::OPTIONS, false),
            (Method::POST, true),
            (Method::PUT, true),
            (Method::PATCH, true),
            (Method::DELETE, true),
        ] {
            assert_eq!(is_write(&method), write, "{method}");
        }
    }
}
