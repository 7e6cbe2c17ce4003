//! Turns arguments into a validated configuration: which store, which cluster, which
//! policy. Every refusal names the offending value and the accepted form.

use std::path::Path;

use jiff::Timestamp;
use tidemark_api::{BackupPolicy, ObjectStoreSpec};
use tidemark_core::{Policy, PolicyError, PolicyField, PolicyInput};
use tidemark_store::{ClusterStore, StoreOptions};

use crate::args::{PolicyArgs, StoreArgs};
use crate::exit::CliError;

/// Where to work.
#[derive(Debug)]
pub struct Target {
    pub store: ClusterStore,
    /// The object lock backups are committed with (`--lock-mode` over the policy's
    /// mode; the period is the policy's).
    pub object_lock: Option<ObjectLockSetting>,
}

/// The lock mode in force, and the policy's period when it has one.
#[derive(Debug, Clone, Copy)]
pub struct ObjectLockSetting {
    pub mode: tidemark_core::lock::LockMode,
    pub period: Option<tidemark_core::RetentionDuration>,
}

/// A validated policy and how the user wrote it (for the audit record).
#[derive(Debug)]
pub struct ResolvedPolicy {
    pub policy: Policy,
    pub as_given: serde_json::Value,
}

/// Reads and checks a BackupPolicy file; warns about months written `<n>m`.
pub fn read_policy_file(path: &Path) -> Result<BackupPolicy, CliError> {
    let text = read_config_file(path)?;
    let policy = BackupPolicy::from_yaml(&text)
        .map_err(|e| CliError::input(format!("{}: {e}", path.display())))?;
    warn_ambiguous(
        &path.display().to_string(),
        policy.spec.ambiguous_durations(),
    );
    Ok(policy)
}

/// Prints `warning: …` on stderr for each retention duration written with seed 000's ambiguous
/// `<n>m` (months here, minutes in intervals), after `prefix` (where it was read) when
/// there is one.
pub fn warn_ambiguous(
    prefix: &str,
    found: impl IntoIterator<Item = tidemark_core::AmbiguousDuration>,
) {
    for a in found {
        if prefix.is_empty() {
            eprintln!("warning: {a}");
        } else {
            eprintln!("warning: {prefix}: {a}");
        }
    }
}

/// [`warn_ambiguous`] for a flag's value.
pub fn warn_ambiguous_flag(flag: &str, value: Option<&str>) {
    warn_ambiguous("", tidemark_core::AmbiguousDuration::check(flag, value));
}

/// Reads a configuration file, refusing one too large to be a configuration; its nesting
/// and the rest of the YAML budget are held by the one parse that reads it.
pub fn read_config_file(path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::input(format!("cannot read {}: {e}", path.display())))?;
    if text.len() > tidemark_api::config::MAX_CONFIG_BYTES {
        let e = tidemark_api::config::YamlError::TooLarge { bytes: text.len() };
        return Err(CliError::input(format!("{}: {e}", path.display())));
    }
    Ok(text)
}

/// The DeleteHooks of `--hooks` files (YAML documents: DeleteHook, as applied to the
/// cluster or written for `tidemark run`; BackupPolicy and ScheduledBackup documents are
/// passed over), each refused with its file and field when it is not one that runs.
///
/// # Errors
/// A file cannot be read or parsed; a hook is invalid; two hooks share a name.
pub fn hook_files(
    paths: &[std::path::PathBuf],
) -> Result<Vec<tidemark_engine::hooks::LocalHook>, CliError> {
    let mut hooks: Vec<tidemark_engine::hooks::LocalHook> = Vec::new();
    for path in paths {
        let text = read_config_file(path)?;
        let docs = tidemark_api::config::parse_documents(&text)
            .map_err(|e| CliError::input(format!("--hooks {}: {e}", path.display())))?;
        let before = hooks.len();
        for doc in docs {
            let tidemark_api::config::Document::Hook(h) = doc else {
                continue;
            };
            let name = &h.metadata.name;
            if hooks.iter().any(|x| &x.name == name) {
                return Err(CliError::input(format!(
                    "--hooks {}: DeleteHook {name}: metadata.name: already defined; each hook needs its own name",
                    path.display()
                )));
            }
            hooks.push(
                tidemark_engine::hooks::LocalHook::from_document(&h).map_err(|e| {
                    CliError::input(format!(
                        "--hooks {}: DeleteHook {name}: {e}",
                        path.display()
                    ))
                })?,
            );
        }
        if hooks.len() == before {
            return Err(CliError::input(format!(
                "--hooks {}: no DeleteHook document in it; expected YAML documents of kind DeleteHook (apiVersion {})",
                path.display(),
                tidemark_api::API_VERSION
            )));
        }
    }
    Ok(hooks)
}

/// Opens the store named by flags, or else by the BackupPolicy file at `policy` (for the
/// commands that take a policy file only for its store and cluster).
pub fn store_target(args: &StoreArgs, policy: Option<&Path>) -> Result<Target, CliError> {
    let file = policy.map(read_policy_file).transpose()?;
    target(args, file.as_ref(), policy)
}

/// `file://relative/dir` (or `file://./dir`) → an absolute file URL under `base`; other
/// URLs unchanged. Config files can then name a store next to themselves.
pub fn absolutize_file_url(url: &str, base: &Path) -> String {
    match url.strip_prefix("file://") {
        Some(rest) if !rest.starts_with('/') => {
            let joined = base.join(rest.trim_start_matches("./"));
            format!("file://{}", joined.display())
        }
        _ => url.to_owned(),
    }
}

/// Opens the store named by flags, or else by the policy file (`policy_path` is where the
/// file is, for relative `file://` URLs).
pub fn target(
    args: &StoreArgs,
    file: Option<&BackupPolicy>,
    policy_path: Option<&Path>,
) -> Result<Target, CliError> {
    let copied;
    let file = match (&args.from_copy, file) {
        (None, f) => f,
        (Some(name), Some(p)) => {
            copied = p.as_copy(name).ok_or_else(|| {
                CliError::input(format!(
                    "--from-copy {name}: the policy names no such copy (spec.copies: {})",
                    p.spec.copy_names()
                ))
            })?;
            Some(&copied)
        }
        (Some(name), None) => {
            return Err(CliError::input(format!(
                "--from-copy {name} needs --policy FILE: the BackupPolicy whose spec.copies names the copy"
            )));
        }
    };
    let os = file.and_then(|p| p.spec.object_store.as_ref());
    let cwd = std::env::current_dir().unwrap_or_default();
    let url = match (&args.store, os) {
        (Some(u), _) => absolutize_file_url(u, &cwd),
        (None, Some(os)) => {
            let dir = policy_path
                .and_then(Path::parent)
                .map(|d| cwd.join(d))
                .unwrap_or_else(|| cwd.clone());
            absolutize_file_url(&os.store_url().map_err(CliError::input)?, &dir)
        }
        (None, None) => {
            return Err(CliError::input(
                "no store given: pass --store URL (e.g. file:///var/backups or s3://bucket/prefix) or a --policy file with spec.objectStore",
            ));
        }
    };
    let cluster = match (&args.cluster, file) {
        (Some(c), _) => c.clone(),
        (None, Some(p)) => p.cluster().to_owned(),
        (None, None) => {
            return Err(CliError::input(
                "no cluster given: pass --cluster NAME (the directory under the store URL)",
            ));
        }
    };
    let endpoint = args
        .endpoint
        .clone()
        .or_else(|| os.and_then(|o| o.endpoint.clone()));
    let ca_bundle = match &args.ca_bundle {
        // TIDEMARK_CA_BUNDLE in a pod holds the PEM itself (the operator sets it so).
        // (PEM may have text before its first block, as `openssl x509 -text` writes it.)
        Some(pem) if pem.contains("-----BEGIN ") => Some(pem.clone()),
        Some(file) => Some(std::fs::read_to_string(file).map_err(|e| {
            CliError::input(format!(
                "--ca-bundle {file}: {e} (a PEM file of the CA certificates to trust)"
            ))
        })?),
        None => os.and_then(|o| o.ca_bundle.clone()),
    };
    let mut options = StoreOptions {
        endpoint,
        region: os.and_then(|o| o.region.clone()),
        path_style: os.and_then(|o| o.path_style),
        ca_bundle,
        ..Default::default()
    };
    if let Some(name) = &args.from_copy {
        copy_credentials(name, &mut options);
    }
    let compression = match os.map(ObjectStoreSpec::compression).transpose() {
        Ok(c) => c.unwrap_or_default(),
        Err(e) => return Err(CliError::input(e.to_string())),
    };
    let policy_dir = policy_path
        .and_then(Path::parent)
        .map(|d| cwd.join(d))
        .unwrap_or_else(|| cwd.clone());
    let (recipients, identities) = keys(args, os.and_then(|o| o.encryption.as_ref()), &policy_dir)?;
    let plaintext_before = match args.allow_plaintext_before.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => Some(t.parse::<jiff::Timestamp>().map_err(|_| {
            CliError::input(format!(
                "--allow-plaintext-before {:?}: not an instant; give RFC 3339, e.g. 2026-11-01T00:00:00Z",
                t.chars().take(64).collect::<String>()
            ))
        })?),
        None => os
            .and_then(|o| o.encryption.as_ref())
            .map(tidemark_api::policy::EncryptionSpec::plaintext_before)
            .transpose()
            .map_err(|e| CliError::input(e.to_string()))?
            .flatten(),
    };
    let policy_lock = file
        .map(|p| p.spec.object_lock())
        .transpose()
        .map_err(|e| CliError::input(e.to_string()))?
        .flatten();
    let period = match args.lock_period.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => Some({
            warn_ambiguous_flag("--lock-period", Some(p));
            p.parse::<tidemark_core::RetentionDuration>()
                .map_err(|e| CliError::input(format!("--lock-period: {e}")))?
        }),
        None => policy_lock.map(|l| l.period),
    };
    let object_lock = match args.lock_mode.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => Some(ObjectLockSetting {
            mode: m
                .parse()
                .map_err(|e: String| CliError::input(format!("--lock-mode: {e}")))?,
            period,
        }),
        None => policy_lock.map(|l| ObjectLockSetting {
            mode: l.mode,
            period,
        }),
    };
    let lock_expiry = match args.after_lock_expiry.as_deref().filter(|m| !m.is_empty()) {
        Some(v) => v
            .parse()
            .map_err(|e: String| CliError::input(format!("--after-lock-expiry: {e}")))?,
        None => file
            .map(|p| p.spec.lock_expiry())
            .transpose()
            .map_err(|e| CliError::input(e.to_string()))?
            .unwrap_or_default(),
    };
    let rate = match args.bandwidth.as_deref().filter(|b| !b.is_empty()) {
        Some(b) => Some(
            b.parse::<tidemark_core::rate::Rate>()
                .map_err(|e| CliError::input(format!("--bandwidth: {e}")))?,
        ),
        None => file
            .map(|p| p.spec.bandwidth())
            .transpose()
            .map_err(|e| CliError::input(e.to_string()))?
            .flatten(),
    };
    Ok(Target {
        store: ClusterStore::open(&url, &cluster, &options)?
            .with_bandwidth(
                rate.map(|r| std::sync::Arc::new(tidemark_store::bandwidth::Bandwidth::new(&r))),
            )
            .with_lock_expiry(lock_expiry)
            .with_budget(budget()?)
            .with_compression(compression)
            .with_recipients(recipients)
            .with_plaintext_before(plaintext_before)
            .with_identities(identities)
            .with_object_lock(object_lock.map(|l| l.mode))?
            .with_lock_period(object_lock.and_then(|l| l.period)),
        object_lock,
    })
}

/// A copy's own credentials from `TIDEMARK_COPY_<NAME>_…` (the name upper-cased, `-` as
/// `_`), where given: S3 `AWS_ACCESS_KEY_ID` with `AWS_SECRET_ACCESS_KEY` (and
/// `AWS_SESSION_TOKEN`), GCS `GOOGLE_SERVICE_ACCOUNT_KEY` (the JSON key), Azure
/// `AZURE_STORAGE_ACCOUNT_NAME` with `AZURE_STORAGE_ACCOUNT_KEY` or `AZURE_STORAGE_SAS_TOKEN`.
/// Without them the copy is reached with the usual variables.
pub fn copy_credentials(name: &str, options: &mut StoreOptions) {
    let prefix = format!("TIDEMARK_COPY_{}_", name.to_uppercase().replace('-', "_"));
    let var = |k: &str| {
        std::env::var(format!("{prefix}{k}"))
            .ok()
            .filter(|v| !v.is_empty())
    };
    if let (Some(id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
        options.credentials = Some(tidemark_store::S3Credentials {
            access_key_id: id,
            secret_access_key: secret,
            session_token: var("AWS_SESSION_TOKEN"),
        });
    }
    if let Some(key) = var("GOOGLE_SERVICE_ACCOUNT_KEY") {
        options.cloud_credentials =
            Some(tidemark_store::CloudCredentials::GcsServiceAccountKey(key));
    } else if let Some(account) = var("AZURE_STORAGE_ACCOUNT_NAME") {
        options.cloud_credentials = Some(tidemark_store::CloudCredentials::Azure {
            account,
            access_key: var("AZURE_STORAGE_ACCOUNT_KEY"),
            sas_token: var("AZURE_STORAGE_SAS_TOKEN"),
        });
    }
}

/// What one command may read from a store ([`tidemark_store::budget`]): the local
/// defaults, or the environment's.
///
/// # Errors
/// A `TIDEMARK_MAX_*` variable that is not a positive whole number.
pub fn budget() -> Result<tidemark_store::budget::Budget, CliError> {
    tidemark_store::budget::Budget::from_env(tidemark_store::budget::Budget::LOCAL)
        .map_err(CliError::input)
}

/// Who uploads are encrypted to, and what reads decrypt with.
pub type Keys = (
    Option<std::sync::Arc<tidemark_store::crypt::Recipients>>,
    Option<std::sync::Arc<tidemark_store::crypt::Identities>>,
);

use tidemark_store::crypt::IDENTITY_ENV;

/// Who uploads are encrypted to and what reads decrypt with: the flags, else the policy
/// file's `objectStore.encryption` (its `identityFile` relative to `policy_dir`), plus
/// identities in `TIDEMARK_IDENTITY`.
///
/// # Errors
/// A recipient that is not one (named); an identity file that cannot be read or holds a
/// line that is not an identity (its line number; never the line).
pub fn keys(
    args: &StoreArgs,
    spec: Option<&tidemark_api::policy::EncryptionSpec>,
    policy_dir: &Path,
) -> Result<Keys, CliError> {
    use tidemark_store::crypt::{Identities, Recipients};
    let input = |e: tidemark_store::crypt::KeyError| CliError::input(e.to_string());
    // An empty setting (`TIDEMARK_RECIPIENTS=""`) is no setting: the policy's recipients
    // stand, never silently none.
    let given: Vec<&String> = args
        .recipients
        .iter()
        .filter(|r| !r.trim().is_empty())
        .collect();
    let recipients = if given.is_empty() {
        Recipients::parse(spec.map(|s| s.recipients.as_slice()).unwrap_or_default())
            .map_err(input)?
    } else {
        Recipients::parse(&given).map_err(input)?
    };
    let mut files: Vec<std::path::PathBuf> = args.identities.clone();
    if files.is_empty()
        && let Some(f) = spec.and_then(|s| s.identity_file.as_deref())
    {
        // The policy file may be shared with machines that only write (a database host):
        // without the file there, commands that need no key go on, and a read that needs
        // one stops with exit 10 naming the recipients.
        let path = policy_dir.join(f);
        if path.exists() {
            files.push(path);
        } else {
            tracing::info!(
                path = %path.display(),
                "the policy's objectStore.encryption.identityFile is not here; encrypted backups cannot be read"
            );
        }
    }
    let mut identities: Option<Identities> = None;
    for f in &files {
        let read = Identities::read_file(f).map_err(input)?;
        identities = Some(match identities {
            Some(i) => i.merge(read),
            None => read,
        });
    }
    if let Ok(text) = std::env::var(IDENTITY_ENV)
        && !text.trim().is_empty()
    {
        let read = Identities::parse(&text, IDENTITY_ENV).map_err(input)?;
        identities = Some(match identities {
            Some(i) => i.merge(read),
            None => read,
        });
    }
    Ok((
        recipients.map(std::sync::Arc::new),
        identities.map(std::sync::Arc::new),
    ))
}

/// The retention policy of the BackupPolicy file at `path` alone (no flags): the other side
/// of a change previewed (`plan --against`/`--with`, `simulate --against`).
pub fn policy_file(path: &Path) -> Result<ResolvedPolicy, CliError> {
    let file = read_policy_file(path)?;
    let args = crate::args::PolicyArgs {
        policy: Some(path.to_path_buf()),
        ..Default::default()
    };
    policy(&args, Some(&file))
}

/// The retention policy from the file or the flags (not both).
pub fn policy(args: &PolicyArgs, file: Option<&BackupPolicy>) -> Result<ResolvedPolicy, CliError> {
    let input = match file {
        Some(p) => {
            if args.any_flag() {
                return Err(CliError::input(
                    "give the policy either as --policy FILE or as flags (--window, --keep-last, …), not both",
                ));
            }
            let Some(r) = &p.spec.retention else {
                return Err(CliError::input(format!(
                    "{}: spec.retention is missing, so there is nothing to plan; add e.g. `retention: {{window: 30d}}`",
                    args.policy
                        .as_deref()
                        .unwrap_or(Path::new("policy"))
                        .display()
                )));
            };
            r.to_input(p.spec.time_zone.as_deref())
        }
        None => PolicyInput {
            window: {
                warn_ambiguous_flag("--window", args.window.as_deref());
                warn_ambiguous_flag("--failed-ttl", args.failed_ttl.as_deref());
                args.window.clone()
            },
            keep_last: args.keep_last,
            keep_daily: args.keep_daily,
            keep_weekly: args.keep_weekly,
            keep_monthly: args.keep_monthly,
            keep_yearly: args.keep_yearly,
            failed_backups_ttl: args.failed_ttl.clone(),
            cover_window: args.cover_window.then_some(true),
            consolidate: args.consolidate.then_some(true),
            max_deletions_per_pass: args.max_deletions,
            require_verified: args.require_verified.then_some(true),
            time_zone: args.time_zone.clone(),
            point_in_time_window: args.pitr_window.clone(),
            deletion_guard_threshold: args.deletion_guard_threshold,
            deletion_guard_window: args.deletion_guard_window.clone(),
        },
    };
    let mut policy = input.validate().map_err(|e| {
        let path = args.policy.as_deref().unwrap_or(Path::new("policy"));
        CliError::input(match (file.is_some(), e.field()) {
            (true, Some(f)) => format!(
                "{}: {}: {}",
                path.display(),
                yaml_path(f),
                e.problem()
            ),
            (true, None) => format!("{}: spec.retention: {e}", path.display()),
            (false, Some(f)) => format!("invalid policy: {}: {}", flag(f), e.problem()),
            (false, None) => match e {
                PolicyError::NoRule => "invalid policy: the policy has no retention rule, so it would keep only the newest backup: give at least one of --window, --keep-last, --keep-daily, --keep-weekly, --keep-monthly or --keep-yearly (or --policy FILE)".to_owned(),
                other => format!("invalid policy: {other}"),
            },
        })
    })?;
    // The file's annotation, unless the flag says otherwise.
    if let Some(p) = file {
        policy.branches_acknowledged =
            tidemark_api::policy::branches_acknowledged(&p.metadata.annotations)
                .map_err(CliError::input)?;
    }
    if let Some(at) = &args.acknowledge_branches {
        policy.branches_acknowledged = Some(at.parse().map_err(|_| {
            CliError::input(format!(
                "invalid --acknowledge-branches {at:?}: expected an RFC 3339 instant, e.g. 2026-11-29T12:00:00Z"
            ))
        })?);
    }
    let as_given = serde_json::to_value(&policy).unwrap_or(serde_json::Value::Null);
    Ok(ResolvedPolicy { policy, as_given })
}

/// Where a policy field is in a BackupPolicy document.
fn yaml_path(f: PolicyField) -> String {
    match f {
        PolicyField::TimeZone => "spec.timeZone".to_owned(),
        other => format!("spec.retention.{}", other.name()),
    }
}

/// The flag that sets a policy field.
fn flag(f: PolicyField) -> &'static str {
    match f {
        PolicyField::Window => "--window",
        PolicyField::KeepLast => "--keep-last",
        PolicyField::KeepDaily => "--keep-daily",
        PolicyField::KeepWeekly => "--keep-weekly",
        PolicyField::KeepMonthly => "--keep-monthly",
        PolicyField::KeepYearly => "--keep-yearly",
        PolicyField::FailedBackupsTtl => "--failed-ttl",
        PolicyField::CoverWindow => "--cover-window",
        PolicyField::Consolidate => "--consolidate",
        PolicyField::MaxDeletionsPerPass => "--max-deletions",
        PolicyField::PointInTimeWindow => "--pitr-window",
        PolicyField::DeletionGuardThreshold => "--deletion-guard-threshold",
        PolicyField::DeletionGuardWindow => "--deletion-guard-window",
        PolicyField::TimeZone => "--time-zone",
    }
}

/// `--now`, or the clock. Instants past the last one the clock can name
/// (`9999-12-30T22:00:00Z`) mean that last one.
pub fn now(arg: Option<&str>) -> Result<Timestamp, CliError> {
    let Some(s) = arg else {
        return Ok(Timestamp::now());
    };
    let invalid = || {
        CliError::input(format!(
            "invalid --now {s:?}: expected an RFC 3339 time such as 2026-11-20T02:00:00Z"
        ))
    };
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    // Well-formed but beyond the range: the end of time, for "as if everything expired".
    let pieces = jiff::fmt::temporal::Pieces::parse(s).map_err(|_| invalid())?;
    let date = pieces.date();
    if pieces.offset().is_some() && date.year() >= 9999 {
        Ok(Timestamp::MAX)
    } else {
        Err(invalid())
    }
}

/// Refuses to carry out a plan evaluated later than the clock unless asked to: such a
/// pass deletes backups that the real window still promises.
pub fn check_future_now(now: Timestamp, allowed: bool) -> Result<(), CliError> {
    /// Slack for a `--now` taken from the clock a moment before.
    const SKEW: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);
    let clock = Timestamp::now();
    if now > clock + SKEW && !allowed {
        return Err(CliError::input(format!(
            "--now {now} is later than the clock ({clock}): gc would delete what a pass then would, backups the window promises today included; pass --allow-future-now to do so (plan shows it without deleting)"
        )));
    }
    Ok(())
}

/// Takes the store's lease for `what` (`tidemark gc`, `tidemark delete`): at once, or
/// waiting as `--wait` says (telling stderr who holds it).
///
/// # Errors
/// `--wait` is not a duration; `TIDEMARK_LEASE_TTL` is not one from 3s to 1h; another
/// deleter holds the lease (exit 9, with how to wait for it); the store failed.
pub async fn fence(
    store: &tidemark_store::ClusterStore,
    what: &str,
    args: &crate::args::FenceArgs,
) -> Result<tidemark_engine::Fence, CliError> {
    use tidemark_engine::fence::{Fence, FenceOptions, Wait};
    let wait = match args.wait.as_deref() {
        None => Wait::No,
        Some("") => Wait::Forever,
        Some(text) => {
            let d = WAIT_FIELD.parse(Some(text)).map_err(CliError::input)?;
            Wait::For(std::time::Duration::try_from(d).unwrap_or(std::time::Duration::MAX))
        }
    };
    let options = FenceOptions::from_env()?;
    let mut told = String::new();
    let taken = Fence::acquire(
        store,
        &tidemark_engine::fence::holder(what),
        std::sync::Arc::new(tidemark_engine::SystemClock),
        options,
        wait,
        |l| {
            if l.holder != told {
                eprintln!(
                    "waiting for the store's lease, held by {} (renewed {}, expires {})",
                    l.describe(),
                    l.renewed_at,
                    l.expires_at
                );
                told.clone_from(&l.holder);
            }
        },
    )
    .await;
    match taken {
        Ok(f) => Ok(f),
        Err(e @ tidemark_engine::EngineError::LeaseHeld { .. }) if wait == Wait::No => {
            let exit = e.class().into();
            Err(CliError::new(
                exit,
                anyhow::Error::new(e).context(format!(
                    "{what} deletes only under the store's lease; --wait waits for it"
                )),
            ))
        }
        Err(e) => Err(e.into()),
    }
}

/// `--wait DURATION` of `gc` and `delete`: at most a week.
const WAIT_FIELD: tidemark_api::interval::IntervalField =
    tidemark_api::interval::IntervalField::named("--wait", "168h", 168 * 3600);
