//! The state file: the whole simulated cloud as JSON, rewritten after every
//! change and read back on start, so a killed sim-cloud loses nothing it
//! acknowledged. Writes go to a temporary file that is synced and renamed
//! over the old one, so a crash leaves either the old or the new state,
//! never half of one.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::Cloud;

/// Bumped when the format changes incompatibly.
const VERSION: u32 = 1;

#[derive(Serialize, Deserialize)]
struct StateFile {
    version: u32,
    cloud: Cloud,
}

/// Why the state file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// Reading, writing, syncing or renaming failed.
    #[error("state file {path}: {source}")]
    Io {
        /// The file (or its temporary sibling).
        path: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file is not JSON of the expected shape (or the state could not
    /// be encoded).
    #[error("state file {path} is not valid: {source}")]
    Format {
        /// The file.
        path: String,
        /// What the parser found.
        source: serde_json::Error,
    },
    /// The file was written by a sim-cloud with another format.
    #[error("state file {path} has version {found}; this sim-cloud reads version {VERSION}")]
    Version {
        /// The file.
        path: String,
        /// The version it has.
        found: u32,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PersistError + '_ {
    move |source| PersistError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The cloud saved at `path`, or `None` when there is no file yet.
pub fn load(path: &Path) -> Result<Option<Cloud>, PersistError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    };
    let file: StateFile = serde_json::from_slice(&bytes).map_err(|source| PersistError::Format {
        path: path.display().to_string(),
        source,
    })?;
    if file.version != VERSION {
        return Err(PersistError::Version {
            path: path.display().to_string(),
            found: file.version,
        });
    }
    Ok(Some(file.cloud))
}

/// The bytes `save` writes (serialized under the lock, written outside it).
pub fn encode(cloud: &Cloud) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec_pretty(&StateFile {
        version: VERSION,
        cloud: cloud.clone(),
    })
}

/// Atomically replaces the file at `path` with `bytes` (from `encode`).
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    let tmp = temporary(path);
    let mut file = std::fs::File::create(&tmp).map_err(io(&tmp))?;
    file.write_all(bytes).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io(path))?;
    // Make the rename itself durable; best effort (not every filesystem lets
    // a directory be opened and synced).
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Saves `cloud` at `path` (encode + write).
pub fn save(path: &Path, cloud: &Cloud) -> Result<(), PersistError> {
    let bytes = encode(cloud).map_err(|source| PersistError::Format {
        path: path.display().to_string(),
        source,
    })?;
    write(path, &bytes)
}

/// `<path>.tmp` beside the file, so the rename stays on one filesystem.
fn temporary(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimConfig;

    fn cloud() -> Cloud {
        let config = SimConfig::parse(
            "groups: [{id: w, role: Worker, initialSize: 2, image: v1, bootDelay: 1s, deleteDelay: 2s}]",
        )
        .expect("a config");
        let mut cloud = Cloud::default();
        cloud.apply_config(&config, 1_000);
        cloud.faults.never_join = 3;
        cloud.faults.delete_delay = Some(std::time::Duration::from_millis(1500));
        let (created, _) = cloud.create("w", Some("req".into()), 2_000).expect("created");
        cloud.delete(&created.name, 2_500).expect("known");
        cloud.mark_joined("w-00000", 1_000);
        cloud
    }

    #[test]
    fn state_round_trips_through_the_file() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("state.json");
        assert_eq!(load(&path).expect("no file is fine"), None);
        let cloud = cloud();
        save(&path, &cloud).expect("saved");
        assert_eq!(load(&path).expect("loaded"), Some(cloud.clone()));
        assert!(!temporary(&path).exists(), "the temporary file was renamed away");
        let mut changed = cloud;
        changed.set_group_image("w", "v2").expect("known group");
        save(&path, &changed).expect("saved again");
        assert_eq!(load(&path).expect("loaded"), Some(changed));
    }

    #[test]
    fn garbage_and_unknown_versions_are_errors_not_empty_clouds() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("state.json");
        std::fs::write(&path, b"{not json").expect("written");
        assert!(matches!(load(&path), Err(PersistError::Format { .. })));
        std::fs::write(
            &path,
            br#"{"version": 99, "cloud": {"groups": {}, "instances": {}, "nextSerial": 0, "faults": {}}}"#,
        )
        .expect("written");
        assert!(matches!(
            load(&path),
            Err(PersistError::Version { found: 99, .. })
        ));
    }
}
