//! Durable state of `tidemark run`, kept in the store beside the backups so that a restart
//! (or another machine) resumes without a duplicate or a lost slot:
//! `<cluster>/_state/run.json` holds each schedule's status and the last retention run.
//! Written with conditional puts: two runners on one cluster cannot both advance it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use object_store::path::Path;
use object_store::{ObjectStoreExt, UpdateVersion};
use serde::{Deserialize, Serialize};
use tidemark_core::schedule::ScheduleStatus;

use crate::error::{StoreError, is_not_found, request, write_err};
use crate::layout;
use crate::open::ClusterStore;

/// Version of `_state/run.json`.
pub const STATE_FORMAT_VERSION: u32 = 1;

/// `_state/run.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunState {
    pub format_version: u32,
    /// Status of each ScheduledBackup, by name.
    #[serde(default)]
    pub schedules: BTreeMap<String, ScheduleStatus>,
    /// When the retention pass last ran.
    #[serde(default)]
    pub last_retention_run_time: Option<Timestamp>,
    /// Backups started and not yet finished, by schedule: written before a backup starts,
    /// so a run that dies during one leaves a record the next run finds (even when no
    /// byte reached the store) and records the attempt as failed.
    #[serde(default)]
    pub running: BTreeMap<String, Attempt>,
    /// Fields of newer versions, kept on rewrite.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One backup attempt in flight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub backup_name: String,
    pub backup_id: String,
    pub started_at: Timestamp,
    #[serde(default)]
    pub immediate: bool,
}

/// The state and the version it was read at.
#[derive(Debug, Clone)]
pub struct StoredState {
    pub state: RunState,
    version: Option<UpdateVersion>,
}

fn key() -> Path {
    Path::from_iter([layout::STATE, "run.json"])
}

impl StoredState {
    /// A state never written (saving it creates the file, and fails if one exists).
    pub fn empty() -> Self {
        StoredState {
            state: RunState {
                format_version: STATE_FORMAT_VERSION,
                ..Default::default()
            },
            version: None,
        }
    }

    /// Reads `_state/run.json` (empty state when absent).
    ///
    /// # Errors
    /// A failed request; a malformed file or one of a newer format.
    pub async fn load(store: &ClusterStore) -> Result<Self, StoreError> {
        let key = key();
        let got = match store.inner.get(&key).await {
            Ok(g) => g,
            Err(e) if is_not_found(&e) => return Ok(Self::empty()),
            Err(source) => return Err(request(store, "reading", &key, source)),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|source| request(store, "reading", &key, source))?;
        let state: RunState =
            serde_json::from_slice(&bytes).map_err(|e| StoreError::MalformedState {
                url: store.url.clone(),
                key: store.display_key(&key),
                problem: e.to_string(),
            })?;
        if state.format_version > STATE_FORMAT_VERSION {
            return Err(StoreError::MalformedState {
                url: store.url.clone(),
                key: store.display_key(&key),
                problem: format!(
                    "formatVersion {} is newer than this Tidemark understands ({STATE_FORMAT_VERSION}); upgrade Tidemark",
                    state.format_version
                ),
            });
        }
        Ok(StoredState {
            state,
            version: Some(version),
        })
    }

    /// Writes the state if nobody else changed it since it was read.
    ///
    /// # Errors
    /// Another writer changed it ([`StoreError::StateContention`]: another `tidemark run`
    /// on the same cluster); a failed request.
    pub async fn save(&mut self, store: &ClusterStore) -> Result<(), StoreError> {
        let key = key();
        let body = serde_json::to_vec_pretty(&self.state).map_err(|source| StoreError::Encode {
            url: store.url.clone(),
            what: "_state/run.json",
            source,
        })?;
        let written = match &self.version {
            None => crate::index::create_head(store, &key, body).await,
            Some(v) => crate::index::replace_head(store, &key, v, body).await,
        };
        match written {
            Ok(()) => {}
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => {
                return Err(StoreError::StateContention {
                    url: store.url.clone(),
                    key: store.display_key(&key),
                });
            }
            Err(source) => return Err(write_err(store, &key, source)),
        }
        let meta = store
            .inner
            .head(&key)
            .await
            .map_err(|source| request(store, "reading", &key, source))?;
        self.version = Some(UpdateVersion {
            e_tag: meta.e_tag,
            version: meta.version,
        });
        Ok(())
    }
}
