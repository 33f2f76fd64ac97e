//! Flags and helpers shared by several subcommands: the output grammar (`--format`, `--out DIR`,
//! `--force`, `-q`, `-v`) and accountant lists.

use std::path::PathBuf;

use dpaudit::accountants::AccountantKind;
use dpaudit::audit::outcome::{Outcome, Verdict};
use dpaudit::error::Result;
use dpaudit::report::{self, output, progress, ExportFormat, OutputDir, Report};

/// Output format of a command. Every command accepts every value: `text` is the command's own
/// terminal summary, the others render its [`Report`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum Format {
    /// A terminal summary.
    #[default]
    /// Plain text for a terminal.
    Text,
    /// The report as JSON (schema: docs/schema/report.v2.json).
    Json,
    /// The report's tables as CSV.
    Csv,
    /// The report as Markdown (plots inline).
    Md,
    /// The report as one self-contained HTML page.
    Html,
}

impl Format {
    /// The report format, `None` for `text`.
    pub fn export(self) -> Option<ExportFormat> {
        match self {
            Format::Text => None,
            Format::Json => Some(ExportFormat::Json),
            Format::Csv => Some(ExportFormat::Csv),
            Format::Md => Some(ExportFormat::Md),
            Format::Html => Some(ExportFormat::Html),
        }
    }
}

/// The output grammar every command shares.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct OutputArgs {
    /// What to print on stdout: text, json, csv, md or html (default: text, unless the command
    /// says otherwise).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,
    /// Also write the report in every format (report.json, report.md, report.html,
    /// report-*.csv, plot-*.svg, plot-*.png) and the command's own files into DIR (created when
    /// missing).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace output files from an earlier run (without it they are refused, exit 2, before
    /// any work).
    #[arg(long)]
    pub force: bool,
    /// No progress bars or notes on stderr.
    #[arg(long, short, conflicts_with = "verbose")]
    pub quiet: bool,
    /// More detail on stderr.
    #[arg(long, short, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// Checked outputs, ready before any work.
#[derive(Debug, Clone)]
pub struct Outputs {
    /// The stdout format.
    pub format: Format,
    /// `--out DIR`, created and checked.
    pub dir: Option<OutputDir>,
    /// `--force`.
    pub force: bool,
    /// `-q`.
    pub quiet: bool,
}

impl OutputArgs {
    /// Validates the output flags before any work: records `-q`/`-v`, creates `--out DIR` and
    /// refuses (exit 2) report files or `extra` files already there unless `--force`.
    pub fn prepare(&self, default: Format, extra: &[&str]) -> Result<Outputs> {
        progress::set_verbosity(self.quiet, self.verbose);
        let dir = match &self.out {
            Some(d) => {
                let dir = OutputDir::create(d, self.force)?;
                dir.refuse_existing(extra)?;
                Some(dir)
            }
            None => None,
        };
        Ok(Outputs {
            format: self.format.unwrap_or(default),
            dir,
            force: self.force,
            quiet: self.quiet,
        })
    }
}

impl Outputs {
    /// Prints and writes a command's [`Outcome`]: its main table (when it has one) is what
    /// `--format csv` prints and is written into `--out DIR`; returns the outcome's status.
    pub fn emit(&self, o: Outcome) -> Result<Verdict> {
        match o.table {
            Some((name, csv)) => self.finish_with_csv(&o.report, &o.text, &name, csv, o.files)?,
            None => self.finish(&o.report, &o.text, o.files)?,
        };
        Ok(o.status)
    }

    /// Prints `--format` on stdout (`text` for [`Format::Text`], else the report) and writes the
    /// report in every format plus `extra` files into `--out DIR`. Returns the written paths.
    pub fn finish(&self, rep: &Report, text: &str, extra: Vec<(String, Vec<u8>)>) -> Result<Vec<PathBuf>> {
        // Files first: a report that cannot be written fails before stdout claims success.
        let mut written = Vec::new();
        if let Some(dir) = &self.dir {
            written = report::write_all_with(rep, dir, extra)?;
            progress::note(&format!("wrote {} files to {}", written.len(), dir.path().display()));
        }
        match self.format.export() {
            None => output::emit_stdout(text.as_bytes())?,
            Some(f) => output::emit_stdout(&report::export(rep, f)?)?,
        }
        Ok(written)
    }

    /// [`Outputs::finish`] for a command whose `--format csv` is its one main table (`csv`)
    /// rather than every table of the report; `csv` is also written into `--out DIR` as
    /// `csv_name`.
    pub fn finish_with_csv(
        &self,
        rep: &Report,
        text: &str,
        csv_name: &str,
        csv: Vec<u8>,
        mut extra: Vec<(String, Vec<u8>)>,
    ) -> Result<Vec<PathBuf>> {
        if self.format != Format::Csv {
            extra.push((csv_name.to_string(), csv));
            return self.finish(rep, text, extra);
        }
        let mut written = Vec::new();
        if let Some(dir) = &self.dir {
            extra.push((csv_name.to_string(), csv.clone()));
            written = report::write_all_with(rep, dir, extra)?;
            progress::note(&format!("wrote {} files to {}", written.len(), dir.path().display()));
        }
        output::emit_stdout(&csv)?;
        Ok(written)
    }
}

/// Parses `--accountant gdp|rdp|pld|clt|all` (comma-separated lists allowed).
pub fn parse_accountants(s: &str) -> Result<Vec<AccountantKind>, dpaudit::Error> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("all") {
            return Ok(AccountantKind::ALL.to_vec());
        }
        let k: AccountantKind = part.parse()?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        return Err(dpaudit::Error::field("--accountant", "no accountant given"));
    }
    Ok(out)
}
