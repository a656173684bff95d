//! One zone at a time: nine nodes of one group spread over three zones
//! (the sim-cloud balances new instances over them, as a cloud group does)
//! are replaced with `topologyKey: topology.kubernetes.io/zone`, a surge of
//! 3 and one node drained ahead, by `nodewarden run` sending its traces to
//! Jaeger. From a watch on the Nodes, and again from the rollout's
//! timeline: no old node of one zone is disrupted (cordoned or drained)
//! while an old node of another still is, and the zones go in order (real
//! control plane, sim-cloud).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::etcd_members::times_reaching;
use crate::rollout_waves::timeline_of;
use crate::support::jaeger::Jaeger;
use crate::support::rollout::*;
use crate::support::{Probe, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use nodewarden::api::update::NodeVersion;
use nodewarden::runtime::reflector::{Event, Reflector, ReflectorConfig};
use nodewarden_timeline::MarkKind;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const ZONE: &str = "topology.kubernetes.io/zone";

/// When an old node was first seen cordoned and when it was deleted.
#[derive(Clone, Debug, Default)]
struct Disruption {
    node: String,
    zone: String,
    cordoned: Option<Duration>,
    deleted: Option<Duration>,
}

/// Records each old node's disruption from a watch on the test's Nodes.
fn watch_disruptions(
    env: &crate::support::TestEnv,
    stop: CancellationToken,
) -> Arc<Mutex<BTreeMap<String, Disruption>>> {
    let seen: Arc<Mutex<BTreeMap<String, Disruption>>> = Arc::default();
    let config = ReflectorConfig {
        label_selector: Some(env.run_selector()),
        ..Default::default()
    };
    let mut reflector = Reflector::new("zones", Api::<Node>::all(env.client.clone()), config);
    let (record, start) = (seen.clone(), Instant::now());
    reflector.on_event(move |event: &Event<Node>| {
        let node = event.object();
        if !runs_image(node, "img-1") {
            return;
        }
        let Ok(mut seen) = record.lock() else { return };
        let entry = seen.entry(node.name_any()).or_insert_with(|| Disruption {
            node: node.name_any(),
            zone: node.labels().get(ZONE).cloned().unwrap_or_default(),
            ..Default::default()
        });
        let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        if cordoned && entry.cordoned.is_none() {
            entry.cordoned = Some(start.elapsed());
        }
        if matches!(event, Event::Deleted(_)) {
            entry.deleted = Some(start.elapsed());
        }
    });
    tokio::spawn(reflector.run(stop));
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_zones_are_replaced_one_at_a_time_in_order() {
    let zones = json!({"zones": ["zone-a", "zone-b", "zone-c"]});
    let r = setup_with("zones", &[("workers", "Worker", 9)], zones).await;
    let env = &r.env;
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let seen = watch_disruptions(env, stop.clone());
    let jaeger = Jaeger::start();
    let operator = r.start_traced_replica(&jaeger.otlp_endpoint).await;
    patch_node_version(
        env,
        json!({"spec": {"rollout": {"maxSurge": 3, "maxUnavailable": 1, "topologyKey": ZONE}}}),
    )
    .await;
    let took = roll_nodes(env, 9, "img-2", None).await;

    // This watch may see the last deletion after roll_nodes' own did.
    let seen: Vec<Disruption> = wait_for(
        "every old node's deletion watched",
        Duration::from_secs(30),
        || async {
            let seen: Vec<Disruption> = seen
                .lock()
                .map(|s| s.values().cloned().collect())
                .unwrap_or_default();
            match seen.len() == 9 && seen.iter().all(|d| d.deleted.is_some()) {
                true => Probe::Done(seen),
                false => Probe::NotYet(format!("{seen:?}")),
            }
        },
    )
    .await;
    let interval = |d: &Disruption| {
        let start = d.cordoned.or(d.deleted).unwrap_or_default();
        (start, d.deleted.unwrap_or(Duration::MAX))
    };
    for a in &seen {
        for b in seen.iter().filter(|b| b.zone != a.zone) {
            let ((a0, a1), (b0, b1)) = (interval(a), interval(b));
            assert!(
                a1 <= b0 || b1 <= a0,
                "{} and {} were disrupted at once: {seen:?}",
                a.zone,
                b.zone
            );
        }
    }
    let mut order: Vec<(Duration, &str)> = seen.iter().map(|d| (interval(d).0, d.zone.as_str())).collect();
    order.sort();
    let mut zone_order: Vec<&str> = order.iter().map(|(_, z)| *z).collect();
    zone_order.dedup();
    assert_eq!(zone_order, ["zone-a", "zone-b", "zone-c"], "{order:?}");

    // The status is written after the pass that saw the last node.
    let versions = Api::<NodeVersion>::all(env.client.clone());
    let domain = wait_for(
        "status.domain with every zone done",
        Duration::from_secs(30),
        || async {
            let nv = versions.get(&env.name("version")).await.ok();
            match nv.and_then(|nv| nv.status).and_then(|s| s.domain) {
                Some(d) if d.current.is_none() && d.done.len() == 3 => Probe::Done(d),
                other => Probe::NotYet(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(domain.key, ZONE);
    assert_eq!(domain.done, ["zone-a", "zone-b", "zone-c"]);
    let nv = env.name("version");
    assert_eq!(times_reaching(env, &nv, "RolloutDomainStarted", 3).await, 3);
    let spans: Vec<String> = order
        .iter()
        .map(|(at, zone)| format!("{zone}@{:.1}s", at.as_secs_f64()))
        .collect();
    println!("9 nodes over 3 zones rolled one zone at a time in {took:?}; disruptions began: {spans:?}");

    // The same from the timeline: each row's drain to its end, by zone.
    let zone_of: BTreeMap<String, String> = seen.iter().map(|d| (d.node.clone(), d.zone.clone())).collect();
    let drawn = wait_for(
        "the timeline with three domains",
        Duration::from_secs(60),
        || async {
            let drawn = timeline_of(&jaeger).await;
            let domains = drawn.marks.iter().filter(|m| m.kind == MarkKind::Domain).count();
            match (domains, drawn.rows.len()) {
                (3, 9) => Probe::Done(drawn),
                seen => Probe::NotYet(format!("(domains, rows) {seen:?}")),
            }
        },
    )
    .await;
    let domains: Vec<&str> = drawn
        .marks
        .iter()
        .filter(|m| m.kind == MarkKind::Domain)
        .map(|m| m.label.as_str())
        .collect();
    let want: Vec<String> = ["zone-a", "zone-b", "zone-c"]
        .iter()
        .map(|z| format!("{ZONE}={z}"))
        .collect();
    assert_eq!(domains, want);
    let drained: Vec<(&str, u64, u64)> = drawn
        .rows
        .iter()
        .map(|row| {
            let drain = row
                .phases
                .iter()
                .find(|p| p.name == "drain")
                .map_or(row.root.0, |p| p.start);
            (
                zone_of.get(&row.node).map_or("", String::as_str),
                drain,
                row.extent().1,
            )
        })
        .collect();
    for a in &drained {
        for b in drained.iter().filter(|b| b.0 != a.0) {
            assert!(
                a.2 <= b.1 || b.2 <= a.1,
                "the timeline shows {} and {} drained at once: {drained:?}",
                a.0,
                b.0
            );
        }
    }
    drop(operator);
    assert_no_leak(&r).await;
    r.sim.sim.kill().await;
    r.env.cleanup().await;
}
