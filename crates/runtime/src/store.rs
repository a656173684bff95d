//! A thread-safe object cache with named indexes, fed by a reflector.
//!
//! Objects are stored as `Arc<K>` and never mutated in place: readers get a
//! cheap shared handle and a writer replaces the whole object. Each named index
//! maps an index value to the set of object keys having it (an inverted index),
//! kept in step on every add, update and delete; empty sets are removed.
//!
//! The cache has two faces (kube-runtime's `Writer`/`Store`): a [`Writer`]
//! that only its reflector holds, and any number of read-only [`Store`]s for
//! controllers, so nothing but the watch can change what a controller sees.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube::Resource;
use tokio::sync::watch;

/// `namespace/name` (or just `name` for cluster-scoped objects).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// The object's namespace; None for a cluster-scoped object.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// The key of `name` in `namespace` (None: cluster-scoped).
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjectKey {
            namespace: namespace.map(str::to_owned),
            name: name.to_owned(),
        }
    }

    /// The key of the cluster-scoped object `name`.
    pub fn cluster(name: &str) -> Self {
        ObjectKey::new(None, name)
    }

    /// The key of an object; None for an object without a name (never stored).
    pub fn of<K: Resource>(obj: &K) -> Option<Self> {
        let meta = obj.meta();
        Some(ObjectKey {
            namespace: meta.namespace.clone(),
            name: meta.name.clone()?,
        })
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{ns}/{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The key of an object of kind `K`: a mapper that returns keys for a
/// controller of `K` cannot hand it a key of another kind.
pub struct Key<K> {
    key: ObjectKey,
    kind: PhantomData<fn() -> K>,
}

impl<K> Key<K> {
    /// The key of `namespace/name` (or `name` when cluster-scoped).
    pub fn new(namespace: Option<&str>, name: &str) -> Self {
        ObjectKey::new(namespace, name).into()
    }

    /// The key of a cluster-scoped object.
    pub fn cluster(name: &str) -> Self {
        ObjectKey::cluster(name).into()
    }

    /// The untyped key, for stores and logs.
    pub fn untyped(&self) -> &ObjectKey {
        &self.key
    }
}

impl<K: Resource> Key<K> {
    /// The key of an object; None for an object without a name.
    pub fn of(obj: &K) -> Option<Self> {
        ObjectKey::of(obj).map(Into::into)
    }
}

impl<K> From<ObjectKey> for Key<K> {
    fn from(key: ObjectKey) -> Self {
        Key {
            key,
            kind: PhantomData,
        }
    }
}

impl<K> std::ops::Deref for Key<K> {
    type Target = ObjectKey;
    fn deref(&self) -> &ObjectKey {
        &self.key
    }
}

impl<K> Clone for Key<K> {
    fn clone(&self) -> Self {
        self.key.clone().into()
    }
}

impl<K> PartialEq for Key<K> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl<K> Eq for Key<K> {}

impl<K> Hash for Key<K> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

impl<K> PartialOrd for Key<K> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<K> Ord for Key<K> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

impl<K> fmt::Debug for Key<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.key, f)
    }
}

impl<K> fmt::Display for Key<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.key, f)
    }
}

/// An index function: the index values of an object (none, one or many).
pub type IndexFn<K> = Arc<dyn Fn(&K) -> Vec<String> + Send + Sync>;

struct Index<K> {
    func: IndexFn<K>,
    values: HashMap<String, HashSet<ObjectKey>>,
}

struct Inner<K> {
    objects: HashMap<ObjectKey, Arc<K>>,
    indexes: HashMap<&'static str, Index<K>>,
}

/// The read side of the cache. Cheap to clone: clones share the same objects.
pub struct Store<K> {
    inner: Arc<RwLock<Inner<K>>>,
    synced: watch::Sender<Freshness>,
}

/// How current a store is: listed once, and whether its reflector is
/// connected now (a watch running, or a list just stored). A store whose
/// reflector lost its connection keeps its objects but may be behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Freshness {
    listed: bool,
    connected: bool,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store {
            inner: self.inner.clone(),
            synced: self.synced.clone(),
        }
    }
}

/// An empty store that no reflector feeds (for tests of pure code).
impl<K> Default for Store<K> {
    fn default() -> Self {
        Self::empty()
    }
}

/// The write side of the cache: held by the one reflector that feeds it.
pub struct Writer<K> {
    store: Store<K>,
}

impl<K> Default for Writer<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> Store<K> {
    fn empty() -> Self {
        Store {
            inner: Arc::new(RwLock::new(Inner {
                objects: HashMap::new(),
                indexes: HashMap::new(),
            })),
            synced: watch::Sender::new(Freshness::default()),
        }
    }

    /// A poisoned lock only means a panic happened elsewhere while holding it;
    /// every write below leaves the maps consistent before it can panic.
    fn read(&self) -> RwLockReadGuard<'_, Inner<K>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner<K>> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a named index; existing objects are indexed at once.
    pub fn add_index(&self, name: &'static str, func: impl Fn(&K) -> Vec<String> + Send + Sync + 'static) {
        let func: IndexFn<K> = Arc::new(func);
        let mut inner = self.write();
        let mut values: HashMap<String, HashSet<ObjectKey>> = HashMap::new();
        for (key, obj) in &inner.objects {
            for value in func(obj) {
                values.entry(value).or_default().insert(key.clone());
            }
        }
        inner.indexes.insert(name, Index { func, values });
    }

    /// The object stored under `key`, if any.
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<K>> {
        self.read().objects.get(key).cloned()
    }

    /// Every stored object, in no particular order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.read().objects.values().cloned().collect()
    }

    /// The keys of every stored object.
    pub fn keys(&self) -> Vec<Key<K>> {
        self.read().objects.keys().cloned().map(Key::from).collect()
    }

    /// The number of stored objects.
    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The objects whose index `index` has `value` (empty for an unknown index).
    pub fn by_index(&self, index: &str, value: &str) -> Vec<Arc<K>> {
        let inner = self.read();
        let Some(idx) = inner.indexes.get(index) else {
            return Vec::new();
        };
        idx.values
            .get(value)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| inner.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The keys whose index `index` has `value`.
    pub fn keys_by_index(&self, index: &str, value: &str) -> Vec<Key<K>> {
        let inner = self.read();
        inner
            .indexes
            .get(index)
            .and_then(|idx| idx.values.get(value))
            .map(|keys| keys.iter().cloned().map(Key::from).collect())
            .unwrap_or_default()
    }

    /// The values present in index `index`.
    pub fn index_values(&self, index: &str) -> Vec<String> {
        let inner = self.read();
        inner
            .indexes
            .get(index)
            .map(|idx| idx.values.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// True once the first full list has been stored.
    pub fn is_synced(&self) -> bool {
        self.synced.borrow().listed
    }

    /// Resolves once the first full list has been stored.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        // Err only when the sender is gone, which cannot happen while `self` lives.
        let _ = rx.wait_for(|f| f.listed).await;
    }

    /// True when listed and its reflector is connected now: the cache is as
    /// current as a watch makes it.
    pub fn is_current(&self) -> bool {
        let f = *self.synced.borrow();
        f.listed && f.connected
    }

    /// Resolves once the store is listed and its reflector connected.
    pub async fn wait_current(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|f| f.listed && f.connected).await;
    }
}

/// The writer reads what it wrote, like any store.
impl<K> std::ops::Deref for Writer<K> {
    type Target = Store<K>;
    fn deref(&self) -> &Store<K> {
        &self.store
    }
}

impl<K> Writer<K> {
    /// An empty cache, not yet synced.
    pub fn new() -> Self {
        Writer {
            store: Store::empty(),
        }
    }

    /// A read-only handle for controllers.
    pub fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// Inserts or replaces an object; returns the previous one.
    pub fn insert(&self, key: ObjectKey, obj: Arc<K>) -> Option<Arc<K>> {
        let mut inner = self.store.write();
        let Inner { objects, indexes } = &mut *inner;
        let old = objects.insert(key.clone(), obj.clone());
        for idx in indexes.values_mut() {
            if let Some(old) = &old {
                unindex(idx, &key, old);
            }
            for value in (idx.func)(&obj) {
                idx.values.entry(value).or_default().insert(key.clone());
            }
        }
        old
    }

    /// Removes an object; returns it if it was there.
    pub fn remove(&self, key: &ObjectKey) -> Option<Arc<K>> {
        let mut inner = self.store.write();
        let Inner { objects, indexes } = &mut *inner;
        let old = objects.remove(key)?;
        for idx in indexes.values_mut() {
            unindex(idx, key, &old);
        }
        Some(old)
    }

    /// Replaces the whole content with `objects` (a fresh list). Returns, for
    /// each object, what changed: the caller turns these into events, and in
    /// particular reports objects that vanished as deletions.
    pub fn replace(&self, objects: Vec<(ObjectKey, Arc<K>)>) -> Replaced<K> {
        let mut fresh: HashMap<ObjectKey, Arc<K>> = HashMap::with_capacity(objects.len());
        for (key, obj) in objects {
            fresh.insert(key, obj);
        }
        let mut inner = self.store.write();
        let mut out = Replaced {
            added: Vec::new(),
            updated: Vec::new(),
            deleted: Vec::new(),
        };
        let old_objects = std::mem::take(&mut inner.objects);
        for (key, old) in &old_objects {
            if !fresh.contains_key(key) {
                out.deleted.push(old.clone());
            }
        }
        for (key, obj) in &fresh {
            match old_objects.get(key) {
                Some(old) => out.updated.push((old.clone(), obj.clone())),
                None => out.added.push(obj.clone()),
            }
        }
        for idx in inner.indexes.values_mut() {
            idx.values.clear();
            for (key, obj) in &fresh {
                for value in (idx.func)(obj) {
                    idx.values.entry(value).or_default().insert(key.clone());
                }
            }
        }
        inner.objects = fresh;
        out
    }

    /// Marks a full list as stored (wakes [`Store::wait_synced`]): the store
    /// is current as of that list.
    pub fn mark_synced(&self) {
        self.store.synced.send_replace(Freshness {
            listed: true,
            connected: true,
        });
    }

    /// Records whether the reflector is connected (a watch running) or lost
    /// its connection (the store may fall behind until it is back).
    pub fn mark_connected(&self, connected: bool) {
        self.store.synced.send_if_modified(|f| {
            let changed = f.connected != connected;
            f.connected = connected;
            changed
        });
    }
}

fn unindex<K>(idx: &mut Index<K>, key: &ObjectKey, obj: &K) {
    for value in (idx.func)(obj) {
        if let Some(keys) = idx.values.get_mut(&value) {
            keys.remove(key);
            if keys.is_empty() {
                idx.values.remove(&value);
            }
        }
    }
}

/// What a `replace` changed.
pub struct Replaced<K> {
    /// Objects in the fresh list that were not stored.
    pub added: Vec<Arc<K>>,
    /// (old, new) for objects present before and after.
    pub updated: Vec<(Arc<K>, Arc<K>)>,
    /// Objects that were stored but are missing from the fresh list.
    pub deleted: Vec<Arc<K>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use std::collections::BTreeMap;

    fn cm(ns: &str, name: &str, color: &str) -> (ObjectKey, Arc<ConfigMap>) {
        let mut obj = ConfigMap::default();
        obj.metadata.namespace = Some(ns.into());
        obj.metadata.name = Some(name.into());
        obj.metadata.labels = Some(BTreeMap::from([("color".to_string(), color.to_string())]));
        (ObjectKey::new(Some(ns), name), Arc::new(obj))
    }

    fn color_index(store: &Writer<ConfigMap>) {
        store.add_index("color", |c: &ConfigMap| {
            c.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("color").cloned())
                .into_iter()
                .collect()
        });
    }

    fn names(objs: &[Arc<ConfigMap>]) -> Vec<String> {
        let mut v: Vec<String> = objs.iter().filter_map(|o| o.metadata.name.clone()).collect();
        v.sort();
        v
    }

    #[test]
    fn index_follows_add_update_delete() {
        let store = Writer::new();
        color_index(&store);
        let (ka, a) = cm("ns", "a", "red");
        let (kb, b) = cm("ns", "b", "red");
        store.insert(ka.clone(), a);
        store.insert(kb.clone(), b);
        assert_eq!(names(&store.by_index("color", "red")), ["a", "b"]);

        // An update moves the key from the old value to the new one.
        let (_, a_blue) = cm("ns", "a", "blue");
        store.insert(ka.clone(), a_blue);
        assert_eq!(names(&store.by_index("color", "red")), ["b"]);
        assert_eq!(names(&store.by_index("color", "blue")), ["a"]);

        // A delete removes it, and an emptied value disappears altogether.
        store.remove(&kb);
        assert!(store.by_index("color", "red").is_empty());
        assert_eq!(store.index_values("color"), ["blue"]);
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn index_added_late_covers_existing_objects() {
        let store = Writer::new();
        let (k, a) = cm("ns", "a", "green");
        store.insert(k, a);
        color_index(&store);
        assert_eq!(names(&store.by_index("color", "green")), ["a"]);
        assert!(store.by_index("unknown", "green").is_empty());
    }

    #[test]
    fn replace_reports_vanished_objects_as_deleted() {
        let store = Writer::new();
        color_index(&store);
        for (k, o) in [
            cm("ns", "a", "red"),
            cm("ns", "b", "red"),
            cm("other", "a", "red"),
        ] {
            store.insert(k, o);
        }
        let changed = store.replace(vec![cm("ns", "b", "blue"), cm("ns", "c", "red")]);
        assert_eq!(names(&changed.added), ["c"]);
        assert_eq!(changed.updated.len(), 1);
        let mut deleted: Vec<String> = changed
            .deleted
            .iter()
            .map(|o| format!("{}", ObjectKey::of(o.as_ref()).expect("named")))
            .collect();
        deleted.sort();
        assert_eq!(deleted, ["ns/a", "other/a"]);
        assert_eq!(names(&store.by_index("color", "red")), ["c"]);
        assert_eq!(names(&store.by_index("color", "blue")), ["b"]);
        assert_eq!(store.len(), 2);
    }

    #[test]
    fn stored_objects_are_shared_not_copied() {
        let store = Writer::new();
        let (k, a) = cm("ns", "a", "red");
        store.insert(k.clone(), a.clone());
        let got = store.get(&k).expect("stored");
        assert!(Arc::ptr_eq(&got, &a));
    }

    #[tokio::test]
    async fn synced_signal_fires_once_marked() {
        let writer: Writer<ConfigMap> = Writer::new();
        let store = writer.store();
        assert!(!store.is_synced());
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { store.wait_synced().await })
        };
        writer.mark_synced();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("wait_synced resolves")
            .expect("task ran");
        assert!(store.is_synced());
        assert!(store.is_current());
    }

    #[tokio::test]
    async fn a_disconnected_store_is_synced_but_not_current() {
        let writer: Writer<ConfigMap> = Writer::new();
        let store = writer.store();
        writer.mark_synced();
        writer.mark_connected(false);
        assert!(store.is_synced());
        assert!(!store.is_current());
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { store.wait_current().await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a disconnected store is not current");
        writer.mark_connected(true);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter)
            .await
            .expect("wait_current resolves")
            .expect("task ran");
    }

    #[test]
    fn key_display() {
        assert_eq!(ObjectKey::new(Some("ns"), "a").to_string(), "ns/a");
        assert_eq!(ObjectKey::cluster("node-1").to_string(), "node-1");
    }
}
