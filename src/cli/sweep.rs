//! `dpaudit sweep <sampler.toml> --sigma-min A..B --points N [--log] [axes…]`: a grid of
//! settings, evaluated in parallel, one output row per grid point (deterministic order).

use std::path::PathBuf;

use crate::cli::common::{parse_accountants, Format, OutputArgs};
use crate::cli::EXIT_OK;
use crate::diffusion::sweep::{self, SweepSpec};
use crate::diffusion::SamplerConfig;
use crate::error::{Error, Result};
use crate::report::progress::Progress;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
dpaudit sweep fixtures/samplers/edm-cifar10-paper.toml --sigma-min 0.002..5 --points 40 --log \\\n      \
--subsample-rate 1,0.5,0.01 --format csv > sweep.csv\n\n\
Every accountant is its own set of columns (<name>_epsilon, <name>_kind, <name>_status). The default\n\
accountants are gdp (exact at p = 1; full-batch upper bound at p < 1) and clt (an estimate, never a\n\
guarantee); add pld/rdp with --accountant gdp,clt,pld (slower). The step convention is a column.\n\
--format csv (the default) prints that one table; json, md and html give the report with the plot\n\
of ε against the swept axis (bounds solid, estimates dashed, --max-epsilon as the budget line).")]
pub struct Args {
    /// Sampler configuration (TOML, constant density).
    pub config: PathBuf,
    /// σ_min range `A..B` (EDM schedules).
    #[arg(long)]
    pub sigma_min: Option<String>,
    /// Number of σ_min grid points.
    #[arg(long, default_value_t = 10)]
    pub points: usize,
    /// Log-spaced σ_min grid.
    #[arg(long)]
    pub log: bool,
    /// Subsampling rates p, comma-separated (e.g. 1,0.5,0.01).
    #[arg(long)]
    pub subsample_rate: Option<String>,
    /// Switch points (fraction of steps run by the public denoiser first), comma-separated.
    #[arg(long)]
    pub switch_at: Option<String>,
    /// Numbers of generated samples S, comma-separated.
    #[arg(long)]
    pub samples: Option<String>,
    /// Numbers of noise levels N, comma-separated.
    #[arg(long)]
    pub steps: Option<String>,
    /// Accountants (gdp, clt, rdp, pld or all).
    #[arg(long, default_value = "gdp,clt")]
    pub accountant: String,
    /// An ε budget, drawn as a line on the plot and counted in the conclusion.
    #[arg(long, value_name = "E")]
    pub max_epsilon: Option<f64>,
    /// Output grammar (default format for this command: csv).
    #[command(flatten)]
    pub output: OutputArgs,
}

fn list<T: std::str::FromStr>(flag: &str, s: &Option<String>) -> Result<Vec<T>> {
    let Some(s) = s else { return Ok(Vec::new()) };
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<T>()
                .map_err(|_| Error::field(flag, format!("`{p}` is not a valid value")))
        })
        .collect::<Result<Vec<T>>>()
        .and_then(|v| {
            if v.is_empty() {
                Err(Error::field(flag, "empty list"))
            } else {
                Ok(v)
            }
        })
}

/// Parses `A..B`.
pub fn parse_range(s: &str) -> Result<(f64, f64)> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| Error::field("--sigma-min", format!("expected A..B, got `{s}`")))?;
    let p = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| Error::field("--sigma-min", format!("`{x}` is not a number")))
    };
    let (a, b) = (p(a)?, p(b)?);
    if !(a > 0.0 && b > a) {
        return Err(Error::field("--sigma-min", format!("need 0 < A < B, got {a}..{b}")));
    }
    Ok((a, b))
}

/// Runs `dpaudit sweep`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let out = args.output.prepare(Format::Csv, &["sweep.csv"])?;
    if let Some(b) = args.max_epsilon {
        if !(b.is_finite() && b >= 0.0) {
            return Err(Error::field("--max-epsilon", format!("must be a finite number ≥ 0, got {b}")).into());
        }
    }
    let accountants = parse_accountants(&args.accountant)?;
    let cfg = SamplerConfig::load(&args.config)?;
    let sigma_min = match &args.sigma_min {
        Some(r) => {
            let (a, b) = parse_range(r)?;
            sweep::grid(a, b, args.points, args.log)?
        }
        None => Vec::new(),
    };
    let spec = SweepSpec {
        sigma_min,
        levels: list("--steps", &args.steps)?,
        subsample_rate: list("--subsample-rate", &args.subsample_rate)?,
        switch_at: list("--switch-at", &args.switch_at)?,
        samples: list("--samples", &args.samples)?,
        accountants: accountants.clone(),
    };
    let progress = Progress::new(Some(0), out.quiet, "sweep");
    let (rows, rep) = crate::audit::sweep::sweep(&cfg, &args.config, &spec, args.max_epsilon, &progress)?;
    progress.finish();
    let table = rep
        .tables
        .iter()
        .find(|t| t.id == "sweep")
        .ok_or_else(|| Error::input("no sweep table"))?;
    let csv = crate::report::export::table_csv(table)?;
    out.finish_with_csv(
        &rep,
        &crate::audit::sweep::text(&rows, &accountants),
        "sweep.csv",
        csv,
        Vec::new(),
    )?;
    Ok(EXIT_OK)
}
