//! Random specs, generated within and just outside the schemas, sent to the
//! real API server while the operator runs: each is either refused with a
//! message naming the field, or accepted and then reported in its status
//! (a NodeMaintenance's phase, a Plan's `Validated` condition for its
//! generation). No reconcile panics, and the controllers go on serving: a
//! valid NodeMaintenance sent afterwards still drains its node.
//!
//! The specs come from a seeded generator; the seed is printed and
//! `NODEWARDEN_SEED=<n>` replays a run.

use crate::support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::plans::{create_plan, plans, upgrade};
use crate::support::{Probe, RUN_LABEL, TestEnv, seen, wait_for};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, PostParams};
use nodewarden::api::node_maintenance::{MaintenancePhase, medik8s};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

/// Objects of each kind sent.
const OBJECTS: usize = 30;

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// A field's value: with `within`, one the schema takes (possibly still
/// wrong in a way only the controller can see: a missing node, an unknown
/// time zone, a missing Secret); else also values just outside it. None:
/// the field is left out.
fn field(
    within: bool,
    valid: Vec<Option<Value>>,
    outside: Vec<Option<Value>>,
) -> impl Strategy<Value = Option<Value>> {
    let mut options = valid;
    if !within {
        options.extend(outside);
    }
    proptest::sample::select(options)
}

fn maintenance_spec(nodes: Vec<String>, within: bool) -> impl Strategy<Value = Value> {
    let mut names: Vec<Option<Value>> = nodes.into_iter().map(|n| Some(json!(n))).collect();
    names.push(Some(json!("no-such-node")));
    (
        field(
            within,
            names,
            vec![None, Some(json!("")), Some(json!("UPPER_case!")), Some(json!(3))],
        ),
        prop_oneof![
            Just(None),
            "[a-z ]{1,40}".prop_map(|t| Some(Value::from(t))),
            "\\PC{0,40}".prop_map(|t| Some(Value::from(t))),
            Just(if within { None } else { Some(json!(17)) }),
            Just(if within {
                None
            } else {
                Some(json!("x".repeat(5000)))
            }),
        ],
        field(
            within,
            vec![
                None,
                Some(json!("30s")),
                Some(json!("1h30m")),
                Some(json!("soon")),
            ],
            vec![Some(json!("-5s")), Some(json!(0)), Some(json!(""))],
        ),
        field(
            within,
            vec![None, Some(json!("Fail")), Some(json!("DeletePods"))],
            vec![Some(json!("Explode"))],
        ),
    )
        .prop_map(|(node, reason, timeout, on_timeout)| {
            object([
                ("nodeName", node),
                ("reason", reason),
                ("drainTimeout", timeout),
                ("onDrainTimeout", on_timeout),
            ])
        })
}

fn plan_spec(within: bool) -> impl Strategy<Value = Value> {
    // No node carries this label: a Plan that validates upgrades nothing.
    let nowhere = json!({"matchLabels": {"nodewarden.test/nowhere": "true"}});
    (
        (
            field(
                within,
                vec![Some(json!("v1.2.3")), Some(json!("not a version"))],
                vec![None, Some(json!(""))],
            ),
            field(
                within,
                vec![None, Some(json!("http://127.0.0.1:1/latest"))],
                vec![Some(json!("")), Some(json!("not a url"))],
            ),
            field(
                within,
                vec![None, Some(json!(0)), Some(json!(1)), Some(json!(1_000_000))],
                vec![Some(json!(-1)), Some(json!("two"))],
            ),
            field(
                within,
                vec![Some(nowhere)],
                vec![
                    None,
                    Some(json!({})),
                    Some(json!({"matchExpressions": [{"key": "k", "operator": "Bogus"}]})),
                    Some(json!({"matchLabels": {"bad key!": "v"}})),
                ],
            ),
        ),
        (
            field(
                within,
                vec![Some(upgrade("registry.invalid/upgrade:1"))],
                vec![
                    None,
                    Some(json!({})),
                    Some(json!({"image": ""})),
                    Some(json!({"image": "x", "command": "not-a-list"})),
                ],
            ),
            field(
                within,
                vec![
                    None,
                    Some(json!({"days": ["mon", "tue"], "startTime": "01:00", "endTime": "05:00"})),
                    Some(json!({"days": ["mon"], "timeZone": "Mars/Olympus"})),
                ],
                vec![
                    Some(json!({"days": ["someday"]})),
                    Some(json!({"days": ["mon"], "startTime": "25:00"})),
                ],
            ),
            field(
                within,
                vec![None, Some(json!({"force": true}))],
                vec![Some(json!({"deleteEmptydirData": true, "deleteLocalData": true}))],
            ),
            field(
                within,
                vec![None, Some(json!("10s"))],
                vec![Some(json!("-5s")), Some(json!("soon"))],
            ),
            field(
                within,
                vec![None, Some(json!([{"name": "missing", "path": "/s"}]))],
                vec![Some(json!([{"name": "", "path": ""}]))],
            ),
        ),
    )
        .prop_map(
            |((version, channel, concurrency, selector), (up, window, drain, delay, secrets))| {
                object([
                    ("version", version),
                    ("channel", channel),
                    ("concurrency", concurrency),
                    ("nodeSelector", selector),
                    ("upgrade", up),
                    ("window", window),
                    ("drain", drain),
                    ("postCompleteDelay", delay),
                    ("secrets", secrets),
                ])
            },
        )
}

/// A JSON object of the fields that are not left out.
fn object<const N: usize>(fields: [(&str, Option<Value>); N]) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(key, value)| value.map(|v| (key.to_string(), v)))
            .collect(),
    )
}

/// What became of one object sent.
#[derive(Debug)]
enum Outcome {
    Refused(String),
    Accepted(String),
}

/// A refusal must say which field is wrong.
fn check_refusal(kind: &str, spec: &Value, message: &str) {
    assert!(
        message.contains("spec") || message.contains("metadata"),
        "{kind} {spec} was refused without naming the field: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_specs_are_refused_or_reported_and_nothing_stops_serving() {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));
    let env = TestEnv::new("random-specs").await;
    let nodes = env.create_kwok_nodes(3, &[]).await;
    let operator = env.start_operator(Default::default()).await;

    let seed = support::seed("random specs");
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );

    let maintenances: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &kube::discovery::ApiResource::erase::<medik8s::NodeMaintenance>(&()),
    );
    // Half the objects within the schemas, half reaching outside them.
    let nm_strategies = [
        maintenance_spec(nodes.clone(), true),
        maintenance_spec(nodes.clone(), false),
    ];
    let plan_strategies = [plan_spec(true), plan_spec(false)];
    let mut outcomes: Vec<(String, Value, Outcome)> = Vec::new();
    for i in 0..OBJECTS {
        let spec = nm_strategies[i % 2]
            .new_tree(&mut runner)
            .expect("a spec")
            .current();
        let name = env.name(&format!("random-{i}"));
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
            "kind": "NodeMaintenance",
            "metadata": {"name": name, "labels": {RUN_LABEL: env.id}},
            "spec": spec,
        }))
        .expect("an object");
        let outcome = match maintenances.create(&PostParams::default(), &object).await {
            Ok(_) => Outcome::Accepted(name),
            Err(kube::Error::Api(s)) => Outcome::Refused(s.message),
            Err(e) => panic!("creating a NodeMaintenance: {e}"),
        };
        outcomes.push(("NodeMaintenance".into(), spec, outcome));

        let spec = plan_strategies[i % 2]
            .new_tree(&mut runner)
            .expect("a spec")
            .current();
        let name = format!("random-{i}");
        let outcome = match create_plan(&env, &name, json!({}), spec.clone()).await {
            Ok(_) => Outcome::Accepted(name),
            Err(kube::Error::Api(s)) => Outcome::Refused(s.message),
            Err(e) => panic!("creating a Plan: {e}"),
        };
        outcomes.push(("Plan".into(), spec, outcome));
    }

    // Every accepted object is reported on: a NodeMaintenance gets a phase
    // (a Failed one says why), a Plan its Validated condition for its
    // generation (a False one says why).
    let plan_api = plans(&env, &env.namespace);
    let (mut refused, mut accepted) = (0, 0);
    for (kind, spec, outcome) in &outcomes {
        match outcome {
            Outcome::Refused(message) => {
                refused += 1;
                check_refusal(kind, spec, message);
            }
            Outcome::Accepted(name) if kind == "NodeMaintenance" => {
                accepted += 1;
                let typed: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
                wait_for(
                    &format!("NodeMaintenance {name} ({spec}) reported"),
                    Duration::from_secs(60),
                    || async {
                        match typed.get(name).await {
                            Ok(m) => match m
                                .status
                                .as_ref()
                                .and_then(|s| s.phase.map(|p| (p, s.last_error.clone())))
                            {
                                Some((MaintenancePhase::Failed, error)) => match error {
                                    Some(e) if !e.is_empty() => Probe::Done(()),
                                    _ => Probe::NotYet("Failed without saying why".into()),
                                },
                                Some(_) => Probe::Done(()),
                                None => Probe::NotYet("no phase yet".into()),
                            },
                            Err(e) => Probe::NotYet(seen(e)),
                        }
                    },
                )
                .await;
            }
            Outcome::Accepted(name) => {
                accepted += 1;
                wait_for(
                    &format!("Plan {name} ({spec}) reported"),
                    Duration::from_secs(60),
                    || async {
                        match plan_api.get(name).await {
                            Ok(p) => {
                                let generation = p.metadata.generation;
                                let validated = p.status.as_ref().and_then(|s| {
                                    s.conditions.iter().find(|c| c.type_ == "Validated").cloned()
                                });
                                match validated {
                                    Some(c)
                                        if c.observed_generation == generation
                                            && (c.status == "True" || !c.message.is_empty()) =>
                                    {
                                        Probe::Done(())
                                    }
                                    other => Probe::NotYet(format!("{other:?}")),
                                }
                            }
                            Err(e) => Probe::NotYet(seen(e)),
                        }
                    },
                )
                .await;
            }
        }
    }
    println!(
        "random specs: {refused} refused with a message naming the field, {accepted} accepted and reported"
    );

    // The controllers still serve: a valid maintenance of a fresh node drains it.
    let fresh = env.create_kwok_nodes(1, &[]).await.remove(0);
    let control: medik8s::NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": "nodemaintenance.medik8s.io/v1beta1",
        "kind": "NodeMaintenance",
        "metadata": {"name": env.name("control"), "labels": {RUN_LABEL: env.id}},
        "spec": {"nodeName": fresh, "reason": "after the random ones"},
    }))
    .expect("a maintenance");
    let typed: Api<medik8s::NodeMaintenance> = Api::all(env.client.clone());
    typed
        .create(&PostParams::default(), &control)
        .await
        .expect("creating the control maintenance");
    wait_for(
        "the control maintenance succeeds",
        Duration::from_secs(60),
        || async {
            match typed.get(&control.name_any()).await {
                Ok(m) if m.status.as_ref().and_then(|s| s.phase) == Some(MaintenancePhase::Succeeded) => {
                    Probe::Done(())
                }
                Ok(m) => Probe::NotYet(format!("{:?}", m.status.and_then(|s| s.phase))),
                Err(e) => Probe::NotYet(seen(e)),
            }
        },
    )
    .await;

    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a panic happened (see above)");
    assert!(operator.is_running(), "the operator stopped");
    assert!(
        refused > 0 && accepted > 0,
        "the generator covers both sides of the schema"
    );
    operator.stop().await;
    env.cleanup().await;
}
