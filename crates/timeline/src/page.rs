//! The page: one self-contained HTML file (its style and its SVG inline,
//! nothing to fetch) drawn from a [`Timeline`].

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::model::{Mark, MarkKind, Row, Timeline};

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
pub(crate) fn shorten(s: &str, max: usize) -> String {
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
/// The row of the rollout's own marks (domains, waves, soaks, a halt).
const MARKS_H: f64 = 40.0;
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
pub(crate) fn label_lanes(xs: &[(f64, f64)]) -> Vec<usize> {
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
    let heading = heading(t);
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(&heading),
        escape(&heading)
    );
    let _ = writeln!(html, "<p class=\"facts\">{}</p>", escape(&facts(t).join(" · ")));
    html.push_str(&trace_ids(t));

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
    html.push_str(NOTE);
    html
}

/// The page's title: the NodeVersion rolled out, as the rollout's span or
/// else its replacements name it.
fn heading(t: &Timeline) -> String {
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
    match &nodeversion {
        Some(nv) => format!("Rollout of NodeVersion {nv}"),
        None => "Rollout".to_string(),
    }
}

/// The rollout in brief: nodes replaced, images, how long, leader changes,
/// when it started.
fn facts(t: &Timeline) -> Vec<String> {
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
    facts
}

/// The drawn rollout's trace id, and the other rollouts in the window.
fn trace_ids(t: &Timeline) -> String {
    let mut html = String::new();
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
            "<p class=\"ids\">Other rollouts in this window (draw one with <code>nodewarden-timeline --rollout ID</code>): {}</p>",
            t.other_rollouts
                .iter()
                .map(|id| format!("<code>{}</code>", escape(id)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    html
}

/// How to read the page, under the drawing.
const NOTE: &str = "<p class=\"note\">Each row is one node's <code>replace node</code> trace: the grey bar from its first span \
     to its last, the coloured bars its phases. A leader change is where the replica sending the spans changes \
     (each span's <code>service.instance.id</code>, in the order the spans ended, leaving out <code>wait for \
     join</code> and <code>wait ready</code>, which may be sent long after they end); the line is at the end of \
     the new leader's first span, the shaded band reaches back to the old leader's last. Hover over anything for \
     exact times.</p>\n</body>\n</html>\n";

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

/// The leader changes' labels, placed so they neither run off the right
/// nor overlap.
struct LeaderLabels {
    /// `leader: <from> → <to>`, one per change.
    texts: Vec<String>,
    /// Each label's left and right end, and whether it ends at its line
    /// (else it starts there).
    extents: Vec<(f64, f64, bool)>,
    /// Each label's lane, from the top.
    lanes: Vec<usize>,
    /// How many lanes there are.
    lane_count: usize,
}

impl LeaderLabels {
    fn new(t: &Timeline, axis: &Axis) -> LeaderLabels {
        let texts: Vec<String> = t
            .leader_changes
            .iter()
            .map(|c| format!("leader: {} → {}", c.from, c.to))
            .collect();
        // A label starts at its line, or ends there when it would run off the right.
        let extents: Vec<(f64, f64, bool)> = t
            .leader_changes
            .iter()
            .zip(&texts)
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
        LeaderLabels {
            texts,
            extents,
            lanes,
            lane_count,
        }
    }
}

/// Where the drawing's parts go, top to bottom: the leader labels, the
/// axis, the rows, the budget.
struct Layout {
    labels_top: f64,
    axis_top: f64,
    marks_top: f64,
    rows_top: f64,
    budget_top: f64,
    budget_bottom: f64,
    height: f64,
}

impl Layout {
    fn new(rows: usize, label_lanes: usize, marks: bool) -> Layout {
        let labels_top = 4.0;
        let axis_top = labels_top + label_lanes as f64 * LANE_H + 14.0;
        let marks_top = axis_top + 8.0;
        let rows_top = marks_top + if marks { MARKS_H + 6.0 } else { 0.0 };
        let rows_bottom = rows_top + rows as f64 * ROW_H;
        let budget_top = rows_bottom + 34.0;
        let budget_bottom = budget_top + BUDGET_H;
        Layout {
            labels_top,
            axis_top,
            marks_top,
            rows_top,
            budget_top,
            budget_bottom,
            height: budget_bottom + 24.0,
        }
    }
}

fn svg(t: &Timeline) -> String {
    let axis = Axis {
        start: t.start,
        span: (t.end - t.start).max(1),
        x0: plot_x0(&t.rows),
    };
    let labels = LeaderLabels::new(t, &axis);
    let layout = Layout::new(t.rows.len(), labels.lane_count, !t.marks.is_empty());
    let height = layout.height;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" viewBox=\"0 0 {WIDTH} {height:.0}\" font-size=\"12\" font-family=\"system-ui,sans-serif\">"
    );
    // Bottom up: row stripes, grid, failover gaps, then the rows' bars.
    for i in (1..t.rows.len()).step_by(2) {
        let y = layout.rows_top + i as f64 * ROW_H;
        let _ = writeln!(
            s,
            "<rect x=\"0\" y=\"{y:.1}\" width=\"{WIDTH}\" height=\"{ROW_H}\" fill=\"#f7f7f7\"/>"
        );
    }
    s.push_str(&ticks_svg(t, &axis, &layout));
    s.push_str(&failover_svg(t, &axis, &layout));
    s.push_str(&marks_svg(&t.marks, &axis, layout.marks_top));
    for (i, row) in t.rows.iter().enumerate() {
        s.push_str(&row_svg(row, &axis, layout.rows_top + i as f64 * ROW_H));
    }
    s.push_str(&budget_svg(t, &axis, layout.budget_top, layout.budget_bottom));
    // Leader changes last, over everything else.
    s.push_str(&leader_svg(t, &axis, &labels, &layout));
    s.push_str("</svg>\n");
    s
}

/// The rollout's own row: domains as green bands, waves as blue bars over
/// them, soaks as grey bars, a halt as a red line; each labelled, with its
/// times on hover.
fn marks_svg(marks: &[Mark], axis: &Axis, top: f64) -> String {
    let mut s = String::new();
    for m in marks {
        let (x0, x1) = (axis.x(m.start), axis.x(m.end));
        let title = format!(
            "{}: {} to {} ({})",
            m.label,
            axis.offset(m.start),
            axis.offset(m.end),
            format_duration(m.end.saturating_sub(m.start))
        );
        let (y, h, fill, text_y) = match m.kind {
            MarkKind::Domain => (top, MARKS_H, "#dcefe0", top + MARKS_H - 4.0),
            MarkKind::Wave => (top + 4.0, 18.0, "#9ec1e6", top + 17.0),
            MarkKind::Soak => (top + 4.0, 18.0, "#d0d0d0", top + 17.0),
            MarkKind::Halt => {
                let _ = writeln!(
                    s,
                    "<g><title>{}</title><line x1=\"{x0:.1}\" y1=\"{top:.1}\" x2=\"{x0:.1}\" y2=\"{:.1}\" stroke=\"{LEADER_COLOUR}\" stroke-width=\"2\"/>\
                     <text x=\"{:.1}\" y=\"{:.1}\" fill=\"{LEADER_COLOUR}\" font-weight=\"600\">halted</text></g>",
                    escape(&title),
                    top + MARKS_H,
                    x0 + 3.0,
                    top + MARKS_H - 4.0
                );
                continue;
            }
        };
        let _ = writeln!(
            s,
            "<g><title>{}</title><rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{fill}\"/>\
             <text x=\"{:.1}\" y=\"{text_y:.1}\" font-size=\"11\" fill=\"#333\">{}</text></g>",
            escape(&title),
            (x1 - x0).max(1.0),
            x0 + 3.0,
            escape(&m.label)
        );
    }
    s
}

/// Ticks: grid lines through rows and budget, labels above the rows and
/// under the budget.
fn ticks_svg(t: &Timeline, axis: &Axis, layout: &Layout) -> String {
    let (rows_top, budget_bottom) = (layout.rows_top, layout.budget_bottom);
    let step = tick_step(axis.span);
    let mut s = String::new();
    let mut tick = 0;
    while tick * 1_000_000 <= axis.span {
        let x = axis.x(t.start + tick * 1_000_000);
        let label = tick_label(tick, step);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{rows_top:.1}\" x2=\"{x:.1}\" y2=\"{budget_bottom:.1}\" stroke=\"#ececec\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#666\">{label}</text>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#666\">{label}</text>",
            layout.axis_top,
            budget_bottom + 16.0
        );
        tick += step;
    }
    s
}

/// Between the old leader's last span and the new one's first nobody sent
/// anything: the failover (or a quiet moment before it), shaded.
fn failover_svg(t: &Timeline, axis: &Axis, layout: &Layout) -> String {
    let rows_top = layout.rows_top;
    let mut s = String::new();
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
            layout.budget_bottom - rows_top,
            escape(&title)
        );
    }
    s
}

/// A dashed line at each leader change, through rows and budget, with its
/// label in its lane.
fn leader_svg(t: &Timeline, axis: &Axis, labels: &LeaderLabels, layout: &Layout) -> String {
    let budget_bottom = layout.budget_bottom;
    let mut s = String::new();
    for (((change, label), (_, _, right_aligned)), lane) in t
        .leader_changes
        .iter()
        .zip(&labels.texts)
        .zip(&labels.extents)
        .zip(&labels.lanes)
    {
        let x = axis.x(change.at);
        let label_y = layout.labels_top + (*lane as f64 + 1.0) * LANE_H - 4.0;
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
