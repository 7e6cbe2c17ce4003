//! `tidemark simulate`: what a schedule and a policy keep, day by day.

use std::fmt::Write as _;

use tidemark_core::schedule::Cron;
use tidemark_core::simulate::{Incremental, SimDay, Simulation, simulate};

use crate::args::SimulateArgs;
use crate::exit::{CliError, Exit};
use crate::output::{JSON_FORMAT_VERSION, SimulateOut, human_bytes, table};
use crate::resolve;

/// Parses a size: a number (decimals allowed) and B, KB/MB/GB/TB (powers of 1000) or
/// KiB/MiB/GiB/TiB (powers of 1024).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

pub fn run(args: &SimulateArgs) -> Result<Exit, CliError> {
    let cron: Cron = args
        .schedule
        .parse()
        .map_err(|e| CliError::input(format!("--schedule: {e}")))?;
    let file = args
        .policy
        .policy
        .as_deref()
        .map(resolve::read_policy_file)
        .transpose()?;
    let policy = resolve::policy(&args.policy, file.as_ref())?;
    let backup_size = parse_size(&args.backup_size).ok_or_else(|| {
        CliError::input(format!(
            "invalid --backup-size {:?}: expected a number and a unit, e.g. 20GiB, 500MiB or 1.5TB",
            args.backup_size
        ))
    })?;
    let backup_duration: jiff::SignedDuration = args.backup_duration.parse().map_err(|_| {
        CliError::input(format!(
            "invalid --backup-duration {:?}: expected a duration such as 5m, 90s or 1h",
            args.backup_duration
        ))
    })?;
    if args.days == 0 || args.days > 3660 {
        return Err(CliError::input(format!(
            "invalid --days {}: expected 1 to 3660",
            args.days
        )));
    }
    let start = resolve::now(args.now.as_deref())?;
    let incremental = if args.incremental {
        let size = match &args.increment_size {
            Some(text) => parse_size(text).ok_or_else(|| {
                CliError::input(format!(
                    "invalid --increment-size {text:?}: expected a number and a unit, e.g. 2GiB, 500MiB or 1.5TB"
                ))
            })?,
            None => backup_size / 10,
        };
        if args.max_increments_per_full == Some(0) {
            return Err(CliError::input(
                "invalid --max-increments-per-full 0: expected at least 1 (leave it out for forever incremental)",
            ));
        }
        Some(Incremental {
            size,
            max_per_full: args.max_increments_per_full,
        })
    } else {
        None
    };
    let sim = Simulation {
        cron,
        policy: policy.policy.clone(),
        start,
        days: args.days,
        backup_size,
        backup_duration,
        incremental,
    };
    let days = simulate(&sim).map_err(CliError::input)?;
    // --against: the current policy's simulation, beside.
    let against = match &args.against {
        Some(path) => {
            let current = resolve::policy_file(path)?;
            let days = simulate(&Simulation {
                policy: current.policy.clone(),
                ..sim.clone()
            })
            .map_err(CliError::input)?;
            Some((current.as_given, days))
        }
        None => None,
    };
    let compared = against
        .as_ref()
        .map(|(_, now)| crate::output::SimCompared::of(now, &days));
    if let Some(path) = &args.svg {
        std::fs::write(path, svg(&days, &args.schedule, backup_size)).map_err(|e| {
            CliError::new(
                Exit::Input,
                anyhow::anyhow!("cannot write {}: {e}", path.display()),
            )
        })?;
    }
    if args.output.structured() {
        crate::output::emit_as(
            args.output,
            &SimulateOut {
                format_version: JSON_FORMAT_VERSION,
                schedule: &args.schedule,
                policy: policy.as_given,
                backup_size,
                days: &days,
                against: against.as_ref().zip(compared).map(|((p, d), comparison)| {
                    crate::output::SimulateAgainst {
                        policy: p.clone(),
                        days: d,
                        comparison,
                    }
                }),
            },
        )?;
    } else {
        match &compared {
            Some(c) => crate::output::emit(&render_compared(c))?,
            None => crate::output::emit(&render(&days, incremental.is_some()))?,
        }
    }
    Ok(Exit::Success)
}

/// `simulate --against`: each day under the current policy and the new one.
fn render_compared(days: &[crate::output::SimCompared]) -> String {
    let days_of = |s: i64| format!("{:.1}d", s as f64 / 86_400.0);
    let rows: Vec<Vec<String>> = days
        .iter()
        .map(|d| {
            vec![
                d.day.to_string(),
                d.date.to_string(),
                format!("{} → {}", d.kept_now, d.kept_new),
                format!(
                    "{} → {}",
                    days_of(d.window_seconds_now),
                    days_of(d.window_seconds_new)
                ),
                format!(
                    "{} → {}",
                    human_bytes(d.stored_bytes_now),
                    human_bytes(d.stored_bytes_new)
                ),
                d.newly_deleted.to_string(),
                d.lost
                    .iter()
                    .map(|i| format!("{} → {}", i.from, i.to))
                    .collect::<Vec<_>>()
                    .join(", "),
            ]
        })
        .collect();
    let mut s = table(
        &[
            "DAY",
            "DATE",
            "KEPT (now → new)",
            "WINDOW",
            "STORED",
            "NEWLY DELETED",
            "LOST",
        ],
        &rows,
    );
    if let Some(last) = days.last() {
        let _ = writeln!(
            s,
            "\nAfter {} days: {} → {} recovery points, window {} → {}, {} → {} stored.",
            last.day,
            last.kept_now,
            last.kept_new,
            days_of(last.window_seconds_now),
            days_of(last.window_seconds_new),
            human_bytes(last.stored_bytes_now),
            human_bytes(last.stored_bytes_new)
        );
        let lost: Vec<String> = last
            .lost
            .iter()
            .map(|i| format!("{} → {}", i.from, i.to))
            .collect();
        let _ = writeln!(
            s,
            "The new policy deletes {} restore point(s) the current one keeps{}.",
            last.newly_deleted,
            if lost.is_empty() {
                ", and no instant stops restoring".to_owned()
            } else {
                format!("; these instants stop restoring: {}", lost.join(", "))
            }
        );
    }
    s
}

fn render(days: &[SimDay], incremental: bool) -> String {
    let rows: Vec<Vec<String>> = days
        .iter()
        .map(|d| {
            let mut row = vec![
                d.day.to_string(),
                d.date.to_string(),
                d.taken.to_string(),
                d.deleted.to_string(),
                d.kept.len().to_string(),
            ];
            if incremental {
                row.push(d.kept_only_for_chains.to_string());
                row.push(d.consolidated.to_string());
            }
            row.extend([
                d.window_from.map_or_else(|| "-".into(), |t| t.to_string()),
                format!("{:.1}d", d.window_seconds as f64 / 86_400.0),
                human_bytes(d.stored_bytes),
            ]);
            row
        })
        .collect();
    let mut header = vec!["DAY", "DATE", "TAKEN", "DELETED", "KEPT"];
    if incremental {
        header.extend(["CHAIN-ONLY", "MERGED"]);
    }
    header.extend(["OLDEST RESTORE POINT", "WINDOW", "STORED"]);
    let mut s = table(&header, &rows);
    if let Some(last) = days.last() {
        let peak = days.iter().map(|d| d.stored_bytes).max().unwrap_or(0);
        let _ = writeln!(
            s,
            "\nAfter {} days: {} recovery points, window {:.1} days, {} stored (peak {}). Binlogs are assumed archived continuously and are not counted.",
            last.day,
            last.kept.len(),
            last.window_seconds as f64 / 86_400.0,
            human_bytes(last.stored_bytes),
            human_bytes(peak),
        );
        if last.kept_only_for_chains > 0 {
            let _ = writeln!(
                s,
                "Chains: {} backup(s) are kept only because an increment builds on them, and their number grows: a forever incremental frees nothing without retention.consolidate or a full every N (--max-increments-per-full); see docs/retention.md#forever-incrementals.",
                last.kept_only_for_chains
            );
        }
    }
    s
}

/// One row per backup (by restore point), one column per day; a mark while it is kept.
/// Below, the stored size per day as bars.
fn svg(days: &[SimDay], schedule: &str, backup_size: u64) -> String {
    // Every backup that was kept at the end of some day, in order.
    let mut points: Vec<jiff::Timestamp> =
        days.iter().flat_map(|d| d.kept.iter().copied()).collect();
    points.sort();
    points.dedup();
    let n_days = days.len().max(1);
    let cell_w = (900.0 / n_days as f64).clamp(2.0, 24.0);
    let cell_h = (420.0 / points.len().max(1) as f64).clamp(1.0, 14.0);
    let left = 170.0;
    let top = 40.0;
    let grid_w = cell_w * n_days as f64;
    let grid_h = cell_h * points.len() as f64;
    let bars_top = top + grid_h + 40.0;
    let bars_h = 120.0;
    let width = left + grid_w + 80.0;
    let height = bars_top + bars_h + 40.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="11">"##
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="#ffffff"/><text x="10" y="20" font-size="14">Schedule "{}", {} per backup: recovery points kept (rows) on each day (columns)</text>"##,
        escape(schedule),
        human_bytes(backup_size)
    );
    let row_of = |t: &jiff::Timestamp| points.binary_search(t).unwrap_or(0);
    // Row labels: first, last, and about 20 in between.
    let label_every = (points.len() / 20).max(1);
    for (i, p) in points.iter().enumerate() {
        if i % label_every == 0 || i + 1 == points.len() {
            let y = top + (i as f64 + 0.8) * cell_h;
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{y:.1}" text-anchor="end" fill="#444">{}</text>"##,
                left - 6.0,
                p.strftime("%Y-%m-%d %H:%M")
            );
        }
    }
    for (col, d) in days.iter().enumerate() {
        let x = left + col as f64 * cell_w;
        for p in &d.kept {
            let y = top + row_of(p) as f64 * cell_h;
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="#2b6cb0"/>"##,
                (cell_w - 0.5).max(1.0),
                (cell_h - 0.5).max(0.8)
            );
        }
    }
    let peak = days
        .iter()
        .map(|d| d.stored_bytes)
        .max()
        .unwrap_or(0)
        .max(1);
    let _ = writeln!(
        s,
        r##"<text x="10" y="{:.1}" font-size="13">Stored (peak {})</text>"##,
        bars_top - 10.0,
        human_bytes(peak)
    );
    // A date label takes about 75 px.
    let label_days = ((75.0 / cell_w).ceil() as usize).max(1);
    for (col, d) in days.iter().enumerate() {
        let x = left + col as f64 * cell_w;
        let h = bars_h * d.stored_bytes as f64 / peak as f64;
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{h:.1}" fill="#dd6b20"/>"##,
            bars_top + bars_h - h,
            (cell_w - 0.5).max(1.0)
        );
        if col % label_days == 0 {
            let _ = writeln!(
                s,
                r##"<text x="{x:.1}" y="{:.1}" fill="#444">{}</text>"##,
                bars_top + bars_h + 14.0,
                d.date
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_in_both_unit_families() {
        assert_eq!(parse_size("10GiB"), Some(10 << 30));
        assert_eq!(parse_size("1.5TB"), Some(1_500_000_000_000));
        assert_eq!(parse_size("500 MiB"), Some(500 << 20));
        assert_eq!(parse_size("42"), Some(42));
        assert_eq!(parse_size("ten GB"), None);
        assert_eq!(parse_size("5 parsecs"), None);
    }
}
