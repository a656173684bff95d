//! A client of AWS's Query APIs (EC2 and Auto Scaling): one signed POST per
//! call to the service's regional endpoint (or the one configured), its
//! XML answer or its error mapped to a [`CloudError`]. Calls do not retry.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use super::super::CloudError;
use super::super::http::Http;
use super::credentials::{Cached, Source};
use super::errors::classify;
use super::form::Params;
use super::sigv4;
use super::xml::Xml;

/// The services nodewarden calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// Elastic Compute Cloud: instances, tags, launch templates.
    Ec2,
    /// Auto Scaling: groups, their capacity and instances.
    AutoScaling,
}

impl Service {
    /// The API version every call names.
    pub fn version(self) -> &'static str {
        match self {
            Service::Ec2 => "2016-11-15",
            Service::AutoScaling => "2011-01-01",
        }
    }

    /// The name requests are signed for, and the endpoint's first label.
    fn signing_name(self) -> &'static str {
        match self {
            Service::Ec2 => "ec2",
            Service::AutoScaling => "autoscaling",
        }
    }

    /// The SDKs' service-specific endpoint variable.
    fn endpoint_variable(self) -> &'static str {
        match self {
            Service::Ec2 => "AWS_ENDPOINT_URL_EC2",
            Service::AutoScaling => "AWS_ENDPOINT_URL_AUTO_SCALING",
        }
    }
}

/// What the client needs to know.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// The region requests are signed for and sent to.
    pub region: String,
    /// One endpoint for every service (an emulator's); else the
    /// environment's `AWS_ENDPOINT_URL_<SERVICE>` or `AWS_ENDPOINT_URL`,
    /// else AWS's regional endpoints.
    pub endpoint: Option<String>,
    /// Fixed keys (an emulator's); else the environment's chain.
    pub static_credentials: Option<(String, String)>,
    /// How long one call may take.
    pub call_timeout: Duration,
}

/// Signed calls to EC2 and Auto Scaling.
pub struct QueryClient {
    http: Http,
    region: String,
    ec2: http::Uri,
    autoscaling: http::Uri,
    credentials: Cached,
    call_timeout: Duration,
}

impl QueryClient {
    /// A client from `settings` and the process environment.
    pub fn new(settings: Settings) -> Result<QueryClient, CloudError> {
        Self::with_environment(settings, &|name| std::env::var(name).ok())
    }

    /// A client from `settings` and the environment `var` reads.
    pub fn with_environment(
        settings: Settings,
        var: &dyn Fn(&str) -> Option<String>,
    ) -> Result<QueryClient, CloudError> {
        let endpoint = |service: &str, variable: &str| {
            let url = settings
                .endpoint
                .clone()
                .or_else(|| var(variable).filter(|v| !v.is_empty()))
                .or_else(|| var("AWS_ENDPOINT_URL").filter(|v| !v.is_empty()))
                .unwrap_or_else(|| regional_endpoint(service, &settings.region));
            url.parse::<http::Uri>()
                .map_err(|e| CloudError::Config(format!("the AWS endpoint {url:?} is not a URL: {e}")))
        };
        let sts = endpoint("sts", "AWS_ENDPOINT_URL_STS")?.to_string();
        let source = Source::choose(settings.static_credentials.clone(), var, sts)?;
        Ok(QueryClient {
            http: Http::new(Duration::from_secs(5))?,
            ec2: endpoint("ec2", Service::Ec2.endpoint_variable())?,
            autoscaling: endpoint("autoscaling", Service::AutoScaling.endpoint_variable())?,
            region: settings.region,
            credentials: Cached::new(source),
            call_timeout: settings.call_timeout,
        })
    }

    /// One call; `what` names its object in errors ("instance i-0abc").
    pub async fn call(&self, service: Service, params: Params, what: &str) -> Result<Xml, CloudError> {
        let endpoint = match service {
            Service::Ec2 => &self.ec2,
            Service::AutoScaling => &self.autoscaling,
        };
        let credentials = self.credentials.get(&self.http).await?;
        let body = params.body();
        let host = endpoint.authority().map(|a| a.as_str()).unwrap_or_default();
        let amz_date = sigv4::amz_date(jiff::Timestamp::now());
        let signed = sigv4::sign(
            &sigv4::Request {
                host,
                path: endpoint.path(),
                body: &body,
                region: &self.region,
                service: service.signing_name(),
                amz_date: &amz_date,
            },
            &credentials,
        );
        let mut request = http::Request::post(endpoint.clone())
            .header(http::header::HOST, host)
            .header(http::header::CONTENT_TYPE, sigv4::FORM)
            .header(http::header::USER_AGENT, "nodewarden");
        for (name, value) in signed {
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CloudError::Config(format!("{}: {e}", params.action())))?;
        let reply = self.http.send(request, self.call_timeout).await?;
        answer(reply.status, &reply.body, what)
    }
}

/// AWS's endpoint of a service in a region (China's regions have their own domain).
fn regional_endpoint(service: &str, region: &str) -> String {
    let domain = if region.starts_with("cn-") {
        "amazonaws.com.cn"
    } else {
        "amazonaws.com"
    };
    format!("https://{service}.{region}.{domain}")
}

/// A call's answer: its XML, or the error it carries.
pub fn answer(status: u16, body: &str, what: &str) -> Result<Xml, CloudError> {
    let xml = Xml::parse(body);
    match (status, xml) {
        (200..=299, Ok(xml)) => Ok(xml),
        (200..=299, Err(e)) => Err(CloudError::InvalidResponse(format!(
            "{what}: an answer that is not XML: {e}"
        ))),
        (status, Ok(xml)) if xml.find("Code").is_some() => {
            let text = |name: &str| xml.find(name).map(|n| n.text.clone()).unwrap_or_default();
            Err(classify(status, &text("Code"), &text("Message"), what))
        }
        (500.., _) => Err(CloudError::Server {
            status,
            message: format!("{what}: {}", body.trim()),
        }),
        (status, _) => Err(CloudError::InvalidResponse(format!(
            "{what}: an answer that is not AWS's ({status}): {}",
            body.trim()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::error::CloudErrorKind;

    #[test]
    fn answers_and_errors_of_both_protocols() {
        let ok = answer(200, "<R xmlns=\"x\"><requestId>1</requestId></R>", "x").expect("ok");
        assert_eq!(ok.text_at(&["requestId"]).as_deref(), Some("1"));
        let ec2 = "<Response><Errors><Error><Code>InvalidInstanceID.NotFound</Code>\
                   <Message>The instance ID 'i-1' does not exist</Message></Error></Errors>\
                   <RequestID>r</RequestID></Response>";
        assert_eq!(
            answer(400, ec2, "instance i-1").map(|_| ()).map_err(|e| e.kind()),
            Err(CloudErrorKind::NotFound)
        );
        let asg = "<ErrorResponse xmlns=\"http://autoscaling.amazonaws.com/doc/2011-01-01/\"><Error>\
                   <Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message></Error>\
                   <RequestId>r</RequestId></ErrorResponse>";
        assert_eq!(
            answer(400, asg, "g").map(|_| ()).map_err(|e| e.kind()),
            Err(CloudErrorKind::Throttled)
        );
        assert_eq!(
            answer(502, "<html>bad gateway</html>", "g")
                .map(|_| ())
                .map_err(|e| e.kind()),
            Err(CloudErrorKind::Server)
        );
        assert_eq!(
            answer(403, "denied", "g").map(|_| ()).map_err(|e| e.kind()),
            Err(CloudErrorKind::InvalidResponse)
        );
        assert_eq!(
            answer(200, "{}", "g").map(|_| ()).map_err(|e| e.kind()),
            Err(CloudErrorKind::InvalidResponse)
        );
    }

    #[test]
    fn endpoints_come_from_settings_then_the_environment_then_the_region() {
        let settings = |endpoint: Option<&str>| Settings {
            region: "eu-west-1".into(),
            endpoint: endpoint.map(String::from),
            static_credentials: Some(("a".into(), "b".into())),
            call_timeout: Duration::from_secs(1),
        };
        let none = |_: &str| None;
        let client = QueryClient::with_environment(settings(None), &none).expect("a client");
        assert_eq!(client.ec2.to_string(), "https://ec2.eu-west-1.amazonaws.com/");
        assert_eq!(
            client.autoscaling.to_string(),
            "https://autoscaling.eu-west-1.amazonaws.com/"
        );
        let env = |name: &str| match name {
            "AWS_ENDPOINT_URL_EC2" => Some("http://ec2.local:1".to_string()),
            "AWS_ENDPOINT_URL" => Some("http://all.local:2".to_string()),
            _ => None,
        };
        let client = QueryClient::with_environment(settings(None), &env).expect("a client");
        assert_eq!(client.ec2.authority().map(|a| a.as_str()), Some("ec2.local:1"));
        assert_eq!(
            client.autoscaling.authority().map(|a| a.as_str()),
            Some("all.local:2")
        );
        let client =
            QueryClient::with_environment(settings(Some("http://127.0.0.1:5000")), &env).expect("a client");
        assert_eq!(
            client.autoscaling.authority().map(|a| a.as_str()),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            regional_endpoint("ec2", "cn-north-1"),
            "https://ec2.cn-north-1.amazonaws.com.cn"
        );
        assert!(QueryClient::with_environment(settings(Some("not a url")), &none).is_err());
    }
}
