//! Tidemark's object-store edge: store URLs, the layout and formats of DESIGN.md §3, the
//! catalog (listing → inventory), the segment index, the one deletion executor, and
//! streaming push and fetch. It knows bytes and keys, not databases (`tidemark-mariadb`)
//! and not use cases (`tidemark-engine`).

pub mod bandwidth;
pub mod bounded;
pub mod budget;
pub mod catalog;
pub mod codec;
pub mod compress;
pub mod copy;
pub mod crypt;
pub mod deny;
pub mod error;
pub mod executor;
pub mod fault;
pub mod format;
pub mod index;
pub mod layout;
pub mod lifecycle;
pub mod local;
pub mod metacache;
pub mod objectlock;
pub mod open;
pub mod progress;
pub mod rawfields;
pub mod state;
pub mod survey;
pub mod synth;
#[cfg(feature = "test-support")]
pub mod testkit;
pub mod tls;
pub mod transfer;
pub mod uploads;

pub use catalog::{Catalog, Malformed, PROTECT_LABEL, SegmentListing, StoredBackup};
pub use error::{ErrorCategory, StoreError};
pub use executor::{
    Consolidation, DeleteFailure, Deletions, ExecOptions, ExecutionReport, execute,
};
pub use open::{Backend, CloudCredentials, ClusterStore, S3Credentials, StoreOptions};
pub use progress::{NoProgress, Progress};
pub use survey::{Survey, SurveyOptions, survey};
