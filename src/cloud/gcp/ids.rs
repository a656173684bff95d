//! The names GCP gives things, as pure functions: scaling group IDs
//! (`projects/P/zones/Z/instanceGroupManagers/G`), provider IDs
//! (`gce://P/Z/I`), the resource URLs of Compute's answers, the names of
//! new instances and instance templates.

use sha2::{Digest, Sha256};

use super::super::CloudError;

/// The prefix of the resource URLs in Compute's answers. Compared without
/// it: nodewarden's IDs and images are written the short way.
pub const URL_PREFIX: &str = "https://www.googleapis.com/compute/v1/";

/// `https://www.googleapis.com/compute/v1/projects/...` → `projects/...`;
/// a path without the prefix is returned as it is.
pub fn short(url: &str) -> &str {
    url.strip_prefix(URL_PREFIX)
        .or_else(|| url.strip_prefix("https://compute.googleapis.com/compute/v1/"))
        .unwrap_or(url)
}

/// A managed instance group, as a ScalingGroup's groupId names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupRef {
    /// Its project (an ID; `created-by` may name it by number).
    pub project: String,
    /// Its zone.
    pub zone: String,
    /// The group manager's name.
    pub name: String,
}

impl GroupRef {
    /// Parses `projects/P/zones/Z/instanceGroupManagers/G` (a full URL too).
    pub fn parse(id: &str) -> Result<GroupRef, CloudError> {
        let invalid = || {
            CloudError::Config(format!(
                "scaling group {id:?} is not projects/<project>/zones/<zone>/instanceGroupManagers/<name>"
            ))
        };
        match short(id).split('/').collect::<Vec<_>>().as_slice() {
            ["projects", project, "zones", zone, "instanceGroupManagers", name]
                if !project.is_empty() && !zone.is_empty() && !name.is_empty() =>
            {
                Ok(GroupRef {
                    project: project.to_string(),
                    zone: zone.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(invalid()),
        }
    }

    /// The group's ID as nodewarden writes it.
    pub fn id(&self) -> String {
        format!(
            "projects/{}/zones/{}/instanceGroupManagers/{}",
            self.project, self.zone, self.name
        )
    }
}

/// An instance, as its Node's providerID names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceRef {
    /// Its project's ID.
    pub project: String,
    /// Its zone.
    pub zone: String,
    /// The instance's name (its Node's name).
    pub name: String,
}

impl InstanceRef {
    /// Parses `gce://P/Z/I`.
    pub fn parse(provider_id: &str) -> Result<InstanceRef, CloudError> {
        let invalid = |reason: &str| CloudError::InvalidProviderId {
            provider_id: provider_id.to_string(),
            reason: reason.to_string(),
        };
        let rest = provider_id
            .strip_prefix("gce://")
            .ok_or_else(|| invalid("not gce://"))?;
        match rest.split('/').collect::<Vec<_>>().as_slice() {
            [project, zone, name] if !project.is_empty() && !zone.is_empty() && !name.is_empty() => {
                Ok(InstanceRef {
                    project: project.to_string(),
                    zone: zone.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(invalid("not gce://<project>/<zone>/<instance>")),
        }
    }

    /// The provider ID of this instance.
    pub fn provider_id(&self) -> String {
        format!("gce://{}/{}/{}", self.project, self.zone, self.name)
    }

    /// Its path under a project, as deleteInstances takes it.
    pub fn zonal_path(&self) -> String {
        format!("zones/{}/instances/{}", self.zone, self.name)
    }
}

/// The group a `created-by` metadata value names:
/// `projects/<project number or id>/zones/Z/instanceGroupManagers/G`.
pub fn created_by(value: &str) -> Option<GroupRef> {
    GroupRef::parse(value).ok()
}

/// The last segment of a URL or path (a template's name from its link).
pub fn last_segment(url: &str) -> &str {
    url.rsplit('/').next().unwrap_or(url)
}

/// The zone of a zone URL (`.../zones/europe-west3-b` → `europe-west3-b`).
pub fn zone_name(url: &str) -> &str {
    last_segment(url)
}

/// The characters GCE instance names may end with.
const NAME_ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// How many characters follow the group's base name: Constellation takes
/// four at random; five cut a chance collision of two keys to one in 60
/// million.
const SUFFIX_LEN: usize = 5;

/// The name of the instance created for idempotency key `request_id`:
/// `<base>-<suffix>`, the suffix derived from the key, so a create asked
/// again (its answer lost) names the same instance and cannot start a
/// second one.
pub fn instance_name_for(base: &str, request_id: &str) -> String {
    let digest = Sha256::digest(request_id.as_bytes());
    let suffix: String = digest
        .iter()
        .take(SUFFIX_LEN)
        .map(|b| NAME_ALPHABET[usize::from(*b) % NAME_ALPHABET.len()] as char)
        .collect();
    format!("{base}-{suffix}")
}

/// A random instance name for a create without a key (Constellation's way).
pub fn random_instance_name(base: &str) -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    let suffix: String = (0..SUFFIX_LEN)
        .map(|_| NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())] as char)
        .collect();
    format!("{base}-{suffix}")
}

/// The name of the template that replaces `current` (Constellation's
/// scheme): a trailing `-<n>` counts up, else `-1` is added.
pub fn next_template_name(current: &str) -> String {
    if let Some((stem, n)) = current.rsplit_once('-')
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = n.parse::<u64>()
    {
        return format!("{stem}-{}", n + 1);
    }
    format!("{current}-1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_parse_short_or_as_urls() {
        let g = GroupRef::parse("projects/p/zones/europe-west3-b/instanceGroupManagers/workers").expect("ok");
        assert_eq!(
            (g.project.as_str(), g.zone.as_str(), g.name.as_str()),
            ("p", "europe-west3-b", "workers")
        );
        let url = format!("{URL_PREFIX}{}", g.id());
        assert_eq!(GroupRef::parse(&url).expect("url"), g);
        for bad in [
            "workers",
            "projects/p/zones/z/instanceGroups/g",
            "projects//zones/z/instanceGroupManagers/g",
            "projects/p/regions/r/instanceGroupManagers/g",
        ] {
            assert!(GroupRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn provider_ids_round_trip_and_refuse_others() {
        let i = InstanceRef::parse("gce://p/z/worker-abcd").expect("ok");
        assert_eq!(i.provider_id(), "gce://p/z/worker-abcd");
        assert_eq!(i.zonal_path(), "zones/z/instances/worker-abcd");
        for bad in ["aws:///z/i-1", "gce://p/z", "gce://p//i", "gce://p/z/i/x"] {
            assert!(InstanceRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_are_compared_short() {
        assert_eq!(
            short("https://www.googleapis.com/compute/v1/projects/p/global/images/i"),
            "projects/p/global/images/i"
        );
        assert_eq!(short("projects/p/global/images/i"), "projects/p/global/images/i");
        assert_eq!(
            last_segment("https://x/projects/p/global/instanceTemplates/t-3"),
            "t-3"
        );
        assert_eq!(
            created_by("projects/123/zones/z/instanceGroupManagers/g").map(|g| g.project),
            Some("123".to_string())
        );
    }

    #[test]
    fn a_key_names_one_instance_and_keys_differ() {
        let a = instance_name_for("worker", "uid-1");
        assert_eq!(a, instance_name_for("worker", "uid-1"));
        assert_ne!(a, instance_name_for("worker", "uid-2"));
        assert_eq!(a.len(), "worker-".len() + SUFFIX_LEN);
        assert!(a["worker-".len()..].bytes().all(|b| NAME_ALPHABET.contains(&b)));
        let r = random_instance_name("worker");
        assert!(r.starts_with("worker-") && r.len() == a.len());
    }

    #[test]
    fn template_names_count_up() {
        assert_eq!(next_template_name("worker-template"), "worker-template-1");
        assert_eq!(next_template_name("worker-template-1"), "worker-template-2");
        assert_eq!(next_template_name("t-9"), "t-10");
        assert_eq!(next_template_name("t-"), "t--1");
    }
}
