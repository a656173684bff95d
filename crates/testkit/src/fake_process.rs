//! A Go-built cloud fake (`e2e/<name>/build.sh`, built once into the cache)
//! run for one test: started on a free port, its control calls sent with
//! nodewarden's own cloud HTTP client, stopped on drop — its request log
//! kept when the test failed.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use nodewarden::cloud::http::Http;

/// The binary `e2e/<name>/build.sh` builds (once per process).
pub fn build(name: &str) -> PathBuf {
    let script = crate::repo().join(format!("e2e/{name}/build.sh"));
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(out.status.success(), "{} failed", script.display());
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string();
    PathBuf::from(dir).join(name)
}

/// A running fake.
pub struct FakeProcess {
    name: String,
    child: Child,
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

impl FakeProcess {
    /// Starts `binary` with `args` and `-listen 127.0.0.1:0 -log FILE`, and
    /// reads the address it listens on from its first line.
    pub fn start(name: &str, binary: &std::path::Path, args: &[&str]) -> FakeProcess {
        let dir = tempfile::tempdir().expect("a temp dir");
        let log = dir.path().join("requests.jsonl");
        let mut child = Command::new(binary)
            .args(["-listen", "127.0.0.1:0", "-log"])
            .arg(&log)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let stdout = child.stdout.take().expect("its stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("its first line");
        let endpoint = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("{name} said {line:?}"))
            .to_string();
        FakeProcess {
            name: name.to_string(),
            child,
            dir,
            endpoint,
        }
    }

    /// Its process ID (to pause it: a cloud that stops answering).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A control request of the fake (`/fake/...`), its answer's body.
    pub async fn control(&self, method: &str, path_and_query: &str) -> String {
        let url = format!("{}{path_and_query}", self.endpoint);
        let request = http::Request::builder()
            .method(method)
            .uri(&url)
            .body(Full::new(Bytes::new()))
            .expect("a control request");
        let http = Http::new(Duration::from_secs(5)).expect("an HTTP client");
        let reply = http
            .send(request, Duration::from_secs(30))
            .await
            .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        assert!(
            reply.status < 300,
            "{method} {url}: {} {}",
            reply.status,
            reply.body
        );
        reply.body
    }
}

impl Drop for FakeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let file = format!("nodewarden-{}-requests-{}.jsonl", self.name, self.child.id());
            let kept = std::env::temp_dir().join(file);
            if std::fs::copy(self.dir.path().join("requests.jsonl"), &kept).is_ok() {
                eprintln!("the {} fake's requests, in order: {}", self.name, kept.display());
            }
        }
    }
}
