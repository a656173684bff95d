//! Jaeger's answer to `GET /api/traces`, read without trusting it (a trace
//! or span lacking what the timeline needs is left out), and the query that
//! asks for it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// Jaeger's answer to `GET /api/traces` could not be read at all.
#[derive(Debug, thiserror::Error)]
#[error("Jaeger's answer is not a list of traces: {0}")]
pub struct TimelineError(#[from] serde_json::Error);

#[derive(Deserialize)]
struct TracesAnswer {
    #[serde(default, deserialize_with = "skip_invalid")]
    data: Vec<Trace>,
}

/// One trace as Jaeger's query API returns it (the fields the timeline reads).
#[derive(Clone, Debug, Deserialize)]
pub struct Trace {
    /// The trace id.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// Its spans; malformed ones are dropped while reading.
    #[serde(default, deserialize_with = "skip_invalid")]
    pub spans: Vec<Span>,
    /// The processes (replicas) that sent the spans, by `processID`.
    #[serde(default, deserialize_with = "skip_invalid_values")]
    pub processes: BTreeMap<String, Process>,
}

/// One span of a [`Trace`].
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Span {
    /// The span id.
    #[serde(rename = "spanID")]
    pub span_id: String,
    /// The span's name: `replace node`, a phase, `rollout`.
    pub operation_name: String,
    /// Its parent (`CHILD_OF`) and its links (`FOLLOWS_FROM`).
    #[serde(default, deserialize_with = "skip_invalid")]
    pub references: Vec<Reference>,
    /// Start, microseconds since the Unix epoch.
    pub start_time: u64,
    /// Duration in microseconds.
    pub duration: u64,
    /// The span's attributes.
    #[serde(default, deserialize_with = "skip_invalid")]
    pub tags: Vec<Tag>,
    /// The key of the sending process in [`Trace::processes`].
    #[serde(rename = "processID", default)]
    pub process_id: Option<String>,
}

/// A reference from a span to another span.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    /// `CHILD_OF` (the parent) or `FOLLOWS_FROM` (a link).
    pub ref_type: String,
    /// The referenced span's trace.
    #[serde(rename = "traceID")]
    pub trace_id: String,
    /// The referenced span.
    #[serde(rename = "spanID")]
    pub span_id: String,
}

/// A span or process attribute.
#[derive(Clone, Debug, Deserialize)]
pub struct Tag {
    /// The attribute's key.
    pub key: String,
    /// Its value (string, number or bool).
    #[serde(default)]
    pub value: serde_json::Value,
}

/// A process that sent spans: one nodewarden replica.
#[derive(Clone, Debug, Deserialize)]
pub struct Process {
    /// Its resource attributes (`service.instance.id` names the replica).
    #[serde(default, deserialize_with = "skip_invalid")]
    pub tags: Vec<Tag>,
}

/// A list whose malformed items are dropped rather than failing the whole answer.
fn skip_invalid<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Vec<T>, D::Error> {
    let items = Option::<Vec<serde_json::Value>>::deserialize(d)?.unwrap_or_default();
    Ok(items
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect())
}

fn skip_invalid_values<'de, D: Deserializer<'de>, T: DeserializeOwned>(
    d: D,
) -> Result<BTreeMap<String, T>, D::Error> {
    let items = Option::<BTreeMap<String, serde_json::Value>>::deserialize(d)?.unwrap_or_default();
    Ok(items
        .into_iter()
        .filter_map(|(k, v)| Some((k, serde_json::from_value(v).ok()?)))
        .collect())
}

/// The traces in an answer of `GET /api/traces`.
pub fn parse_traces(json: &str) -> Result<Vec<Trace>, TimelineError> {
    Ok(serde_json::from_str::<TracesAnswer>(json)?.data)
}

/// The path and query of `GET /api/traces` for `operation`'s traces of
/// `service` that started between `start` and `end` (µs since the epoch).
pub fn traces_query(service: &str, operation: &str, start: u64, end: u64, limit: usize) -> String {
    format!(
        "/api/traces?service={}&operation={}&start={start}&end={end}&limit={limit}",
        percent_encode(service),
        percent_encode(operation)
    )
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub(crate) fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(char::from(b)),
            _ => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

impl Span {
    pub(crate) fn end_time(&self) -> u64 {
        self.start_time.saturating_add(self.duration)
    }

    pub(crate) fn tag(&self, key: &str) -> Option<&serde_json::Value> {
        self.tags.iter().find(|t| t.key == key).map(|t| &t.value)
    }

    pub(crate) fn tag_str(&self, key: &str) -> String {
        self.tag(key)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    }

    /// Without a parent in its own trace (links to other traces do not count).
    fn is_root_of(&self, trace_id: &str) -> bool {
        !self
            .references
            .iter()
            .any(|r| r.ref_type == "CHILD_OF" && r.trace_id == trace_id)
    }

    /// The other traces this span is linked to.
    pub(crate) fn links<'a>(&'a self, trace_id: &'a str) -> impl Iterator<Item = &'a str> {
        self.references
            .iter()
            .filter(move |r| r.ref_type == "FOLLOWS_FROM" && r.trace_id != trace_id)
            .map(|r| r.trace_id.as_str())
    }
}

impl Trace {
    /// The replica (`service.instance.id`) that sent `span`, if Jaeger says.
    pub(crate) fn replica(&self, span: &Span) -> Option<String> {
        self.processes
            .get(span.process_id.as_deref()?)?
            .tags
            .iter()
            .find(|t| t.key == "service.instance.id")?
            .value
            .as_str()
            .map(str::to_string)
    }

    /// The root span named `operation`. A root sent again (by the next
    /// leader, same span id) may be stored twice: the later end is the one
    /// that counts.
    pub(crate) fn root(&self, operation: &str) -> Option<&Span> {
        self.spans
            .iter()
            .filter(|s| s.operation_name == operation && s.is_root_of(&self.trace_id))
            .max_by_key(|s| s.end_time())
    }
}
