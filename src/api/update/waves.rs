//! Where a rollout in waves stands (`status.wave`); [`crate::rollout::waves`]
//! decides it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The wave a rollout is in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    /// The target the waves are for (`<image> <components>`).
    #[serde(default)]
    pub target: String,
    /// The wave under way, from 0 (the first of `spec.rollout.waves`).
    #[serde(default)]
    #[schemars(extend("format" = "int32"))]
    pub wave: u32,
    /// When this wave started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<MicroTime>,
    /// When this wave finished (its soak began); unset while it runs. In
    /// microseconds: a soak of seconds must not end up to a second early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<MicroTime>,
}
