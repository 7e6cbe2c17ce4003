//! A local directory as a store that owns only what is really in it.
//!
//! object_store's `LocalFileSystem` follows symbolic links when it lists, reads and
//! deletes, fails a whole listing on one file name that is not UTF-8, and hides the staging
//! files (`<object>#<n>`) of uploads that never finished. A store must not: a symlink
//! `store/c/nightly/<id> → /elsewhere` would let a pass delete files in `/elsewhere`, and
//! staging files of killed pushes would fill the disk forever. So:
//!
//! - [`SafeLocal`] wraps it: every key is checked component by component (no symlink on
//!   the way, none at the end) before a read, write or delete; listings walk the tree
//!   themselves, never following a link.
//! - [`walk`] lists a directory once and sorts what it finds into objects, foreign entries
//!   (symlinks, names that are not UTF-8 or not valid keys — reported, never touched) and
//!   staging files (leftovers a pass collects by age).

use std::fmt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use jiff::Timestamp;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// What a walk of a directory found.
#[derive(Debug, Default)]
pub struct Walk {
    /// Regular files with valid keys, sorted by key.
    pub objects: Vec<ObjectMeta>,
    /// Entries that are not Tidemark's to touch: symlinks, names that are not UTF-8 or not
    /// valid keys. Relative to the walked root, as people read them.
    pub foreign: Vec<String>,
    /// Staging files of unfinished uploads (`<object>#<digits>`).
    pub staging: Vec<Staged>,
}

/// A staging file of an upload that never finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    /// Key relative to the walked root, `#<n>` included.
    pub key: String,
    pub last_modified: Timestamp,
    pub size: u64,
}

/// Whether a file name is an object_store staging file: `<name>#<digits>`.
pub fn is_staging_name(name: &str) -> bool {
    name.rsplit_once('#').is_some_and(|(base, n)| {
        !base.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Walks `root/<prefix>` without following links. Keys are relative to `root`. A missing
/// directory is an empty walk. Directories named in `skip` (relative to `root`) are not
/// entered.
///
/// # Errors
/// A directory could not be read.
pub fn walk(root: &FsPath, prefix: &str, skip: &[&str]) -> std::io::Result<Walk> {
    let mut out = Walk::default();
    let start = if prefix.is_empty() {
        root.to_path_buf()
    } else {
        root.join(prefix)
    };
    match std::fs::symlink_metadata(&start) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
        Ok(m) if m.file_type().is_symlink() => {
            out.foreign.push(prefix.to_owned());
            return Ok(out);
        }
        Ok(m) if !m.is_dir() => return Ok(out),
        Ok(_) => {}
    }
    let mut stack: Vec<(PathBuf, String)> = vec![(start, prefix.trim_end_matches('/').to_owned())];
    while let Some((dir, rel)) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            let join = |name: &str| {
                if rel.is_empty() {
                    name.to_owned()
                } else {
                    format!("{rel}/{name}")
                }
            };
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                out.foreign.push(join(&entry.file_name().to_string_lossy()));
                continue;
            };
            let key = join(&name);
            let meta = match entry.path().symlink_metadata() {
                Ok(m) => m,
                // Gone since it was listed.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            let kind = meta.file_type();
            if kind.is_symlink() {
                out.foreign.push(key);
            } else if kind.is_dir() {
                if !skip.contains(&key.as_str()) {
                    stack.push((entry.path(), key));
                }
            } else if !kind.is_file() {
                out.foreign.push(key);
            } else if is_staging_name(&name) {
                out.staging.push(Staged {
                    key,
                    last_modified: modified(&meta),
                    size: meta.len(),
                });
            } else {
                match Path::parse(&key) {
                    Ok(location) => out.objects.push(ObjectMeta {
                        location,
                        last_modified: chrono_time(&meta),
                        size: meta.len(),
                        e_tag: None,
                        version: None,
                    }),
                    Err(_) => out.foreign.push(key),
                }
            }
        }
    }
    out.objects.sort_by(|a, b| a.location.cmp(&b.location));
    out.foreign.sort();
    out.staging.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(out)
}

fn modified(meta: &std::fs::Metadata) -> Timestamp {
    meta.modified()
        .ok()
        .and_then(|t| Timestamp::try_from(t).ok())
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

fn chrono_time(meta: &std::fs::Metadata) -> chrono::DateTime<chrono::Utc> {
    let t = modified(meta);
    chrono::DateTime::from_timestamp(t.as_second(), t.subsec_nanosecond().max(0) as u32)
        .unwrap_or_default()
}

/// Removes the staging file `key` (relative to `root`, `#<n>` included) — never through a
/// symbolic link, and only a regular file with a staging name. One already gone is removed.
///
/// # Guarantees
/// Only a regular file with a staging name under `root`; never through a symbolic link,
/// never a directory.
///
/// # Errors
/// The key is not a staging file's, a link is on the way, or removing failed.
pub fn remove_staging(root: &FsPath, key: &str) -> std::io::Result<()> {
    let refuse = |why: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why);
    let parts: Vec<&str> = key.split('/').collect();
    if parts
        .iter()
        .any(|p| p.is_empty() || *p == "." || *p == "..")
        || !parts.last().is_some_and(|n| is_staging_name(n))
    {
        return Err(refuse(format!("{key} is not a staging file's key")));
    }
    let mut path = root.to_path_buf();
    for (i, part) in parts.iter().enumerate() {
        path.push(part);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let last = i + 1 == parts.len();
        if meta.file_type().is_symlink() || (last && !meta.is_file()) || (!last && !meta.is_dir()) {
            return Err(refuse(format!(
                "{} is a symbolic link or not a regular file; left alone",
                path.display()
            )));
        }
    }
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Why a key was refused.
fn refused(location: &Path, what: &str) -> object_store::Error {
    object_store::Error::PermissionDenied {
        path: location.to_string(),
        source: format!("{what}: a symbolic link inside the store is never followed").into(),
    }
}

/// `LocalFileSystem` that never goes through a symbolic link below its root.
#[derive(Debug)]
pub struct SafeLocal {
    root: PathBuf,
    inner: Arc<LocalFileSystem>,
}

impl SafeLocal {
    pub fn new(root: PathBuf, inner: LocalFileSystem) -> Self {
        SafeLocal {
            root,
            inner: Arc::new(inner),
        }
    }

    /// Refuses a key if any of its components below the root is a symbolic link (or the
    /// object itself is something other than a regular file, when it exists).
    fn guard(&self, location: &Path) -> Result<()> {
        guard(&self.root, location)
    }
}

/// See [`SafeLocal::guard`]; also used for staging files, which have no object key.
pub fn guard(root: &FsPath, location: &Path) -> Result<()> {
    let mut path = root.to_path_buf();
    let parts: Vec<_> = location.parts().collect();
    for (i, part) in parts.iter().enumerate() {
        path.push(part.as_ref());
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refused(
                    location,
                    &format!("{} is a symbolic link", path.display()),
                ));
            }
            Ok(m) if i + 1 < parts.len() && !m.is_dir() => {
                return Err(object_store::Error::NotFound {
                    path: location.to_string(),
                    source: format!("{} is not a directory", path.display()).into(),
                });
            }
            Ok(m) if i + 1 == parts.len() && !(m.is_file() || m.is_dir()) => {
                return Err(refused(
                    location,
                    &format!("{} is not a regular file", path.display()),
                ));
            }
            // Not there (yet): nothing further down can be a link.
            Err(_) => return Ok(()),
            Ok(_) => {}
        }
    }
    Ok(())
}

impl fmt::Display for SafeLocal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SafeLocal({})", self.root.display())
    }
}

/// Lists `prefix` by [`walk`] (on a blocking thread), as an object stream.
fn listing(root: PathBuf, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
    let prefix = prefix.map(|p| p.to_string()).unwrap_or_default();
    futures::stream::once(async move {
        let walked = tokio::task::spawn_blocking(move || walk(&root, &prefix, &[])).await;
        match walked {
            Ok(Ok(w)) => Ok(futures::stream::iter(w.objects.into_iter().map(Ok))),
            Ok(Err(e)) => Err(object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            }),
            Err(e) => Err(object_store::Error::Generic {
                store: "LocalFileSystem",
                source: Box::new(e),
            }),
        }
    })
    .map(|r| match r {
        Ok(s) => s.boxed(),
        Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
    })
    .flatten()
    .boxed()
}

#[async_trait]
impl ObjectStore for SafeLocal {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.guard(location)?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.guard(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.guard(location)?;
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<Path>>,
    ) -> BoxStream<'static, Result<Path>> {
        let root = self.root.clone();
        let inner = Arc::clone(&self.inner);
        locations
            .then(move |loc| {
                let root = root.clone();
                let inner = Arc::clone(&inner);
                async move {
                    let loc = loc?;
                    guard(&root, &loc)?;
                    crate::fault::delete_one(inner.as_ref(), loc).await
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        listing(self.root.clone(), prefix)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let offset = offset.clone();
        listing(self.root.clone(), prefix)
            .filter(move |r| {
                let keep = r.as_ref().map_or(true, |m| m.location > offset);
                async move { keep }
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        let dir = match prefix {
            Some(p) => {
                self.guard(p)?;
                p.parts()
                    .fold(self.root.clone(), |d, part| d.join(part.as_ref()))
            }
            None => self.root.clone(),
        };
        let mut out = ListResult {
            common_prefixes: Vec::new(),
            objects: Vec::new(),
            extensions: Default::default(),
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => {
                return Err(object_store::Error::Generic {
                    store: "LocalFileSystem",
                    source: Box::new(e),
                });
            }
        };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            let key = match prefix {
                Some(p) => format!("{p}/{name}"),
                None => name.clone(),
            };
            let Ok(location) = Path::parse(&key) else {
                continue;
            };
            if meta.file_type().is_symlink() || is_staging_name(&name) {
                continue;
            }
            if meta.is_dir() {
                out.common_prefixes.push(location);
            } else if meta.is_file() {
                out.objects.push(ObjectMeta {
                    location,
                    last_modified: chrono_time(&meta),
                    size: meta.len(),
                    e_tag: None,
                    version: None,
                });
            }
        }
        out.common_prefixes.sort();
        out.objects.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(out)
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.guard(from)?;
        self.guard(to)?;
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn staging_names() {
        assert!(is_staging_name("backup.bin#1"));
        assert!(is_staging_name("backup.bin#12"));
        assert!(!is_staging_name("backup.bin#"));
        assert!(!is_staging_name("backup.bin#x"));
        assert!(!is_staging_name("#1"));
        assert!(!is_staging_name("backup.bin"));
    }

    #[test]
    fn walk_reports_links_and_odd_names_and_never_follows() {
        use std::os::unix::ffi::OsStrExt;
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("secret"), b"x").unwrap();
        let c = root.path().join("c");
        std::fs::create_dir_all(c.join("n/20200101T000000Z-00000000")).unwrap();
        std::fs::write(c.join("n/20200101T000000Z-00000000/backup.bin"), b"ok").unwrap();
        std::fs::write(c.join("n/20200101T000000Z-00000000/backup.bin#1"), b"half").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), c.join("n/20200101T000000Z-11111111"))
            .unwrap();
        std::fs::write(c.join(std::ffi::OsStr::from_bytes(b"bad-\xff-name")), b"x").unwrap();
        let w = walk(root.path(), "c", &[]).unwrap();
        let keys: Vec<String> = w.objects.iter().map(|m| m.location.to_string()).collect();
        assert_eq!(keys, vec!["c/n/20200101T000000Z-00000000/backup.bin"]);
        assert_eq!(w.staging.len(), 1);
        assert_eq!(
            w.staging[0].key,
            "c/n/20200101T000000Z-00000000/backup.bin#1"
        );
        assert_eq!(w.foreign.len(), 2, "{:?}", w.foreign);
        assert!(
            w.foreign
                .iter()
                .any(|f| f.ends_with("20200101T000000Z-11111111"))
        );
        // Nothing through the link can be read or deleted.
        let fs = LocalFileSystem::new_with_prefix(root.path()).unwrap();
        let safe = SafeLocal::new(root.path().to_path_buf(), fs);
        let through = Path::from("c/n/20200101T000000Z-11111111/secret");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            assert!(
                safe.get_opts(&through, GetOptions::default())
                    .await
                    .is_err()
            );
            let mut d =
                safe.delete_stream(futures::stream::once(async move { Ok(through) }).boxed());
            assert!(d.next().await.unwrap().is_err());
        });
        assert!(elsewhere.path().join("secret").exists());
    }
}
