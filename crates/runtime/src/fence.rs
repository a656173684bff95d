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
//! One kind of write is not abandoned mid-way, only no longer waited for: a
//! Service's. kube-apiserver allocates a Service's NodePorts and cluster IPs
//! before it stores the Service, and on an apply or an update it commits the
//! allocation before the store's write (k8s.io/apiserver's `Store.Update`
//! calls the create or update hook's finish inside its update function). A
//! write cancelled between the two leaves the ports allocated to no Service
//! until the API server's repair loop frees them, minutes later, and every
//! create asking for them is refused meanwhile ("provided port is already
//! allocated"). So a Service write is sent to its end in a task of its own;
//! the caller is still answered `Lapsed` at the deadline and stops acting.
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

/// Whether an abandoned request must still be sent to its end (see the
/// module docs): writes of core Services, whose allocations a cancelled write
/// can leak.
pub fn must_run_to_end(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/api/v1/namespaces/") else {
        return false;
    };
    let mut segments = rest.split('/');
    let (_namespace, resource) = (segments.next(), segments.next());
    resource == Some("services") && segments.nth(1).is_none()
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
        let detached = must_run_to_end(&path);
        Box::pin(async move {
            let lapsed = || FenceError::Lapsed {
                method: method.clone(),
                path: path.clone(),
            };
            if detached {
                // Dropping a JoinHandle leaves its task running.
                let sent = tokio::spawn(async move { client.send(request).await });
                return match tokio::time::timeout_at(until, sent).await {
                    Ok(Ok(answer)) => answer.map_err(Into::into),
                    Ok(Err(panicked)) => Err(panicked.into()),
                    Err(_) => Err(lapsed().into()),
                };
            }
            match tokio::time::timeout_at(until, client.send(request)).await {
                Ok(answer) => answer.map_err(Into::into),
                Err(_) => Err(lapsed().into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::time::Instant;

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

    #[test]
    fn only_service_writes_run_to_their_end() {
        for (path, to_end) in [
            ("/api/v1/namespaces/ns/services", true),
            ("/api/v1/namespaces/ns/services/lb", true),
            ("/api/v1/namespaces/ns/services/lb/status", false),
            ("/api/v1/namespaces/ns/pods/p", false),
            ("/api/v1/namespaces/services", false),
            ("/apis/example.com/v1/namespaces/ns/services/lb", false),
            ("/api/v1/nodes/services", false),
        ] {
            assert_eq!(must_run_to_end(path), to_end, "{path}");
        }
    }

    /// A client whose every request takes `delay` and, when it was not
    /// dropped by then, is counted in `finished`.
    fn slow_client(delay: Duration, finished: Arc<AtomicUsize>) -> Client {
        let service = tower::service_fn(move |_request: Request<Body>| {
            let finished = Arc::clone(&finished);
            async move {
                tokio::time::sleep(delay).await;
                finished.fetch_add(1, Ordering::SeqCst);
                Response::builder()
                    .status(200)
                    .body(Body::from(b"{}".to_vec()))
                    .map_err(tower::BoxError::from)
            }
        });
        Client::new(service, "default")
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_service_write_is_answered_at_once_and_still_sent_to_its_end() {
        let finished = Arc::new(AtomicUsize::new(0));
        for path in [
            "/api/v1/namespaces/ns/services/lb",
            "/api/v1/namespaces/ns/pods/p",
        ] {
            let term = Duration::from_millis(50);
            let leader = LeaderHandle::leading_until(Instant::now() + term);
            let slow = slow_client(Duration::from_millis(300), Arc::clone(&finished));
            let request = Request::post(path)
                .body(Body::from(b"{}".to_vec()))
                .expect("a request");
            let started = Instant::now();
            let answer = fenced(slow, leader).send(request).await;
            assert!(
                matches!(&answer, Err(kube::Error::Service(e)) if e.to_string().contains("abandoned")),
                "{path}: {answer:?}"
            );
            assert_eq!(started.elapsed(), term, "{path}: answered at the deadline");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The Service write was sent to its end; the Pod write was dropped.
        assert_eq!(finished.load(Ordering::SeqCst), 1);
    }
}
