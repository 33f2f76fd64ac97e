//! `mia --shard i/n` + `merge` equals one unsharded run; parts that do not belong together are
//! refused.

use super::common::{dpaudit, stderr};

const ATTACK: &[&str] = &[
    "--checkpoint",
    "models/digits-mlp.toml",
    "--attack",
    "loss,pia,empirical",
    "--timesteps",
    "10,50",
    "--noise-draws",
    "2",
    "--bootstrap",
    "50",
    "--null-test",
    "--seed",
    "7",
];

/// The detailed record `mia.json` of a `mia`/`merge` run (`--out` into a scratch folder; a
/// `--format json` pair is dropped: stdout's JSON is the shared report).
fn json(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("o");
    let mut full: Vec<&str> = Vec::new();
    let mut k = 0;
    while k < args.len() {
        if args[k] == "--format" && args.get(k + 1) == Some(&"json") {
            k += 2;
            continue;
        }
        full.push(args[k]);
        k += 1;
    }
    full.extend_from_slice(&["--out", d.to_str().unwrap(), "-q"]);
    let o = dpaudit(&full);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    serde_json::from_str(&std::fs::read_to_string(d.join("mia.json")).unwrap()).unwrap()
}

fn shards(dir: &std::path::Path, n: usize, extra: &[&str]) -> Vec<String> {
    (0..n)
        .map(|i| {
            let spec = format!("{i}/{n}");
            let mut args = vec!["mia"];
            args.extend_from_slice(ATTACK);
            args.extend_from_slice(extra);
            args.extend_from_slice(&["--shard", &spec, "--out", dir.to_str().unwrap()]);
            let o = dpaudit(&args);
            assert_eq!(o.status.code(), Some(0), "shard {spec}: {}", stderr(&o));
            dir.join(format!("mia-part-{i}-of-{n}.json")).display().to_string()
        })
        .collect()
}

/// The metrics, audits and comparisons of four merged shards are those of one run, bit for bit.
#[test]
fn four_shards_merged_equal_one_unsharded_run() {
    let mut one = vec!["mia"];
    one.extend_from_slice(ATTACK);
    one.extend_from_slice(&["--format", "json"]);
    let full = json(&one);
    let dir = tempfile::tempdir().unwrap();
    let parts = shards(dir.path(), 4, &[]);
    // Each shard holds about a quarter of the records.
    let sizes: Vec<usize> = parts
        .iter()
        .map(|p| {
            let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
            v["records"].as_array().unwrap().len()
        })
        .collect();
    let total: usize = sizes.iter().sum();
    assert!(
        sizes.iter().all(|&s| s * 4 <= total + 4 * 6 && s * 4 + 4 * 6 >= total),
        "{sizes:?}"
    );
    let mut merge = vec!["merge"];
    merge.extend(parts.iter().map(String::as_str));
    merge.extend_from_slice(&["--format", "json"]);
    let merged = json(&merge);
    for key in [
        "results",
        "null_results",
        "one_run",
        "many_runs",
        "comparisons",
        "checkpoint_basis",
    ] {
        assert_eq!(
            merged[key], full[key],
            "{key} differs between merged shards and one run"
        );
    }
    assert_eq!(merged["results"].as_array().unwrap().len(), 6);
    // The merged record list is the unsharded one: the scores CSVs agree line for line.
    let a = dir.path().join("one.csv");
    let b = dir.path().join("merged.csv");
    let mut one_csv = one.clone();
    one_csv.extend_from_slice(&["--scores-out", a.to_str().unwrap()]);
    assert_eq!(dpaudit(&one_csv).status.code(), Some(0));
    let mut merge_csv = merge.clone();
    merge_csv.extend_from_slice(&["--scores-out", b.to_str().unwrap()]);
    assert_eq!(dpaudit(&merge_csv).status.code(), Some(0));
    assert_eq!(std::fs::read_to_string(a).unwrap(), std::fs::read_to_string(b).unwrap());
}

/// A missing shard, a duplicated shard, and a part computed with another seed are refused (exit 2).
#[test]
fn parts_that_do_not_belong_together_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let parts = shards(dir.path(), 2, &[]);
    let o = dpaudit(&["merge", &parts[0]]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("missing shard(s): 1/2"), "{}", stderr(&o));
    let o = dpaudit(&["merge", &parts[0], &parts[0], &parts[1]]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("also in"), "{}", stderr(&o));
    let other = tempfile::tempdir().unwrap();
    let reseeded: Vec<String> = (0..2)
        .map(|i| {
            let spec = format!("{i}/2");
            let mut args = vec!["mia"];
            args.extend_from_slice(&ATTACK[..ATTACK.len() - 1]);
            args.extend_from_slice(&["8", "--shard", &spec, "--out", other.path().to_str().unwrap()]);
            assert_eq!(dpaudit(&args).status.code(), Some(0));
            other
                .path()
                .join(format!("mia-part-{i}-of-2.json"))
                .display()
                .to_string()
        })
        .collect();
    let o = dpaudit(&["merge", &parts[0], &reseeded[1]]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("another plan"), "{}", stderr(&o));
    // A part holding one record twice is refused, naming that part file and the record.
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&parts[1]).unwrap()).unwrap();
    let recs = v["records"].as_array_mut().unwrap();
    let again = recs[3].clone();
    recs.push(again.clone());
    let doubled = other.path().join("doubled").join("mia-part-1-of-2.json");
    std::fs::create_dir_all(doubled.parent().unwrap()).unwrap();
    std::fs::write(&doubled, serde_json::to_string(&v).unwrap()).unwrap();
    let o = dpaudit(&["merge", &parts[0], doubled.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let want = format!(
        "{}: record {} ({} at t = {}, position {}) appears twice",
        doubled.display(),
        again["record_id"].as_str().unwrap(),
        again["attack"].as_str().unwrap(),
        again["t"],
        again["position"]
    );
    assert!(stderr(&o).contains(&want), "want {want}\n{}", stderr(&o));
    // A shard never overwrites an existing part, and bad specs are usage errors.
    let mut again = vec!["mia"];
    again.extend_from_slice(ATTACK);
    again.extend_from_slice(&["--shard", "0/2", "--out", dir.path().to_str().unwrap()]);
    let o = dpaudit(&again);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("already exists"), "{}", stderr(&o));
    let o = dpaudit(&[
        "mia",
        "--checkpoint",
        "models/digits-mlp.toml",
        "--shard",
        "2/2",
        "--out",
        "x",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--shard"), "{}", stderr(&o));
}
