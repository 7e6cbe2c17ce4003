//! `tidemark simulate` with the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::bin;

use std::process::Output;

fn run(args: &[&str]) -> Output {
    bin().arg("simulate").args(args).output().unwrap()
}

#[test]
fn keep_last_over_ten_days_as_json_table_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("chart.svg");
    let common = [
        "--schedule",
        "0 0 2 * * *",
        "--keep-last",
        "3",
        "--days",
        "10",
        "--backup-size",
        "2GiB",
        "--now",
        "2026-11-01T00:00:00Z",
    ];
    let out = run(&[
        &common[..],
        &["--output", "json", "--svg", svg.to_str().unwrap()],
    ]
    .concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let days = v["days"].as_array().unwrap();
    assert_eq!(days.len(), 10);
    let kept: Vec<usize> = days
        .iter()
        .map(|d| d["kept"].as_array().unwrap().len())
        .collect();
    assert_eq!(kept, vec![1, 2, 3, 3, 3, 3, 3, 3, 3, 3]);
    assert_eq!(days[9]["storedBytes"], 3u64 * (2 << 30));
    assert_eq!(days[9]["windowFrom"], "2026-11-08T02:05:00Z");
    let chart = std::fs::read_to_string(&svg).unwrap();
    assert!(chart.starts_with("<svg"), "{chart}");
    // One mark per kept backup per day.
    assert_eq!(
        chart.matches("fill=\"#2b6cb0\"").count(),
        kept.iter().sum::<usize>()
    );

    let table = run(&common);
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("After 10 days: 3 recovery points"), "{text}");
}

#[test]
fn bad_input_names_the_flag_and_the_form() {
    let out = run(&["--schedule", "0 0 2 * * * 2030", "--keep-last", "3"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--schedule") && err.contains("\"0 0 2 * * *\""),
        "{err}"
    );
    // Seed 001: five fields are refused with their six-field form (read as six, "0 2 * * *"
    // would fire at 00:00 on the 2nd of each month).
    let out = run(&["--schedule", "0 2 * * *", "--keep-last", "3"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--schedule")
            && err.contains("\"0 2 * * *\" has five fields; schedules need six, seconds first: did you mean \"0 0 2 * * *\"?"),
        "{err}"
    );
    let out = run(&[
        "--schedule",
        "0 0 2 * * *",
        "--keep-last",
        "3",
        "--backup-size",
        "lots",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("20GiB"));
    let out = run(&["--schedule", "0 0 2 * * *"]);
    assert_eq!(out.status.code(), Some(2));
}

/// Seed 002's forever incremental in `simulate` (issue 43 §3): the growth is shown day by
/// day (`keptOnlyForChains`, a `Chains:` line naming the way out); with `--consolidate`
/// the chain is merged and the count stays bounded; a full every N frees whole chains.
/// Mutation tried: consolidations not simulated — the bounded run grew.
#[test]
fn forever_incrementals_show_their_growth() {
    let sim = |extra: &[&str]| {
        let mut args = vec![
            "--schedule",
            "0 0 2 * * *",
            "--keep-last",
            "3",
            "--days",
            "12",
            "--now",
            "2026-11-01T00:00:00Z",
            "--incremental",
        ];
        args.extend_from_slice(extra);
        run(&args)
    };
    let out = sim(&["-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let chain_only: Vec<u64> = v["days"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["keptOnlyForChains"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(chain_only, vec![0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let text = String::from_utf8_lossy(&sim(&[]).stdout).into_owned();
    assert!(
        text.contains("Chains: 9 backup(s) are kept only because an increment builds on them")
            && text.contains("forever-incrementals"),
        "{text}"
    );
    let out = sim(&["--consolidate", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for d in v["days"].as_array().unwrap() {
        assert!(d["kept"].as_array().unwrap().len() <= 4, "{d}");
        assert!(d.get("keptOnlyForChains").is_none(), "{d}");
    }
    let text = String::from_utf8_lossy(&sim(&["--consolidate"]).stdout).into_owned();
    assert!(!text.contains("Chains:"), "{text}");
    let out = sim(&["--max-increments-per-full", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--max-increments-per-full 0"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `simulate --against CURRENT.yaml` (issue 45 §2): the same days under the current and the
/// new policy, side by side — the comparison is each simulation's own figures.
#[test]
fn against_compares_two_policies_day_by_day() {
    let dir = tempfile::tempdir().unwrap();
    let current = dir.path().join("current.yaml");
    std::fs::write(
        &current,
        "apiVersion: tidemark.io/v1alpha1\nkind: BackupPolicy\nmetadata: {name: db}\nspec:\n  objectStore: {url: file://.}\n  retention: {keepLast: 10}\n",
    )
    .unwrap();
    let common = [
        "--schedule",
        "0 0 2 * * *",
        "--days",
        "14",
        "--now",
        "2026-11-01T00:00:00Z",
    ];
    let out = run(&[
        &common[..],
        &[
            "--keep-last",
            "3",
            "--against",
            current.to_str().unwrap(),
            "-o",
            "json",
        ],
    ]
    .concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let c = v["against"]["comparison"].as_array().unwrap();
    assert_eq!(c.len(), 14);
    let last = &c[13];
    assert_eq!(
        (last["keptNow"].as_u64(), last["keptNew"].as_u64()),
        (Some(10), Some(3)),
        "{last}"
    );
    assert_eq!(
        last["keptNew"],
        v["days"][13]["kept"].as_array().unwrap().len()
    );
    assert_eq!(
        last["keptNow"],
        v["against"]["days"][13]["kept"].as_array().unwrap().len()
    );
    assert!(last["windowSecondsNow"].as_i64() > last["windowSecondsNew"].as_i64());
    // What the new policy deletes that the current one keeps, and the instants lost.
    assert_eq!(last["newlyDeleted"], 7, "{last}");
    assert_eq!(last["newlyKept"], 0, "{last}");
    assert_eq!(
        last["lost"],
        serde_json::json!([{"from": v["against"]["days"][13]["windowFrom"], "to": v["days"][13]["windowFrom"]}]),
        "{last}"
    );
    assert_eq!(c[0]["newlyDeleted"], 0, "{}", c[0]);
    assert!(c[0].get("lost").is_none(), "{}", c[0]);
    let table = run(&[
        &common[..],
        &["--keep-last", "3", "--against", current.to_str().unwrap()],
    ]
    .concat());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("KEPT (now → new)")
            && text.contains("10 → 3 recovery points")
            && text.contains(
                "deletes 7 restore point(s) the current one keeps; these instants stop restoring"
            ),
        "{text}"
    );
}
