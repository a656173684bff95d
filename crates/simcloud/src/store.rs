//! The one place the sim-cloud's state lives while it runs: every change is
//! made on a copy, written to the state file, and only then becomes the
//! state. So an answer the sim gave is never lost by a crash, and a change
//! that could not be saved is not made at all.

use std::path::PathBuf;

use tokio::sync::{Mutex, Notify};

use crate::model::{Cloud, ModelError};
use crate::persist::{self, PersistError};

/// The running sim-cloud's state, saved on every change (see the module docs).
pub struct SimStore {
    cloud: Mutex<Cloud>,
    state_file: PathBuf,
    /// Signalled after every change, so the joiner can look at new timers.
    changed: Notify,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The model refused it.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// It could not be saved.
    #[error(transparent)]
    Persist(#[from] PersistError),
    /// The task writing the state file panicked or was cancelled.
    #[error("writing the state file: {0}")]
    Writer(#[from] tokio::task::JoinError),
}

impl SimStore {
    /// Holds `cloud`, saving every change to `state_file`.
    pub fn new(cloud: Cloud, state_file: PathBuf) -> SimStore {
        SimStore {
            cloud: Mutex::new(cloud),
            state_file,
            changed: Notify::new(),
        }
    }

    /// Looks at the state.
    pub async fn read<T>(&self, f: impl FnOnce(&Cloud) -> T) -> T {
        f(&*self.cloud.lock().await)
    }

    /// Changes the state through `f` and saves it before anyone sees it.
    /// The lock is held while saving, so the file sees changes in order.
    pub async fn mutate<T>(
        &self,
        f: impl FnOnce(&mut Cloud) -> Result<T, ModelError>,
    ) -> Result<T, StoreError> {
        let mut cloud = self.cloud.lock().await;
        let mut next = cloud.clone();
        let out = f(&mut next)?;
        if next != *cloud {
            let bytes = persist::encode(&next).map_err(|source| PersistError::Format {
                path: self.state_file.display().to_string(),
                source,
            })?;
            let path = self.state_file.clone();
            tokio::task::spawn_blocking(move || persist::write(&path, &bytes)).await??;
            *cloud = next;
            self.changed.notify_one();
        }
        Ok(out)
    }

    /// Resolves after the next change (or at once if one happened since the
    /// last call: the signal is kept until someone waits).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SimConfig;

    #[tokio::test]
    async fn changes_reach_the_file_and_failed_changes_do_not_happen() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("state.json");
        let config = SimConfig::parse("groups: [{id: w, role: Worker, image: v1}]").expect("a config");
        let mut cloud = Cloud::default();
        cloud.apply_config(&config, 0);
        let store = SimStore::new(cloud, path.clone());
        store
            .mutate(|c| c.create("w", None, 10).map(|_| ()))
            .await
            .expect("created");
        let saved = persist::load(&path).expect("readable").expect("written");
        assert_eq!(saved.instances.len(), 1);
        store.changed().await; // the change above left its signal
        let err = store.mutate(|c| c.create("nope", None, 10)).await;
        assert!(matches!(err, Err(StoreError::Model(ModelError::UnknownGroup(_)))));
        assert_eq!(store.read(|c| c.instances.len()).await, 1);
    }
}
