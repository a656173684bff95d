//! The webhook's certificates: a CA and a serving certificate signed by it,
//! made by nodewarden itself (rcgen on ring) and kept in one Secret that
//! every replica serves from. The CA lives ten years and is what the API
//! server trusts (the ValidatingWebhookConfiguration's caBundle); the
//! serving certificate lives one year and is renewed by the leader a month
//! before it ends, signed by the same CA, so the caBundle stays valid.

use std::collections::BTreeMap;
use std::net::IpAddr;

use jiff::{SignedDuration, Timestamp};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, SanType,
};

/// The Secret's keys (`tls.crt`/`tls.key` as a kubernetes.io/tls Secret has them).
pub const CA_CERT: &str = "ca.crt";
/// The CA's private key (needed to renew the serving certificate).
pub const CA_KEY: &str = "ca.key";
/// The serving certificate.
pub const TLS_CERT: &str = "tls.crt";
/// The serving certificate's key.
pub const TLS_KEY: &str = "tls.key";
/// On the Secret: when the serving certificate ends (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "nodewarden.dev/serving-not-after";

/// How long the CA is valid.
pub const CA_VALIDITY: SignedDuration = SignedDuration::from_hours(10 * 365 * 24);
/// How long a serving certificate is valid.
pub const SERVING_VALIDITY: SignedDuration = SignedDuration::from_hours(365 * 24);
/// A serving certificate is renewed when less than this is left.
pub const RENEW_BEFORE: SignedDuration = SignedDuration::from_hours(30 * 24);

const CA_NAME: &str = "nodewarden webhook CA";

/// Why certificates could not be made.
#[derive(Debug, thiserror::Error)]
#[error("webhook certificates: {0}")]
pub struct CertError(String);

impl From<rcgen::Error> for CertError {
    fn from(e: rcgen::Error) -> Self {
        CertError(e.to_string())
    }
}

/// The PEMs of a CA and its serving certificate, and when the latter ends.
#[derive(Clone, Debug, PartialEq)]
pub struct CertBundle {
    /// The CA certificate (the caBundle).
    pub ca_cert: String,
    /// The CA's key (PKCS#8).
    pub ca_key: String,
    /// The serving certificate.
    pub tls_cert: String,
    /// The serving certificate's key (PKCS#8).
    pub tls_key: String,
    /// When the serving certificate ends.
    pub not_after: Timestamp,
}

/// Where the serving certificate must be valid.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServingNames {
    /// DNS names (the webhook Service's `<svc>.<ns>.svc` and variants).
    pub dns: Vec<String>,
    /// IP addresses (loopback for a URL clientConfig in tests).
    pub ips: Vec<IpAddr>,
}

/// Sets the validity of `params` from `from` to `to` (whole days, UTC).
fn set_validity(params: &mut CertificateParams, from: Timestamp, to: Timestamp) -> Result<(), CertError> {
    let ymd = |t: Timestamp| -> Result<(i32, u8, u8), CertError> {
        let d = t.to_zoned(jiff::tz::TimeZone::UTC).date();
        let month = u8::try_from(d.month()).map_err(|e| CertError(e.to_string()))?;
        let day = u8::try_from(d.day()).map_err(|e| CertError(e.to_string()))?;
        Ok((i32::from(d.year()), month, day))
    };
    let (y, m, d) = ymd(from)?;
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = ymd(to)?;
    params.not_after = rcgen::date_time_ymd(y, m, d);
    Ok(())
}

fn ca_params(now: Timestamp) -> Result<CertificateParams, CertError> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(
        &mut params,
        now - SignedDuration::from_hours(24),
        now + CA_VALIDITY,
    )?;
    Ok(params)
}

/// A new CA and a serving certificate for `names`, valid from `now`.
pub fn generate(names: &ServingNames, now: Timestamp) -> Result<CertBundle, CertError> {
    let ca_key = KeyPair::generate()?;
    let params = ca_params(now)?;
    let ca_cert = params.self_signed(&ca_key)?;
    let ca_key_pem = ca_key.serialize_pem();
    let (tls_cert, tls_key, not_after) = serving(names, &params, ca_key, now)?;
    Ok(CertBundle {
        ca_cert: ca_cert.pem(),
        ca_key: ca_key_pem,
        tls_cert,
        tls_key,
        not_after,
    })
}

/// A new serving certificate signed by the CA of `bundle` (the CA is kept).
pub fn renew(bundle: &CertBundle, names: &ServingNames, now: Timestamp) -> Result<CertBundle, CertError> {
    let ca_key = KeyPair::from_pem(&bundle.ca_key)?;
    // The issuer is named as the CA certificate names its subject; its key
    // identifier derives from the same key, so chains verify as before.
    let params = ca_params(now)?;
    let (tls_cert, tls_key, not_after) = serving(names, &params, ca_key, now)?;
    Ok(CertBundle {
        tls_cert,
        tls_key,
        not_after,
        ..bundle.clone()
    })
}

fn serving(
    names: &ServingNames,
    ca: &CertificateParams,
    ca_key: KeyPair,
    now: Timestamp,
) -> Result<(String, String, Timestamp), CertError> {
    let issuer = Issuer::from_params(ca, ca_key);
    let mut params = CertificateParams::new(names.dns.clone())?;
    params
        .subject_alt_names
        .extend(names.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        names
            .dns
            .first()
            .cloned()
            .unwrap_or_else(|| "nodewarden-webhook".into()),
    );
    params.distinguished_name = name;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let not_after = now + SERVING_VALIDITY;
    set_validity(&mut params, now - SignedDuration::from_hours(24), not_after)?;
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    // rcgen's dates have a day's resolution: the certificate ends at the
    // start of that day, which is what is recorded.
    let day_start = not_after
        .to_zoned(jiff::tz::TimeZone::UTC)
        .start_of_day()
        .map(|z| z.timestamp())
        .unwrap_or(not_after);
    Ok((cert.pem(), key.serialize_pem(), day_start))
}

/// Whether the serving certificate must be renewed at `now`.
pub fn needs_renewal(not_after: Timestamp, now: Timestamp) -> bool {
    now + RENEW_BEFORE >= not_after
}

impl CertBundle {
    /// The Secret's data.
    pub fn to_data(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CA_CERT.into(), self.ca_cert.clone()),
            (CA_KEY.into(), self.ca_key.clone()),
            (TLS_CERT.into(), self.tls_cert.clone()),
            (TLS_KEY.into(), self.tls_key.clone()),
        ])
    }

    /// Reads a bundle from a Secret's data and annotations; None when
    /// anything is missing (the Secret is then written anew).
    pub fn from_secret(
        data: &BTreeMap<String, Vec<u8>>,
        annotations: &BTreeMap<String, String>,
    ) -> Option<CertBundle> {
        let text = |k: &str| data.get(k).and_then(|v| String::from_utf8(v.clone()).ok());
        Some(CertBundle {
            ca_cert: text(CA_CERT)?,
            ca_key: text(CA_KEY)?,
            tls_cert: text(TLS_CERT)?,
            tls_key: text(TLS_KEY)?,
            not_after: annotations.get(NOT_AFTER_ANNOTATION)?.parse().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> ServingNames {
        ServingNames {
            dns: vec!["nodewarden-webhook.nodewarden-system.svc".into()],
            ips: vec!["127.0.0.1".parse().expect("an ip")],
        }
    }

    fn verifies(bundle: &CertBundle, at: Timestamp) {
        // A rustls client trusting only the CA accepts the serving chain.
        use rustls::pki_types::pem::PemObject;
        let ca =
            rustls::pki_types::CertificateDer::from_pem_slice(bundle.ca_cert.as_bytes()).expect("ca pem");
        let leaf =
            rustls::pki_types::CertificateDer::from_pem_slice(bundle.tls_cert.as_bytes()).expect("leaf pem");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca).expect("a root");
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots.into(), provider)
            .build()
            .expect("a verifier");
        let name = rustls::pki_types::ServerName::try_from("nodewarden-webhook.nodewarden-system.svc")
            .expect("a name");
        use rustls::client::danger::ServerCertVerifier;
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &name,
                &[],
                rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                    at.as_second().unsigned_abs(),
                )),
            )
            .expect("the serving certificate verifies against the CA");
    }

    #[test]
    fn a_generated_and_a_renewed_serving_certificate_verify_against_the_same_ca() {
        let now = Timestamp::now();
        let first = generate(&names(), now).expect("certificates");
        verifies(&first, now);
        assert!(!needs_renewal(first.not_after, now));
        assert!(needs_renewal(
            first.not_after,
            now + SERVING_VALIDITY - RENEW_BEFORE
        ));
        let later = now + SignedDuration::from_hours(340 * 24);
        let renewed = renew(&first, &names(), later).expect("renewed");
        assert_eq!(
            renewed.ca_cert, first.ca_cert,
            "the CA (and so the caBundle) is kept"
        );
        assert_ne!(renewed.tls_cert, first.tls_cert);
        assert!(renewed.not_after > first.not_after);
        verifies(&renewed, later);
        verifies(&first, later);
    }

    #[test]
    fn a_secret_round_trips_and_an_incomplete_one_is_none() {
        let bundle = generate(&names(), Timestamp::now()).expect("certificates");
        let data: BTreeMap<String, Vec<u8>> = bundle
            .to_data()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        let annotations = BTreeMap::from([(NOT_AFTER_ANNOTATION.to_string(), bundle.not_after.to_string())]);
        assert_eq!(CertBundle::from_secret(&data, &annotations), Some(bundle));
        let mut partial = data.clone();
        partial.remove(TLS_KEY);
        assert_eq!(CertBundle::from_secret(&partial, &annotations), None);
        assert_eq!(CertBundle::from_secret(&data, &BTreeMap::new()), None);
    }
}
