//! The cluster's PodDisruptionBudgets, watched for the drains while any run.
//!
//! A drain whose eviction a budget refused is woken the moment that budget
//! allows a disruption again, instead of its backoff deciding when it
//! retries: with many drains behind the same few budgets, each freed slot
//! is used at once (20 concurrent drains took 22 × one drain on backoff
//! alone). Only the drains that budget blocks are woken. The cache also
//! names a refusing budget without a list call per round.

use std::collections::BTreeSet;

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::{Api, Client};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::runtime::reflector::{Event, Reflector, ReflectorConfig};
use crate::runtime::store::Store;

/// Budgets freed but not yet read by a drain that can be held before a slow
/// drain misses some (it then simply looks again).
const FREED_BACKLOG: usize = 256;

/// A running watch of every PodDisruptionBudget; it stops when dropped.
pub struct BudgetWatch {
    store: Store<PodDisruptionBudget>,
    freed: broadcast::Sender<String>,
    _stop: DropGuard,
}

impl BudgetWatch {
    /// Starts listing and watching the budgets of all namespaces (they are
    /// few and small, unlike pods).
    pub fn start(client: Client) -> Self {
        let api: Api<PodDisruptionBudget> = Api::all(client);
        let mut reflector = Reflector::new("pod-disruption-budgets", api, ReflectorConfig::default());
        let (freed, _) = broadcast::channel(FREED_BACKLOG);
        let tx = freed.clone();
        reflector.on_event(move |event| {
            let (old, new) = match event {
                Event::Added(new) => (None, new),
                Event::Updated { old, new } => (Some(old.as_ref()), new),
                _ => return,
            };
            if frees(old, new) {
                // No receiver: no drain is waiting; nothing to tell.
                let _ = tx.send(key(new));
            }
        });
        let store = reflector.store();
        let stop = CancellationToken::new();
        tokio::spawn(reflector.run(stop.clone()));
        BudgetWatch {
            store,
            freed,
            _stop: stop.drop_guard(),
        }
    }

    /// The budgets as last seen.
    pub fn store(&self) -> &Store<PodDisruptionBudget> {
        &self.store
    }

    /// Tells of each budget (`namespace/name`) that starts allowing a disruption.
    pub fn subscribe(&self) -> Freed {
        Freed(self.freed.subscribe())
    }
}

/// A drain's end of the budget watch.
pub struct Freed(broadcast::Receiver<String>);

impl Freed {
    /// Returns once one of `blocking` (budget keys) allows a disruption, or
    /// once news may have been missed; never if `blocking` is empty.
    pub async fn any_of(&mut self, blocking: &BTreeSet<String>) {
        if blocking.is_empty() {
            return std::future::pending().await;
        }
        loop {
            match self.0.recv().await {
                Ok(budget) if blocking.contains(&budget) => return,
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
            }
        }
    }
}

/// `namespace/name`, as drains name a refusing budget.
pub fn key(budget: &PodDisruptionBudget) -> String {
    format!(
        "{}/{}",
        budget.metadata.namespace.as_deref().unwrap_or_default(),
        budget.metadata.name.as_deref().unwrap_or_default()
    )
}

fn allowed(budget: &PodDisruptionBudget) -> i32 {
    budget
        .status
        .as_ref()
        .and_then(|s| s.disruptions_allowed)
        .unwrap_or(0)
}

/// Whether a change frees the budget: it allows more disruptions than it
/// did (a new budget: any at all).
pub fn frees(old: Option<&PodDisruptionBudget>, new: &PodDisruptionBudget) -> bool {
    allowed(new) > old.map_or(0, allowed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::policy::v1::PodDisruptionBudgetStatus;

    fn budget(allowed: Option<i32>) -> PodDisruptionBudget {
        PodDisruptionBudget {
            status: allowed.map(|a| PodDisruptionBudgetStatus {
                disruptions_allowed: Some(a),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_budget_is_freed_when_it_allows_more_than_before() {
        let table = [
            ("new, allows one", None, Some(1), true),
            ("new, allows none", None, Some(0), false),
            ("new, no status yet", None, None, false),
            ("0 → 1", Some(Some(0)), Some(1), true),
            ("no status → 1", Some(None), Some(1), true),
            ("1 → 2", Some(Some(1)), Some(2), true),
            ("1 → 1 (another field changed)", Some(Some(1)), Some(1), false),
            ("1 → 0", Some(Some(1)), Some(0), false),
        ];
        for (what, old, new, freed) in table {
            let old = old.map(budget);
            assert_eq!(frees(old.as_ref(), &budget(new)), freed, "{what}");
        }
    }

    #[tokio::test]
    async fn only_a_blocking_budget_wakes_a_drain() {
        let (tx, rx) = broadcast::channel(4);
        let mut freed = Freed(rx);
        let blocking: BTreeSet<String> = ["ns/a".to_string()].into();
        tx.send("ns/b".to_string()).expect("a receiver");
        tx.send("ns/a".to_string()).expect("a receiver");
        freed.any_of(&blocking).await;
        // "ns/b" was read and passed over: nothing is left.
        assert!(freed.0.try_recv().is_err());
        let nothing = tokio::time::timeout(
            std::time::Duration::from_millis(20),
            freed.any_of(&BTreeSet::new()),
        )
        .await;
        assert!(nothing.is_err(), "a drain blocked by no budget is not woken");
    }
}
