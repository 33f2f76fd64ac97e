//! `dpaudit sweep <sampler.toml> --sigma-min A..B --points N [--log] [axes…]`: a grid of
//! settings, evaluated in parallel, one output row per grid point (deterministic order).

use std::path::PathBuf;

use crate::cli::common::{parse_accountants, Format, OutputArgs};
use dpaudit::audit::outcome::Verdict;
use dpaudit::audit::sweep::grid;
use dpaudit::diffusion::sweep::SweepSpec;
use dpaudit::error::{Error, Result};
use dpaudit::report::progress::Progress;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
dpaudit sweep fixtures/samplers/edm-cifar10-paper.toml --sigma-min 0.002..5 --points 40 --log \\\n      \
--sample-rate 1,0.5,0.01 --format csv > sweep.csv\n  \
dpaudit sweep fixtures/samplers/ddpm-linear-ddim50.toml --stop-step 40,45,49 --clip 0.5,1 --samples 1,100\n\n\
--format csv (the default) prints the grid table; json, md and html give the report with the plot of\n\
ε against the swept axis (bounds solid, estimates dashed, --max-epsilon as the budget line).\n\n\
Every axis given is crossed with every other (a cartesian grid): --sigma-min/--t-min, --levels,\n\
--stop-step, --switch-step or --switch-at, --clip, --dataset-size, --delta, --sample-rate, --samples.\n\
Every accountant is its own set of columns (<name>_epsilon, <name>_kind, <name>_status). The default\n\
accountants are gdp (exact at p = 1; full-batch upper bound at p < 1) and clt (an estimate, never a\n\
guarantee); add pld/rdp with --accountant gdp,clt,pld (slower). The step convention is a column.")]
/// Sweep a sampler configuration over a grid of settings.
pub struct Args {
    /// Sampler configuration (TOML, constant density).
    pub config: PathBuf,
    /// Smallest noise level t_min: a range `A..B` (with --points, --log) or a comma-separated
    /// list. EDM: σ_min; flow matching: s_min = t/(1+t); DDPM: stop at the first level ≤ t.
    #[arg(long, visible_alias = "t-min")]
    pub sigma_min: Option<String>,
    /// Number of σ_min grid points.
    #[arg(long, default_value_t = 10)]
    pub points: usize,
    /// Log-spaced σ_min grid.
    #[arg(long)]
    pub log: bool,
    /// Poisson sampling rates p, comma-separated (e.g. 1,0.5,0.01). (Formerly --subsample-rate
    /// and --rate, still accepted.)
    #[arg(long = "sample-rate", alias = "subsample-rate", alias = "rate", value_name = "P,…")]
    pub subsample_rate: Option<String>,
    /// Switch points (fraction of steps run by the public denoiser first), comma-separated.
    #[arg(long)]
    pub switch_at: Option<String>,
    /// Switch steps (index of the first private step), comma-separated.
    #[arg(long)]
    pub switch_step: Option<String>,
    /// Stop steps (sampling stops after this many steps), comma-separated.
    #[arg(long)]
    pub stop_step: Option<String>,
    /// Clipping norms C, comma-separated.
    #[arg(long)]
    pub clip: Option<String>,
    /// Dataset sizes |D|, comma-separated.
    #[arg(long)]
    pub dataset_size: Option<String>,
    /// δ values, comma-separated.
    #[arg(long)]
    pub delta: Option<String>,
    /// Numbers of generated samples S, comma-separated.
    #[arg(long)]
    pub samples: Option<String>,
    /// Numbers of noise levels N, comma-separated. (Formerly --steps, still accepted: --steps
    /// means optimiser or DP-SGD steps everywhere else.)
    #[arg(long = "levels", alias = "steps", value_name = "N,…")]
    pub steps: Option<String>,
    /// Accountants (gdp, clt, rdp, pld or all).
    #[arg(long, default_value = "gdp,clt")]
    pub accountant: String,
    /// An ε budget, drawn as a line on the plot and counted in the conclusion.
    #[arg(long, value_name = "E")]
    pub max_epsilon: Option<f64>,
    /// Output grammar (default format for this command: csv, the grid table).
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
pub fn run(args: Args) -> anyhow::Result<Verdict> {
    let outs = args.output.prepare(Format::Csv, &["sweep.csv", "sweep.json"])?;
    if let Some(b) = args.max_epsilon {
        if !(b.is_finite() && b >= 0.0) {
            return Err(Error::field("--max-epsilon", format!("must be a finite number ≥ 0, got {b}")).into());
        }
    }
    let accountants = parse_accountants(&args.accountant)?;
    let sigma_min = match &args.sigma_min {
        Some(r) if r.contains("..") => {
            let (a, b) = parse_range(r)?;
            grid(a, b, args.points, args.log)?
        }
        Some(_) => list("--sigma-min", &args.sigma_min)?,
        None => Vec::new(),
    };
    let spec = SweepSpec {
        sigma_min,
        levels: list("--levels", &args.steps)?,
        stop_step: list("--stop-step", &args.stop_step)?,
        switch_step: list("--switch-step", &args.switch_step)?,
        switch_at: list("--switch-at", &args.switch_at)?,
        clip_norm: list("--clip", &args.clip)?,
        dataset_size: list("--dataset-size", &args.dataset_size)?,
        delta: list("--delta", &args.delta)?,
        subsample_rate: list("--sample-rate", &args.subsample_rate)?,
        samples: list("--samples", &args.samples)?,
        accountants,
    };
    let plan = dpaudit::audit::sweep::Plan {
        config: args.config,
        spec,
        budget: args.max_epsilon,
    };
    let progress = Progress::new(Some(0), outs.quiet, "sweep");
    let outcome = dpaudit::audit::sweep::execute(&plan, &progress)?;
    progress.finish();
    Ok(outs.emit(outcome)?)
}
