//! A Query API call's parameters and their form encoding: flat names with
//! the protocol's list shapes (`InstanceId.1` for EC2, `Names.member.1` for
//! Auto Scaling), percent-encoded by `cloud::form`. The expected bodies in the tests are
//! botocore's serializations of the same calls.

use crate::cloud::form::encode;

/// One call's parameters, Action and Version first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Params(Vec<(String, String)>);

impl Params {
    /// A call of `action` in the API `version`.
    pub fn new(action: &str, version: &str) -> Params {
        Params(vec![
            ("Action".into(), action.into()),
            ("Version".into(), version.into()),
        ])
    }

    /// The call's action.
    pub fn action(&self) -> &str {
        self.0.first().map(|(_, v)| v.as_str()).unwrap_or_default()
    }

    /// One parameter.
    pub fn set(mut self, name: &str, value: impl Into<String>) -> Params {
        self.0.push((name.into(), value.into()));
        self
    }

    /// Sets `name` when there is a value.
    pub fn maybe(self, name: &str, value: Option<impl Into<String>>) -> Params {
        match value {
            Some(v) => self.set(name, v),
            None => self,
        }
    }

    /// A list: `{prefix}.1`, `{prefix}.2`, ... (prefix with `.member` for
    /// Auto Scaling's lists).
    pub fn list<S: AsRef<str>>(self, prefix: &str, values: impl IntoIterator<Item = S>) -> Params {
        values.into_iter().enumerate().fold(self, |p, (i, v)| {
            p.set(&format!("{prefix}.{}", i + 1), v.as_ref())
        })
    }

    /// A list of structures: `{prefix}.{n}.{field}` for each item's fields.
    pub fn structs(self, prefix: &str, items: &[Vec<(&str, String)>]) -> Params {
        let mut params = self;
        for (i, fields) in items.iter().enumerate() {
            for (field, value) in fields {
                params = params.set(&format!("{prefix}.{}.{field}", i + 1), value.clone());
            }
        }
        params
    }

    /// The form body.
    pub fn body(&self) -> String {
        let pairs: Vec<(&str, &str)> = self.0.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        encode(&pairs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_encode_as_botocore_does() {
        let ec2 = Params::new("DescribeInstances", "2016-11-15")
            .list("InstanceId", ["i-1", "i-2"])
            .structs(
                "Filter",
                &[vec![("Name", "tag:k".into()), ("Value.1", "v".into())]],
            );
        assert_eq!(
            ec2.body(),
            "Action=DescribeInstances&Version=2016-11-15&InstanceId.1=i-1&InstanceId.2=i-2\
             &Filter.1.Name=tag%3Ak&Filter.1.Value.1=v"
        );
        let sts = Params::new("AssumeRoleWithWebIdentity", "2011-06-15")
            .set("RoleArn", "arn:aws:iam::1:role/r")
            .set("RoleSessionName", "nodewarden")
            .set("WebIdentityToken", "token");
        assert_eq!(
            sts.body(),
            "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=arn%3Aaws%3Aiam%3A%3A1%3Arole%2Fr\
             &RoleSessionName=nodewarden&WebIdentityToken=token"
        );
        assert_eq!(sts.action(), "AssumeRoleWithWebIdentity");
    }
}
