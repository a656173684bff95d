//! `nodewarden-simcloud` as a child process of a test.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nodewarden::cloud::sim::SimProvider;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A running `nodewarden-simcloud` child process and a provider talking to it.
pub struct SimCloud {
    child: Child,
    pub provider: SimProvider,
    /// Where it listens (what `nodewarden run --sim-cloud` takes).
    pub addr: String,
    config: PathBuf,
    state: PathBuf,
}

impl SimCloud {
    /// Starts the binary on port 0 and reads the bound address from the first
    /// line of its stdout.
    pub async fn start(config: &Path, state: &Path) -> SimCloud {
        SimCloud::start_on(config, state, "127.0.0.1:0").await
    }

    /// SIGKILL, `down` later the same config and state file on the same
    /// address: a cloud API that went away mid-call and came back with what
    /// it had acknowledged.
    pub async fn restart(&mut self, down: Duration) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
        tokio::time::sleep(down).await;
        let (config, state, addr) = (self.config.clone(), self.state.clone(), self.addr.clone());
        *self = SimCloud::start_on(&config, &state, &addr).await;
    }

    async fn start_on(config: &Path, state: &Path, listen: &str) -> SimCloud {
        let mut child = Command::new(crate::simcloud_binary())
            .arg("--config")
            .arg(config)
            .arg("--state")
            .arg(state)
            .args(["--listen", listen, "--kubeconfig"])
            .arg(&super::control_plane().kubeconfig)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("starting nodewarden-simcloud");
        let stdout = child.stdout.take().expect("a piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(TIMEOUT, lines.next_line())
            .await
            .expect("sim-cloud printed its address in time")
            .expect("reading sim-cloud's stdout")
            .expect("sim-cloud printed a line before exiting");
        let addr = first
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .to_string();
        // Keep draining stdout so the child never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let provider = SimProvider::new(&addr)
            .expect("a valid endpoint")
            .with_timeout(Duration::from_secs(5));
        SimCloud {
            child,
            provider,
            addr,
            config: config.to_path_buf(),
            state: state.to_path_buf(),
        }
    }

    /// kill -9: no chance to save anything on the way out.
    pub async fn kill(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

/// A sim-cloud from a config text (YAML or JSON), with a state file in a
/// temp directory that lives as long as the returned value.
pub struct OwnedSimCloud {
    pub sim: SimCloud,
    _dir: tempfile::TempDir,
}

impl SimCloud {
    pub async fn start_with_config(config: &str) -> OwnedSimCloud {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("sim-cloud.yaml");
        std::fs::write(&path, config).expect("writing the sim-cloud config");
        let sim = SimCloud::start(&path, &dir.path().join("state.json")).await;
        OwnedSimCloud { sim, _dir: dir }
    }
}
