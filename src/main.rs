//! The `nodewarden` binary: the operator and its tools.

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "nodewarden",
    version,
    about = "Keeps every Kubernetes node on the OS image and Kubernetes version its operators asked for"
)]
struct Cli {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true, env = "NODEWARDEN_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinition YAML of every resource nodewarden defines.
    Crds,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    nodewarden::telemetry::init_logging(cli.log_json);
    match cli.command {
        Command::Crds => print_crds(),
    }
}

fn print_crds() -> anyhow::Result<()> {
    let mut out = String::new();
    for crd in nodewarden::api::all_crds() {
        out.push_str("---\n");
        out.push_str(&serde_norway::to_string(&crd).context("serializing a CRD to YAML")?);
    }
    print!("{out}");
    Ok(())
}
