//! A real etcd cluster of the pinned etcd binary (the one the control plane
//! runs): one process per member, each on a loopback address of its own
//! (127.0.0.x), so that a member's peer URL names the node it stands for, as
//! on a kubeadm control plane. Members are added the way `kubeadm join`
//! adds them: `member add`, then the new process with
//! `--initial-cluster-state existing`. Every process is killed on drop.

use std::collections::BTreeMap;
use std::net::{IpAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use super::{Probe, control_plane, wait_for};

/// One member's process and where it listens.
struct Process {
    name: String,
    /// The advertised client URL (HTTPS on a TLS cluster).
    client_url: String,
    /// Plain HTTP, not advertised: where the harness itself lists, adds
    /// and checks members (the same as `client_url` without TLS).
    admin_url: String,
    peer_url: String,
    data_dir: PathBuf,
    child: Option<Child>,
}

/// The cluster: its members by IP.
pub struct EtcdCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    token: String,
    members: Mutex<BTreeMap<IpAddr, Process>>,
    /// Client URLs over HTTPS, clients held to a certificate of the CA.
    pub tls: Option<Tls>,
    /// Every member's client port (None: a free one each).
    client_port: Option<u16>,
}

/// How [`EtcdCluster::start_with_options`] starts the cluster.
#[derive(Clone, Debug, Default)]
pub struct EtcdOptions {
    /// Clients over HTTPS with certificates (see [`Tls`]), the serving one
    /// for these IPs (the initial members' and those that will join).
    pub tls_for: Option<Vec<IpAddr>>,
    /// Every member's client port, as kubeadm's 2379 on each node's IP
    /// (None: a free one each).
    pub client_port: Option<u16>,
}

/// A CA, etcd's serving certificate (for the members' IPs) and a client
/// certificate, as PEM files.
#[derive(Clone, Debug)]
pub struct Tls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Tls {
    /// New certificates in `dir`, the serving one for `ips`.
    pub fn generate(dir: &std::path::Path, ips: &[IpAddr]) -> Tls {
        use rcgen::{
            BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType,
        };
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).expect("a CA");
        let issuer = Issuer::from_params(&ca, ca_key);
        let leaf = |purposes: Vec<ExtendedKeyUsagePurpose>, name: &str| {
            let mut params = CertificateParams::new(vec![name.to_string()]).expect("params");
            params
                .subject_alt_names
                .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
            params.extended_key_usages = purposes;
            let key = KeyPair::generate().expect("a key");
            let cert = params.signed_by(&key, &issuer).expect("a certificate");
            (cert.pem(), key.serialize_pem())
        };
        // Serving and client use, as kubeadm's: etcd's JSON gateway dials
        // etcd itself with it.
        let (server, server_key) = leaf(
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            "etcd",
        );
        let (client, client_key) = leaf(vec![ExtendedKeyUsagePurpose::ClientAuth], "nodewarden");
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).expect("writing a PEM file");
            path
        };
        Tls {
            ca: write("ca.crt", &ca_cert.pem()),
            server_cert: write("server.crt", &server),
            server_key: write("server.key", &server_key),
            client_cert: write("client.crt", &client),
            client_key: write("client.key", &client_key),
        }
    }

    /// The control plane's etcd PKI as kubeadm lays it out in `dir`
    /// (`ca.crt`, `peer.crt`, `peer.key`: the client certificate here).
    pub fn write_pki(&self, dir: &std::path::Path) {
        std::fs::create_dir_all(dir).expect("a PKI dir");
        for (from, to) in [
            (&self.ca, "ca.crt"),
            (&self.client_cert, "peer.crt"),
            (&self.client_key, "peer.key"),
        ] {
            std::fs::copy(from, dir.join(to)).expect("copying a PEM file");
        }
    }

    /// nodewarden's etcd settings for `endpoints` with the client certificate.
    pub fn config(&self, endpoints: Vec<String>) -> nodewarden::etcd::EtcdConfig {
        nodewarden::etcd::EtcdConfig {
            endpoints,
            ca: Some(self.ca.clone()),
            cert: Some(self.client_cert.clone()),
            key: Some(self.client_key.clone()),
            ..Default::default()
        }
    }
}

/// A port free on `ip` now (etcd binds it a moment later; nothing else
/// binds the 127.0.0.x addresses a test owns).
fn free_port(ip: IpAddr) -> u16 {
    TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on a loopback address")
}

/// One exchange with etcd within 5 s: the status and the JSON answer.
async fn exchange(request: http::Request<Full<Bytes>>) -> Result<(http::StatusCode, Value), String> {
    let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let exchange = async {
        let response = client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        Ok((status, value))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
}

/// POSTs JSON to etcd's v3 gateway: the answer, or why not.
pub async fn post(url: &str, body: Value) -> Result<Value, String> {
    let request = http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    match exchange(request).await? {
        (status, value) if status.is_success() => Ok(value),
        (status, value) => Err(format!("{status}: {value}")),
    }
}

/// GET `{client_url}/health` says healthy.
async fn healthy(client_url: &str) -> Result<(), String> {
    let request = http::Request::get(format!("{client_url}/health"))
        .body(Full::default())
        .map_err(|e| e.to_string())?;
    match exchange(request).await? {
        (_, value) if value["health"] == "true" => Ok(()),
        (_, value) => Err(value.to_string()),
    }
}

/// A member as the member list shows it: (name, peer URL's IP, client URLs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    pub id: String,
    pub name: String,
    pub ip: Option<IpAddr>,
    pub client_urls: Vec<String>,
}

impl EtcdCluster {
    /// Starts a member named `name` on each `(name, ip)` and waits until
    /// all are healthy.
    pub async fn start(members: &[(String, IpAddr)]) -> EtcdCluster {
        EtcdCluster::start_with(members, false).await
    }

    /// As [`EtcdCluster::start`], clients over HTTPS with certificates
    /// (see [`Tls`]); the peers still talk plain HTTP.
    pub async fn start_with(members: &[(String, IpAddr)], tls: bool) -> EtcdCluster {
        let ips: Vec<IpAddr> = members.iter().map(|(_, ip)| *ip).collect();
        let options = EtcdOptions {
            tls_for: tls.then_some(ips),
            client_port: None,
        };
        EtcdCluster::start_with_options(members, options).await
    }

    /// As [`EtcdCluster::start`], as `options` say.
    pub async fn start_with_options(members: &[(String, IpAddr)], options: EtcdOptions) -> EtcdCluster {
        let bin_dir = std::fs::read_to_string(control_plane().run_dir.join("bin-dir"))
            .expect("the control plane's bin-dir");
        let dir = tempfile::tempdir().expect("a temp dir");
        let cluster = EtcdCluster {
            bin: PathBuf::from(bin_dir.trim()).join("etcd"),
            tls: options.tls_for.as_ref().map(|ips| Tls::generate(dir.path(), ips)),
            dir,
            token: format!("t-{:08x}", rand::random::<u32>()),
            members: Mutex::new(BTreeMap::new()),
            client_port: options.client_port,
        };
        let planned: Vec<Process> = members.iter().map(|(name, ip)| cluster.plan(name, *ip)).collect();
        let initial: Vec<String> = planned
            .iter()
            .map(|p| format!("{}={}", p.name, p.peer_url))
            .collect();
        let mut all = cluster.members.lock().await;
        for (mut p, (_, ip)) in planned.into_iter().zip(members) {
            p.child = Some(cluster.spawn(&p, &initial.join(","), "new"));
            all.insert(*ip, p);
        }
        let urls: Vec<String> = all.values().map(|p| p.client_url.clone()).collect();
        drop(all);
        for url in urls {
            cluster.wait_healthy(&url).await;
        }
        cluster
    }

    /// Waits until the member at `client_url` answers healthy (over TLS,
    /// through nodewarden's own client).
    async fn wait_healthy(&self, client_url: &str) {
        let Some(tls) = &self.tls else {
            return wait_healthy(client_url).await;
        };
        let client = nodewarden::etcd::EtcdClient::new(tls.config(vec![client_url.to_string()]))
            .expect("an etcd client");
        let member = nodewarden::etcd::Member {
            client_urls: vec![client_url.to_string()],
            ..Default::default()
        };
        wait_for(
            &format!("etcd at {client_url} healthy"),
            Duration::from_secs(30),
            || async {
                match client.health(&member).await {
                    nodewarden::etcd::Health::Healthy => Probe::Done(()),
                    nodewarden::etcd::Health::Unhealthy(why) => Probe::NotYet(why),
                }
            },
        )
        .await;
    }

    fn plan(&self, name: &str, ip: IpAddr) -> Process {
        let port = self.client_port.unwrap_or_else(|| free_port(ip));
        let (client_url, admin_url) = match self.tls {
            Some(_) => (
                format!("https://{ip}:{port}"),
                format!("http://{ip}:{}", free_port(ip)),
            ),
            None => (format!("http://{ip}:{port}"), format!("http://{ip}:{port}")),
        };
        Process {
            name: name.to_string(),
            client_url,
            admin_url,
            peer_url: format!("http://{ip}:{}", free_port(ip)),
            data_dir: self.dir.path().join(name),
            child: None,
        }
    }

    fn spawn(&self, p: &Process, initial_cluster: &str, state: &str) -> Child {
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", p.name))).expect("a log file");
        let mut command = Command::new(&self.bin);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        command
            .args(["--name", &p.name])
            .arg("--data-dir")
            .arg(&p.data_dir)
            .arg("--listen-client-urls")
            .arg(if p.admin_url == p.client_url {
                p.client_url.clone()
            } else {
                format!("{},{}", p.client_url, p.admin_url)
            })
            .args(["--advertise-client-urls", &p.client_url])
            .args(["--listen-peer-urls", &p.peer_url])
            .args(["--initial-advertise-peer-urls", &p.peer_url])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args(["--log-level", "warn", "--unsafe-no-fsync"])
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("starting etcd")
    }

    /// The client URLs of the members started so far.
    pub async fn client_urls(&self) -> Vec<String> {
        self.members
            .lock()
            .await
            .values()
            .map(|p| p.client_url.clone())
            .collect()
    }

    /// Whether a member was ever started on `ip`.
    pub async fn has(&self, ip: IpAddr) -> bool {
        self.members.lock().await.contains_key(&ip)
    }

    /// The harness's own plain-HTTP URLs of the members started so far.
    async fn admin_urls(&self) -> Vec<String> {
        self.members
            .lock()
            .await
            .values()
            .map(|p| p.admin_url.clone())
            .collect()
    }

    /// The member list, from the first member that answers.
    pub async fn list(&self) -> Result<Vec<Listed>, String> {
        let mut failures = Vec::new();
        for url in self.admin_urls().await {
            match post(
                &format!("{url}/v3/cluster/member/list"),
                json!({"linearizable": true}),
            )
            .await
            {
                Ok(answer) => return Ok(listed(&answer)),
                Err(e) => failures.push(format!("{url}: {e}")),
            }
        }
        Err(failures.join("; "))
    }

    /// What `kubeadm join` does for a new control-plane node: adds a member
    /// on `ip`, starts it, waits until it is healthy. Err: etcd refused the
    /// add (it does while too few members are up); nothing was started.
    pub async fn join(&self, name: &str, ip: IpAddr) -> Result<(), String> {
        let mut p = self.plan(name, ip);
        let mut failures = Vec::new();
        let mut answer = None;
        for url in self.admin_urls().await {
            match post(
                &format!("{url}/v3/cluster/member/add"),
                json!({"peerURLs": [p.peer_url]}),
            )
            .await
            {
                Ok(a) => {
                    answer = Some(a);
                    break;
                }
                Err(e) => failures.push(format!("{url}: {e}")),
            }
        }
        let answer = answer.ok_or_else(|| format!("member add for {name}: {}", failures.join("; ")))?;
        // Every member the answer lists: started ones by name, the new one as `name`.
        let initial: Vec<String> = listed(&answer)
            .iter()
            .filter_map(|m| {
                let peer = answer["members"]
                    .as_array()?
                    .iter()
                    .find(|w| w["ID"].as_str() == Some(m.id.as_str()))?["peerURLs"][0]
                    .as_str()?
                    .to_string();
                match (m.name.is_empty(), peer == p.peer_url) {
                    (_, true) => Some(format!("{name}={peer}")),
                    (false, false) => Some(format!("{}={peer}", m.name)),
                    // Another member added and not started yet: not ours to name.
                    (true, false) => None,
                }
            })
            .collect();
        p.child = Some(self.spawn(&p, &initial.join(","), "existing"));
        let url = p.client_url.clone();
        self.members.lock().await.insert(ip, p);
        self.wait_healthy(&url).await;
        Ok(())
    }

    /// kill -9 the member on `ip`.
    pub async fn kill(&self, ip: IpAddr) {
        let mut all = self.members.lock().await;
        if let Some(child) = all.get_mut(&ip).and_then(|p| p.child.as_mut()) {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts the member on `ip` again on its data (after [`EtcdCluster::kill`]).
    pub async fn restart(&self, ip: IpAddr) {
        let mut all = self.members.lock().await;
        let p = all.get_mut(&ip).expect("a member on that IP");
        // With its data dir in place etcd ignores the initial-cluster flags.
        let child = self.spawn(p, &format!("{}={}", p.name, p.peer_url), "existing");
        p.child = Some(child);
        let url = p.client_url.clone();
        drop(all);
        self.wait_healthy(&url).await;
    }

    /// The member's name on `ip`.
    pub async fn name_on(&self, ip: IpAddr) -> Option<String> {
        self.members.lock().await.get(&ip).map(|p| p.name.clone())
    }
}

/// The members of a gateway answer (member list or member add).
fn listed(answer: &Value) -> Vec<Listed> {
    answer["members"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| Listed {
                    id: m["ID"].as_str().unwrap_or_default().to_string(),
                    name: m["name"].as_str().unwrap_or_default().to_string(),
                    ip: m["peerURLs"][0]
                        .as_str()
                        .and_then(nodewarden::etcd::rules::url_ip),
                    client_urls: m["clientURLs"]
                        .as_array()
                        .map(|u| u.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                        .unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_healthy(client_url: &str) {
    wait_for(
        &format!("etcd at {client_url} healthy"),
        Duration::from_secs(30),
        || async {
            match healthy(client_url).await {
                Ok(()) => Probe::Done(()),
                Err(e) => Probe::NotYet(e),
            }
        },
    )
    .await;
}
