//! The reflector's store equals a fresh list after the API server restarts
//! mid-watch, after an etcd compaction forces 410 Gone, and after its watch
//! connection goes silent; objects deleted while it was disconnected arrive
//! as deletions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{PrivateControlPlane, Probe, TcpProxy, TestEnv, control_plane, seen, wait_for};
use k8s_openapi::api::core::v1::{ConfigMap, Node, PodTemplate};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use nodewarden::runtime::reflector::{Event, FirstList, Reflector, ReflectorConfig, ReflectorStats};
use nodewarden::runtime::store::Store;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Names seen in Deleted events.
type Deletions = Arc<Mutex<BTreeSet<String>>>;

fn record_deletions<K>(reflector: &mut Reflector<K>) -> Deletions
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let deleted = Deletions::default();
    let sink = deleted.clone();
    reflector.on_event(move |event| {
        if let Event::Deleted(obj) = event {
            let name = obj.meta().name.clone().unwrap_or_default();
            sink.lock().unwrap_or_else(|e| e.into_inner()).insert(name);
        }
    });
    deleted
}

/// name → resourceVersion of every object in the store.
fn store_versions<K: Resource>(store: &Store<K>) -> BTreeMap<String, String> {
    store
        .list()
        .iter()
        .map(|o| {
            (
                o.meta().name.clone().unwrap_or_default(),
                o.meta().resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits until the store holds exactly what a fresh consistent list returns.
async fn wait_store_equals_list<K>(store: &Store<K>, api: &Api<K>, selector: &str)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    wait_for(
        "the store to equal a fresh list",
        Duration::from_secs(60),
        || async {
            let listed: BTreeMap<String, String> =
                match api.list(&ListParams::default().labels(selector)).await {
                    Ok(list) => list
                        .items
                        .iter()
                        .map(|o| {
                            (
                                o.meta().name.clone().unwrap_or_default(),
                                o.meta().resource_version.clone().unwrap_or_default(),
                            )
                        })
                        .collect(),
                    Err(e) => return Probe::NotYet(seen(e)),
                };
            let stored = store_versions(store);
            if stored == listed {
                Probe::Done(())
            } else {
                Probe::NotYet(format!("store {stored:?} vs list {listed:?}"))
            }
        },
    )
    .await
}

/// Runs `reflector` until its store is synced and a watch is running.
async fn run_until_watching<K>(
    reflector: Reflector<K>,
) -> (
    Store<K>,
    Arc<ReflectorStats>,
    CancellationToken,
    tokio::task::JoinHandle<()>,
)
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let (store, stats) = (reflector.store(), reflector.stats());
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(reflector.run(shutdown.clone()));
    tokio::time::timeout(Duration::from_secs(30), store.wait_synced())
        .await
        .expect("synced");
    wait_for("a running watch", Duration::from_secs(10), || async {
        if stats.watches.load(Ordering::Relaxed) > 0 {
            Probe::Done(())
        } else {
            Probe::NotYet("no watch".into())
        }
    })
    .await;
    (store, stats, shutdown, task)
}

#[tokio::test]
async fn store_equals_list_after_compaction_forces_410() {
    let env = TestEnv::new("reflector-410").await;
    let cp = control_plane();
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    for i in 0..30 {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("cm-{i}"), "labels": {"set": "a"}}, "data": {"v": "0"}
        }))
        .expect("a configmap");
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("creating a configmap");
    }

    // The reflector talks through a proxy the test can cut; small pages so the
    // paged list is exercised.
    let proxy = TcpProxy::start(cp.apiserver_addr()).await;
    let proxied: Api<ConfigMap> = Api::namespaced(cp.client_via(&proxy).await, &env.namespace);
    let config = ReflectorConfig {
        label_selector: Some("set=a".into()),
        page_size: 7,
        ..Default::default()
    };
    let mut reflector = Reflector::new("configmaps", proxied, config);
    let deleted = record_deletions(&mut reflector);
    let (store, stats, shutdown, task) = run_until_watching(reflector).await;
    assert_eq!(store.len(), 30);

    // Disconnected: delete some, add some, change some; then compact etcd so
    // the reflector's last resourceVersion is gone.
    assert!(store.is_current(), "a watching reflector's store is current");
    proxy.cut();
    // A leader's controllers wait for current stores: one cut off says so.
    tokio::time::timeout(Duration::from_secs(10), async {
        while store.is_current() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a cut-off reflector's store stops being current");
    let mut expected_deleted = BTreeSet::new();
    for i in 0..10 {
        cms.delete(&format!("cm-{i}"), &DeleteParams::default())
            .await
            .expect("deleting");
        expected_deleted.insert(format!("cm-{i}"));
    }
    for i in 30..35 {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": format!("cm-{i}"), "labels": {"set": "a"}}
        }))
        .expect("a configmap");
        cms.create(&PostParams::default(), &cm).await.expect("creating");
    }
    for i in 10..15 {
        let patch = json!({"data": {"v": "1"}});
        cms.patch(&format!("cm-{i}"), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patching");
    }
    cp.compact_etcd().await;
    proxy.restore();

    wait_store_equals_list(&store, &cms, "set=a").await;
    tokio::time::timeout(Duration::from_secs(10), store.wait_current())
        .await
        .expect("current again once reconnected");
    assert!(
        stats.expired.load(Ordering::Relaxed) >= 1,
        "the compaction should have forced a 410"
    );
    assert!(
        stats.lists.load(Ordering::Relaxed) >= 2,
        "a 410 must lead to a relist"
    );
    let seen_deleted = deleted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        seen_deleted, expected_deleted,
        "deletions made while disconnected"
    );
    let changed = store.get(&nodewarden::runtime::store::ObjectKey::new(
        Some(&env.namespace),
        "cm-12",
    ));
    assert_eq!(
        changed
            .and_then(|c| c.data.clone())
            .and_then(|d| d.get("v").cloned())
            .as_deref(),
        Some("1")
    );
    // The transform stripped managedFields before storing.
    assert!(store.list().iter().all(|c| c.metadata.managed_fields.is_none()));

    shutdown.cancel();
    task.await.expect("reflector task");
    env.cleanup().await;
}

#[tokio::test]
async fn store_equals_list_after_apiserver_restart() {
    // A control plane of our own: restarting the shared API server would
    // disturb every other test.
    let private = tokio::task::spawn_blocking(|| PrivateControlPlane::start("reflector-restart"))
        .await
        .expect("starting a private control plane");
    let cp = &private.0;
    let client = cp.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    for i in 0..20 {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": format!("n-{i}"), "labels": {"set": "r"}}
        }))
        .expect("a node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("creating a node");
    }

    // Nodes are served from the watch cache, unlike the ConfigMaps above: this
    // covers the cached path (bookmarks, cache re-initialised on restart).
    let proxy = TcpProxy::start(cp.apiserver_addr()).await;
    let proxied: Api<Node> = Api::all(cp.client_via(&proxy).await);
    let config = ReflectorConfig {
        label_selector: Some("set=r".into()),
        ..Default::default()
    };
    let mut reflector = Reflector::new("nodes", proxied, config);
    let deleted = record_deletions(&mut reflector);
    let (store, stats, shutdown, task) = run_until_watching(reflector).await;
    let watches_before = stats.watches.load(Ordering::Relaxed);

    // Kill the API server mid-watch and start it again; change things while
    // the reflector is still cut off from the new one.
    proxy.cut();
    // Our own direct connections go too, so the killed server's port frees up.
    drop(nodes);
    drop(client);
    let restarted = tokio::task::spawn_blocking(move || {
        private.restart_apiserver();
        private
    })
    .await
    .expect("restarting kube-apiserver");
    let client = restarted.0.client().await;
    let nodes: Api<Node> = Api::all(client);
    let mut expected_deleted = BTreeSet::new();
    for i in 0..5 {
        nodes
            .delete(&format!("n-{i}"), &DeleteParams::default())
            .await
            .expect("deleting a node");
        expected_deleted.insert(format!("n-{i}"));
    }
    for i in 20..23 {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": format!("n-{i}"), "labels": {"set": "r"}}
        }))
        .expect("a node");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("creating a node");
    }
    for i in 5..8 {
        let patch = json!({"metadata": {"annotations": {"touched": "yes"}}});
        nodes
            .patch(&format!("n-{i}"), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patching");
    }
    proxy.restore();

    wait_store_equals_list(&store, &nodes, "set=r").await;
    assert!(
        stats.watches.load(Ordering::Relaxed) > watches_before,
        "the reflector re-watched"
    );
    let seen_deleted = deleted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    assert_eq!(
        seen_deleted, expected_deleted,
        "deletions made while disconnected"
    );
    let touched = store
        .get(&nodewarden::runtime::store::ObjectKey::cluster("n-6"))
        .expect("n-6 stored");
    assert_eq!(
        touched.annotations().get("touched").map(String::as_str),
        Some("yes")
    );

    shutdown.cancel();
    task.await.expect("reflector task");
    drop(restarted);
}

/// A watch whose connection goes half-dead (nothing arrives, no error) is
/// noticed after the idle timeout and restarted from its last version, on
/// a fresh connection: the store catches up without a relist.
#[tokio::test]
async fn a_stalled_watch_is_restarted_and_the_store_catches_up() {
    let env = TestEnv::new("reflector-stall").await;
    let cp = control_plane();
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
    let create = |name: &str| {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"set": "s"}}
        }))
        .expect("a configmap");
        let cms = cms.clone();
        async move {
            cms.create(&PostParams::default(), &cm)
                .await
                .expect("creating a configmap");
        }
    };
    create("before").await;

    let proxy = TcpProxy::start(cp.apiserver_addr()).await;
    let proxied: Api<ConfigMap> = Api::namespaced(cp.client_via(&proxy).await, &env.namespace);
    let config = ReflectorConfig {
        label_selector: Some("set=s".into()),
        idle_timeout: Duration::from_secs(3),
        ..Default::default()
    };
    let reflector = Reflector::new("configmaps", proxied, config);
    let (store, stats, shutdown, task) = run_until_watching(reflector).await;
    let lists = stats.lists.load(Ordering::Relaxed);

    // The watch's connection (and every pooled one) goes silent for good.
    proxy.stall_open_connections();
    create("during-stall").await;
    wait_store_equals_list(&store, &cms, "set=s").await;
    let stalls = stats.stalls.load(Ordering::Relaxed);
    println!(
        "stalled watch detected {stalls} time(s); watches started {}",
        stats.watches.load(Ordering::Relaxed)
    );
    assert!(stalls >= 1, "the silent watch was noticed");
    assert_eq!(
        stats.lists.load(Ordering::Relaxed),
        lists,
        "caught up by re-watching from the last version, not by relisting"
    );
    shutdown.cancel();
    let _ = task.await;
    env.cleanup().await;
}

/// The API server's count of consistent reads of `resource` served from its
/// watch cache (lists without a resourceVersion).
async fn consistent_reads(client: &kube::Client, resource: &str) -> f64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a metrics request");
    let text = client
        .request_text(request)
        .await
        .expect("reading the API server's metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_watch_cache_consistent_read_total{"))
        .filter(|l| l.contains(&format!("resource=\"{resource}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Creates a PodTemplate of the first-list set.
async fn create_template(templates: &Api<PodTemplate>, name: &str) {
    let template: PodTemplate = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"set": "first-list"}},
        "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
    }))
    .expect("a PodTemplate");
    templates
        .create(&PostParams::default(), &template)
        .await
        .expect("creating a PodTemplate");
}

#[tokio::test]
async fn a_cached_first_list_is_answered_by_the_watch_cache_without_a_consistent_read() {
    // A control plane of our own: no other client reads PodTemplates there,
    // so the API server's count of consistent reads is this test's alone.
    let private = tokio::task::spawn_blocking(|| PrivateControlPlane::start("reflector-first-list"))
        .await
        .expect("starting a private control plane");
    let client = private.0.client().await;
    let templates: Api<PodTemplate> = Api::namespaced(client.clone(), "default");
    for i in 0..3 {
        create_template(&templates, &format!("t-{i}")).await;
    }
    let config = |first_list| ReflectorConfig {
        label_selector: Some("set=first-list".into()),
        first_list,
        ..ReflectorConfig::default()
    };

    // resourceVersion=0: the cache answers as it is, with every object.
    let before = consistent_reads(&client, "podtemplates").await;
    let reflector = Reflector::new("cached", templates.clone(), config(FirstList::Cached));
    let (store, _, shutdown, task) = run_until_watching(reflector).await;
    assert_eq!(store.list().len(), 3, "the cached list holds every PodTemplate");
    let after_cached = consistent_reads(&client, "podtemplates").await;
    assert_eq!(after_cached, before, "a cached first list is no consistent read");
    shutdown.cancel();
    task.await.expect("the reflector ends");

    // The default: a consistent read, in pages.
    let reflector = Reflector::new("paged", templates.clone(), config(FirstList::Paged));
    let (store, _, shutdown, task) = run_until_watching(reflector).await;
    assert_eq!(store.list().len(), 3, "the paged list holds every PodTemplate");
    let after_paged = consistent_reads(&client, "podtemplates").await;
    assert!(
        after_paged > after_cached,
        "a paged first list is a consistent read ({after_cached} → {after_paged})"
    );

    // Both watch on from their list: a new PodTemplate arrives.
    create_template(&templates, "t-late").await;
    wait_store_equals_list(&store, &templates, "set=first-list").await;
    shutdown.cancel();
    task.await.expect("the reflector ends");
}
