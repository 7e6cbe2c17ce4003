//! `tidemark verify` (issue 19 §4): the engine's verify use case ([`tidemark_engine::verify`])
//! and its report, as a table or as `--output json`.

use serde::Serialize;
use tidemark_engine::verify::{Verification, VerifyRequest};
use tidemark_store::ClusterStore;
use tidemark_store::transfer::Checked;

use crate::args::VerifyArgs;
use crate::exit::{CliError, Exit};
use crate::output::JSON_FORMAT_VERSION;
use crate::output::{emit, emit_as};
use crate::resolve;

/// What `verify --output json` prints.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyOut {
    pub format_version: u32,
    pub store: String,
    pub cluster: String,
    pub sample: f64,
    #[serde(flatten)]
    pub found: Verification,
}

pub async fn verify(args: &VerifyArgs) -> Result<Exit, CliError> {
    let target = resolve::store_target(&args.store, args.policy.as_deref())?;
    let store = &target.store;
    let sample = args.sample.unwrap_or(1.0);
    let Some(found) = tidemark_engine::verify::verify(store, &VerifyRequest { sample }).await?
    else {
        return Err(CliError::new(
            Exit::Data,
            anyhow::anyhow!(
                "no committed backup in {} (cluster {:?}): nothing to verify — check --store and --cluster",
                store.url,
                store.cluster
            ),
        ));
    };
    let (problems, damage) = (found.problems, found.damage);
    let out = VerifyOut {
        format_version: JSON_FORMAT_VERSION,
        store: store.url.clone(),
        cluster: store.cluster.clone(),
        sample,
        found,
    };
    if args.output.structured() {
        emit_as(args.output, &out)?;
    } else {
        emit(&table(store, &out))?;
    }
    Ok(if problems == 0 {
        Exit::Success
    } else if damage {
        Exit::Data
    } else {
        Exit::Store
    })
}

fn table(store: &ClusterStore, out: &VerifyOut) -> String {
    let mut s = format!(
        "Verified cluster {:?} in {}{}\n\n",
        store.cluster,
        store.url,
        if out.sample < 1.0 {
            format!(" (a sample of {:.0}%)", out.sample * 100.0)
        } else {
            String::new()
        }
    );
    for b in &out.found.backups {
        let depth = if b.payload.iter().any(|p| p.checked == Some(Checked::Stored)) {
            " (stored bytes only: encrypted, no identity here)"
        } else {
            ""
        };
        s.push_str(&format!(
            "{:<12} {}  {}  {}{depth}\n",
            b.status, b.backup_id, b.backup_name, b.kind
        ));
        for p in b.payload.iter().filter(|p| p.status != "ok") {
            s.push_str(&format!(
                "             {}: {}\n",
                p.key,
                p.problem.as_deref().unwrap_or(p.status)
            ));
        }
    }
    s.push_str(&format!(
        "\nSegments: {} indexed, {} checked, {} ok\n",
        out.found.segments.indexed, out.found.segments.checked, out.found.segments.ok
    ));
    if out.found.segments.unindexed > 0 {
        let more = out.found.segments.unindexed - out.found.segments.unindexed_names.len();
        s.push_str(&format!(
            "{:<12} {} segment(s) stored but not in the index, which no restore replays: {}{}\n",
            "unindexed",
            out.found.segments.unindexed,
            out.found.segments.unindexed_names.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        ));
    }
    for m in &out.found.malformed {
        s.push_str(&format!("{:<12} {}: {}\n", "malformed", m.key, m.problem));
    }
    for p in &out.found.segments.problems {
        s.push_str(&format!(
            "{:<12} {}: {}\n",
            p.status,
            p.key,
            p.problem.as_deref().unwrap_or("")
        ));
    }
    s.push_str(&format!(
        "Recovery window: {}\n",
        crate::output::window_line(&out.found.recovery_window)
    ));
    s.push_str(&if out.found.problems == 0 {
        "Everything checked out.\n".to_owned()
    } else {
        format!("{} problem(s) found.\n", out.found.problems)
    });
    s
}
