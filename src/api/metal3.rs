//! The part of metal3's BareMetalHost (`metal3.io/v1alpha1`) nodewarden
//! reads. The CRD itself is metal3's own (from the baremetal-operator Go
//! module, see e2e/metal3/): this type is never installed, and nodewarden
//! only ever patches a host's labels, so fields it does not know are kept.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A physical machine metal3 manages.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "metal3.io",
    version = "v1alpha1",
    kind = "BareMetalHost",
    plural = "baremetalhosts",
    namespaced,
    status = "BareMetalHostStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct BareMetalHostSpec {
    /// Whether the host should be powered on.
    #[serde(default)]
    pub online: bool,
    /// How to reach its BMC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<BmcDetails>,
    /// The Secret with its network configuration (OpenStack network_data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<SecretReference>,
}

/// A host's BMC.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcDetails {
    /// `ipmi://10.0.0.1`, `redfish+http://10.0.0.1:8000/redfish/v1/Systems/1`, ...
    #[serde(default)]
    pub address: String,
    /// The Secret (in the host's namespace) with `username` and `password`.
    #[serde(default)]
    pub credentials_name: String,
}

/// A Secret by name (and namespace: the host's when empty).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SecretReference {
    /// The Secret's name.
    #[serde(default)]
    pub name: String,
    /// The Secret's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// What metal3 reports about a host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BareMetalHostStatus {
    /// `OK`, `discovered`, `error`, `delayed`, `detached`, `servicing`.
    #[serde(default)]
    pub operational_status: String,
    /// Why the host is in error.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_message: String,
    /// Where provisioning stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<ProvisionStatus>,
}

/// A host's provisioning.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProvisionStatus {
    /// `available`, `provisioned`, `deprovisioning`, ...
    #[serde(default)]
    pub state: String,
}

/// Provisioning states in which a host is going away or cannot be used.
const UNUSABLE_STATES: [&str; 7] = [
    "registration error",
    "deprovisioning",
    "deleting",
    "powering off before delete",
    "unmanaged",
    "detached",
    "",
];

impl BareMetalHost {
    /// Why the host cannot serve a cluster now, or None: it is usable
    /// (operational status OK and a provisioning state that is not on its
    /// way out). A host metal3 has not reported on yet is not usable.
    pub fn unusable(&self) -> Option<String> {
        if self.metadata.deletion_timestamp.is_some() {
            return Some("being deleted".into());
        }
        let Some(status) = &self.status else {
            return Some("no status from metal3 yet".into());
        };
        if status.operational_status != "OK" {
            let why = match status.error_message.as_str() {
                "" => String::new(),
                m => format!(": {m}"),
            };
            return Some(format!("operational status {:?}{why}", status.operational_status));
        }
        let state = status
            .provisioning
            .as_ref()
            .map(|p| p.state.as_str())
            .unwrap_or("");
        UNUSABLE_STATES
            .contains(&state)
            .then(|| format!("provisioning state {state:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(operational: &str, state: &str) -> BareMetalHost {
        let mut h = BareMetalHost::new("h", BareMetalHostSpec::default());
        h.status = Some(BareMetalHostStatus {
            operational_status: operational.into(),
            error_message: String::new(),
            provisioning: Some(ProvisionStatus { state: state.into() }),
        });
        h
    }

    #[test]
    fn usable_hosts() {
        for (operational, state, usable) in [
            ("OK", "available", true),
            ("OK", "provisioned", true),
            ("OK", "externally provisioned", true),
            ("OK", "deprovisioning", false),
            ("OK", "deleting", false),
            ("error", "provisioned", false),
            ("discovered", "available", false),
            ("OK", "", false),
        ] {
            assert_eq!(
                host(operational, state).unusable().is_none(),
                usable,
                "{operational} {state}"
            );
        }
        let mut fresh = host("OK", "available");
        fresh.status = None;
        assert!(fresh.unusable().is_some(), "no status: not usable");
    }
}
