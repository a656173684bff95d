//! nodewarden's test harness, one library for the integration tests
//! (`tests/it`), the chaos runs and the benches, compiled once: tests
//! against the real local control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, kwok).
//!
//! One control plane serves a whole test run: the first test to ask starts it
//! with `e2e/controlplane/cluster.sh up` (a no-op when `just test` or the user
//! already started it) and every test after that reuses it. Each test gets its
//! own client, its own namespace and a run id that labels every cluster-scoped
//! object it creates, so tests run in parallel without touching each other.
//!
//! By concern: `cluster` (the shared and private control planes, clients,
//! CRDs), `env` (one test's namespace, run id, Nodes and Deployments, cleanup),
//! `wait` (probes polled until done), `proxy` (a TCP proxy that cuts and stalls
//! connections to the API server), `late` (a link that holds requests and
//! delivers them late, to see how a write arriving after a leader change is answered), `operator` (the operator under test, run
//! in-process), `audit` (the API server's record of nodewarden's writes); `admission` (a webhook configuration pointing at a test's webhook), `manifests`, `aws` (moto, Auto Scaling groups, a joiner), `jaeger`, `sim`, `rollout`, `plans`, `metal3` (metal3's genuine BareMetalHost CRD), `etcd` (a real etcd cluster, a member per loopback address), `nmo` (the pinned peer, for benches), `procstat` (CPU time by process, for benches), `sip` and `replicas` (nodewarden
//! run as processes, like the pods of its Deployment) for the tests that need them. Tests use the names re-exported here.

pub mod admission;
pub mod audit;
pub mod aws;
pub mod azure;
pub mod chaos;
pub mod chart;
pub mod cloud_chaos;
pub mod discovery;
pub mod etcd;
pub mod fake_process;
pub mod gcp;
pub mod jaeger;
pub mod late;
pub mod maintenances;
pub mod manifests;
pub mod metal3;
pub mod nmo;
pub mod plans;
pub mod procstat;
pub mod rbac;
pub mod replicas;
pub mod rollout;
pub mod sim;
pub mod sip;
pub mod stall_report;
pub mod update_samples;
pub mod upgrade_agent;

mod cluster;
mod env;
mod operator;
mod proxy;
mod wait;

/// Logs of the code under test (RUST_LOG picks the level; info if unset),
/// through the test harness's capture: each test's failure report carries
/// the logs of the operators it ran, not a mix of every test's on stderr.
pub fn init_test_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_test_writer()
        .try_init();
}

pub use cluster::{ControlPlane, PrivateControlPlane, control_plane, install_crds, install_own_crds};
pub use env::{RUN_LABEL, TestEnv};
pub use operator::RunningOperator;
pub use proxy::TcpProxy;
pub use wait::{Probe, seen, wait_for, wait_for_condition};

pub use nodewarden::node::node_is_ready;

pub use manifests::apply_manifest;

/// The repository's root (the scripts under `e2e/`, the manifests).
pub fn repo() -> &'static std::path::Path {
    static ROOT: std::sync::LazyLock<std::path::PathBuf> = std::sync::LazyLock::new(|| {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        here.join("../..")
            .canonicalize()
            .unwrap_or_else(|_| here.join("../.."))
    });
    &ROOT
}

/// The `nodewarden` binary cargo built beside the test or bench running
/// (`target/<profile>/deps/<test>` → `target/<profile>/nodewarden`), as
/// the tests run it as a process.
pub fn nodewarden_binary() -> std::path::PathBuf {
    binary("nodewarden")
}

/// The `nodewarden-simcloud` binary, found as [`nodewarden_binary`] is.
pub fn simcloud_binary() -> std::path::PathBuf {
    binary("nodewarden-simcloud")
}

/// A binary of the root package, which cargo builds for its integration
/// tests and benches: `target/<profile>/<name>`.
fn binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the running test's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("a test binary under target/<profile>/deps");
    let binary = profile_dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.is_file(),
        "{} is missing: cargo builds it for the integration tests and benches",
        binary.display()
    );
    binary
}

/// The seed of a randomized test: `NODEWARDEN_SEED` when set (to replay a
/// run), a random one otherwise; printed either way, with how to replay it.
pub fn seed(test: &str) -> u64 {
    seed_or(test, rand::random())
}

/// As [`seed`], with `default` when `NODEWARDEN_SEED` is unset: a run whose
/// schedule CI replays the same way every time.
pub fn seed_or(test: &str, default: u64) -> u64 {
    let seed = std::env::var("NODEWARDEN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    println!("{test}: seed {seed} (NODEWARDEN_SEED={seed} replays it)");
    seed
}
