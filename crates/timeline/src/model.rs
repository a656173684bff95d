//! What the page shows, decided from the traces: a row per replaced node
//! with its phases, the rollout's root span, the leader changes and the
//! replacements in progress over time.

use std::collections::{BTreeMap, BTreeSet};

use crate::jaeger::{Span, Trace};
use crate::{REPLACE_NODE, ROLLOUT};

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

/// What a mark of the rollout itself is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MarkKind {
    /// A failure domain's replacements (`rollout domain`).
    Domain,
    /// A wave, from its start to when it finished (`rollout wave`).
    Wave,
    /// The soak after a wave (`wave soak`).
    Soak,
    /// The rollout halted (`rollout halted`).
    Halt,
}

/// A span of the rollout's own trace: a wave, a soak, a domain, a halt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// What it is.
    pub kind: MarkKind,
    /// Its label: "wave 2", "soak after wave 1", "zone=b", "halted".
    pub label: String,
    /// Start (µs).
    pub start: u64,
    /// End (µs).
    pub end: u64,
}

/// The marks of the rollout `rollout_id` in `traces`, by start (a span
/// seen in several answers counts once).
pub fn rollout_marks(traces: &[Trace], rollout_id: &str) -> Vec<Mark> {
    let mut seen = BTreeSet::new();
    let mut marks = Vec::new();
    for span in traces
        .iter()
        .filter(|t| t.trace_id == rollout_id)
        .flat_map(|t| &t.spans)
    {
        let wave = || span.tag_str("nodewarden.wave");
        let (kind, label) = match span.operation_name.as_str() {
            crate::ROLLOUT_WAVE => (MarkKind::Wave, format!("wave {}", wave())),
            crate::WAVE_SOAK => (MarkKind::Soak, format!("soak after wave {}", wave())),
            crate::ROLLOUT_DOMAIN => (MarkKind::Domain, span.tag_str("nodewarden.domain")),
            crate::ROLLOUT_HALTED => (MarkKind::Halt, "halted".to_string()),
            _ => continue,
        };
        if seen.insert(span.span_id.as_str()) {
            marks.push(Mark {
                kind,
                label,
                start: span.start_time,
                end: span.end_time(),
            });
        }
    }
    marks.sort_by_key(|m| (m.start, m.kind));
    marks
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
    /// The drawn rollout's waves, soaks, domains and halts.
    pub marks: Vec<Mark>,
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

    let marks = rollout_id
        .as_deref()
        .map(|id| rollout_marks(traces, id))
        .unwrap_or_default();
    let extents: Vec<(u64, u64)> = rows.iter().map(Row::extent).collect();
    let bounds = extents
        .iter()
        .copied()
        .chain(rollout.as_ref().map(|r| (r.start, r.end)))
        .chain(marks.iter().map(|m| (m.start, m.end)));
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
        marks,
    }
}
