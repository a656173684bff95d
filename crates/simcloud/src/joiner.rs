//! Turns due instances into Nodes: sleeps until the next join is due (or the
//! state changes), creates the Nodes, records each join. After a restart the
//! first pass picks up every join whose time passed while the sim was down.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::model::now;
use crate::nodes;
use crate::store::SimStore;

/// How long to wait before trying again after a Node could not be created.
const RETRY: Duration = Duration::from_secs(1);
/// How long to sleep with nothing pending (a change wakes it earlier).
const IDLE: Duration = Duration::from_secs(3600);

/// Creates due Nodes until `shutdown` is cancelled.
pub async fn run(sim: Arc<SimStore>, client: Client, shutdown: CancellationToken) {
    loop {
        let due = {
            let at = now();
            sim.read(|c| c.due_joins(at)).await
        };
        let mut failed = false;
        for job in due {
            if let Err(e) = nodes::create(&client, &job).await {
                tracing::warn!(instance = job.instance, error = %e, "creating the Node failed; will retry");
                failed = true;
                continue;
            }
            let at = now();
            match sim
                .mutate(|c| {
                    c.mark_joined(&job.instance, at);
                    Ok(())
                })
                .await
            {
                Ok(()) => tracing::info!(
                    instance = job.instance,
                    group = job.group,
                    "instance joined: Node created"
                ),
                Err(e) => {
                    tracing::warn!(instance = job.instance, error = %e, "recording the join failed; will retry");
                    failed = true;
                }
            }
        }
        let next = sim.read(|c| c.next_join_at()).await;
        let mut wait = next.map_or(IDLE, |at| Duration::from_millis(at.saturating_sub(now())));
        if failed {
            wait = wait.max(RETRY);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = sim.changed() => {}
        }
    }
}
