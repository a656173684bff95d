//! A link to the API server that holds requests and delivers them late: what
//! a write stuck on a stalled connection does when the connection comes back.
//!
//! A client that gives up on a request cannot recall it: once its bytes are on
//! the wire, the API server may still receive them after the writer's lease
//! term ended. A TCP proxy cannot replay that faithfully (the client closing
//! the connection, or TLS's close_notify behind the request, lets the API
//! server cancel the request or not, by timing), so this link holds whole
//! requests: while it holds, a request waits in the link; `deliver` sends each
//! held request to the API server whether or not its sender still waits, and
//! returns the API server's answers. A test then sees exactly how a late write
//! was answered.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use nodewarden::runtime::error::Category;
use nodewarden::runtime::fence::fenced;
use nodewarden::runtime::leader::{LeaderElectionConfig, LeaderElector, LeaderHandle};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::proxy::TcpProxy;

/// A request held by the link, and where its sender waits for the answer.
type Held = (
    Request<Body>,
    oneshot::Sender<Result<Response<Body>, kube::Error>>,
);

#[derive(Default)]
struct LinkState {
    holding: bool,
    held: Vec<Held>,
}

/// A link to the API server through `client` that can hold requests.
#[derive(Clone)]
pub struct HoldingLink {
    client: Client,
    state: Arc<Mutex<LinkState>>,
}

/// How the API server answered a request the link delivered late.
#[derive(Clone, Debug)]
pub struct LateAnswer {
    pub method: Method,
    pub path: String,
    pub status: StatusCode,
    /// The answer's body: a Status object's reason and message for a refusal.
    pub body: String,
    /// Whether the sender still waited for the answer when it came.
    pub sender_waited: bool,
}

impl LateAnswer {
    /// "PUT /api/v1/... → 409 Conflict", for messages.
    pub fn describe(&self) -> String {
        format!("{} {} → {}: {}", self.method, self.path, self.status, self.body)
    }
}

impl HoldingLink {
    pub fn new(client: Client) -> Self {
        HoldingLink {
            client,
            state: Arc::default(),
        }
    }

    /// A client whose requests go through this link.
    pub fn client(&self) -> Client {
        let namespace = self.client.default_namespace().to_string();
        Client::new(self.clone(), namespace)
    }

    /// Holds every request from now on, until `deliver`.
    pub fn hold(&self) {
        self.state().holding = true;
    }

    /// How many requests the link holds now.
    pub fn held(&self) -> usize {
        self.state().held.len()
    }

    /// Stops holding and sends every held request to the API server, in the
    /// order they were made, each after the one before was answered. Each
    /// answer goes to its sender if it still waits, and is returned.
    pub async fn deliver(&self) -> Vec<LateAnswer> {
        let held = {
            let mut state = self.state();
            state.holding = false;
            std::mem::take(&mut state.held)
        };
        let mut answers = Vec::new();
        for (request, sender) in held {
            let (method, path) = (request.method().clone(), request.uri().path().to_string());
            let answer = self.client.send(request).await.unwrap_or_else(|e| {
                panic!("delivering the held {method} {path}: the API server could not be reached: {e}")
            });
            let (parts, body) = answer.into_parts();
            let bytes = body
                .collect()
                .await
                .unwrap_or_else(|e| panic!("reading the answer to the held {method} {path}: {e}"))
                .to_bytes();
            let sender_waited = !sender.is_closed();
            let _ = sender.send(Ok(Response::from_parts(
                parts.clone(),
                Body::from(bytes.to_vec()),
            )));
            answers.push(LateAnswer {
                method,
                path,
                status: parts.status,
                body: String::from_utf8_lossy(&bytes).into_owned(),
                sender_waited,
            });
        }
        answers
    }

    fn state(&self) -> MutexGuard<'_, LinkState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, tower::BoxError>> + Send>>;

impl tower::Service<Request<Body>> for HoldingLink {
    type Response = Response<Body>;
    type Error = tower::BoxError;
    type Future = Answer;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.client.clone();
        let mut state = self.state();
        if !state.holding {
            return Box::pin(async move { client.send(request).await.map_err(Into::into) });
        }
        let (sender, answer) = oneshot::channel();
        state.held.push((request, sender));
        Box::pin(async move {
            match answer.await {
                Ok(answer) => answer.map_err(Into::into),
                Err(_) => Err("the holding link was dropped with the request".into()),
            }
        })
    }
}

/// The election's timings in these tests: short, so a lapsed term ends soon.
const LEASE: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY: Duration = Duration::from_millis(500);

fn election(namespace: &str, identity: &str) -> LeaderElectionConfig {
    LeaderElectionConfig {
        namespace: namespace.to_owned(),
        lease_name: "nodewarden-late-writes".to_owned(),
        identity: identity.to_owned(),
        lease_duration: LEASE,
        renew_deadline: RENEW_DEADLINE,
        retry_period: RETRY,
    }
}

async fn lead(
    client: Client,
    namespace: &str,
    identity: &str,
) -> (LeaderHandle, tokio::task::JoinHandle<()>) {
    let elector = LeaderElector::new(client, election(namespace, identity)).expect("a valid election config");
    let handle = elector.handle();
    let task = tokio::spawn(elector.run(CancellationToken::new()));
    let mut leading = handle.subscribe();
    let within = Duration::from_secs(20);
    let led = tokio::time::timeout(within, leading.wait_for(|l| *l)).await;
    assert!(
        matches!(led, Ok(Ok(_))),
        "{identity} did not lead within {within:?}"
    );
    (handle, task)
}

/// A leader about to be cut off: its election runs through a TCP proxy, its
/// fenced writes through a holding link. `stall` stops both: the election
/// cannot renew, and the writes made from then on wait in the link, to be
/// delivered after a successor acted.
pub struct FadingLeader {
    proxy: TcpProxy,
    link: HoldingLink,
    handle: LeaderHandle,
    task: tokio::task::JoinHandle<()>,
}

impl FadingLeader {
    /// Leads the election of `namespace` as `identity`.
    pub async fn start(namespace: &str, identity: &str) -> Self {
        let cp = super::control_plane();
        let proxy = TcpProxy::start(cp.apiserver_addr()).await;
        let (handle, task) = lead(cp.client_via(&proxy).await, namespace, identity).await;
        FadingLeader {
            proxy,
            link: HoldingLink::new(cp.client().await),
            handle,
            task,
        }
    }

    /// The controllers' client of this replica: fenced, over the link.
    pub fn client(&self) -> Client {
        fenced(self.link.client(), self.handle.clone())
    }

    /// Cuts the leader off: nothing it sends reaches the API server now.
    pub fn stall(&self) {
        self.proxy.stall();
        self.link.hold();
    }

    /// Makes `write` (through [`client`](Self::client)) while stalled, and
    /// checks what the fence does: abandons it when the term lapses, the
    /// write still on its way. Returns once the term is over.
    pub async fn write_abandoned<T: std::fmt::Debug>(
        &self,
        what: &str,
        write: impl Future<Output = Result<T, kube::Error>>,
    ) {
        self.stall();
        let held_before = self.link.held();
        let answer = write.await;
        let category = answer.map_err(|e| nodewarden::error::Error::from(e).category());
        assert!(
            matches!(category, Err(Category::NotLeader)),
            "{what}: the stuck write is abandoned when the term lapses, got {category:?}"
        );
        assert!(!self.handle.is_leader(), "{what}: the term lapsed");
        assert_eq!(
            self.link.held(),
            held_before + 1,
            "{what}: the write is on its way"
        );
    }

    /// Lets everything through again and delivers the held writes.
    pub async fn deliver_late(self) -> Vec<LateAnswer> {
        self.proxy.restore();
        let answers = self.link.deliver().await;
        self.task.abort();
        answers
    }
}

/// The replica that takes over once the fading leader's lease expired: its
/// fenced client, straight to the API server.
pub async fn successor(namespace: &str, identity: &str) -> (Client, tokio::task::JoinHandle<()>) {
    let cp = super::control_plane();
    let (handle, task) = lead(cp.client().await, namespace, identity).await;
    (fenced(cp.client().await, handle), task)
}

/// Checks that each late write was answered 409 Conflict: refused by its
/// precondition.
pub fn assert_refused(what: &str, answers: &[LateAnswer], count: usize) {
    assert_eq!(
        answers.len(),
        count,
        "{what}: late writes delivered: {answers:#?}"
    );
    for a in answers {
        assert_eq!(
            a.status,
            StatusCode::CONFLICT,
            "{what}: a late write lands refused by its precondition: {}",
            a.describe()
        );
    }
}
