//! `dpaudit calibrate`: the noise multiplier, sampling rate or number of steps of a DP-SGD-style
//! event that meets a target ε at δ, on the safe side (see
//! [`crate::accountants::calibrate`]).

use super::account::{check_delta_flag, check_q, check_sigma, NeighbouringArg};
use super::common::{Format, OutputArgs};
use crate::accountants::calibrate::{DpSgd, SolveFor};
use crate::accountants::AccountantKind;
use crate::audit::calibrate::{self, Plan};
use crate::error::{Error, Result};
use crate::events::Neighbouring;

/// `--solve-for` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SolveForArg {
    NoiseMultiplier,
    SampleRate,
    Steps,
}

impl From<SolveForArg> for SolveFor {
    fn from(s: SolveForArg) -> Self {
        match s {
            SolveForArg::NoiseMultiplier => SolveFor::NoiseMultiplier,
            SolveForArg::SampleRate => SolveFor::SampleRate,
            SolveForArg::Steps => SolveFor::Steps,
        }
    }
}

#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  # noise multiplier for ε = 8 at δ = 1e-5 with q = 0.01 and 10000 steps (PLD, the default)
  dpaudit calibrate --target-epsilon 8 --sample-rate 0.01 --steps 10000 --delta 1e-5

  # how many steps fit in ε = 3 with σ = 1.1, q = 0.004?
  dpaudit calibrate --target-epsilon 3 --noise-multiplier 1.1 --sample-rate 0.004 --delta 1e-5 --solve-for steps

The answer is re-checked with the accountant and always on the safe side (ε ≤ target).
--accountant clt gives an ESTIMATE, not a guarantee.
Exit codes: 0 ok; 2 bad flags, unreachable target, or unsupported event.")]
pub struct Args {
    /// Target ε.
    #[arg(long, allow_negative_numbers = true)]
    pub target_epsilon: f64,
    /// δ.
    #[arg(long, allow_negative_numbers = true)]
    pub delta: f64,
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
    /// Accountant used (one of gdp, clt, rdp, pld).
    #[arg(long, default_value = "pld")]
    pub accountant: String,
    /// Neighbouring relation.
    #[arg(long, value_enum, default_value = "add-remove")]
    pub neighbouring: NeighbouringArg,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Flags → a validated calibration plan.
fn plan(args: &Args) -> Result<Plan> {
    let kind: AccountantKind = args.accountant.trim().parse()?;
    let target = args.target_epsilon;
    if !(target.is_finite() && target > 0.0) {
        return Err(Error::field(
            "--target-epsilon",
            format!("must be finite and > 0, got {target}"),
        ));
    }
    let delta = check_delta_flag("--delta", args.delta)?;
    let solve_for =
        match args.solve_for {
            Some(s) => SolveFor::from(s),
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
    Ok(Plan {
        accountant: kind,
        fixed: DpSgd {
            noise_multiplier: sigma,
            sample_rate: q,
            steps,
        },
        solve_for,
        target,
        delta,
        neighbouring: Neighbouring::from(args.neighbouring),
    })
}

/// Runs `dpaudit calibrate`.
pub fn run(args: Args) -> anyhow::Result<i32> {
    let out = args.output.prepare(Format::Text, &[])?;
    let plan = plan(&args)?;
    if plan.accountant == AccountantKind::Clt {
        eprintln!("WARNING: the clt accountant gives an ESTIMATE (DRS Thm 3.5), not a guarantee");
    }
    let progress = crate::report::progress::Progress::new(None, out.quiet, "calibrate");
    progress.set_message(format!("solving for {}", plan.solve_for.as_str()));
    let (c, rep) = calibrate::calibrate(&plan)?;
    progress.finish();
    out.finish(&rep, &calibrate::text(&plan, &c), Vec::new())?;
    Ok(super::EXIT_OK)
}
