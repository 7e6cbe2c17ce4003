//! A real Kubernetes control plane for tests and benchmarks: etcd, kube-apiserver and
//! (optionally) kube-controller-manager, v1.20.2, on 127.0.0.1.
//!
//! `scripts/kube-apiserver.sh` builds the binaries once per machine (from Debian's
//! `kubernetes` source package) into `~/.cache/tidemark/kube-1.20.2/bin`; set
//! `TIDEMARK_KUBE_BIN` to use another directory. A missing binary is an error that says
//! what to run — tests never skip silently.
#![allow(clippy::expect_used, clippy::panic)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Config};
use tidemark_store::testkit::free_ports;
use tokio::sync::oneshot;

/// The admin's bearer token (group `system:masters`).
pub const ADMIN_TOKEN: &str = "tidemark-test-admin-token";
/// Where the operator runs in tests, as in `deploy/`.
pub const OPERATOR_NAMESPACE: &str = "tidemark-system";
pub const OPERATOR_SERVICE_ACCOUNT: &str = "tidemark-operator";

const START_TIMEOUT: Duration = Duration::from_secs(180);
/// The Services' cluster IPs (the `kubernetes` Service is the first).
const SERVICE_RANGE: &str = "10.0.0.0/24";

pub mod node;
mod restricted;
pub use node::Node;
pub use restricted::restricted_violations;

/// Where the Kubernetes binaries are.
///
/// # Errors
/// They are not built yet: the message says how to build them.
pub fn kube_bin() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("TIDEMARK_KUBE_BIN") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home).join(".cache/tidemark/kube-1.20.2/bin")
        }
    };
    for b in ["etcd", "kube-apiserver", "kube-controller-manager"] {
        if !dir.join(b).is_file() {
            return Err(format!(
                "{} is missing: the operator tests need a real kube-apiserver. Run scripts/kube-apiserver.sh \
                 (builds it once per machine, ~16 min) or scripts/test.sh, or set TIDEMARK_KUBE_BIN to a \
                 directory holding etcd, kube-apiserver and kube-controller-manager.",
                dir.join(b).display()
            ));
        }
    }
    Ok(dir)
}

/// A component of the control plane: its name, its process, how it was started.
#[derive(Debug)]
struct Component {
    name: &'static str,
    child: Child,
    program: std::ffi::OsString,
    args: Vec<std::ffi::OsString>,
}

/// A running control plane. Dropping it stops every process.
#[derive(Debug)]
pub struct KubeCluster {
    /// Each component's process and the program and arguments it was started with (for
    /// [`KubeCluster::restart_after`]).
    children: std::sync::Mutex<Vec<Component>>,
    dir: tempfile::TempDir,
    pub url: String,
}

impl KubeCluster {
    /// Starts etcd and kube-apiserver (and, with `controller_manager`, the garbage
    /// collector, namespace and Job controllers), installs Tidemark's CRDs (without CEL,
    /// which v1.20 refuses) and `deploy/`'s RBAC for the operator's ServiceAccount, and
    /// waits until the API answers.
    ///
    /// # Panics
    /// A binary is missing or the control plane does not come up: the test fails with the
    /// reason and the tail of the logs.
    pub async fn start(controller_manager: bool) -> Self {
        Self::start_with(controller_manager, true).await
    }

    async fn start_with(controller_manager: bool, install: bool) -> Self {
        Self::start_in(controller_manager, install, None).await
    }

    /// The control plane on 127.0.0.1 (`node: None`), or inside a node's network and mount
    /// namespaces, at the node's address, set up for a kubelet: serving certificate from
    /// the node's CA (SANs for the node address and the `kubernetes` Service), Node
    /// authorization, ServiceAccount tokens, and the controllers a node's workloads need.
    pub(crate) async fn start_in(
        controller_manager: bool,
        install: bool,
        node: Option<&node::Host>,
    ) -> Self {
        let bin = kube_bin().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().expect("temporary directory");
        let d = dir.path().to_path_buf();
        let d = d.as_path();
        let command = |program: PathBuf| match node {
            Some(host) => host.command(&program),
            None => Command::new(program),
        };
        // Inside a node's namespaces every port is free: no other test shares them.
        let (address, etcd_client, etcd_peer, secure) = match node {
            Some(host) => (host.node_ip.to_string(), 2379, 2380, 6443),
            None => {
                let p = free_ports(3);
                ("127.0.0.1".to_owned(), p[0], p[1], p[2])
            }
        };
        let mut cluster = KubeCluster {
            children: std::sync::Mutex::new(Vec::new()),
            url: format!("https://{address}:{secure}"),
            dir,
        };
        cluster.spawn(
            "etcd",
            command(bin.join("etcd"))
                .arg(format!("--data-dir={}", d.join("etcd").display()))
                .arg(format!(
                    "--listen-client-urls=http://127.0.0.1:{etcd_client}"
                ))
                .arg(format!(
                    "--advertise-client-urls=http://127.0.0.1:{etcd_client}"
                ))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"
                ))
                .arg(format!(
                    "--initial-cluster=default=http://127.0.0.1:{etcd_peer}"
                ))
                .arg("--unsafe-no-fsync"),
        );
        let key = d.join("sa.key");
        let public = d.join("sa.pub");
        run_ok(
            Command::new("openssl")
                .args(["genrsa", "-out"])
                .arg(&key)
                .arg("2048"),
        );
        run_ok(
            Command::new("openssl")
                .args(["rsa", "-pubout", "-in"])
                .arg(&key)
                .arg("-out")
                .arg(&public),
        );
        let mut tokens = format!("{ADMIN_TOKEN},admin,admin-uid,system:masters\n");
        if let Some(host) = node {
            tokens.push_str(&host.token_line());
        }
        std::fs::write(d.join("tokens.csv"), tokens).expect("tokens.csv");
        let mut apiserver = command(bin.join("kube-apiserver"));
        apiserver
            .arg(format!("--etcd-servers=http://127.0.0.1:{etcd_client}"))
            .arg(format!("--bind-address={address}"))
            .arg(format!("--advertise-address={address}"))
            .arg(format!("--secure-port={secure}"))
            .arg("--insecure-port=0")
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg(format!(
                "--token-auth-file={}",
                d.join("tokens.csv").display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", public.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                key.display()
            ))
            .arg(format!("--service-cluster-ip-range={SERVICE_RANGE}"))
            .arg("--enable-priority-and-fairness=false");
        match node {
            Some(host) => {
                apiserver
                    .arg("--authorization-mode=Node,RBAC")
                    .arg("--enable-admission-plugins=NodeRestriction")
                    .args(host.apiserver_args());
            }
            // No token controller runs: pods get no ServiceAccount token.
            None => {
                apiserver
                    .arg("--authorization-mode=RBAC")
                    .arg("--disable-admission-plugins=ServiceAccount");
            }
        }
        cluster.spawn("kube-apiserver", &mut apiserver);
        cluster.write_kubeconfig();
        let client = cluster.admin_client();
        cluster.wait_ready(&client).await;
        if controller_manager {
            let mut manager = command(bin.join("kube-controller-manager"));
            manager
                .arg(format!("--kubeconfig={}", cluster.kubeconfig().display()))
                .arg("--leader-elect=false")
                .arg("--port=0")
                .arg("--secure-port=0")
                .arg("--concurrent-gc-syncs=5");
            match node {
                Some(host) => {
                    manager
                        .arg(format!("--controllers={}", node::CONTROLLERS))
                        .arg(format!(
                            "--service-account-private-key-file={}",
                            key.display()
                        ))
                        .args(host.controller_manager_args());
                }
                None => {
                    manager.arg("--controllers=garbagecollector,namespace,job");
                }
            }
            cluster.spawn("kube-controller-manager", &mut manager);
        }
        if install {
            cluster.install(&client).await;
        }
        cluster
    }

    /// Etcd and the API server only, nothing installed (for probing).
    pub async fn start_bare() -> Self {
        Self::start_with(false, false).await
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = std::fs::File::create(self.dir.path().join(format!("{name}.log"))).expect("log");
        let child = start_logged(name, cmd, log);
        self.children
            .get_mut()
            .expect("components")
            .push(Component {
                name,
                child,
                program: cmd.get_program().to_owned(),
                args: cmd.get_args().map(std::ffi::OsStr::to_owned).collect(),
            });
    }

    /// Kills a component (SIGKILL, as a crash) and, `down` later, starts it again as it was
    /// started (its log goes on). The caller waits for it to answer.
    ///
    /// # Panics
    /// No such component, or it cannot be started.
    pub fn restart_after(&self, component: &str, down: Duration) {
        let mut children = self.children.lock().expect("components");
        let c = children
            .iter_mut()
            .find(|c| c.name == component)
            .unwrap_or_else(|| panic!("no component {component}"));
        let _ = c.child.kill();
        let _ = c.child.wait();
        std::thread::sleep(down);
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join(format!("{}.log", c.name)))
            .expect("log");
        let mut cmd = Command::new(&c.program);
        cmd.args(&c.args);
        c.child = start_logged(c.name, &mut cmd, log);
    }

    /// A component's whole log (`kube-apiserver`, `etcd`, `kube-controller-manager`).
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The tail of a component's log, for failure messages.
    pub fn log_tail(&self, name: &str) -> String {
        let text = self.log(name);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// A kubeconfig for the admin (for `kubectl`, the controller-manager and the operator
    /// binary).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn write_kubeconfig(&self) {
        std::fs::write(
            self.kubeconfig(),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\ncurrent-context: test\n",
                self.url
            ),
        )
        .expect("kubeconfig");
    }

    /// A kubeconfig that acts as the operator's ServiceAccount (the admin token,
    /// impersonating it), for running the `tidemark operator` binary.
    pub fn operator_kubeconfig(&self) -> PathBuf {
        let path = self.dir.path().join("operator-kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: operator\n  user:\n    token: {ADMIN_TOKEN}\n    as: system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SERVICE_ACCOUNT}\n    as-groups: [system:serviceaccounts, system:serviceaccounts:{OPERATOR_NAMESPACE}, system:authenticated]\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: operator\n    namespace: {OPERATOR_NAMESPACE}\ncurrent-context: test\n",
                self.url
            ),
        )
        .expect("kubeconfig");
        path
    }

    fn config(&self) -> Config {
        let mut config = Config::new(self.url.parse().expect("url"));
        config.accept_invalid_certs = true;
        config.auth_info.token = Some(ADMIN_TOKEN.to_owned().into());
        config.default_namespace = "default".into();
        config
    }

    /// A client with every right.
    pub fn admin_client(&self) -> Client {
        Client::try_from(self.config()).expect("client")
    }

    /// A client acting as the ServiceAccount `namespace/name`: exactly the rights RBAC
    /// gives it.
    pub fn client_as(&self, namespace: &str, name: &str) -> Client {
        let mut config = self.config();
        config.auth_info.impersonate = Some(format!("system:serviceaccount:{namespace}:{name}"));
        config.auth_info.impersonate_groups = Some(vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ]);
        Client::try_from(config).expect("client")
    }

    /// Installs RBAC documents (as [`crate::rbac::manifests`] makes them): namespaces,
    /// ServiceAccounts, roles and bindings.
    pub async fn install_rbac(&self, docs: &[serde_json::Value]) {
        let client = self.admin_client();
        for doc in docs {
            apply_rbac(&client, doc.clone()).await;
        }
    }

    /// The operator's client: its ServiceAccount, bound by `deploy/`'s RBAC.
    pub fn operator_client(&self) -> Client {
        self.client_as(OPERATOR_NAMESPACE, OPERATOR_SERVICE_ACCOUNT)
    }

    async fn wait_ready(&mut self, client: &Client) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let req = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("request");
            if let Ok(text) = client.request_text(req).await
                && text.trim() == "ok"
            {
                return;
            }
            let exited = self
                .children
                .lock()
                .expect("components")
                .iter_mut()
                .find_map(|c| c.child.try_wait().ok().flatten().map(|s| (c.name, s)));
            if let Some((name, status)) = exited {
                panic!(
                    "{name} exited ({status}) while starting; log:\n{}",
                    self.log_tail(name)
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "kube-apiserver not ready after {START_TIMEOUT:?}; log:\n{}",
                    self.log_tail("kube-apiserver")
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Tidemark's CRDs (without CEL) and `deploy/`'s RBAC, then waits until the CRDs are
    /// served.
    async fn install(&self, client: &Client) {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in tidemark_api::crd::all() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            crds.patch(
                &name,
                &PatchParams::apply("tidemark-test").force(),
                &Patch::Apply(tidemark_api::crd::without_cel(&crd)),
            )
            .await
            .unwrap_or_else(|e| panic!("installing {}: {e}", crd.spec.names.kind));
        }
        create(
            client,
            &Namespace {
                metadata: meta(OPERATOR_NAMESPACE, None),
                ..Default::default()
            },
        )
        .await;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), OPERATOR_NAMESPACE);
        match accounts
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata: meta(OPERATOR_SERVICE_ACCOUNT, Some(OPERATOR_NAMESPACE)),
                    ..Default::default()
                },
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating the operator's ServiceAccount: {e}"),
        }
        for doc in deploy_rbac() {
            apply_rbac(client, doc).await;
        }
        let deadline = Instant::now() + START_TIMEOUT;
        for crd in tidemark_api::crd::all() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            loop {
                let c = crds.get(&name).await.expect("crd");
                let established = c
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    break;
                }
                assert!(Instant::now() < deadline, "CRD {name} not established");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Creates a namespace for one test.
    pub async fn namespace(&self, name: &str) {
        create(
            &self.admin_client(),
            &Namespace {
                metadata: meta(name, None),
                ..Default::default()
            },
        )
        .await;
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        let children = self
            .children
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for c in children.iter_mut().rev() {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
    }
}

/// Starts `cmd` (component `name`) with its output to `log` and no input.
fn start_logged(name: &str, cmd: &mut Command, log: std::fs::File) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e}"))
}

pub const WAIT: Duration = Duration::from_secs(60);

/// Polls `f` until it gives `Some`, or fails after [`WAIT`] saying what was awaited.
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    eventually_within(what, WAIT, f).await
}

/// Waits until the operator has put the remote-cleanup finalizer on the Backup `name`.
pub async fn cleanup_finalizer(backups: &Api<tidemark_api::crd::Backup>, name: &str) {
    eventually(&format!("the finalizer on {name}"), || async {
        backups
            .get_opt(name)
            .await
            .ok()??
            .metadata
            .finalizers?
            .contains(&crate::cleanup::FINALIZER.to_owned())
            .then_some(())
    })
    .await;
}

/// [`eventually`] with a wait of its own (real pods, real backups).
pub async fn eventually_within<T, F, Fut>(what: &str, wait: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {wait:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The system clock moved by an amount the test sets, and may change while the operator
/// runs (a test's way to be days later). Clones share the amount.
#[derive(Debug, Clone, Default)]
pub struct ShiftedClock(Arc<std::sync::atomic::AtomicI64>);

impl ShiftedClock {
    pub fn new(by: jiff::SignedDuration) -> Self {
        let clock = ShiftedClock::default();
        clock.set(by);
        clock
    }

    /// From now on the clock reads `by` ahead of the system clock.
    pub fn set(&self, by: jiff::SignedDuration) {
        self.0
            .store(by.as_secs(), std::sync::atomic::Ordering::SeqCst);
    }
}

impl tidemark_engine::Clock for ShiftedClock {
    fn now(&self) -> jiff::Timestamp {
        let by = self.0.load(std::sync::atomic::Ordering::SeqCst);
        jiff::Timestamp::now() + jiff::SignedDuration::from_secs(by)
    }
}

/// Sends the operator's log lines to the test's captured output (shown when the test
/// fails): `RUST_LOG` when set, else Tidemark's lines from `info` and others' warnings.
/// Once per process; the threads of a test's runtime write into that test's output.
pub fn log_to_test_output() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,tidemark_operator=info,tidemark_engine=info,tidemark_store=info,tidemark_mariadb=info",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// A running operator; `stop` shuts it down gracefully (its lease released).
#[derive(Debug)]
pub struct Operator {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    server: tokio::task::JoinHandle<()>,
    /// Where its `/metrics`, `/healthz` and `/readyz` answer.
    pub http: std::net::SocketAddr,
}

impl Operator {
    /// Starts the real operator in this process, as the ServiceAccount `deploy/` binds,
    /// with a short lease (6 s) so that leader changes are quick.
    pub fn start(cluster: &KubeCluster, identity: &str) -> Self {
        Self::start_with_clock(cluster, identity, Arc::new(tidemark_engine::SystemClock))
    }

    /// [`Operator::start`] with the operator's clock (schedules, TTLs, retention) being
    /// `clock`, e.g. a [`ShiftedClock`] days ahead to see TTLs run out.
    pub fn start_with_clock(
        cluster: &KubeCluster,
        identity: &str,
        clock: Arc<dyn tidemark_engine::Clock>,
    ) -> Self {
        Self::start_with(cluster, identity, clock, |_| {})
    }

    /// [`Operator::start_with_clock`], with `adjust` changing the options (limits, flags).
    pub fn start_with(
        cluster: &KubeCluster,
        identity: &str,
        clock: Arc<dyn tidemark_engine::Clock>,
        adjust: impl FnOnce(&mut crate::Options),
    ) -> Self {
        Self::start_as(cluster.operator_client(), identity, clock, adjust)
    }

    /// [`Operator::start_with`] acting as `client` (e.g. another ServiceAccount, bound by
    /// other RBAC: [`KubeCluster::install_rbac`]).
    pub fn start_as(
        client: Client,
        identity: &str,
        clock: Arc<dyn tidemark_engine::Clock>,
        adjust: impl FnOnce(&mut crate::Options),
    ) -> Self {
        log_to_test_output();
        let (tx, rx) = oneshot::channel::<()>();
        let mut election = crate::leader::Election::new(OPERATOR_NAMESPACE, identity);
        election.lease_duration = Duration::from_secs(6);
        election.retry_period = Duration::from_secs(1);
        let mut options = crate::Options {
            store_retry_timeout: Duration::from_secs(3),
            ..crate::Options::new(election)
        };
        adjust(&mut options);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let http = listener.local_addr().expect("address");
        let server = tokio::spawn(crate::metrics::serve(
            tokio::net::TcpListener::from_std(listener).expect("listener"),
            options.metrics.clone(),
        ));
        let task = tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.await;
            };
            if let Err(e) = crate::run(client, options, clock, shutdown).await {
                panic!("operator stopped: {e}");
            }
        });
        Operator {
            stop: Some(tx),
            task,
            server,
            http,
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), &mut self.task)
            .await
            .expect("operator stops within 30 s")
            .expect("operator task");
        self.server.abort();
    }

    /// Whether the operator is still running (a panic that escaped would have ended it).
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Kills the operator as a crash would: its tasks dropped mid-flight, its lease left to
    /// expire.
    pub fn kill(mut self) {
        self.stop.take();
        self.task.abort();
        self.server.abort();
    }

    /// `GET path` on the operator's HTTP endpoint: the status code and the body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conn = tokio::net::TcpStream::connect(self.http)
            .await
            .expect("connect");
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut text = String::new();
        conn.read_to_string(&mut text).await.expect("read");
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (code, body)
    }
}

/// A Secret `name` in `ns` with the test S3 server's keys, as `credentialsSecret` reads it.
pub async fn s3_secret(client: &Client, ns: &str, name: &str) {
    use k8s_openapi::ByteString;
    use tidemark_store::testkit::{ACCESS_KEY, SECRET_KEY};
    let data: std::collections::BTreeMap<String, ByteString> =
        [("accessKeyId", ACCESS_KEY), ("secretAccessKey", SECRET_KEY)]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.as_bytes().to_vec())))
            .collect();
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: policy_secret_meta(name, ns),
        data: Some(data),
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the S3 Secret");
}

/// Prometheus's promtool (`TIDEMARK_PROMTOOL`, else `promtool` on the PATH; Debian's
/// `prometheus` package, which `scripts/test.sh` installs); a missing one fails, saying so.
pub fn promtool() -> Command {
    let program = std::env::var("TIDEMARK_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let ok = Command::new(&program)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "promtool ({program}) is needed: set TIDEMARK_PROMTOOL or install Debian's prometheus package (scripts/test.sh does)"
    );
    Command::new(program)
}

/// `promtool check metrics` on `text` (a `/metrics` answer): panics with its findings.
pub fn check_metrics(text: &str) {
    use std::io::Write;
    let mut child = promtool()
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write to promtool");
    let out = child.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The events of `ns` with `reason`.
pub async fn events(
    client: &Client,
    ns: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Creates a Backup object for the synthetic backup `b` (named as it, of policy `db`), with
/// `extra` merged into the object, and marks it completed as the operator would.
pub async fn completed_backup(
    api: &Api<tidemark_api::crd::Backup>,
    b: &tidemark_store::synth::SynthBackup,
    extra: serde_json::Value,
) {
    let mut obj = serde_json::json!({
        "apiVersion": "tidemark.io/v1alpha1", "kind": "Backup",
        "metadata": {"name": b.name},
        "spec": {"policy": {"name": "db"}},
    });
    merge(&mut obj, extra);
    let backup: tidemark_api::crd::Backup = serde_json::from_value(obj).expect("a Backup");
    api.create(&PostParams::default(), &backup)
        .await
        .expect("create the Backup");
    api.patch_status(
        &b.name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "phase": "completed", "backupId": b.id,
            "key": format!("{}/{}/metadata.json", b.name, b.id),
        }})),
    )
    .await
    .expect("mark the Backup completed");
}

/// Creates the pod `pod` (JSON, with its metadata) in `ns` and marks it Running at
/// 127.0.0.1 and Ready (for an hour already), as a kubelet would: the node the operator's
/// tests play.
pub async fn running_pod(client: &Client, ns: &str, pod: serde_json::Value) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(pod).expect("a Pod");
    let name = pod.metadata.name.clone().expect("the pod's name");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    mark_running(client, ns, &name).await;
}

/// Marks the pod `ns/name` Running at 127.0.0.1 and Ready since an hour ago (an
/// established primary, when it is one).
pub async fn mark_running(client: &Client, ns: &str, name: &str) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let since = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "phase": "Running", "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": since.to_string()}],
        }})),
    )
    .await
    .expect("mark the pod Running");
}

/// Merges `b` into `a` as a JSON merge patch does (objects key by key).
pub fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Secret's metadata, labelled for BackupPolicies to use
/// ([`crate::stores::POLICY_SECRET_LABEL`]).
pub fn policy_secret_meta(
    name: &str,
    ns: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        labels: Some(
            [(
                crate::stores::POLICY_SECRET_LABEL.to_owned(),
                "true".to_owned(),
            )]
            .into(),
        ),
        ..meta(name, Some(ns))
    }
}

fn meta(
    name: &str,
    namespace: Option<&str>,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        name: Some(name.to_owned()),
        namespace: namespace.map(str::to_owned),
        ..Default::default()
    }
}

async fn create<K>(client: &Client, object: &K)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    match api.create(&PostParams::default(), object).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating {object:?}: {e}"),
    }
}

/// The RBAC documents of `deploy/rbac.yaml`, as the tests install them.
fn deploy_rbac() -> Vec<serde_json::Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_saphyr::from_multiple::<serde_json::Value>(&text)
        .expect("rbac yaml")
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

async fn apply_rbac(client: &Client, json: serde_json::Value) {
    let kind = json["kind"].as_str().unwrap_or_default().to_owned();
    let pp = PostParams::default();
    let result = match kind.as_str() {
        "ServiceAccount" => {
            let a: ServiceAccount = serde_json::from_value(json).expect("ServiceAccount");
            let ns = a.metadata.namespace.clone().unwrap_or_default();
            Api::<ServiceAccount>::namespaced(client.clone(), &ns)
                .create(&pp, &a)
                .await
                .map(|_| ())
        }
        "Namespace" => Api::<Namespace>::all(client.clone())
            .create(&pp, &serde_json::from_value(json).expect("Namespace"))
            .await
            .map(|_| ()),
        "ClusterRole" => Api::<ClusterRole>::all(client.clone())
            .create(&pp, &serde_json::from_value(json).expect("ClusterRole"))
            .await
            .map(|_| ()),
        "ClusterRoleBinding" => Api::<ClusterRoleBinding>::all(client.clone())
            .create(
                &pp,
                &serde_json::from_value(json).expect("ClusterRoleBinding"),
            )
            .await
            .map(|_| ()),
        "Role" => {
            let r: Role = serde_json::from_value(json).expect("Role");
            let ns = r.metadata.namespace.clone().unwrap_or_default();
            Api::<Role>::namespaced(client.clone(), &ns)
                .create(&pp, &r)
                .await
                .map(|_| ())
        }
        "RoleBinding" => {
            let r: RoleBinding = serde_json::from_value(json).expect("RoleBinding");
            let ns = r.metadata.namespace.clone().unwrap_or_default();
            Api::<RoleBinding>::namespaced(client.clone(), &ns)
                .create(&pp, &r)
                .await
                .map(|_| ())
        }
        other => panic!("RBAC: unexpected kind {other:?}"),
    };
    match result {
        Ok(()) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("installing {kind} (RBAC): {e}"),
    }
}

/// A `pods/exec` request the API server forwarded to the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
}

/// Turns an exec request into the local process that plays the container's command
/// (`None`: no such container, refused as a kubelet would).
pub type ExecHandler = Arc<dyn Fn(&ExecRequest) -> Option<tokio::process::Command> + Send + Sync>;

/// The part of a kubelet that `pods/exec` reaches: an HTTPS server on 127.0.0.1 that the
/// API server proxies `/exec/{namespace}/{pod}/{container}?command=…` to, speaking the
/// `v4.channel.k8s.io` websocket protocol as a kubelet does (stdout on channel 1, stderr
/// on 2, the exit status as a `Status` on 3). The command runs as a local process chosen
/// by the test's handler. Register it as a Node with [`Kubelet::register`].
pub struct Kubelet {
    pub port: u16,
    /// Every request it served, in order.
    pub requests: Arc<std::sync::Mutex<Vec<ExecRequest>>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Kubelet {
    /// Serves exec requests with `handler` (a self-signed certificate: the API server
    /// does not verify a kubelet's without `--kubelet-certificate-authority`).
    ///
    /// # Panics
    /// The certificate or the listener cannot be made.
    pub async fn start(handler: ExecHandler) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (acceptor, _) = tls_acceptor(dir.path(), "kubelet");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("kubelet listener");
        let port = listener.local_addr().expect("address").port();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, handler, seen) = (acceptor.clone(), handler.clone(), seen.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await
                        && let Err(e) = serve_exec(tls, handler, seen).await
                    {
                        eprintln!("kubelet: {e}");
                    }
                });
            }
        });
        Kubelet {
            port,
            requests,
            task,
            _dir: dir,
        }
    }

    /// Creates the Node `name` with this kubelet's address (127.0.0.1 and its port), so the
    /// API server sends exec requests for pods on that node here.
    pub async fn register(&self, client: &Client, name: &str) {
        use k8s_openapi::api::core::v1::Node;
        let nodes: Api<Node> = Api::all(client.clone());
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
        }))
        .expect("node");
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating node {name}: {e}"),
        }
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {
                    "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
                    "conditions": [{"type": "Ready", "status": "True"}],
                }})),
            )
            .await
            .expect("node status");
    }
}

/// A TLS acceptor with a fresh self-signed certificate for 127.0.0.1 (made with openssl in
/// `dir`), and that certificate in PEM (a client's CA bundle).
fn tls_acceptor(dir: &Path, name: &str) -> (tokio_rustls::TlsAcceptor, String) {
    use rustls_pki_types::pem::PemObject;
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    run_ok(
        Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
            ])
            .arg(format!("/CN={name}"))
            // A leaf, not a CA, so that it may be its own trust anchor (caBundle).
            .args([
                "-addext",
                "subjectAltName=IP:127.0.0.1",
                "-addext",
                "basicConstraints=critical,CA:FALSE",
                "-addext",
                "extendedKeyUsage=serverAuth",
                "-keyout",
            ])
            .arg(&key)
            .arg("-out")
            .arg(&cert),
    );
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(&cert)
        .expect("certificate")
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate");
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&key).expect("key");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .expect("TLS config");
    let pem = std::fs::read_to_string(&cert).expect("certificate");
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), pem)
}

/// An HTTPS webhook receiver on 127.0.0.1 for DeleteHook tests: `POST /ok` answers 200,
/// `/fail` 500, `/slow` after 10 s. Every request is recorded (path and JSON body) when it
/// arrives, in order.
pub struct Webhook {
    /// `https://127.0.0.1:<port>`
    pub url: String,
    /// The server's certificate, for `caBundle`.
    pub ca_bundle: String,
    pub calls: Arc<std::sync::Mutex<Vec<(String, serde_json::Value)>>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Webhook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhook")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Webhook {
    /// # Panics
    /// The certificate or the listener cannot be made.
    pub async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().expect("temporary directory");
        let (acceptor, ca_bundle) = tls_acceptor(dir.path(), "webhook");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("webhook listener");
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().expect("address").port()
        );
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = calls.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen) = (acceptor.clone(), seen.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let (head, body) = loop {
                        let Ok(n) = tls.read(&mut chunk).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..n]);
                        let text = String::from_utf8_lossy(&buf).into_owned();
                        if let Some((head, body)) = text.split_once("\r\n\r\n") {
                            let length = head
                                .lines()
                                .find_map(|l| {
                                    let (k, v) = l.split_once(':')?;
                                    k.eq_ignore_ascii_case("content-length")
                                        .then(|| v.trim().parse::<usize>().ok())?
                                })
                                .unwrap_or(0);
                            if body.len() >= length {
                                break (head.to_owned(), body.to_owned());
                            }
                        }
                    };
                    let path = head
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_owned();
                    let json = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
                    seen.lock().expect("calls").push((path.clone(), json));
                    if path == "/endless" {
                        // An error answer whose body never ends: a client must stop reading.
                        let _ = tls
                            .write_all(
                                b"HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\n\r\n",
                            )
                            .await;
                        let chunk = vec![b'x'; 64 * 1024];
                        while tls.write_all(&chunk).await.is_ok() {}
                        return;
                    }
                    let (code, text) = match path.as_str() {
                        "/ok" => ("200 OK", "noted"),
                        "/slow" => {
                            tokio::time::sleep(Duration::from_secs(10)).await;
                            ("200 OK", "late")
                        }
                        "/slower" => {
                            tokio::time::sleep(Duration::from_secs(40)).await;
                            ("200 OK", "very late")
                        }
                        _ => ("500 Internal Server Error", "no such ticket"),
                    };
                    let _ = tls
                        .write_all(
                            format!(
                                "HTTP/1.1 {code}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                                text.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Webhook {
            url,
            ca_bundle,
            calls,
            task,
            _dir: dir,
        }
    }
}

/// One exec: the websocket handshake (choosing `v4.channel.k8s.io`), the process, its
/// output on channels 1 and 2, its exit as a `Status` on channel 3.
async fn serve_exec<S>(
    stream: S,
    handler: ExecHandler,
    seen: Arc<std::sync::Mutex<Vec<ExecRequest>>>,
) -> Result<(), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures::SinkExt;
    use tokio::io::AsyncReadExt;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};

    let uri = Arc::new(std::sync::Mutex::new(String::new()));
    let seen_uri = uri.clone();
    // The signature is tungstenite's.
    #[allow(clippy::result_large_err)]
    let callback = move |req: &Request, mut res: Response| -> Result<Response, ErrorResponse> {
        *seen_uri.lock().expect("uri") = req.uri().to_string();
        let offered = req
            .headers()
            .get("sec-websocket-protocol")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if offered.split(',').any(|p| p.trim() == "v4.channel.k8s.io") {
            res.headers_mut().insert(
                "sec-websocket-protocol",
                http::HeaderValue::from_static("v4.channel.k8s.io"),
            );
        }
        Ok(res)
    };
    let mut ws = tokio_tungstenite::accept_hdr_async(stream, callback)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let uri = uri.lock().expect("uri").clone();
    let request = parse_exec(&uri).ok_or_else(|| format!("not an exec request: {uri}"))?;
    seen.lock().expect("requests").push(request.clone());
    let status = |code: Option<i32>, message: &str| {
        let v = match code {
            Some(0) => serde_json::json!({"metadata": {}, "status": "Success"}),
            Some(c) => {
                serde_json::json!({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
                "message": format!("command terminated with non-zero exit code: {message}"),
                "details": {"causes": [{"reason": "ExitCode", "message": c.to_string()}]}})
            }
            None => serde_json::json!({"metadata": {}, "status": "Failure", "message": message}),
        };
        let mut bytes = vec![3u8];
        bytes.extend(serde_json::to_vec(&v).expect("status"));
        Message::binary(bytes)
    };
    let Some(mut cmd) = handler(&request) else {
        let m = status(
            None,
            &format!(
                "container {} not found in pod {}",
                request.container, request.pod
            ),
        );
        let _ = ws.send(m).await;
        let _ = ws.close(None).await;
        return Ok(());
    };
    let wants_stdin = uri.contains("stdin=true") || uri.contains("input=1");
    let mut child = cmd
        .stdin(if wants_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("running {:?}: {e}", request.command))?;
    // Stdin: the client's frames on channel 0, passed to the process as they come (v4 has
    // no end-of-input signal: the process reads what it needs).
    let (mut ws, mut incoming) = futures::StreamExt::split(ws);
    let mut stdin = child.stdin.take();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let (mut out_open, mut err_open) = (true, true);
    let (mut out_buf, mut err_buf) = (vec![0u8; 64 * 1024], vec![0u8; 8192]);
    while out_open || err_open {
        let (channel, n) = tokio::select! {
            r = out.read(&mut out_buf[..]), if out_open => (1u8, r.map_err(|e| e.to_string())?),
            r = err.read(&mut err_buf[..]), if err_open => (2u8, r.map_err(|e| e.to_string())?),
            m = futures::StreamExt::next(&mut incoming), if stdin.is_some() => {
                use tokio::io::AsyncWriteExt;
                match (m, stdin.as_mut()) {
                    (Some(Ok(m)), Some(pipe)) => {
                        let data = m.into_data();
                        if data.first() == Some(&0) && pipe.write_all(&data[1..]).await.is_err() {
                            stdin = None;
                        }
                    }
                    _ => stdin = None,
                }
                continue;
            }
        };
        if n == 0 {
            if channel == 1 {
                out_open = false
            } else {
                err_open = false
            }
            continue;
        }
        let data = if channel == 1 {
            &out_buf[..n]
        } else {
            &err_buf[..n]
        };
        let mut frame = Vec::with_capacity(n + 1);
        frame.push(channel);
        frame.extend_from_slice(data);
        if ws.send(Message::binary(frame)).await.is_err() {
            // The client went away: stop the command, as a kubelet does.
            let _ = child.start_kill();
            return Ok(());
        }
    }
    drop(stdin);
    let exit = child.wait().await.map_err(|e| e.to_string())?;
    let code = exit.code().unwrap_or(-1);
    let _ = ws.send(status(Some(code), &format!("exit {code}"))).await;
    let _ = ws.close().await;
    Ok(())
}

/// `/exec/{namespace}/{pod}/{container}?command=a&command=b&output=1…`.
fn parse_exec(uri: &str) -> Option<ExecRequest> {
    let (path, query) = uri.split_once('?').unwrap_or((uri, ""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["exec", namespace, pod, container] = parts.as_slice() else {
        return None;
    };
    let command = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "command")
        .map(|(_, v)| percent_decode(v))
        .collect();
    Some(ExecRequest {
        namespace: percent_decode(namespace),
        pod: percent_decode(pod),
        container: percent_decode(container),
        command,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
