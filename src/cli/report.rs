//! `dpaudit report <result.json> --format md|html|csv|json|text [--out DIR]`: re-renders the
//! JSON report written by any dpaudit command (`--format json`, or `report.json` from `--out`).
//! The JSON is read strictly (unknown fields are errors), so a report renders to exactly what
//! the original command produced; version 1 files are upgraded.

use std::path::PathBuf;

use crate::cli::common::{Format, OutputArgs};
use dpaudit::audit::outcome::Verdict;
use dpaudit::error::{Error, Result};
use dpaudit::report::{self, output};

const EXAMPLES: &str = "\
Examples:
  # A CI job kept the JSON; render it for a reviewer as one self-contained HTML page.
  dpaudit check pipeline.toml --max-epsilon 8 --format json > result.json
  dpaudit report result.json --format html > result.html

  # Every format at once (report.md, report.html, report.json, report-*.csv,
  # plot-*.svg, plot-*.png) into a directory (created when missing); --force replaces old files.
  dpaudit report reports/check-dpsgd-cifar10/report.json --out /tmp/review --force

  # Tables as CSV (each table preceded by a `# <id>: <title>` line).
  dpaudit report result.json --format csv";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// Re-render a JSON report as Markdown, HTML or CSV.
pub struct Args {
    /// A JSON report written by dpaudit (`--format json` or `report.json` from `--out`).
    pub input: PathBuf,
    /// Output grammar (default format for this command: md).
    #[command(flatten)]
    pub output_args: OutputArgs,
    /// Write the one --format to FILE (atomically) instead of stdout.
    #[arg(long, short, value_name = "FILE", conflicts_with = "out")]
    pub output: Option<PathBuf>,
}

/// Runs `dpaudit report`.
pub fn run(args: Args) -> anyhow::Result<Verdict> {
    Ok(run_inner(&args)?)
}

fn run_inner(args: &Args) -> Result<Verdict> {
    let out = args.output_args.prepare(Format::Md, &[])?;
    if let Some(p) = &args.output {
        output::check_file(p, out.force)?;
    }
    output::verify_member(&args.input)?;
    let bytes = dpaudit::limits::read_file_capped(&args.input, "file size", dpaudit::limits::TEXT_INPUT_BYTE)?;
    not_a_detail_file(&args.input, &bytes)?;
    let rep = report::from_json(&bytes).map_err(|e| e.with_file(&args.input))?;
    dpaudit::audit::rederive::check(&rep).map_err(|e| e.with_file(&args.input))?;
    match &args.output {
        Some(p) => {
            let data = match out.format.export() {
                Some(f) => report::export(&rep, f)?,
                None => report::export::to_text(&rep).into_bytes(),
            };
            output::write_atomic(p, &data, out.force)?;
        }
        None => {
            out.finish(&rep, &report::export::to_text(&rep), Vec::new())?;
        }
    }
    Ok(Verdict::Holds)
}

/// A command's detail file (sweep.json, calibrate.json, verify.json, mia.json, run.json) is
/// not a report: exit 2 pointing to the report.json written beside it.
fn not_a_detail_file(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return Ok(());
    };
    let is_report = v.get("title").is_some_and(|t| t.is_string()) && v.get("command").is_some();
    if is_report {
        return Ok(());
    }
    let beside = path.with_file_name("report.json");
    Err(Error::input(format!(
        "this is a command's detail file, not a dpaudit report: `dpaudit report` renders the report.json that \
--out writes beside it{}",
        if beside.is_file() {
            format!(" (`dpaudit report {}`)", beside.display())
        } else {
            String::new()
        }
    ))
    .with_file(path))
}
