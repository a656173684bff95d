//! The sim-cloud's config file: its scaling groups.
//!
//! ```yaml
//! groups:
//!   - id: demo-workers          # DNS label; instance names are <id>-<serial>
//!     name: workers             # optional, defaults to the id
//!     role: Worker              # Worker | ControlPlane
//!     initialSize: 3            # instances created (and joined at once) on first start
//!     image: image-v1           # image of new instances (changeable through the API)
//!     bootDelay: 2s             # Creating -> Ready
//!     joinDelay: 1s             # Ready -> its Node appears
//!     deleteDelay: 3s           # Terminating -> Terminated
//!     labels:                   # put on the group's Nodes
//!       topology.kubernetes.io/zone: zone-a
//!     internalIpBase: 10.0.1.10 # optional: the group's n-th instance (from 0)
//!                               # gets this address + n as its Node's InternalIP
//!     zones: [zone-a, zone-b]   # optional: each new instance goes to the zone
//!                               # with the fewest of the group's instances (as an
//!                               # AWS group balances its zones), its Node labelled
//!                               # topology.kubernetes.io/zone
//! ```
//!
//! Durations are `500ms`, `2s`, `1m`, `1h` or a bare number of seconds.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use nodewarden_simwire::GroupRole;
use nodewarden_simwire::duration;

/// Longest group ID: leaves room for `-<serial>` in a 63-character Node
/// name that is also valid as the `kubernetes.io/hostname` label value.
pub const MAX_GROUP_ID_LEN: usize = 50;

/// The whole config file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimConfig {
    /// The scaling groups, each with a unique ID.
    pub groups: Vec<GroupConfig>,
}

/// One scaling group of the config file (see the module docs for an example).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupConfig {
    /// A DNS label of at most [`MAX_GROUP_ID_LEN`] characters; instance
    /// names are `<id>-<serial>`.
    pub id: String,
    /// A short human name; the ID when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether its Nodes run workloads or the control plane.
    pub role: GroupRole,
    /// Instances created, already booted, when the group first appears.
    #[serde(default)]
    pub initial_size: u32,
    /// The image of new instances until the API sets another.
    pub image: String,
    /// `Creating` to `Ready`.
    #[serde(with = "duration", default)]
    pub boot_delay: Duration,
    /// `Ready` to its Node.
    #[serde(with = "duration", default)]
    pub join_delay: Duration,
    /// `Terminating` to `Terminated`.
    #[serde(with = "duration", default)]
    pub delete_delay: Duration,
    /// Put on the group's Nodes.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The InternalIP of the group's first instance; each later one gets
    /// the next address. None: kwok's default address.
    #[serde(default)]
    pub internal_ip_base: Option<std::net::Ipv4Addr>,
    /// The zones its instances are spread over (none: no zone label).
    #[serde(default)]
    pub zones: Vec<String>,
}

/// Why the config file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why reading it failed.
        source: std::io::Error,
    },
    /// The file is not YAML of the expected shape.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// What the parser found.
        source: serde_norway::Error,
    },
    /// A group breaks a rule [`SimConfig::validate`] checks.
    #[error("group {id:?}: {reason}")]
    Invalid {
        /// The group's ID.
        id: String,
        /// The rule it breaks.
        reason: String,
    },
}

impl SimConfig {
    /// Reads, parses and validates the file at `path`.
    pub fn load(path: &Path) -> Result<SimConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let config = SimConfig::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Parses YAML text, without validating it.
    pub fn parse(text: &str) -> Result<SimConfig, serde_norway::Error> {
        serde_norway::from_str(text)
    }

    /// Group IDs end up in Node names and provider IDs, so they must be DNS labels.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        for group in &self.groups {
            let invalid = |reason: &str| ConfigError::Invalid {
                id: group.id.clone(),
                reason: reason.to_string(),
            };
            if !is_dns_label(&group.id) || group.id.len() > MAX_GROUP_ID_LEN {
                return Err(invalid(&format!(
                    "the id must be lowercase letters, digits and '-', at most {MAX_GROUP_ID_LEN} characters"
                )));
            }
            if group.image.is_empty() {
                return Err(invalid("the image must not be empty"));
            }
            if !seen.insert(group.id.as_str()) {
                return Err(invalid("the id is used twice"));
            }
        }
        Ok(())
    }
}

/// RFC 1123 label: lowercase alphanumerics and '-', alphanumeric at both ends.
fn is_dns_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty() && s.chars().all(|c| alnum(c) || c == '-') && s.starts_with(alnum) && s.ends_with(alnum)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
groups:
  - id: demo-workers
    name: workers
    role: Worker
    initialSize: 3
    image: image-v1
    bootDelay: 2s
    joinDelay: 500ms
    deleteDelay: 3
    labels:
      topology.kubernetes.io/zone: zone-a
  - id: demo-cp
    role: ControlPlane
    image: image-v1
"#;

    #[test]
    fn parses_the_documented_example() {
        let config = SimConfig::parse(EXAMPLE).expect("the example parses");
        config.validate().expect("the example is valid");
        let workers = &config.groups[0];
        assert_eq!(workers.role, GroupRole::Worker);
        assert_eq!(workers.initial_size, 3);
        assert_eq!(workers.boot_delay, Duration::from_secs(2));
        assert_eq!(workers.join_delay, Duration::from_millis(500));
        assert_eq!(workers.delete_delay, Duration::from_secs(3));
        assert_eq!(workers.labels["topology.kubernetes.io/zone"], "zone-a");
        let cp = &config.groups[1];
        assert_eq!(
            (cp.role, cp.initial_size, cp.name.as_deref()),
            (GroupRole::ControlPlane, 0, None)
        );
        assert_eq!(cp.boot_delay, Duration::ZERO);
    }

    #[test]
    fn rejects_typos_and_bad_ids() {
        assert!(SimConfig::parse("groups: [{id: a, role: Worker, image: i, bootDelai: 1s}]").is_err());
        for id in ["Upper", "-dash", "dash-", "", &"x".repeat(MAX_GROUP_ID_LEN + 1)] {
            let config = SimConfig {
                groups: vec![GroupConfig {
                    id: id.to_string(),
                    name: None,
                    role: GroupRole::Worker,
                    initial_size: 0,
                    image: "i".into(),
                    boot_delay: Duration::ZERO,
                    join_delay: Duration::ZERO,
                    delete_delay: Duration::ZERO,
                    labels: BTreeMap::new(),
                    internal_ip_base: None,
                    zones: Vec::new(),
                }],
            };
            assert!(config.validate().is_err(), "{id:?} must be rejected");
        }
        let twice = SimConfig::parse(
            "groups: [{id: a, role: Worker, image: i}, {id: a, role: ControlPlane, image: i}]",
        )
        .expect("parses");
        assert!(twice.validate().is_err());
    }
}
