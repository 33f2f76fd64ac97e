//! `dpaudit merge`: part files of `mia --shard i/n` → checked to belong together → the report of
//! one unsharded run (same metrics, audits, comparisons and exit code).

use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs};
use dpaudit::audit::merge;

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
pub fn run(a: Args) -> anyhow::Result<dpaudit::audit::outcome::Verdict> {
    let started = std::time::Instant::now();
    let out = a.output.prepare(Format::Text, &["mia.json", "mia.csv"])?;
    for p in a.roc_out.iter().chain(&a.scores_out) {
        dpaudit::report::output::check_file(p, out.force)?;
    }
    let plan = merge::Plan {
        parts: a.parts,
        checkpoint: a.checkpoint,
        data: a.data,
        split: a.split,
        started,
    };
    let merged = merge::execute(&plan)?;
    super::mia::emit(
        &merged.report,
        &merged.records,
        &out,
        a.roc_out.as_ref(),
        a.scores_out.as_ref(),
    )
}
