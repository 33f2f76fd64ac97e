//! `dpaudit sweep <sampler.toml> --sigma-min A..B --points N [--log] [axes…]`: a grid of
//! settings, evaluated in parallel, one output row per grid point (deterministic order).

use std::path::PathBuf;

use crate::cli::common::{parse_accountants, Format, OutputArgs};
use crate::cli::EXIT_OK;
use dpaudit::accountants::AccountantKind;
use dpaudit::diffusion::sweep::{self, SweepRow, SweepSpec};
use dpaudit::diffusion::SamplerConfig;
use dpaudit::error::{Error, Result};
use dpaudit::report::progress::Progress;

#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  \
dpaudit sweep fixtures/samplers/edm-cifar10-paper.toml --sigma-min 0.002..5 --points 40 --log \\\n      \
--subsample-rate 1,0.5,0.01 --format csv > sweep.csv\n  \
dpaudit sweep fixtures/samplers/ddpm-linear-ddim50.toml --stop-step 40,45,49 --clip 0.5,1 --samples 1,100\n\n\
--format csv (the default) prints the grid table; json, md and html give the report with the plot of\n\
ε against the swept axis (bounds solid, estimates dashed, --max-epsilon as the budget line).\n\n\
Every axis given is crossed with every other (a cartesian grid): --sigma-min/--t-min, --steps,\n\
--stop-step, --switch-step or --switch-at, --clip, --dataset-size, --delta, --subsample-rate, --samples.\n\
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
    /// Subsampling rates p, comma-separated (e.g. 1,0.5,0.01).
    #[arg(long, visible_alias = "rate")]
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
    /// Numbers of noise levels N, comma-separated.
    #[arg(long)]
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

/// Runs `dpaudit sweep`; returns the exit code.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let outs = args.output.prepare(Format::Csv, &["sweep.csv", "sweep.json"])?;
    if let Some(b) = args.max_epsilon {
        if !(b.is_finite() && b >= 0.0) {
            return Err(Error::field("--max-epsilon", format!("must be a finite number ≥ 0, got {b}")).into());
        }
    }
    let accountants = parse_accountants(&args.accountant)?;
    let cfg = SamplerConfig::load(&args.config)?;
    cfg.warn_defaults(&args.config);
    let sigma_min = match &args.sigma_min {
        Some(r) if r.contains("..") => {
            let (a, b) = parse_range(r)?;
            sweep::grid(a, b, args.points, args.log)?
        }
        Some(_) => list("--sigma-min", &args.sigma_min)?,
        None => Vec::new(),
    };
    let spec = SweepSpec {
        sigma_min,
        levels: list("--steps", &args.steps)?,
        stop_step: list("--stop-step", &args.stop_step)?,
        switch_step: list("--switch-step", &args.switch_step)?,
        switch_at: list("--switch-at", &args.switch_at)?,
        clip_norm: list("--clip", &args.clip)?,
        dataset_size: list("--dataset-size", &args.dataset_size)?,
        delta: list("--delta", &args.delta)?,
        subsample_rate: list("--subsample-rate", &args.subsample_rate)?,
        samples: list("--samples", &args.samples)?,
        accountants: accountants.clone(),
    };
    let progress = Progress::new(Some(0), outs.quiet, "sweep");
    let (rows, rep) = dpaudit::audit::sweep::sweep(&cfg, &args.config, &spec, args.max_epsilon, &progress)?;
    progress.finish();
    let csv = sweep::to_csv(&rows, &accountants)?;
    let detail = serde_json::to_vec_pretty(&rows)?;
    outs.finish_with_csv(
        &rep,
        &render_text(&rows, &accountants),
        "sweep.csv",
        csv.into_bytes(),
        vec![("sweep.json".to_string(), detail)],
    )?;
    Ok(EXIT_OK)
}

fn render_text(rows: &[SweepRow], accountants: &[AccountantKind]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if let Some(r) = rows.first() {
        let _ = writeln!(s, "step convention {}", r.convention);
    }
    let _ = write!(
        s,
        "{:>12} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>13}",
        "t_min", "N", "stop", "switch", "C", "|D|", "δ", "p", "S", "private", "full μ"
    );
    for a in accountants {
        let _ = write!(s, " {:>14}", format!("{} ε", a.as_str()));
    }
    s.push('\n');
    for r in rows {
        let switch = match r.switch_step {
            Some(k) => format!("#{k}"),
            None => format!("{}", r.switch_at),
        };
        let stop = match (r.stop_step, r.stop_at) {
            (Some(k), _) => format!("#{k}"),
            (None, Some(t)) => format!("≤{t}"),
            (None, None) => "-".into(),
        };
        let _ = write!(
            s,
            "{:>12} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>13.6e}",
            format!("{:.6}", r.sigma_min.unwrap_or(r.t_min)),
            r.levels,
            stop,
            switch,
            r.clip_norm,
            r.dataset_size,
            r.delta,
            r.subsample_rate,
            r.samples,
            r.private_steps,
            r.full_batch_mu
        );
        for a in accountants {
            let l = r.accountants.iter().find(|l| l.accountant == *a);
            let cell = match l {
                Some(l) => match l.epsilon {
                    Some(e) if l.status == "ok" => format!("{e:.6}"),
                    Some(e) => format!("{e:.6}!"),
                    None => "n/a".into(),
                },
                None => "-".into(),
            };
            let _ = write!(s, " {cell:>14}");
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "kinds: gdp exact at p = 1, upper bound (no amplification) at p < 1; clt estimate (\"!\" = CLT conditions fail: not a guarantee); pld/rdp upper bounds; n/a = unavailable (see --format csv for reasons)"
    );
    s
}
