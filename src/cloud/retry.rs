//! Transient failures of cloud reads retried in place, as cloud SDKs do (three
//! attempts, like AWS's standard retry mode).
//!
//! Why: a reconcile may read the cloud a dozen times (a node's group and
//! image, a group's image). When each read fails now and then, a reconcile
//! that starts over on the first failure almost never finishes: at a 20%
//! failure rate, 30 reads all succeed once in a thousand tries, and the
//! workqueue's backoff grows in the meantime.
//!
//! Only reads are retried here. A change (create, delete, set an image) goes
//! back to the reconcile, which checks leadership before every change: a
//! retry loop down here could repeat a change after the lease was lost.
//! Throttling waits are honoured one layer down, by
//! [`super::metered::MeteredCloud`]'s shared pause, so this layer wraps it.

use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

use super::decorator::{CloudOperation, Decorator};
use super::{CloudFuture, CloudProvider};

/// How often and how patiently a read is tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts: usize,
    /// The delay after the first failure (before jitter); it doubles.
    pub first_delay: Duration,
    /// The longest delay (before jitter).
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 3,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        }
    }
}

/// Retries the reads of `inner` (see the module docs).
pub struct RetryingCloud {
    inner: Arc<dyn CloudProvider>,
    policy: RetryPolicy,
}

impl RetryingCloud {
    /// Retries the reads of `inner` by `policy`.
    pub fn new(inner: Arc<dyn CloudProvider>, policy: RetryPolicy) -> Self {
        RetryingCloud { inner, policy }
    }

    fn read<'a, T: Send + 'a>(
        &'a self,
        call: impl Fn() -> CloudFuture<'a, T> + Send + 'a,
    ) -> CloudFuture<'a, T> {
        Box::pin(async move {
            let mut delays = ExponentialBuilder::default()
                .with_min_delay(self.policy.first_delay)
                .with_max_delay(self.policy.max_delay)
                .with_factor(2.0)
                .with_jitter()
                .with_max_times(self.policy.attempts.saturating_sub(1))
                .build();
            loop {
                match call().await {
                    Err(e) if e.retryable() => match delays.next() {
                        Some(delay) => {
                            tracing::debug!(error = %e, ?delay, "cloud read failed; trying again");
                            tokio::time::sleep(delay).await;
                        }
                        None => return Err(e),
                    },
                    done => return done,
                }
            }
        })
    }
}

/// Whether a call only reads: only those are retried here.
fn is_read(operation: CloudOperation) -> bool {
    match operation {
        CloudOperation::NodeState
        | CloudOperation::NodeStates
        | CloudOperation::NodeImage
        | CloudOperation::NodeGroup
        | CloudOperation::GroupImage
        | CloudOperation::ListGroups => true,
        CloudOperation::CreateNode | CloudOperation::DeleteNode | CloudOperation::SetGroupImage => false,
    }
}

impl Decorator for RetryingCloud {
    fn inner(&self) -> &Arc<dyn CloudProvider> {
        &self.inner
    }

    fn around<'a, T: Send + 'a>(
        &'a self,
        operation: CloudOperation,
        call: impl Fn() -> CloudFuture<'a, T> + Send + 'a,
    ) -> CloudFuture<'a, T> {
        if is_read(operation) {
            self.read(call)
        } else {
            call()
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cloud::{CreateNodeRequest, CreatedNode, InstanceState, ScalingGroup};
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::cloud::CloudError;

    /// A cloud whose answers are scripted, one per call, counting calls.
    #[derive(Default)]
    struct Scripted {
        answers: Mutex<VecDeque<Result<(), CloudError>>>,
        calls: AtomicUsize,
    }

    impl Scripted {
        fn with(answers: Vec<Result<(), CloudError>>) -> Arc<Self> {
            Arc::new(Scripted {
                answers: Mutex::new(answers.into()),
                calls: AtomicUsize::new(0),
            })
        }

        fn answer(&self) -> Result<(), CloudError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.answers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front()
                .unwrap_or(Ok(()))
        }
    }

    impl CloudProvider for Scripted {
        fn name(&self) -> &str {
            "scripted"
        }
        fn create_node<'a>(&'a self, _: &'a CreateNodeRequest) -> CloudFuture<'a, CreatedNode> {
            Box::pin(async move {
                self.answer().map(|()| CreatedNode {
                    node_name: "n".into(),
                    provider_id: "p".into(),
                    image: None,
                })
            })
        }
        fn delete_node<'a>(&'a self, _: &'a str) -> CloudFuture<'a, ()> {
            Box::pin(async move { self.answer() })
        }
        fn node_state<'a>(&'a self, _: &'a str) -> CloudFuture<'a, InstanceState> {
            Box::pin(async move { self.answer().map(|()| InstanceState::Ready) })
        }
        fn node_image<'a>(&'a self, _: &'a str) -> CloudFuture<'a, String> {
            Box::pin(async move { self.answer().map(|()| "img".into()) })
        }
        fn node_group<'a>(&'a self, _: &'a str) -> CloudFuture<'a, String> {
            Box::pin(async move { self.answer().map(|()| "g".into()) })
        }
        fn group_image<'a>(&'a self, _: &'a str) -> CloudFuture<'a, String> {
            Box::pin(async move { self.answer().map(|()| "img".into()) })
        }
        fn set_group_image<'a>(&'a self, _: &'a str, _: &'a str) -> CloudFuture<'a, ()> {
            Box::pin(async move { self.answer() })
        }
        fn list_groups(&self) -> CloudFuture<'_, Vec<ScalingGroup>> {
            Box::pin(async move { self.answer().map(|()| Vec::new()) })
        }
    }

    fn server_error() -> CloudError {
        CloudError::Server {
            status: 500,
            message: "boom".into(),
        }
    }

    fn throttled() -> CloudError {
        CloudError::Throttled {
            retry_after: Some(Duration::from_secs(1)),
        }
    }

    fn not_found() -> CloudError {
        CloudError::NotFound { what: "i".into() }
    }

    #[derive(Clone, Copy, Debug)]
    enum Call {
        Read,
        Delete,
        Create,
        SetImage,
    }

    async fn call(cloud: &RetryingCloud, which: Call) -> Result<(), CloudError> {
        match which {
            Call::Read => cloud.node_image("p").await.map(drop),
            Call::Delete => cloud.delete_node("p").await,
            Call::Create => cloud
                .create_node(&CreateNodeRequest::new("g").with_request_id("k"))
                .await
                .map(drop),
            Call::SetImage => cloud.set_group_image("g", "img").await,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn reads_are_retried_while_transient_and_changes_never() {
        type Case = (Call, Vec<Result<(), CloudError>>, usize, bool);
        // (call, scripted answers, attempts expected, succeeds)
        let cases: Vec<Case> = vec![
            (Call::Read, vec![Ok(())], 1, true),
            (Call::Read, vec![Err(server_error()), Ok(())], 2, true),
            (
                Call::Read,
                vec![Err(throttled()), Err(server_error()), Ok(())],
                3,
                true,
            ),
            // Three attempts in all, then the error goes to the reconcile.
            (
                Call::Read,
                vec![Err(server_error()), Err(server_error()), Err(server_error())],
                3,
                false,
            ),
            // An answer is an answer: not found is not asked again.
            (Call::Read, vec![Err(not_found())], 1, false),
            (Call::Delete, vec![Err(server_error())], 1, false),
            (Call::Create, vec![Err(throttled())], 1, false),
            (Call::SetImage, vec![Err(server_error())], 1, false),
        ];
        for (which, answers, attempts, succeeds) in cases {
            let scripted = Scripted::with(answers);
            let cloud = RetryingCloud::new(scripted.clone(), RetryPolicy::default());
            let result = call(&cloud, which).await;
            assert_eq!(
                (scripted.calls.load(Ordering::SeqCst), result.is_ok()),
                (attempts, succeeds),
                "{which:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_waits_between_reads_stay_within_the_policy() {
        let scripted = Scripted::with(vec![
            Err(server_error()),
            Err(server_error()),
            Err(server_error()),
        ]);
        let policy = RetryPolicy::default();
        let cloud = RetryingCloud::new(scripted, policy);
        let start = tokio::time::Instant::now();
        assert!(cloud.group_image("g").await.is_err());
        let waited = start.elapsed();
        // Two waits: 100 ms and 200 ms, each with up to 100% jitter.
        assert!(
            waited >= Duration::from_millis(300) && waited <= Duration::from_millis(600),
            "{waited:?}"
        );
    }
}
