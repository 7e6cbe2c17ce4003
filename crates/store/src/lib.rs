//! Tidemark's object-store edge: store URLs, the layout and formats of DESIGN.md §3, the
//! catalog (listing → inventory) and the executor that carries out a retention plan.

pub mod archive;
pub mod binlog;
pub mod catalog;
pub mod consolidate;
pub mod error;
pub mod executor;
pub mod fault;
pub mod format;
pub mod index;
pub mod layout;
pub mod mariadb;
pub mod open;
pub mod progress;
pub mod restore;
pub mod state;
pub mod survey;
pub mod synth;
#[cfg(feature = "test-support")]
pub mod testkit;
pub mod transfer;

pub use catalog::{Catalog, Malformed, PROTECT_LABEL, SegmentListing, StoredBackup};
pub use error::{ErrorCategory, StoreError};
pub use executor::{DeleteFailure, ExecOptions, ExecutionReport, execute};
pub use open::{Backend, ClusterStore, StoreOptions};
pub use progress::{NoProgress, Progress};
pub use survey::{Survey, SurveyOptions, survey};
