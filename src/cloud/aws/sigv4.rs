//! AWS Signature Version 4 for the Query APIs nodewarden calls: a POST of a
//! form body to the endpoint's path, no query string, signed over
//! `content-type`, `host`, `x-amz-date` and, with temporary credentials,
//! `x-amz-security-token`. The test vectors come from botocore's signer.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::credentials::Credentials;

/// The form body's content type, as the SDKs send it.
pub const FORM: &str = "application/x-www-form-urlencoded; charset=utf-8";

/// What is signed of one request.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// The Host header: host, and `:port` when not the scheme's default.
    pub host: &'a str,
    /// The path the request is posted to (`/` for AWS's endpoints).
    pub path: &'a str,
    /// The form body.
    pub body: &'a str,
    /// The signing region and service (`ec2`, `autoscaling`, `sts`).
    pub region: &'a str,
    pub service: &'a str,
    /// The request's time as `YYYYMMDDTHHMMSSZ`.
    pub amz_date: &'a str,
}

/// The headers to send beside Host and Content-Type: X-Amz-Date, the
/// session token when there is one, and Authorization.
pub fn sign(request: &Request<'_>, credentials: &Credentials) -> Vec<(&'static str, String)> {
    let token = credentials.session_token.as_deref();
    let mut canonical_headers = format!(
        "content-type:{FORM}\nhost:{}\nx-amz-date:{}\n",
        request.host, request.amz_date
    );
    let mut signed_headers = String::from("content-type;host;x-amz-date");
    if let Some(token) = token {
        canonical_headers.push_str(&format!("x-amz-security-token:{token}\n"));
        signed_headers.push_str(";x-amz-security-token");
    }
    let canonical_request = format!(
        "POST\n{}\n\n{canonical_headers}\n{signed_headers}\n{}",
        canonical_path(request.path),
        hex(&Sha256::digest(request.body.as_bytes()))
    );
    let date = &request.amz_date[..8.min(request.amz_date.len())];
    let scope = format!("{date}/{}/{}/aws4_request", request.region, request.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{scope}\n{}",
        request.amz_date,
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let key = signing_key(
        &credentials.secret_access_key,
        date,
        request.region,
        request.service,
    );
    let signature = hex(&hmac(&key, string_to_sign.as_bytes()));
    let mut headers = vec![("x-amz-date", request.amz_date.to_string())];
    if let Some(token) = token {
        headers.push(("x-amz-security-token", token.to_string()));
    }
    headers.push((
        "authorization",
        format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_headers}, Signature={signature}",
            credentials.access_key_id
        ),
    ));
    headers
}

/// `YYYYMMDDTHHMMSSZ` of a time.
pub fn amz_date(now: jiff::Timestamp) -> String {
    now.strftime("%Y%m%dT%H%M%SZ").to_string()
}

/// An empty path is `/`; AWS's paths need no further encoding.
fn canonical_path(path: &str) -> &str {
    if path.is_empty() { "/" } else { path }
}

fn signing_key(secret: &str, date: &str, region: &str, service: &str) -> Vec<u8> {
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k_region = hmac(&k_date, region.as_bytes());
    let k_service = hmac(&k_region, service.as_bytes());
    hmac(&k_service, b"aws4_request")
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: new_from_slice cannot fail for it.
    let mut mac = match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    };
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(id: &str, secret: &str, token: Option<&str>) -> Credentials {
        Credentials {
            access_key_id: id.into(),
            secret_access_key: secret.into(),
            session_token: token.map(String::from),
            expires: None,
        }
    }

    fn authorization(headers: &[(&str, String)]) -> String {
        headers
            .iter()
            .find(|(k, _)| *k == "authorization")
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    /// Signed by botocore 's SigV4Auth for the same request (EC2 on AWS's
    /// endpoint, temporary credentials).
    #[test]
    fn ec2_with_a_session_token_signs_as_botocore_does() {
        let request = Request {
            host: "ec2.eu-west-1.amazonaws.com",
            path: "/",
            body: "Action=DescribeInstances&Version=2016-11-15&InstanceId.1=i-0abc",
            region: "eu-west-1",
            service: "ec2",
            amz_date: "20261128T121556Z",
        };
        let creds = credentials(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            Some("session-token-example"),
        );
        let headers = sign(&request, &creds);
        assert_eq!(
            authorization(&headers),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261128/eu-west-1/ec2/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date;x-amz-security-token, \
             Signature=dcc15a106cc3486653a671529f80f582f01b788316d029b9fdc018e06f78b09d"
        );
        assert!(headers.contains(&("x-amz-security-token", "session-token-example".into())));
        assert!(headers.contains(&("x-amz-date", "20261128T121556Z".into())));
    }

    /// Signed by botocore for an endpoint with a port (an emulator's).
    #[test]
    fn an_endpoint_with_a_port_signs_its_host_with_the_port() {
        let request = Request {
            host: "127.0.0.1:5000",
            path: "",
            body: "Action=SetDesiredCapacity&Version=2011-01-01&AutoScalingGroupName=g&DesiredCapacity=4",
            region: "us-east-1",
            service: "autoscaling",
            amz_date: "20261128T121556Z",
        };
        let headers = sign(&request, &credentials("testing", "testing", None));
        assert_eq!(
            authorization(&headers),
            "AWS4-HMAC-SHA256 Credential=testing/20261128/us-east-1/autoscaling/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d5d64367cb7275af97b405b116c0c83f87106686447790ae55faa8fd48fff7e"
        );
        assert_eq!(headers.len(), 2, "no session token header without a token");
    }

    #[test]
    fn amz_dates_are_utc_seconds() {
        let t: jiff::Timestamp = "2026-11-28T12:15:56.789Z".parse().expect("a timestamp");
        assert_eq!(amz_date(t), "20261128T121556Z");
    }
}
