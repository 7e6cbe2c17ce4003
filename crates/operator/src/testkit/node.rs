//! A real single-node Kubernetes cluster for tests: the control plane of [`KubeCluster`]
//! plus containerd, kubelet, kube-scheduler and kube-proxy, all inside network and mount
//! namespaces of their own, so that real pods, Jobs, exec streams, volumes and Services
//! run and nothing leaks onto the machine.
//!
//! The layout (see `scripts/kube-node.sh` for what is installed and built):
//! - one *holder* process (`unshare --net --mount`) owns the namespaces; every daemon is
//!   started inside them with `nsenter`, and joins a cgroup of this node's own
//!   (`tidemark-node-<test pid>` in every v1 hierarchy) before it runs, so that everything
//!   the node starts — containers and shims included — is found and stopped by that cgroup;
//! - a veth pair joins the node to the machine: `host_ip` on the machine's side (where
//!   servers that pods must reach listen: SeaweedFS, webhook receivers), `node_ip` on the
//!   node's side (the node's address and the API server's). The node has no default route,
//!   so no pod reaches beyond the machine; pods get a CNI bridge on [`POD_RANGE`] with their
//!   traffic to the machine masqueraded to `node_ip`; Services are kube-proxy's iptables
//!   rules inside the node's namespace;
//! - `/run` (tmpfs), `/var/lib` and `/var/log` are private to the node, and so are the
//!   kernel tunables a kubelet rewrites;
//! - images come from archives (no registry): the pause and MariaDB images that
//!   `scripts/kube-node.sh` caches, and any the test adds (the operator image);
//! - cluster DNS: dnsmasq on `node_ip` (the kubelet's `clusterDNS`) answers
//!   `cluster.local` from a hosts file that a task of the test rewrites from the
//!   Services and Endpoints every second — Service names, headless Services and
//!   StatefulSet pods (`<pod>.<service>.<ns>.svc.cluster.local`), as CoreDNS would.
//!
//! Dropping a [`Node`] kills everything in its cgroup, removes the cgroups, the veth pair
//! (with the namespaces, their bridges and iptables rules) and the state directory; a node
//! left behind by a killed test run is removed by the next start.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Endpoints, Node as K8sNode, PersistentVolume, Service, ServiceAccount,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use tidemark_store::testkit::TestCa;

use super::{KubeCluster, kube_bin, run_ok};

/// What the node's kube-controller-manager runs: what Deployments, StatefulSets, Jobs,
/// Services, claims and ServiceAccount tokens need, cascades, and the node lifecycle (it
/// lifts the `not-ready` taint a kubelet registers with).
pub(crate) const CONTROLLERS: &str = "garbagecollector,namespace,job,serviceaccount,\
serviceaccount-token,endpoint,endpointslice,replicaset,deployment,statefulset,\
persistentvolume-binder,pvc-protection,pv-protection,podgc,nodelifecycle";

/// The node's name (and its `kubernetes.io/hostname` label).
pub const NODE_NAME: &str = "tidemark-node";
/// The pods' addresses (host-local IPAM on the node's bridge).
pub const POD_RANGE: &str = "10.244.0.0/24";
/// The images `scripts/kube-node.sh` builds (names kept in sync with it).
pub const PAUSE_IMAGE: &str = "tidemark.test/pause:1";
pub const MARIADB_IMAGE: &str = "tidemark.test/mariadb:10.11";
/// The StorageClass of [`Node::local_volumes`].
pub const LOCAL_STORAGE_CLASS: &str = "local";
/// The kubelet's bearer token (user `system:node:<NODE_NAME>`, group `system:nodes`).
const NODE_TOKEN: &str = "tidemark-test-node-token";
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The recipe version of `scripts/kube-node.sh`'s images.
const IMAGES_RECIPE: &str = "node-3";

/// Where `scripts/kube-node.sh` put the image archives.
///
/// # Errors
/// They are not built yet: the message says how to build them.
pub fn images_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("TIDEMARK_NODE_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            PathBuf::from(home)
                .join(".cache/tidemark")
                .join(IMAGES_RECIPE)
        }
    };
    for f in ["pause.tar", "mariadb.tar"] {
        if !dir.join(f).is_file() {
            return Err(format!(
                "{} is missing: the real-node tests need the images and packages that \
                 scripts/kube-node.sh installs and builds once per machine (or run scripts/test.sh).",
                dir.join(f).display()
            ));
        }
    }
    Ok(dir)
}

/// Programs the node runs that come from Debian packages, and where a missing one comes from.
const TOOLS: &[(&str, &str)] = &[
    ("/usr/bin/containerd", "containerd"),
    ("/usr/bin/ctr", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/bin/nsenter", "util-linux"),
    ("/usr/bin/unshare", "util-linux"),
    ("/usr/sbin/ip", "iproute2"),
    ("/usr/bin/openssl", "openssl"),
    ("/usr/sbin/dnsmasq", "dnsmasq-base"),
];

/// The machine's side of a node: the namespaces' holder, the cgroup, the veth pair, the
/// certificates. Dropping it stops every process of the node (whatever started them) and
/// removes what it made, so that a start that fails half-way leaves nothing behind.
#[derive(Debug)]
pub(crate) struct Host {
    holder: Child,
    holder_pid: u32,
    cgroup: Cgroup,
    pub(crate) node_ip: Ipv4Addr,
    pub(crate) host_ip: Ipv4Addr,
    host_link: String,
    state: PathBuf,
}

impl Host {
    fn create(state: &Path) -> Self {
        sweep_stale();
        let pid = std::process::id();
        let cgroup = Cgroup::create(&format!("tidemark-node-{pid}"));
        let (host_ip, node_ip) = free_subnet();
        let host_link = format!("tmh{pid}");
        let node_link = format!("tmn{pid}");
        for d in ["var-lib", "var-log", "sysctl", "logs", "volumes"] {
            std::fs::create_dir_all(state.join(d)).expect("state directory");
        }
        let mut holder = cgroup
            .command(Path::new("unshare"))
            .args(["--net", "--mount", "--propagation", "private", "--"])
            .args(["sleep", "infinity"])
            .stdin(Stdio::null())
            .spawn()
            .expect("starting the namespaces' holder (unshare)");
        let holder_pid = holder.id();
        // `unshare` execs `sleep` once the namespaces exist.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{holder_pid}/comm"))
            .map(|c| c.trim() != "sleep")
            .unwrap_or(true)
        {
            if let Ok(Some(status)) = holder.try_wait() {
                panic!("unshare exited ({status}) before making the node's namespaces");
            }
            assert!(Instant::now() < deadline, "unshare did not start in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        let host = Host {
            holder,
            holder_pid,
            cgroup,
            node_ip,
            host_ip,
            host_link: host_link.clone(),
            state: state.to_path_buf(),
        };
        run_ok(Command::new("ip").args([
            "link", "add", &host_link, "type", "veth", "peer", "name", &node_link,
        ]));
        run_ok(Command::new("ip").args([
            "link",
            "set",
            &node_link,
            "netns",
            &holder_pid.to_string(),
        ]));
        run_ok(Command::new("ip").args([
            "addr",
            "add",
            &format!("{host_ip}/30"),
            "dev",
            &host_link,
        ]));
        run_ok(Command::new("ip").args(["link", "set", &host_link, "up"]));
        // Inside: mounts of the node's own, the kernel tunables a kubelet rewrites as files
        // of its own, the node's end of the veth pair, forwarding for the pods.
        let s = state.display();
        let script = format!(
            r#"set -e
mount --make-rshared /
mount -t tmpfs -o mode=755 tmpfs /run
mount --bind {s}/var-lib /var/lib
mount --bind {s}/var-log /var/log
for f in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  copy={s}/sysctl/$(echo "$f" | tr / .)
  cat "/proc/sys/$f" > "$copy"
  mount --bind "$copy" "/proc/sys/$f"
done
ip link set lo up
ip link set {node_link} name eth0
ip addr add {node_ip}/30 dev eth0
ip link set eth0 up
echo 1 > /proc/sys/net/ipv4/ip_forward
# A pod reaching a Service whose endpoint is on the same bridge needs the bridge's
# traffic to pass iptables (the reply's un-DNAT).
[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] || modprobe br_netfilter \
  || {{ echo "the kernel module br_netfilter is needed (modprobe br_netfilter)" >&2; exit 1; }}
echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables
"#
        );
        run_ok(host.command(Path::new("sh")).arg("-c").arg(script));
        host.make_pki();
        host
    }

    /// `program` started inside the node's namespaces and cgroup (the returned command's
    /// pid is the program's own: the wrapper shell and `nsenter` exec it).
    pub(crate) fn command(&self, program: &Path) -> Command {
        let mut cmd = self.cgroup.command(Path::new("nsenter"));
        cmd.args(["-t", &self.holder_pid.to_string(), "-m", "-n", "--"])
            .arg(program);
        cmd
    }

    fn pki(&self, file: &str) -> PathBuf {
        self.state.join("pki").join(file)
    }

    /// A CA, the API server's serving certificate (for the node address, the `kubernetes`
    /// Service's first IP and its names: pods verify it), and the API server's client
    /// certificate for kubelets (group `system:masters`).
    fn make_pki(&self) {
        let dir = self.state.join("pki");
        std::fs::create_dir_all(&dir).expect("pki directory");
        let ca = TestCa::new(&dir, "tidemark-test-ca");
        ca.issue(
            "apiserver",
            "/CN=kube-apiserver",
            &format!(
                "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:{},IP:10.0.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n",
                self.node_ip
            ),
        );
        ca.issue(
            "kubelet-client",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
        );
    }

    pub(crate) fn token_line(&self) -> String {
        format!("{NODE_TOKEN},system:node:{NODE_NAME},node-uid,system:nodes\n")
    }

    pub(crate) fn apiserver_args(&self) -> Vec<String> {
        let p = |f: &str| self.pki(f).display().to_string();
        vec![
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            format!("--kubelet-client-certificate={}", p("kubelet-client.crt")),
            format!("--kubelet-client-key={}", p("kubelet-client.key")),
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--allow-privileged=true".into(),
        ]
    }

    pub(crate) fn controller_manager_args(&self) -> Vec<String> {
        vec![format!("--root-ca-file={}", self.pki("ca.crt").display())]
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.cgroup.kill_all();
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        self.cgroup.remove();
        // The veth pair goes with the node's network namespace; this is for a holder that
        // never got its end.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_link])
            .stderr(Stdio::null())
            .status();
    }
}

/// A running single-node cluster. Dropping it stops and removes everything it started.
#[derive(Debug)]
pub struct Node {
    daemons: Vec<(&'static str, Child)>,
    cluster: KubeCluster,
    host: Host,
    state: tempfile::TempDir,
    bin: PathBuf,
    volumes: std::sync::atomic::AtomicUsize,
    /// The task that keeps the DNS hosts file in step with the Services.
    dns_records: Option<tokio::task::AbortHandle>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(task) = &self.dns_records {
            task.abort();
        }
        // The daemons' children (shims, containers) and the control plane go with the
        // host's cgroup, when the fields drop after this.
        for (_, child) in self.daemons.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Node {
    /// Starts the control plane, containerd, kubelet, kube-scheduler and kube-proxy,
    /// imports the cached pause and MariaDB images and `images` (OCI archives naming their
    /// image), and waits until the node is Ready. Each step's time is logged to stderr.
    ///
    /// # Panics
    /// A binary, package or image is missing (the message says what installs it), or the
    /// node does not come up (the message has the tail of the failing daemon's log).
    pub async fn start(images: &[&Path]) -> Self {
        let started = Instant::now();
        let step = |what: &str| eprintln!("node: {what} after {:.1?}", started.elapsed());
        let bin = kube_bin().unwrap_or_else(|e| panic!("{e}"));
        for b in ["kubelet", "kube-scheduler", "kube-proxy", "kubectl"] {
            assert!(
                bin.join(b).is_file(),
                "{} is missing: run scripts/kube-node.sh (it builds the node's binaries once per machine)",
                bin.join(b).display()
            );
        }
        for (path, package) in TOOLS {
            assert!(
                Path::new(path).exists(),
                "{path} is missing: the real-node tests need Debian's {package} package (scripts/kube-node.sh installs it)"
            );
        }
        let cached = images_dir().unwrap_or_else(|e| panic!("{e}"));
        // Named by this process, so that a later start removes it if this one is killed.
        let state = tempfile::Builder::new()
            .prefix(&format!("tidemark-node-{}-", std::process::id()))
            .tempdir()
            .expect("state directory");
        let host = Host::create(state.path());
        step("namespaces, cgroup and veth pair made");
        // Tidemark itself is installed by the tests, as the docs say.
        let cluster = KubeCluster::start_in(true, false, Some(&host)).await;
        step("control plane ready");
        let mut node = Node {
            daemons: Vec::new(),
            cluster,
            host,
            state,
            bin,
            volumes: Default::default(),
            dns_records: None,
        };
        node.start_dns();
        node.start_containerd();
        step("containerd ready");
        let mut all: Vec<PathBuf> = vec![cached.join("pause.tar"), cached.join("mariadb.tar")];
        all.extend(images.iter().map(|p| p.to_path_buf()));
        // Imported while the kubelet registers the node (no pod runs before both are done).
        let importing: Vec<(PathBuf, Child)> = all
            .into_iter()
            .map(|image| {
                let child = node
                    .ctr()
                    .args(["images", "import"])
                    .arg(&image)
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("ctr images import");
                (image, child)
            })
            .collect();
        node.start_kubelet();
        let kubeconfig = node.cluster.kubeconfig().display().to_string();
        let scheduler = node
            .host
            .command(&node.bin.join("kube-scheduler"))
            .arg(format!("--kubeconfig={kubeconfig}"))
            .args(["--leader-elect=false", "--port=0"])
            .spawn_logged(&node.state.path().join("logs"), "kube-scheduler");
        node.daemons.push(("kube-scheduler", scheduler));
        let proxy = node
            .host
            .command(&node.bin.join("kube-proxy"))
            .arg(format!("--kubeconfig={kubeconfig}"))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--bind-address={}", node.host.node_ip))
            .arg(format!("--cluster-cidr={POD_RANGE}"))
            .args([
                "--proxy-mode=iptables",
                "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                "--metrics-bind-address=127.0.0.1:10249",
                "--healthz-bind-address=127.0.0.1:10256",
            ])
            .spawn_logged(&node.state.path().join("logs"), "kube-proxy");
        node.daemons.push(("kube-proxy", proxy));
        node.wait_ready().await;
        step("node Ready");
        for (image, child) in importing {
            let out = child.wait_with_output().expect("ctr images import");
            assert!(
                out.status.success(),
                "ctr images import {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        step("images imported");
        node.storage_class().await;
        node
    }

    /// The control plane: clients, kubeconfigs, logs.
    pub fn cluster(&self) -> &KubeCluster {
        &self.cluster
    }

    /// The node's address (and the API server's).
    pub fn node_ip(&self) -> Ipv4Addr {
        self.host.node_ip
    }

    /// `program` in the node's mount and network namespaces (e.g. `iptables`, to cut the
    /// node's traffic to a server on the machine).
    pub fn command_in_node(&self, program: &Path) -> Command {
        self.host.command(program)
    }

    /// The machine's address on the link to the node: servers that pods must reach
    /// listen here.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host.host_ip
    }

    /// The node's state directory (volumes, logs, the daemons' files).
    pub fn state(&self) -> &Path {
        self.state.path()
    }

    /// dnsmasq on the node's address, authoritative for `cluster.local` (an unknown name
    /// is NXDOMAIN at once, nothing is forwarded: the node has no way out), answering from
    /// the hosts file [`dns_records`] writes; a task rewrites it every second from the
    /// Services and Endpoints and tells dnsmasq to read it again (SIGHUP).
    fn start_dns(&mut self) {
        let dir = self.state.path().join("dns");
        std::fs::create_dir_all(&dir).expect("dns directory");
        let hosts = dir.join("hosts");
        std::fs::write(&hosts, "").expect("dns hosts file");
        let child = self
            .host
            .command(Path::new("/usr/sbin/dnsmasq"))
            .args([
                "--keep-in-foreground",
                "--log-facility=-",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--no-negcache",
                "--bind-interfaces",
                "--user=root",
                "--pid-file=",
                "--local=/cluster.local/",
            ])
            .arg(format!("--listen-address={}", self.host.node_ip))
            .arg(format!("--addn-hosts={}", hosts.display()))
            .spawn_logged(&self.state.path().join("logs"), "dnsmasq");
        let pid = child.id();
        self.daemons.push(("dnsmasq", child));
        // Signalled only once it handles signals (it says `started` after setting them up):
        // an early SIGHUP would end it.
        let deadline = Instant::now() + READY_TIMEOUT;
        while !std::fs::read_to_string(self.state.path().join("logs/dnsmasq.log"))
            .is_ok_and(|log| log.contains("started"))
        {
            self.assert_running(deadline, "dnsmasq");
            std::thread::sleep(Duration::from_millis(50));
        }
        let client = self.cluster.admin_client();
        let task = tokio::spawn(async move {
            let mut written = String::new();
            loop {
                if let Ok(text) = dns_records(&client).await
                    && text != written
                {
                    let next = hosts.with_extension("next");
                    let ok = std::fs::write(&next, &text).is_ok()
                        && std::fs::rename(&next, &hosts).is_ok()
                        && Command::new("kill")
                            .args(["-HUP", &pid.to_string()])
                            .status()
                            .is_ok_and(|s| s.success());
                    if ok {
                        written = text;
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        self.dns_records = Some(task.abort_handle());
    }

    fn containerd_socket(&self) -> PathBuf {
        self.state.path().join("containerd/containerd.sock")
    }

    fn start_containerd(&mut self) {
        let s = self.state.path();
        let dir = s.join("containerd");
        let cni = s.join("cni");
        std::fs::create_dir_all(cni.join("net.d")).expect("cni directory");
        std::fs::write(
            cni.join("net.d/10-tidemark.conflist"),
            serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "tidemark",
                "plugins": [
                    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true,
                     "hairpinMode": true,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_RANGE}]],
                              "routes": [{"dst": "0.0.0.0/0"}],
                              "dataDir": cni.join("ipam").display().to_string()}},
                    {"type": "portmap", "capabilities": {"portMappings": true}},
                ],
            })
            .to_string(),
        )
        .expect("cni config");
        std::fs::create_dir_all(&dir).expect("containerd directory");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{socket}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  # This machine refuses any negative oom_score_adj, even for root.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf}"
"#,
                root = dir.join("root").display(),
                state = dir.join("state").display(),
                socket = self.containerd_socket().display(),
                opt = dir.join("opt").display(),
                cni_conf = cni.join("net.d").display(),
            ),
        )
        .expect("containerd config");
        let child = self
            .host
            .command(Path::new("/usr/bin/containerd"))
            .arg("--config")
            .arg(&config)
            .spawn_logged(&s.join("logs"), "containerd");
        self.daemons.push(("containerd", child));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let ok = self
                .ctr()
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return;
            }
            self.assert_running(deadline, "containerd");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn ctr(&self) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.arg("--address")
            .arg(self.containerd_socket())
            .args(["-n", "k8s.io"]);
        cmd
    }

    /// Imports an OCI image archive (named by its `io.containerd.image.name` annotation)
    /// into the node's containerd, where pods find it without a registry.
    ///
    /// # Panics
    /// The import fails.
    pub fn import(&self, archive: &Path) {
        run_ok(self.ctr().args(["images", "import"]).arg(archive));
    }

    /// Gives the image `from` the further name `to` (a new tag of the same image, as a
    /// registry would have after a push).
    ///
    /// # Panics
    /// `ctr` fails.
    pub fn tag(&self, from: &str, to: &str) {
        run_ok(self.ctr().args(["images", "tag", "--force", from, to]));
    }

    fn start_kubelet(&mut self) {
        let s = self.state.path();
        let dir = s.join("kubelet");
        std::fs::create_dir_all(&dir).expect("kubelet directory");
        std::fs::write(s.join("resolv.conf"), "nameserver 127.0.0.1\n").expect("resolv.conf");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: node\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: node\n  user:\n    token: {NODE_TOKEN}\ncontexts:\n- name: node\n  context:\n    cluster: node\n    user: node\ncurrent-context: node\n",
                self.cluster.url,
                self.host.pki("ca.crt").display()
            ),
        )
        .expect("kubelet kubeconfig");
        let config = dir.join("config.yaml");
        std::fs::write(
            &config,
            serde_json::json!({
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                "address": self.host.node_ip.to_string(),
                "port": 10250,
                "readOnlyPort": 0,
                "healthzPort": 0,
                "cgroupDriver": "cgroupfs",
                "cgroupRoot": format!("/{}", self.host.cgroup.name),
                "failSwapOn": false,
                "authentication": {
                    "anonymous": {"enabled": false},
                    "webhook": {"enabled": true},
                    "x509": {"clientCAFile": self.host.pki("ca.crt").display().to_string()},
                },
                "authorization": {"mode": "Webhook"},
                "clusterDomain": "cluster.local",
                // dnsmasq on the node's address ([`Node::start_dns`]).
                "clusterDNS": [self.host.node_ip.to_string()],
                "resolvConf": s.join("resolv.conf").display().to_string(),
                "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                                 "nodefs.inodesFree": "1%", "imagefs.available": "1%"},
                // Local images only: nothing may evict them.
                "imageGCHighThresholdPercent": 100,
                "imageGCLowThresholdPercent": 99,
                "serializeImagePulls": false,
                "nodeStatusUpdateFrequency": "4s",
                "syncFrequency": "10s",
            })
            .to_string(),
        )
        .expect("kubelet config");
        let child = self
            .host
            .command(&self.bin.join("kubelet"))
            .arg(format!("--config={}", config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg("--container-runtime=remote")
            .arg(format!(
                "--container-runtime-endpoint=unix://{}",
                self.containerd_socket().display()
            ))
            .arg(format!("--node-ip={}", self.host.node_ip))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--root-dir={}", dir.join("root").display()))
            .arg(format!("--cert-dir={}", dir.join("pki").display()))
            .arg(format!(
                "--volume-plugin-dir={}",
                dir.join("volume-plugins").display()
            ))
            .arg(format!("--pod-infra-container-image={PAUSE_IMAGE}"))
            .spawn_logged(&s.join("logs"), "kubelet");
        self.daemons.push(("kubelet", child));
    }

    async fn wait_ready(&mut self) {
        let nodes: Api<K8sNode> = Api::all(self.cluster.admin_client());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            // Ready, and schedulable: no taint left from registration.
            let ready = nodes
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| {
                    let tainted = n
                        .spec
                        .and_then(|s| s.taints)
                        .is_some_and(|t| t.iter().any(|t| t.effect != "PreferNoSchedule"));
                    !tainted
                        && n.status
                            .and_then(|s| s.conditions)
                            .unwrap_or_default()
                            .iter()
                            .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            if ready {
                return;
            }
            for name in [
                "kubelet",
                "containerd",
                "kube-scheduler",
                "kube-proxy",
                "dnsmasq",
            ] {
                self.assert_running(deadline, name);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Fails with the daemon's log when it exited or the deadline passed.
    fn assert_running(&mut self, deadline: Instant, name: &str) {
        let exited = self
            .daemons
            .iter_mut()
            .find(|(n, _)| *n == name)
            .and_then(|(_, c)| c.try_wait().ok().flatten());
        if let Some(status) = exited {
            panic!("{name} exited ({status}); log:\n{}", self.log_tail(name));
        }
        if Instant::now() > deadline {
            panic!(
                "the node did not come up within {READY_TIMEOUT:?}; {name}'s log:\n{}",
                self.log_tail(name)
            );
        }
    }

    /// The tail of a node daemon's log (`containerd`, `kubelet`, `kube-scheduler`,
    /// `kube-proxy`) or of the control plane's.
    pub fn log_tail(&self, name: &str) -> String {
        let path = self.state.path().join("logs").join(format!("{name}.log"));
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(40)..].join("\n")
            }
            Err(_) => self.cluster.log_tail(name),
        }
    }

    async fn storage_class(&self) {
        let class: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": LOCAL_STORAGE_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Retain",
        }))
        .expect("storage class");
        Api::<StorageClass>::all(self.cluster.admin_client())
            .create(&PostParams::default(), &class)
            .await
            .expect("creating the local StorageClass");
    }

    /// `count` new `local` PersistentVolumes of the [`LOCAL_STORAGE_CLASS`] (Retain), each
    /// a fresh directory of the node's (mode 0777: any pod user may write it), pinned to
    /// the node; claims of that class bind to them when their pod is scheduled. Returns
    /// their names.
    ///
    /// # Panics
    /// The API refuses them.
    pub async fn local_volumes(&self, count: usize) -> Vec<String> {
        use std::os::unix::fs::PermissionsExt;
        let api: Api<PersistentVolume> = Api::all(self.cluster.admin_client());
        let mut names = Vec::new();
        for _ in 0..count {
            let n = self
                .volumes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let name = format!("local-{n}");
            let path = self.state.path().join("volumes").join(&name);
            std::fs::create_dir_all(&path).expect("volume directory");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
                .expect("volume mode");
            let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {
                    "capacity": {"storage": "5Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": LOCAL_STORAGE_CLASS,
                    "local": {"path": path.display().to_string()},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                    ]}]}},
                },
            }))
            .expect("volume");
            api.create(&PostParams::default(), &pv)
                .await
                .unwrap_or_else(|e| panic!("creating {name}: {e}"));
            names.push(name);
        }
        names
    }

    /// Creates a namespace for one test and waits for its `default` ServiceAccount (pods
    /// are refused until the controller-manager made it).
    pub async fn namespace(&self, name: &str) {
        self.cluster.namespace(name).await;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.cluster.admin_client(), name);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = accounts
                .get_opt("default")
                .await
                .ok()
                .flatten()
                .is_some_and(|a| a.secrets.is_some_and(|s| !s.is_empty()));
            if ready {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "namespace {name}: no default ServiceAccount token after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `kubectl` (the cluster's own version) as the admin, with `args`.
    pub fn kubectl(&self) -> Command {
        // Bounded, so a hung exec stream cannot stall a test run (exit 124 when cut).
        let mut cmd = Command::new("timeout");
        cmd.args(["--kill-after=10", "300"])
            .arg(self.bin.join("kubectl"))
            .env("KUBECONFIG", self.cluster.kubeconfig());
        cmd
    }
}

/// The node's DNS records as a hosts file, as CoreDNS's `kubernetes` plugin answers: a
/// Service's ClusterIP under `<service>.<ns>.svc.cluster.local`; for a headless Service,
/// each ready endpoint (and the not-ready ones when it publishes them) under that name,
/// and under `<hostname>.<service>.<ns>.svc.cluster.local` when the endpoint has a
/// hostname (a StatefulSet's pods, whose `subdomain` is the Service).
async fn dns_records(client: &kube::Client) -> Result<String, kube::Error> {
    let services = Api::<Service>::all(client.clone())
        .list(&Default::default())
        .await?;
    let endpoints = Api::<Endpoints>::all(client.clone())
        .list(&Default::default())
        .await?;
    let mut lines = Vec::new();
    let mut headless = std::collections::BTreeMap::new();
    for s in &services.items {
        let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) else {
            continue;
        };
        let spec = s.spec.clone().unwrap_or_default();
        match spec.cluster_ip.as_deref() {
            Some("None") => {
                headless.insert(
                    (ns.clone(), name.clone()),
                    spec.publish_not_ready_addresses.unwrap_or(false),
                );
            }
            Some(ip) if !ip.is_empty() => {
                lines.push(format!("{ip} {name}.{ns}.svc.cluster.local"));
            }
            _ => {}
        }
    }
    for e in &endpoints.items {
        let (Some(ns), Some(name)) = (&e.metadata.namespace, &e.metadata.name) else {
            continue;
        };
        let Some(&not_ready) = headless.get(&(ns.clone(), name.clone())) else {
            continue;
        };
        for subset in e.subsets.iter().flatten() {
            let unready = subset.not_ready_addresses.iter().flatten();
            let addresses = subset
                .addresses
                .iter()
                .flatten()
                .chain(unready.filter(|_| not_ready));
            for a in addresses {
                lines.push(format!("{} {name}.{ns}.svc.cluster.local", a.ip));
                if let Some(host) = &a.hostname {
                    lines.push(format!("{} {host}.{name}.{ns}.svc.cluster.local", a.ip));
                }
            }
        }
    }
    lines.sort();
    Ok(lines.join("\n") + "\n")
}

trait SpawnLogged {
    fn spawn_logged(&mut self, dir: &Path, name: &str) -> Child;
}

impl SpawnLogged for Command {
    fn spawn_logged(&mut self, dir: &Path, name: &str) -> Child {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
        self.stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"))
    }
}

/// A /30 on the machine that no interface uses yet: (the machine's side, the node's).
fn free_subnet() -> (Ipv4Addr, Ipv4Addr) {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr"])
        .output()
        .expect("ip addr");
    let used = String::from_utf8_lossy(&out.stdout).into_owned();
    let start = std::process::id() % 64;
    for i in 0..64 {
        let third = 200 + ((start + i) % 50) as u8;
        if !used.contains(&format!("10.213.{third}.")) {
            return (
                Ipv4Addr::new(10, 213, third, 1),
                Ipv4Addr::new(10, 213, third, 2),
            );
        }
    }
    panic!("no free 10.213.x.0/30 for the node's link");
}

/// A cgroup of the same name in every v1 hierarchy.
#[derive(Debug)]
struct Cgroup {
    name: String,
    hierarchies: Vec<PathBuf>,
}

/// The mount points of the machine's cgroup (v1) hierarchies.
fn hierarchies() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split_whitespace().next() != Some("cgroup") {
                return None;
            }
            left.split_whitespace().nth(4).map(PathBuf::from)
        })
        .collect()
}

impl Cgroup {
    fn create(name: &str) -> Self {
        let hierarchies = hierarchies();
        assert!(
            !hierarchies.is_empty(),
            "no cgroup v1 hierarchy is mounted: the node's kubelet 1.20 needs cgroup v1"
        );
        for h in &hierarchies {
            let dir = h.join(name);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
            // A new cpuset has no CPUs or memory nodes until given its parent's.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                    std::fs::write(dir.join(f), v.trim())
                        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(f).display()));
                }
            }
        }
        Cgroup {
            name: name.to_owned(),
            hierarchies,
        }
    }

    /// `program` run by a shell that first moves itself into this cgroup in every
    /// hierarchy, then execs it (so its pid, and everything it starts, is in the cgroup).
    fn command(&self, program: &Path) -> Command {
        let procs: Vec<String> = self
            .hierarchies
            .iter()
            .map(|h| {
                h.join(&self.name)
                    .join("cgroup.procs")
                    .display()
                    .to_string()
            })
            .collect();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "for f in {}; do echo $$ > \"$f\"; done; exec \"$@\"",
                procs.join(" ")
            ))
            .arg("sh")
            .arg(program);
        cmd
    }

    /// Every directory of this cgroup's subtrees, deepest first.
    fn directories(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, depth: usize, out: &mut Vec<(usize, PathBuf)>) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        walk(&e.path(), depth + 1, out);
                    }
                }
            }
            out.push((depth, dir.to_path_buf()));
        }
        let mut all = Vec::new();
        for h in &self.hierarchies {
            let top = h.join(&self.name);
            if top.is_dir() {
                walk(&top, 0, &mut all);
            }
        }
        all.sort_by_key(|d| std::cmp::Reverse(d.0));
        all.into_iter().map(|(_, d)| d).collect()
    }

    fn pids(&self) -> Vec<String> {
        let mut pids: Vec<String> = self
            .directories()
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
            .collect();
        pids.sort();
        pids.dedup();
        pids
    }

    /// SIGKILL to every process in the subtree, until none is left (processes that fork
    /// meanwhile are caught by the next round).
    fn kill_all(&self) {
        for _ in 0..100 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            let _ = Command::new("kill")
                .arg("-9")
                .args(&pids)
                .stderr(Stdio::null())
                .status();
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "node: processes left in cgroup {}: {:?}",
            self.name,
            self.pids()
        );
    }

    fn remove(&self) {
        for _ in 0..50 {
            let left: Vec<PathBuf> = self
                .directories()
                .into_iter()
                .filter(|d| std::fs::remove_dir(d).is_err())
                .collect();
            if left.is_empty() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("node: cgroup {} could not be removed", self.name);
    }
}

/// Removes what a node of a test run that was killed left behind: its cgroups (and every
/// process in them, which takes its namespaces, links and mounts with it).
fn sweep_stale() {
    let mut stale = std::collections::BTreeSet::new();
    for h in hierarchies() {
        let Ok(entries) = std::fs::read_dir(&h) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("tidemark-node-")
                && !Path::new("/proc").join(pid).exists()
            {
                stale.insert(name);
            }
        }
    }
    for name in stale {
        eprintln!("node: removing {name}, left by a test run that was killed");
        let cgroup = Cgroup {
            name,
            hierarchies: hierarchies(),
        };
        cgroup.kill_all();
        cgroup.remove();
    }
    // Its state directory, once nothing of it runs any more.
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("tidemark-node-")
                .and_then(|rest| rest.split('-').next());
            if let Some(pid) = pid
                && !pid.is_empty()
                && pid.bytes().all(|b| b.is_ascii_digit())
                && !Path::new("/proc").join(pid).exists()
            {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
