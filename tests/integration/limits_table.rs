//! docs/reliability.md's limits table against what the binary refuses (issue 48): the test
//! parses the table, so a row changed in the docs or in `src/limits.rs` without the other
//! fails here. Every row is checked at its documented limit and just above it against the
//! cost it names (`dpaudit::limits`, at the default caps: what the binary applies), and every
//! row whose refusal is cheap to reach is also refused through the binary just above the
//! limit, with the documented number in the message (`… is above the limit of N`), and
//! accepted at it where a run at the limit is cheap.

use super::common::{root, stderr};
use dpaudit::limits::{self, Cost};
use std::path::Path;
use std::process::{Command, Output};

const DOC: &str = "docs/reliability.md";
const MEM: f64 = limits::DEFAULT_MEMORY as f64;
const WORK: f64 = limits::DEFAULT_WORK;

/// One row of the table: its first cell (the input) and its last (the limit at the defaults).
struct Row {
    input: String,
    limit: String,
}

fn table() -> Vec<Row> {
    let text = std::fs::read_to_string(root().join(DOC)).unwrap();
    let start = text
        .find("| input | field | cost per unit | limit at the defaults |")
        .expect("the limits table");
    text[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            // Split on `|` that is not escaped (`\|` inside a cell).
            let cells: Vec<String> = l
                .replace("\\|", "\u{1}")
                .split('|')
                .map(|c| c.trim().replace('\u{1}', "|"))
                .collect();
            Row {
                input: cells[1].clone(),
                limit: cells[cells.len() - 2].clone(),
            }
        })
        .collect()
}

/// The numbers a cell writes (`2,000,000`, `1.33`), in order.
fn numbers(cell: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in cell.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_digit() || (!cur.is_empty() && (c == ',' || c == '.')) {
            cur.push(c);
        } else if !cur.is_empty() {
            let t = cur.trim_end_matches([',', '.']).replace(',', "");
            out.push(t.parse().unwrap());
            cur.clear();
        }
    }
    out
}

/// The largest value `check_in` accepts for `cost` at the default caps.
fn max_of(cost: Cost) -> f64 {
    let m = |cap: f64, per: f64| if per > 0.0 { (cap / per).floor() } else { f64::INFINITY };
    m(MEM, cost.bytes).min(m(WORK, cost.work))
}

/// How a row's documented number is read and what it must equal.
enum Doc {
    /// The `i`-th number of the cell is the limit, exactly.
    Count(usize),
    /// The `i`-th number of the cell, times `unit` bytes, is the limit to the cell's precision
    /// (`1.33 GiB`).
    Bytes(usize, f64),
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dpaudit"))
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root())
        .output()
        .unwrap()
}

/// Asserts a refusal (exit 2) naming `field` and stating the limit `n`.
fn refused(o: &Output, field: &str, n: f64, row: &str) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{row}: {e}");
    assert!(e.contains(field), "{row}: the refusal does not name `{field}`: {e}");
    assert!(
        e.contains(&format!("above the limit of {}", n as u64)),
        "{row}: the binary's limit is not the documented {n}: {e}"
    );
}

/// Asserts the value at the limit passed the check (whatever the command did next).
fn not_refused_by(o: &Output, field: &str, row: &str) {
    let e = stderr(o);
    assert!(
        !(e.contains(field) && e.contains("above the limit")),
        "{row}: refused at its limit: {e}"
    );
}

fn sampler_with_levels(dir: &Path, levels: u64) -> String {
    let base = std::fs::read_to_string(root().join("fixtures/samplers/edm-cifar10-paper.toml")).unwrap();
    let p = dir.join(format!("levels-{levels}.toml"));
    std::fs::write(&p, base.replace("levels = 50", &format!("levels = {levels}"))).unwrap();
    p.display().to_string()
}

fn unet_config(dir: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root().join("models/mnist-ddpm/config.json")).unwrap()).unwrap();
    edit(&mut c);
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("config.json"), serde_json::to_string_pretty(&c).unwrap()).unwrap();
    d.display().to_string()
}

#[test]
fn the_documented_limits_are_the_ones_the_binary_applies() {
    let rows = table();
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let out = |n: &str| t.join(n).display().to_string();
    // Every row: (its input cell up to a parenthesis, how its number reads, the cost behind it).
    let specs: Vec<(&str, Doc, Option<Cost>)> = vec![
        (
            "sampler schedule noise levels",
            Doc::Count(0),
            Some(limits::SCHEDULE_LEVEL),
        ),
        (
            "DDPM training timesteps",
            Doc::Count(0),
            Some(limits::SCHEDULE_TIMESTEP),
        ),
        // 1797 records × 64 values × 49 steps per trajectory (work), and the B × N matrices.
        (
            "trajectories of the empirical denoiser",
            Doc::Count(4),
            Some(Cost::new(
                limits::DENOISER_CELL.bytes * 1797.0,
                limits::DENOISER_STEP.work * 1797.0 * 64.0 * 49.0,
            )),
        ),
        ("decompressed data", Doc::Bytes(0, GIB), Some(limits::DECOMPRESSED_BYTE)),
        (
            "decompressed MNIST records",
            Doc::Count(0),
            Some(Cost::new(
                limits::IMAGE_VALUE.bytes * 784.0,
                limits::IMAGE_VALUE.work * 784.0,
            )),
        ),
        ("sweep grid", Doc::Count(0), Some(limits::SWEEP_POINT)),
        (
            "model card / `train` flags",
            Doc::Count(0),
            Some(limits::TRAINED_PARAMETER),
        ),
        (
            "diffusers UNet `config.json`",
            Doc::Count(0),
            Some(limits::TRAINED_PARAMETER),
        ),
        ("diffusers UNet depth", Doc::Count(0), None),
        (
            "canaries",
            Doc::Count(0),
            Some(Cost::new(
                limits::CANARY_VALUE.bytes * 64.0,
                limits::CANARY_VALUE.work * 64.0,
            )),
        ),
        ("training batch", Doc::Count(0), Some(limits::BATCH_ROW)),
        (
            "safetensors weights file",
            Doc::Bytes(0, GIB),
            Some(Cost::new(2.0, 1.0)),
        ),
        (
            "diffusers weights file",
            Doc::Bytes(0, GIB),
            Some(limits::WEIGHTS_FILE_BYTE),
        ),
        (
            "binary inputs read whole before decoding",
            Doc::Bytes(0, GIB),
            Some(limits::BINARY_INPUT_BYTE),
        ),
        ("files only hashed", Doc::Bytes(0, 1e9), Some(limits::HASHED_BYTE)),
        (
            "bootstrap resamples",
            Doc::Count(1),
            Some(Cost::new(8.0, limits::BOOTSTRAP_SCORE.work * 1000.0)),
        ),
        // DPAgg-TI on the digits: m = 16, d = 16; two sides of runs, each m·d + d.
        (
            "distinguishing audit",
            Doc::Count(2),
            Some(Cost::new(
                4.0 * limits::RELEASED_COORDINATE.bytes,
                2.0 * limits::RELEASED_COORDINATE.work * (16.0 * 16.0 + 16.0),
            )),
        ),
        (
            "DPAgg-TI releases",
            Doc::Count(2),
            Some(Cost::new(
                limits::RELEASED_COORDINATE.bytes * 16.0,
                limits::RELEASED_COORDINATE.work * 32.0,
            )),
        ),
        ("any text input", Doc::Count(0), Some(limits::TEXT_INPUT_BYTE)),
        ("event trees", Doc::Count(0), Some(limits::EVENT_PART)),
        ("PLD composition", Doc::Count(0), Some(limits::PLD_LEAF)),
        ("claims files", Doc::Count(0), Some(limits::CLAIM)),
        (
            "sweep grid with `--accountant pld`",
            Doc::Count(0),
            Some(limits::SWEEP_POINT_PLD),
        ),
        ("`train` loop", Doc::Count(0), Some(limits::TRAIN_STEP)),
        (
            "`mia` noise draws",
            Doc::Count(0),
            Some(Cost::new(0.0, limits::MIA_DRAW.work * 4.0)),
        ),
        ("image sets", Doc::Count(0), Some(limits::IMAGE_VALUE)),
        ("`.npy` headers", Doc::Bytes(0, 1024.0 * 1024.0), None),
        ("worker threads", Doc::Count(0), None),
    ];
    // The table and the specs name the same rows, in the same order.
    // A row's key: its input cell up to a parenthesis.
    let find = |key: &str| -> &Row {
        let hits: Vec<&Row> = rows
            .iter()
            .filter(|r| r.input.split(" (").next().unwrap().trim() == key)
            .collect();
        assert_eq!(hits.len(), 1, "docs row `{key}`: {} matches", hits.len());
        hits[0]
    };
    assert_eq!(
        rows.len(),
        specs.len(),
        "the docs table has {} rows, the test {}: add the new row here",
        rows.len(),
        specs.len()
    );
    let mut documented = std::collections::HashMap::new();
    for (key, doc, cost) in &specs {
        let row = find(key);
        let nums = numbers(&row.limit);
        let n = match (doc, cost) {
            (Doc::Count(i), Some(c)) => {
                let n = max_of(*c);
                assert_eq!(
                    nums.get(*i).copied(),
                    Some(n),
                    "{key}: docs say `{}`, the cost gives {n}",
                    row.limit
                );
                n
            }
            (Doc::Bytes(i, unit), Some(c)) => {
                let n = max_of(*c);
                let shown = nums[*i] * unit;
                // The cell rounds: 1.33 GiB, 25 GB.
                let digits = row
                    .limit
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .split('.')
                    .nth(1)
                    .map_or(0, str::len);
                let tol = 0.5 * unit * 10f64.powi(-(digits as i32));
                assert!(
                    (shown - n).abs() <= tol,
                    "{key}: docs say `{}`, the cost gives {n} bytes",
                    row.limit
                );
                n
            }
            (Doc::Count(i), None) | (Doc::Bytes(i, _), None) => nums[*i],
        };
        // At the limit the check passes, one above it refuses.
        if let Some(c) = cost {
            limits::check_in(key, n, *c, MEM, WORK).unwrap_or_else(|e| panic!("{key}: refused at {n}: {e}"));
            assert!(
                limits::check_in(key, n + 1.0, *c, MEM, WORK).is_err(),
                "{key}: {n} + 1 passes"
            );
        }
        documented.insert(*key, n);
    }
    // The canaries row's second figure: 28×28 MNIST canaries.
    let mnist = numbers(&find("canaries").limit)[3];
    let c784 = Cost::new(limits::CANARY_VALUE.bytes * 784.0, limits::CANARY_VALUE.work * 784.0);
    assert_eq!(mnist, max_of(c784), "MNIST canaries");
    let n = |k: &str| documented[k];
    let s = |v: f64| format!("{}", v as u64);

    // Through the binary: just above each limit (and at it where a run there is cheap).
    let levels = n("sampler schedule noise levels");
    let o = run(&["analyze", &sampler_with_levels(t, levels as u64 + 1), "--quiet"], &[]);
    refused(&o, "levels", levels, "levels");

    // The digits sampler at 50 levels (49 steps), one trajectory more than the limit: the
    // message states the product against the work cap.
    let traj = n("trajectories of the empirical denoiser");
    let cfg = std::fs::read_to_string(root().join("fixtures/samplers/digits-trajectories.toml"))
        .unwrap()
        .replace("levels = 20", "levels = 50")
        .replace("trajectories = 8\n", &format!("trajectories = {}\n", traj as u64 + 1))
        .replace("\"../data/", &format!("\"{}/", root().join("fixtures/data").display()));
    let p = t.join("traj.toml");
    std::fs::write(&p, cfg).unwrap();
    let o = run(&["analyze", p.to_str().unwrap(), "--quiet"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let want = format!(
        "{} trajectories over 1797 records of dimension 64 and 49 steps",
        traj as u64 + 1
    );
    assert!(stderr(&o).contains(&want), "{}", stderr(&o));
    assert!(stderr(&o).contains("density.trajectories"), "{}", stderr(&o));

    let ts = n("DDPM training timesteps");
    let o = run(
        &[
            "train",
            "--timesteps",
            &s(ts + 1.0),
            "--steps",
            "1",
            "--out",
            &out("ts"),
            "-q",
        ],
        &[],
    );
    refused(&o, "timesteps", ts, "timesteps");

    let points = n("sweep grid");
    let sweep = |p: f64, extra: &[&str]| {
        let pts = s(p);
        let mut a = vec![
            "sweep",
            "fixtures/samplers/edm-cifar10-paper.toml",
            "--sigma-min",
            "0.002..5",
            "--points",
            &pts,
            "--quiet",
        ];
        a.extend_from_slice(extra);
        run(&a, &[])
    };
    refused(&sweep(points + 1.0, &[]), "--points", points, "sweep points");
    let pld_points = n("sweep grid with `--accountant pld`");
    refused(
        &sweep(pld_points + 1.0, &["--accountant", "pld"]),
        "--points",
        pld_points,
        "pld sweep points",
    );

    let params = n("model card / `train` flags");
    let o = run(
        &[
            "train",
            "--hidden",
            "8192",
            "--depth",
            "8",
            "--steps",
            "1",
            "--out",
            &out("wide"),
            "-q",
        ],
        &[],
    );
    refused(&o, "model.hidden", params, "train --hidden");

    let cfg_params = n("diffusers UNet `config.json`");
    let wide = unet_config(t, "wide-unet", |c| {
        c["block_out_channels"] = serde_json::json!([4096, 8192])
    });
    let o = run(&["model", "info", &wide], &[]);
    refused(
        &o,
        "parameters (from config.json)",
        cfg_params,
        "config.json parameters",
    );

    let lpb = n("diffusers UNet depth");
    let deep = unet_config(t, "deep-unet", |c| {
        c["layers_per_block"] = serde_json::json!(lpb as u64 + 1)
    });
    refused(
        &run(&["model", "info", &deep], &[]),
        "layers_per_block",
        lpb,
        "layers_per_block",
    );
    let at = unet_config(t, "at-unet", |c| c["layers_per_block"] = serde_json::json!(lpb as u64));
    not_refused_by(
        &run(&["model", "info", &at], &[]),
        "layers_per_block",
        "layers_per_block",
    );

    let canaries = n("canaries");
    let o = run(
        &[
            "train",
            "--canaries",
            &s(canaries + 1.0),
            "--steps",
            "1",
            "--out",
            &out("can"),
            "-q",
        ],
        &[],
    );
    refused(&o, "--canaries", canaries, "--canaries");

    let batch = n("training batch");
    let o = run(
        &[
            "train",
            "--batch-size",
            &s(batch + 1.0),
            "--steps",
            "1",
            "--out",
            &out("b"),
            "-q",
        ],
        &[],
    );
    refused(&o, "--batch-size", batch, "--batch-size");

    let steps = n("`train` loop");
    let o = run(&["train", "--steps", &s(steps + 1.0), "--out", &out("st"), "-q"], &[]);
    refused(&o, "--steps", steps, "--steps");

    let text = n("any text input");
    let big = t.join("big.toml");
    std::fs::File::create(&big).unwrap().set_len(text as u64 + 1).unwrap();
    refused(
        &run(&["account", "--event", big.to_str().unwrap()], &[]),
        "file size",
        text,
        "text file size",
    );

    let runs = n("distinguishing audit");
    let o = run(
        &[
            "run",
            "dpagg-ti",
            "fixtures/runs/dpagg-ti-digits.toml",
            "--audit",
            "--audit-runs",
            &s(runs + 1.0),
            "--seed",
            "1",
            "-q",
        ],
        &[],
    );
    refused(&o, "--audit-runs", runs, "--audit-runs");

    let draws = n("`mia` noise draws");
    let o = run(
        &[
            "mia",
            "--checkpoint",
            "models/mnist-dp-ddpm",
            "--noise-draws",
            &s(draws + 1.0),
            "--quiet",
        ],
        &[],
    );
    refused(&o, "--noise-draws", draws, "--noise-draws");

    let threads = n("worker threads");
    let o = run(
        &["account", "--event", "fixtures/events/dpsgd.toml"],
        &[("RAYON_NUM_THREADS", &s(threads + 1.0))],
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("above the limit of {} threads", threads as u64)),
        "{}",
        stderr(&o)
    );
}
