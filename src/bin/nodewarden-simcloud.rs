//! `nodewarden-simcloud`: the simulated cloud (the `nodewarden-simcloud`
//! crate) as a process, with the operator's Kubernetes client, HTTP server
//! and logging. It prints `listening on <addr>` as its first line on stdout
//! and serves until SIGTERM or Ctrl-C.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use nodewarden::http::{ConnLimits, bind_with};
use nodewarden_simcloud::{joiner, server};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
#[command(
    name = "nodewarden-simcloud",
    version,
    about = "A simulated cloud for tests and demos: scaling groups whose instances join as kwok Nodes"
)]
struct Args {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "NODEWARDEN_LOG_JSON")]
    log_json: bool,
    /// YAML file with the scaling groups (id, role, initialSize, image, delays, labels).
    #[arg(long)]
    config: PathBuf,
    /// JSON file holding the cloud's state: rewritten on every change, reloaded on start.
    #[arg(long)]
    state: PathBuf,
    /// Address of the HTTP API (port 0 picks a free port). The bound address is
    /// printed as the first line on stdout: `listening on 127.0.0.1:34567`.
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Kubeconfig of the cluster the instances join (default: in-cluster, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

/// The sim-cloud's connections: every replica's cloud client, the test
/// harness and the demo. Idle connections are kept longer than hyper's
/// client keeps them in its pool (90 s), so a client never sends on a
/// connection the server is closing.
const LIMITS: ConnLimits = ConnLimits {
    max_connections: 1024,
    header_read_timeout: Duration::from_secs(120),
    ..ConnLimits::ENDPOINTS
};

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    nodewarden::telemetry::init_logging(args.log_json, None);
    tokio::runtime::Runtime::new()
        .context("starting the async runtime")?
        .block_on(serve(args))
}

/// Serves until SIGTERM or Ctrl-C. Nothing needs saving on the way out:
/// every change was saved when it was made.
async fn serve(args: Args) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
    tokio::spawn(async move {
        nodewarden::signal::wait().await;
        signals.cancel();
    });
    let opened = nodewarden_simcloud::open(&args.config, &args.state)?;
    let client = nodewarden::client::build(args.kubeconfig.as_deref()).await?;
    let sim = opened.store;
    let api = sim.clone();
    let (addr, serve) = bind_with(args.listen, LIMITS, shutdown.clone(), move |req| {
        server::answer(api.clone(), req)
    })
    .await
    .with_context(|| format!("listening on {}", args.listen))?;
    // The first line on stdout is the contract with whoever started us.
    println!("listening on {addr}");
    let _ = std::io::stdout().flush();
    tracing::info!(%addr, state = %args.state.display(), instances = opened.instances, restored = opened.restored, "sim-cloud serving");
    let joiner = tokio::spawn(joiner::run(sim, client, shutdown.clone()));
    serve.await;
    let _ = joiner.await;
    Ok(())
}
