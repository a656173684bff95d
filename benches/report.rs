//! The one table `just bench-scale` prints: the six figures of the scale
//! benches (scale, drains, rollout, failover), each beside its target and
//! the command that measured it, read from the JSON each bench wrote under
//! `.run/bench-*/`. Writes the table as `report.md` and `report.json`, and
//! `report.svg`: every target's figure as a share of what the target allows.
//!
//! `cargo bench --bench report` renders what the benches last wrote; under
//! `cargo test` it checks the verdicts on a table of cases first, then
//! renders whatever is there, so the command cannot rot.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// How a figure stands against its target.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    Met,
    Missed,
    /// The figure has no target, or its target is for another size.
    NoTarget,
}

/// One line of the table.
#[derive(Debug)]
struct Row {
    item: u8,
    figure: String,
    nodewarden: String,
    peer: String,
    target: String,
    verdict: Verdict,
    /// The figure over what the target allows (≤ 1 is met), for the chart.
    share_of_target: Option<f64>,
    command: String,
}

/// A target that the figure must not exceed.
fn at_most(figure: f64, limit: f64) -> (Verdict, Option<f64>) {
    let verdict = if figure <= limit {
        Verdict::Met
    } else {
        Verdict::Missed
    };
    (verdict, Some(figure / limit))
}

/// A target that the figure must reach.
fn at_least(figure: f64, floor: f64) -> (Verdict, Option<f64>) {
    let verdict = if figure >= floor {
        Verdict::Met
    } else {
        Verdict::Missed
    };
    (verdict, Some(floor / figure.max(1e-9)))
}

fn num(v: &Value, path: &str) -> Option<f64> {
    path.split('.').try_fold(v, |v, key| v.get(key))?.as_f64()
}

fn s(v: Option<f64>, unit: &str, digits: usize) -> String {
    match v {
        Some(v) => format!("{v:.digits$} {unit}").trim_end().to_string(),
        None => "—".to_string(),
    }
}

/// The size the memory and queue targets are set for.
const TARGET_NODES: f64 = 5000.0;

/// Items 1, 3 and 6, from `scale.json`.
fn scale_rows(scale: &Value) -> Vec<Row> {
    let command = scale["command"]
        .as_str()
        .unwrap_or("cargo bench --bench scale")
        .to_string();
    let mut rows = Vec::new();
    for point in scale["points"].as_array().into_iter().flatten() {
        let nodes = num(point, "nodes").unwrap_or(0.0);
        let at_target_size = nodes >= TARGET_NODES;
        let serve = |who: &str| num(point, &format!("{who}.time_to_serve_seconds"));
        rows.push(Row {
            item: 1,
            figure: format!(
                "{nodes:.0} nodes, {:.0} pods: time to serve",
                num(point, "pods").unwrap_or(0.0)
            ),
            nodewarden: s(serve("nodewarden"), "s", 1),
            peer: s(serve("node_maintenance_operator"), "s", 1),
            target: "—".into(),
            verdict: Verdict::NoTarget,
            share_of_target: None,
            command: command.clone(),
        });
        let rss = |who: &str| {
            format!(
                "{} / {} / {}",
                s(num(point, &format!("{who}.rss_serving_mb")), "", 1),
                s(num(point, &format!("{who}.rss_steady_mb")), "", 1),
                s(num(point, &format!("{who}.peak_rss_mb")), "MB", 1),
            )
        };
        let ours = num(point, "nodewarden.rss_steady_mb").unwrap_or(f64::INFINITY);
        let theirs = num(point, "node_maintenance_operator.rss_steady_mb").unwrap_or(0.0);
        let (verdict, share) = if at_target_size {
            at_most(ours, 64.0)
        } else {
            (Verdict::NoTarget, None)
        };
        rows.push(Row {
            item: 1,
            figure: format!("{nodes:.0} nodes: RSS serving / after the heartbeats / peak"),
            nodewarden: rss("nodewarden"),
            peer: rss("node_maintenance_operator"),
            target: if at_target_size {
                "≤ 64 MB (after the heartbeats)".into()
            } else {
                "(set for 5,000 nodes)".into()
            },
            verdict,
            share_of_target: share,
            command: command.clone(),
        });
        if at_target_size {
            let (verdict, share) = at_most(ours, theirs / 10.0);
            rows.push(Row {
                item: 1,
                figure: format!("{nodes:.0} nodes: RSS after the heartbeats against a tenth of the peer's"),
                nodewarden: s(Some(ours), "MB", 1),
                peer: format!("a tenth: {}", s(Some(theirs / 10.0), "MB", 1)),
                target: "≤ a tenth of the peer".into(),
                verdict,
                share_of_target: share,
                command: command.clone(),
            });
        }
        let cpu = |who: &str| {
            s(
                num(point, &format!("{who}.cpu_seconds_per_minute_steady")),
                "s/min",
                2,
            )
        };
        rows.push(Row {
            item: 1,
            figure: format!("{nodes:.0} nodes: CPU per minute at rest"),
            nodewarden: cpu("nodewarden"),
            peer: cpu("node_maintenance_operator"),
            target: "—".into(),
            verdict: Verdict::NoTarget,
            share_of_target: None,
            command: command.clone(),
        });
        let p99 = num(point, "churn.queue_wait_p99_seconds");
        let (verdict, share) = match p99 {
            Some(p99) if at_target_size => at_most(p99, 0.010),
            _ => (Verdict::NoTarget, None),
        };
        rows.push(Row {
            item: 3,
            figure: format!(
                "{nodes:.0} churning nodes ({:.0} Node updates/s, {:.0} reconciles): watch event → reconcile start, p50 / p99",
                num(point, "churn.node_updates_per_second").unwrap_or(0.0),
                num(point, "churn.reconciles").unwrap_or(0.0),
            ),
            nodewarden: format!(
                "{} / {}",
                s(num(point, "churn.queue_wait_p50_seconds").map(|v| v * 1000.0), "ms", 2),
                s(p99.map(|v| v * 1000.0), "ms", 2)
            ),
            peer: "—".into(),
            target: if at_target_size { "p99 ≤ 10 ms".into() } else { "(set for 5,000 nodes)".into() },
            verdict,
            share_of_target: share,
            command: command.clone(),
        });
    }
    if let Some(r) = scale.get("apiserver_restart").filter(|r| !r.is_null()) {
        let relisted = r["relisted_resources"].as_array().map_or(0, Vec::len);
        rows.push(Row {
            item: 6,
            figure: format!(
                "{:.0} nodes: kube-apiserver down {:.1} s, then every store current again / a new maintenance served; full relists; peak RSS",
                num(r, "nodes").unwrap_or(0.0),
                num(r, "apiserver_down_seconds").unwrap_or(0.0),
            ),
            nodewarden: format!(
                "{} / {}; {relisted} of {:.0} relisted; {}",
                s(num(r, "every_reflector_watching_again_seconds"), "s", 2),
                s(num(r, "new_maintenance_served_seconds"), "s", 2),
                num(r, "reflectors").unwrap_or(0.0),
                s(num(r, "nodewarden_peak_rss_mb"), "MB", 1),
            ),
            peer: format!("peak {}", s(num(r, "peer_peak_rss_mb"), "MB", 1)),
            target: "—".into(),
            verdict: Verdict::NoTarget,
            share_of_target: None,
            command,
        });
    }
    rows
}

/// Item 2, from `drains.json`.
fn drain_rows(drains: &Value) -> Vec<Row> {
    let command = drains["command"]
        .as_str()
        .unwrap_or("cargo bench --bench drains")
        .to_string();
    let many = num(drains, "maintenances_at_once").unwrap_or(0.0);
    let figure = |who: &str| {
        format!(
            "{} at once, {} for one ({})",
            s(num(drains, &format!("{who}.all_at_once_seconds")), "s", 2),
            s(num(drains, &format!("{who}.one_drain_seconds")), "s", 2),
            s(num(drains, &format!("{who}.all_over_one")), "×", 1),
        )
    };
    let over_one = num(drains, "nodewarden.all_over_one").unwrap_or(f64::INFINITY);
    let peer_over_ours = num(drains, "peer_over_nodewarden").unwrap_or(0.0);
    let (verdict, share) = at_most(over_one, 1.5);
    let (faster, faster_share) = at_least(peer_over_ours, 10.0);
    vec![
        Row {
            item: 2,
            figure: format!("{many:.0} NodeMaintenances at once on PDB-guarded nodes, until all succeed"),
            nodewarden: figure("nodewarden"),
            peer: figure("node_maintenance_operator"),
            target: "≤ 1.5 × one drain".into(),
            verdict,
            share_of_target: share,
            command: command.clone(),
        },
        Row {
            item: 2,
            figure: format!("{many:.0} at once: the peer's time over nodewarden's"),
            nodewarden: s(Some(peer_over_ours), "×", 1),
            peer: String::new(),
            target: "≥ 10 ×".into(),
            verdict: faster,
            share_of_target: faster_share,
            command,
        },
    ]
}

/// Item 4, from `rollout.json`.
fn rollout_rows(rollout: &Value) -> Vec<Row> {
    let command = rollout["command"]
        .as_str()
        .unwrap_or("cargo bench --bench rollout")
        .to_string();
    let nodes = num(rollout, "nodes").unwrap_or(0.0);
    rollout["rollouts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let ratio = num(r, "ratio_to_ideal").unwrap_or(f64::INFINITY);
            let (verdict, share) = at_most(ratio, 1.05);
            let calls = match r["cloud_calls_per_node"].as_object() {
                Some(m) => format!(
                    "{:.1} cloud calls per node",
                    m.values().filter_map(Value::as_f64).sum::<f64>()
                ),
                None => "cloud calls not counted".to_string(),
            };
            Row {
                item: 4,
                figure: format!(
                    "{nodes:.0} sim-cloud nodes replaced at maxSurge {:.0}",
                    num(r, "max_surge").unwrap_or(0.0)
                ),
                nodewarden: format!(
                    "{} against an ideal {} ({ratio:.2} ×); {calls}",
                    s(num(r, "seconds"), "s", 1),
                    s(num(r, "ideal_seconds"), "s", 1),
                ),
                peer: "—".into(),
                target: "≤ 1.05 × ideal".into(),
                verdict,
                share_of_target: share,
                command: command.clone(),
            }
        })
        .collect()
}

/// Item 5, from `failover.json`.
fn failover_rows(failover: &Value) -> Vec<Row> {
    let command = failover["command"]
        .as_str()
        .unwrap_or("cargo bench --bench failover")
        .to_string();
    let lease = num(failover, "lease_duration_seconds").unwrap_or(15.0);
    let retry = num(failover, "retry_period_seconds").unwrap_or(2.0);
    let mut rows = Vec::new();
    for (signal, key, limit) in [("SIGTERM", "sigterm", 1.0), ("SIGKILL", "sigkill", lease + retry)] {
        let Some(trials) = failover.get(key).filter(|t| !t.is_null()) else {
            continue;
        };
        let worst = num(trials, "first_reconcile_max_seconds").unwrap_or(f64::INFINITY);
        let (verdict, share) = at_most(worst, limit);
        rows.push(Row {
            item: 5,
            figure: format!(
                "{signal} to the leader ({:.0} trials, default flags) → the new leader's first reconcile",
                num(trials, "trials").unwrap_or(0.0)
            ),
            nodewarden: format!(
                "median {}, max {}",
                s(num(trials, "first_reconcile_median_seconds"), "s", 2),
                s(Some(worst), "s", 2)
            ),
            peer: "—".into(),
            target: if key == "sigterm" {
                "≤ 1 s".into()
            } else {
                format!("≤ lease + one retry = {limit:.0} s")
            },
            verdict,
            share_of_target: share,
            command: command.clone(),
        });
    }
    rows
}

/// Every row the present JSON files allow, in the issue's order.
fn rows(
    scale: Option<&Value>,
    drains: Option<&Value>,
    rollout: Option<&Value>,
    failover: Option<&Value>,
) -> Vec<Row> {
    let mut rows: Vec<Row> = [
        scale.map(scale_rows),
        drains.map(drain_rows),
        rollout.map(rollout_rows),
        failover.map(failover_rows),
    ]
    .into_iter()
    .flatten()
    .flatten()
    .collect();
    rows.sort_by_key(|r| r.item);
    rows
}

fn verdict_text(v: Verdict) -> &'static str {
    match v {
        Verdict::Met => "met",
        Verdict::Missed => "MISSED",
        Verdict::NoTarget => "",
    }
}

fn markdown(rows: &[Row]) -> Vec<String> {
    let mut lines = vec![
        "| # | figure | nodewarden | Node Maintenance Operator v0.17.0 | target | | command |".to_string(),
        "|---|---|---|---|---|---|---|".to_string(),
    ];
    for r in rows {
        lines.push(format!(
            "| {} | {} | {} | {} | {} | {} | `{}` |",
            r.item,
            r.figure,
            r.nodewarden,
            r.peer,
            r.target,
            verdict_text(r.verdict),
            r.command
        ));
    }
    lines
}

/// One bar per target: the figure as a share of what the target allows,
/// with the target's line at 100 %.
fn chart(rows: &[Row]) -> String {
    let targeted: Vec<&Row> = rows.iter().filter(|r| r.share_of_target.is_some()).collect();
    let scale_max = targeted
        .iter()
        .filter_map(|r| r.share_of_target)
        .fold(1.2, f64::max)
        .min(10.0);
    let (left, width, row_height) = (520.0, 360.0, 26.0);
    let height = 60.0 + row_height * targeted.len() as f64;
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="12">
<text x="10" y="20" font-size="14">nodewarden against its targets: each figure as a share of what its target allows (the line is the target)</text>
"##,
        left + width + 80.0
    );
    for (i, r) in targeted.iter().enumerate() {
        let share = r.share_of_target.unwrap_or(0.0);
        let y = 40.0 + row_height * i as f64;
        let w = width * share.min(scale_max) / scale_max;
        let colour = if r.verdict == Verdict::Met { "#2a7" } else { "#c63" };
        let label: String = r.figure.chars().take(80).collect();
        svg.push_str(&format!(
            r##"<text x="10" y="{}">{}</text><rect x="{left}" y="{y}" width="{w:.1}" height="{}" fill="{colour}"/><text x="{:.1}" y="{}">{:.0} %</text>
"##,
            y + 14.0,
            xml_escape(&format!("{}. {label}", r.item)),
            row_height - 8.0,
            left + w + 4.0,
            y + 14.0,
            share * 100.0,
        ));
    }
    let line = left + width / scale_max;
    svg.push_str(&format!(
        r##"<line x1="{line:.1}" y1="32" x2="{line:.1}" y2="{:.1}" stroke="#333" stroke-dasharray="4 3"/>
</svg>
"##,
        height - 10.0
    ));
    svg
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn read(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e) => panic!("{} is not the JSON a bench writes: {e}", path.display()),
    }
}

/// The verdicts on figures just inside and just outside each target.
fn check_verdicts() {
    let point = |nodes: f64, ours: f64, theirs: f64, p99: f64| {
        json!({"command": "c", "points": [{
            "nodes": nodes, "pods": nodes * 4.0,
            "nodewarden": {"rss_steady_mb": ours, "time_to_serve_seconds": 1.0},
            "node_maintenance_operator": {"rss_steady_mb": theirs},
            "churn": {"queue_wait_p99_seconds": p99},
        }]})
    };
    let verdicts = |v: &Value| -> Vec<(u8, Verdict)> {
        scale_rows(v)
            .iter()
            .filter(|r| r.item != 1 || r.figure.contains("RSS"))
            .map(|r| (r.item, r.verdict))
            .collect()
    };
    let cases = [
        // At 5,000 nodes RSS is judged twice: against 64 MB, then against a
        // tenth of the peer's.
        (
            point(5000.0, 63.0, 700.0, 0.009),
            vec![(1, Verdict::Met), (1, Verdict::Met), (3, Verdict::Met)],
        ),
        (
            point(5000.0, 63.0, 600.0, 0.011),
            vec![(1, Verdict::Met), (1, Verdict::Missed), (3, Verdict::Missed)],
        ),
        (
            point(5000.0, 65.0, 900.0, 0.001),
            vec![(1, Verdict::Missed), (1, Verdict::Met), (3, Verdict::Met)],
        ),
        (
            point(500.0, 99.0, 10.0, 0.5),
            vec![(1, Verdict::NoTarget), (3, Verdict::NoTarget)],
        ),
    ];
    for (input, want) in cases {
        assert_eq!(verdicts(&input), want, "{input}");
    }
    let drains = |all: f64, peer: f64| {
        let d = json!({"maintenances_at_once": 20, "nodewarden": {"all_over_one": all}, "peer_over_nodewarden": peer});
        drain_rows(&d).iter().map(|r| r.verdict).collect::<Vec<_>>()
    };
    assert_eq!(drains(1.4, 11.0), [Verdict::Met, Verdict::Met]);
    assert_eq!(drains(1.6, 9.0), [Verdict::Missed, Verdict::Missed]);
    let rollout = json!({"nodes": 30, "rollouts": [{"max_surge": 1, "ratio_to_ideal": 1.04}, {"max_surge": 3, "ratio_to_ideal": 1.06}]});
    let got: Vec<Verdict> = rollout_rows(&rollout).iter().map(|r| r.verdict).collect();
    assert_eq!(got, [Verdict::Met, Verdict::Missed]);
    let failover = json!({"lease_duration_seconds": 15, "retry_period_seconds": 2,
        "sigterm": {"first_reconcile_max_seconds": 0.9}, "sigkill": {"first_reconcile_max_seconds": 17.5}});
    let got: Vec<Verdict> = failover_rows(&failover).iter().map(|r| r.verdict).collect();
    assert_eq!(got, [Verdict::Met, Verdict::Missed]);
    println!("report: verdicts checked on {} cases", 4 + 2 + 2 + 2);
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        check_verdicts();
    }
    let run = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".run");
    let part = |dir: &str, file: &str| read(&run.join(dir).join(file));
    let (scale, drains, rollout, failover) = (
        part("bench-scale", "scale.json"),
        part("bench-drains", "drains.json"),
        part("bench-rollout", "rollout.json"),
        part("bench-failover", "failover.json"),
    );
    let missing: Vec<&str> = [
        ("scale", scale.is_none()),
        ("drains", drains.is_none()),
        ("rollout", rollout.is_none()),
        ("failover", failover.is_none()),
    ]
    .into_iter()
    .filter_map(|(name, gone)| gone.then_some(name))
    .collect();
    if !missing.is_empty() {
        println!(
            "report: not measured yet: {} (cargo bench --bench <name>)",
            missing.join(", ")
        );
    }
    let rows = rows(
        scale.as_ref(),
        drains.as_ref(),
        rollout.as_ref(),
        failover.as_ref(),
    );
    let table = markdown(&rows);
    for line in &table {
        println!("report: {line}");
    }
    let missed = rows.iter().filter(|r| r.verdict == Verdict::Missed).count();
    let met = rows.iter().filter(|r| r.verdict == Verdict::Met).count();
    println!("report: {met} targets met, {missed} missed");
    let out = run.join("bench-scale");
    let report = json!({
        "rows": rows.iter().map(|r| json!({
            "item": r.item,
            "figure": r.figure,
            "nodewarden": r.nodewarden,
            "peer": r.peer,
            "target": r.target,
            "verdict": verdict_text(r.verdict),
            "share_of_target": r.share_of_target,
            "command": r.command,
        })).collect::<Vec<_>>(),
        "parts": {"scale": scale, "drains": drains, "rollout": rollout, "failover": failover},
    });
    let written = std::fs::create_dir_all(&out)
        .and_then(|()| std::fs::write(out.join("report.md"), table.join("\n") + "\n"))
        .and_then(|()| {
            std::fs::write(
                out.join("report.json"),
                serde_json::to_string_pretty(&report).unwrap_or_default(),
            )
        })
        .and_then(|()| std::fs::write(out.join("report.svg"), chart(&rows)));
    match written {
        Ok(()) => println!(
            "report: wrote {0}/report.md, report.json and report.svg",
            out.display()
        ),
        Err(e) => panic!("writing the report into {}: {e}", out.display()),
    }
}
