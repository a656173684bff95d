//! The admission webhook of a real replica (`nodewarden run --webhook-addr`,
//! as the ServiceAccount of manifests/base/rbac.yaml) against clients that
//! would exhaust it, all on 127.0.0.1: bodies over the limit, one and then 50
//! at once, are refused with 413 (or 429 past the reviews at once) while the
//! replica's peak RSS (VmHWM) stays within what its limits allow, and it
//! answers reviews after; a few hundred connections that never start TLS or
//! stall in the handshake do not keep a review from being answered, and are
//! closed after the handshake timeout and counted. The NetworkPolicy
//! component renders over the base and passes a server-side dry run.

use crate::support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::replicas::*;
use crate::support::{Probe, TestEnv, wait_for};
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use nodewarden::admission::limits::{MAX_BODY_BYTES, MAX_IN_FLIGHT};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1024 * 1024;

/// What the test's clients allow a slow machine before they give up.
const PATIENCE: Duration = Duration::from_secs(60);

/// One replica serving the webhook on loopback, and a TLS client that
/// trusts its CA.
struct Webhook {
    replicas: Replicas,
    identity: String,
    port: u16,
    tls: tokio_rustls::TlsConnector,
    /// A node that does not exist: a review of a NodeMaintenance for it is
    /// denied after the reads the rules make.
    missing: String,
}

impl Webhook {
    /// Starts the replica with `extra` flags and waits until it answers a
    /// review.
    async fn start(env: &TestEnv, extra: &[&str]) -> Webhook {
        support::install_crds(&env.client).await;
        let dir = replica_log_dir(&env.id);
        let kubeconfig = service_account_kubeconfig(&env.client, &dir).await;
        let replicas = Replicas::start_with_env(
            1,
            env,
            Shared {
                kubeconfig: &kubeconfig,
                lease_name: &format!("nodewarden-{}", env.id),
                otlp_endpoint: "",
                extra,
                logs: &dir,
            },
            &[(SERVE_WEBHOOK.into(), "1".into())],
        );
        let identity = replicas.identities().remove(0);
        let port = replicas.webhook.as_ref().expect("webhook ports")[&identity];
        let tls = connector(&ca(env).await);
        let webhook = Webhook {
            replicas,
            identity,
            port,
            tls,
            missing: env.name("no-such-node"),
        };
        wait_for("the webhook answering a review", PATIENCE, || async {
            match webhook.review().await {
                Ok(answer) => Probe::Done(answer),
                Err(e) => Probe::NotYet(e),
            }
        })
        .await;
        webhook
    }

    fn pid(&self) -> u32 {
        self.replicas.pid(&self.identity).expect("the replica runs")
    }

    async fn tls_connect(&self) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
        let tcp = TcpStream::connect(("127.0.0.1", self.port))
            .await
            .map_err(|e| format!("connecting: {e}"))?;
        let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        self.tls
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))
    }

    /// A review of a NodeMaintenance CREATE for a node that does not exist,
    /// as kube-apiserver sends it: the webhook's verdict, Err when it did
    /// not give the one the rules give.
    async fn review(&self) -> Result<String, String> {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "5c1e3f0a-hardening",
                "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
                "resource": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "resource": "nodemaintenances"},
                "name": "hardening", "operation": "CREATE",
                "userInfo": {"username": "admin"},
                "object": {
                    "apiVersion": "nodemaintenance.medik8s.io/v1beta1", "kind": "NodeMaintenance",
                    "metadata": {"name": "hardening"},
                    "spec": {"nodeName": self.missing, "reason": "test"},
                },
                "dryRun": false,
            }
        });
        let body = serde_json::to_vec(&review).map_err(|e| e.to_string())?;
        let mut stream = self.tls_connect().await?;
        let head = format!(
            "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream
            .write_all(&[head.as_bytes(), &body].concat())
            .await
            .map_err(|e| format!("writing: {e}"))?;
        let mut raw = Vec::new();
        // A server closing without TLS close_notify ends the read with an error.
        let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
            .await
            .map_err(|_| "no answer".to_string())?;
        let answer = String::from_utf8_lossy(&raw).to_string();
        let verdict = format!("invalid nodeName, no node with name {} found", self.missing);
        if answer.starts_with("HTTP/1.1 200") && answer.contains(&verdict) {
            Ok(answer)
        } else {
            Err(answer)
        }
    }

    /// Sends a body meant to be `total` bytes, declared in Content-Length
    /// or chunked, while reading the answer: its status, once the head
    /// arrived (the server answers before taking the whole body).
    async fn post_oversized(&self, total: u64, declared: bool) -> Result<(u16, String), String> {
        let stream = self.tls_connect().await?;
        let (mut read, mut write) = tokio::io::split(stream);
        let framing = if declared {
            format!("Content-Length: {total}")
        } else {
            "Transfer-Encoding: chunked".to_string()
        };
        let head = format!(
            "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{framing}\r\n\r\n"
        );
        write
            .write_all(head.as_bytes())
            .await
            .map_err(|e| format!("writing the head: {e}"))?;
        // Whitespace: a valid start of a JSON document, however long.
        const CHUNK: usize = 64 * 1024;
        let writer = tokio::spawn(async move {
            let data = vec![b' '; CHUNK];
            let framed = [format!("{CHUNK:x}\r\n").as_bytes(), &data, b"\r\n"].concat();
            let mut sent = 0u64;
            while sent < total {
                let piece = if declared { &data } else { &framed };
                if write.write_all(piece).await.is_err() {
                    break; // The server answered and closed.
                }
                sent += CHUNK as u64;
            }
        });
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        let answer = tokio::time::timeout(PATIENCE, async {
            while !String::from_utf8_lossy(&raw).contains("\r\n\r\n") {
                match read.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => raw.extend_from_slice(&buf[..n]),
                }
            }
            String::from_utf8_lossy(&raw).to_string()
        })
        .await;
        writer.abort();
        let answer = answer.map_err(|_| "no answer".to_string())?;
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status in {answer:?}"))?;
        Ok((status, answer))
    }

    /// The replica's count of webhook refusals for `reason`.
    async fn refused(&self, reason: &str) -> f64 {
        let scraped = self.replicas.scrape().await.expect("scraping /metrics");
        let text = &scraped[&self.identity];
        metric_value(
            text,
            &format!("nodewarden_webhook_requests_refused_total{{reason=\"{reason}\"}}"),
        )
        .unwrap_or_else(|| panic!("no refusal series for {reason}:\n{text}"))
    }

    /// The count of `reason` once it reached `expected` (a connection is
    /// counted as its task ends, just after the client saw it close), or
    /// what it is after [`PATIENCE`].
    async fn counted(&self, reason: &str, expected: f64) -> f64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let n = self.refused(reason).await;
            if n >= expected || Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The CA of the webhook's Secret (the first replica to serve makes it).
async fn ca(env: &TestEnv) -> String {
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), SYSTEM_NAMESPACE);
    wait_for("the webhook's CA", PATIENCE, || async {
        match secrets.get_opt("nodewarden-webhook-tls").await {
            Ok(Some(s)) => match s.data.and_then(|d| d.get("ca.crt").cloned()) {
                Some(ca) => Probe::Done(String::from_utf8_lossy(&ca.0).to_string()),
                None => Probe::NotYet("no ca.crt yet".into()),
            },
            other => Probe::NotYet(format!("{other:?}")),
        }
    })
    .await
}

fn connector(ca: &str) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.expect("a CA certificate")).expect("a root");
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A field of `/proc/<pid>/status` in bytes (VmRSS, VmHWM).
fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the replica's status");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Resets the process's peak RSS (VmHWM) to its current RSS, so the next
/// peak is the flood's alone. False where the kernel does not allow it: the
/// peak then includes the start-up's, an upper bound still.
fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_the_limit_leave_the_replica_its_memory_and_its_answers() {
    let env = TestEnv::new("webhook-bodies").await;
    let webhook = Webhook::start(&env, &[]).await;
    let pid = webhook.pid();
    let limit = MAX_BODY_BYTES as u64;
    // The replica has answered reviews: its TLS and HTTP paths are warm.
    for _ in 0..3 {
        webhook.review().await.expect("a review answered");
    }
    let huge = 300 * 1000 * 1000;

    // One body over the limit, declared: refused before a byte is read.
    let baseline = proc_status(pid, "VmRSS");
    assert!(
        reset_peak(pid),
        "cannot reset the replica's peak RSS (/proc/<pid>/clear_refs)"
    );
    let (status, answer) = webhook.post_oversized(huge, true).await.expect("an answer");
    assert_eq!(status, 413, "{answer}");
    let declared_peak = proc_status(pid, "VmHWM");
    // Undeclared (chunked): read up to the limit, then refused.
    reset_peak(pid);
    let (status, answer) = webhook.post_oversized(huge, false).await.expect("an answer");
    assert_eq!(status, 413, "{answer}");
    let chunked_peak = proc_status(pid, "VmHWM");
    println!(
        "one 300 MB body: baseline RSS {:.1} MiB; peak {:.1} MiB declared, {:.1} MiB chunked (limit {:.0} MiB)",
        mib(baseline),
        mib(declared_peak),
        mib(chunked_peak),
        mib(limit)
    );
    assert!(
        declared_peak < baseline + limit,
        "a declared body over the limit grew the RSS from {baseline} to {declared_peak}"
    );
    assert!(
        chunked_peak < baseline + limit + 4 * MIB,
        "a chunked body over the limit grew the RSS from {baseline} to {chunked_peak}: more than the limit and the connection's buffers"
    );

    // 50 at once, half declared, half chunked.
    let baseline = proc_status(pid, "VmRSS");
    reset_peak(pid);
    let webhook = Arc::new(webhook);
    let clients: Vec<_> = (0..50)
        .map(|i| {
            let webhook = webhook.clone();
            tokio::spawn(async move { webhook.post_oversized(huge, i % 2 == 0).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for client in clients {
        statuses.push(client.await.expect("a client").expect("an answer").0);
    }
    let peak = proc_status(pid, "VmHWM");
    let after = proc_status(pid, "VmRSS");
    let answered = |status: u16| statuses.iter().filter(|s| **s == status).count();
    // 408: a body that took longer than the body timeout to reach the limit
    // (a busy machine); refused all the same.
    let (too_large, busy, slow) = (answered(413), answered(429), answered(408));
    println!(
        "50 concurrent 300 MB bodies: {too_large} answered 413, {busy} answered 429, {slow} answered 408; RSS baseline {:.1} MiB, peak {:.1} MiB, after {:.1} MiB",
        mib(baseline),
        mib(peak),
        mib(after)
    );
    assert_eq!(too_large + busy + slow, 50, "every one refused: {statuses:?}");
    // At most MAX_IN_FLIGHT bodies are read at once, each at most the limit;
    // 32 MiB more for the 50 connections' TLS and HTTP buffers and the
    // allocator's own (seen: under 3 MiB over the bodies). Without the cap
    // the 50 bodies alone would take 350 MiB.
    let bound = baseline + MAX_IN_FLIGHT as u64 * limit + 32 * MIB;
    assert!(
        peak <= bound,
        "peak RSS {:.1} MiB over baseline {:.1} MiB + {MAX_IN_FLIGHT} bodies of {:.0} MiB + 32 MiB",
        mib(peak),
        mib(baseline),
        mib(limit)
    );
    // The Deployment's limit is 512 Mi.
    assert!(peak < 256 * MIB, "peak RSS {:.1} MiB", mib(peak));

    // Still answering, every refusal counted.
    webhook.review().await.expect("a review answered after the flood");
    assert_eq!(webhook.refused("body_too_large").await, (too_large + 2) as f64);
    assert_eq!(webhook.refused("too_many_requests").await, busy as f64);
    assert_eq!(webhook.refused("body_timeout").await, slow as f64);
    drop(webhook);
    env.cleanup().await;
}

/// A connection of the test that never completes a TLS handshake.
struct Stalled {
    stream: TcpStream,
    how: &'static str,
}

/// `n` connections of each kind: no TLS at all, a TLS record begun (its
/// header, then nothing), a full ClientHello then silence (the server
/// answers and waits for the client's Finished).
async fn stall(port: u16, n: usize) -> Vec<Stalled> {
    let hello = {
        let config =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
        let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let mut client = rustls::ClientConnection::new(Arc::new(config), name).expect("a TLS client");
        let mut hello = Vec::new();
        client.write_tls(&mut hello).expect("a ClientHello");
        hello
    };
    let mut stalled = Vec::new();
    for (how, first) in [
        ("no TLS", Vec::new()),
        ("a begun TLS record", vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01]),
        ("a ClientHello", hello),
    ] {
        for _ in 0..n {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connecting");
            stream.write_all(&first).await.expect("writing");
            stalled.push(Stalled { stream, how });
        }
    }
    stalled
}

/// Whether the server still holds `stream` open: no EOF, no reset (what
/// it sent, its side of a handshake, is read and dropped).
fn still_open(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match stream.try_read(&mut buf) {
            Ok(0) => return false,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// Waits until the server closes `stream`; false if it is still open after `patience`.
async fn closed(stream: &mut TcpStream, patience: Duration) -> bool {
    tokio::time::timeout(patience, async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_are_closed_after_the_timeout_and_reviews_answered_meanwhile() {
    // Short for the test (production waits 10 s); long enough for the test's
    // own handshakes on a busy machine.
    const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
    let env = TestEnv::new("webhook-stalls").await;
    let timeout_flag = format!("--webhook-handshake-timeout={}", HANDSHAKE_TIMEOUT.as_secs());
    let webhook = Webhook::start(&env, &[&timeout_flag]).await;

    let timed_out_before = webhook.refused("handshake_timeout").await;
    // Before the first connection: the server's timer for each starts later.
    let opened = Instant::now();
    // 3 × 70: a few hundred, within the 256 connections a replica serves.
    let mut stalled = stall(webhook.port, 70).await;
    let asked = Instant::now();
    let review = webhook.review().await;
    let answered_in = asked.elapsed();
    let open = stalled.iter().filter(|s| still_open(&s.stream)).count();
    let within_timeout = opened.elapsed() < HANDSHAKE_TIMEOUT;
    println!(
        "{} stalled connections: a review answered in {answered_in:?} ({}); {open} still open {:?} after the first was opened",
        stalled.len(),
        if review.is_ok() {
            "its verdict"
        } else {
            "not answered"
        },
        opened.elapsed()
    );
    review.expect("a review answered while the stalled connections are held");
    // Their timeout cannot have struck yet: the server held every one.
    if within_timeout {
        assert_eq!(
            open,
            stalled.len(),
            "stalled connections closed before their timeout"
        );
    }

    // Every one is closed after the handshake timeout (slack for a busy machine).
    let mut still = Vec::new();
    for s in &mut stalled {
        if !closed(&mut s.stream, HANDSHAKE_TIMEOUT + PATIENCE).await {
            still.push(s.how);
        }
    }
    println!(
        "all closed {:?} after the first was opened (handshake timeout {HANDSHAKE_TIMEOUT:?})",
        opened.elapsed()
    );
    assert!(still.is_empty(), "still open: {still:?}");
    let total = timed_out_before + stalled.len() as f64;
    assert_eq!(webhook.counted("handshake_timeout", total).await, total);
    assert_eq!(webhook.refused("too_many_connections").await, 0.0);
    webhook.review().await.expect("a review answered after");
    drop(webhook);
    env.cleanup().await;
}

/// The component renders over the base, lets only an ipBlock reach the
/// webhook port of nodewarden's pods and everyone the metrics port, and
/// passes a server-side dry run.
#[tokio::test]
async fn the_network_policy_component_renders_and_passes_a_dry_run() {
    use support::manifests::{Applied, apply, find, kustomize, to_object};
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let overlay = repo.join("target/kustomize-networkpolicy");
    std::fs::create_dir_all(&overlay).expect("an overlay dir");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "resources: [../../manifests/base]\ncomponents: [../../manifests/networkpolicy]\n",
    )
    .expect("writing the overlay");
    let docs = kustomize(&overlay);
    let policy = find(&docs, "NetworkPolicy", "nodewarden").clone();
    let pods = &find(&docs, "Deployment", "nodewarden")["spec"]["template"];
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"], pods["metadata"]["labels"],
        "the policy selects nodewarden's pods"
    );
    let ports: Vec<&str> = pods["spec"]["containers"][0]["ports"]
        .as_array()
        .expect("container ports")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    let ingress = policy["spec"]["ingress"].as_array().expect("ingress rules");
    let rule = |port: &str| {
        assert!(
            ports.contains(&port),
            "the container has no port {port}: {ports:?}"
        );
        ingress
            .iter()
            .find(|r| {
                r["ports"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["port"] == port))
            })
            .unwrap_or_else(|| panic!("no rule for port {port}: {policy}"))
    };
    let webhook = rule("webhook");
    let sources = webhook["from"].as_array().expect("the webhook port's sources");
    assert!(
        !sources.is_empty() && sources.iter().all(|s| s["ipBlock"]["cidr"].is_string()),
        "only address ranges reach the webhook: {webhook}"
    );
    assert!(
        rule("metrics")["from"].is_null(),
        "the metrics port admits any source"
    );

    let env = TestEnv::new("networkpolicy").await;
    // Its namespace, for real (idempotent), so the policy can be dry-run into it.
    let namespace = find(&docs, "Namespace", SYSTEM_NAMESPACE).clone();
    let applied = apply(&env.client, &to_object("networkpolicy", 0, namespace), false).await;
    assert!(matches!(applied, Ok(Applied::Done(_))), "creating the namespace");
    match apply(&env.client, &to_object("networkpolicy", 1, policy), true).await {
        Ok(Applied::Done(_)) => {}
        Ok(Applied::NotServed(e)) | Err(e) => panic!("the NetworkPolicy fails a dry run: {e}"),
    }
    env.cleanup().await;
}
