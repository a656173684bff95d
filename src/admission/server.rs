//! The webhook's HTTPS endpoint and its certificate keeper (IO; the
//! decisions are [`super::rules`], the limits every client is held to
//! [`super::limits`]).

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionReview, Operation};
use kube::{Client, ResourceExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::certs::{self, CertBundle};
use super::limits::{self, Limits, Refusal};
use super::metrics::{WebhookMetrics, WebhookRefusal};
use super::review::{self, Reviewed};
use super::rules::{self, ControlPlane, EtcdPlacement, MaintenanceCreate, Requester};
use super::{AdmissionConfig, CertSource};
use crate::api::node_maintenance::{DRAIN_FOR_LABEL, MaintenanceObject, MaintenancePhase, kubevirt, medik8s};
use crate::api::update::NodeVersion;
use crate::http::conn::{self, Slots, Timeout};
use crate::runtime::leader::LeaderHandle;

/// The serving certificate in use; swapped when the Secret changes.
#[derive(Debug, Default)]
pub struct CertResolver(RwLock<Option<(String, Arc<CertifiedKey>)>>);

impl CertResolver {
    /// Serves this certificate (PEM chain) and key from now on; false when
    /// it is served already.
    pub fn load(&self, tls_cert: &str, tls_key: &str) -> Result<bool, String> {
        let current = self.0.read().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|(pem, _)| pem == tls_cert) {
            return Ok(false);
        }
        drop(current);
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(tls_cert.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| format!("the serving certificate: {e}"))?;
        let key =
            PrivateKeyDer::from_pem_slice(tls_key.as_bytes()).map_err(|e| format!("the serving key: {e}"))?;
        let key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| format!("the serving key: {e}"))?;
        let certified = Arc::new(CertifiedKey::new(chain, key));
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Some((tls_cert.to_string(), certified));
        Ok(true)
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, k)| k.clone())
    }
}

/// Serves the webhook on `config.addr` until `stop`: TLS with the
/// resolver's certificate (connections before the first load fail their
/// handshake, and the API server retries), every connection and review held
/// to `limits`, each refusal counted in `metrics`.
pub async fn serve(
    client: Client,
    config: AdmissionConfig,
    limits: Limits,
    metrics: WebhookMetrics,
    resolver: Arc<CertResolver>,
    stop: CancellationToken,
) {
    let listener = match TcpListener::bind(config.addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(addr = %config.addr, error = %e, "cannot serve the admission webhook");
            return;
        }
    };
    serve_on(listener, client, config, limits, metrics, resolver, stop).await;
}

/// [`serve`] on a bound listener.
async fn serve_on(
    listener: TcpListener,
    client: Client,
    config: AdmissionConfig,
    limits: Limits,
    metrics: WebhookMetrics,
    resolver: Arc<CertResolver>,
    stop: CancellationToken,
) {
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_no_client_auth().with_cert_resolver(resolver));
    let mut tls = match tls {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot configure the webhook's TLS");
            return;
        }
    };
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    metrics.serving();
    let webhook = Arc::new(Webhook {
        client,
        node_selector: config.node_selector.clone(),
        etcd: config.etcd,
        limits,
        reviews: Arc::new(Semaphore::new(limits.max_in_flight)),
        metrics,
    });
    let slots = Slots::new(limits.conn.max_connections);
    let addr = listener.local_addr().unwrap_or(config.addr);
    tracing::info!(%addr, ?limits, "serving the admission webhook");
    while let Some(stream) = conn::accept(&listener, &stop).await {
        let Some(slot) = slots.take() else {
            // Dropped: closed at once, not queued.
            webhook.refused(WebhookRefusal::TooManyConnections);
            continue;
        };
        let (acceptor, webhook) = (acceptor.clone(), webhook.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let stream = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "webhook TLS handshake failed");
                    return;
                }
                Err(_) => {
                    webhook.refused(WebhookRefusal::HandshakeTimeout);
                    return;
                }
            };
            webhook.serve_connection(stream).await;
        });
    }
}

/// What answering reviews needs, shared by every connection.
struct Webhook {
    client: Client,
    node_selector: Option<String>,
    etcd: EtcdPlacement,
    limits: Limits,
    /// One permit per review in progress.
    reviews: Arc<Semaphore>,
    metrics: WebhookMetrics,
}

impl Webhook {
    fn refused(&self, reason: WebhookRefusal) {
        tracing::debug!(
            reason = reason.as_str(),
            "webhook refused a connection or request"
        );
        self.metrics.count(reason);
    }

    /// Answers the requests of one connection until it ends.
    async fn serve_connection<S>(self: Arc<Self>, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        // A header timeout after an answer is an idle connection closed,
        // not a request refused.
        let answered = Arc::new(AtomicBool::new(false));
        let (webhook, seen) = (self.clone(), answered.clone());
        let service = service_fn(move |req| {
            let (webhook, seen) = (webhook.clone(), seen.clone());
            async move {
                let response = webhook.answer(req).await;
                seen.store(true, Ordering::Relaxed);
                Ok::<_, Infallible>(response)
            }
        });
        let conn = self.limits.conn;
        if let Err(e) = conn.http1().serve_connection(conn.io(stream), service).await {
            match conn::timed_out(&e) {
                Some(Timeout::HeaderRead) if !answered.load(Ordering::Relaxed) => {
                    self.refused(WebhookRefusal::HeaderTimeout)
                }
                Some(Timeout::Write) => self.refused(WebhookRefusal::WriteTimeout),
                _ => tracing::debug!(error = %e, "webhook connection ended with an error"),
            }
        }
    }

    /// One request in, one answer out: the review's verdict, or why not.
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let timeout = self.limits.request_timeout;
        let answered = match tokio::time::timeout(timeout, self.review(req)).await {
            Ok(answered) => answered,
            Err(_) => Err(Refusal::RequestTimeout(timeout)),
        };
        match answered {
            Ok(review) => match serde_json::to_vec(&review) {
                Ok(b) => json_response(StatusCode::OK, b),
                Err(e) => text_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            },
            Err(refusal) => {
                self.refused(refusal.reason());
                let mut response = text_response(refusal.status(), refusal.to_string());
                if matches!(refusal, Refusal::Busy { .. }) {
                    response
                        .headers_mut()
                        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                }
                response
            }
        }
    }

    /// Reads the review (a declared length over the limit is refused before
    /// anything else, the body read within its limits) and decides it.
    async fn review(&self, req: Request<Incoming>) -> Result<AdmissionReview<DynamicObject>, Refusal> {
        let limit = self.limits.max_body_bytes;
        let body = req.into_body();
        limits::check_declared(&body, limit)?;
        let _permit = self.reviews.try_acquire().map_err(|_| Refusal::Busy {
            max: self.limits.max_in_flight,
        })?;
        let bytes = tokio::time::timeout(self.limits.body_timeout, limits::read_body(body, limit))
            .await
            .map_err(|_| Refusal::BodyTimeout(self.limits.body_timeout))??;
        let review = review::parse(&bytes)?;
        drop(bytes);
        let verdict = decide(self, &review.request).await;
        if let Err(message) = &verdict {
            let request = &review.request;
            tracing::info!(kind = %request.kind.kind, name = %request.name, %message, "admission denied");
        }
        Ok(review.answer(verdict))
    }
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    response(status, "application/json", body)
}

fn text_response(status: StatusCode, text: String) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", text.into_bytes())
}

fn response(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    response
}

/// What the rules say of one request, after the reads they need.
async fn decide(webhook: &Webhook, req: &review::Request) -> Result<(), String> {
    let client = &webhook.client;
    let (object, old) = (req.object.as_ref(), req.old_object.as_ref());
    match (req.kind.kind.as_str(), &req.operation) {
        ("NodeMaintenance", Operation::Create) => {
            let requester = Requester::from_label(Reviewed::label(object, DRAIN_FOR_LABEL));
            maintenance_create(webhook, &req.name, Reviewed::node_name(object), requester).await
        }
        ("NodeMaintenance", Operation::Update) => {
            rules::maintenance_update(Reviewed::node_name(old), Reviewed::node_name(object))
        }
        ("ScalingGroup", Operation::Create | Operation::Update) => {
            let nv = Reviewed::node_image(object);
            let exists = Api::<NodeVersion>::all(client.clone())
                .get_opt(nv)
                .await
                .map_err(|e| format!("cannot check spec.nodeImage now: {e}"))?
                .is_some();
            rules::scaling_group(nv, exists)
        }
        _ => Ok(()),
    }
}

const CONTROL_PLANE_LABELS: [&str; 2] = [
    "node-role.kubernetes.io/control-plane",
    "node-role.kubernetes.io/master",
];

fn is_control_plane(node: &Node) -> bool {
    CONTROL_PLANE_LABELS
        .iter()
        .any(|l| node.labels().contains_key(*l))
}

/// (name, node, phase, being deleted) of every NodeMaintenance of one group.
async fn list_group<M: MaintenanceObject>(
    client: &Client,
) -> Result<Vec<(String, String, Option<MaintenancePhase>, bool)>, String> {
    let list = Api::<M>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("cannot list NodeMaintenances now: {e}"))?;
    Ok(list
        .items
        .iter()
        .map(|m| {
            (
                m.name_any(),
                m.node_name().to_string(),
                m.maintenance_status().and_then(|s| s.phase),
                m.meta().deletion_timestamp.is_some(),
            )
        })
        .collect())
}

/// (node name, not failed) of every NodeMaintenance not being deleted, both groups.
async fn maintenances(client: &Client, except: &str) -> Result<Vec<(String, bool)>, String> {
    let mut all = list_group::<medik8s::NodeMaintenance>(client).await?;
    all.extend(list_group::<kubevirt::NodeMaintenance>(client).await?);
    Ok(all
        .into_iter()
        .filter(|(name, _, _, deleting)| !deleting && (except.is_empty() || name != except))
        .map(|(_, node, phase, _)| (node, phase != Some(MaintenancePhase::Failed)))
        .collect())
}

async fn maintenance_create(
    webhook: &Webhook,
    name: &str,
    node_name: &str,
    requester: Requester,
) -> Result<(), String> {
    let (client, node_selector) = (&webhook.client, webhook.node_selector.as_deref());
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .get_opt(node_name)
        .await
        .map_err(|e| format!("cannot check spec.nodeName now: {e}"))?;
    let others = maintenances(client, name).await?;
    let existing: Vec<String> = others
        .iter()
        .filter(|(n, _)| n == node_name)
        .map(|(n, _)| n.clone())
        .collect();
    let control_plane = match node.as_ref().filter(|n| is_control_plane(n)) {
        None => None,
        Some(_) => {
            let in_maintenance: BTreeSet<&str> = others
                .iter()
                .filter(|(_, active)| *active)
                .map(|(n, _)| n.as_str())
                .collect();
            let mut params = ListParams::default();
            if let Some(selector) = node_selector {
                params = params.labels(selector);
            }
            let all = nodes
                .list(&params)
                .await
                .map_err(|e| format!("cannot list the control-plane nodes now: {e}"))?;
            let control_plane: Vec<&Node> = all.items.iter().filter(|n| is_control_plane(n)).collect();
            let names = control_plane.iter().map(|n| n.name_any()).collect();
            let pods = crate::etcd::placement::static_etcd_pods_for(client, webhook.etcd)
                .await
                .map_err(|e| format!("cannot list the etcd pods now: {e}"))?;
            Some(ControlPlane {
                members: rules::etcd_members(webhook.etcd, &names, &pods),
                available: control_plane
                    .iter()
                    .filter(|n| {
                        crate::node::node_is_ready(n) && !in_maintenance.contains(n.name_any().as_str())
                    })
                    .map(|n| n.name_any())
                    .collect(),
            })
        }
    };
    rules::maintenance_create(&MaintenanceCreate {
        node_name,
        requester,
        node_exists: node.is_some(),
        existing: &existing,
        control_plane: control_plane.as_ref(),
    })
}

/// Keeps the certificates current on every replica until `stop`: the
/// Secret made when missing (the first writer wins, the others read its
/// result), renewed by the leader when due, served as soon as it changes;
/// every replica also keeps the configuration's caBundle equal to the CA
/// (a reinstalled configuration comes back empty, and the leader may be a
/// full lease away).
pub async fn keep_certificates(
    client: Client,
    config: AdmissionConfig,
    resolver: Arc<CertResolver>,
    leader: LeaderHandle,
    stop: CancellationToken,
) {
    let mut leading = leader.subscribe();
    loop {
        // Twice at most: a replica that lost the race to create the Secret
        // serves the winner's certificate at once.
        for _ in 0..2 {
            match keep_once(&client, &config, &resolver, &leader).await {
                Ok(Kept::Done) => break,
                Ok(Kept::ReadAgain) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "keeping the webhook's certificates");
                    break;
                }
            }
        }
        // Again after `refresh`, or at once when leadership changes (a new
        // leader checks the renewal without waiting).
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.refresh) => {}
            changed = leading.changed() => if changed.is_err() { return },
        }
    }
}

/// What one round of [`keep_certificates`] came to.
enum Kept {
    /// The certificate in the Secret is served and the caBundle is its CA.
    Done,
    /// Another replica wrote the Secret or the configuration first: read again.
    ReadAgain,
}

async fn keep_once(
    client: &Client,
    config: &AdmissionConfig,
    resolver: &CertResolver,
    leader: &LeaderHandle,
) -> Result<Kept, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &config.namespace);
    let found = secrets
        .get_opt(&config.secret)
        .await
        .map_err(|e| format!("reading Secret {}: {e}", config.secret))?;
    if config.certificates == CertSource::CertManager {
        return serve_cert_managers(found.as_ref(), config, resolver);
    }
    let Some((bundle, version)) = own_bundle(&secrets, config, leader, found).await? else {
        return Ok(Kept::ReadAgain);
    };
    if resolver.load(&bundle.tls_cert, &bundle.tls_key)? {
        tracing::info!(not_after = %bundle.not_after, "serving the webhook's certificate");
    }
    let served = Served {
        secrets: &secrets,
        name: &config.secret,
        version: version.as_deref(),
    };
    ensure_ca_bundle(client, &config.webhook_configuration, &bundle.ca_cert, &served).await
}

/// Serves the certificate cert-manager wrote in the Secret (cert-manager
/// also injects the caBundle).
fn serve_cert_managers(
    found: Option<&Secret>,
    config: &AdmissionConfig,
    resolver: &CertResolver,
) -> Result<Kept, String> {
    let text = |k: &str| {
        found
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(k))
            .and_then(|v| String::from_utf8(v.0.clone()).ok())
    };
    let (Some(cert), Some(key)) = (text(certs::TLS_CERT), text(certs::TLS_KEY)) else {
        return Err(format!(
            "Secret {} has no tls.crt and tls.key yet (cert-manager writes them)",
            config.secret
        ));
    };
    if resolver.load(&cert, &key)? {
        tracing::info!(secret = %config.secret, "serving cert-manager's certificate");
    }
    Ok(Kept::Done)
}

/// The certificates nodewarden keeps itself: made when the Secret is
/// missing, or holds none (the chart and manifests/base make it empty),
/// renewed by the leader when due, else as found; with the Secret's
/// resourceVersion. None: another replica wrote the Secret first, read it
/// again.
async fn own_bundle(
    secrets: &Api<Secret>,
    config: &AdmissionConfig,
    leader: &LeaderHandle,
    found: Option<Secret>,
) -> Result<Option<(CertBundle, Option<String>)>, String> {
    let current = found.as_ref().and_then(|s| {
        let data = s
            .data
            .as_ref()?
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        CertBundle::from_secret(&data, s.metadata.annotations.as_ref()?)
    });
    let now = Timestamp::now();
    match (found, current) {
        (None, _) => {
            let made = certs::generate(&config.names, now).map_err(|e| e.to_string())?;
            match secrets
                .create(
                    &PostParams::default(),
                    &secret(config, &made, ObjectMeta::default()),
                )
                .await
            {
                Ok(made_secret) => {
                    tracing::info!(secret = %config.secret, "made the webhook's CA and serving certificate");
                    Ok(Some((made, made_secret.metadata.resource_version)))
                }
                // Another replica made it first: serve its certificate.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
                Err(e) => Err(format!("creating Secret {}: {e}", config.secret)),
            }
        }
        // Filled by whichever replica gets there first, as a missing one is
        // made (the write is conditioned on the resourceVersion read);
        // renewed by the leader.
        (Some(s), current)
            if current
                .as_ref()
                .is_none_or(|b| leader.is_leader() && certs::needs_renewal(b.not_after, now)) =>
        {
            let next = match &current {
                Some(b) => certs::renew(b, &config.names, now),
                None => certs::generate(&config.names, now),
            }
            .map_err(|e| e.to_string())?;
            match secrets
                .replace(
                    &config.secret,
                    &PostParams::default(),
                    &secret(config, &next, s.metadata),
                )
                .await
            {
                Ok(written) => {
                    match current {
                        Some(_) => {
                            tracing::info!(secret = %config.secret, not_after = %next.not_after, "renewed the webhook's serving certificate")
                        }
                        None => {
                            tracing::info!(secret = %config.secret, "wrote the webhook's CA and serving certificate")
                        }
                    }
                    Ok(Some((next, written.metadata.resource_version)))
                }
                // Another replica wrote it first: serve its certificate.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
                Err(e) => Err(format!("writing Secret {}: {e}", config.secret)),
            }
        }
        // Certificates found (the guard above takes a Secret without them).
        (Some(s), Some(b)) => Ok(Some((b, s.metadata.resource_version))),
        (Some(_), None) => Ok(None),
    }
}

/// The Secret holding `bundle`, written over `found`: the metadata read
/// (labels, annotations, owner references and the resourceVersion the
/// write is conditioned on) is kept, so a Secret someone else made (the Helm
/// chart makes it empty, to delete it on uninstall) stays theirs.
fn secret(config: &AdmissionConfig, bundle: &CertBundle, found: ObjectMeta) -> Secret {
    let mut annotations = found.annotations.unwrap_or_default();
    annotations.insert(
        certs::NOT_AFTER_ANNOTATION.to_string(),
        bundle.not_after.to_string(),
    );
    let mut labels = found.labels.unwrap_or_default();
    labels.insert("app.kubernetes.io/name".to_string(), "nodewarden".to_string());
    Secret {
        metadata: ObjectMeta {
            name: Some(config.secret.clone()),
            namespace: Some(config.namespace.clone()),
            annotations: Some(annotations),
            labels: Some(labels),
            managed_fields: None,
            ..found
        },
        string_data: Some(bundle.to_data()),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// The Secret whose certificate a replica serves, as of the version read.
struct Served<'a> {
    secrets: &'a Api<Secret>,
    name: &'a str,
    version: Option<&'a str>,
}

impl Served<'_> {
    /// Whether the Secret is still the version served.
    async fn unchanged(&self) -> Result<bool, String> {
        let now = self
            .secrets
            .get_opt(self.name)
            .await
            .map_err(|e| format!("reading Secret {}: {e}", self.name))?;
        let version = now.and_then(|s| s.metadata.resource_version);
        Ok(version.is_some() && version.as_deref() == self.version)
    }
}

/// Sets every webhook's caBundle of the configuration `name` to `ca`, the
/// CA of the Secret `served` (a configuration not installed is left alone).
///
/// Every replica does, so none writes a CA the Secret no longer holds: the
/// write goes only while the Secret is still the version served, and is
/// conditioned on the configuration's version read before that check. A
/// replica that replaces the Secret after the check (the leader, with a
/// new CA) then rewrites the configuration too, so the stale write gets 409.
async fn ensure_ca_bundle(
    client: &Client,
    name: &str,
    ca: &str,
    served: &Served<'_>,
) -> Result<Kept, String> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let Some(mut vwc) = api
        .get_opt(name)
        .await
        .map_err(|e| format!("reading {name}: {e}"))?
    else {
        return Ok(Kept::Done);
    };
    let want = k8s_openapi::ByteString(ca.as_bytes().to_vec());
    let webhooks = vwc.webhooks.get_or_insert_with(Vec::new);
    if webhooks
        .iter()
        .all(|w| w.client_config.ca_bundle.as_ref() == Some(&want))
    {
        return Ok(Kept::Done);
    }
    if !served.unchanged().await? {
        return Ok(Kept::ReadAgain);
    }
    for w in webhooks.iter_mut() {
        w.client_config.ca_bundle = Some(want.clone());
    }
    match api.replace(name, &PostParams::default(), &vwc).await {
        Ok(_) => {
            tracing::info!(configuration = %name, "set the webhook configuration's caBundle");
            Ok(Kept::Done)
        }
        // Another replica wrote it first: read both again.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Kept::ReadAgain),
        Err(e) => Err(format!("setting the caBundle of {name}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::admission::ServingNames;

    /// A webhook on loopback held to `limits`, its API server at `api` (an
    /// address that never answers, or none), its certificate from a CA of
    /// its own.
    struct Served {
        addr: SocketAddr,
        tls: tokio_rustls::TlsConnector,
        metrics: WebhookMetrics,
        stop: CancellationToken,
    }

    impl Drop for Served {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    async fn start(limits: Limits, api: SocketAddr) -> Served {
        let names = ServingNames {
            dns: Vec::new(),
            ips: vec![std::net::Ipv4Addr::LOCALHOST.into()],
        };
        let bundle = certs::generate(&names, Timestamp::now()).expect("certificates");
        let resolver = Arc::new(CertResolver::default());
        resolver
            .load(&bundle.tls_cert, &bundle.tls_key)
            .expect("the serving certificate");
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(bundle.ca_cert.as_bytes()) {
            roots.add(ca.expect("the CA")).expect("a root");
        }
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let addr = listener.local_addr().expect("an address");
        let client = Client::try_from(kube::Config::new(format!("http://{api}").parse().expect("a URL")))
            .expect("a client");
        let config = AdmissionConfig::in_namespace(addr, "test");
        let (metrics, stop) = (
            WebhookMetrics::register(&crate::telemetry::Metrics::new()),
            CancellationToken::new(),
        );
        tokio::spawn(serve_on(
            listener,
            client,
            config,
            limits,
            metrics.clone(),
            resolver,
            stop.clone(),
        ));
        Served {
            addr,
            tls: tokio_rustls::TlsConnector::from(Arc::new(tls)),
            metrics,
            stop,
        }
    }

    /// An address that accepts connections and never answers: an API
    /// server that hangs.
    async fn silent_api() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding");
        let addr = listener.local_addr().expect("an address");
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        addr
    }

    const PATIENCE: Duration = Duration::from_secs(30);

    impl Served {
        async fn connect(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
            let tcp = TcpStream::connect(self.addr).await.expect("connecting");
            let name = rustls::pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
            self.tls.connect(name, tcp).await.expect("a TLS handshake")
        }

        /// Sends `head` (without its blank line) and `body`; the answer's
        /// status, headers and body, read until the server closes.
        async fn send(&self, head: &str, body: &[u8]) -> (u16, String) {
            let mut stream = self.connect().await;
            let request = [format!("{head}\r\nConnection: close\r\n\r\n").as_bytes(), body].concat();
            // The server may answer and close before taking the whole body.
            let _ = stream.write_all(&request).await;
            let mut raw = Vec::new();
            let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut raw))
                .await
                .expect("an answer");
            let text = String::from_utf8_lossy(&raw).to_string();
            let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            (status, text)
        }

        async fn post(&self, body: &[u8]) -> (u16, String) {
            let head = format!(
                "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}",
                body.len()
            );
            self.send(&head, body).await
        }

        fn refused(&self, reason: WebhookRefusal) -> u64 {
            self.metrics.refused(reason)
        }

        /// The count of `reason` once it reached `expected` (a connection
        /// is counted as its task ends, which may be just after the client
        /// saw it close), or what it is after [`PATIENCE`].
        async fn counted(&self, reason: WebhookRefusal, expected: u64) -> u64 {
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while self.refused(reason) < expected && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            self.refused(reason)
        }
    }

    /// A review the rules decide without a read: an UPDATE moving a
    /// NodeMaintenance to another node.
    fn moving_review() -> Vec<u8> {
        let object = |node: &str| serde_json::json!({"spec": {"nodeName": node}});
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "nodemaintenance.medik8s.io", "version": "v1beta1", "kind": "NodeMaintenance"},
                "name": "nm", "operation": "UPDATE",
                "object": object("b"), "oldObject": object("a"),
            }
        }))
        .expect("json")
    }

    fn small_limits() -> Limits {
        Limits {
            max_body_bytes: 64 * 1024,
            ..Limits::default()
        }
    }

    #[tokio::test]
    async fn a_review_is_answered_and_malformed_ones_are_refused() {
        let served = start(small_limits(), silent_api().await).await;
        let (status, answer) = served.post(&moving_review()).await;
        assert_eq!(status, 200, "{answer}");
        assert!(
            answer.contains("\"uid\":\"u-1\"") && answer.contains("\"allowed\":false"),
            "{answer}"
        );
        assert!(
            answer.contains("updating spec.NodeName isn't allowed"),
            "{answer}"
        );
        let deep = "[".repeat(20_000);
        for body in [
            &b""[..],
            b"not json",
            b"{\"apiVersion\":\"v1\",\"kind\":\"x\"}",
            deep.as_bytes(),
        ] {
            let (status, answer) = served.post(body).await;
            assert_eq!(status, 400, "{answer}");
            assert!(answer.contains("not an AdmissionReview"), "{answer}");
        }
        assert_eq!(served.refused(WebhookRefusal::BadRequest), 4);
        // Still serving.
        assert_eq!(served.post(&moving_review()).await.0, 200);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_is_refused_declared_or_not() {
        let served = start(small_limits(), silent_api().await).await;
        // Declared: refused before a byte of it is read.
        let head = "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 300000000";
        let (status, answer) = served.send(head, b"{").await;
        assert_eq!(status, 413, "{answer}");
        assert!(
            answer.contains("over the webhook's limit of 65536 bytes"),
            "{answer}"
        );
        // Undeclared (chunked): cut off once past the limit.
        let chunk = format!("{:x}\r\n{}\r\n", 32 * 1024, " ".repeat(32 * 1024));
        let body = chunk.repeat(10);
        let head = "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked";
        let (status, answer) = served.send(head, body.as_bytes()).await;
        assert_eq!(status, 413, "{answer}");
        assert_eq!(served.refused(WebhookRefusal::BodyTooLarge), 2);
        assert_eq!(served.post(&moving_review()).await.0, 200);
    }

    /// Sends a head whose body never arrives whole: its review holds a slot
    /// until the body timeout.
    async fn stall_a_body(served: &Served) -> tokio_rustls::client::TlsStream<TcpStream> {
        let mut stalled = served.connect().await;
        stalled
            .write_all(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
            .await
            .expect("writing");
        stalled
    }

    #[tokio::test]
    async fn reviews_past_the_cap_are_answered_429() {
        let limits = Limits {
            max_in_flight: 1,
            // Longer than the test: the stalled body holds the one slot.
            body_timeout: Duration::from_secs(300),
            ..small_limits()
        };
        let served = start(limits, silent_api().await).await;
        let _stalled = stall_a_body(&served).await;
        // Once the server has read the stalled head, every review is refused.
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let answer = loop {
            let (status, answer) = served.post(&moving_review()).await;
            if status == 429 {
                break answer;
            }
            assert_eq!(status, 200, "{answer}");
            assert!(tokio::time::Instant::now() < deadline, "no 429 in {PATIENCE:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(answer.to_ascii_lowercase().contains("retry-after: 1"), "{answer}");
        assert!(answer.contains("1 reviews are in progress"), "{answer}");
        assert_eq!(served.refused(WebhookRefusal::TooManyRequests), 1);
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_in_time_is_answered_408_and_frees_its_slot() {
        let limits = Limits {
            max_in_flight: 1,
            body_timeout: Duration::from_millis(500),
            ..small_limits()
        };
        let served = start(limits, silent_api().await).await;
        let mut stalled = stall_a_body(&served).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(PATIENCE, stalled.read_to_end(&mut answer))
            .await
            .expect("the stalled body is answered");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert_eq!(served.refused(WebhookRefusal::BodyTimeout), 1);
        // The one slot is free again.
        assert_eq!(served.post(&moving_review()).await.0, 200);
    }

    #[tokio::test]
    async fn a_review_the_api_server_leaves_hanging_is_answered_503_in_time() {
        let limits = Limits {
            request_timeout: Duration::from_millis(500),
            ..small_limits()
        };
        let served = start(limits, silent_api().await).await;
        // A CREATE needs reads, and the API server never answers them.
        let create = String::from_utf8(moving_review())
            .expect("utf-8")
            .replace("UPDATE", "CREATE");
        let (status, answer) = served.post(create.as_bytes()).await;
        assert_eq!(status, 503, "{answer}");
        assert!(answer.contains("the review took longer than 500ms"), "{answer}");
        assert_eq!(served.refused(WebhookRefusal::RequestTimeout), 1);
    }

    /// Waits until the server closes `stream`; panics after [`PATIENCE`].
    async fn closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) {
        let closed = tokio::time::timeout(PATIENCE, async {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "still open after {PATIENCE:?}");
    }

    #[tokio::test]
    async fn stalled_handshakes_and_heads_are_closed_and_counted() {
        // Long enough for the test's own handshakes and heads on a busy machine.
        let mut limits = small_limits();
        limits.handshake_timeout = Duration::from_secs(3);
        limits.conn.header_read_timeout = Duration::from_secs(2);
        let served = start(limits, silent_api().await).await;
        // No handshake at all, and one begun (a TLS record header) but not finished.
        let mut idle = TcpStream::connect(served.addr).await.expect("connecting");
        let mut begun = TcpStream::connect(served.addr).await.expect("connecting");
        begun
            .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
            .await
            .expect("writing");
        // Past the handshake, no request head.
        let mut headless = served.connect().await;
        // A request answered, then idle: closed, but not counted as refused.
        let mut kept = served.connect().await;
        let review = moving_review();
        let head = format!(
            "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n",
            review.len()
        );
        kept.write_all(&[head.as_bytes(), &review].concat())
            .await
            .expect("writing");
        closed(&mut idle).await;
        closed(&mut begun).await;
        closed(&mut headless).await;
        closed(&mut kept).await;
        assert_eq!(served.counted(WebhookRefusal::HandshakeTimeout, 2).await, 2);
        // The connection that was answered closed idle, not refused.
        assert_eq!(served.counted(WebhookRefusal::HeaderTimeout, 1).await, 1);
    }

    #[tokio::test]
    async fn a_connection_past_the_cap_is_closed_at_once_and_counted() {
        let mut limits = small_limits();
        limits.conn.max_connections = 2;
        let served = start(limits, silent_api().await).await;
        // Two connections hold both slots (the handshake timeout is 10 s).
        let _first = TcpStream::connect(served.addr).await.expect("connecting");
        let _second = TcpStream::connect(served.addr).await.expect("connecting");
        let mut third = TcpStream::connect(served.addr).await.expect("connecting");
        closed(&mut third).await;
        assert_eq!(served.counted(WebhookRefusal::TooManyConnections, 1).await, 1);
    }
}
