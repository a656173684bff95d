//! A rollout in waves: `[1, "25%", "100%"]` over eight nodes with a soak of
//! 3 s replaces one node, then two, then the other five, each wave's first
//! instance made only after the wave before joined and soaked, as the
//! sim-cloud's own instance times show (real control plane, sim-cloud).

use crate::support::rollout::*;
use nodewarden::api::update::{condition, reason};
use nodewarden::cloud::sim::wire::InstanceView;
use serde_json::json;

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
