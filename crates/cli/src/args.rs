//! Command-line arguments (clap derive). Validation into a usable configuration happens in
//! `resolve.rs`, so every refusal carries our own message and exit code.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Tidemark: backup lifecycle for object storage. Plans retention, explains every
/// keep/delete decision, and deletes crash-safely without shrinking the recovery window.
#[derive(Debug, Parser)]
#[command(name = "tidemark", version, propagate_version = true)]
#[command(after_help = crate::exit::help_text())]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Log lines as `text` (for people) or `json` (one object per line, for log pipelines).
    #[arg(long, global = true, value_name = "FORMAT", env = "TIDEMARK_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,
}

/// What the store's flags bring that only a command writing to the store uses: encryption
/// of uploads, the plaintext allowance of reads that decrypt, the transfer rate, the lock
/// period of commits.
const WRITE_FLAGS: &[&str] = &[
    "recipients",
    "allow_plaintext_before",
    "bandwidth",
    "lock_period",
];

/// Flags a command's shared groups bring that the command does not use (issue 46 §4:
/// commands list only the flags they use), by argument id: hidden from its help, man page
/// and completions, and refused on its command line (set in the environment, they are let
/// be: one environment serves every command).
pub const UNUSED: &[(&str, &[&str], &str)] = &[
    ("ls", WRITE_FLAGS, "it neither writes nor decrypts"),
    ("plan", WRITE_FLAGS, "it neither writes nor decrypts"),
    (
        "delete",
        WRITE_FLAGS,
        "it writes nothing but its audit record",
    ),
    (
        "gc",
        &["against", "with"],
        "they preview a policy change: give them to plan, which deletes nothing",
    ),
    // A simulation has no failed backups, no store to guard, nothing verified and no
    // branches of history.
    (
        "simulate",
        &[
            "failed_ttl",
            "require_verified",
            "deletion_guard_threshold",
            "deletion_guard_window",
            "acknowledge_branches",
        ],
        "a simulation has no failed backups, no store to guard, nothing verified and no branches",
    ),
];

/// The command line's definition, without the [`UNUSED`] flags in any help.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let mut command = Cli::command();
    for (name, ids, _) in UNUSED {
        command = command.mut_subcommand(name, |mut sub| {
            for id in *ids {
                sub = sub.mut_arg(id, |a| a.hide(true));
            }
            sub
        });
    }
    command
}

/// Parses the process's arguments: clap's own errors, and an [`UNUSED`] flag given on the
/// command line, exit 2 with the usage.
pub fn parse() -> Cli {
    use clap::FromArgMatches;
    let mut command = command();
    let matches = command.get_matches_mut();
    if let Some((name, given)) = matches.subcommand() {
        for (_, ids, why) in UNUSED.iter().filter(|(n, _, _)| *n == name) {
            for id in *ids {
                if given.value_source(id) == Some(clap::parser::ValueSource::CommandLine) {
                    let mut sub = command.find_subcommand(name).cloned().unwrap_or_default();
                    let flag = sub
                        .get_arguments()
                        .find(|a| a.get_id() == *id)
                        .and_then(clap::Arg::get_long)
                        .unwrap_or(id)
                        .to_owned();
                    sub = sub.bin_name(format!("tidemark {name}"));
                    sub.error(
                        clap::error::ErrorKind::ArgumentConflict,
                        format!("--{flag} is not used by `tidemark {name}` ({why}); remove it"),
                    )
                    .exit();
                }
            }
        }
    }
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show what a retention pass would keep and delete, with every reason. Deletes nothing.
    Plan(PassArgs),
    /// Run a retention pass: write an audit record, then delete what the plan says.
    Gc(GcArgs),
    /// List recovery points, the point-in-time window, and gaps in the log archive.
    Ls(LsArgs),
    /// Stream a backup into the store: stdin, or the stdout of the command after `--`.
    /// metadata.json is written last; prints the backup-id.
    Push(PushArgs),
    /// Stream a committed backup's payload back out (stdout or --out FILE), checking its
    /// size and sha256.
    Fetch(FetchArgs),
    /// Ship closed binlog files (named by the server's binlog index file) to
    /// <cluster>/binlogs/ and index them with their event times. Re-runs upload nothing
    /// twice. Keeps watching unless --once.
    ArchiveBinlogs(ArchiveArgs),
    /// Build a MariaDB data directory at a point in time: the newest mariabackup chain
    /// completed by then, prepared, plus the binlogs replayed up to the target.
    /// --dry-run lists what it would use.
    Restore(RestoreArgs),
    /// What a schedule and a retention policy keep over time: recovery points kept each
    /// day, the recovery window and the storage, as a table (or JSON) and an SVG chart.
    /// Touches no store.
    Simulate(SimulateArgs),
    /// Standalone mode: run the ScheduledBackups, binlog archiving and retention of every
    /// BackupPolicy in DIR's YAML files, with all state in the store. Ctrl-C or SIGTERM
    /// stops it (a running backup gets --grace to finish).
    Run(RunArgs),
    /// Print Tidemark's CustomResourceDefinitions (BackupPolicy, Backup, ScheduledBackup,
    /// DeleteHook, VolumeClaimRetention, Restore) as YAML, for `kubectl apply
    /// --server-side -f -` (too large for a client-side apply's annotation).
    Crds(CrdsArgs),
    /// Print the operator's RBAC as YAML, for `kubectl apply -f -`: cluster-wide (what
    /// deploy/rbac.yaml holds), or with --namespace a Role in each listed namespace only;
    /// --disable leaves out the rights of exec, jobs, archiver or recreate.
    Rbac(RbacArgs),
    /// Run the Kubernetes operator: the controllers of BackupPolicy (retention passes, the
    /// binlog archiver, restore tests, verification), ScheduledBackup, Backup (method Jobs,
    /// exec streams, deletion with DeleteHooks, TTLs), Restore and VolumeClaimRetention,
    /// with leader election (one replica acts). Reads the kubeconfig like kubectl (in a pod:
    /// its ServiceAccount). Serves /metrics, /healthz and /readyz on --listen. SIGTERM or
    /// Ctrl-C lets reconciles in flight finish, then releases the leader Lease. Installed by
    /// deploy/ or the Helm chart (docs/operator.md).
    Operator(OperatorArgs),
    /// Copy this binary to PATH (mode 755): how a backup Job's init container puts
    /// `tidemark` into the database image, which may have no `cp`.
    Install(InstallArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell, e.g.
    /// `tidemark completions bash > /etc/bash_completion.d/tidemark`.
    Completions(CompletionsArgs),
    /// Write the man pages (tidemark.1 and one per command, tidemark-plan.1, …) into DIR,
    /// e.g. `tidemark man --dir /usr/local/share/man/man1`; without --dir, print tidemark.1.
    Man(ManArgs),
    /// Create a Backup of a BackupPolicy in the Kubernetes cluster (kubeconfig as kubectl
    /// reads it); with --wait, follow it until it completes (exit 0) or fails (exit 6).
    /// Also `kubectl tidemark backup <policy>` when installed as kubectl-tidemark.
    Backup(BackupArgs),
    /// A BackupPolicy's health in one screen (kubectl plugin: `kubectl tidemark status
    /// <policy>`): its conditions, recovery window, binlog archive, last retention pass,
    /// schedules, newest Backups, restore test, verification, Restores and recent warnings.
    Status(StatusArgs),
    /// A Backup's or Restore's spec, status, conditions and events in one screen (kubectl
    /// plugin: `kubectl tidemark describe backup NAME`), or as one document with -o.
    Describe(DescribeArgs),
    /// A Backup's or Restore's Job log (kubectl plugin: `kubectl tidemark logs restore
    /// NAME`): its pod's while the Job is there, else the end of it that the operator kept
    /// in the object's status when the Job ended.
    Logs(LogsArgs),
    /// Build and commit the synthetic full that replaces a mariabackup increment and its
    /// chain (seed 002), as `gc --consolidate` does for the increments its plan names; the
    /// chain itself is left to the next retention pass. Prints the new full's backup-id.
    Consolidate(ConsolidateArgs),
    /// Delete one backup on request (as the operator does for a Backup deleted with
    /// deletionPolicy: Delete): audit record first, metadata.json before the payload. When
    /// a recovery depends on it — the last restorable backup, the base of a committed
    /// increment, the only bridge over a binlog gap — it is marked instead, and a
    /// retention pass removes it (or merges its chain into a synthetic full) once safe.
    Delete(DeleteArgs),
    /// Read every committed backup's payload and every indexed binlog segment back from the
    /// store (streamed, nothing kept), checking sizes, sha256 and — where it can decode them
    /// — the content; check every chain and the recovery window; report each backup.
    /// Exit 0 when everything checks out, 4 when anything is damaged, cut short or missing.
    Verify(VerifyArgs),
    /// Copy what the source store holds committed — backups as whole chains, binlog
    /// segments with their timelines — to a second store, as stored (ciphertext stays
    /// ciphertext), committing last: one pass of what `tidemark run` and the operator do
    /// for a policy's spec.copies. The copy keeps what its own retention keeps; nothing
    /// deleted from the source is deleted from it. The source records the copy's progress
    /// (_state/copies/NAME.json) and its retention keeps what the copy has not received.
    Copy(CopyArgs),
    /// Prove the newest (or a random, or a given) point restorable: restore it into scratch
    /// space, start MariaDB on it, run CHECK TABLE on every table and an optional query with
    /// its expected result, record the outcome beside the backup (`_restoretest.json`),
    /// and remove the scratch data. Exit 0 passed, 4 a check failed.
    RestoreTest(RestoreTestArgs),
    /// Make a new age X25519 identity for encrypted backups: with --output, the identity
    /// file (mode 600, never overwritten) and its public key on stdout; without, the
    /// identity on stdout and the public key on stderr (as age-keygen does).
    Keygen(KeygenArgs),
}

#[derive(Debug, Args)]
pub struct CopyArgs {
    /// The source store (`--from` is the same as `--store`).
    #[command(flatten)]
    pub store: StoreArgs,
    /// The source store's URL (the same as --store).
    #[arg(long = "from", value_name = "URL", conflicts_with = "store")]
    pub from: Option<String>,
    /// A BackupPolicy file: the source is its store; with --copy NAME the copy is its
    /// spec.copies entry NAME, with that copy's retention, lock and bandwidth.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The policy file's copy to copy to (spec.copies[].name).
    #[arg(
        long = "copy",
        value_name = "NAME",
        requires = "policy",
        conflicts_with = "to"
    )]
    pub copy: Option<String>,
    /// The copy's store URL, by hand (instead of --policy with --copy); the cluster is the
    /// source's. It is reached with the usual variables.
    #[arg(long, value_name = "URL")]
    pub to: Option<String>,
    /// The S3-compatible endpoint of --to.
    #[arg(long, value_name = "URL", requires = "to")]
    pub to_endpoint: Option<String>,
    /// The copy's name with --to (its record in the source is _state/copies/NAME.json).
    #[arg(long, value_name = "NAME", default_value = "copy", requires = "to")]
    pub name: String,
    /// With --to: the copy keeps backups completed within this span (<n>d, <n>w, <n>mo)
    /// and what its newest needs; default: everything the source has.
    #[arg(long, value_name = "DURATION", requires = "to")]
    pub window: Option<String>,
    /// Say what would be sent; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// After the copy, run the copy's own retention pass (its plan, its reasons, its
    /// audit record) under the same lease.
    #[arg(long, conflicts_with = "dry_run")]
    pub gc: bool,
    /// Remove the copy's record from the source (a copy given up): the source's retention
    /// stops keeping anything for it. Copies nothing.
    #[arg(long, conflicts_with_all = ["dry_run", "gc"])]
    pub forget: bool,
    #[command(flatten)]
    pub fence: FenceArgs,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// A BackupPolicy file to take --store and --cluster (and encryption keys) from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Check a random fraction of the backups and segments (0 < F ≤ 1; the newest backup
    /// and its chain always), e.g. 0.1 for a nightly spot check.
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    pub sample: Option<f64>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
        _ => Err(format!(
            "{:?}: expected a fraction 0 < F ≤ 1, e.g. 0.1",
            s.chars().take(40).collect::<String>()
        )),
    }
}

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Where to write the identity file (it must not exist).
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ConsolidateArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub compress: CompressArgs,
    /// A BackupPolicy file to take --store and --cluster from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The increment whose chain to merge.
    #[arg(long, value_name = "ID")]
    pub backup_id: String,
    /// Where the chain is prepared (room for one full data directory); default: the
    /// system's temporary directory.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// A BackupPolicy file to take --store and --cluster from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The backup to delete.
    #[arg(long, value_name = "ID")]
    pub backup_id: String,
    /// Its name (the directory above the id); needed only when two backups share the id.
    #[arg(long, value_name = "NAME")]
    pub backup_name: Option<String>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub hook: HookArgs,
    #[command(flatten)]
    pub fence: FenceArgs,
}

/// A BackupPolicy in the Kubernetes cluster, instead of --store/--cluster/--policy.
#[derive(Debug, Args, Default)]
pub struct KubeArgs {
    /// The namespace of the BackupPolicy (default: the kubeconfig context's).
    #[arg(long, short = 'n', value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The kubeconfig file, as kubectl's --kubeconfig (default: $KUBECONFIG, else
    /// ~/.kube/config, else in-cluster).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use, as kubectl's --context.
    #[arg(long, value_name = "CONTEXT")]
    pub context: Option<String>,
    /// Act as this user (impersonation), as kubectl's --as.
    #[arg(long = "as", value_name = "USER")]
    pub as_user: Option<String>,
    /// Act with this group too (repeat it), as kubectl's --as-group; needs --as.
    #[arg(long = "as-group", value_name = "GROUP", requires = "as_user")]
    pub as_group: Vec<String>,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Where to write the pages (it must exist).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The BackupPolicy.
    #[arg(value_name = "POLICY")]
    pub policy: String,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// How many of its newest Backups to show.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u16).range(0..=500))]
    pub backups: u16,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// The kinds `describe` and `logs` show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ObjectKind {
    /// A Backup (backups.tidemark.io).
    Backup,
    /// A Restore (restores.tidemark.io).
    Restore,
}

/// A Backup or Restore of the cluster, for `describe` and `logs`.
#[derive(Debug, Args)]
pub struct ObjectArgs {
    /// Its kind.
    #[arg(value_enum, value_name = "KIND")]
    pub kind: ObjectKind,
    /// Its name.
    #[arg(value_name = "NAME")]
    pub name: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

#[derive(Debug, Args)]
pub struct DescribeArgs {
    #[command(flatten)]
    pub object: ObjectArgs,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub object: ObjectArgs,
    /// At most this many of the log's last lines from a running Job's pod (the kept end
    /// is at most 60 lines).
    #[arg(long, value_name = "N", default_value_t = 200, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub tail: i64,
}

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The BackupPolicy to back up.
    #[arg(value_name = "POLICY")]
    pub policy: String,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// mariabackup (default), xtrabackup, exec or job.
    #[arg(long, value_name = "METHOD")]
    pub method: Option<String>,
    /// primary or prefer-standby (default).
    #[arg(long, value_name = "TARGET")]
    pub target: Option<String>,
    /// full or incremental.
    #[arg(long = "type", value_name = "TYPE", default_value = "full", value_parser = ["full", "incremental"])]
    pub kind: String,
    /// The Backup's time to live (seed 004): <n>d, <n>w or <n>mo; once it has passed since
    /// the Backup's creation, the Backup and its data are deleted (never the newest
    /// restorable backup, a held one or a chain's base before its chain). Default: the
    /// policy's ttl, else none.
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,
    /// Wait until the Backup completes or fails.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: give up waiting after this long (the backup goes on), e.g. 30m.
    #[arg(long, value_name = "DURATION", default_value = "1h", requires = "wait")]
    pub timeout: String,
}

#[derive(Debug, Args)]
pub struct InstallArgs {
    /// Where to write the copy, e.g. /tidemark-bin/tidemark.
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
}

#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Namespace of the leader-election Lease (default: $POD_NAMESPACE, else
    /// tidemark-system).
    #[arg(
        long,
        value_name = "NAMESPACE",
        env = "POD_NAMESPACE",
        default_value = "tidemark-system"
    )]
    pub lease_namespace: String,
    /// The leader-election Lease's name: one per install (the chart names it after its
    /// release, so two releases in one namespace never share it).
    #[arg(
        long,
        value_name = "NAME",
        env = "TIDEMARK_LEASE_NAME",
        default_value = "tidemark-operator"
    )]
    pub lease_name: String,
    /// This replica's name in the election (default: $POD_NAME, else the host name).
    #[arg(long, value_name = "NAME", env = "POD_NAME")]
    pub identity: Option<String>,
    /// The image backup Jobs copy `tidemark` from (this operator's own image).
    #[arg(long, value_name = "IMAGE", env = "TIDEMARK_IMAGE")]
    pub image: Option<String>,
    /// Where `/metrics` (Prometheus), `/healthz` and `/readyz` answer.
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0:8080")]
    pub listen: std::net::SocketAddr,
    /// Let policies reach their store with the operator's own identity (its environment,
    /// IRSA or pod identity). Off: every store needs a credentialsSecret
    /// in the policy's namespace, so no tenant can use the operator's access to another
    /// team's bucket.
    #[arg(long, env = "TIDEMARK_ALLOW_AMBIENT_CREDENTIALS")]
    pub allow_ambient_credentials: bool,
    /// Let policies lock backups in compliance mode, which nobody — not the bucket's
    /// owner — can lift before the date. Off: a policy asking for it is refused
    /// (InvalidSpec); governance locks are always allowed.
    #[arg(long, env = "TIDEMARK_ALLOW_COMPLIANCE_LOCKS")]
    pub allow_compliance_locks: bool,
    /// Let `method: job` templates and DeleteHook Jobs ask for privileged or
    /// capability-adding containers, host paths, host namespaces or ports, or a service
    /// account other than the namespace's default. Off: such a template is refused — the
    /// operator creates those pods with its own rights, so whoever may create a Backup
    /// would otherwise get pods their own RBAC refuses them.
    #[arg(long, env = "TIDEMARK_ALLOW_PRIVILEGED_TEMPLATES")]
    pub allow_privileged_templates: bool,
    /// Let `spec.binlogArchive.server.image` name an image other than the database
    /// container's. Off: such a policy's archiver is refused (InvalidSpec) — the archiver
    /// runs with the store's keys and the database login, so whoever may create a
    /// BackupPolicy would run any image with them.
    #[arg(long, env = "TIDEMARK_ALLOW_ARCHIVER_IMAGES")]
    pub allow_archiver_images: bool,
    /// Let BackupPolicies use Secrets not labelled tidemark.io/policy-secret=true. Off: a
    /// policy naming one is refused (InvalidSpec) — whoever may create a BackupPolicy would
    /// otherwise have the operator read any key of any Secret of the namespace (the
    /// store's keys, the database login, the age identities) and send it to a host the
    /// policy names. For an upgrade, until the Secrets are labelled.
    #[arg(long, env = "TIDEMARK_ALLOW_UNLABELLED_SECRETS")]
    pub allow_unlabelled_secrets: bool,
    /// Address ranges the operator never connects to for a tenant, comma-separated (e.g.
    /// 169.254.0.0/16,10.0.0.0/8; "" for none): a store endpoint, its redirects, a GCS
    /// key's base URL, a DeleteHook's webhook — every connection's addresses are checked.
    /// Default: the link-local ranges and AWS's fd00:ec2::254 (cloud instance metadata),
    /// loopback and the unspecified addresses (the operator's own pod) — 169.254.0.0/16,
    /// fe80::/10, fd00:ec2::254/128, 127.0.0.0/8, ::1/128, 0.0.0.0/8, ::/128.
    #[arg(long, value_name = "CIDR,...", env = "TIDEMARK_DENY_ENDPOINTS", default_value = tidemark_operator::tenancy::DEFAULT_DENIED_ENDPOINTS, hide_default_value = true)]
    pub deny_endpoints: String,
    /// The longest lock the operator sets, from when it sets it, e.g. 365d: a policy with
    /// a longer objectLock.period is refused, and a chain's date (a full locked until its
    /// last increment's slot plus the period) is cut to it. Default: no bound.
    #[arg(long, value_name = "DURATION", env = "TIDEMARK_MAX_LOCK_PERIOD")]
    pub max_lock_period: Option<String>,
    /// Exec backups streamed at once (1 to 64); more wait their turn (`Queued`). Each
    /// holds up to 24 MiB of its payload, and a compressed one (zstd at most level 6
    /// here) under 10 MiB more: the operator needs about 60 MiB plus 34 MiB per stream.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub exec_streams: u16,
    /// Retention passes and Backup deletions run at once (1 to 64); more wait their turn
    /// (the policy's condition `Queued`). A pass holds its store's catalog in memory, so
    /// this bounds the operator's memory when every policy is due at once (at start).
    #[arg(long, value_name = "N", default_value_t = 2, env = "TIDEMARK_BACKGROUND_PASSES", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub background_passes: u16,
    /// The longest one exec backup may stream, e.g. 24h (at most 168h); it is then stopped
    /// and recorded as failed.
    #[arg(long, value_name = "DURATION", default_value = "24h")]
    pub exec_max_duration: String,
    /// Serve only the objects of this namespace (repeat it, or separate with commas);
    /// default: every namespace. Goes with the namespaced RBAC (`tidemark rbac
    /// --namespace`), which grants rights in these namespaces only.
    #[arg(
        long = "namespace",
        value_name = "NAMESPACE",
        env = "TIDEMARK_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,
    /// Turn a capability off: exec (pods/exec), jobs (Job creation: methods mariabackup,
    /// xtrabackup and job, consolidation, DeleteHook job actions), archiver (the binlog
    /// archiver Deployment), recreate (pod deletion: an expired claim's pending StatefulSet
    /// pod). What needs it is refused with the reason. Goes with `tidemark
    /// rbac --disable`, which leaves the right out.
    #[arg(long = "disable", value_name = "CAPABILITY", env = "TIDEMARK_DISABLE", value_delimiter = ',', value_parser = ["exec", "jobs", "archiver", "recreate"])]
    pub disable: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RbacArgs {
    /// A Role in this namespace instead of the ClusterRole (repeat it, or separate with
    /// commas): the operator then needs `--namespace` with the same list.
    #[arg(long = "namespace", value_name = "NAMESPACE", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Leave out the rights of a capability: exec, jobs, archiver or recreate (as `tidemark
    /// operator --disable`).
    #[arg(long = "disable", value_name = "CAPABILITY", value_delimiter = ',', value_parser = ["exec", "jobs", "archiver", "recreate"])]
    pub disable: Vec<String>,
    /// Where the operator runs: its ServiceAccount and leader-election Lease.
    #[arg(long, value_name = "NAMESPACE", default_value = "tidemark-system")]
    pub operator_namespace: String,
    /// The operator's ServiceAccount.
    #[arg(long, value_name = "NAME", default_value = "tidemark-operator")]
    pub service_account: String,
}

#[derive(Debug, Args)]
pub struct CrdsArgs {
    /// For API servers older than Kubernetes 1.25: leave out the CEL rules
    /// (`x-kubernetes-validations`), which they refuse, and the `null` of optional enums,
    /// and take `spec.resources` quantities as any value (the operator checks them; v1.20's
    /// server-side apply cannot model an int-or-string field).
    #[arg(long)]
    pub without_cel: bool,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Directory of YAML files holding BackupPolicy and ScheduledBackup documents.
    #[arg(long, value_name = "DIR")]
    pub config: PathBuf,
    /// On Ctrl-C or SIGTERM, how long a running backup may take to finish before it is
    /// stopped and recorded as failed, e.g. 30s, 5m.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub grace: String,
}

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Six-field cron, seconds first, e.g. "0 0 2 * * *" (every day at 02:00:00), or a
    /// macro (@hourly, @daily, @weekly, @monthly, @yearly); five fields are refused.
    #[arg(long, value_name = "CRON")]
    pub schedule: String,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// How many days to simulate.
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub days: u32,
    /// Size of one backup, e.g. 20GiB, 500MiB or 1.5TB.
    #[arg(long, value_name = "SIZE", default_value = "10GiB")]
    pub backup_size: String,
    /// How long one backup takes (its restore point is its end), e.g. 5m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub backup_duration: String,
    /// Start of the simulation (RFC 3339; default: now).
    #[arg(long, value_name = "TIME")]
    pub now: Option<String>,
    /// Write an SVG chart here: one row per backup, one column per day, a mark while it
    /// is kept; the stored size below.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Incremental backups (seed 002): each backup an increment on the one before, the
    /// first a full; with `--max-increments-per-full`, a full after that many. Without it,
    /// forever incremental: the table shows what chains keep.
    #[arg(long)]
    pub incremental: bool,
    /// Size of one increment (with --incremental; default: a tenth of --backup-size).
    #[arg(long, value_name = "SIZE", requires = "incremental")]
    pub increment_size: Option<String>,
    /// A full after this many increments (with --incremental; a ScheduledBackup's
    /// `incremental.maxIncrementsPerFull`).
    #[arg(long, value_name = "N", requires = "incremental")]
    pub max_increments_per_full: Option<u32>,
    /// Compare with this BackupPolicy file's retention, day by day (a policy change
    /// previewed over time): recovery points kept, window and bytes stored under each.
    #[arg(long, value_name = "CURRENT.yaml")]
    pub against: Option<PathBuf>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// A BackupPolicy in the cluster (kubectl plugin): create a Restore of it (with --into
    /// or --new-claim), or with --dry-run print what a restore would use, read from its
    /// store. Without it, the store is --store's. (TIDEMARK_STORE and TIDEMARK_CLUSTER in
    /// the environment are then not used; --store and --cluster are refused with it.)
    #[arg(value_name = "POLICY", conflicts_with_all = ["policy", "datadir"])]
    pub policy_name: Option<String>,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// A BackupPolicy file to take --store and --cluster from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The instant to restore to, RFC 3339 (e.g. 2026-11-20T14:05:00Z); binlog events are
    /// replayed through that second. With POLICY, optional: the newest restorable instant.
    #[arg(long, value_name = "TIME", required_unless_present = "policy_name")]
    pub to: Option<String>,
    /// Restore along this timeline of the archive (`ls` lists them) instead of the main
    /// line: an instant of a history that a restore or a failover abandoned, kept as a
    /// branch.
    #[arg(long, value_name = "N", conflicts_with = "policy_name")]
    pub timeline: Option<u32>,
    /// The data directory to create (it must not exist or be empty).
    #[arg(long, value_name = "DIR", required_unless_present_any = ["dry_run", "policy_name"])]
    pub datadir: Option<PathBuf>,
    /// With POLICY: restore into this existing claim (no pod may use it).
    #[arg(
        long,
        value_name = "CLAIM",
        requires = "policy_name",
        conflicts_with_all = ["new_claim", "dry_run"]
    )]
    pub into: Option<String>,
    /// With POLICY: replace the data the claim of --into (or the claims of --statefulset)
    /// holds.
    #[arg(long, requires = "policy_name", conflicts_with_all = ["dry_run", "new_claim"])]
    pub replace_data: bool,
    /// With POLICY: restore every claim of this StatefulSet, scaled to 0, to the same point
    /// in place — one Restore per claim (`<claim template>-<statefulset>-<ordinal>`), the
    /// replicas' with the primary's, so they resume replication from it by GTID. Needs
    /// --replace-data; with --wait, checks that every claim reached one position.
    #[arg(
        long,
        value_name = "NAME",
        requires = "policy_name",
        conflicts_with_all = ["into", "new_claim", "dry_run"]
    )]
    pub statefulset: Option<String>,
    /// With --statefulset: the claim template that holds the data, when the StatefulSet has
    /// several.
    #[arg(long, value_name = "TEMPLATE", requires = "statefulset")]
    pub claim_template: Option<String>,
    /// With POLICY: create this claim and restore into it (e.g. data-db2-0 for pod 0 of
    /// StatefulSet db2 with the claim template data).
    #[arg(
        long,
        value_name = "CLAIM",
        requires = "policy_name",
        conflicts_with = "dry_run"
    )]
    pub new_claim: Option<String>,
    /// The storage class of --new-claim (default: the cluster's default).
    #[arg(long, value_name = "CLASS", requires = "new_claim")]
    pub storage_class: Option<String>,
    /// The size of --new-claim (a quantity such as 20Gi; default: from the chain).
    #[arg(long, value_name = "SIZE", requires = "new_claim")]
    pub size: Option<String>,
    /// With POLICY: the Restore's name (default: `<policy>-restore-<now>`); with
    /// --statefulset, the first part of each one's (`<name>-<ordinal>`, default
    /// `<statefulset>-restore-<now>`).
    #[arg(
        long,
        value_name = "NAME",
        requires = "policy_name",
        conflicts_with = "dry_run"
    )]
    pub name: Option<String>,
    /// With POLICY: wait until the Restore has ended; exit 0 when it succeeded, 7 when its
    /// target cannot be restored, 8 when it failed otherwise.
    #[arg(long, requires = "policy_name", conflicts_with = "dry_run")]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, value_name = "DURATION", default_value = "1h", requires = "wait")]
    pub timeout: String,
    /// List the backups and binlogs the restore would use, and stop.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// After a restore, write what it did in brief to FILE as JSON (`bytesDownloaded`,
    /// `backupsApplied`, `segmentsReplayed`, `milliseconds`, `steps`): the operator's
    /// Restore Job reports through its termination message this way.
    #[arg(long, value_name = "FILE", conflicts_with = "dry_run")]
    pub report_file: Option<PathBuf>,
    /// Keep the restored data only if the restore oracle proves it (issue 48): at least
    /// one chunk of the primary's checksums replayed and compared, none differing.
    /// Otherwise the data directory is removed (exit 8). Without it, differences are
    /// reported and the data kept.
    #[arg(long, conflicts_with = "dry_run")]
    pub require_oracle: bool,
    #[command(flatten)]
    pub tools: MariaDbTools,
}

/// The MariaDB programs a restore runs.
#[derive(Debug, Args)]
pub struct MariaDbTools {
    /// The mariabackup program.
    #[arg(long, value_name = "PATH", default_value = "mariabackup")]
    pub mariabackup: PathBuf,
    /// The mbstream program.
    #[arg(long, value_name = "PATH", default_value = "mbstream")]
    pub mbstream: PathBuf,
    /// The server started on the restored directory (to replay binlogs, to check it).
    #[arg(long, value_name = "PATH", default_value = "mariadbd")]
    pub mariadbd: PathBuf,
    /// The binlog decoder.
    #[arg(long, value_name = "PATH", default_value = "mariadb-binlog")]
    pub mariadb_binlog: PathBuf,
    /// The client that applies the decoded events and runs the checks.
    #[arg(long, value_name = "PATH", default_value = "mariadb")]
    pub mariadb: PathBuf,
    /// MySQL's server, started on a restored MySQL data directory (binlog replay).
    #[arg(long, value_name = "PATH", default_value = "mysqld")]
    pub mysqld: PathBuf,
    /// MySQL's client, which applies the decoded events.
    #[arg(long, value_name = "PATH", default_value = "mysql")]
    pub mysql: PathBuf,
    /// MySQL's binlog decoder.
    #[arg(long, value_name = "PATH", default_value = "mysqlbinlog")]
    pub mysqlbinlog: PathBuf,
    /// The user the private MariaDB server (binlog replay, a restore test's checks) runs as
    /// when tidemark runs as root: that server never runs as root, and is handed the
    /// restored data directory. Best a user of its own that owns nothing else (on a
    /// database host not mysql, which owns the live server's files). Needed as root;
    /// ignored otherwise (the server runs as you).
    #[arg(long, value_name = "USER", env = "TIDEMARK_SERVER_USER")]
    pub server_user: Option<String>,
    /// How binlogs are replayed: `applier`, the default, gives the row transactions of
    /// ROW-format binlogs to the private server's replication applier and sends the rest
    /// (DDL, statement-logged changes) through mariadb-binlog | mariadb; `client` sends
    /// everything through mariadb-binlog | mariadb. Both apply the same transactions.
    #[arg(
        long,
        value_name = "HOW",
        value_enum,
        default_value_t = ReplayHow::Applier,
        env = tidemark_mariadb::tools::REPLAY_ENV
    )]
    pub replay: ReplayHow,
    /// With --replay applier: the applier's parallel workers, optimistic (transactions of
    /// one GTID domain applied side by side, committed in the binlog's order); 0, the
    /// default: its SQL thread alone.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(0..=64))]
    pub replay_threads: Option<u16>,
}

/// `--replay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReplayHow {
    Applier,
    Client,
}

impl MariaDbTools {
    /// # Errors
    /// `--replay-threads` with `--replay client` (it has no applier threads to set).
    pub fn tools(&self) -> Result<tidemark_mariadb::restore::Tools, crate::exit::CliError> {
        if let (ReplayHow::Client, Some(n)) = (self.replay, self.replay_threads) {
            return Err(crate::exit::CliError::input(format!(
                "--replay-threads {n} sets the applier's workers; --replay client (or \
                 TIDEMARK_REPLAY=client) has none: drop --replay-threads, or use --replay applier"
            )));
        }
        Ok(tidemark_mariadb::restore::Tools {
            mariabackup: self.mariabackup.clone().into(),
            mbstream: self.mbstream.clone().into(),
            mariadbd: self.mariadbd.clone().into(),
            mariadb_binlog: self.mariadb_binlog.clone().into(),
            mariadb: self.mariadb.clone().into(),
            mysqld: self.mysqld.clone().into(),
            mysql: self.mysql.clone().into(),
            mysqlbinlog: self.mysqlbinlog.clone().into(),
            server_user: self.server_user.clone().map(Into::into),
            replay: match (self.replay, self.replay_threads) {
                (ReplayHow::Client, _) => tidemark_mariadb::tools::Replay::Client,
                (ReplayHow::Applier, Some(threads)) => {
                    tidemark_mariadb::tools::Replay::Applier { threads }
                }
                (ReplayHow::Applier, None) => tidemark_mariadb::tools::Replay::applier(),
            },
        })
    }
}

#[derive(Debug, Args)]
pub struct RestoreTestArgs {
    /// A BackupPolicy in the cluster (kubectl plugin): ask the operator for a restore test
    /// of the policy's store now (the annotation tidemark.io/restore-test, with the
    /// policy's spec.restoreTest settings or the newest instant), and with --wait follow it
    /// to its outcome. Without it, the test runs here, on --store's store.
    #[arg(
        value_name = "POLICY",
        conflicts_with_all = ["policy", "to", "random", "query", "expect", "run_id", "scratch"]
    )]
    pub policy_name: Option<String>,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// With POLICY: wait for the test's outcome; exit 0 when it passed, 4 when it failed
    /// (as without POLICY).
    #[arg(long, requires = "policy_name")]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, value_name = "DURATION", default_value = "1h", requires = "wait")]
    pub timeout: String,
    #[command(flatten)]
    pub store: StoreArgs,
    /// A BackupPolicy file to take --store and --cluster (and its restoreTest's query)
    /// from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The instant to restore (RFC 3339); default: the newest restorable one.
    #[arg(long, value_name = "TIME", conflicts_with = "random")]
    pub to: Option<String>,
    /// Restore a random instant of the recovery window instead of the newest.
    #[arg(long)]
    pub random: bool,
    /// A query to run on the restored server, e.g. "SELECT COUNT(*) FROM shop.orders".
    #[arg(long, value_name = "SQL", allow_hyphen_values = true)]
    pub query: Option<String>,
    /// The query's expected output (tab-separated columns, a line per row; as `mariadb -N
    /// -B` prints it: `NULL`, and tabs, newlines and backslashes in values escaped).
    #[arg(
        long,
        value_name = "TEXT",
        requires = "query",
        allow_hyphen_values = true
    )]
    pub expect: Option<String>,
    /// A name for this run, recorded as `runId` (a scheduler finds its own record by it).
    #[arg(long, value_name = "ID")]
    pub run_id: Option<String>,
    /// Where the scratch data directory goes (room for one restored database); default:
    /// the system's temporary directory. It is removed afterwards.
    #[arg(long, value_name = "DIR")]
    pub scratch: Option<PathBuf>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub tools: MariaDbTools,
}

/// The database server `archive-binlogs --from-server` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    Mariadb,
    Mysql,
}

#[derive(Debug, Args)]
pub struct ArchiveArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub compress: CompressArgs,
    /// A BackupPolicy file to take --store and --cluster from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The server's binlog index file, e.g. /var/lib/mysql/mysql-bin.index.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "from_server",
        conflicts_with = "from_server"
    )]
    pub binlog_index: Option<PathBuf>,
    /// Read the binlogs from the server over the network, as a replica client
    /// (`mariadb-binlog --read-from-remote-server --raw`), with the connection options
    /// after `--`; nothing changes on the database's machine.
    #[arg(long, requires = "spool")]
    pub from_server: bool,
    /// With --from-server: where fetched files wait until shipped (removed after).
    #[arg(long, value_name = "DIR")]
    pub spool: Option<PathBuf>,
    /// With --from-server: the `mariadb` client (asks SHOW BINARY LOGS; writes the
    /// checksums of --checksums-every).
    #[arg(long, value_name = "PATH", default_value = "mariadb")]
    pub mariadb: PathBuf,
    /// With --from-server: the `mariadb-binlog` program.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "mariadb-binlog",
        requires = "from_server"
    )]
    pub mariadb_binlog: PathBuf,
    /// With --from-server (or --checksums-every): which server it is. `mysql` reads a
    /// MySQL server with MySQL's programs (--mysql, --mysqlbinlog); a server that is not
    /// the one named is refused.
    #[arg(long, value_enum, default_value_t = Engine::Mariadb)]
    pub engine: Engine,
    /// With --engine mysql: MySQL's client (asks SHOW BINARY LOGS; writes the checksums).
    #[arg(long, value_name = "PATH", default_value = "mysql")]
    pub mysql: PathBuf,
    /// With --from-server --engine mysql: MySQL's `mysqlbinlog`.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "mysqlbinlog",
        requires = "from_server"
    )]
    pub mysqlbinlog: PathBuf,
    /// The `@@server_id` of the server the cluster says is primary: only it starts a new
    /// timeline (after a failover), so an old primary still writing, or a server whose
    /// files claim another's transactions, never takes over the archive's main line.
    /// Without it, the server this archiver reads is taken as primary, and a new timeline
    /// says so (the operator passes its labelled primary's).
    #[arg(long, value_name = "ID")]
    pub primary_server_id: Option<u32>,
    /// One pass, then exit.
    #[arg(long)]
    pub once: bool,
    /// Pause between passes when watching, e.g. 10s, 1m.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub interval: String,
    /// When watching, warn once the archive is further behind the server than this (its
    /// newest archived event against the server's newest), e.g. 5m, 1h; and say when it
    /// caught up.
    #[arg(long, value_name = "DURATION", default_value = "5m")]
    pub max_lag: String,
    /// With --from-server: after each pass, PURGE BINARY LOGS on the server up to the
    /// newest file the store holds verified (indexed with its checksum, present with its
    /// size), never further, keeping the files whose transactions are younger than this
    /// (e.g. 2h). The account needs BINLOG ADMIN.
    #[arg(long, value_name = "DURATION", requires = "from_server")]
    pub purge_keep: Option<String>,
    /// With --purge-keep: past this many bytes of binlogs on the server, --purge-keep
    /// yields (the archive never does); from 80 % of it with files not archived, the point
    /// in time is at risk and every pass says so (e.g. 50GiB).
    #[arg(long, value_name = "SIZE", requires = "purge_keep")]
    pub purge_max_disk: Option<String>,
    /// With --purge-keep: a replica whose binlogs are purged by the same rule, logging in
    /// with the same options (its files are matched to the archive by GTID, not by name),
    /// e.g. db-1.db:3306. Repeat for each replica, at most 16.
    #[arg(long, value_name = "HOST[:PORT]", requires = "purge_keep")]
    pub purge_replica: Vec<String>,
    /// Write the restore oracle's checksums on the server this often (e.g. 1h), logging in
    /// with the connection options after `--` (with --binlog-index too): each table's
    /// chunks counted and digested by the server, logged so that a restore's replay
    /// computes them again on its own data and `restore-test` compares (docs/cli.md). A
    /// run never overlaps the previous one; with --once, one run before the pass. The
    /// account needs BINLOG ADMIN, SELECT on the tables checked, and CREATE, INSERT,
    /// UPDATE, DELETE on the schema tidemark_oracle.
    #[arg(long, value_name = "DURATION")]
    pub checksums_every: Option<String>,
    /// With --checksums-every: check only these tables, as SCHEMA.TABLE where * matches
    /// any characters (e.g. shop.*); repeat. Default: every table.
    #[arg(long, value_name = "PATTERN", requires = "checksums_every")]
    pub checksum_tables: Vec<String>,
    /// With --checksums-every: never check these tables (same patterns, over
    /// --checksum-tables), e.g. *.audit_log; repeat.
    #[arg(long, value_name = "PATTERN", requires = "checksums_every")]
    pub checksum_skip: Vec<String>,
    /// With --checksums-every: rows per chunk, each read by one statement (100 to
    /// 1000000).
    #[arg(long, value_name = "ROWS", default_value_t = tidemark_mariadb::oracle::CHUNK_ROWS)]
    pub checksum_chunk_rows: u64,
    /// With --checksums-every: the pause after each chunk, which bounds the rate of reads
    /// on the server (e.g. 50ms: at most 20 chunks a second).
    #[arg(long, value_name = "DURATION", default_value = "50ms")]
    pub checksum_pause: String,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// With --from-server (or --checksums-every): connection options for mariadb and
    /// mariadb-binlog, e.g.
    /// --defaults-extra-file=/etc/tidemark/my.cnf --host=db --port=3306 (the password in
    /// the option file, never on the command line).
    #[arg(last = true, value_name = "CLIENT_OPTIONS")]
    pub client: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackupKindArg {
    Full,
    Incremental,
}

/// How what a command uploads is compressed (issue 19 §1).
#[derive(Debug, Args)]
pub struct CompressArgs {
    /// Compress payloads and binlog segments on the stream: none, zstd (level 3) or
    /// zstd:<level> (1–19). Recorded per object; fetch, restore and consolidation read
    /// either kind. Default: the policy file's objectStore.compression, else none.
    #[arg(long, value_name = "none|zstd[:LEVEL]", env = "TIDEMARK_COMPRESSION", value_parser = parse_compression)]
    pub compression: Option<tidemark_store::compress::Compression>,
}

impl CompressArgs {
    /// `store` writing as the flag says, else as it was opened (the policy's setting).
    pub fn apply(&self, store: &tidemark_store::ClusterStore) -> tidemark_store::ClusterStore {
        match self.compression {
            Some(c) => store.clone().with_compression(c),
            None => store.clone(),
        }
    }
}

fn parse_compression(s: &str) -> Result<tidemark_store::compress::Compression, String> {
    s.parse()
        .map_err(|e: tidemark_store::compress::CompressionError| e.to_string())
}

#[derive(Debug, Args)]
pub struct PushArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub compress: CompressArgs,
    /// A BackupPolicy file to take --store and --cluster from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The backup's name (its directory in the store), e.g. nightly or
    /// cluster-sample-daily-20261120020000.
    #[arg(long, value_name = "NAME")]
    pub backup_name: String,
    /// The attempt's id, <YYYYMMDDTHHMMSSZ>-<8 hex> (generated from the start time when
    /// absent).
    #[arg(long, value_name = "ID")]
    pub backup_id: Option<String>,
    #[arg(long = "type", value_enum, default_value_t = BackupKindArg::Full)]
    pub kind: BackupKindArg,
    /// The backup-id an incremental builds on (must be committed in the store).
    #[arg(long, value_name = "ID")]
    pub parent: Option<String>,
    /// Recorded as `method` in metadata.json (default: exec with a command, stdin without).
    /// `mariabackup` runs the command (default `mariabackup`) with `--backup
    /// --stream=xbstream` appended, incremental from the parent's LSN, and records the LSNs
    /// and binlog position. `mysql-clone` clones a MySQL server (8.0.17 or newer, clone
    /// plugin active, the account granted BACKUP_ADMIN) into a private recipient server
    /// run here (--mysqld), reads the clone's GTID set, and streams its data directory as a
    /// tar: the command is the client and the source's connection options. `mysqldump`
    /// dumps a MySQL server's own databases in one consistent snapshot (--single-transaction;
    /// a source holding views, triggers, routines or events is refused), and records the
    /// snapshot's GTID set and
    /// binlog position: the command is mysqldump and the source's connection options (the
    /// source is asked about itself through --mysql).
    #[arg(long, value_name = "NAME")]
    pub method: Option<String>,
    #[command(flatten)]
    pub mysql: MySqlTools,
    /// Payload file extension: the object is backup.<EXT> (default: xbstream for
    /// --method mariabackup, tar for mysql-clone, sql for mysqldump, bin otherwise).
    #[arg(long, value_name = "EXT")]
    pub ext: Option<String>,
    /// A label for metadata.json, KEY=VALUE (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub label: Vec<String>,
    /// Delete this backup once it is this old, whatever the policy (<n>d|<n>w|<n>mo), except
    /// when it is the newest or a kept backup depends on it.
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,
    /// Lock the backup until this instant (RFC 3339, e.g. 2026-12-31T00:00:00Z) with S3
    /// Object Lock in --lock-mode; an incremental takes its chain's date when that is
    /// later. Default with a lock mode: the policy's objectLock period after the start.
    #[arg(long, value_name = "TIME")]
    pub lock_until: Option<String>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// The command whose stdout is the backup, e.g. -- tar -C /data -cf - . With
    /// --method mariabackup: the mariabackup program and its connection options, e.g.
    /// -- mariabackup --user=root --socket=/run/mysqld/mysqld.sock. With --method
    /// mysql-clone: the client and the source's TCP connection options, e.g. -- mysql
    /// --host=db --port=3306 --user=tidemark --password=… With --method mysqldump: the same
    /// with mysqldump, e.g. -- mysqldump --host=db --user=tidemark --password=…
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The MySQL programs a `mysql-clone` or `mysqldump` backup runs here.
#[derive(Debug, Args)]
pub struct MySqlTools {
    /// MySQL's server: the clone's private recipient, and the server that reads the
    /// clone's point.
    #[arg(long, value_name = "PATH", default_value = "mysqld")]
    pub mysqld: PathBuf,
    /// MySQL's client, for the private servers.
    #[arg(long, value_name = "PATH", default_value = "mysql")]
    pub mysql: PathBuf,
    /// The user the private servers run as when tidemark runs as root (they never run as
    /// root); ignored otherwise.
    #[arg(long, value_name = "USER", env = "TIDEMARK_SERVER_USER")]
    pub server_user: Option<String>,
}

impl MySqlTools {
    pub fn tools(&self) -> tidemark_mariadb::restore::Tools {
        tidemark_mariadb::restore::Tools {
            mysqld: self.mysqld.clone().into(),
            mysql: self.mysql.clone().into(),
            server_user: self.server_user.clone().map(Into::into),
            ..Default::default()
        }
    }
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// A BackupPolicy file to take --store and --cluster from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The backup to fetch.
    #[arg(long, value_name = "ID")]
    pub backup_id: String,
    /// Its backup name (found by searching when absent).
    #[arg(long, value_name = "NAME")]
    pub backup_name: Option<String>,
    /// Write to this file (created only when the whole payload checks out) instead of
    /// stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Where the backups are.
#[derive(Debug, Default, Args)]
pub struct StoreArgs {
    /// Store URL: file:///dir, s3://bucket[/prefix], gs://bucket[/prefix],
    /// az://container[/prefix] or memory://. S3 reads the usual AWS_* variables.
    #[arg(long, value_name = "URL", env = "TIDEMARK_STORE")]
    pub store: Option<String>,
    /// The cluster directory inside the store.
    #[arg(long, value_name = "NAME", env = "TIDEMARK_CLUSTER")]
    pub cluster: Option<String>,
    /// S3-compatible endpoint, e.g. http://127.0.0.1:8333 (plain HTTP allowed when given).
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// A private CA to trust for the store's HTTPS, beside the public roots: a PEM file
    /// (the variable may also hold the PEM text itself).
    #[arg(long, value_name = "FILE", env = "TIDEMARK_CA_BUNDLE")]
    pub ca_bundle: Option<String>,
    /// Encrypt what this command uploads (payloads, binlog segments) to this age X25519
    /// public key (age1…); repeat, or separate with commas, for several (at most 16).
    /// Default: the policy file's objectStore.encryption.recipients, else not encrypted.
    #[arg(
        long = "recipient",
        value_name = "AGE1…",
        env = "TIDEMARK_RECIPIENTS",
        value_delimiter = ','
    )]
    pub recipients: Vec<String>,
    /// A file of age identities (AGE-SECRET-KEY-1… lines, as age-keygen or tidemark
    /// keygen writes) to read encrypted backups and segments with; repeatable. Default: the
    /// policy file's objectStore.encryption.identityFile. TIDEMARK_IDENTITY may hold the
    /// identities themselves (as a Secret mounted as a variable does).
    #[arg(long = "identity", value_name = "FILE", env = "TIDEMARK_IDENTITY_FILE")]
    pub identities: Vec<PathBuf>,
    /// Under encryption (recipients given), payloads and segments that are not encrypted
    /// are refused by restore, restore-test and consolidation — a bucket writer holding no
    /// key could have planted them — except those written before this instant (RFC 3339):
    /// the history from before encryption was turned on. Default: the policy file's
    /// objectStore.encryption.plaintextBefore.
    #[arg(
        long = "allow-plaintext-before",
        value_name = "INSTANT",
        env = "TIDEMARK_ALLOW_PLAINTEXT_BEFORE"
    )]
    pub allow_plaintext_before: Option<String>,
    /// S3 Object Lock (the bucket must have it enabled): backups this command commits are
    /// locked in this mode, governance or compliance, and what it deletes goes with all its
    /// versions. Default: the policy file's objectStore.objectLock.mode.
    #[arg(long, value_name = "MODE", env = "TIDEMARK_LOCK_MODE")]
    pub lock_mode: Option<String>,
    /// With a lock mode: how long what this command commits is locked (<n>d|<n>w|<n>mo) when
    /// no date is given. Default: the policy file's objectStore.objectLock.period (else its
    /// retention.window).
    #[arg(long, value_name = "DURATION", env = "TIDEMARK_LOCK_PERIOD")]
    pub lock_period: Option<String>,
    /// What a retention pass does with a locked chain whose lock has ended and that no rule
    /// keeps (seed 002): `lifecycle` (the default) records it as expired in the store — no
    /// plan, restore or window uses it again — and leaves its objects to the bucket's
    /// lifecycle rule; `delete` deletes them, every version. Default: the policy file's
    /// objectStore.objectLock.afterExpiry.
    #[arg(long, value_name = "WHAT", env = "TIDEMARK_AFTER_LOCK_EXPIRY")]
    pub after_lock_expiry: Option<String>,
    /// Use the --policy file's copy NAME (spec.copies[].name) instead of its own store:
    /// `restore --from-copy dr`, `ls --from-copy dr`, `verify --from-copy dr`, `gc
    /// --from-copy dr` (the copy's own retention). The copy's S3 credentials may be given
    /// as TIDEMARK_COPY_<NAME>_AWS_ACCESS_KEY_ID and _AWS_SECRET_ACCESS_KEY (GCS:
    /// _GOOGLE_SERVICE_ACCOUNT_KEY; Azure: _AZURE_STORAGE_ACCOUNT_NAME with _KEY or
    /// _SAS_TOKEN); else the usual variables.
    #[arg(
        long,
        value_name = "NAME",
        env = "TIDEMARK_FROM_COPY",
        conflicts_with_all = ["store", "endpoint"]
    )]
    pub from_copy: Option<String>,
    /// Hold this command's transfers to and from the store (payloads, binlog segments;
    /// `copy`: what it sends) to this rate, e.g. 50MiB/s (B, KB, MB, GB, KiB, MiB, GiB per
    /// second, at least 64KiB/s). Default: the --policy file's spec.bandwidth (with
    /// --from-copy, the copy's bandwidth), else no limit.
    #[arg(long, value_name = "RATE", env = "TIDEMARK_BANDWIDTH")]
    pub bandwidth: Option<String>,
}

/// The retention policy: a BackupPolicy file, or flags.
#[derive(Debug, Default, Args)]
pub struct PolicyArgs {
    /// A BackupPolicy YAML file (its objectStore and name give --store and --cluster when
    /// those are not set). Not combinable with the policy flags below.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// Keep backups completed within this span: <n>d, <n>w or <n>mo (month = 30 days).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub window: Option<String>,
    /// Keep the newest N successful backups (failed ones never count).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub keep_last: Option<i64>,
    /// Keep the newest backup of each of the last N days that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub keep_daily: Option<i64>,
    /// Keep the newest backup of each of the last N ISO weeks that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub keep_weekly: Option<i64>,
    /// Keep the newest backup of each of the last N months that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub keep_monthly: Option<i64>,
    /// Keep the newest backup of each of the last N years that have one.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub keep_yearly: Option<i64>,
    /// Delete failed and never-committed attempts older than this (<n>d|<n>w|<n>mo).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub failed_ttl: Option<String>,
    /// Also keep the newest backup completed before the window, so the whole window
    /// restores.
    #[arg(long)]
    pub cover_window: bool,
    /// IANA time zone for the calendar buckets of --keep-daily and friends (default UTC).
    #[arg(long, value_name = "ZONE")]
    pub time_zone: Option<String>,
    /// Delete at most N backups in one pass (0 = no cap); the rest wait for the next.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub max_deletions: Option<i64>,
    /// gc deletes no backup until the newest one (and its chain) was read back whole
    /// (recorded as _verified.json beside it, so it is read once).
    #[arg(long)]
    pub require_verified: bool,
    /// Merge ancestors kept only for a chain into a synthetic full that takes the place of
    /// the oldest retained increment (mariabackup chains), then delete them.
    #[arg(long)]
    pub consolidate: bool,
    /// Keep binlogs so that every instant of this span before now restores (<n>d|<n>w|<n>mo):
    /// from the start of the newest backup completed before it. Backups kept longer by the
    /// other rules restore to their own point (reason `standalone`). Default: binlogs for
    /// every retained backup.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub pitr_window: Option<String>,
    /// Hold a pass that would delete more than N backups and more than half of the
    /// restorable ones until acknowledged (gc --allow-mass-deletion). Default 10; 0: the
    /// count never holds a pass.
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub deletion_guard_threshold: Option<i64>,
    /// Also hold a pass that would move the start of the recovery window or of the
    /// point-in-time window later by more than this (<n>d|<n>w|<n>mo).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true)]
    pub deletion_guard_window: Option<String>,
    /// Binlog segments on a branch (off the archive's main line: what a new timeline left
    /// behind) whose last event is at or before TIME (RFC 3339) were looked at and may go
    /// by the ordinary rule; later ones are kept for --window, or, without one, until
    /// acknowledged. Combines with --policy.
    #[arg(long, value_name = "TIME")]
    pub acknowledge_branches: Option<String>,
}

impl PolicyArgs {
    /// Whether any policy flag (besides --policy) was given.
    pub fn any_flag(&self) -> bool {
        self.window.is_some()
            || self.keep_last.is_some()
            || self.keep_daily.is_some()
            || self.keep_weekly.is_some()
            || self.keep_monthly.is_some()
            || self.keep_yearly.is_some()
            || self.failed_ttl.is_some()
            || self.cover_window
            || self.time_zone.is_some()
            || self.max_deletions.is_some()
            || self.consolidate
            || self.require_verified
            || self.pitr_window.is_some()
            || self.deletion_guard_threshold.is_some()
            || self.deletion_guard_window.is_some()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For people.
    Table,
    /// The stable contract of docs/cli.md.
    Json,
    /// The same document as `json`, in YAML.
    Yaml,
    /// The table, with more columns where a command lists backups (`ls`, `plan`, `gc`):
    /// when it started, its exact bytes, compression, encryption, lock and log position.
    /// Other commands print their table.
    Wide,
}

impl OutputFormat {
    /// A document for programs (`json` or `yaml`), not a table.
    pub fn structured(self) -> bool {
        matches!(self, OutputFormat::Json | OutputFormat::Yaml)
    }
}

#[derive(Debug, Args)]
pub struct PassArgs {
    /// A BackupPolicy in the Kubernetes cluster: its store (reached with its Secret), its
    /// retention rules and its Backups' holds (`kubectl tidemark plan <policy>`). Instead
    /// of --store/--cluster/--policy and the policy flags.
    #[arg(value_name = "POLICY", conflicts_with_all = ["store", "cluster", "policy"])]
    pub cluster_policy: Option<String>,
    /// Acknowledge mass deletions: the deletion guard releases the deletions it first held
    /// at or before TIME (RFC 3339; the held pass prints it), and holds any later wave.
    /// Default: the policy's tidemark.io/allow-deletions-before annotation.
    #[arg(long, value_name = "TIME")]
    pub allow_mass_deletion: Option<String>,
    /// plan: preview a policy change — the policy given (--policy NEW.yaml or flags) against
    /// this BackupPolicy file's: what it deletes that this one keeps, both windows before
    /// and after, and the instants that stop being restorable.
    #[arg(long, value_name = "CURRENT.yaml", conflicts_with = "cluster_policy")]
    pub against: Option<PathBuf>,
    /// plan POLICY: preview the cluster policy's change to this BackupPolicy file's
    /// retention (`kubectl tidemark plan db --with new.yaml`), as --against.
    #[arg(long, value_name = "NEW.yaml", requires = "cluster_policy")]
    pub with: Option<PathBuf>,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub policy: PolicyArgs,
    /// Evaluate at this instant instead of the current time (RFC 3339, e.g.
    /// 2026-11-20T02:00:00Z).
    #[arg(long, value_name = "TIME")]
    pub now: Option<String>,
    /// Place a hold on this backup-id for this pass (repeatable), e.g. one a runbook or a
    /// restore still needs.
    #[arg(long, value_name = "BACKUP_ID")]
    pub protect: Vec<String>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[derive(Debug, Args)]
pub struct GcArgs {
    #[command(flatten)]
    pub pass: PassArgs,
    /// How `--consolidate` writes its synthetic fulls (as `push --compression`).
    #[command(flatten)]
    pub compress: CompressArgs,
    /// Go ahead although some metadata.json files are malformed: those backups are left
    /// untouched (they are never deleted) and everything else is collected.
    #[arg(long)]
    pub ignore_malformed: bool,
    /// Where consolidation prepares a chain into a full data directory (default: the
    /// system temporary directory); it needs room for one full backup, unpacked.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Carry out a plan evaluated at a --now later than the clock: it deletes what a pass
    /// at that time would, backups the real window still promises included. Without this
    /// flag gc refuses such a --now (plan does not need it).
    #[arg(long)]
    pub allow_future_now: bool,
    #[command(flatten)]
    pub hook: HookArgs,
    /// Delete although the operator recorded in the store that its cluster has no
    /// established primary (seed 000: retention deletes nothing until one is; `plan` shows
    /// the record). For a cluster that is gone for good.
    #[arg(long)]
    pub override_primary_gate: bool,
    #[command(flatten)]
    pub fence: FenceArgs,
}

/// The DeleteHooks `gc` and `delete` run (seed 003: every deletion path runs them).
#[derive(Debug, Args)]
pub struct HookArgs {
    /// DeleteHook definitions (YAML, as applied to the cluster or written for `tidemark
    /// run`; repeatable): the webhooks and commands of those that select a backup run right
    /// before its data goes — and only then, not when it is only marked. A hook the
    /// operator recorded in the store (`_state/hooks.json`) runs here from its definition.
    /// With `kubectl tidemark gc`, the namespace's DeleteHooks are read from the cluster
    /// and their webhooks called from here.
    #[arg(long, value_name = "FILE")]
    pub hooks: Vec<std::path::PathBuf>,
    /// Address ranges no webhook gc or delete calls may connect to, comma-separated (""
    /// for none). Default: the operator's — link-local and cloud metadata, loopback and
    /// unspecified addresses (see `tidemark operator --help`).
    #[arg(long, value_name = "CIDR,...", default_value = tidemark_operator::tenancy::DEFAULT_DENIED_ENDPOINTS, hide_default_value = true)]
    pub deny_endpoints: String,
    /// Delete backups that DeleteHooks which cannot run here select — a job (it needs the
    /// cluster), or one the operator recorded in the store whose definition --hooks does
    /// not give — without running them. Each skipped hook is named in the audit record.
    /// Without it, such a deletion is refused (exit 2) naming the hooks, and nothing is
    /// deleted.
    #[arg(long)]
    pub skip_hooks: bool,
}

/// The store's lease, which every deleter holds (`tidemark run`, the operator's passes
/// and finalizers, `gc`, `delete`).
#[derive(Debug, Args, Default)]
pub struct FenceArgs {
    /// When another deleter holds the store's lease (`tidemark run`, the operator's pass,
    /// another gc or delete), wait until it is released or expires — without limit, or up
    /// to DURATION (`--wait=10m`) — instead of stopping at once with exit 9.
    #[arg(
        long,
        value_name = "DURATION",
        num_args = 0..=1,
        default_missing_value = "",
        require_equals = true
    )]
    pub wait: Option<String>,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// A BackupPolicy in the Kubernetes cluster: list its store, reached with its Secret
    /// (`kubectl tidemark ls <policy>`). Instead of --store/--cluster/--policy.
    #[arg(value_name = "POLICY", conflicts_with_all = ["store", "cluster", "policy"])]
    pub cluster_policy: Option<String>,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    /// A BackupPolicy file to take --store and --cluster from.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

#[cfg(test)]
mod tests {
    /// clap's own consistency checks over every subcommand: no flag named twice (the store
    /// flags are flattened into many commands), defaults and conflicts that exist.
    #[test]
    fn every_command_line_is_consistent() {
        // Also: every flag of UNUSED exists (mut_arg panics on an unknown id).
        super::command().debug_assert();
    }

    /// `--deny-endpoints`'s help lists its default (hidden from clap's own rendering, a
    /// word too long for a man page's line): every range of it.
    #[test]
    fn deny_endpoints_help_names_the_default() {
        use clap::CommandFactory;
        let mut cli = super::Cli::command();
        let operator = cli.find_subcommand_mut("operator").expect("operator");
        let help = operator
            .get_arguments()
            .find(|a| a.get_id() == "deny_endpoints")
            .and_then(|a| a.get_long_help().or(a.get_help()))
            .map(ToString::to_string)
            .unwrap_or_default();
        for range in tidemark_operator::tenancy::DEFAULT_DENIED_ENDPOINTS.split(',') {
            assert!(help.contains(range), "{range} not in the help: {help}");
        }
    }
}
