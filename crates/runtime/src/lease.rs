//! One Lease implementation for everything that holds a
//! `coordination.k8s.io/v1` Lease: the leader election and the per-node
//! maintenance leases other remediation tools respect.
//!
//! - [`LeaseLock`]: get / create / update / delete of one Lease, every write
//!   conditioned on the resourceVersion just read (client-go's
//!   resourcelock/leaselock.go). [`KubeLeaseLock`] is the API server's;
//!   tests substitute an in-memory one.
//! - [`Observed`]: expiry judged on the local monotonic clock, from when
//!   this process saw the record change, never by comparing the record's
//!   timestamps with the wall clock (machines' clocks disagree).

use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams, Preconditions, WatchEvent, WatchParams};
use tokio::time::Instant;
use tracing::debug;

/// Why one attempt on the Lease failed (logged; the loop tries again).
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server refused or failed the request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// No answer in time.
    #[error("lease {lease} did not answer within {after:?}")]
    Timeout {
        /// `namespace/name` of the Lease.
        lease: String,
        /// How long we waited.
        after: Duration,
    },
    /// The record cannot be written conditionally.
    #[error("lease {lease} has no metadata.resourceVersion: it cannot be written conditionally")]
    NoResourceVersion {
        /// `namespace/name` of the Lease.
        lease: String,
    },
}

/// A Lease as read: its spec and the version a conditional write needs.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseRecord {
    /// The Lease's spec (holder, duration, times, transitions).
    pub spec: LeaseSpec,
    /// Its metadata.resourceVersion.
    pub resource_version: String,
}

/// How a conditional write ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Written {
    /// Written; the record as stored now.
    Done(LeaseRecord),
    /// Someone else wrote (or created) it first: read again.
    Conflict,
}

/// One Lease, read and written with optimistic locking.
pub trait LeaseLock: Send + Sync {
    /// `namespace/name`, for logs.
    fn describe(&self) -> String;
    /// The Lease, or None when it does not exist.
    fn get(&self) -> BoxFuture<'_, Result<Option<LeaseRecord>, LeaseError>>;
    /// Creates the Lease with `spec` (Conflict if it exists).
    fn create(&self, spec: LeaseSpec) -> BoxFuture<'_, Result<Written, LeaseError>>;
    /// Replaces the spec, if the Lease is still at `resource_version`.
    fn update<'a>(
        &'a self,
        resource_version: &'a str,
        spec: LeaseSpec,
    ) -> BoxFuture<'a, Result<Written, LeaseError>>;
    /// Deletes the Lease if it is still at `resource_version`; true when
    /// this call deleted it.
    fn delete<'a>(&'a self, resource_version: &'a str) -> BoxFuture<'a, Result<bool, LeaseError>>;
    /// Resolves once the Lease, changed after `resource_version`, names no
    /// holder or is gone — a leader handing over — or when the caller should
    /// read it again (its history expired). Never resolves otherwise: a
    /// standby waits on this and on its retry timer, whichever comes first,
    /// so a failed watch only costs the speed-up.
    fn released<'a>(&'a self, resource_version: &'a str) -> BoxFuture<'a, ()>;
}

/// A Lease on the API server.
pub struct KubeLeaseLock {
    api: Api<Lease>,
    namespace: String,
    name: String,
    /// The metadata of the Lease as last read or written. An update writes
    /// it back (labels, annotations, owner references), as client-go's
    /// LeaseLock does, so a Lease someone else made (a Helm chart's, which
    /// Helm finds by its labels and annotations) keeps what they put there.
    last: std::sync::Mutex<Option<ObjectMeta>>,
}

impl KubeLeaseLock {
    /// The Lease `name` in `namespace`.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        KubeLeaseLock {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            last: std::sync::Mutex::new(None),
        }
    }

    fn record(&self, lease: Lease) -> Result<LeaseRecord, LeaseError> {
        let resource_version = lease
            .metadata
            .resource_version
            .clone()
            .filter(|rv| !rv.is_empty())
            .ok_or_else(|| LeaseError::NoResourceVersion {
                lease: self.describe(),
            })?;
        let mut metadata = lease.metadata;
        metadata.managed_fields = None;
        *self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(metadata);
        Ok(LeaseRecord {
            spec: lease.spec.unwrap_or_default(),
            resource_version,
        })
    }

    fn lease(&self, resource_version: Option<&str>, spec: LeaseSpec) -> Lease {
        let last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        Lease {
            metadata: lease_metadata(&self.namespace, &self.name, resource_version, last),
            spec: Some(spec),
        }
    }

    fn written(&self, result: Result<Lease, kube::Error>) -> Result<Written, LeaseError> {
        match result {
            Ok(lease) => Ok(Written::Done(self.record(lease)?)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Written::Conflict),
            Err(e) => Err(e.into()),
        }
    }
}

impl LeaseLock for KubeLeaseLock {
    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn get(&self) -> BoxFuture<'_, Result<Option<LeaseRecord>, LeaseError>> {
        Box::pin(async move {
            match self.api.get_opt(&self.name).await? {
                Some(lease) => Ok(Some(self.record(lease)?)),
                None => Ok(None),
            }
        })
    }

    fn create(&self, spec: LeaseSpec) -> BoxFuture<'_, Result<Written, LeaseError>> {
        Box::pin(async move {
            let lease = self.lease(None, spec);
            self.written(self.api.create(&PostParams::default(), &lease).await)
        })
    }

    fn update<'a>(
        &'a self,
        resource_version: &'a str,
        spec: LeaseSpec,
    ) -> BoxFuture<'a, Result<Written, LeaseError>> {
        Box::pin(async move {
            // A PUT carrying the version read: 409 if anyone wrote in between.
            let lease = self.lease(Some(resource_version), spec);
            self.written(self.api.replace(&self.name, &PostParams::default(), &lease).await)
        })
    }

    fn delete<'a>(&'a self, resource_version: &'a str) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: Some(resource_version.to_owned()),
                    uid: None,
                }),
                ..DeleteParams::default()
            };
            match self.api.delete(&self.name, &params).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            }
        })
    }

    fn released<'a>(&'a self, resource_version: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // One watch of this Lease alone, from the version just read, so a
            // release between that read and this watch is not missed.
            let params = WatchParams::default()
                .fields(&format!("metadata.name={}", self.name))
                .timeout(WATCH_TIMEOUT_SECONDS);
            let events = match self.api.watch(&params, resource_version).await {
                Ok(events) => events,
                Err(err) => {
                    debug!(error = %err, lease = %self.describe(), "cannot watch the lease; polling only");
                    return std::future::pending().await;
                }
            };
            let mut events = std::pin::pin!(events);
            while let Some(event) = events.next().await {
                match event {
                    Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease)) => {
                        let held = lease
                            .spec
                            .and_then(|s| s.holder_identity)
                            .is_some_and(|h| !h.is_empty());
                        if !held {
                            return;
                        }
                    }
                    Ok(WatchEvent::Deleted(_)) => return,
                    // 410: the version read is gone from history; read again.
                    Ok(WatchEvent::Error(e)) if e.code == 410 => return,
                    Ok(WatchEvent::Bookmark(_)) => {}
                    Ok(WatchEvent::Error(e)) => {
                        debug!(error = %e.message, lease = %self.describe(), "lease watch failed; polling only");
                        break;
                    }
                    Err(err) => {
                        debug!(error = %err, lease = %self.describe(), "lease watch failed; polling only");
                        break;
                    }
                }
            }
            std::future::pending().await
        })
    }
}

/// The metadata of a write of Lease `namespace/name`: a create (no
/// `resource_version`) names the Lease alone; an update at the version last
/// read keeps that read's metadata, and at any other version (a write
/// without a read before it) names the Lease alone, as before.
fn lease_metadata(
    namespace: &str,
    name: &str,
    resource_version: Option<&str>,
    last: Option<ObjectMeta>,
) -> ObjectMeta {
    match (resource_version, last) {
        (Some(rv), Some(last)) if last.resource_version.as_deref() == Some(rv) => last,
        _ => ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            resource_version: resource_version.map(str::to_owned),
            ..ObjectMeta::default()
        },
    }
}

/// A standby's lease watch is replaced every retry period anyway; this only
/// bounds one left open by a caller that stopped polling it.
const WATCH_TIMEOUT_SECONDS: u32 = 60;

/// The record as this candidate last saw it, and when (by the local clock) it
/// last saw it change.
#[derive(Clone, Debug)]
pub struct Observed {
    /// The record's spec.
    pub spec: LeaseSpec,
    /// The record's version: a write conditioned on it fails if anyone wrote since.
    pub resource_version: String,
    /// When this observer saw the record change last (local monotonic clock).
    pub at: Instant,
}

impl Observed {
    /// Folds a fresh read into the previous observation: the expiry clock
    /// restarts only when the record changed.
    pub fn next(previous: Option<Observed>, spec: LeaseSpec, resource_version: String, now: Instant) -> Self {
        match previous {
            Some(p) if p.spec == spec && p.resource_version == resource_version => p,
            _ => Observed {
                spec,
                resource_version,
                at: now,
            },
        }
    }

    /// The holder named in the record, if any.
    pub fn holder(&self) -> Option<&str> {
        self.spec.holder_identity.as_deref().filter(|h| !h.is_empty())
    }

    /// `fallback` stands in for a missing or nonsensical leaseDurationSeconds.
    pub fn expires_at(&self, fallback: Duration) -> Instant {
        let secs = self
            .spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok());
        self.at + secs.filter(|s| *s > 0).map_or(fallback, Duration::from_secs)
    }

    /// May `identity` write itself into the lease at `now`? Yes if it is free
    /// (released), already ours, or expired by our clock.
    pub fn available_to(&self, identity: &str, fallback: Duration, now: Instant) -> bool {
        match self.holder() {
            None => true,
            Some(holder) if holder == identity => true,
            Some(_) => now >= self.expires_at(fallback),
        }
    }
}

/// The record that makes `identity` the holder, following client-go: a new
/// holder counts a transition and sets acquireTime; a renewal keeps both.
pub fn holding_spec(current: &LeaseSpec, identity: &str, lease_seconds: i32, now: Timestamp) -> LeaseSpec {
    let renewing = current.holder_identity.as_deref() == Some(identity);
    let transitions = current.lease_transitions.unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(lease_seconds),
        renew_time: Some(MicroTime(now)),
        acquire_time: match &current.acquire_time {
            Some(t) if renewing => Some(t.clone()),
            _ => Some(MicroTime(now)),
        },
        lease_transitions: Some(if renewing {
            transitions
        } else {
            transitions.saturating_add(1)
        }),
        // Keep fields we do not manage (strategy, preferredHolder).
        ..current.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_keeps_the_metadata_read_at_its_version() {
        let read = ObjectMeta {
            name: Some("nodewarden".into()),
            namespace: Some("ops".into()),
            resource_version: Some("7".into()),
            labels: Some([("app.kubernetes.io/managed-by".to_string(), "Helm".to_string())].into()),
            annotations: Some([("meta.helm.sh/release-name".to_string(), "nodewarden".to_string())].into()),
            ..ObjectMeta::default()
        };
        let kept = lease_metadata("ops", "nodewarden", Some("7"), Some(read.clone()));
        assert_eq!(
            kept, read,
            "an update at the version read writes its metadata back"
        );
        let other = lease_metadata("ops", "nodewarden", Some("8"), Some(read.clone()));
        assert_eq!(
            (other.labels, other.resource_version.as_deref()),
            (None, Some("8"))
        );
        let created = lease_metadata("ops", "nodewarden", None, Some(read));
        assert_eq!((created.labels, created.resource_version), (None, None));
    }
}
