//! `dpaudit calibrate`: the noise multiplier, sampling rate or number of steps of a DP-SGD-style
//! event that meets a target ε at δ, on the safe side (see
//! [`dpaudit::accountants::calibrate`]).

use super::account::{check_delta_flag, check_q, check_sigma, NeighbouringArg, TrainingRunArgs};
use super::common::{Format, OutputArgs};
use dpaudit::accountants::calibrate::{DpSgd, SolveFor};
use dpaudit::accountants::AccountantKind;
use dpaudit::audit::outcome::Verdict;
use dpaudit::config::dpsgd::Derived;
use dpaudit::diffusion::calibrate::SamplerParam;
use dpaudit::error::{Error, Result};
use dpaudit::events::Neighbouring;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
/// `--solve-for` values.
pub enum SolveForArg {
    /// Solve for the noise multiplier σ.
    NoiseMultiplier,
    /// Solve for the sampling rate q.
    SampleRate,
    /// Solve for the number of steps.
    Steps,
    /// Sampler: smallest noise level t_min (EDM σ_min, flow matching t = s_min/(1 − s_min)).
    SigmaMin,
    /// Sampler: number of generated samples S.
    Samples,
    /// Sampler: index of the first private step.
    SwitchStep,
    /// Sampler: clipping norm C (`clip-norm` is still accepted).
    #[value(name = "clip", alias = "clip-norm")]
    ClipNorm,
}

impl SolveForArg {
    fn dpsgd(self) -> Result<SolveFor> {
        match self {
            SolveForArg::NoiseMultiplier => Ok(SolveFor::NoiseMultiplier),
            SolveForArg::SampleRate => Ok(SolveFor::SampleRate),
            SolveForArg::Steps => Ok(SolveFor::Steps),
            _ => Err(Error::field(
                "--solve-for",
                "sigma-min, samples, switch-step and clip are sampler settings: give --sampler CONFIG",
            )),
        }
    }
    fn sampler(self) -> Result<SamplerParam> {
        match self {
            SolveForArg::SigmaMin => Ok(SamplerParam::SigmaMin),
            SolveForArg::SampleRate => Ok(SamplerParam::SampleRate),
            SolveForArg::Samples => Ok(SamplerParam::Samples),
            SolveForArg::SwitchStep => Ok(SamplerParam::SwitchStep),
            SolveForArg::ClipNorm => Ok(SamplerParam::ClipNorm),
            _ => Err(Error::field(
                "--solve-for",
                "with --sampler, solve for sigma-min, sample-rate, samples, switch-step or clip",
            )),
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  # noise multiplier for ε = 8 at δ = 1e-5 with q = 0.01 and 10000 steps (PLD, the default)
  dpaudit calibrate --target-epsilon 8 --sample-rate 0.01 --steps 10000 --delta 1e-5

  # Opacus-style: 10 epochs of batch 64 over N = 60000 (Poisson; steps and q derived and printed)
  dpaudit calibrate --target-epsilon 1 --delta 1e-5 --epochs 10 --batch-size 64 --dataset-size 60000

  # a sampler: the smallest σ_min whose sound ε is at most 8 (CLT estimate beside it)
  dpaudit calibrate --sampler fixtures/samplers/edm-cifar10-paper.toml --solve-for sigma-min --target-epsilon 8

  # how many steps fit in ε = 3 with σ = 1.1, q = 0.004?
  dpaudit calibrate --target-epsilon 3 --noise-multiplier 1.1 --sample-rate 0.004 --delta 1e-5 --solve-for steps

The answer is re-checked with the accountant and always on the safe side (ε ≤ target).
--accountant clt gives an ESTIMATE, not a guarantee.
Exit codes: 0 ok; 2 bad flags, unreachable target, or unsupported event.")]
/// Find the noise multiplier, sampling rate or steps that meet a target ε.
pub struct Args {
    /// Target ε.
    #[arg(long, allow_negative_numbers = true)]
    pub target_epsilon: f64,
    /// δ (with --sampler: defaults to the config's δ).
    #[arg(long, allow_negative_numbers = true)]
    pub delta: Option<f64>,
    /// Calibrate a diffusion sampler configuration instead of a DP-SGD event.
    #[arg(long, value_name = "CONFIG", conflicts_with_all = ["noise_multiplier", "steps", "epochs"])]
    pub sampler: Option<std::path::PathBuf>,
    /// DP-SGD in users' words (`--epochs --batch-size --dataset-size [--sampling]`).
    #[command(flatten)]
    pub run: TrainingRunArgs,
    /// Noise multiplier σ (fixed unless solved for).
    #[arg(long, value_name = "SIGMA", allow_negative_numbers = true)]
    pub noise_multiplier: Option<f64>,
    /// Poisson sampling rate q in (0, 1] (fixed unless solved for; default 1).
    #[arg(long, value_name = "Q", allow_negative_numbers = true)]
    pub sample_rate: Option<f64>,
    /// Number of steps ≥ 1 (fixed unless solved for).
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub steps: Option<u64>,
    /// Which parameter to solve for (default: the one of the three flags left out).
    #[arg(long, value_enum)]
    pub solve_for: Option<SolveForArg>,
    /// Accountant used (one of gdp, clt, rdp, pld; default pld). With --sampler: the sound
    /// accountants to take the smallest bound from (default gdp,pld; the CLT is shown beside).
    #[arg(long)]
    pub accountant: Option<String>,
    /// Neighbouring relation.
    #[arg(long, value_enum, default_value = "add-remove")]
    pub neighbouring: NeighbouringArg,
    /// Output grammar: --format, --out DIR, --force, -q, -v.
    #[command(flatten)]
    pub output: OutputArgs,
}

type DpSgdPlan = (AccountantKind, DpSgd, SolveFor, f64, f64, Format, Option<Derived>);

fn plan(args: &Args) -> Result<DpSgdPlan> {
    let format = args.output.format.unwrap_or_default();
    let kind: AccountantKind = args.accountant.as_deref().unwrap_or("pld").trim().parse()?;
    let derived = args.run.derive()?;
    let target = args.target_epsilon;
    if !(target.is_finite() && target > 0.0) {
        return Err(Error::field(
            "--target-epsilon",
            format!("must be finite and > 0, got {target}"),
        ));
    }
    let delta = check_delta_flag(
        "--delta",
        args.delta.ok_or_else(|| Error::field("--delta", "required"))?,
    )?;
    let solve_for =
        match args.solve_for {
            Some(s) => s.dpsgd()?,
            None if derived.is_some() => SolveFor::NoiseMultiplier,
            None => {
                let missing: Vec<SolveFor> = [
                    (args.noise_multiplier.is_none(), SolveFor::NoiseMultiplier),
                    (args.steps.is_none(), SolveFor::Steps),
                ]
                .into_iter()
                .filter_map(|(m, s)| m.then_some(s))
                .collect();
                match missing.as_slice() {
                    [one] => *one,
                    [] => return Err(Error::field(
                        "--solve-for",
                        "every parameter is given: say which one to solve for (noise-multiplier, sample-rate or steps)",
                    )),
                    _ => {
                        return Err(Error::field(
                            "--solve-for",
                            "more than one parameter is missing: give --noise-multiplier or --steps",
                        ))
                    }
                }
            }
        };
    let given = |flag: &str, present: bool| -> Result<()> {
        if present {
            return Err(Error::field(
                flag,
                format!(
                    "is being solved for (--solve-for {}); do not pass it",
                    solve_for.as_str()
                ),
            ));
        }
        Ok(())
    };
    match solve_for {
        SolveFor::NoiseMultiplier => given("--noise-multiplier", args.noise_multiplier.is_some())?,
        SolveFor::SampleRate => given("--sample-rate", args.sample_rate.is_some())?,
        SolveFor::Steps => given("--steps", args.steps.is_some())?,
    }
    let sigma = match solve_for {
        SolveFor::NoiseMultiplier => 1.0,
        _ => check_sigma(
            "--noise-multiplier",
            args.noise_multiplier
                .ok_or_else(|| Error::field("--noise-multiplier", "required"))?,
        )?,
    };
    if let Some(d) = &derived {
        if solve_for != SolveFor::NoiseMultiplier {
            return Err(Error::field(
                "--solve-for",
                "with --epochs/--batch-size/--dataset-size the steps and q are fixed: solve for noise-multiplier",
            ));
        }
        return Ok((
            kind,
            DpSgd {
                noise_multiplier: sigma,
                sample_rate: d.sample_rate,
                steps: d.accounted_steps,
            },
            solve_for,
            target,
            delta,
            format,
            derived.clone(),
        ));
    }
    let q = match solve_for {
        SolveFor::SampleRate => 1.0,
        _ => check_q("--sample-rate", args.sample_rate.unwrap_or(1.0))?,
    };
    let steps = match solve_for {
        SolveFor::Steps => 1,
        _ => {
            let n = args.steps.ok_or_else(|| Error::field("--steps", "required"))?;
            if n == 0 {
                return Err(Error::field(
                    "--steps",
                    "must be ≥ 1 (zero steps cost nothing; there is nothing to calibrate)",
                ));
            }
            n
        }
    };
    Ok((
        kind,
        DpSgd {
            noise_multiplier: sigma,
            sample_rate: q,
            steps,
        },
        solve_for,
        target,
        delta,
        format,
        None,
    ))
}

/// Runs `dpaudit calibrate`.
pub fn run(args: Args) -> anyhow::Result<Verdict> {
    let outs = args
        .output
        .prepare(Format::Text, &["calibrate.csv", "calibrate.json"])?;
    if args.sampler.is_some() {
        return run_sampler(&args, &outs);
    }
    let (accountant, fixed, solve_for, target, delta, _format, derived) = plan(&args)?;
    let request = dpaudit::audit::calibrate::DpSgdRequest {
        plan: dpaudit::audit::calibrate::Plan {
            accountant,
            fixed,
            solve_for,
            target,
            delta,
            neighbouring: Neighbouring::from(args.neighbouring),
        },
        derived,
    };
    let progress = dpaudit::report::progress::Progress::new(None, outs.quiet, "calibrate");
    let outcome = dpaudit::audit::calibrate::execute(&request, &progress);
    progress.finish();
    Ok(outs.emit(outcome?)?)
}

fn run_sampler(args: &Args, outs: &crate::cli::common::Outputs) -> anyhow::Result<Verdict> {
    let path = args.sampler.as_deref().expect("checked by the caller");
    let param = args
        .solve_for
        .ok_or_else(|| {
            Error::field(
                "--solve-for",
                "required with --sampler: sigma-min, sample-rate, samples, switch-step or clip",
            )
        })?
        .sampler()?;
    if args.sample_rate.is_some() {
        return Err(Error::field(
            "--sample-rate",
            "set the rate in the sampler config (privacy.subsample_rate)",
        )
        .into());
    }
    let delta = args.delta.map(|d| check_delta_flag("--delta", d)).transpose()?;
    let accountants = crate::cli::common::parse_accountants(args.accountant.as_deref().unwrap_or("gdp,pld"))?;
    if accountants.iter().all(|a| *a == AccountantKind::Clt) {
        return Err(Error::field(
            "--accountant",
            "the answer needs a sound accountant (gdp, pld or rdp); the CLT is shown beside it anyway",
        )
        .into());
    }
    let plan = dpaudit::audit::calibrate::SamplerPlan {
        config: path.to_path_buf(),
        param,
        target: args.target_epsilon,
        delta,
        accountants,
    };
    let progress = dpaudit::report::progress::Progress::new(None, outs.quiet, "calibrate");
    let outcome = dpaudit::audit::calibrate::execute_sampler(&plan, &progress);
    progress.finish();
    Ok(outs.emit(outcome?)?)
}
