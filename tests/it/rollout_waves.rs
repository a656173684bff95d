//! A rollout in waves: `[1, "25%", "100%"]` over eight nodes with a soak of
//! 3 s replaces one node, then two, then the other five, each wave's first
//! instance made only after the wave before joined and soaked, as the
//! sim-cloud's own instance times show (real control plane, sim-cloud).

use crate::support::rollout::*;
use nodewarden::api::update::{condition, reason};
use nodewarden::cloud::sim::wire::InstanceView;
use serde_json::json;
use std::time::Duration;

const SOAK_MS: u64 = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waves_of_one_then_a_quarter_then_the_rest_start_after_a_soak() {
    let r = setup("waves", &[("workers", "Worker", 8)]).await;
    let env = &r.env;
    let op = r.start_operator().await;
    let log = ConditionLog::start(env, &env.name("version"));
    patch_node_version(
        env,
        json!({"spec": {"rollout": {"maxSurge": 8, "waves": [1, "25%", "100%"], "soakTime": "3s"}}}),
    )
    .await;
    let took = roll_nodes(env, 8, "img-2", None).await;

    let mut made = r.instances_of("img-2").await;
    made.sort_by_key(|i| i.instance.created_at_ms);
    assert_eq!(made.len(), 8, "one instance per node: {:?}", names(&made));
    let waves = [&made[..1], &made[1..3], &made[3..]];
    for pair in waves.windows(2) {
        let (before, next) = (pair[0], pair[1]);
        let joined = before
            .iter()
            .map(|i| i.instance.joined_at_ms.unwrap_or(u64::MAX))
            .max()
            .unwrap_or_default();
        let first = next[0].instance.created_at_ms;
        assert!(
            first >= joined + SOAK_MS,
            "a wave began {} ms after the last join of the one before, not after the soak: {:?}",
            first as i64 - joined as i64,
            names(&made)
        );
        let last = next
            .iter()
            .map(|i| i.instance.created_at_ms)
            .max()
            .unwrap_or_default();
        assert!(
            last < first + SOAK_MS,
            "a wave's instances are made together: {:?}",
            names(&made)
        );
    }
    assert!(
        log.saw(condition::PROGRESSING, reason::SOAKING_WAVE),
        "Progressing=SoakingWave never shown: {:?}",
        log.all()
    );
    let gaps: Vec<u64> = made
        .windows(2)
        .map(|w| w[1].instance.created_at_ms - w[0].instance.created_at_ms)
        .collect();
    println!(
        "8 nodes rolled in waves 1 / 25% / rest with a 3 s soak in {took:?}; gaps between creates (ms): {gaps:?}"
    );
    assert_no_leak(&r).await;
    r.finish(op).await;
}

fn names(instances: &[InstanceView]) -> Vec<(String, u64, Option<u64>)> {
    instances
        .iter()
        .map(|i| {
            (
                i.instance.name.clone(),
                i.instance.created_at_ms,
                i.instance.joined_at_ms,
            )
        })
        .collect()
}

/// Waves 1 / 10 % / the rest over ten nodes with a 2 s soak, read back from
/// the rollout's timeline (Jaeger's traces of `nodewarden run`, as its
/// page draws them): the waves and soaks in order, each wave's
/// replacements within it, and the gaps between them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_shows_each_wave_and_soak_in_order() {
    use crate::support::jaeger::Jaeger;
    use nodewarden_timeline as timeline;

    let jaeger = Jaeger::start();
    let r = setup("wave-timeline", &[("workers", "Worker", 10)]).await;
    let env = &r.env;
    let operator = r.start_traced_replica(&jaeger.otlp_endpoint).await;
    patch_node_version(
        env,
        json!({"spec": {"rollout": {"maxSurge": 10, "waves": [1, "10%", "100%"], "soakTime": "2s"}}}),
    )
    .await;
    let took = roll_nodes(env, 10, "img-2", None).await;

    // The spans go out as waves end; the rollout's root at its end.
    let drawn = crate::support::wait_for(
        "the timeline with three waves",
        Duration::from_secs(60),
        || async {
            let drawn = timeline_of(&jaeger).await;
            let waves = drawn
                .marks
                .iter()
                .filter(|m| m.kind == timeline::MarkKind::Wave)
                .count();
            match (waves, drawn.rows.len()) {
                (3, 10) => crate::support::Probe::Done(drawn),
                seen => crate::support::Probe::NotYet(format!("(waves, rows) {seen:?}: {:?}", drawn.marks)),
            }
        },
    )
    .await;
    let labels: Vec<&str> = drawn.marks.iter().map(|m| m.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "wave 1",
            "soak after wave 1",
            "wave 2",
            "soak after wave 2",
            "wave 3"
        ],
        "{:?}",
        drawn.marks
    );
    let (starts, ends): (Vec<u64>, Vec<u64>) = drawn.marks.iter().map(|m| (m.start, m.end)).unzip();
    for i in 1..starts.len() {
        assert!(
            starts[i] >= ends[i - 1],
            "{} begins after {} ends",
            labels[i],
            labels[i - 1]
        );
    }
    for soak in drawn.marks.iter().filter(|m| m.kind == timeline::MarkKind::Soak) {
        assert!(
            soak.end - soak.start >= 2_000_000,
            "{} lasts the soak time",
            soak.label
        );
    }
    // Each replacement within its wave: 1, 1 and 8 of them.
    let waves: Vec<&timeline::Mark> = drawn
        .marks
        .iter()
        .filter(|m| m.kind == timeline::MarkKind::Wave)
        .collect();
    let per_wave: Vec<usize> = waves
        .iter()
        .map(|w| {
            drawn
                .rows
                .iter()
                .filter(|r| r.extent().0 >= w.start && r.extent().0 <= w.end)
                .count()
        })
        .collect();
    assert_eq!(per_wave, [1, 1, 8], "replacements started per wave");
    let gaps: Vec<String> = drawn
        .marks
        .windows(2)
        .map(|w| {
            format!(
                "{} → {}: {:.1} s",
                w[0].label,
                w[1].label,
                (w[1].start as f64 - w[0].start as f64) / 1e6
            )
        })
        .collect();
    println!("10 nodes in waves 1 / 10% / rest with a 2 s soak in {took:?}; from the timeline: {gaps:?}");
    drop(operator);
    assert_no_leak(&r).await;
    r.sim.sim.kill().await;
    r.env.cleanup().await;
}

/// The timeline of the latest rollout `jaeger` received, as
/// `nodewarden-timeline` draws it.
pub(crate) async fn timeline_of(jaeger: &crate::support::jaeger::Jaeger) -> nodewarden_timeline::Timeline {
    use nodewarden_timeline as timeline;
    use std::time::{SystemTime, UNIX_EPOCH};
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0);
    let mut answers = Vec::new();
    for operation in ["replace node", "rollout"] {
        let query = timeline::traces_query("nodewarden", operation, 0, now, 10_000);
        if let Ok(body) = crate::support::jaeger::http_get(&format!("{}{query}", jaeger.query)).await {
            answers.extend(timeline::parse_traces(&body).unwrap_or_default());
        }
    }
    timeline::build(&answers, &timeline::Options::default())
}
