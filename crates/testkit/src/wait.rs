//! Waiting for the cluster to reach a state: a probe polled until done, with
//! what it last saw reported on timeout.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// What a probe saw: done with a value, or not yet, with a description of
/// what it saw (reported if the wait times out).
pub enum Probe<T> {
    Done(T),
    NotYet(String),
}

/// Polls `probe` until it is done or `timeout` passes; on timeout panics with
/// `what` and the last thing the probe saw.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Probe<T>>,
{
    let start = Instant::now();
    loop {
        let last = match probe().await {
            Probe::Done(value) => return value,
            Probe::NotYet(seen) => seen,
        };
        if start.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A probe result from a Kubernetes call: API errors count as "not yet" and
/// are reported as what was seen.
pub fn seen<E: Debug>(err: E) -> String {
    format!("error: {err:?}")
}

/// Waits until the object `name` has a condition `type_` with `status` and
/// `reason` in `.status.conditions`; returns its message.
pub async fn wait_for_condition<K>(
    api: &kube::Api<K>,
    name: &str,
    (type_, status, reason): (&str, &str, &str),
    timeout: Duration,
) -> String
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + Debug,
{
    wait_for(&format!("{name} {type_}={status} {reason}"), timeout, || async {
        let object = match api.get(name).await {
            Ok(o) => serde_json::to_value(o).unwrap_or_default(),
            Err(e) => return Probe::NotYet(seen(e)),
        };
        // A NodeVersion keeps nodewarden's conditions beside Constellation's one.
        let conditions: Vec<serde_json::Value> = ["conditions", "rolloutConditions"]
            .iter()
            .flat_map(|list| object["status"][list].as_array().cloned().unwrap_or_default())
            .collect();
        match conditions.iter().find(|c| c["type"] == type_) {
            Some(c) if c["status"] == status && c["reason"] == reason => {
                Probe::Done(c["message"].as_str().unwrap_or_default().to_string())
            }
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await
}
