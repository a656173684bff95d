//! The state reads made at once, answered with one call to the cloud.
//!
//! Why: while a rollout runs at a high surge, every joining and leaving
//! instance is asked for its state now and then, each by its own reconcile.
//! One call each spends the cloud ration (and the cloud's own request
//! quota) that the creates and deletes setting the rollout's pace need.
//! A cloud that answers for many instances in one call (the simulated
//! cloud's `GET /states`; EC2's DescribeInstanceStatus takes up to 100 IDs,
//! which the aws provider does not use for this yet) gets the reads that
//! arrive while one call is under way — waiting for its ration included —
//! together in the next call. A lone read goes at once: nothing waits for a
//! batch to fill.
//!
//! Everything but `node_state` passes straight through. A provider that
//! asks one by one ([`CloudProvider::states_per_call`] of 1) is not batched.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::decorator::Decorator;
use super::{CloudError, CloudFuture, CloudProvider, InstanceState};
use crate::runtime::sync::lock;

type Answer = oneshot::Sender<Result<InstanceState, CloudError>>;

/// State reads waiting for the next call, and whether a call is under way.
#[derive(Default)]
struct Queue {
    waiting: Vec<(String, Answer)>,
    calling: bool,
}

/// Batches the state reads of `inner` (see the module docs).
pub struct BatchedStates {
    inner: Arc<dyn CloudProvider>,
    queue: Arc<Mutex<Queue>>,
}

impl BatchedStates {
    /// Batches the state reads of `inner`.
    pub fn new(inner: Arc<dyn CloudProvider>) -> Self {
        BatchedStates {
            inner,
            queue: Arc::default(),
        }
    }
}

/// Calls the cloud until no read waits: each call takes up to `per_call`
/// distinct IDs of those waiting, and answers every read of them.
async fn drain(inner: Arc<dyn CloudProvider>, queue: Arc<Mutex<Queue>>, per_call: usize) {
    loop {
        let batch = {
            let mut q = lock(&queue);
            if q.waiting.is_empty() {
                q.calling = false;
                return;
            }
            take_batch(&mut q.waiting, per_call)
        };
        let ids: Vec<String> = {
            let mut ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
            ids.dedup();
            ids
        };
        let answer = inner.node_states(&ids).await;
        for (id, reply) in batch {
            let result = match &answer {
                Ok(states) => states.get(&id).copied().ok_or_else(|| CloudError::NotFound {
                    what: format!("instance {id}"),
                }),
                Err(e) => Err(e.clone()),
            };
            // A reader that gave up no longer listens.
            let _ = reply.send(result);
        }
    }
}

/// Takes the reads of the first `per_call` distinct IDs waiting (every read
/// of each), sorted by ID; the rest keep waiting in order.
fn take_batch(waiting: &mut Vec<(String, Answer)>, per_call: usize) -> Vec<(String, Answer)> {
    let mut chosen: Vec<String> = Vec::new();
    for (id, _) in waiting.iter() {
        if !chosen.contains(id) {
            if chosen.len() == per_call {
                break;
            }
            chosen.push(id.clone());
        }
    }
    let (mut taken, kept): (Vec<_>, Vec<_>) = waiting.drain(..).partition(|(id, _)| chosen.contains(id));
    *waiting = kept;
    taken.sort_by(|a, b| a.0.cmp(&b.0));
    taken
}

impl Decorator for BatchedStates {
    fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    fn state<'a>(&'a self, provider_id: &'a str) -> CloudFuture<'a, InstanceState> {
        let per_call = self.inner.states_per_call();
        if per_call <= 1 {
            return self.inner.node_state(provider_id);
        }
        Box::pin(async move {
            let (reply, answer) = oneshot::channel();
            let start = {
                let mut q = lock(&self.queue);
                q.waiting.push((provider_id.to_string(), reply));
                !std::mem::replace(&mut q.calling, true)
            };
            if start {
                // Its own task: a reader that gives up must not stop the
                // calls the others wait for.
                tokio::spawn(drain(self.inner.clone(), self.queue.clone(), per_call));
            }
            answer
                .await
                .unwrap_or_else(|_| Err(CloudError::Transport("the state read was dropped".into())))
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::cloud::{CreateNodeRequest, CreatedNode, ScalingGroup};
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// A cloud that answers state reads in batches of `per_call` after a
    /// pause, and records each call's IDs.
    struct Recorded {
        per_call: usize,
        states: BTreeMap<String, InstanceState>,
        calls: Mutex<Vec<Vec<String>>>,
        fail: bool,
        singles: AtomicUsize,
    }

    impl Recorded {
        fn new(per_call: usize, known: &[&str]) -> Arc<Recorded> {
            Arc::new(Recorded {
                per_call,
                states: known
                    .iter()
                    .map(|id| (id.to_string(), InstanceState::Terminating))
                    .collect(),
                calls: Mutex::default(),
                fail: false,
                singles: AtomicUsize::new(0),
            })
        }

        fn calls(&self) -> Vec<Vec<String>> {
            lock(&self.calls).clone()
        }
    }

    impl CloudProvider for Recorded {
        fn name(&self) -> &str {
            "recorded"
        }
        fn create_node<'a>(&'a self, _: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
            unimplemented!("not used")
        }
        fn delete_node<'a>(&'a self, _: &'a str) -> CloudFuture<'a, ()> {
            unimplemented!("not used")
        }
        fn node_state<'a>(&'a self, id: &'a str) -> CloudFuture<'a, InstanceState> {
            self.singles.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                self.states
                    .get(id)
                    .copied()
                    .ok_or_else(|| CloudError::NotFound { what: id.to_string() })
            })
        }
        fn states_per_call(&self) -> usize {
            self.per_call
        }
        fn node_states<'a>(&'a self, ids: &'a [String]) -> CloudFuture<'a, BTreeMap<String, InstanceState>> {
            Box::pin(async move {
                assert!(ids.len() <= self.per_call, "{} IDs in one call", ids.len());
                lock(&self.calls).push(ids.to_vec());
                tokio::time::sleep(Duration::from_millis(20)).await;
                if self.fail {
                    return Err(CloudError::Throttled { retry_after: None });
                }
                Ok(ids
                    .iter()
                    .filter_map(|id| Some((id.clone(), *self.states.get(id)?)))
                    .collect())
            })
        }
        fn node_image<'a>(&'a self, _: &'a str) -> CloudFuture<'a, String> {
            unimplemented!("not used")
        }
        fn node_group<'a>(&'a self, _: &'a str) -> CloudFuture<'a, String> {
            unimplemented!("not used")
        }
        fn group_image<'a>(&'a self, _: &'a str) -> CloudFuture<'a, String> {
            unimplemented!("not used")
        }
        fn set_group_image<'a>(&'a self, _: &'a str, _: &'a str) -> CloudFuture<'a, ()> {
            unimplemented!("not used")
        }
        fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>> {
            unimplemented!("not used")
        }
    }

    /// Reads `ids` at once through `cloud`; their answers in order.
    async fn read_at_once(
        cloud: &Arc<BatchedStates>,
        ids: &[&str],
    ) -> Vec<Result<InstanceState, CloudError>> {
        let reads = ids.iter().map(|id| {
            let cloud = cloud.clone();
            let id = id.to_string();
            tokio::spawn(async move { cloud.node_state(&id).await })
        });
        let mut answers = Vec::new();
        for read in reads.collect::<Vec<_>>() {
            answers.push(read.await.expect("the read ends"));
        }
        answers
    }

    #[tokio::test]
    async fn reads_made_while_a_call_is_under_way_go_together_in_the_next() {
        let inner = Recorded::new(100, &["a", "b", "c", "d"]);
        let cloud = Arc::new(BatchedStates::new(inner.clone()));
        // A lone read goes at once...
        let first = {
            let cloud = cloud.clone();
            tokio::spawn(async move { cloud.node_state("a").await })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        // ...and those made while it is under way wait for it, then go as one.
        let answers = read_at_once(&cloud, &["c", "b", "d", "b"]).await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Ok(InstanceState::Terminating)))
        );
        assert!(matches!(
            first.await.expect("the read ends"),
            Ok(InstanceState::Terminating)
        ));
        assert_eq!(
            inner.calls(),
            vec![vec!["a"], vec!["b", "c", "d"]],
            "each ID once a call"
        );
        assert_eq!(inner.singles.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_call_takes_no_more_ids_than_the_cloud_answers_for() {
        let ids: Vec<String> = (0..7).map(|i| format!("i-{i}")).collect();
        let known: Vec<&str> = ids.iter().map(String::as_str).collect();
        let inner = Recorded::new(3, &known);
        let cloud = Arc::new(BatchedStates::new(inner.clone()));
        let answers = read_at_once(&cloud, &known).await;
        assert!(answers.iter().all(Result::is_ok));
        let calls = inner.calls();
        assert!(calls.iter().all(|c| c.len() <= 3), "{calls:?}");
        assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), 7, "{calls:?}");
    }

    #[tokio::test]
    async fn an_instance_left_out_of_the_answer_is_not_found_and_a_failed_call_fails_every_read() {
        let inner = Recorded::new(10, &["known"]);
        let cloud = Arc::new(BatchedStates::new(inner.clone()));
        let answers = read_at_once(&cloud, &["known", "unknown"]).await;
        assert!(matches!(answers[0], Ok(InstanceState::Terminating)));
        assert!(
            matches!(&answers[1], Err(e) if e.is_not_found()),
            "{:?}",
            answers[1]
        );

        let failing = Arc::new(Recorded {
            fail: true,
            ..Arc::into_inner(Recorded::new(10, &["x", "y"])).expect("one owner")
        });
        let cloud = Arc::new(BatchedStates::new(failing));
        let answers = read_at_once(&cloud, &["x", "y", "x"]).await;
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Err(CloudError::Throttled { .. }))),
            "{answers:?}"
        );
    }

    #[tokio::test]
    async fn a_provider_that_asks_one_by_one_is_not_batched() {
        let inner = Recorded::new(1, &["a", "b"]);
        let cloud = Arc::new(BatchedStates::new(inner.clone()));
        let answers = read_at_once(&cloud, &["a", "b"]).await;
        assert!(answers.iter().all(Result::is_ok));
        assert_eq!(inner.singles.load(Ordering::SeqCst), 2);
        assert!(inner.calls().is_empty());
    }

    #[tokio::test]
    async fn a_reader_that_gives_up_does_not_stop_the_others() {
        let inner = Recorded::new(10, &["a", "b"]);
        let cloud = Arc::new(BatchedStates::new(inner.clone()));
        // The first reader starts the call and gives up at once.
        let first = {
            let cloud = cloud.clone();
            tokio::spawn(async move { cloud.node_state("a").await })
        };
        tokio::task::yield_now().await;
        first.abort();
        let answers = read_at_once(&cloud, &["b"]).await;
        assert!(
            matches!(answers[0], Ok(InstanceState::Terminating)),
            "{answers:?}"
        );
    }
}
