//! The sim-cloud's protocol: the JSON shapes of its HTTP API and its
//! provider IDs, spoken by both the server (the `nodewarden-simcloud` crate
//! and binary) and the operator's `sim` provider (`nodewarden::cloud::sim`,
//! which re-exports this crate as its `wire` module).
//!
//! A leaf: it depends on neither side, so neither depends on the other. The
//! answers carry the cloud's vocabulary ([`InstanceState`], [`ScalingGroup`],
//! [`GroupRole`], in [`cloud`]) as it is; the operator's provider trait uses
//! the same types. The simulator converts its model to these shapes, never
//! the other way round, so the provider needs nothing but this crate.
#![warn(missing_docs)]

pub mod cloud;
pub mod duration;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use cloud::{GroupRole, InstanceState, ScalingGroup};

/// The scheme of the sim's provider IDs: `sim://<group>/<instance>`.
pub const PROVIDER_ID_PREFIX: &str = "sim://";

/// The provider ID of an instance: `sim://<group>/<instance>`.
pub fn provider_id(group: &str, instance: &str) -> String {
    format!("{PROVIDER_ID_PREFIX}{group}/{instance}")
}

/// Most instances one `GET /states` answers for (as EC2's
/// DescribeInstanceStatus).
pub const MAX_STATES: usize = 100;

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
    /// `sim://<group>/<instance>`, what its Node carries in `spec.providerID`.
    pub provider_id: String,
    /// The state at the time of the answer.
    pub state: InstanceState,
    /// True when the instance is under the `neverJoin` fault.
    pub never_join: bool,
    /// Name, group, image, request ID and every timestamp.
    #[serde(flatten)]
    pub instance: Instance,
}

/// An instance's record: what the cloud knows of it, without the state
/// derived from it. Times are milliseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Instance {
    /// Its name, `<group>-<serial>`; also its Node's name.
    pub name: String,
    /// The ID of its group.
    pub group: String,
    /// The image it boots from (its group's image when it was created).
    pub image: String,
    /// The caller's idempotency key, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// When it was created.
    pub created_at_ms: u64,
    /// When it is done booting.
    pub ready_at_ms: u64,
    /// When its Node is due; `None`: never (the `neverJoin` fault).
    pub join_at_ms: Option<u64>,
    /// Boots into `Failed` (the `failBoot` fault).
    #[serde(default)]
    pub fails: bool,
    /// When its Node was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joined_at_ms: Option<u64>,
    /// When its delete was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at_ms: Option<u64>,
    /// When its delete is (or was) done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated_at_ms: Option<u64>,
    /// The address its Node reports as InternalIP, when its group
    /// assigns them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_ip: Option<String>,
    /// The zone it runs in, when its group spreads over zones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// One group as `GET /groups` shows it. A provider may read the answer as
/// plain [`ScalingGroup`]s: the extra fields are ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupView {
    /// id, role, name, size, image.
    #[serde(flatten)]
    pub group: ScalingGroup,
    /// How long its instances take to boot (`Creating` to `Ready`).
    pub boot_delay_ms: u64,
    /// How long after booting its instances' Nodes appear.
    pub join_delay_ms: u64,
    /// How long its deletes take (`Terminating` to `Terminated`).
    pub delete_delay_ms: u64,
    /// The labels put on its Nodes.
    pub labels: BTreeMap<String, String>,
}

/// Body of `GET`/`PUT /groups/{id}/image`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageBody {
    /// The image new instances of the group boot from.
    pub image: String,
}

/// Optional body of `POST /groups/{id}/instances`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateBody {
    /// An idempotency key: a repeated create in the same group returns the
    /// instance the first one made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// Body of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong, for people.
    pub error: String,
}

/// The injected faults: body of `GET /faults` and `POST /faults`. A POST
/// replaces the whole set, and a missing field means "no such fault", so
/// `Faults::default()` switches them all off. How the sim-cloud acts on them
/// is its own business (the `faults` module of `nodewarden-simcloud`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Faults {
    /// Fraction of cloud calls answered 500 without doing anything.
    pub error_rate: f64,
    /// Fraction of cloud calls answered 429 (with `Retry-After`) without doing anything.
    pub throttle_rate: f64,
    /// The `Retry-After` of throttled answers, in whole seconds (default 1).
    pub retry_after_seconds: u64,
    /// Fraction of successful creates and deletes whose answer is "lost":
    /// the change is made, but the caller gets a 500. Callers must find out
    /// what happened (idempotent retries) instead of assuming nothing did.
    pub lost_response_rate: f64,
    /// The next N created instances boot but never get a Node.
    pub never_join: u32,
    /// The next N created instances end up Failed instead of Ready (no Node).
    pub fail_boot: u32,
    /// Deletes requested while set take this long instead of the group's delay.
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    pub delete_delay: Option<Duration>,
}

/// No faults at all.
impl Default for Faults {
    fn default() -> Faults {
        Faults {
            error_rate: 0.0,
            throttle_rate: 0.0,
            retry_after_seconds: 1,
            lost_response_rate: 0.0,
            never_join: 0,
            fail_boot: 0,
            delete_delay: None,
        }
    }
}

impl Faults {
    /// Rates must be fractions and, together, at most 1.
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("errorRate", self.error_rate),
            ("throttleRate", self.throttle_rate),
            ("lostResponseRate", self.lost_response_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1, not {rate}"));
            }
        }
        if self.error_rate + self.throttle_rate > 1.0 {
            return Err("errorRate + throttleRate must not exceed 1".into());
        }
        Ok(())
    }
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

    fn rates(error_rate: f64, throttle_rate: f64) -> Faults {
        Faults {
            error_rate,
            throttle_rate,
            ..Faults::default()
        }
    }

    #[test]
    fn validation_rejects_impossible_rates() {
        assert!(rates(0.5, 0.5).validate().is_ok());
        assert!(rates(0.6, 0.5).validate().is_err());
        assert!(rates(-0.1, 0.0).validate().is_err());
        let lost = Faults {
            lost_response_rate: 1.5,
            ..Faults::default()
        };
        assert!(lost.validate().is_err());
    }

    #[test]
    fn faults_json_uses_the_documented_names() {
        let f: Faults = serde_json::from_str(
            r#"{"errorRate":0.1,"throttleRate":0.2,"retryAfterSeconds":3,"neverJoin":1,"deleteDelay":"5s"}"#,
        )
        .expect("parses");
        assert_eq!(f.delete_delay, Some(Duration::from_secs(5)));
        assert_eq!(f.never_join, 1);
        let defaults: Faults = serde_json::from_str("{}").expect("parses");
        assert_eq!(defaults, Faults::default());
        assert_eq!(defaults.retry_after_seconds, 1);
        let back: Faults =
            serde_json::from_value(serde_json::to_value(&f).expect("serializes")).expect("parses");
        assert_eq!(back, f);
    }

    #[test]
    fn an_instance_view_is_flat_json() {
        let view = InstanceView {
            provider_id: provider_id("g", "g-00001"),
            state: InstanceState::Ready,
            never_join: false,
            instance: Instance {
                name: "g-00001".into(),
                group: "g".into(),
                image: "v1".into(),
                request_id: None,
                created_at_ms: 1,
                ready_at_ms: 2,
                join_at_ms: Some(3),
                fails: false,
                joined_at_ms: None,
                deleted_at_ms: None,
                terminated_at_ms: None,
                internal_ip: None,
                zone: None,
            },
        };
        let json = serde_json::to_value(&view).expect("serializes");
        assert_eq!(json["name"], "g-00001");
        assert_eq!(json["providerId"], "sim://g/g-00001");
        assert_eq!(json["readyAtMs"], 2);
        let back: InstanceView = serde_json::from_value(json).expect("parses");
        assert_eq!(back, view);
    }
}
