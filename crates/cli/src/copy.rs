//! `tidemark copy` (issue 44): one pass of the engine's copy use case
//! ([`tidemark_engine::copy`]) from a store to a second one, and optionally the copy's own
//! retention pass, under the copy's lease.

use std::sync::Arc;

use serde::Serialize;
use tidemark_engine::copy::{CopyOutcome, CopyRequest};
use tidemark_store::ExecutionReport;

use crate::args::{CopyArgs, StoreArgs};
use crate::exit::{CliError, Exit};
use crate::output::{JSON_FORMAT_VERSION, emit, emit_as};
use crate::progress::TerminalProgress;
use crate::resolve;

/// What `copy --output json` prints.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyOut {
    pub format_version: u32,
    /// The source store and cluster.
    pub from: String,
    /// The copy's store and cluster.
    pub to: String,
    #[serde(flatten)]
    pub copied: CopyOutcome,
    /// The copy's own retention pass (`--gc`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<ExecutionReport>,
}

pub async fn copy(args: &CopyArgs) -> Result<Exit, CliError> {
    let file = args
        .policy
        .as_deref()
        .map(resolve::read_policy_file)
        .transpose()?;
    let mut source_args = StoreArgs {
        store: args.from.clone().or_else(|| args.store.store.clone()),
        ..StoreArgs::default()
    };
    copy_flags(&args.store, &mut source_args);
    let source = resolve::target(&source_args, file.as_ref(), args.policy.as_deref())?.store;
    let (name, copy_args, copy_policy) = match (&args.copy, &args.to, &file) {
        (Some(name), _, Some(p)) => {
            let args = StoreArgs {
                from_copy: Some(name.clone()),
                cluster: Some(source.cluster.clone()),
                ..StoreArgs::default()
            };
            let seen = p.as_copy(name).ok_or_else(|| {
                CliError::input(format!(
                    "--copy {name}: the policy names no such copy in spec.copies"
                ))
            })?;
            (name.clone(), args, Some(seen))
        }
        (None, Some(to), _) => {
            let store_args = StoreArgs {
                store: Some(to.clone()),
                cluster: Some(source.cluster.clone()),
                endpoint: args.to_endpoint.clone(),
                ..StoreArgs::default()
            };
            (args.name.clone(), store_args, None)
        }
        _ => {
            return Err(CliError::input(
                "no copy given: pass --policy FILE --copy NAME (a copy the policy names in spec.copies), or --to URL",
            ));
        }
    };
    tidemark_api::names::dns_label("the copy's name", &name)
        .map_err(|e| CliError::input(e.to_string()))?;
    if args.forget {
        tidemark_store::state::forget_copy(&source, &name).await?;
        eprintln!(
            "forgot copy {name}: {}/{} keeps nothing for it any more",
            source.url, source.cluster
        );
        return Ok(Exit::Success);
    }
    let copy = resolve::target(&copy_args, file.as_ref(), args.policy.as_deref())?.store;
    let policy = match (&copy_policy, &args.window) {
        (Some(p), _) => {
            let as_args = crate::args::PolicyArgs::default();
            match p.spec.retention.as_ref() {
                Some(_) => resolve::policy(&as_args, Some(p))?.policy,
                None => tidemark_engine::copy::keep_everything(),
            }
        }
        (None, Some(w)) => tidemark_core::PolicyInput {
            window: Some(w.clone()),
            ..Default::default()
        }
        .validate()
        .map_err(|e| CliError::input(format!("--window: {e}")))?,
        (None, None) => tidemark_engine::copy::keep_everything(),
    };
    // `--bandwidth`, else the copy's own: the copy's store carries it.
    let bandwidth = match args.store.bandwidth.as_deref() {
        Some(b) => Some(Arc::new(tidemark_store::bandwidth::Bandwidth::new(
            &b.parse::<tidemark_core::rate::Rate>()
                .map_err(|e| CliError::input(format!("--bandwidth: {e}")))?,
        ))),
        None => copy.bandwidth().cloned(),
    };
    let json = args.output.structured();
    let bar = TerminalProgress::for_bytes(json, "copying");
    let progress: &dyn tidemark_store::Progress = match &bar {
        Some(b) => b,
        None => &tidemark_store::NoProgress,
    };
    let request = CopyRequest {
        name: name.clone(),
        policy: policy.clone(),
        now: jiff::Timestamp::now(),
        bandwidth,
        dry_run: args.dry_run,
    };
    let fence = if args.dry_run {
        None
    } else {
        Some(resolve::fence(&copy, "tidemark copy", &args.fence).await?)
    };
    let copied =
        tidemark_engine::copy::copy_pass(&source, &copy, &request, fence.as_ref(), progress).await;
    let copied = match copied {
        Ok(c) => c,
        Err(e) => {
            if let Some(f) = fence {
                f.release().await;
            }
            return Err(e.into());
        }
    };
    let retention = match (&fence, args.gc) {
        (Some(f), true) => {
            let now = jiff::Timestamp::now();
            let pass = tidemark_engine::copy::retention_request(
                &policy,
                serde_json::to_value(&policy).unwrap_or_default(),
                now,
                // The policy file's acknowledgement, for the copy's deletion guard.
                file.as_ref()
                    .map(|f| {
                        tidemark_api::policy::deletions_allowed_before(&f.metadata.annotations)
                    })
                    .transpose()
                    .map_err(CliError::input)?
                    .flatten(),
            );
            let outcome =
                tidemark_engine::retention_pass(&copy, &pass, Some(f), None, progress).await;
            match outcome {
                Ok(o) => o.executed,
                Err(e) => {
                    if let Some(f) = fence {
                        f.release().await;
                    }
                    return Err(e.into());
                }
            }
        }
        _ => None,
    };
    if let Some(f) = fence {
        f.release().await;
    }
    if let Some(b) = &bar {
        b.finish();
    }
    let failures = copied.failures.len() + retention.as_ref().map_or(0, |r| r.failures.len());
    let out = CopyOut {
        format_version: JSON_FORMAT_VERSION,
        from: format!("{}/{}", source.url, source.cluster),
        to: format!("{}/{}", copy.url, copy.cluster),
        copied,
        retention,
    };
    if json {
        emit_as(args.output, &out)?;
    } else {
        emit(&table(&out))?;
    }
    Ok(if failures == 0 {
        Exit::Success
    } else {
        Exit::Store
    })
}

/// The source's reading flags (keys, CA, endpoint, cluster) given on the command line.
fn copy_flags(from: &StoreArgs, to: &mut StoreArgs) {
    to.cluster.clone_from(&from.cluster);
    to.endpoint.clone_from(&from.endpoint);
    to.ca_bundle.clone_from(&from.ca_bundle);
    to.identities.clone_from(&from.identities);
    to.allow_plaintext_before
        .clone_from(&from.allow_plaintext_before);
}

fn table(out: &CopyOut) -> String {
    use std::fmt::Write;
    let c = &out.copied;
    let mut s = String::new();
    let _ = writeln!(s, "copy {}: {} -> {}", c.name, out.from, out.to);
    if let Some(w) = &c.would_send {
        let _ = writeln!(
            s,
            "would send {} backup(s) and {} segment(s):",
            w.backups.len(),
            w.segments.len()
        );
        for b in &w.backups {
            let _ = writeln!(s, "  backup  {b}");
        }
        for seg in &w.segments {
            let _ = writeln!(s, "  segment {seg}");
        }
    } else {
        let _ = writeln!(
            s,
            "sent {} backup(s), {} segment(s), {} byte(s)",
            c.backups_sent.len(),
            c.segments_sent,
            c.bytes
        );
        for b in &c.backups_sent {
            let _ = writeln!(s, "  backup  {b}");
        }
    }
    if !c.backups_declined.is_empty() || c.segments_declined > 0 {
        let _ = writeln!(
            s,
            "not sent (the copy's retention would not keep them): {} backup(s), {} segment(s)",
            c.backups_declined.len(),
            c.segments_declined
        );
        for d in &c.declined {
            let _ = writeln!(s, "  backup  {} ({})", d.backup_id, d.reasons.join(", "));
        }
    }
    let newest = |t: Option<jiff::Timestamp>| t.map_or_else(|| "-".to_owned(), |t| t.to_string());
    let _ = writeln!(
        s,
        "newest restorable: source {}, copy {}",
        newest(c.source_newest_at),
        newest(c.copy_newest_at)
    );
    if let Some(r) = &out.retention {
        let _ = writeln!(
            s,
            "copy's retention: {} backup(s) and {} segment(s) deleted",
            r.backups_deleted.len(),
            r.segments_deleted
        );
    }
    for f in &c.failures {
        let _ = writeln!(s, "failed: {f}");
    }
    s
}
