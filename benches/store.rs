//! Store lookups per second, and the memory one stripped Node costs in the store.
//!
//! The memory figure comes from a counting global allocator: bytes held after
//! inserting 5,000 Nodes (as the reflector stores them: transformed by
//! `strip_node`) minus bytes held before, divided by 5,000. It is printed
//! before the criterion benchmarks run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Node;
use nodewarden::node::strip_node;
use nodewarden::runtime::store::{ObjectKey, Store, Writer};
use serde_json::json;

struct Counting;

static HELD: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HELD.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const NODES: usize = 5_000;

/// A Node as a cloud cluster's API server returns it: labels, annotations,
/// taints, conditions, addresses, images and managedFields.
fn realistic_node(i: usize) -> Node {
    let name = format!("ip-10-0-{}-{}.eu-west-1.compute.internal", i / 250, i % 250);
    let conditions: Vec<_> = [
        "MemoryPressure",
        "DiskPressure",
        "PIDPressure",
        "Ready",
        "NetworkUnavailable",
    ]
    .iter()
    .map(|t| {
        json!({"type": t, "status": if *t == "Ready" {"True"} else {"False"},
            "lastHeartbeatTime": "2026-11-21T10:00:00Z", "lastTransitionTime": "2026-11-01T10:00:00Z",
            "reason": format!("Kubelet{t}"), "message": format!("kubelet reports {t}")})
    })
    .collect();
    let images: Vec<_> = (0..40)
        .map(|k| json!({"names": [format!("registry.example.com/team/app-{k}@sha256:{:064x}", k), format!("registry.example.com/team/app-{k}:v1.{k}")], "sizeBytes": 123_456_789}))
        .collect();
    let managed: Vec<_> = ["kubelet", "kube-controller-manager", "nodewarden"]
        .iter()
        .map(|m| json!({"manager": m, "operation": "Update", "apiVersion": "v1", "time": "2026-11-21T10:00:00Z",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}}, "f:status": {"f:conditions": {}}}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "uid": format!("{:08x}-0000-4000-8000-{:012x}", i, i),
            "resourceVersion": format!("{}", 100_000 + i),
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "m6i.2xlarge", "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": format!("eu-west-1{}", ["a", "b", "c"][i % 3]),
                "node-role.kubernetes.io/worker": "", "pool": format!("pool-{}", i % 10),
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "constellation.edgeless.systems/node-image": "ref/v1.2.3",
                "constellation.edgeless.systems/scaling-group-id": format!("group-{}", i % 10),
            },
            "managedFields": managed,
        },
        "spec": {"providerID": format!("aws:///eu-west-1a/i-{:017x}", i), "podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {"cpu": "7910m", "memory": "30Gi", "pods": "110", "ephemeral-storage": "90Gi"},
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", i / 250, i % 250)}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1.0",
                "osImage": "Constellation", "containerRuntimeVersion": "containerd://1.7.0", "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images,
        },
    }))
    .expect("a node")
}

fn pool_index(store: &Store<Node>) {
    store.add_index("pool", |n: &Node| {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("pool").cloned())
            .into_iter()
            .collect()
    });
}

fn memory_per_node() {
    let nodes: Vec<Node> = (0..NODES).map(realistic_node).collect();
    let raw: usize = nodes
        .iter()
        .map(|n| serde_json::to_vec(n).map(|v| v.len()).unwrap_or(0))
        .sum();
    let stripped: Vec<Node> = nodes.into_iter().map(strip_node).collect();
    let json: usize = stripped
        .iter()
        .map(|n| serde_json::to_vec(n).map(|v| v.len()).unwrap_or(0))
        .sum();
    let store = Writer::new();
    pool_index(&store);
    let before = HELD.load(Ordering::Relaxed);
    for node in stripped {
        let key = ObjectKey::of(&node).expect("named");
        store.insert(key, Arc::new(node));
    }
    let after = HELD.load(Ordering::Relaxed);
    // `stripped` moved into the store: the delta is the store's own overhead
    // (keys, index, Arc headers) on top of the nodes, which were allocated
    // before `before`; so count the nodes themselves separately.
    // The nodes were allocated before `before`: the delta is the store's own
    // cost (keys, maps, index). A Node's own heap size is measured apart.
    let overhead = (after - before) as f64 / NODES as f64;
    let rebuilt_before = HELD.load(Ordering::Relaxed);
    let again: Vec<Arc<Node>> = (0..NODES)
        .map(|i| Arc::new(strip_node(realistic_node(i))))
        .collect();
    let per_node = (HELD.load(Ordering::Relaxed) - rebuilt_before) as f64 / NODES as f64;
    black_box((&again, &store));
    println!(
        "store memory: {NODES} stripped Nodes: {:.0} bytes per Node held ({per_node:.0} object + {overhead:.0} store keys/index); \
         JSON size per Node {:.0} bytes as served, {:.0} bytes stripped",
        per_node + overhead,
        raw as f64 / NODES as f64,
        json as f64 / NODES as f64
    );
}

fn lookups(c: &mut Criterion) {
    memory_per_node();
    let store = Writer::new();
    pool_index(&store);
    let keys: Vec<ObjectKey> = (0..NODES)
        .map(|i| {
            let node = strip_node(realistic_node(i));
            let key = ObjectKey::of(&node).expect("named");
            store.insert(key.clone(), Arc::new(node));
            key
        })
        .collect();
    let mut g = c.benchmark_group("store");
    g.throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function("get_by_key/5000_nodes", |b| {
        b.iter(|| {
            for key in &keys {
                black_box(store.get(key));
            }
        })
    });
    g.throughput(Throughput::Elements(10));
    g.bench_function("by_index/10_pools_of_500", |b| {
        b.iter(|| {
            for p in 0..10 {
                black_box(store.by_index("pool", &format!("pool-{p}")));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, lookups);
criterion_main!(benches);
