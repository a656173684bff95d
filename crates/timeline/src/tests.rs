//! The timeline from Jaeger's answer to the page.

use super::*;
use crate::jaeger::percent_encode;
use crate::page::{label_lanes, shorten};

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

#[test]
fn a_rollouts_waves_soaks_domains_and_halt_are_marked_on_its_own_row() {
    let mut rollout = rollout_trace("R", 0.0, 30.0, "p1");
    let tagged = |id: &str, op: &str, start: f64, end: f64, key: &str, value: &str| {
        let mut s = span("R", id, op, start, end, "p1", Some("r0"));
        s["tags"] = serde_json::json!([{"key": key, "type": "string", "value": value}]);
        s
    };
    let marks = [
        tagged("w1", ROLLOUT_WAVE, 0.0, 5.0, "nodewarden.wave", "1"),
        tagged("s1", WAVE_SOAK, 5.0, 8.0, "nodewarden.wave", "1"),
        tagged("w2", ROLLOUT_WAVE, 8.0, 20.0, "nodewarden.wave", "2"),
        tagged("d1", ROLLOUT_DOMAIN, 0.0, 12.0, "nodewarden.domain", "zone=a"),
        span("R", "h", ROLLOUT_HALTED, 25.0, 25.0, "p1", Some("r0")),
    ];
    let mut other = rollout_trace("OTHER", 0.0, 3.0, "p1");
    if let Some(spans) = other["spans"].as_array_mut() {
        spans.push(span("OTHER", "x", ROLLOUT_WAVE, 1.0, 2.0, "p1", Some("r0")));
    }
    if let Some(spans) = rollout["spans"].as_array_mut() {
        spans.extend(marks);
    }
    let traces = parse(vec![
        rollout.clone(),
        rollout,
        other,
        replacement("A", "n1", "R", (1.0, 4.0, "p1"), &[("drain", 2.0, 3.0, "p1")]),
    ]);
    let got: Vec<(MarkKind, String, u64)> = rollout_marks(&traces, "R")
        .into_iter()
        .map(|m| (m.kind, m.label, m.start / 1_000_000))
        .collect();
    assert_eq!(
        got,
        [
            (MarkKind::Domain, "zone=a".to_string(), 0),
            (MarkKind::Wave, "wave 1".to_string(), 0),
            (MarkKind::Soak, "soak after wave 1".to_string(), 5),
            (MarkKind::Wave, "wave 2".to_string(), 8),
            (MarkKind::Halt, "halted".to_string(), 25),
        ],
        "each once, of the drawn rollout only"
    );
    let timeline = build(&traces, &Options::default());
    assert_eq!(timeline.marks.len(), 5);
    let page = render(&timeline);
    for text in [">wave 1<", ">soak after wave 1<", ">zone=a<", ">halted<"] {
        assert!(page.contains(text), "{text} drawn");
    }
}
