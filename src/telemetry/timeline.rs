//! A rollout as one self-contained HTML page: a row per replaced node with
//! its phases on a shared time axis, the leader changes, and how many
//! replacements ran at once. It is drawn from the answers of Jaeger's query
//! API (`GET /api/traces`), so it works with any Jaeger that received
//! nodewarden's traces, including one built without the web UI.
//!
//! Everything here is pure: `nodewarden timeline` fetches, this decides
//! and draws. Data from Jaeger is never trusted: a trace or span lacking
//! what the timeline needs is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use super::trace::{REPLACE_NODE, ROLLOUT};

// --- Jaeger's answer ------------------------------------------------------------

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
fn percent_encode(s: &str) -> String {
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
    fn end_time(&self) -> u64 {
        self.start_time.saturating_add(self.duration)
    }

    fn tag(&self, key: &str) -> Option<&serde_json::Value> {
        self.tags.iter().find(|t| t.key == key).map(|t| &t.value)
    }

    fn tag_str(&self, key: &str) -> String {
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
    fn links<'a>(&'a self, trace_id: &'a str) -> impl Iterator<Item = &'a str> {
        self.references
            .iter()
            .filter(move |r| r.ref_type == "FOLLOWS_FROM" && r.trace_id != trace_id)
            .map(|r| r.trace_id.as_str())
    }
}

impl Trace {
    /// The replica (`service.instance.id`) that sent `span`, if Jaeger says.
    fn replica(&self, span: &Span) -> Option<String> {
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
    fn root(&self, operation: &str) -> Option<&Span> {
        self.spans
            .iter()
            .filter(|s| s.operation_name == operation && s.is_root_of(&self.trace_id))
            .max_by_key(|s| s.end_time())
    }
}

// --- what the page shows --------------------------------------------------------

/// One phase of a replacement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// `create instance`, `wait for join`, ...
    pub name: String,
    /// Start, µs since the epoch.
    pub start: u64,
    /// End, µs since the epoch.
    pub end: u64,
    /// The replica that sent it.
    pub replica: Option<String>,
}

/// One replaced node: a trace with a `replace node` root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The replacement's trace.
    pub trace_id: String,
    /// The replaced node (`k8s.node.name`).
    pub node: String,
    /// The node that replaced it.
    pub heir: String,
    /// Their scaling group.
    pub group: String,
    /// `control-plane`, `worker` or `unknown`.
    pub role: String,
    /// The replaced node's image.
    pub old_image: String,
    /// The image the rollout brought.
    pub new_image: String,
    /// The NodeVersion that rolled out.
    pub nodeversion: String,
    /// The rollout's trace, which the root links to.
    pub rollout: Option<String>,
    /// The root span's start and end (µs).
    pub root: (u64, u64),
    /// The replica that sent the root.
    pub root_replica: Option<String>,
    /// Its phases, by start.
    pub phases: Vec<Phase>,
}

impl Row {
    /// From the first to the last span of the replacement: the root ends
    /// just before `delete node`, and the old node counts until it is gone.
    pub fn extent(&self) -> (u64, u64) {
        let start = self.phases.iter().map(|p| p.start).fold(self.root.0, u64::min);
        let end = self.phases.iter().map(|p| p.end).fold(self.root.1, u64::max);
        (start, end)
    }
}

/// The root span of a rollout trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutSpan {
    /// The rollout's trace.
    pub trace_id: String,
    /// The NodeVersion.
    pub nodeversion: String,
    /// The image it rolled out.
    pub image: String,
    /// How many nodes it had when it ended.
    pub nodes: Option<i64>,
    /// Its maxSurge when it ended (recorded since the span carries it).
    pub max_surge: Option<i64>,
    /// Start (µs).
    pub start: u64,
    /// End (µs).
    pub end: u64,
    /// The replica that sent it.
    pub replica: Option<String>,
}

/// A span's end and who sent it: spans go out right after their step ends,
/// so the end is about when the replica sent it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The span's end (µs).
    pub at: u64,
    /// The replica that sent it.
    pub replica: String,
}

/// The spans' sender changed from one replica to another: a new leader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderChange {
    /// The end of the first span the new leader sent (µs): it led by then.
    pub at: u64,
    /// The end of the last span the old leader sent before (µs).
    pub previous_last: u64,
    /// The old leader.
    pub from: String,
    /// The new leader.
    pub to: String,
}

/// From `at` on (µs), `in_progress` replacements were running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// When the count changed.
    pub at: u64,
    /// Replacements running from then on.
    pub in_progress: usize,
}

/// What to draw besides what the traces say.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The rollout (trace id) to draw; None: the latest.
    pub rollout: Option<String>,
    /// The maxSurge line; None: as the rollout span recorded it (if it did).
    pub max_surge: Option<u32>,
}

/// One rollout, ready to draw.
#[derive(Clone, Debug)]
pub struct Timeline {
    /// The drawn rollout's trace id (None: replacements linked to no rollout).
    pub rollout_id: Option<String>,
    /// Its root span, when Jaeger had it (it is sent once the rollout ends).
    pub rollout: Option<RolloutSpan>,
    /// The replaced nodes, by start.
    pub rows: Vec<Row>,
    /// The leader changes, in order.
    pub leader_changes: Vec<LeaderChange>,
    /// Replacements in progress over time.
    pub budget: Vec<Step>,
    /// The maxSurge line, if given.
    pub max_surge: Option<u32>,
    /// The time axis: the first start (µs).
    pub start: u64,
    /// The time axis: the last end (µs).
    pub end: u64,
    /// Rollouts in the answers that are not drawn (their trace ids).
    pub other_rollouts: Vec<String>,
}

/// The replaced nodes in `traces` (traces without a `replace node` root
/// are not replacements; a trace id seen twice counts once).
pub fn replacement_rows(traces: &[Trace]) -> Vec<Row> {
    let mut seen = BTreeSet::new();
    let mut rows = Vec::new();
    for trace in traces {
        let Some(root) = trace.root(REPLACE_NODE) else {
            continue;
        };
        if !seen.insert(trace.trace_id.as_str()) {
            continue;
        }
        // A phase sent again after a crash keeps its span id: one bar, the later end.
        let mut phases: BTreeMap<&str, &Span> = BTreeMap::new();
        for span in trace.spans.iter().filter(|s| s.operation_name != REPLACE_NODE) {
            let kept = phases.entry(span.span_id.as_str()).or_insert(span);
            if span.end_time() > kept.end_time() {
                *kept = span;
            }
        }
        let mut phases: Vec<Phase> = phases
            .values()
            .map(|s| Phase {
                name: s.operation_name.clone(),
                start: s.start_time,
                end: s.end_time(),
                replica: trace.replica(s),
            })
            .collect();
        phases.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
        rows.push(Row {
            trace_id: trace.trace_id.clone(),
            node: root.tag_str("k8s.node.name"),
            heir: root.tag_str("nodewarden.heir"),
            group: root.tag_str("nodewarden.scaling_group"),
            role: root.tag_str("nodewarden.role"),
            old_image: root.tag_str("nodewarden.image.old"),
            new_image: root.tag_str("nodewarden.image.new"),
            nodeversion: root.tag_str("nodewarden.nodeversion"),
            rollout: root.links(&trace.trace_id).next().map(str::to_string),
            root: (root.start_time, root.end_time()),
            root_replica: trace.replica(root),
            phases,
        });
    }
    rows.sort_by(|a, b| (a.extent(), &a.node).cmp(&(b.extent(), &b.node)));
    rows
}

/// The rollout root spans in `traces`, by start.
pub fn rollout_spans(traces: &[Trace]) -> Vec<RolloutSpan> {
    let mut seen = BTreeSet::new();
    let mut out: Vec<RolloutSpan> = traces
        .iter()
        .filter_map(|t| Some((t, t.root(ROLLOUT)?)))
        .filter(|(t, _)| seen.insert(t.trace_id.as_str()))
        .map(|(t, root)| RolloutSpan {
            trace_id: t.trace_id.clone(),
            nodeversion: root.tag_str("nodewarden.nodeversion"),
            image: root.tag_str("nodewarden.image.new"),
            nodes: root.tag("nodewarden.nodes").and_then(|v| v.as_i64()),
            max_surge: root.tag("nodewarden.max_surge").and_then(|v| v.as_i64()),
            start: root.start_time,
            end: root.end_time(),
            replica: t.replica(root),
        })
        .collect();
    out.sort_by_key(|r| (r.start, r.end));
    out
}

/// Which rollout to draw: the one asked for, else the one the last
/// replacement to end belongs to (a rollout's own root only exists once it
/// is over), else the last rollout to end. None: replacements linked to no
/// rollout.
pub fn choose_rollout(rows: &[Row], rollouts: &[RolloutSpan], wanted: Option<&str>) -> Option<String> {
    if let Some(wanted) = wanted {
        return Some(wanted.to_string());
    }
    match rows.iter().max_by_key(|r| r.extent().1) {
        Some(last) => last.rollout.clone(),
        None => rollouts.iter().max_by_key(|r| r.end).map(|r| r.trace_id.clone()),
    }
}

/// Phases that end at a timestamp the objects keep (the heir's creation,
/// its Ready condition) rather than when they are sent: the leader that
/// pairs the nodes sends them, perhaps long after they ended under another
/// leader. Every other span ends right before its sender sends it.
const ENDED_BEFORE_SENT: [&str; 2] = ["wait for join", "wait ready"];

/// The leader changes the senders of spans show: taken in the order they
/// were sent, each switch from one replica to another is a change, at the
/// first span the new leader sent.
pub fn leader_changes(mut sent: Vec<Sent>) -> Vec<LeaderChange> {
    sent.sort_by(|a, b| (a.at, &a.replica).cmp(&(b.at, &b.replica)));
    let mut changes = Vec::new();
    for pair in sent.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if before.replica != after.replica {
            changes.push(LeaderChange {
                at: after.at,
                previous_last: before.at,
                from: before.replica.clone(),
                to: after.replica.clone(),
            });
        }
    }
    changes
}

/// How many of `intervals` (start, end) are in progress over time: a step
/// wherever the count changes. One ending as another starts do not overlap.
pub fn in_progress(intervals: &[(u64, u64)]) -> Vec<Step> {
    let mut changes: Vec<(u64, i64)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end.max(start), -1)])
        .collect();
    changes.sort();
    let mut steps: Vec<Step> = Vec::new();
    let mut count: i64 = 0;
    let mut i = 0;
    while i < changes.len() {
        let at = changes[i].0;
        while i < changes.len() && changes[i].0 == at {
            count += changes[i].1;
            i += 1;
        }
        let in_progress = usize::try_from(count).unwrap_or(0);
        // Nothing runs before the first step.
        if steps.last().map_or(0, |s| s.in_progress) != in_progress {
            steps.push(Step { at, in_progress });
        }
    }
    steps
}

/// The timeline of one rollout from the answers of Jaeger's query API
/// (`replace node` and `rollout` traces, in any mix).
pub fn build(traces: &[Trace], options: &Options) -> Timeline {
    let all_rows = replacement_rows(traces);
    let rollouts = rollout_spans(traces);
    let rollout_id = choose_rollout(&all_rows, &rollouts, options.rollout.as_deref());
    let rows: Vec<Row> = all_rows.into_iter().filter(|r| r.rollout == rollout_id).collect();
    let rollout = rollouts
        .iter()
        .find(|r| Some(&r.trace_id) == rollout_id.as_ref())
        .cloned();
    let mut others: BTreeSet<String> = rollouts.iter().map(|r| r.trace_id.clone()).collect();
    if let Some(id) = &rollout_id {
        others.remove(id);
    }

    let mut sent: Vec<Sent> = Vec::new();
    for row in &rows {
        let phases = row
            .phases
            .iter()
            .filter(|p| !ENDED_BEFORE_SENT.contains(&p.name.as_str()))
            .map(|p| (p.end, &p.replica));
        for (at, replica) in std::iter::once((row.root.1, &row.root_replica)).chain(phases) {
            if let Some(replica) = replica {
                sent.push(Sent {
                    at,
                    replica: replica.clone(),
                });
            }
        }
    }
    if let Some(r) = &rollout
        && let Some(replica) = &r.replica
    {
        sent.push(Sent {
            at: r.end,
            replica: replica.clone(),
        });
    }

    let extents: Vec<(u64, u64)> = rows.iter().map(Row::extent).collect();
    let bounds = extents
        .iter()
        .copied()
        .chain(rollout.as_ref().map(|r| (r.start, r.end)));
    let start = bounds.clone().map(|b| b.0).min().unwrap_or(0);
    let end = bounds.map(|b| b.1).max().unwrap_or(start);
    // Asked for, else as the rollout's span recorded it.
    let max_surge = options.max_surge.or_else(|| {
        rollout
            .as_ref()
            .and_then(|r| r.max_surge)
            .and_then(|m| u32::try_from(m).ok())
    });
    Timeline {
        rollout_id,
        rollout,
        leader_changes: leader_changes(sent),
        budget: in_progress(&extents),
        max_surge,
        start,
        end: end.max(start),
        other_rollouts: others.into_iter().collect(),
        rows,
    }
}

// --- drawing --------------------------------------------------------------------

/// The phases in the order a replacement goes through them, with their colours
/// (Okabe–Ito, told apart with most colour-vision deficiencies).
const PHASE_COLOURS: [(&str, &str); 7] = [
    ("create instance", "#E69F00"),
    ("wait for join", "#56B4E9"),
    ("wait ready", "#009E73"),
    ("transfer labels", "#F0E442"),
    ("drain", "#0072B2"),
    ("delete instance", "#D55E00"),
    ("delete node", "#CC79A7"),
];
const OTHER_PHASE_COLOUR: &str = "#999999";
const ROOT_COLOUR: &str = "#e4e4e4";
const LEADER_COLOUR: &str = "#c0001a";

fn phase_colour(name: &str) -> &'static str {
    PHASE_COLOURS
        .iter()
        .find(|(n, _)| *n == name)
        .map_or(OTHER_PHASE_COLOUR, |(_, c)| c)
}

/// Escapes text for HTML and SVG, in elements and quoted attributes alike.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A duration in µs for people: exact to the millisecond.
pub fn format_duration(micros: u64) -> String {
    match micros {
        0..1_000 => format!("{micros} µs"),
        1_000..1_000_000 => format!("{:.1} ms", micros as f64 / 1e3),
        _ => format!("{:.3} s", micros as f64 / 1e6),
    }
}

/// The distance between ticks (seconds) for an axis `span` µs long: a
/// round number giving at most 12 ticks.
pub fn tick_step(span: u64) -> u64 {
    const STEPS: [u64; 14] = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
    let seconds = span.div_ceil(1_000_000);
    STEPS
        .iter()
        .copied()
        .find(|step| seconds / step <= 12)
        .unwrap_or_else(|| seconds.div_ceil(12 * 3600) * 3600)
}

fn tick_label(seconds: u64, step: u64) -> String {
    if step >= 60 {
        format!("{}m", seconds / 60)
    } else {
        format!("{seconds}s")
    }
}

/// At most `max` characters, cut in the middle: node names differ at
/// their ends (`...-00003`), so both ends stay.
fn shorten(s: &str, max: usize) -> String {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() <= max {
        return s.to_string();
    }
    let tail = max.saturating_sub(1) / 2;
    let head = max.saturating_sub(1) - tail;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "?" } else { s }
}

const WIDTH: f64 = 1360.0;
const PLOT_X1: f64 = WIDTH - 30.0;
const LANE_H: f64 = 16.0;
const ROW_H: f64 = 22.0;
const BAR_H: f64 = 14.0;
const BUDGET_H: f64 = 110.0;
/// Row labels cut longer names (node and heir each).
const NAME_MAX: usize = 30;
/// About how wide a character is: of a node name (12 px), of its heir's
/// (11 px), of a leader label (12 px, bold); generous, so text never runs
/// into the bars.
const NODE_CHAR_W: f64 = 7.3;
const HEIR_CHAR_W: f64 = 6.7;
const BOLD_CHAR_W: f64 = 7.8;

/// Where the plot starts: right of the longest row label.
fn plot_x0(rows: &[Row]) -> f64 {
    let longest = rows
        .iter()
        .map(|r| {
            let node = shorten(or_unknown(&r.node), NAME_MAX).chars().count() as f64;
            let heir = shorten(or_unknown(&r.heir), NAME_MAX).chars().count() as f64;
            node * NODE_CHAR_W + (heir + 3.0) * HEIR_CHAR_W
        })
        .fold(0.0, f64::max);
    (8.0 + longest + 16.0).clamp(200.0, 560.0)
}

/// Times to x coordinates on the shared axis.
struct Axis {
    start: u64,
    span: u64,
    x0: f64,
}

impl Axis {
    fn x(&self, t: u64) -> f64 {
        let offset = t.saturating_sub(self.start).min(self.span) as f64;
        self.x0 + offset / self.span as f64 * (PLOT_X1 - self.x0)
    }

    /// `t` as an offset from the rollout's start.
    fn offset(&self, t: u64) -> String {
        format!("+{:.3} s", t.saturating_sub(self.start) as f64 / 1e6)
    }
}

/// Label lanes for the leader changes, so close ones do not overlap:
/// each goes in the first lane whose last label ends left of it.
fn label_lanes(xs: &[(f64, f64)]) -> Vec<usize> {
    let mut lane_ends: Vec<f64> = Vec::new();
    xs.iter()
        .map(
            |&(left, right)| match lane_ends.iter().position(|&end| end + 8.0 < left) {
                Some(lane) => {
                    lane_ends[lane] = right;
                    lane
                }
                None => {
                    lane_ends.push(right);
                    lane_ends.len() - 1
                }
            },
        )
        .collect()
}

/// The whole page.
pub fn render(t: &Timeline) -> String {
    let mut html = String::new();
    let nodeversion = t
        .rollout
        .as_ref()
        .map(|r| r.nodeversion.clone())
        .filter(|n| !n.is_empty())
        .or_else(|| {
            t.rows
                .iter()
                .map(|r| r.nodeversion.clone())
                .find(|n| !n.is_empty())
        });
    let heading = match &nodeversion {
        Some(nv) => format!("Rollout of NodeVersion {nv}"),
        None => "Rollout".to_string(),
    };
    let old: BTreeSet<&str> = t
        .rows
        .iter()
        .map(|r| r.old_image.as_str())
        .filter(|i| !i.is_empty())
        .collect();
    let new: BTreeSet<&str> = t
        .rows
        .iter()
        .map(|r| r.new_image.as_str())
        .chain(t.rollout.as_ref().map(|r| r.image.as_str()))
        .filter(|i| !i.is_empty())
        .collect();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(&heading),
        escape(&heading)
    );

    let mut facts = vec![format!(
        "{} node{} replaced",
        t.rows.len(),
        if t.rows.len() == 1 { "" } else { "s" }
    )];
    if !old.is_empty() || !new.is_empty() {
        let join = |s: &BTreeSet<&str>| {
            if s.is_empty() {
                "?".into()
            } else {
                s.iter().copied().collect::<Vec<_>>().join(", ")
            }
        };
        facts.push(format!("{} → {}", join(&old), join(&new)));
    }
    if !t.rows.is_empty() || t.rollout.is_some() {
        facts.push(format!(
            "{} from the first span to the last",
            format_duration(t.end - t.start)
        ));
    }
    if let Some(r) = &t.rollout {
        facts.push(format!("rollout span {}", format_duration(r.end - r.start)));
    }
    facts.push(match t.leader_changes.len() {
        1 => "1 leader change".to_string(),
        n => format!("{n} leader changes"),
    });
    if let Some(start) = i64::try_from(t.start)
        .ok()
        .and_then(|us| jiff::Timestamp::from_microsecond(us).ok())
        .filter(|_| t.start > 0)
    {
        facts.push(format!("started {}", start.strftime("%Y-%m-%d %H:%M:%S UTC")));
    }
    let _ = writeln!(html, "<p class=\"facts\">{}</p>", escape(&facts.join(" · ")));
    let _ = writeln!(
        html,
        "<p class=\"ids\">rollout trace <code>{}</code>{}</p>",
        escape(
            t.rollout_id
                .as_deref()
                .unwrap_or("none (replacements linked to no rollout)")
        ),
        if t.rollout.is_none() && t.rollout_id.is_some() {
            " (its root span is not in Jaeger: it is sent when the rollout ends)"
        } else {
            ""
        }
    );
    if !t.other_rollouts.is_empty() {
        let _ = writeln!(
            html,
            "<p class=\"ids\">Other rollouts in this window (draw one with <code>nodewarden timeline --rollout ID</code>): {}</p>",
            t.other_rollouts
                .iter()
                .map(|id| format!("<code>{}</code>", escape(id)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    if t.rows.is_empty() {
        html.push_str("<p>No replaced node in these traces.</p>\n</body>\n</html>\n");
        return html;
    }
    let other_spans = t
        .rows
        .iter()
        .flat_map(|r| &r.phases)
        .any(|p| phase_colour(&p.name) == OTHER_PHASE_COLOUR);
    html.push_str(&legend(other_spans, t.max_surge.is_some()));
    html.push_str(&svg(t));
    html.push_str(
        "<p class=\"note\">Each row is one node's <code>replace node</code> trace: the grey bar from its first span \
         to its last, the coloured bars its phases. A leader change is where the replica sending the spans changes \
         (each span's <code>service.instance.id</code>, in the order the spans ended, leaving out <code>wait for \
         join</code> and <code>wait ready</code>, which may be sent long after they end); the line is at the end of \
         the new leader's first span, the shaded band reaches back to the old leader's last. Hover over anything for \
         exact times.</p>\n</body>\n</html>\n",
    );
    html
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px 20px;color:#222;background:#fff}\
h1{font-size:20px;margin:0 0 6px}p{margin:4px 0;font-size:13px}.ids{color:#555}\
code{font-family:ui-monospace,monospace;font-size:12px}\
.legend{display:flex;flex-wrap:wrap;gap:6px 14px;margin:10px 0 4px;font-size:12px}\
.legend span{display:inline-flex;align-items:center;gap:5px}\
.legend i{display:inline-block;width:18px;height:10px;border-radius:2px}\
.note{color:#555;max-width:1300px;margin-top:8px}svg{display:block}";

fn legend(other_spans: bool, max_surge: bool) -> String {
    let mut out = String::from("<div class=\"legend\">");
    let mut item = |swatch: String, name: &str| {
        let _ = write!(out, "<span><i style=\"{swatch}\"></i>{}</span>", escape(name));
    };
    item(
        format!("background:{ROOT_COLOUR};border:1px solid #bbb"),
        "replacement",
    );
    for (name, colour) in PHASE_COLOURS {
        item(format!("background:{colour}"), name);
    }
    if other_spans {
        item(format!("background:{OTHER_PHASE_COLOUR}"), "other span");
    }
    item(
        format!("border-left:2px dashed {LEADER_COLOUR};width:0"),
        "leader change",
    );
    item(
        "background:#b9cde4;border-top:2px solid #3b6ea5;height:8px".into(),
        "replacements in progress",
    );
    if max_surge {
        item("border-top:2px dashed #444;height:0".into(), "maxSurge");
    }
    out.push_str("</div>\n");
    out
}

fn svg(t: &Timeline) -> String {
    let axis = Axis {
        start: t.start,
        span: (t.end - t.start).max(1),
        x0: plot_x0(&t.rows),
    };
    let step = tick_step(axis.span);
    let labels: Vec<String> = t
        .leader_changes
        .iter()
        .map(|c| format!("leader: {} → {}", c.from, c.to))
        .collect();
    // A label starts at its line, or ends there when it would run off the right.
    let extents: Vec<(f64, f64, bool)> = t
        .leader_changes
        .iter()
        .zip(&labels)
        .map(|(c, label)| {
            let x = axis.x(c.at);
            let w = label.chars().count() as f64 * BOLD_CHAR_W;
            if x + 4.0 + w > WIDTH {
                (x - 4.0 - w, x - 4.0, true)
            } else {
                (x + 4.0, x + 4.0 + w, false)
            }
        })
        .collect();
    let lanes = label_lanes(&extents.iter().map(|&(l, r, _)| (l, r)).collect::<Vec<_>>());
    let lane_count = lanes.iter().max().map_or(0, |m| m + 1);

    let labels_top = 4.0;
    let axis_top = labels_top + lane_count as f64 * LANE_H + 14.0;
    let rows_top = axis_top + 8.0;
    let rows_bottom = rows_top + t.rows.len() as f64 * ROW_H;
    let budget_top = rows_bottom + 34.0;
    let budget_bottom = budget_top + BUDGET_H;
    let height = budget_bottom + 24.0;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" viewBox=\"0 0 {WIDTH} {height:.0}\" font-size=\"12\" font-family=\"system-ui,sans-serif\">"
    );

    // Bottom up: row stripes, grid, failover gaps, then the rows' bars.
    for i in (1..t.rows.len()).step_by(2) {
        let y = rows_top + i as f64 * ROW_H;
        let _ = writeln!(
            s,
            "<rect x=\"0\" y=\"{y:.1}\" width=\"{WIDTH}\" height=\"{ROW_H}\" fill=\"#f7f7f7\"/>"
        );
    }

    // Ticks: grid lines through rows and budget, labels above the rows and under the budget.
    let mut tick = 0;
    while tick * 1_000_000 <= axis.span {
        let x = axis.x(t.start + tick * 1_000_000);
        let label = tick_label(tick, step);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{rows_top:.1}\" x2=\"{x:.1}\" y2=\"{budget_bottom:.1}\" stroke=\"#ececec\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#666\">{label}</text>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#666\">{label}</text>",
            axis_top,
            budget_bottom + 16.0
        );
        tick += step;
    }

    // Between the old leader's last span and the new one's first nobody
    // sent anything: the failover (or a quiet moment before it).
    for change in &t.leader_changes {
        let (x0, x1) = (axis.x(change.previous_last), axis.x(change.at));
        let title = format!(
            "no span sent for {}: from {}'s last ({}) to {}'s first ({})",
            format_duration(change.at - change.previous_last),
            change.from,
            axis.offset(change.previous_last),
            change.to,
            axis.offset(change.at)
        );
        let _ = writeln!(
            s,
            "<rect x=\"{x0:.1}\" y=\"{rows_top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{LEADER_COLOUR}\" fill-opacity=\"0.08\"><title>{}</title></rect>",
            x1 - x0,
            budget_bottom - rows_top,
            escape(&title)
        );
    }

    for (i, row) in t.rows.iter().enumerate() {
        s.push_str(&row_svg(row, &axis, rows_top + i as f64 * ROW_H));
    }

    s.push_str(&budget_svg(t, &axis, budget_top, budget_bottom));

    // Leader changes last, over everything else.
    for (((change, label), (_, _, right_aligned)), lane) in
        t.leader_changes.iter().zip(&labels).zip(&extents).zip(&lanes)
    {
        let x = axis.x(change.at);
        let label_y = labels_top + (*lane as f64 + 1.0) * LANE_H - 4.0;
        let (anchor, text_x) = if *right_aligned {
            ("end", x - 4.0)
        } else {
            ("start", x + 4.0)
        };
        let title = format!(
            "leader: {} → {}\nfirst span from {} ended at {}\nlast span from {} before it ended at {}",
            change.from,
            change.to,
            change.to,
            axis.offset(change.at),
            change.from,
            axis.offset(change.previous_last)
        );
        let _ = writeln!(
            s,
            "<g><title>{}</title><line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{budget_bottom:.1}\" stroke=\"{LEADER_COLOUR}\" stroke-width=\"1.5\" stroke-dasharray=\"5 3\"/>\
             <text x=\"{text_x:.1}\" y=\"{label_y:.1}\" text-anchor=\"{anchor}\" fill=\"{LEADER_COLOUR}\" font-weight=\"600\">{}</text></g>",
            escape(&title),
            label_y - 10.0,
            escape(label)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn row_svg(row: &Row, axis: &Axis, y: f64) -> String {
    let mut s = String::new();
    let (start, end) = row.extent();
    let replicas: BTreeSet<&str> = row
        .phases
        .iter()
        .filter_map(|p| p.replica.as_deref())
        .chain(row.root_replica.as_deref())
        .collect();
    let title = format!(
        "{} → {}\n{} ({}), {} → {}\nreplacement: {} ({} → {})\nroot span: {}\nspans sent by {}\ntrace {}",
        or_unknown(&row.node),
        or_unknown(&row.heir),
        or_unknown(&row.group),
        or_unknown(&row.role),
        or_unknown(&row.old_image),
        or_unknown(&row.new_image),
        format_duration(end - start),
        axis.offset(start),
        axis.offset(end),
        format_duration(row.root.1 - row.root.0),
        if replicas.is_empty() {
            "?".to_string()
        } else {
            replicas.into_iter().collect::<Vec<_>>().join(", ")
        },
        row.trace_id
    );
    let text_y = y + ROW_H / 2.0 + 4.0;
    let _ = writeln!(
        s,
        "<g><title>{}</title><text x=\"8\" y=\"{text_y:.1}\">{}<tspan fill=\"#888\" font-size=\"11\"> → {}</tspan></text>",
        escape(&title),
        escape(&shorten(or_unknown(&row.node), NAME_MAX)),
        escape(&shorten(or_unknown(&row.heir), NAME_MAX))
    );
    let (x0, x1) = (axis.x(start), axis.x(end));
    let _ = writeln!(
        s,
        "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" rx=\"3\" fill=\"{ROOT_COLOUR}\" stroke=\"#bbb\"/></g>",
        y + 2.0,
        (x1 - x0).max(1.0),
        ROW_H - 4.0
    );
    for phase in &row.phases {
        let (x0, x1) = (axis.x(phase.start), axis.x(phase.end));
        let title = format!(
            "{} · {}\n{} ({} → {})\nsent by {}",
            or_unknown(&row.node),
            phase.name,
            format_duration(phase.end - phase.start),
            axis.offset(phase.start),
            axis.offset(phase.end),
            phase.replica.as_deref().unwrap_or("?")
        );
        // Phases of a few milliseconds still show, as a sliver.
        let _ = writeln!(
            s,
            "<rect x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{BAR_H}\" fill=\"{}\"><title>{}</title></rect>",
            y + (ROW_H - BAR_H) / 2.0,
            (x1 - x0).max(1.5),
            phase_colour(&phase.name),
            escape(&title)
        );
    }
    s
}

fn budget_svg(t: &Timeline, axis: &Axis, top: f64, bottom: f64) -> String {
    let mut s = String::new();
    let most = t.budget.iter().map(|b| b.in_progress).max().unwrap_or(0);
    let y_max = most.max(t.max_surge.map_or(0, |m| m as usize)).max(1);
    let y = |n: usize| bottom - n as f64 / y_max as f64 * (bottom - top);
    let x0 = axis.x0;
    let _ = writeln!(
        s,
        "<text x=\"8\" y=\"{:.1}\" font-weight=\"600\">replacements in progress</text>\
         <text x=\"8\" y=\"{:.1}\" fill=\"#666\" font-size=\"11\">at most {most} at once</text>",
        top + 12.0,
        top + 28.0
    );
    let y_step = y_max.div_ceil(5);
    let mut n = 0;
    while n <= y_max {
        let _ = writeln!(
            s,
            "<line x1=\"{x0:.1}\" y1=\"{line_y:.1}\" x2=\"{PLOT_X1}\" y2=\"{line_y:.1}\" stroke=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#666\">{n}</text>",
            x0 - 6.0,
            y(n) + 4.0,
            line_y = y(n),
            colour = if n == 0 { "#999" } else { "#ececec" },
        );
        n += y_step;
    }
    // The step area: each step holds until the next.
    let mut path = format!("M{:.1},{bottom:.1}", axis.x(t.start));
    for (i, step) in t.budget.iter().enumerate() {
        let until = t.budget.get(i + 1).map_or(t.end, |next| next.at);
        let (x0, x1) = (axis.x(step.at), axis.x(until));
        let _ = write!(path, " H{x0:.1} V{:.1}", y(step.in_progress));
        if step.in_progress > 0 {
            let _ = writeln!(
                s,
                "<rect x=\"{x0:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"transparent\"><title>{} in progress, {} ({} → {})</title></rect>",
                (x1 - x0).max(1.0),
                bottom - top,
                step.in_progress,
                format_duration(until - step.at),
                axis.offset(step.at),
                axis.offset(until)
            );
        }
    }
    let _ = write!(path, " H{:.1} V{bottom:.1} Z", axis.x(t.end));
    let _ = writeln!(
        s,
        "<path d=\"{path}\" fill=\"#b9cde4\" stroke=\"#3b6ea5\" stroke-width=\"1.5\" pointer-events=\"none\"/>"
    );
    if let Some(m) = t.max_surge {
        let my = y(m as usize);
        let _ = writeln!(
            s,
            "<line x1=\"{x0:.1}\" y1=\"{my:.1}\" x2=\"{PLOT_X1}\" y2=\"{my:.1}\" stroke=\"#444\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\
             <text x=\"{PLOT_X1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#444\">maxSurge {m}</text>",
            my - 4.0
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span as Jaeger's JSON has it (times in seconds, for reading ease).
    fn span(
        trace: &str,
        id: &str,
        op: &str,
        start_s: f64,
        end_s: f64,
        process: &str,
        parent: Option<&str>,
    ) -> serde_json::Value {
        let references: Vec<serde_json::Value> = parent
            .map(|p| serde_json::json!({"refType": "CHILD_OF", "traceID": trace, "spanID": p}))
            .into_iter()
            .collect();
        serde_json::json!({
            "traceID": trace, "spanID": id, "operationName": op, "references": references,
            "startTime": (start_s * 1e6) as u64, "duration": ((end_s - start_s) * 1e6) as u64,
            "tags": [], "logs": [], "processID": process,
        })
    }

    fn processes() -> serde_json::Value {
        let p = |name: &str| serde_json::json!({"serviceName": "nodewarden", "tags": [{"key": "service.instance.id", "type": "string", "value": name}]});
        serde_json::json!({"p1": p("nw-0"), "p2": p("nw-1"), "p3": p("nw-2")})
    }

    /// A `replace node` trace: root (with the node's tags and a link to
    /// `rollout`) and phases `(name, start, end, process)`.
    fn replacement(
        trace: &str,
        node: &str,
        rollout: &str,
        root: (f64, f64, &str),
        phases: &[(&str, f64, f64, &str)],
    ) -> serde_json::Value {
        let mut root_span = span(trace, "root", REPLACE_NODE, root.0, root.1, root.2, None);
        root_span["references"] =
            serde_json::json!([{"refType": "FOLLOWS_FROM", "traceID": rollout, "spanID": "r0"}]);
        root_span["tags"] = serde_json::json!([
            {"key": "k8s.node.name", "type": "string", "value": node},
            {"key": "nodewarden.heir", "type": "string", "value": format!("{node}-heir")},
            {"key": "nodewarden.scaling_group", "type": "string", "value": "workers"},
            {"key": "nodewarden.role", "type": "string", "value": "worker"},
            {"key": "nodewarden.image.old", "type": "string", "value": "img-1"},
            {"key": "nodewarden.image.new", "type": "string", "value": "img-2"},
            {"key": "nodewarden.nodeversion", "type": "string", "value": "nv"},
        ]);
        let mut spans = vec![root_span];
        for (i, (name, start, end, process)) in phases.iter().enumerate() {
            spans.push(span(
                trace,
                &format!("s{i}"),
                name,
                *start,
                *end,
                process,
                Some("root"),
            ));
        }
        serde_json::json!({"traceID": trace, "spans": spans, "processes": processes()})
    }

    fn rollout_trace(trace: &str, start: f64, end: f64, process: &str) -> serde_json::Value {
        let mut root = span(trace, "r0", ROLLOUT, start, end, process, None);
        root["tags"] = serde_json::json!([
            {"key": "nodewarden.nodeversion", "type": "string", "value": "nv"},
            {"key": "nodewarden.image.new", "type": "string", "value": "img-2"},
            {"key": "nodewarden.nodes", "type": "int64", "value": 2},
        ]);
        serde_json::json!({"traceID": trace, "spans": [root], "processes": processes()})
    }

    fn parse(traces: Vec<serde_json::Value>) -> Vec<Trace> {
        parse_traces(&serde_json::json!({"data": traces}).to_string()).expect("an answer")
    }

    fn sent(list: &[(u64, &str)]) -> Vec<Sent> {
        list.iter()
            .map(|&(at, r)| Sent {
                at,
                replica: r.to_string(),
            })
            .collect()
    }

    #[test]
    fn rows_come_from_replace_node_roots_with_their_phases() {
        let traces = parse(vec![
            replacement(
                "b",
                "node-b",
                "R",
                (20.0, 40.0, "p1"),
                &[
                    ("create instance", 20.0, 21.0, "p1"),
                    ("drain", 30.0, 35.0, "p1"),
                    ("delete node", 40.0, 41.0, "p1"),
                ],
            ),
            replacement(
                "a",
                "node-a",
                "R",
                (10.0, 30.0, "p1"),
                &[("wait ready", 12.0, 14.0, "p1")],
            ),
            // Not a replacement (no `replace node` root): no row.
            serde_json::json!({"traceID": "c", "spans": [span("c", "x", "drain", 1.0, 2.0, "p1", Some("elsewhere"))], "processes": {}}),
            rollout_trace("R", 9.0, 42.0, "p1"),
        ]);
        let rows = replacement_rows(&traces);
        let table: Vec<_> = rows
            .iter()
            .map(|r| {
                (
                    r.node.as_str(),
                    r.heir.as_str(),
                    r.rollout.as_deref(),
                    r.phases.iter().map(|p| p.name.as_str()).collect(),
                    r.extent(),
                )
            })
            .collect();
        assert_eq!(
            table,
            vec![
                (
                    "node-a",
                    "node-a-heir",
                    Some("R"),
                    vec!["wait ready"],
                    (10_000_000, 30_000_000)
                ),
                (
                    "node-b",
                    "node-b-heir",
                    Some("R"),
                    vec!["create instance", "drain", "delete node"],
                    // `delete node` comes after the root: the row reaches it.
                    (20_000_000, 41_000_000)
                ),
            ]
        );
        let b = &rows[1];
        assert_eq!(
            (
                b.group.as_str(),
                b.role.as_str(),
                b.old_image.as_str(),
                b.new_image.as_str()
            ),
            ("workers", "worker", "img-1", "img-2")
        );
        assert_eq!(b.root_replica.as_deref(), Some("nw-0"));
        assert_eq!(rollout_spans(&traces)[0].nodes, Some(2));
    }

    #[test]
    fn spans_sent_twice_count_once_and_malformed_ones_are_skipped() {
        let mut trace = replacement(
            "a",
            "node-a",
            "R",
            (10.0, 30.0, "p1"),
            &[("drain", 12.0, 14.0, "p1"), ("drain", 12.0, 15.0, "p2")],
        );
        // The phase sent again after a crash has the same span id.
        trace["spans"][2]["spanID"] = "s0".into();
        // The root sent again by the next leader: the later end counts.
        let mut again = trace["spans"][0].clone();
        again["duration"] = 25_000_000.into();
        again["processID"] = "p2".into();
        let spans = trace["spans"].as_array_mut().expect("spans");
        spans.push(again);
        // Spans Jaeger could never send: no times, a string duration, no name.
        spans.push(serde_json::json!({"spanID": "x1", "operationName": "wait ready", "processID": "p1"}));
        spans.push(serde_json::json!({"spanID": "x2", "operationName": "wait ready", "startTime": 1, "duration": "long"}));
        spans.push(serde_json::json!({"spanID": "x3", "startTime": 1, "duration": 2}));
        let traces = parse(vec![
            trace.clone(),
            trace,
            serde_json::json!({"spans": []}),
            serde_json::json!(7),
        ]);
        let rows = replacement_rows(&traces);
        assert_eq!(rows.len(), 1, "one row per trace id");
        let row = &rows[0];
        assert_eq!(row.root, (10_000_000, 35_000_000));
        assert_eq!(row.root_replica.as_deref(), Some("nw-1"));
        assert_eq!(
            row.phases,
            vec![Phase {
                name: "drain".into(),
                start: 12_000_000,
                end: 15_000_000,
                replica: Some("nw-1".into()),
            }]
        );
        // An unknown processID, or an instance id that is no string: no replica, no panic.
        let odd = |trace: &str, process: &str| {
            serde_json::json!({
                "traceID": trace,
                "spans": [span(trace, "root", REPLACE_NODE, 1.0, 2.0, process, None)],
                "processes": {"p1": {"serviceName": "nodewarden", "tags": [{"key": "service.instance.id", "value": 3}]}},
            })
        };
        let odd = replacement_rows(&parse(vec![odd("o1", "p9"), odd("o2", "p1")]));
        assert_eq!(
            odd.iter().map(|r| r.root_replica.clone()).collect::<Vec<_>>(),
            [None, None]
        );
        assert!(parse_traces("{\"data\": null}").expect("null data").is_empty());
        assert!(parse_traces("not json").is_err());
    }

    #[test]
    fn leader_changes_follow_the_sending_replica() {
        let change = |at, previous_last, from: &str, to: &str| LeaderChange {
            at,
            previous_last,
            from: from.into(),
            to: to.into(),
        };
        let table: Vec<(&str, Vec<Sent>, Vec<LeaderChange>)> = vec![
            ("nothing sent", vec![], vec![]),
            (
                "one leader throughout",
                sent(&[(1, "a"), (2, "a"), (9, "a")]),
                vec![],
            ),
            (
                "one change",
                sent(&[(1, "a"), (2, "a"), (5, "b"), (6, "b")]),
                vec![change(5, 2, "a", "b")],
            ),
            (
                "order is by time, not input",
                sent(&[(6, "b"), (1, "a"), (5, "b"), (2, "a")]),
                vec![change(5, 2, "a", "b")],
            ),
            (
                "two changes to a third replica",
                sent(&[(1, "a"), (2, "a"), (5, "b"), (7, "b"), (9, "c")]),
                vec![change(5, 2, "a", "b"), change(9, 7, "b", "c")],
            ),
            (
                "two changes back to the first",
                sent(&[(1, "a"), (5, "b"), (6, "b"), (9, "a"), (10, "a")]),
                vec![change(5, 1, "a", "b"), change(9, 6, "b", "a")],
            ),
        ];
        for (what, input, want) in table {
            assert_eq!(leader_changes(input), want, "{what}");
        }
    }

    #[test]
    fn phases_that_end_before_they_are_sent_do_not_mark_a_leader() {
        // nw-1 took over at 20 s and paired a node that was Ready at 15 s.
        let traces = parse(vec![
            replacement(
                "a",
                "node-a",
                "R",
                (10.0, 18.0, "p1"),
                &[("create instance", 10.0, 11.0, "p1"), ("drain", 12.0, 17.0, "p1")],
            ),
            replacement(
                "b",
                "node-b",
                "R",
                (12.0, 30.0, "p2"),
                &[
                    ("create instance", 12.0, 13.0, "p1"),
                    ("wait for join", 13.0, 14.0, "p2"),
                    ("wait ready", 14.0, 15.0, "p2"),
                    ("transfer labels", 21.0, 22.0, "p2"),
                ],
            ),
        ]);
        let changes = build(&traces, &Options::default()).leader_changes;
        assert_eq!(
            changes,
            [LeaderChange {
                at: 22_000_000,
                previous_last: 18_000_000,
                from: "nw-0".into(),
                to: "nw-1".into(),
            }]
        );
    }

    #[test]
    fn budget_steps_count_overlapping_replacements() {
        let s = |at, in_progress| Step { at, in_progress };
        type Case = (&'static str, Vec<(u64, u64)>, Vec<Step>);
        let table: Vec<Case> = vec![
            ("none", vec![], vec![]),
            ("one", vec![(10, 20)], vec![s(10, 1), s(20, 0)]),
            (
                "one after the other",
                vec![(10, 20), (30, 40)],
                vec![s(10, 1), s(20, 0), s(30, 1), s(40, 0)],
            ),
            (
                "handed over at the same instant",
                vec![(10, 20), (20, 30)],
                vec![s(10, 1), s(30, 0)],
            ),
            (
                "two overlap",
                vec![(10, 30), (20, 40)],
                vec![s(10, 1), s(20, 2), s(30, 1), s(40, 0)],
            ),
            (
                "three, input unordered",
                vec![(25, 50), (10, 30), (20, 40)],
                vec![s(10, 1), s(20, 2), s(25, 3), s(30, 2), s(40, 1), s(50, 0)],
            ),
            (
                "same start",
                vec![(10, 20), (10, 30)],
                vec![s(10, 2), s(20, 1), s(30, 0)],
            ),
            ("zero length", vec![(10, 10)], vec![]),
        ];
        for (what, input, want) in table {
            assert_eq!(in_progress(&input), want, "{what}");
        }
    }

    #[test]
    fn the_latest_rollout_is_drawn_unless_one_is_asked_for() {
        let traces = parse(vec![
            replacement("a1", "old-a", "OLD", (1.0, 5.0, "p1"), &[]),
            rollout_trace("OLD", 0.5, 6.0, "p1"),
            replacement("b1", "new-a", "NEW", (100.0, 110.0, "p1"), &[]),
            replacement(
                "b2",
                "new-b",
                "NEW",
                (105.0, 120.0, "p2"),
                &[("drain", 106.0, 118.0, "p2")],
            ),
            // NEW is still running: its root span is not in Jaeger yet.
        ]);
        let latest = build(&traces, &Options::default());
        assert_eq!(latest.rollout_id.as_deref(), Some("NEW"));
        assert_eq!(latest.rollout, None);
        assert_eq!(
            latest.rows.iter().map(|r| r.node.as_str()).collect::<Vec<_>>(),
            ["new-a", "new-b"]
        );
        assert_eq!(latest.other_rollouts, ["OLD"]);
        assert_eq!((latest.start, latest.end), (100_000_000, 120_000_000));
        assert_eq!(latest.leader_changes.len(), 1);
        assert_eq!(
            latest.budget.iter().map(|s| s.in_progress).max(),
            Some(2),
            "{:?}",
            latest.budget
        );

        let asked = build(
            &traces,
            &Options {
                rollout: Some("OLD".into()),
                max_surge: Some(3),
            },
        );
        assert_eq!(asked.rows.len(), 1);
        assert_eq!(asked.rollout.as_ref().map(|r| r.start), Some(500_000));
        assert_eq!((asked.start, asked.end), (500_000, 6_000_000));
        assert_eq!(asked.max_surge, Some(3));

        let nothing = build(&[], &Options::default());
        assert!(nothing.rows.is_empty() && nothing.rollout_id.is_none());
        assert!(render(&nothing).contains("No replaced node"));
    }

    #[test]
    fn text_is_escaped() {
        let table = [
            ("plain-node-1", "plain-node-1"),
            (
                "<script>alert(1)</script>",
                "&lt;script&gt;alert(1)&lt;/script&gt;",
            ),
            ("a & b", "a &amp; b"),
            ("\"quoted\" 'single'", "&quot;quoted&quot; &#39;single&#39;"),
            ("→ ünïcode", "→ ünïcode"),
        ];
        for (raw, want) in table {
            assert_eq!(escape(raw), want, "{raw}");
        }
        // Whatever Jaeger holds reaches the page only escaped.
        let evil = "<img src=x onerror=alert(1)>";
        let mut trace = replacement(
            "a",
            evil,
            "R",
            (1.0, 2.0, "p1"),
            &[("</title><b>", 1.0, 1.5, "p1")],
        );
        trace["processes"]["p1"]["tags"][0]["value"] = evil.into();
        let page = render(&build(&parse(vec![trace]), &Options::default()));
        assert!(!page.contains("<img") && !page.contains("</title><b>"), "{page}");
        assert!(page.contains("&lt;img src=x"));
        // Self-contained: nothing to fetch.
        for fetch in ["<script", "<link", "src=\"http", "href=", "@import", "url("] {
            assert!(!page.contains(fetch), "{fetch}");
        }
    }

    #[test]
    fn ticks_are_round_and_few() {
        let table = [
            (0, 1),
            (500_000, 1),
            (12_000_000, 1),
            (13_000_000, 2),
            (74_200_000, 10),
            (600_000_000, 60),
            (3_600_000_000, 300),
            (100 * 3_600_000_000, 32_400),
        ];
        for (span, want) in table {
            assert_eq!(tick_step(span), want, "{span} µs");
        }
        assert_eq!(format_duration(250), "250 µs");
        assert_eq!(format_duration(12_345), "12.3 ms");
        assert_eq!(format_duration(74_200_123), "74.200 s");
    }

    #[test]
    fn long_names_are_cut_in_the_middle() {
        let table = [
            ("demo-workers-00003", 30, "demo-workers-00003"),
            (
                "ha-3f9c1a7e-control-plane-00000",
                30,
                "ha-3f9c1a7e-con…ol-plane-00000",
            ),
            ("abcdef", 5, "ab…ef"),
            ("ünïcödé", 4, "ün…é"),
        ];
        for (name, max, want) in table {
            assert_eq!(shorten(name, max), want, "{name}");
            assert!(shorten(name, max).chars().count() <= max);
        }
    }

    #[test]
    fn close_leader_labels_take_separate_lanes() {
        assert_eq!(
            label_lanes(&[(10.0, 100.0), (50.0, 140.0), (120.0, 200.0), (300.0, 380.0)]),
            [0, 1, 0, 0]
        );
        assert_eq!(label_lanes(&[]), Vec::<usize>::new());
    }

    #[test]
    fn queries_name_the_operation_encoded() {
        assert_eq!(
            traces_query("nodewarden", "replace node", 1, 2, 10),
            "/api/traces?service=nodewarden&operation=replace%20node&start=1&end=2&limit=10"
        );
        assert_eq!(percent_encode("a&b=c/ü"), "a%26b%3Dc%2F%C3%BC");
    }
}
