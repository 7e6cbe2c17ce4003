//! Tidemark's resource types (`tidemark.io/v1alpha1`), shared by the command line and the
//! operator so the same YAML serves both. No I/O.

pub mod config;
pub mod crd;
pub mod interval;
pub mod lifecycle;
pub mod names;
pub mod policy;
pub mod schedule;

pub use policy::{
    BackupPolicy, BackupPolicySpec, DeletionPolicy, ObjectStoreSpec, PodResources, Resources,
    RetentionSpec,
};
pub use schedule::{Backup, BackupSpec, OwnerReferenceMode, ScheduledBackup, ScheduledBackupSpec};

/// API group and version of every Tidemark kind.
pub const API_VERSION: &str = "tidemark.io/v1alpha1";
