//! The JSON shapes of the sim-cloud's HTTP API and its provider IDs, shared by
//! the server and the `sim` provider.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::{Instance, Millis};
use crate::cloud::{InstanceState, ScalingGroup};

/// The scheme of the sim's provider IDs: `sim://<group>/<instance>`.
pub const PROVIDER_ID_PREFIX: &str = "sim://";

pub fn provider_id(group: &str, instance: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{group}/{instance}")
}

/// Splits `sim://<group>/<instance>` into group and instance.
pub fn parse_provider_id(provider_id: &str) -> Option<(&str, &str)> {
    let rest = provider_id.strip_prefix(PROVIDER_ID_PREFIX)?;
    let (group, instance) = rest.split_once('/')?;
    let plain = |s: &str| !s.is_empty() && !s.contains('/');
    (plain(group) && plain(instance)).then_some((group, instance))
}

/// One instance as `GET /instances` and friends show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    pub provider_id: String,
    /// The state at the time of the answer.
    pub state: InstanceState,
    /// True when the instance is under the `neverJoin` fault.
    pub never_join: bool,
    /// Name, group, image, request ID and every timestamp.
    #[serde(flatten)]
    pub instance: Instance,
}

/// One group as `GET /groups` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupView {
    /// id, role, name, size, image.
    #[serde(flatten)]
    pub group: ScalingGroup,
    pub boot_delay_ms: Millis,
    pub join_delay_ms: Millis,
    pub delete_delay_ms: Millis,
    pub labels: BTreeMap<String, String>,
}

/// Body of `GET`/`PUT /groups/{id}/image`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageBody {
    pub image: String,
}

/// Optional body of `POST /groups/{id}/instances`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Body of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip_and_reject_foreign_ones() {
        let id = provider_id("g", "g-00001");
        assert_eq!(id, "sim://g/g-00001");
        assert_eq!(parse_provider_id(&id), Some(("g", "g-00001")));
        for bad in ["gce://p/z/i", "sim://g", "sim:///i", "sim://g/", "sim://g/i/x"] {
            assert_eq!(parse_provider_id(bad), None, "{bad}");
        }
    }
}
