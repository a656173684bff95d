//! A Jaeger all-in-one (built from Go modules by `e2e/jaeger/build.sh`) as a
//! child process of a test: nodewarden exports OTLP to it, the test reads the
//! traces back through Jaeger's query API, as a user would.

use std::collections::BTreeMap;
use std::process::Command;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;

pub struct Jaeger {
    dir: tempfile::TempDir,
    pub otlp_endpoint: String,
    pub query: String,
}

impl Jaeger {
    pub fn start() -> Jaeger {
        let dir = tempfile::tempdir().expect("a temp dir");
        let script = crate::repo().join("e2e/jaeger/run.sh");
        let out = Command::new(&script)
            .arg("start")
            .arg(dir.path())
            .output()
            .expect("running e2e/jaeger/run.sh");
        assert!(
            out.status.success(),
            "starting jaeger failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = |f: &str| {
            std::fs::read_to_string(dir.path().join(f))
                .unwrap_or_else(|e| panic!("reading {f}: {e}"))
                .trim()
                .to_string()
        };
        Jaeger {
            otlp_endpoint: format!("http://127.0.0.1:{}", port("otlp-http-port")),
            query: format!("http://127.0.0.1:{}", port("query-port")),
            dir,
        }
    }

    /// Every trace of `service` that has a span named `operation`.
    pub async fn traces(&self, service: &str, operation: &str) -> Result<Vec<JaegerTrace>, String> {
        let operation = operation.replace(' ', "%20");
        let uri = format!(
            "{}/api/traces?service={service}&operation={operation}&limit=10000&lookback=1h",
            self.query
        );
        let body = http_get(&uri).await?;
        let answer: TracesAnswer = serde_json::from_str(&body).map_err(|e| format!("decoding {uri}: {e}"))?;
        Ok(answer.data.unwrap_or_default())
    }
}

impl Jaeger {
    /// Waits until the traces of `service` with a root span `root` name
    /// exactly `nodes` (by the root's `k8s.node.name`), and returns them.
    pub async fn wait_node_traces(
        &self,
        service: &str,
        root: &str,
        nodes: &std::collections::BTreeSet<String>,
    ) -> Vec<JaegerTrace> {
        super::wait_for(
            &format!("a {root:?} trace per node in Jaeger"),
            std::time::Duration::from_secs(30),
            || async {
                match self.traces(service, root).await {
                    Ok(t) => {
                        let traced: std::collections::BTreeSet<String> = t
                            .iter()
                            .filter_map(|t| t.root(root))
                            .filter_map(|s| s.tag_str("k8s.node.name").map(str::to_string))
                            .collect();
                        match &traced == nodes {
                            true => super::Probe::Done(t),
                            false => super::Probe::NotYet(format!("traces for {traced:?}")),
                        }
                    }
                    Err(e) => super::Probe::NotYet(e),
                }
            },
        )
        .await
    }
}

/// GET a plain-HTTP URL; the body as text, or what went wrong.
pub async fn http_get(uri: &str) -> Result<String, String> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .get(uri.parse().map_err(|e| format!("{uri}: {e}"))?)
        .await
        .map_err(|e| format!("GET {uri}: {e}"))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("reading {uri}: {e}"))?
        .to_bytes();
    let text = String::from_utf8_lossy(&body).into_owned();
    if !status.is_success() {
        return Err(format!("GET {uri}: {status} {text}"));
    }
    Ok(text)
}

impl Drop for Jaeger {
    fn drop(&mut self) {
        let script = crate::repo().join("e2e/jaeger/run.sh");
        let _ = Command::new(script).arg("stop").arg(self.dir.path()).output();
    }
}

#[derive(Deserialize)]
struct TracesAnswer {
    data: Option<Vec<JaegerTrace>>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerTrace {
    #[serde(rename = "traceID")]
    pub trace_id: String,
    pub spans: Vec<JaegerSpan>,
    pub processes: BTreeMap<String, JaegerProcess>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerSpan {
    #[serde(rename = "traceID")]
    pub trace_id: String,
    #[serde(rename = "spanID")]
    pub span_id: String,
    pub operation_name: String,
    #[serde(default)]
    pub references: Vec<JaegerReference>,
    #[serde(default)]
    pub tags: Vec<JaegerTag>,
    #[serde(default)]
    pub logs: Vec<serde_json::Value>,
    #[serde(rename = "processID")]
    pub process_id: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerReference {
    pub ref_type: String,
    #[serde(rename = "traceID")]
    pub trace_id: String,
    #[serde(rename = "spanID")]
    pub span_id: String,
}

#[derive(Clone, Debug, Deserialize)]
pub struct JaegerTag {
    pub key: String,
    pub value: serde_json::Value,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JaegerProcess {
    pub service_name: String,
    #[serde(default)]
    pub tags: Vec<JaegerTag>,
}

impl JaegerSpan {
    pub fn tag(&self, key: &str) -> Option<&serde_json::Value> {
        self.tags.iter().find(|t| t.key == key).map(|t| &t.value)
    }

    pub fn tag_str(&self, key: &str) -> Option<&str> {
        self.tag(key).and_then(|v| v.as_str())
    }

    /// A span without a parent in its own trace (links to other traces are
    /// FOLLOWS_FROM references and do not count).
    pub fn is_root(&self) -> bool {
        !self
            .references
            .iter()
            .any(|r| r.ref_type == "CHILD_OF" && r.trace_id == self.trace_id)
    }
}

impl JaegerTrace {
    /// The replica (`service.instance.id`) that sent each span.
    pub fn instances(&self) -> std::collections::BTreeSet<String> {
        self.spans
            .iter()
            .filter_map(|s| self.processes.get(&s.process_id))
            .filter_map(|p| {
                p.tags
                    .iter()
                    .find(|t| t.key == "service.instance.id")
                    .and_then(|t| t.value.as_str())
                    .map(str::to_string)
            })
            .collect()
    }

    pub fn root(&self, operation: &str) -> Option<&JaegerSpan> {
        self.spans
            .iter()
            .find(|s| s.operation_name == operation && s.is_root())
    }

    pub fn operations(&self) -> std::collections::BTreeSet<&str> {
        self.spans.iter().map(|s| s.operation_name.as_str()).collect()
    }
}
