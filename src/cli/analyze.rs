//! `dpaudit analyze <sampler.toml>`: per-step μ_t, totals for each accountant (with the kind of
//! number each gives), CLT validity warnings and the critical-window view.

use std::path::PathBuf;

use crate::cli::common::{parse_accountants, Format, OutputArgs};
use dpaudit::audit::analyze;
use dpaudit::audit::outcome::Status;
use dpaudit::error::Error;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-paper.toml\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-paper.toml -v   # every step and the event tree\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-subsampled.toml --accountant clt,pld --format json\n\n\
Reproduces the paper's Figure 6 full-batch μ ≈ 787.6 with the first fixture (convention C,\n\
2C/(β|D|) = 1). Exit code 2 on a bad configuration (file:line: field: message).")]
/// Per-step privacy analysis of a diffusion sampler configuration.
pub struct Args {
    /// Sampler configuration (TOML).
    pub config: PathBuf,
    /// Accountants: gdp, clt, rdp, pld or all (comma-separated).
    #[arg(long, default_value = "all")]
    pub accountant: String,
    /// Override the δ of the configuration.
    #[arg(long)]
    pub delta: Option<f64>,
    /// Output grammar: --format, --out DIR, --force, -q, -v.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Runs `dpaudit analyze`.
pub fn run(args: Args) -> anyhow::Result<Status> {
    let out = args.output.prepare(Format::Text, &["analyze.csv", "analyze.json"])?;
    let plan = analyze::Plan {
        verbose: args.output.verbose > 0,
        config: args.config,
        accountants: parse_accountants(&args.accountant)?,
        delta: args
            .delta
            .map(|d| {
                if d > 0.0 && d < 1.0 {
                    Ok(d)
                } else {
                    Err(Error::field("--delta", format!("δ must be in (0, 1), got {d}")))
                }
            })
            .transpose()?,
    };
    Ok(out.emit(analyze::execute(&plan)?)?)
}
