//! The commands: observe → plan → (execute) → report.

use std::collections::HashSet;
use std::io::Write;

use jiff::Timestamp;
use tidemark_core::{Action, Policy};
use tidemark_engine::{LocalConsolidator, PassRequest, retention_pass};
use tidemark_store::catalog::SegmentListing;
use tidemark_store::{Catalog, NoProgress, Progress};

use crate::args::{Cli, Command, LsArgs, OutputFormat, PassArgs};
use crate::exit::{CliError, Exit};
use crate::output::{
    ArchiveOut, BackupOut, JSON_FORMAT_VERSION, LsOut, MissingRange, PlanOut, emit, emit_as,
    human_bytes, table, window_line,
};
use crate::progress::TerminalProgress;
use crate::resolve;

pub fn run(cli: Cli) -> Result<Exit, CliError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(Exit::Internal, e))?;
    let outcome = match cli.command {
        Command::Plan(a) => rt.block_on(pass(&a, None)),
        Command::Gc(a) => rt.block_on(pass(
            &a.pass,
            Some(GcOptions {
                compress: &a.compress,
                ignore_malformed: a.ignore_malformed,
                work_dir: a.work_dir.as_deref(),
                allow_future_now: a.allow_future_now,
                hook: &a.hook,
                override_primary_gate: a.override_primary_gate,
                fence: &a.fence,
            }),
        )),
        Command::Ls(a) => rt.block_on(ls(&a)),
        Command::Push(a) => rt.block_on(crate::transfer::push(&a)),
        Command::Fetch(a) => rt.block_on(crate::transfer::fetch(&a)),
        Command::ArchiveBinlogs(a) => rt.block_on(crate::transfer::archive_binlogs(&a)),
        Command::Restore(a) => rt.block_on(crate::restore::restore(&a)),
        Command::Simulate(a) => crate::simulate::run(&a),
        Command::Run(a) => rt.block_on(crate::run::run(&a)),
        Command::Crds(a) => crds(&a),
        Command::Rbac(a) => rbac(&a),
        Command::Operator(a) => rt.block_on(operator(&a)),
        Command::Install(a) => install(&a),
        Command::Completions(a) => completions(&a),
        Command::Man(a) => man(&a),
        Command::Backup(a) => rt.block_on(crate::cluster::backup(&a)),
        Command::Status(a) => rt.block_on(crate::cluster::status(&a)),
        Command::Describe(a) => rt.block_on(crate::inspect::describe(&a)),
        Command::Logs(a) => rt.block_on(crate::inspect::logs(&a)),
        Command::Consolidate(a) => rt.block_on(consolidate(&a)),
        Command::Delete(a) => rt.block_on(delete(&a)),
        Command::Keygen(a) => keygen(&a),
        Command::Verify(a) => rt.block_on(crate::verify::verify(&a)),
        Command::Copy(a) => rt.block_on(crate::copy::copy(&a)),
        Command::RestoreTest(a) => rt.block_on(crate::restore::restore_test(&a)),
    };
    // Work still blocked in a thread (a name lookup through a cut network, when a watch was
    // cut short) holds the exit a second at most.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    outcome
}

/// `tidemark operator`: elect, then run the controllers until a signal.
async fn operator(args: &crate::args::OperatorArgs) -> Result<Exit, CliError> {
    let client = kube::Client::try_default().await.map_err(|e| {
        CliError::input(format!(
            "no Kubernetes configuration (kubeconfig or in-cluster): {e}"
        ))
    })?;
    let identity = args.identity.clone().unwrap_or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| format!("tidemark-{}", std::process::id()))
    });
    let mut election = tidemark_operator::leader::Election::new(&args.lease_namespace, &identity);
    tidemark_api::names::dns_subdomain("--lease-name", &args.lease_name)
        .map_err(|e| CliError::input(e.to_string()))?;
    election.name.clone_from(&args.lease_name);
    let mut options = tidemark_operator::Options::new(election);
    if let Some(image) = &args.image {
        options.image.clone_from(image);
    }
    options.allow_ambient_credentials = args.allow_ambient_credentials;
    options.tenancy.allow_compliance = args.allow_compliance_locks;
    options.tenancy.allow_privileged_templates = args.allow_privileged_templates;
    options.tenancy.allow_archiver_images = args.allow_archiver_images;
    options.tenancy.allow_unlabelled_secrets = args.allow_unlabelled_secrets;
    options.tenancy.denied_endpoints =
        tidemark_operator::tenancy::parse_cidrs(&args.deny_endpoints)
            .map_err(|e| CliError::input(format!("--deny-endpoints {e}")))?;
    resolve::warn_ambiguous_flag("--max-lock-period", args.max_lock_period.as_deref());
    options.tenancy.max_lock_period = args
        .max_lock_period
        .as_deref()
        .filter(|p| !p.is_empty())
        .map(str::parse::<tidemark_core::RetentionDuration>)
        .transpose()
        .map_err(|e| CliError::input(format!("--max-lock-period: {e}")))?;
    let max = tidemark_api::interval::IntervalField::exec_max_duration()
        .parse(Some(&args.exec_max_duration))
        .map_err(|e| CliError::input(e.to_string()))?;
    options.exec_limits = tidemark_operator::streams::Limits {
        streams: usize::from(args.exec_streams),
        max_duration: max.unsigned_abs(),
    };
    options.background_passes = usize::from(args.background_passes);
    options.pass_budget =
        tidemark_store::budget::Budget::from_env(tidemark_store::budget::Budget::SHARED)
            .map_err(CliError::input)?;
    options.store_lease = tidemark_engine::FenceOptions::from_env()?;
    options.namespaces = namespaces(&args.namespaces)?;
    options.capabilities = tidemark_operator::rbac::Capabilities::without(&args.disable)
        .map_err(|e| CliError::input(format!("--disable: {e}")))?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::input(format!("--listen {}: {e}", args.listen)))?;
    tokio::spawn(tidemark_operator::metrics::serve(
        listener,
        options.metrics.clone(),
    ));
    let shutdown = async {
        crate::transfer::shutdown_signal().await;
    };
    match tidemark_operator::run(
        client,
        options,
        std::sync::Arc::new(tidemark_engine::SystemClock),
        shutdown,
    )
    .await
    {
        Ok(()) => Ok(Exit::Success),
        Err(e) => Err(CliError::new(Exit::Contention, e)),
    }
}

/// `tidemark delete --backup-id ID`: a requested deletion (the engine's, as the
/// operator's finalizer makes it): deleted, or marked while a recovery depends on it.
async fn delete(args: &crate::args::DeleteArgs) -> Result<Exit, CliError> {
    use tidemark_engine::delete::Requested;
    if !tidemark_core::inventory::is_backup_id(&args.backup_id) {
        return Err(CliError::input(format!(
            "--backup-id {:?}: not a backup-id (e.g. 20261120T020000Z-3f2a9c1d)",
            args.backup_id
        )));
    }
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &target.store;
    let id = &args.backup_id;
    // The lease first: what is read to find the backup is what is deleted.
    let fence = resolve::fence(store, "tidemark delete", &args.fence).await?;
    let found = fence.guard(find_and_delete(store, args, &fence)).await;
    fence.release().await;
    let (name, outcome) = found?;
    let (word, objects, audit, kept): (&str, usize, Option<String>, Vec<String>) = match &outcome {
        Requested::Absent => ("absent", 0, None, Vec::new()),
        Requested::Marked(keep) => (
            "marked",
            0,
            None,
            keep.iter().map(ToString::to_string).collect(),
        ),
        Requested::Deleted(r) => (
            "deleted",
            r.objects_deleted,
            r.audit_key.clone(),
            Vec::new(),
        ),
    };
    if args.output.structured() {
        emit_as(
            args.output,
            &serde_json::json!({
                "formatVersion": JSON_FORMAT_VERSION,
                "outcome": word,
                "backupName": name,
                "backupId": id,
                "objectsDeleted": objects,
                "auditRecord": audit,
                "keptBy": kept,
            }),
        )?;
    } else {
        emit(&match &outcome {
            Requested::Absent => {
                format!("backup {name}/{id} is not in the store any more: nothing to delete\n")
            }
            Requested::Marked(_) => format!(
                "backup {name}/{id} stays while a recovery depends on it ({}): marked for deletion; a retention pass (gc) removes it, or merges its chain into a synthetic full with consolidate, once that no longer holds\n",
                kept.join(", ")
            ),
            Requested::Deleted(_) => format!(
                "deleted backup {name}/{id} ({objects} objects; audit record {})\n",
                audit.as_deref().unwrap_or("-")
            ),
        })?;
    }
    Ok(Exit::Success)
}

/// `tidemark consolidate --backup-id ID`: the synthetic full of one chain.
async fn consolidate(args: &crate::args::ConsolidateArgs) -> Result<Exit, CliError> {
    if !tidemark_core::inventory::is_backup_id(&args.backup_id) {
        return Err(CliError::input(format!(
            "--backup-id {:?}: not a backup-id (e.g. 20261120T020000Z-3f2a9c1d)",
            args.backup_id
        )));
    }
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &args.compress.apply(&target.store);
    let consolidator = tidemark_engine::LocalConsolidator {
        tools: Default::default(),
        work_dir: args.work_dir.clone().unwrap_or_else(std::env::temp_dir),
    };
    let c =
        tidemark_engine::pass::consolidate_now(store, &args.backup_id, &consolidator, &NoProgress)
            .await?;
    if args.output.structured() {
        emit_as(
            args.output,
            &serde_json::json!({
                "target": c.target,
                "synthetic": c.synthetic,
                "consolidatedFrom": c.consolidated_from,
                "size": c.size,
            }),
        )?;
    } else {
        emit(&format!(
            "committed the synthetic full {} (from {})\n",
            c.synthetic,
            c.consolidated_from.join(" + ")
        ))?;
    }
    Ok(Exit::Success)
}

/// `tidemark install PATH`: this binary, copied to PATH through a temporary file beside it.
fn install(args: &crate::args::InstallArgs) -> Result<Exit, CliError> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().map_err(|e| CliError::new(Exit::Internal, e))?;
    let dir = args
        .path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let fail = |e: std::io::Error| {
        CliError::input(format!("cannot install to {}: {e}", args.path.display()))
    };
    let tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    std::fs::copy(&me, tmp.path()).map_err(fail)?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).map_err(fail)?;
    tmp.persist(&args.path).map_err(|e| fail(e.error))?;
    Ok(Exit::Success)
}

/// `--namespace` values: Kubernetes namespace names, each once.
fn namespaces(given: &[String]) -> Result<Vec<String>, CliError> {
    let mut out: Vec<String> = Vec::new();
    for ns in given.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        tidemark_api::names::dns_label("--namespace", ns)
            .map_err(|e| CliError::input(e.to_string()))?;
        if !out.iter().any(|o| o == ns) {
            out.push(ns.to_owned());
        }
    }
    Ok(out)
}

/// `tidemark rbac`: the operator's RBAC as one YAML stream.
fn rbac(args: &crate::args::RbacArgs) -> Result<Exit, CliError> {
    tidemark_api::names::dns_label("--operator-namespace", &args.operator_namespace)
        .map_err(|e| CliError::input(e.to_string()))?;
    tidemark_api::names::dns_subdomain("--service-account", &args.service_account)
        .map_err(|e| CliError::input(e.to_string()))?;
    let install = tidemark_operator::rbac::Install {
        namespace: args.operator_namespace.clone(),
        service_account: args.service_account.clone(),
        namespaces: namespaces(&args.namespaces)?,
        capabilities: tidemark_operator::rbac::Capabilities::without(&args.disable)
            .map_err(|e| CliError::input(format!("--disable: {e}")))?,
    };
    let mut out = String::from(
        "# The Tidemark operator's RBAC, from `tidemark rbac`. Apply with kubectl apply -f -.\n",
    );
    for doc in tidemark_operator::rbac::manifests(&install) {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&doc).map_err(|e| CliError::new(Exit::Internal, e))?);
    }
    emit(&out)?;
    Ok(Exit::Success)
}

/// `tidemark crds`: the CRDs as one YAML stream.
fn crds(args: &crate::args::CrdsArgs) -> Result<Exit, CliError> {
    let text = if args.without_cel {
        let mut out = String::new();
        for crd in tidemark_api::crd::all() {
            out.push_str("---\n");
            out.push_str(
                &serde_saphyr::to_string(&tidemark_api::crd::without_cel(&crd))
                    .map_err(|e| CliError::new(Exit::Internal, e))?,
            );
        }
        out
    } else {
        tidemark_api::crd::yaml().map_err(|e| CliError::new(Exit::Internal, e))?
    };
    emit(&text)?;
    Ok(Exit::Success)
}

fn keygen(args: &crate::args::KeygenArgs) -> Result<Exit, CliError> {
    let (identity, public) = tidemark_store::crypt::generate();
    // Every other command's -o is a format: `keygen -o json` would write the secret key
    // to a file named json, where a user expected it on the screen.
    if let Some(name) = args
        .output
        .as_ref()
        .and_then(|p| p.to_str())
        .filter(|p| ["json", "yaml", "table", "wide"].contains(p))
    {
        return Err(CliError::input(format!(
            "--output {name}: keygen's -o names the identity file, not a format (it prints the public key, or the identity without -o); to write a file of that name, give ./{name}"
        )));
    }
    match &args.output {
        Some(path) => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| CliError::input(format!("--output {}: {e}", path.display())))?;
            f.write_all(identity.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| {
                    CliError::new(Exit::Internal, anyhow::anyhow!("{}: {e}", path.display()))
                })?;
            emit(&format!("{public}\n"))?;
        }
        None => {
            eprintln!("Public key: {public}");
            emit(&identity)?;
        }
    }
    Ok(Exit::Success)
}

/// `delete`'s work under the store's lease: which directory holds the id, then the
/// deletion.
async fn find_and_delete(
    store: &tidemark_store::ClusterStore,
    args: &crate::args::DeleteArgs,
    fence: &tidemark_engine::Fence,
) -> Result<(String, tidemark_engine::delete::Requested), CliError> {
    use tidemark_engine::delete::{DeleteRequest, delete_requested};
    let id = &args.backup_id;
    // Which directory: the one name holding the id (or the one named).
    let catalog = Catalog::load_backups(store, &NoProgress).await?;
    let mut names: Vec<&str> = catalog
        .backups
        .iter()
        .filter(|b| &b.backup.id == id)
        .map(|b| b.backup.name.as_str())
        .filter(|n| args.backup_name.as_deref().is_none_or(|want| want == *n))
        .collect();
    names.sort_unstable();
    names.dedup();
    let name = match names.as_slice() {
        [one] => (*one).to_owned(),
        [] => {
            return Err(CliError::input(format!(
                "no backup {id}{} in {} (cluster {}): nothing to delete (`tidemark ls` lists them)",
                args.backup_name
                    .as_deref()
                    .map(|n| format!(" named {n}"))
                    .unwrap_or_default(),
                store.url,
                store.cluster
            )));
        }
        many => {
            return Err(CliError::input(format!(
                "backup-id {id} is in {} directories ({}): say which with --backup-name",
                many.len(),
                many.join(", ")
            )));
        }
    };
    let request = DeleteRequest {
        name: name.clone(),
        id: id.clone(),
        reason: tidemark_core::Reason::DeletionRequested,
        requested_by: "tidemark delete".to_owned(),
        audit_extra: serde_json::Map::new(),
        now: Timestamp::now(),
        recorded_hooks: recorded_hooks(&args.hook),
        hooks: local_hooks(
            &args.hook,
            resolve::hook_files(&args.hook.hooks)?,
            "deletionRequested",
        )?,
    };
    Ok((name, delete_requested(fence, &request).await?))
}

/// The deletion guard's hold in one line, with the acknowledgement that releases it
/// (`None`: nothing held).
fn guard_line(
    v: &tidemark_core::guard::Verdict,
    gc: bool,
    started_at: Timestamp,
) -> Option<String> {
    if !v.holds() {
        return None;
    }
    let mut s = format!(
        "deletion guard{}: {}.",
        if gc { "" } else { " (plan: what gc would do)" },
        v.summary()
    );
    // A plan records nothing: only an instant a gc recorded releases anything.
    if let Some(at) = v.release_with.filter(|&at| gc || at < started_at) {
        s.push_str(&format!(
            " If that is what you want, acknowledge with `tidemark gc --allow-mass-deletion {at}` (or the policy's annotation tidemark.io/allow-deletions-before: \"{at}\"): it releases these deletions only, not a later wave"
        ));
    } else {
        s.push_str(" `tidemark gc` holds them and records since when, and prints the acknowledgement that releases them");
    }
    Some(s)
}

/// What `gc` adds to a `plan`.
struct GcOptions<'a> {
    compress: &'a crate::args::CompressArgs,
    ignore_malformed: bool,
    work_dir: Option<&'a std::path::Path>,
    allow_future_now: bool,
    hook: &'a crate::args::HookArgs,
    override_primary_gate: bool,
    fence: &'a crate::args::FenceArgs,
}

/// What becomes of hooks that cannot run here: skipped with `--skip-hooks`, else refused.
fn recorded_hooks(args: &crate::args::HookArgs) -> tidemark_engine::RecordedHooks {
    if args.skip_hooks {
        tidemark_engine::RecordedHooks::Skip
    } else {
        tidemark_engine::RecordedHooks::Refuse
    }
}

/// The hooks the command line runs (none: `None`), their webhooks kept off
/// `--deny-endpoints`.
fn local_hooks(
    args: &crate::args::HookArgs,
    hooks: Vec<tidemark_engine::hooks::LocalHook>,
    reason: &'static str,
) -> Result<Option<std::sync::Arc<dyn tidemark_engine::DeleteHooks>>, CliError> {
    let deny = &args.deny_endpoints;
    let denied = tidemark_operator::tenancy::parse_cidrs(deny)
        .map_err(|e| CliError::input(format!("--deny-endpoints {deny:?}: {e}")))?;
    Ok((!hooks.is_empty()).then(|| {
        std::sync::Arc::new(
            tidemark_engine::hooks::LocalHooks::new(hooks)
                .for_reason(reason)
                .denying(denied),
        ) as std::sync::Arc<dyn tidemark_engine::DeleteHooks>
    }))
}

/// `plan` (gc = None) and `gc`: one retention pass through the engine, the same one
/// `tidemark run` makes.
async fn pass(args: &PassArgs, gc: Option<GcOptions<'_>>) -> Result<Exit, CliError> {
    let in_cluster = match &args.cluster_policy {
        Some(name) => {
            crate::restore::refuse_beside_policy(
                name,
                &crate::restore::store_flags_beside_policy(),
            )?;
            Some(
                crate::cluster::policy(
                    &args.kube,
                    name,
                    args.store.from_copy.as_deref(),
                    args.store.endpoint.as_deref(),
                )
                .await?,
            )
        }
        None => None,
    };
    // Seed 003: every deletion runs the hooks of the backups it deletes, right before their
    // data goes: those of --hooks files, and with `kubectl tidemark gc` the namespace's
    // (webhooks called from here; a job needs the operator: refused unless --skip-hooks).
    let mut hooks = match &gc {
        Some(g) => resolve::hook_files(&g.hook.hooks)?,
        None => Vec::new(),
    };
    if let (Some(c), Some(_)) = (&in_cluster, &gc) {
        for h in &c.hooks {
            if hooks.iter().any(|x| x.name == h.name) {
                return Err(CliError::input(format!(
                    "--hooks: DeleteHook {} is also in the cluster's namespace {}; kubectl tidemark gc runs the cluster's: leave it out of --hooks",
                    h.name,
                    c.document.metadata.namespace.as_deref().unwrap_or_default()
                )));
            }
        }
        hooks.extend(c.hooks.iter().cloned());
    }
    let file = match &in_cluster {
        Some(c) => Some(c.document.clone()),
        None => args
            .policy
            .policy
            .as_deref()
            .map(resolve::read_policy_file)
            .transpose()?,
    };
    // `gc --against/--with` are refused by the parser (args::UNUSED).
    // A change previewed: the new policy is planned, the current one compared with it.
    let (policy, compare_with) = match (&args.with, &args.against) {
        (Some(new), _) => (
            resolve::policy_file(new)?,
            Some(resolve::policy(&args.policy, file.as_ref())?.policy),
        ),
        (None, Some(current)) => (
            resolve::policy(&args.policy, file.as_ref())?,
            Some(resolve::policy_file(current)?.policy),
        ),
        (None, None) => (resolve::policy(&args.policy, file.as_ref())?, None),
    };
    let allow_deletions_before = match &args.allow_mass_deletion {
        Some(at) => {
            let t = at.parse::<Timestamp>().map_err(|_| {
                CliError::input(format!(
                    "invalid --allow-mass-deletion {at:?}: expected an RFC 3339 instant, e.g. 2026-11-29T12:00:00Z (the held pass prints the one to give)"
                ))
            })?;
            // A future instant would release every wave to come.
            if t > Timestamp::now() {
                return Err(CliError::input(format!(
                    "--allow-mass-deletion {at}: later than now; give the instant the held pass printed (it releases the deletions held at or before it, not those to come)"
                )));
            }
            Some(t)
        }
        None => match &file {
            Some(f) => tidemark_api::policy::deletions_allowed_before(&f.metadata.annotations)
                .map_err(CliError::input)?,
            None => None,
        },
    };
    let (mut target, cluster_holds, cluster_restores) = match in_cluster {
        Some(c) => (
            resolve::Target {
                store: c.store,
                object_lock: None,
            },
            c.holds,
            c.restore_holds,
        ),
        None => (
            resolve::target(&args.store, file.as_ref(), args.policy.policy.as_deref())?,
            HashSet::new(),
            Vec::new(),
        ),
    };
    if let Some(g) = &gc {
        target.store = g.compress.apply(&target.store);
    }
    let now = resolve::now(args.now.as_deref())?;
    if let Some(g) = &gc {
        resolve::check_future_now(now, g.allow_future_now)?;
    }
    let started_at = Timestamp::now();
    let json = args.output.structured();

    let bar = TerminalProgress::for_humans(json);
    let progress: &dyn Progress = match &bar {
        Some(b) => b,
        None => &NoProgress,
    };
    let request = PassRequest {
        // Only gc runs hooks (plan deletes nothing): no hooks, no list to read.
        hooks: match &gc {
            Some(g) => local_hooks(g.hook, hooks, "retention")?,
            None => None,
        },
        policy: policy.policy.clone(),
        policy_as_given: policy.as_given.clone(),
        now,
        started_at,
        protect: args.protect.iter().cloned().chain(cluster_holds).collect(),
        restores: cluster_restores,
        execute: gc.is_some(),
        ignore_malformed: gc.as_ref().is_some_and(|g| g.ignore_malformed),
        recorded_hooks: gc
            .as_ref()
            .map_or(tidemark_engine::RecordedHooks::Refuse, |g| {
                recorded_hooks(g.hook)
            }),
        override_primary_gate: gc.as_ref().is_some_and(|g| g.override_primary_gate),
        allow_deletions_before,
        compare_with,
    };
    let consolidator = LocalConsolidator {
        tools: Default::default(),
        work_dir: gc
            .as_ref()
            .and_then(|g| g.work_dir)
            .map_or_else(std::env::temp_dir, std::path::Path::to_path_buf),
    };
    // gc deletes only under the store's lease, which it holds until its pass ends.
    let fence = match &gc {
        Some(g) => Some(resolve::fence(&target.store, "tidemark gc", g.fence).await?),
        None => None,
    };
    let outcome = retention_pass(
        &target.store,
        &request,
        fence.as_ref(),
        Some(&consolidator),
        progress,
    )
    .await;
    if let Some(f) = fence {
        f.release().await;
    }
    if let Some(b) = &bar {
        b.finish();
    }
    let outcome = outcome?;
    let survey = &outcome.survey;
    for id in &args.protect {
        if !survey.catalog.has_id(id) {
            eprintln!(
                "warning: --protect {id}: no backup with that id in {}/{}",
                target.store.url, target.store.cluster
            );
        }
    }
    for w in &survey.catalog.warnings {
        eprintln!("warning: {w}");
    }
    let mut out = PlanOut::new(
        &target.store,
        survey,
        policy.as_given.clone(),
        outcome.executed,
    );
    out.lifecycle = tidemark_store::survey::bucket_lifecycle(
        &target.store,
        survey,
        policy.policy.window.map(|w| w.as_signed_duration()),
    )
    .await
    .map(crate::output::LifecycleOut::new);
    if let Some(problem) = out.lifecycle.as_ref().and_then(|l| l.problem.as_ref()) {
        eprintln!("warning: {problem}");
    }
    // Seed 000's gate as the operator recorded it: gc deletes nothing while it is closed.
    out.no_primary = tidemark_store::state::load_holds(&target.store)
        .await
        .ok()
        .flatten()
        .and_then(|h| {
            h.no_primary.map(|g| crate::output::GateOut {
                writer: h.writer,
                since: g.since,
                message: g.message,
            })
        });
    out.deletion_guard = outcome.guard.clone();
    out.change = outcome.change.clone();
    if json {
        emit_as(args.output, &out)?;
    } else {
        emit(&plan_table(
            &out,
            &policy.policy,
            args.output == OutputFormat::Wide,
        ))?;
    }
    if let Some(line) = guard_line(&outcome.guard, gc.is_some(), started_at) {
        eprintln!("warning: {line}");
    }

    let malformed = survey.catalog.malformed.len();
    if malformed > 0 {
        let verb = if outcome.blocked_by_malformed {
            "nothing was deleted"
        } else if gc.is_some() {
            "they were left untouched"
        } else {
            "gc will refuse to run until they are fixed or --ignore-malformed is given"
        };
        eprintln!(
            "error: {malformed} malformed metadata.json file(s) in {}/{} ({}); {verb}",
            target.store.url,
            target.store.cluster,
            survey
                .catalog
                .malformed
                .iter()
                .map(|m| format!("{}: {}", m.key, m.problem))
                .collect::<Vec<_>>()
                .join("; ")
        );
        if outcome.blocked_by_malformed || gc.is_none() {
            return Ok(Exit::Data);
        }
    }
    if let Some(report) = &out.executed
        && !report.failures.is_empty()
    {
        eprintln!(
            "error: {} object(s) could not be deleted; run gc again to finish (first: {}: {})",
            report.failures.len(),
            report.failures[0].key,
            report.failures[0].error
        );
        return Ok(Exit::Partial);
    }
    if gc.is_some() && outcome.guard.holds() {
        return Ok(Exit::Held);
    }
    Ok(Exit::Success)
}

fn describe_policy(p: &Policy) -> String {
    let mut parts = Vec::new();
    if let Some(w) = p.window {
        parts.push(format!("window {w}"));
    }
    for (name, n) in [
        ("keepLast", p.keep_last),
        ("keepDaily", p.keep_daily),
        ("keepWeekly", p.keep_weekly),
        ("keepMonthly", p.keep_monthly),
        ("keepYearly", p.keep_yearly),
    ] {
        if n > 0 {
            parts.push(format!("{name} {n}"));
        }
    }
    if let Some(t) = p.failed_backups_ttl {
        parts.push(format!("failedBackupsTTL {t}"));
    }
    if p.cover_window {
        parts.push("coverWindow".into());
    }
    if p.max_deletions_per_pass > 0 {
        parts.push(format!("maxDeletionsPerPass {}", p.max_deletions_per_pass));
    }
    parts.push(format!(
        "time zone {}",
        p.time_zone.iana_name().unwrap_or("UTC")
    ));
    parts.join(", ")
}

fn plan_table(out: &PlanOut, policy: &Policy, wide: bool) -> String {
    let mut s = format!(
        "Retention plan for cluster {:?} in {} at {}{}\nPolicy: {}\n\n",
        out.cluster,
        out.store,
        out.now,
        if out.dry_run { " (dry run)" } else { "" },
        describe_policy(policy)
    );
    let rows: Vec<Vec<String>> = out
        .backups
        .iter()
        .map(|b| {
            vec![
                b.action
                    .map(|a| match a {
                        Action::Keep => "keep",
                        Action::Delete => "DELETE",
                        Action::Consolidate => "consolidate",
                    })
                    .unwrap_or("")
                    .to_owned(),
                b.backup_id.clone(),
                b.backup_name.clone(),
                b.kind.to_owned(),
                b.phase.to_owned(),
                b.completed_at
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                human_bytes(b.size),
                b.reasons.clone().unwrap_or_default().join(", "),
            ]
            .into_iter()
            .chain(wide.then(|| wide_columns(b)).into_iter().flatten())
            .collect()
        })
        .collect();
    if rows.is_empty() {
        s.push_str("No backups in this cluster.\n");
    } else {
        let header = [
            "ACTION",
            "BACKUP-ID",
            "NAME",
            "TYPE",
            "PHASE",
            "COMPLETED",
            "SIZE",
            "REASONS",
        ];
        s.push_str(&table(&with_wide(&header, wide), &rows));
    }
    s.push('\n');
    s.push_str(&format!(
        "Backups: keep {}, delete {} ({})\n",
        out.summary.keep,
        out.summary.delete,
        human_bytes(out.summary.delete_bytes)
    ));
    s.push_str(&format!(
        "Segments: delete {} ({}){}; keep {}{}{}{}\n",
        out.segments.delete.len(),
        human_bytes(out.segments.delete_bytes),
        out.horizon
            .map(|h| format!(" behind the horizon {h}"))
            .unwrap_or_else(|| " (no horizon: no successful backup is kept)".into()),
        out.segments.keep,
        if out.segments.kept_unknown_last_event > 0 {
            let n = out.segments.kept_unknown_last_event;
            format!(
                " ({n} kept because {} last event time is unknown)",
                if n == 1 { "its" } else { "their" }
            )
        } else {
            String::new()
        },
        if out.segments.kept_branch > 0 {
            format!(
                " ({} behind the horizon kept on a branch of a switch of primary, until \
                 acknowledged with --acknowledge-branches or out of the window)",
                out.segments.kept_branch
            )
        } else {
            String::new()
        },
        if out.segments.drop_from_index.is_empty() {
            String::new()
        } else {
            format!(
                "; {} index entries whose object is gone will be dropped",
                out.segments.drop_from_index.len()
            )
        },
    ));
    s.push_str(&format!(
        "Recovery window after this pass: {}\n",
        window_line(&out.recovery_window)
    ));
    if let Some(g) = &out.no_primary {
        s.push_str(&format!(
            "Primary: none established since {} ({}, recorded by {}): gc deletes nothing until one is (--override-primary-gate)\n",
            g.since, g.message, g.writer
        ));
    }
    if !out.expired.is_empty() {
        let bytes: u64 = out.expired.iter().map(|e| e.size).sum();
        s.push_str(&format!(
            "Expired: {} locked backup(s) ({}) whose lock ended, recorded as expired: in no plan, restore or window; their objects are left to the bucket's lifecycle rule\n",
            out.expired.len(),
            human_bytes(bytes)
        ));
    }
    if let Some(l) = &out.lifecycle {
        let expiring = out
            .backups
            .iter()
            .filter(|b| b.action == Some(Action::Delete) && b.immutable_until.is_some())
            .count();
        if expiring > 0 {
            s.push_str(&format!(
                "Of the backups this pass deletes, {expiring} were locked: they are recorded as expired and their objects left to the bucket's lifecycle rule (afterExpiry: lifecycle; --after-lock-expiry delete deletes them)\n"
            ));
        }
        s.push_str(&match (&l.problem, &l.verdict) {
            (Some(p), _) => format!("Lifecycle: {p}\n"),
            (None, tidemark_store::lifecycle::Verdict::Removes { rule, days }) => format!(
                "Lifecycle: the bucket's rule {rule:?} removes expired chains {days} days after they were written\n"
            ),
            (None, _) => String::new(),
        });
    }
    if out.summary.kept_only_for_chains > 0 {
        s.push_str(&format!(
            "Chains: {} backup(s) ({}) kept only because a retained increment builds on them; \
             they go with their chain's last increment. A forever-incremental chain (no \
             maxIncrementsPerFull) without retention.consolidate never ends, so retention \
             frees nothing of it (docs/retention.md#forever-incrementals)\n",
            out.summary.kept_only_for_chains,
            human_bytes(out.summary.kept_only_for_chains_bytes)
        ));
    }
    s.push_str(&crate::output::timeline_lines(&out.timelines));
    if !out.foreign.is_empty() {
        s.push_str(&format!(
            "Foreign objects (not Tidemark's layout, never deleted): {}\n",
            list_some(&out.foreign)
        ));
    }
    if !out.malformed.is_empty() {
        let items: Vec<String> = out
            .malformed
            .iter()
            .map(|m| format!("{} ({})", m.key, m.problem))
            .collect();
        s.push_str(&format!(
            "Malformed (never deleted): {}\n",
            list_some(&items)
        ));
    }
    if !out.ignored.is_empty() {
        let items: Vec<String> = out
            .ignored
            .iter()
            .map(|m| format!("{} ({})", m.key, m.problem))
            .collect();
        s.push_str(&format!(
            "Ignored (outside the layout, left alone): {}\n",
            list_some(&items)
        ));
    }
    if !out.leftovers.delete.is_empty() || out.leftovers.keep > 0 {
        s.push_str(&format!(
            "Leftovers of interrupted work (abandoned uploads, staging files, unreferenced index shards): delete {} ({}); keep {} (too young, or of a running attempt)\n",
            out.leftovers.delete.len(),
            human_bytes(out.leftovers.delete_bytes),
            out.leftovers.keep
        ));
    }
    match &out.executed {
        None => s.push_str(
            "\nDry run: nothing was deleted. `tidemark gc` with the same arguments carries out this plan.\n",
        ),
        Some(r) if r.audit_key.is_none() => s.push_str("\nNothing to do.\n"),
        Some(r) => {
            for c in &r.consolidated {
                s.push_str(&format!(
                    "\nConsolidated {} into the synthetic full {} ({}; replaces {})",
                    c.consolidated_from.join(" + "),
                    c.synthetic,
                    human_bytes(c.size),
                    c.target
                ));
            }
            s.push_str(&format!(
                "\nDeleted {} backup(s) and {} segment(s) ({} objects); removed {} index entries.\nAudit record: {}\n",
                r.backups_deleted.len(),
                r.segments_deleted,
                r.objects_deleted,
                r.index_entries_removed,
                r.audit_key.as_deref().unwrap_or("-"),
            ));
            for f in &r.failures {
                s.push_str(&format!("Could not delete {}: {}\n", f.key, f.error));
            }
        }
    }
    if let Some(c) = &out.change {
        s.push_str(&change_table(c));
    }
    s
}

/// `plan --against` / `--with`: the policy change, for people.
fn change_table(c: &tidemark_core::preview::PolicyChange) -> String {
    let mut s = String::from("\nPolicy change (the plan above is the new policy's):\n");
    let reasons = |r: &[tidemark_core::Reason]| {
        r.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if c.newly_deleted.is_empty() {
        s.push_str("  deletes nothing the current policy keeps\n");
    } else {
        s.push_str(&format!(
            "  deletes {} backup(s) the current policy keeps:\n",
            c.newly_deleted.len()
        ));
        for b in &c.newly_deleted {
            s.push_str(&format!(
                "    {}/{}  kept now for: {}\n",
                b.backup_name,
                b.backup_id,
                reasons(&b.current)
            ));
        }
    }
    if !c.newly_kept.is_empty() {
        s.push_str(&format!(
            "  keeps {} backup(s) the current policy deletes: {}\n",
            c.newly_kept.len(),
            c.newly_kept
                .iter()
                .map(|b| b.backup_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    s.push_str(&format!(
        "  recovery window now:   {}\n  recovery window after: {}\n",
        window_line(&c.recovery_window.before),
        window_line(&c.recovery_window.after)
    ));
    s.push_str(&format!(
        "  binlog segments deleted: {} now, {} after\n",
        c.segments_deleted.before, c.segments_deleted.after
    ));
    if c.lost.is_empty() {
        s.push_str("  no instant restorable now stops being restorable\n");
    } else {
        let spans: Vec<String> = c
            .lost
            .iter()
            .map(|i| format!("{} → {}", i.from, i.to))
            .collect();
        s.push_str(&format!(
            "  instants that stop being restorable to the point: {}\n",
            spans.join(", ")
        ));
    }
    s
}

/// The first few items and a count of the rest.
fn list_some(items: &[String]) -> String {
    const SHOWN: usize = 10;
    let mut s = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if items.len() > SHOWN {
        s.push_str(&format!(" … and {} more", items.len() - SHOWN));
    }
    format!("{} — {s}", items.len())
}

async fn ls(args: &LsArgs) -> Result<Exit, CliError> {
    // The policy's point-in-time window, when a policy is named: holes before it are
    // intended, not gaps.
    let (target, document) = match &args.cluster_policy {
        Some(name) => {
            crate::restore::refuse_beside_policy(
                name,
                &crate::restore::store_flags_beside_policy(),
            )?;
            let p = crate::cluster::policy(
                &args.kube,
                name,
                args.store.from_copy.as_deref(),
                args.store.endpoint.as_deref(),
            )
            .await?;
            (
                resolve::Target {
                    store: p.store,
                    object_lock: None,
                },
                Some(p.document),
            )
        }
        None => (
            resolve::store_target(&args.store, args.policy.as_deref())?,
            args.policy
                .as_deref()
                .map(resolve::read_policy_file)
                .transpose()?,
        ),
    };
    let pitr_start = document
        .as_ref()
        .and_then(|d| d.spec.retention.as_ref())
        .and_then(|r| r.to_input(None).validate().ok())
        .and_then(|p| tidemark_core::point_in_time_start(&p, jiff::Timestamp::now()));
    let json = args.output.structured();
    let bar = TerminalProgress::for_humans(json);
    let progress: &dyn Progress = match &bar {
        Some(b) => b,
        None => &NoProgress,
    };
    let catalog = Catalog::load(&target.store, progress).await;
    if let Some(b) = &bar {
        b.finish();
    }
    // An index that cannot be read (malformed, newer, a shard missing) still leaves the
    // backups to list: shown, with the binlog archive and the recovery window left out.
    let (catalog, index_problem) = match catalog {
        Ok(c) => (c, None),
        Err(e) if e.category() == tidemark_store::ErrorCategory::Data => {
            match Catalog::load_backups(&target.store, &NoProgress).await {
                Ok(c) => (c, Some(e)),
                Err(again) => {
                    eprintln!("error: {e}");
                    return Err(again.into());
                }
            }
        }
        Err(e) => return Err(e.into()),
    };
    let inventory = catalog.inventory(&SegmentListing::default());
    let standing = tidemark_core::standing_at(&inventory, pitr_start);
    let ok: &HashSet<String> = &standing.restorable;
    let replay = tidemark_core::Replay::with_timelines(&inventory.segments, &inventory.timelines);
    let mut backups: Vec<BackupOut> = catalog
        .backups
        .iter()
        .map(|b| {
            // A backup has one payload as Tidemark writes it; the first speaks for it.
            let first = b.metadata.as_ref().and_then(|m| m.payload.first());
            BackupOut {
                restorable: Some(ok.contains(&b.backup.id)),
                problem: b.problem.clone(),
                compression: first.and_then(|p| p.compression.clone()),
                encryption: first.and_then(|p| p.encryption.clone()),
                log_position: b.metadata.as_ref().and_then(|m| m.log_position.clone()),
                server: b.metadata.as_ref().and_then(|m| m.server.clone()),
                on_branch: replay.on_branch(&b.backup),
                ..BackupOut::from_backup(&b.backup)
            }
        })
        .collect();
    backups.sort_by(|a, b| (a.started_at, &a.backup_id).cmp(&(b.started_at, &b.backup_id)));

    // Unread index shards count by their summaries (the catalog read those that have holes).
    let runs = catalog
        .index
        .as_ref()
        .map(tidemark_store::index::SegmentIndex::runs)
        .unwrap_or_default();
    // Holes before every backup's replay start are harmless.
    let earliest_start = standing.earliest_replay_start;
    let missing = runs
        .windows(2)
        .filter(|w| {
            use tidemark_core::timeline::timeline_of;
            w[1].first_sequence > w[0].last_sequence + 1
                && timeline_of(w[0].last_sequence) == timeline_of(w[1].first_sequence)
        })
        .map(|w| MissingRange {
            from: w[0].last_sequence + 1,
            to: w[1].first_sequence - 1,
            affects_recovery: earliest_start.is_some_and(|s| w[1].first_sequence > s),
        })
        .collect();
    let out = LsOut {
        format_version: JSON_FORMAT_VERSION,
        store: target.store.url.clone(),
        cluster: target.store.cluster.clone(),
        backups,
        recovery_window: match index_problem {
            Some(_) => None,
            None => standing.window.clone(),
        },
        archive: ArchiveOut {
            segments: runs.iter().map(|r| r.count as usize).sum(),
            first: runs.first().map(|r| r.first_name.clone()),
            last: runs.last().map(|r| r.last_name.clone()),
            bytes: runs.iter().map(|r| r.size).sum(),
            missing,
            unknown_last_event: runs.iter().map(|r| r.unknown_last_event as usize).sum(),
            timelines: match index_problem {
                Some(_) => Vec::new(),
                None => crate::output::timelines_out(&inventory),
            },
            archiver: match tidemark_store::state::load_archiver_status(&target.store).await {
                Ok(s) => s.map(|s| crate::output::ArchiverOut::of(&s, jiff::Timestamp::now())),
                Err(e) => {
                    eprintln!("warning: {e}");
                    None
                }
            },
        },
        foreign: catalog.foreign.clone(),
        malformed: catalog.malformed.clone(),
        ignored: catalog.ignored.clone(),
        copies: match tidemark_store::state::load_copies(&target.store).await {
            Ok(records) => {
                let newest = standing.window.as_ref().map(|w| w.to);
                let now = jiff::Timestamp::now();
                records
                    .iter()
                    .map(|r| crate::output::CopyOut::of(r, newest, now))
                    .collect()
            }
            Err(e) => {
                eprintln!("warning: the store's copy records: {e}");
                Vec::new()
            }
        },
    };
    for w in &catalog.warnings {
        eprintln!("warning: {w}");
    }
    if json {
        emit_as(args.output, &out)?;
    } else {
        emit(&ls_table(&out, args.output == OutputFormat::Wide))?;
    }
    if let Some(e) = &index_problem {
        eprintln!(
            "error: {e}; the backups above are listed without the binlog archive or a recovery window"
        );
    }
    if !out.malformed.is_empty() {
        eprintln!(
            "error: {} malformed metadata.json file(s); see the list above",
            out.malformed.len()
        );
    }
    if index_problem.is_some() || !out.malformed.is_empty() {
        return Ok(Exit::Data);
    }
    Ok(Exit::Success)
}

/// The columns `-o wide` adds to a backup's row.
const WIDE_COLUMNS: [&str; 6] = [
    "STARTED",
    "BYTES",
    "COMPRESSION",
    "ENCRYPTION",
    "LOCKED-UNTIL",
    "LOG-POSITION",
];

fn with_wide<'a>(header: &[&'a str], wide: bool) -> Vec<&'a str> {
    let mut h = header.to_vec();
    if wide {
        h.extend(WIDE_COLUMNS);
    }
    h
}

/// [`WIDE_COLUMNS`] of `b`.
fn wide_columns(b: &crate::output::BackupOut) -> Vec<String> {
    let dash = || "-".to_owned();
    vec![
        b.started_at.to_string(),
        b.size.to_string(),
        b.compression.clone().unwrap_or_else(dash),
        b.encryption.as_ref().map_or_else(dash, |e| {
            format!("{} ({} recipient(s))", e.scheme, e.recipients.len())
        }),
        b.immutable_until.map_or_else(dash, |t| t.to_string()),
        b.log_position
            .as_ref()
            .map_or_else(dash, |p| match &p.gtid {
                Some(g) => format!("{}:{} gtid {g}", p.file, p.position),
                None => format!("{}:{}", p.file, p.position),
            }),
    ]
}

fn ls_table(out: &LsOut, wide: bool) -> String {
    let mut s = format!("Cluster {:?} in {}\n\n", out.cluster, out.store);
    let rows: Vec<Vec<String>> = out
        .backups
        .iter()
        .map(|b| {
            vec![
                b.backup_id.clone(),
                b.backup_name.clone(),
                b.kind.to_owned(),
                b.phase.to_owned(),
                b.completed_at
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                human_bytes(b.size),
                match (b.restorable, &b.problem) {
                    (Some(true), _) => "yes".to_owned(),
                    (_, Some(p)) => format!("no ({p})"),
                    _ => "no".to_owned(),
                },
                b.parent_id.clone().unwrap_or_default(),
            ]
            .into_iter()
            .chain(wide.then(|| wide_columns(b)).into_iter().flatten())
            .collect()
        })
        .collect();
    if rows.is_empty() {
        s.push_str("No backups.\n");
    } else {
        let header = [
            "BACKUP-ID",
            "NAME",
            "TYPE",
            "PHASE",
            "COMPLETED",
            "SIZE",
            "RESTORABLE",
            "PARENT",
        ];
        s.push_str(&table(&with_wide(&header, wide), &rows));
    }
    s.push('\n');
    s.push_str(&format!(
        "Point-in-time window: {}\n",
        window_line(&out.recovery_window)
    ));
    let a = &out.archive;
    match (&a.first, &a.last) {
        (Some(first), Some(last)) => {
            s.push_str(&format!(
                "Log archive: {} segments ({}), {first} … {last}",
                a.segments,
                human_bytes(a.bytes)
            ));
            let span = |m: &MissingRange| {
                if m.from == m.to {
                    m.from.to_string()
                } else {
                    format!("{}–{}", m.from, m.to)
                }
            };
            let (bad, harmless): (Vec<&MissingRange>, Vec<&MissingRange>) =
                a.missing.iter().partition(|m| m.affects_recovery);
            if bad.is_empty() {
                s.push_str(", no missing sequence numbers that recovery needs");
            } else {
                let gaps: Vec<String> = bad.iter().map(|m| span(m)).collect();
                s.push_str(&format!(", MISSING sequence numbers: {}", gaps.join(", ")));
            }
            if !harmless.is_empty() {
                let gaps: Vec<String> = harmless.iter().map(|m| span(m)).collect();
                s.push_str(&format!(
                    " (absent before every backup's replay start, harmless: {})",
                    gaps.join(", ")
                ));
            }
            if a.unknown_last_event > 0 {
                s.push_str(&format!(
                    ", {} with unknown last event time",
                    a.unknown_last_event
                ));
            }
            s.push('\n');
        }
        _ => s.push_str("Log archive: empty\n"),
    }
    s.push_str(&crate::output::timeline_lines(&a.timelines));
    if let Some(r) = &a.archiver {
        let server = r
            .server_id
            .map_or_else(|| "an unknown server".to_owned(), |i| format!("server {i}"));
        let state = if r.silent {
            format!(
                "SILENT since {} (no pass since): the archive is {} s behind",
                r.observed_at, r.lag_seconds
            )
        } else if r.lag_seconds > 0 {
            format!(
                "last pass {}, {} s behind the server",
                r.observed_at, r.lag_seconds
            )
        } else {
            format!("last pass {}, caught up", r.observed_at)
        };
        s.push_str(&format!(
            "Archiver: {server} (timeline {}), {state}\n",
            r.timeline
        ));
    }
    for c in &out.copies {
        let through = c
            .copied_through
            .map_or_else(|| "nothing yet".to_owned(), |t| t.to_string());
        let failures = if c.failures > 0 {
            format!(", {} object(s) not sent", c.failures)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "Copy {}: {} — last pass {}, restorable through {through}, {} s behind{failures}\n",
            c.name,
            crate::output::printable(&c.destination),
            c.last_pass_at,
            c.lag_seconds
        ));
    }
    let branch: Vec<&str> = out
        .backups
        .iter()
        .filter(|b| b.on_branch)
        .map(|b| b.backup_id.as_str())
        .collect();
    if !branch.is_empty() {
        s.push_str(&format!(
            "On a branch (transactions a failover lost; never restored onto the main line): {}\n",
            branch.join(", ")
        ));
    }
    if !out.foreign.is_empty() {
        s.push_str(&format!(
            "Foreign objects (never deleted): {}\n",
            list_some(&out.foreign)
        ));
    }
    for m in &out.malformed {
        s.push_str(&format!("Malformed: {}: {}\n", m.key, m.problem));
    }
    for m in &out.ignored {
        s.push_str(&format!("Ignored: {}: {}\n", m.key, m.problem));
    }
    s
}

/// `completions SHELL`: the completion script clap derives from the command definitions.
fn completions(args: &crate::args::CompletionsArgs) -> Result<Exit, CliError> {
    let mut command = crate::args::command();
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "tidemark", &mut out);
    emit(&String::from_utf8_lossy(&out))?;
    Ok(Exit::Success)
}

/// `man [--dir DIR]`: the man pages clap derives from the command definitions.
fn man(args: &crate::args::ManArgs) -> Result<Exit, CliError> {
    let command = crate::args::command().name("tidemark");
    match &args.dir {
        Some(dir) => {
            if !dir.is_dir() {
                return Err(CliError::input(format!(
                    "--dir {}: not a directory; create it first",
                    dir.display()
                )));
            }
            clap_mangen::generate_to(command, dir).map_err(|e| {
                CliError::new(
                    Exit::Internal,
                    anyhow::anyhow!("--dir {}: {e}", dir.display()),
                )
            })?;
            Ok(Exit::Success)
        }
        None => {
            let mut out = Vec::new();
            clap_mangen::Man::new(command)
                .render(&mut out)
                .map_err(|e| CliError::new(Exit::Internal, e))?;
            emit(&String::from_utf8_lossy(&out))?;
            Ok(Exit::Success)
        }
    }
}
