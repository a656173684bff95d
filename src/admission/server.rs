//! The webhook's HTTPS endpoint and its certificate keeper (IO; the
//! decisions are [`super::rules`]).

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jiff::Timestamp;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Client, ResourceExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::certs::{self, CertBundle};
use super::rules::{self, ControlPlane, MaintenanceCreate};
use super::{AdmissionConfig, CertSource};
use crate::api::node_maintenance::{MaintenanceObject, MaintenancePhase, kubevirt, medik8s};
use crate::api::update::NodeVersion;
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
/// handshake, and the API server retries).
pub async fn serve(
    client: Client,
    config: AdmissionConfig,
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
    tracing::info!(addr = %config.addr, "serving the admission webhook");
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a webhook connection failed");
                    continue;
                }
            },
        };
        let (acceptor, client, selector) = (acceptor.clone(), client.clone(), config.node_selector.clone());
        tokio::spawn(async move {
            let stream = match acceptor.accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "webhook TLS handshake failed");
                    return;
                }
            };
            let service = service_fn(move |req| {
                let client = client.clone();
                let selector = selector.clone();
                async move { Ok::<_, Infallible>(answer(&client, selector.as_deref(), req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "webhook connection ended with an error");
            }
        });
    }
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}

/// One AdmissionReview in, one out.
async fn answer(
    client: &Client,
    node_selector: Option<&str>,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return json_response(StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
    };
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return json_response(StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => return json_response(StatusCode::BAD_REQUEST, e.to_string().into_bytes()),
    };
    let response = match decide(client, node_selector, &request).await {
        Ok(()) => AdmissionResponse::from(&request),
        Err(message) => {
            tracing::info!(kind = %request.kind.kind, name = %request.name, %message, "admission denied");
            AdmissionResponse::from(&request).deny(message)
        }
    };
    match serde_json::to_vec(&response.into_review()) {
        Ok(b) => json_response(StatusCode::OK, b),
        Err(e) => json_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string().into_bytes()),
    }
}

fn spec_str<'a>(obj: Option<&'a DynamicObject>, field: &str) -> Option<&'a str> {
    obj.and_then(|o| o.data.get("spec"))
        .and_then(|s| s.get(field))
        .and_then(|v| v.as_str())
}

/// What the rules say of one request, after the reads they need.
async fn decide(
    client: &Client,
    node_selector: Option<&str>,
    req: &AdmissionRequest<DynamicObject>,
) -> Result<(), String> {
    match (req.kind.kind.as_str(), &req.operation) {
        ("NodeMaintenance", Operation::Create) => {
            let node = spec_str(req.object.as_ref(), "nodeName").unwrap_or_default();
            maintenance_create(client, node_selector, &req.name, node).await
        }
        ("NodeMaintenance", Operation::Update) => rules::maintenance_update(
            spec_str(req.old_object.as_ref(), "nodeName").unwrap_or_default(),
            spec_str(req.object.as_ref(), "nodeName").unwrap_or_default(),
        ),
        ("ScalingGroup", Operation::Create | Operation::Update) => {
            let nv = spec_str(req.object.as_ref(), "nodeImage").unwrap_or_default();
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
    client: &Client,
    node_selector: Option<&str>,
    name: &str,
    node_name: &str,
) -> Result<(), String> {
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
            let members: Vec<&Node> = all.items.iter().filter(|n| is_control_plane(n)).collect();
            Some(ControlPlane {
                nodes: members.iter().map(|n| n.name_any()).collect(),
                available: members
                    .iter()
                    .filter(|n| {
                        crate::controllers::node_is_ready(n)
                            && !in_maintenance.contains(n.name_any().as_str())
                    })
                    .map(|n| n.name_any())
                    .collect(),
            })
        }
    };
    rules::maintenance_create(&MaintenanceCreate {
        node_name,
        node_exists: node.is_some(),
        existing: &existing,
        control_plane: control_plane.as_ref(),
    })
}

/// Keeps the certificates current on every replica until `stop`: the
/// Secret made when missing (the first writer wins, the others read its
/// result), renewed by the leader when due, served as soon as it changes;
/// the leader also keeps the configuration's caBundle equal to the CA.
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
        // leader checks the caBundle and the renewal without waiting).
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.refresh) => {}
            changed = leading.changed() => if changed.is_err() { return },
        }
    }
}

/// What one round of [`keep_certificates`] came to.
enum Kept {
    /// The certificate in the Secret is served (and the caBundle set, when leading).
    Done,
    /// Another replica wrote the Secret first: read it again.
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
    let current = found.as_ref().and_then(|s| {
        let data = s
            .data
            .as_ref()?
            .iter()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        CertBundle::from_secret(&data, s.metadata.annotations.as_ref()?)
    });
    if config.certificates == CertSource::CertManager {
        // cert-manager writes the Secret and injects the caBundle.
        let text = |k: &str| {
            found
                .as_ref()
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
        return Ok(Kept::Done);
    }
    let now = Timestamp::now();
    let bundle = match (found, current) {
        (None, _) => {
            let made = certs::generate(&config.names, now).map_err(|e| e.to_string())?;
            match secrets
                .create(&PostParams::default(), &secret(config, &made, None))
                .await
            {
                Ok(_) => {
                    tracing::info!(secret = %config.secret, "made the webhook's CA and serving certificate");
                    made
                }
                // Another replica made it first: serve its certificate.
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Kept::ReadAgain),
                Err(e) => return Err(format!("creating Secret {}: {e}", config.secret)),
            }
        }
        (Some(s), current)
            if leader.is_leader()
                && current
                    .as_ref()
                    .is_none_or(|b| certs::needs_renewal(b.not_after, now)) =>
        {
            let next = match &current {
                Some(b) => certs::renew(b, &config.names, now),
                None => certs::generate(&config.names, now),
            }
            .map_err(|e| e.to_string())?;
            secrets
                .replace(
                    &config.secret,
                    &PostParams::default(),
                    &secret(config, &next, s.metadata.resource_version.clone()),
                )
                .await
                .map_err(|e| format!("renewing Secret {}: {e}", config.secret))?;
            tracing::info!(secret = %config.secret, not_after = %next.not_after, "renewed the webhook's serving certificate");
            next
        }
        (Some(_), Some(b)) => b,
        (Some(_), None) => {
            return Err(format!(
                "Secret {} is incomplete; the leader writes it anew",
                config.secret
            ));
        }
    };
    if resolver.load(&bundle.tls_cert, &bundle.tls_key)? {
        tracing::info!(not_after = %bundle.not_after, "serving the webhook's certificate");
    }
    if leader.is_leader() {
        ensure_ca_bundle(client, &config.webhook_configuration, &bundle.ca_cert).await?;
    }
    Ok(Kept::Done)
}

fn secret(config: &AdmissionConfig, bundle: &CertBundle, resource_version: Option<String>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(config.secret.clone()),
            namespace: Some(config.namespace.clone()),
            resource_version,
            annotations: Some(
                [(
                    certs::NOT_AFTER_ANNOTATION.to_string(),
                    bundle.not_after.to_string(),
                )]
                .into(),
            ),
            labels: Some([("app.kubernetes.io/name".to_string(), "nodewarden".to_string())].into()),
            ..Default::default()
        },
        string_data: Some(bundle.to_data()),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// Sets every webhook's caBundle of the configuration `name` to `ca` (a
/// configuration not installed is left alone).
async fn ensure_ca_bundle(client: &Client, name: &str, ca: &str) -> Result<(), String> {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let Some(vwc) = api
        .get_opt(name)
        .await
        .map_err(|e| format!("reading {name}: {e}"))?
    else {
        return Ok(());
    };
    let want = k8s_openapi::ByteString(ca.as_bytes().to_vec());
    let mut vwc = vwc;
    let webhooks = vwc.webhooks.get_or_insert_with(Vec::new);
    if webhooks
        .iter()
        .all(|w| w.client_config.ca_bundle.as_ref() == Some(&want))
    {
        return Ok(());
    }
    for w in webhooks.iter_mut() {
        w.client_config.ca_bundle = Some(want.clone());
    }
    // Conditioned on the version read: a concurrent change is retried next time.
    api.replace(name, &PostParams::default(), &vwc)
        .await
        .map_err(|e| format!("setting the caBundle of {name}: {e}"))?;
    tracing::info!(configuration = %name, "set the webhook configuration's caBundle");
    Ok(())
}
