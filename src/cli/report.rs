//! `dpaudit report <result.json> --format md|html|csv|json [--out DIR]`: re-renders a JSON
//! report written by any dpaudit command. The JSON is read strictly (unknown fields are errors),
//! so a report renders to exactly what the original command produced.

use std::path::PathBuf;

use crate::cli::EXIT_OK;
use crate::error::{Error, Result};
use crate::report::{self, output, ExportFormat, OutputDir};

const EXAMPLES: &str = "\
Examples:
  # A CI job kept the JSON; render it for a reviewer as one self-contained HTML page.
  dpaudit check pipeline.toml --max-epsilon 8 --format json > result.json
  dpaudit report result.json --format html > result.html

  # Every format at once (report.md, report.html, report.json, report-*.csv,
  # plot-*.svg, plot-*.png) into an existing directory; --force replaces old files.
  dpaudit report reports/check-dpsgd-cifar10/report.json --out /tmp/review --force

  # Tables as CSV (each table preceded by a `# <id>: <title>` line).
  dpaudit report result.json --format csv";

#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
/// Re-render a JSON report as Markdown, HTML or CSV.
pub struct Args {
    /// A JSON report written by dpaudit (`--format json` or `report.json` from `--out`).
    pub input: PathBuf,
    /// Output format (printed on stdout unless --out or --output is given).
    #[arg(long, value_enum, default_value_t = ExportFormat::Md)]
    pub format: ExportFormat,
    /// Write every format and the plots into DIR, with stable file names.
    #[arg(long, value_name = "DIR", conflicts_with = "output")]
    pub out: Option<PathBuf>,
    /// Write the one --format to FILE (atomically) instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Overwrite existing files.
    #[arg(long)]
    pub force: bool,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Runs `dpaudit report`; returns the exit code.
pub fn run(args: Args) -> anyhow::Result<i32> {
    Ok(run_inner(&args)?)
}

fn run_inner(args: &Args) -> Result<i32> {
    let out_dir = args
        .out
        .as_deref()
        .map(|d| OutputDir::open(d, args.force))
        .transpose()?;
    let bytes = std::fs::read(&args.input).map_err(|e| Error::io(&args.input, &e))?;
    let rep = report::from_json(&bytes).map_err(|e| e.with_file(&args.input))?;
    match out_dir {
        Some(dir) => {
            let pb = report::progress::bar(1, args.quiet, "report");
            pb.set_message("rendering");
            let written = report::write_all(&rep, &dir)?;
            pb.finish_and_clear();
            if !args.quiet {
                eprintln!("wrote {} files to {}", written.len(), dir.path().display());
            }
        }
        None => {
            let data = report::export(&rep, args.format)?;
            output::emit(args.output.as_deref(), &data, args.force)?;
        }
    }
    Ok(EXIT_OK)
}
