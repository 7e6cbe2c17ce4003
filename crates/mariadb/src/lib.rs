//! Tidemark's database edge: the `mariabackup` command line of a streamed backup and the
//! LSNs and binlog position it leaves, binlog event times and the binlog archiver, and the
//! processes of a point-in-time restore and of a consolidation (synthetic full).
//! `tidemark-store` moves the bytes; this crate knows what they are.

pub mod applier;
pub mod archive;
pub mod backup;
pub mod binlog;
pub mod check;
pub mod clone;
pub mod cnf;
pub mod consolidate;
pub mod dump;
pub mod mysql;
pub mod oracle;
pub mod purge;
pub mod remote;
pub mod requirements;
pub mod restore;
pub mod server;
pub mod tools;

pub use backup::{EXT, Lsns, METHOD, MariaDbError, is_lsn_behind};
pub use restore::Tools;
