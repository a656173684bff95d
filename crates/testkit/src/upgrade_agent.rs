//! A fake of Constellation's upgrade-agent for tests, written from the same
//! contract (`nodewarden::upgrade_agent::proto`) and not from nodewarden's
//! client: an HTTP/2 gRPC server on a unix socket that, as the agent does,
//! checks the version, installs the components (under a root of its own)
//! and runs `kubeadm upgrade plan` then `kubeadm upgrade apply` — a kubeadm
//! stub that records its arguments and takes `KUBEADM_SECONDS` to run.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures::stream;
use http::{HeaderMap, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use nodewarden::upgrade_agent::proto::{
    EXECUTE_UPDATE, ExecuteUpdateRequest, ExecuteUpdateResponse, frame, unframe,
};
use prost::Message;

/// One call the fake served.
#[derive(Clone, Debug)]
pub struct Call {
    /// The request as decoded.
    pub request: ExecuteUpdateRequest,
    /// When it arrived and when it was answered.
    pub started: Instant,
    pub ended: Instant,
    /// The gRPC status it answered with.
    pub status: u32,
}

/// The fake agent; stopped on drop.
pub struct FakeAgent {
    /// Its socket.
    pub socket: PathBuf,
    dir: tempfile::TempDir,
    calls: Arc<Mutex<Vec<Call>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the fake's kubeadm does: records its arguments, one line a run, and
/// sleeps `seconds` (an upgrade takes time); exits 1 for version `fail_on`.
fn kubeadm_stub(root: &Path, seconds: u32, fail_on: &str) -> PathBuf {
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).expect("a bin dir");
    let log = root.join("kubeadm.log");
    let script = format!(
        "#!/bin/sh\necho \"$*\" >> '{}'\nsleep {seconds}\nfor a in \"$@\"; do [ \"$a\" = '{fail_on}' ] && exit 1; done\nexit 0\n",
        log.display()
    );
    let path = bin.join("kubeadm");
    std::fs::write(&path, script).expect("writing the kubeadm stub");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

impl FakeAgent {
    /// Serves on a socket of its own; kubeadm takes `seconds` a run and
    /// fails for version `fail_on`.
    pub fn start(seconds: u32, fail_on: &str) -> FakeAgent {
        let dir = tempfile::tempdir().expect("a dir");
        let socket = dir.path().join("constellation-upgrade-agent.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("binding the socket");
        let bin = kubeadm_stub(dir.path(), seconds, fail_on);
        let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
        let root = dir.path().to_path_buf();
        let (served, bin) = (calls.clone(), bin.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (served, bin, root) = (served.clone(), bin.clone(), root.clone());
                tokio::spawn(async move {
                    let service =
                        service_fn(move |req| handle(req, served.clone(), bin.clone(), root.clone()));
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        FakeAgent {
            socket,
            dir,
            calls,
            task,
        }
    }

    /// The calls served so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().expect("the calls").clone()
    }

    /// kubeadm's runs so far, each its arguments.
    pub fn kubeadm_runs(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("kubeadm.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// The file a component was installed to (under the fake's root).
    pub fn installed(&self, install_path: &str) -> PathBuf {
        self.dir
            .path()
            .join("root")
            .join(install_path.trim_start_matches('/'))
    }
}

type Body = BoxBody<Bytes, Infallible>;

/// One gRPC call: decoded, carried out as the agent does, answered with
/// its status in the trailers.
async fn handle(
    req: Request<Incoming>,
    served: Arc<Mutex<Vec<Call>>>,
    bin: PathBuf,
    root: PathBuf,
) -> Result<Response<Body>, Infallible> {
    let started = Instant::now();
    if req.uri().path() != EXECUTE_UPDATE {
        return Ok(answer(12, &format!("unknown method {}", req.uri().path())));
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let request = match unframe(&body).map(ExecuteUpdateRequest::decode) {
        Ok(Ok(r)) => r,
        other => return Ok(answer(13, &format!("undecodable request: {other:?}"))),
    };
    let (status, message) = match execute(&request, &bin, &root).await {
        Ok(()) => (0, String::new()),
        Err(why) => (13, why),
    };
    served.lock().expect("the calls").push(Call {
        request,
        started,
        ended: Instant::now(),
        status,
    });
    Ok(answer(status, &message))
}

/// What the agent does with a request (its order and its messages).
async fn execute(request: &ExecuteUpdateRequest, bin: &Path, root: &Path) -> Result<(), String> {
    let version = &request.wanted_kubernetes_version;
    if !version.starts_with('v') || version.split('.').count() != 3 {
        return Err(format!("unable to verify the Kubernetes version {version}"));
    }
    for c in &request.kubernetes_components {
        let target = root.join("root").join(c.install_path.trim_start_matches('/'));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
        }
        std::fs::write(&target, c.url.as_bytes()).map_err(|e| format!("unable to install: {e}"))?;
    }
    let common = [
        "--ignore-preflight-errors",
        "CoreDNSMigration,CoreDNSUnsupportedPlugins",
        version,
    ];
    let plan: Vec<&str> = ["upgrade", "plan"].into_iter().chain(common).collect();
    let apply: Vec<&str> = [
        "upgrade",
        "apply",
        "--yes",
        "--patches",
        "/opt/kubernetes/patches",
    ]
    .into_iter()
    .chain(common)
    .collect();
    // kubeadm first on the PATH, as the agent's unit puts /run/state/bin.
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    for (what, args) in [("plan", plan), ("apply", apply)] {
        let status = tokio::process::Command::new("kubeadm")
            .args(&args)
            .env("PATH", &path)
            .status()
            .await
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("unable to execute kubeadm upgrade {what}: {status}"));
        }
    }
    Ok(())
}

/// A gRPC answer: the (empty) response message, then the status trailers.
fn answer(status: u32, message: &str) -> Response<Body> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", status.into());
    if !message.is_empty() {
        let encoded: String = message
            .bytes()
            .map(|b| match b {
                b' '..=b'~' if b != b'%' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        trailers.insert("grpc-message", encoded.parse().expect("an ASCII value"));
    }
    let data = frame(&ExecuteUpdateResponse {}.encode_to_vec());
    let frames = vec![
        Ok::<_, Infallible>(Frame::data(Bytes::from(data))),
        Ok(Frame::trailers(trailers)),
    ];
    let body = StreamBody::new(stream::iter(frames)).boxed();
    let mut response = Response::new(body);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}
