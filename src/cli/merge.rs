//! `dpaudit merge`: part files of `mia --shard i/n` → checked to belong together → the report of
//! one unsharded run (same metrics, audits, comparisons and exit code).

use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs};
use dpaudit::attacks::pipeline;
use dpaudit::attacks::shard::{self, MiaPart};
use dpaudit::error::Error;
use dpaudit::models::data::sha256_file;
use dpaudit::models::{device, Checkpoint, Dataset, SplitManifest};

const EXAMPLES: &str = "\
Examples:
  # Four shards (e.g. four GPU nodes of a Slurm job array), then one report:
  for i in 0 1 2 3; do dpaudit mia --checkpoint models/digits-mlp.toml --shard $i/4 --out parts; done
  dpaudit merge parts/mia-part-*-of-4.json --format json

Every part must come from the same checkpoint, data and split (SHA-256 checked) and the same
plan (attacks, steps, seed, metric settings), and shards 0..n must each appear once. Paths
recorded in the parts are used unless --checkpoint/--data/--split point elsewhere (the hashes
must still match). Exit codes as for `dpaudit mia`.";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// Merge the part files of a sharded `mia` run into one report.
pub struct Args {
    /// Part files (`mia-part-<i>-of-<n>.json`).
    #[arg(required = true, value_name = "PART")]
    pub parts: Vec<PathBuf>,
    /// Checkpoint card (default: the path recorded in the parts).
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Data file (default: the path recorded in the parts).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Split manifest (default: the path recorded in the parts).
    #[arg(long)]
    pub split: Option<PathBuf>,
    /// Output grammar, as for `mia`: --out DIR receives the report in every format, mia.json and
    /// mia.csv.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Write every ROC point (with the theoretical TPR limit) as CSV.
    #[arg(long)]
    pub roc_out: Option<PathBuf>,
    /// Write every per-record score as CSV.
    #[arg(long, value_name = "FILE.csv")]
    pub scores_out: Option<PathBuf>,
}

/// Runs `dpaudit merge`.
pub fn run(a: Args) -> anyhow::Result<dpaudit::audit::outcome::Status> {
    let start = std::time::Instant::now();
    let out = a.output.prepare(Format::Text, &["mia.json", "mia.csv"])?;
    for p in a.roc_out.iter().chain(&a.scores_out) {
        dpaudit::report::output::check_file(p, out.force)?;
    }
    let parts = a
        .parts
        .iter()
        .map(|p| Ok((p.clone(), MiaPart::load(p)?)))
        .collect::<dpaudit::Result<Vec<_>>>()?;
    let merged = shard::merge(&parts)?;
    let inputs = &merged.inputs;
    let checked = |given: &Option<PathBuf>, recorded: &PathBuf, want: &str, what: &str| -> dpaudit::Result<PathBuf> {
        let path = given.clone().unwrap_or_else(|| recorded.clone());
        let got = sha256_file(&path)?;
        if got != want {
            return Err(
                Error::input(format!("{what} has SHA-256 {got}; the parts were computed from {want}")).with_file(&path),
            );
        }
        Ok(path)
    };
    let card = checked(
        &a.checkpoint,
        &inputs.checkpoint,
        &inputs.checkpoint_sha256,
        "the checkpoint card",
    )?;
    let data_path = checked(&a.data, &inputs.data, &inputs.data_sha256, "the data file")?;
    let split_path = checked(&a.split, &inputs.split, &inputs.split_sha256, "the split manifest")?;
    let dev = device::select(device::DeviceChoice::Cpu)?;
    let ck = Checkpoint::load(&card, &dev)?;
    let data = Dataset::load(&data_path)?;
    let split = SplitManifest::load(&split_path)?;
    merged.check_records(&ck, &data, &split)?;
    let plan = merged.plan.to_plan();
    let report = pipeline::assemble(&ck, &data, &split, &plan, "merged shards", &merged.records, None, start)?;
    dpaudit::report::progress::note(&format!(
        "merged {} parts, {} records",
        parts.len(),
        merged.records.len()
    ));
    super::mia::emit(
        &report,
        &merged.records,
        &out,
        a.roc_out.as_ref(),
        a.scores_out.as_ref(),
    )
}
