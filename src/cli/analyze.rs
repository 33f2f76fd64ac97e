//! `dpaudit analyze <sampler.toml>`: per-step μ_t, totals for each accountant (with the kind of
//! number each gives), CLT validity warnings and the critical-window view.

use std::path::PathBuf;

use crate::cli::common::{parse_accountants, Format, OutputArgs};
use crate::cli::EXIT_OK;
use dpaudit::audit::analyze::{self, render_text};
use dpaudit::diffusion::SamplerConfig;
use dpaudit::error::Error;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
dpaudit analyze fixtures/samplers/edm-cifar10-paper.toml\n  \
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
pub fn run(args: Args) -> anyhow::Result<i32> {
    let out = args.output.prepare(Format::Text, &["analyze.csv", "analyze.json"])?;
    let accountants = parse_accountants(&args.accountant)?;
    let mut cfg = SamplerConfig::load(&args.config)?;
    cfg.warn_defaults(&args.config);
    if let Some(d) = args.delta {
        if !(d > 0.0 && d < 1.0) {
            return Err(Error::field("--delta", format!("δ must be in (0, 1), got {d}")).into());
        }
        cfg.delta = d;
    }
    let (a, rep) = analyze::analyze(&cfg, &args.config, &accountants)?;
    let csv = analyze::render_csv(&a)?.into_bytes();
    // The detailed record (every step, window row and accountant line) beside the one report.
    let detail = serde_json::to_vec_pretty(&a)?;
    out.finish_with_csv(
        &rep,
        &render_text(&a),
        "analyze.csv",
        csv,
        vec![("analyze.json".to_string(), detail)],
    )?;
    Ok(EXIT_OK)
}
