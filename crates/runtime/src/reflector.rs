//! A reflector: keeps a [`Store`] equal to the API server's view of one
//! resource type, with client-go's list-and-watch rules (as the project's
//! client-go notes describe them):
//!
//! - first a paged list at `resourceVersion=0` (served from the watch cache);
//! - then a watch from the list's resourceVersion with bookmarks and a random
//!   5–10 min timeout; a watch that ends is restarted from the last seen
//!   resourceVersion without relisting;
//! - 410 Gone → relist from the last resourceVersion, and if that is expired
//!   too, a consistent list (`resourceVersion=""`);
//! - objects missing from a relist are reported as deletions;
//! - errors back off 800 ms → 30 s with jitter, reset after 2 min healthy;
//! - a watch that delivers nothing (no event, no bookmark) for `idle_timeout`
//!   is taken for a dead connection and restarted from the last
//!   resourceVersion; list pages and watch starts are bounded by the same
//!   timeout. kube's client has no read timeout, so without this a stalled
//!   connection would leave the store stale with no error (client-go gets
//!   the same from HTTP/2 pings).
//!
//! Every object passes through a transform (by default: strip managedFields)
//! before it is stored, and every change is handed to the registered handlers
//! after the store is updated.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Resource;
use kube::api::{Api, ListParams, ObjectList, VersionMatch, WatchEvent, WatchParams};
use rand::Rng;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::backoff::{Backoff, BackoffConfig};
use super::store::{ObjectKey, Store, Writer};

/// A change the reflector applied to its store.
#[derive(Debug)]
pub enum Event<K> {
    /// A new object.
    Added(Arc<K>),
    /// A changed object, before and after.
    Updated {
        /// As stored before the change.
        old: Arc<K>,
        /// As stored now.
        new: Arc<K>,
    },
    /// The object was deleted, or vanished while the watch was disconnected
    /// (then this is its last known state).
    Deleted(Arc<K>),
}

impl<K> Event<K> {
    /// The object as it is now (for a deletion: as it was last seen).
    pub fn object(&self) -> &Arc<K> {
        match self {
            Event::Added(o) | Event::Deleted(o) => o,
            Event::Updated { new, .. } => new,
        }
    }
}

/// Called after each store change, on the reflector's task.
pub type Handler<K> = Arc<dyn Fn(&Event<K>) + Send + Sync>;
/// Applied to every object before it is stored.
pub type Transform<K> = Arc<dyn Fn(K) -> K + Send + Sync>;

/// What a reflector lists and watches, and how patiently.
#[derive(Clone, Debug)]
pub struct ReflectorConfig {
    /// Only objects with these labels.
    pub label_selector: Option<String>,
    /// Only objects with these fields.
    pub field_selector: Option<String>,
    /// Objects per list page.
    pub page_size: u32,
    /// How the first list reads (and a relist after a failure before any).
    pub first_list: FirstList,
    /// Each watch asks the server to end it after a random time in this range,
    /// so that many clients do not reconnect at once.
    pub watch_timeout: (Duration, Duration),
    /// A watch silent this long (no event, no bookmark) is restarted; also
    /// the limit for one list page or one watch start. The API server sends
    /// a bookmark about once a minute on a quiet watch, so the default
    /// restarts a healthy watch rarely, and a restart costs no relist.
    pub idle_timeout: Duration,
    /// Pauses after failed lists and watches.
    pub backoff: BackoffConfig,
    /// The resource may not be served yet (an API installed later, such as
    /// metal3's): a list answered 404 is no failure but a wait, logged once,
    /// and the list is asked again after this long. None: a 404 is a failure.
    pub absent_api: Option<Duration>,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        ReflectorConfig {
            label_selector: None,
            field_selector: None,
            page_size: 500,
            first_list: FirstList::Paged,
            watch_timeout: (Duration::from_secs(300), Duration::from_secs(600)),
            idle_timeout: Duration::from_secs(70),
            backoff: BackoffConfig::default(),
            absent_api: None,
        }
    }
}

/// How a reflector's first list reads.
///
/// client-go's first list asks for `resourceVersion=0` with a limit of 500:
/// the API server's watch cache answers at once and ignores the limit. kube's
/// client drops `resourceVersion=0` from a list with a limit, which makes it
/// a consistent read instead; the two are chosen here explicitly.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FirstList {
    /// A consistent read in pages of `page_size`: a large set (thousands of
    /// Nodes) is never decoded at once. The API server answers once its
    /// cache has caught up with etcd; on a resource that changes seldom that
    /// takes up to 0.1 s (it asks etcd for progress every 100 ms while a
    /// read waits). Paid once, at start, by a long-lived store.
    #[default]
    Paged,
    /// `resourceVersion=0`, without a limit: the watch cache answers at once,
    /// in one piece, as it answers client-go. For a small set whose reader
    /// may act on a view without the last milliseconds' writes (the cache
    /// has not heard of them yet; the watch from its resourceVersion brings
    /// them). Not for a drain: it would count a node empty too soon.
    Cached,
}

/// Where a list reads from.
#[derive(Clone, Debug, PartialEq)]
enum ListFrom {
    /// The first list: see [`FirstList`].
    First,
    /// Not older than the given version (after a 410, to keep moving forward).
    NotOlderThan(String),
    /// `resourceVersion=""`: a consistent read from etcd.
    Consistent,
}

/// Why a list or watch stopped.
#[derive(Debug)]
enum Stop {
    /// 410 Gone: the version we asked for has been compacted away.
    Gone,
    /// Any other failure: back off and try again.
    Failed,
    /// 404 on a list of an API that may be installed later: ask again after
    /// `absent_api`.
    Absent,
    Shutdown,
}

/// A running watch's events.
type WatchStream<K> = futures::stream::BoxStream<'static, Result<WatchEvent<K>, kube::Error>>;

/// How starting a watch went.
enum Started<K> {
    Watching(WatchStream<K>),
    /// Failed: back off and try again.
    Failed,
    Stop(Stop),
}

/// How a watch ended.
enum Ended {
    /// The server closed it: start another at once.
    Closed,
    /// It went silent for the idle timeout: start another at once (the
    /// store may have missed events meanwhile).
    Stalled,
    /// It broke: start another, after a pause if it broke at once.
    Failed,
    Stop(Stop),
}

/// Counters of what a reflector did, for metrics and tests.
#[derive(Debug, Default)]
pub struct ReflectorStats {
    /// Completed full lists (the first one and every relist).
    pub lists: AtomicU64,
    /// Watches started.
    pub watches: AtomicU64,
    /// 410 Gone answers (each one forces a relist).
    pub expired: AtomicU64,
    /// Failed list or watch attempts (each one backs off).
    pub failures: AtomicU64,
    /// Watches restarted because they were silent for `idle_timeout`, and
    /// lists or watch starts that did not answer within it.
    pub stalls: AtomicU64,
}

/// Keeps one store equal to the API server's view (see the module docs).
pub struct Reflector<K> {
    name: String,
    stats: Arc<ReflectorStats>,
    api: Api<K>,
    config: ReflectorConfig,
    writer: Writer<K>,
    transform: Transform<K>,
    handlers: Vec<Handler<K>>,
}

/// The default transform: managedFields are large and no controller reads them.
pub fn strip_managed_fields<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

impl<K> Reflector<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// `name` identifies the reflector in logs (e.g. "nodes").
    pub fn new(name: &str, api: Api<K>, config: ReflectorConfig) -> Self {
        Reflector {
            name: name.to_owned(),
            stats: Arc::default(),
            api,
            config,
            writer: Writer::new(),
            transform: Arc::new(strip_managed_fields::<K>),
            handlers: Vec::new(),
        }
    }

    /// Replaces the transform applied to every object before it is stored.
    pub fn with_transform(mut self, transform: impl Fn(K) -> K + Send + Sync + 'static) -> Self {
        self.transform = Arc::new(transform);
        self
    }

    /// Registers a handler called after each store change. Handlers run on the
    /// reflector's task: they must be quick (typically: enqueue keys).
    pub fn on_event(&mut self, handler: impl Fn(&Event<K>) + Send + Sync + 'static) {
        self.handlers.push(Arc::new(handler));
    }

    /// A read-only handle on the reflector's cache.
    pub fn store(&self) -> Store<K> {
        self.writer.store()
    }

    /// What the reflector did so far.
    pub fn stats(&self) -> Arc<ReflectorStats> {
        self.stats.clone()
    }

    /// Lists and watches until `shutdown` is cancelled.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut backoff = Backoff::new(self.config.backoff);
        let mut list_from = ListFrom::First;
        let mut absent = false;
        loop {
            let listed = tokio::select! {
                _ = shutdown.cancelled() => return,
                listed = self.list(&list_from) => listed,
            };
            let mut last_rv = match listed {
                Ok(rv) => {
                    if absent {
                        absent = false;
                        tracing::info!(reflector = %self.name, "the API is served now");
                    }
                    rv
                }
                Err(Stop::Absent) => {
                    if !absent {
                        absent = true;
                        tracing::info!(reflector = %self.name, retry_every = ?self.config.absent_api, "the API is not installed; asking again until it is");
                    }
                    let pause = self.config.absent_api.unwrap_or(self.config.backoff.max);
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(pause) => continue,
                    }
                }
                Err(Stop::Gone) => {
                    self.writer.mark_connected(false);
                    // What we asked for is compacted away: read the newest state.
                    tracing::info!(reflector = %self.name, "list version expired; listing consistently");
                    list_from = ListFrom::Consistent;
                    continue;
                }
                Err(_) => {
                    self.writer.mark_connected(false);
                    if self.sleep(&mut backoff, &shutdown).await.is_some() {
                        return;
                    }
                    continue;
                }
            };
            match self.watch(&mut last_rv, &mut backoff, &shutdown).await {
                Stop::Shutdown | Stop::Failed | Stop::Absent => return,
                Stop::Gone => {
                    self.writer.mark_connected(false);
                    tracing::info!(reflector = %self.name, resource_version = %last_rv, "watch expired (410); relisting");
                    list_from = ListFrom::NotOlderThan(last_rv);
                }
            }
        }
    }

    /// A paged list into the store. Returns the list's resourceVersion.
    async fn list(&self, from: &ListFrom) -> Result<String, Stop> {
        let mut params = self.list_params(from);
        let mut objects = Vec::new();
        let mut list_rv = None;
        let listing = Instant::now();
        loop {
            let page = self.list_page(&params).await?;
            if list_rv.is_none() {
                list_rv = page.metadata.resource_version.clone();
            }
            for obj in page.items {
                let obj = (self.transform)(obj);
                if let Some(key) = ObjectKey::of(&obj) {
                    objects.push((key, Arc::new(obj)));
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => {
                    // Later pages are pinned by the token, not by a version.
                    params.continue_token = Some(token);
                    params.resource_version = None;
                    params.version_match = None;
                }
                None => break,
            }
        }
        let Some(list_rv) = list_rv else {
            tracing::warn!(reflector = %self.name, "list answer without resourceVersion");
            return Err(Stop::Failed);
        };
        let count = objects.len();
        self.replace_all(objects);
        tracing::debug!(reflector = %self.name, count, resource_version = %list_rv, took = ?listing.elapsed(), "listed");
        Ok(list_rv)
    }

    /// The first page's parameters for a list from `from`.
    fn list_params(&self, from: &ListFrom) -> ListParams {
        let mut params = ListParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            limit: Some(self.config.page_size),
            ..ListParams::default()
        };
        match from {
            ListFrom::First if self.config.first_list == FirstList::Cached => {
                params.resource_version = Some("0".into());
                params.limit = None;
            }
            ListFrom::First => {}
            ListFrom::NotOlderThan(rv) => {
                params.resource_version = Some(rv.clone());
                params.version_match = Some(VersionMatch::NotOlderThan);
            }
            ListFrom::Consistent => {}
        }
        params
    }

    /// One page of a list, or why the list stops (counted).
    async fn list_page(&self, params: &ListParams) -> Result<ObjectList<K>, Stop> {
        match tokio::time::timeout(self.config.idle_timeout, self.api.list(params)).await {
            Err(_) => {
                self.stats.stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reflector = %self.name, after = ?self.config.idle_timeout, "list did not answer");
                Err(Stop::Failed)
            }
            Ok(Ok(page)) => Ok(page),
            Ok(Err(e)) if is_gone(&e) => {
                self.stats.expired.fetch_add(1, Ordering::Relaxed);
                Err(Stop::Gone)
            }
            Ok(Err(kube::Error::Api(status))) if status.code == 404 && self.config.absent_api.is_some() => {
                Err(Stop::Absent)
            }
            Ok(Err(e)) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reflector = %self.name, error = %e, "list failed");
                Err(Stop::Failed)
            }
        }
    }

    /// Replaces the store's contents with a whole list, emitting what
    /// changed since the last one, and marks the store synced.
    fn replace_all(&self, objects: Vec<(ObjectKey, Arc<K>)>) {
        let changed = self.writer.replace(objects);
        for obj in changed.deleted {
            self.emit(&Event::Deleted(obj));
        }
        for obj in changed.added {
            self.emit(&Event::Added(obj));
        }
        for (old, new) in changed.updated {
            if old.meta().resource_version != new.meta().resource_version {
                self.emit(&Event::Updated { old, new });
            }
        }
        self.writer.mark_synced();
        self.stats.lists.fetch_add(1, Ordering::Relaxed);
    }

    /// Watches from `last_rv`, re-watching when a watch ends, until a 410 or
    /// shutdown. Keeps `last_rv` at the newest version seen.
    async fn watch(&self, last_rv: &mut String, backoff: &mut Backoff, shutdown: &CancellationToken) -> Stop {
        loop {
            let started = Instant::now();
            let ended = match self.start_watch(last_rv, shutdown).await {
                Started::Watching(stream) => {
                    self.writer.mark_connected(true);
                    self.follow(stream, last_rv, shutdown).await
                }
                Started::Stop(stop) => return stop,
                Started::Failed => Ended::Failed,
            };
            if matches!(ended, Ended::Failed | Ended::Stalled) {
                self.writer.mark_connected(false);
            }
            match ended {
                Ended::Stop(stop) => return stop,
                Ended::Closed | Ended::Stalled => {}
                // A watch that failed right away backs off so a broken
                // server is not hammered; one that ended is restarted at once.
                Ended::Failed => {
                    if started.elapsed() < Duration::from_secs(1)
                        && let Some(stop) = self.sleep(backoff, shutdown).await
                    {
                        return stop;
                    }
                }
            }
        }
    }

    /// Starts one watch from `last_rv`, bounded by the idle timeout.
    async fn start_watch(&self, last_rv: &str, shutdown: &CancellationToken) -> Started<K> {
        let (lo, hi) = self.config.watch_timeout;
        let timeout = rand::rng().random_range(lo.as_secs()..=hi.as_secs().max(lo.as_secs()));
        let params = WatchParams {
            label_selector: self.config.label_selector.clone(),
            field_selector: self.config.field_selector.clone(),
            timeout: Some(u32::try_from(timeout).unwrap_or(u32::MAX)),
            bookmarks: true,
            ..WatchParams::default()
        };
        let idle = self.config.idle_timeout;
        let answer = tokio::select! {
            _ = shutdown.cancelled() => return Started::Stop(Stop::Shutdown),
            s = tokio::time::timeout(idle, self.api.watch(&params, last_rv)) => s,
        };
        match answer {
            Ok(Ok(stream)) => {
                self.stats.watches.fetch_add(1, Ordering::Relaxed);
                Started::Watching(stream.boxed())
            }
            Ok(Err(e)) if is_gone(&e) => {
                self.stats.expired.fetch_add(1, Ordering::Relaxed);
                Started::Stop(Stop::Gone)
            }
            Ok(Err(e)) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reflector = %self.name, error = %e, "watch failed to start");
                Started::Failed
            }
            Err(_) => {
                self.stats.stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reflector = %self.name, after = ?idle, "watch did not start; retrying");
                Started::Failed
            }
        }
    }

    /// Applies a watch's events until it ends, fails, goes silent for the
    /// idle timeout, or says 410.
    async fn follow(
        &self,
        mut stream: WatchStream<K>,
        last_rv: &mut String,
        shutdown: &CancellationToken,
    ) -> Ended {
        let idle = self.config.idle_timeout;
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => return Ended::Stop(Stop::Shutdown),
                next = tokio::time::timeout(idle, stream.next()) => next,
            };
            let Ok(next) = next else {
                // Silent for too long: the connection is presumed dead.
                // Restart from the last version (no relist, no backoff).
                self.stats.stalls.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reflector = %self.name, after = ?idle, resource_version = %last_rv, "watch silent; restarting it");
                return Ended::Stalled;
            };
            match next {
                None => return Ended::Closed,
                Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    self.apply(obj, last_rv, false)
                }
                Some(Ok(WatchEvent::Deleted(obj))) => self.apply(obj, last_rv, true),
                Some(Ok(WatchEvent::Bookmark(b))) => *last_rv = b.metadata.resource_version,
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => {
                    self.stats.expired.fetch_add(1, Ordering::Relaxed);
                    return Ended::Stop(Stop::Gone);
                }
                Some(Ok(WatchEvent::Error(status))) => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(reflector = %self.name, code = status.code, message = %status.message, "watch error");
                    return Ended::Failed;
                }
                Some(Err(e)) => {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(reflector = %self.name, error = %e, "watch stream broke");
                    return Ended::Failed;
                }
            }
        }
    }

    /// Backs off; Some(Shutdown) when cancelled meanwhile.
    async fn sleep(&self, backoff: &mut Backoff, shutdown: &CancellationToken) -> Option<Stop> {
        let delay = backoff.next_delay(Instant::now());
        tokio::select! {
            _ = shutdown.cancelled() => Some(Stop::Shutdown),
            _ = tokio::time::sleep(delay) => None,
        }
    }

    fn apply(&self, obj: K, last_rv: &mut String, deleted: bool) {
        if let Some(rv) = &obj.meta().resource_version {
            last_rv.clone_from(rv);
        }
        let obj = (self.transform)(obj);
        let Some(key) = ObjectKey::of(&obj) else {
            return;
        };
        if deleted {
            let last = self.writer.remove(&key).unwrap_or_else(|| Arc::new(obj));
            self.emit(&Event::Deleted(last));
        } else {
            let obj = Arc::new(obj);
            match self.writer.insert(key, obj.clone()) {
                Some(old) => self.emit(&Event::Updated { old, new: obj }),
                None => self.emit(&Event::Added(obj)),
            }
        }
    }

    fn emit(&self, event: &Event<K>) {
        for handler in &self.handlers {
            handler(event);
        }
    }
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 410)
}
