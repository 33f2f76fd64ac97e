//! `dpaudit calibrate`: the noise multiplier, sampling rate or number of steps of a DP-SGD-style
//! event that meets a target ε at δ, on the safe side (see
//! [`dpaudit::accountants::calibrate`]).

use serde::Serialize;

use super::account::{check_delta_flag, check_q, check_sigma, NeighbouringArg, TrainingRunArgs};
use super::common::{Format, OutputArgs};
use dpaudit::accountants::calibrate::{calibrate_dpsgd_any, DpSgd, SolveFor};
use dpaudit::accountants::{AccountResult, AccountantKind, BoundKind};
use dpaudit::audit::outcome::Status;
use dpaudit::config::dpsgd::Derived;
use dpaudit::diffusion::calibrate::{calibrate_sampler, SamplerCalibration, SamplerParam};
use dpaudit::error::{Error, Result};
use dpaudit::events::{DpEvent, Neighbouring};

/// JSON schema version of `calibrate` output.
pub const SCHEMA_VERSION: u32 = 1;

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
    /// Sampler: clipping norm C.
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
                "sigma-min, samples, switch-step and clip-norm are sampler settings: give --sampler CONFIG",
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
                "with --sampler, solve for sigma-min, sample-rate, samples, switch-step or clip-norm",
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

#[derive(Debug, Serialize)]
struct Output {
    schema_version: u32,
    solve_for: SolveFor,
    value: f64,
    target_epsilon: f64,
    delta: f64,
    accountant: AccountantKind,
    kind: BoundKind,
    /// ε the accountant reports at `value` (≤ target).
    epsilon: f64,
    event: DpEvent,
    neighbouring: Neighbouring,
    evaluations: usize,
    result: AccountResult,
    /// Steps and q derived from --epochs/--batch-size/--dataset-size.
    #[serde(skip_serializing_if = "Option::is_none")]
    derivation: Option<Derived>,
    warnings: Vec<String>,
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
pub fn run(args: Args) -> anyhow::Result<Status> {
    let outs = args
        .output
        .prepare(Format::Text, &["calibrate.csv", "calibrate.json"])?;
    if args.sampler.is_some() {
        return run_sampler(&args, &outs);
    }
    let (kind, fixed, solve_for, target, delta, _format, derived) = plan(&args)?;
    let neighbouring = Neighbouring::from(args.neighbouring);
    let mut warnings = Vec::new();
    if kind == AccountantKind::Clt {
        let w = "the clt accountant gives an ESTIMATE (DRS Thm 3.5), not a guarantee: the calibrated value \
                 may not meet the target; use --accountant pld or rdp for a sound answer"
            .to_string();
        eprintln!("WARNING: {w}");
        warnings.push(w);
    }
    let progress = dpaudit::report::progress::Progress::new(None, outs.quiet, "calibrate");
    progress.set_message(format!("solving for {}", solve_for.as_str()));
    // What any sound accountant can certify: when `kind` finds nothing in range, the others
    // are tried and the answer names the accountant that certified it.
    let (c, fallback) = calibrate_dpsgd_any(kind, neighbouring, delta, target, fixed, solve_for)?;
    progress.finish();
    if let Some(w) = &fallback {
        eprintln!("warning: {w}");
        warnings.push(w.clone());
    }
    let kind = c.result.accountant;
    let mut rep = dpaudit::audit::calibrate::to_report(
        &dpaudit::audit::calibrate::Plan {
            accountant: kind,
            fixed,
            solve_for,
            target,
            delta,
            neighbouring,
        },
        &c,
    );
    if let Some(w) = &fallback {
        rep.warn("calibration_fallback_accountant", w, false);
    }
    if let Some(d) = &derived {
        rep.assumptions.other.extend(
            d.derivation
                .iter()
                .map(|l| dpaudit::report::Fact::new("DP-SGD derivation", l.clone())),
        );
    }
    let out = Output {
        schema_version: SCHEMA_VERSION,
        solve_for,
        value: c.value,
        target_epsilon: target,
        delta,
        accountant: kind,
        kind: c.result.kind,
        epsilon: c.result.epsilon,
        event: c.event.clone(),
        neighbouring,
        evaluations: c.evaluations,
        result: c.result.clone(),
        derivation: derived,
        warnings,
    };
    let csv = format!(
        "solve_for,value,target_epsilon,delta,accountant,kind,epsilon\n{},{},{},{},{},{},{}\n",
        solve_for.as_str(),
        out.value,
        target,
        delta,
        kind.as_str(),
        out.kind.as_str(),
        out.epsilon
    );
    let mut text = String::new();
    {
        use std::fmt::Write as _;
        let v = match solve_for {
            SolveFor::Steps => format!("{}", out.value as u64),
            _ => format!("{}", out.value),
        };
        if let Some(d) = &out.derivation {
            let _ = writeln!(text, "DP-SGD run: {}", d.summary());
            for l in &d.derivation {
                let _ = writeln!(text, "  {l}");
            }
        }
        let _ = writeln!(text, "Event:");
        for line in out.event.ledger().lines() {
            let _ = writeln!(text, "  {line}");
        }
        let _ = writeln!(
            text,
            "{} = {v}  gives ε = {:.6} ≤ target {target} at δ = {delta:e} ({}, {})",
            solve_for.as_str(),
            out.epsilon,
            kind.as_str(),
            match out.kind {
                BoundKind::Estimate => "ESTIMATE, not a guarantee",
                BoundKind::UpperBound => "upper bound",
                BoundKind::Exact => "exact",
                BoundKind::LowerBound => "lower bound",
                BoundKind::DataDependent => "data-dependent: not a DP guarantee",
            }
        );
        for w in &out.warnings {
            let _ = writeln!(text, "WARNING: {w}");
        }
    }
    let _ = &out.schema_version;
    Ok(outs.emit(dpaudit::audit::Outcome::new(rep, text).with_table("calibrate.csv", csv.into_bytes()))?)
}

/// JSON document of a sampler calibration.
#[derive(Debug, Serialize)]
struct SamplerOutput<'a> {
    schema_version: u32,
    config: String,
    #[serde(flatten)]
    calibration: &'a SamplerCalibration,
}

fn run_sampler(args: &Args, outs: &crate::cli::common::Outputs) -> anyhow::Result<Status> {
    let path = args.sampler.as_deref().expect("checked by the caller");
    let param = args
        .solve_for
        .ok_or_else(|| {
            Error::field(
                "--solve-for",
                "required with --sampler: sigma-min, sample-rate, samples, switch-step or clip-norm",
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
    let mut cfg = dpaudit::config::sampler::SamplerConfig::load(path)?;
    cfg.warn_defaults(path);
    if let Some(d) = args.delta {
        cfg.delta = check_delta_flag("--delta", d)?;
    }
    let accountants = crate::cli::common::parse_accountants(args.accountant.as_deref().unwrap_or("gdp,pld"))?;
    if accountants.iter().all(|a| *a == AccountantKind::Clt) {
        return Err(Error::field(
            "--accountant",
            "the answer needs a sound accountant (gdp, pld or rdp); the CLT is shown beside it anyway",
        )
        .into());
    }
    let c = calibrate_sampler(&cfg, param, args.target_epsilon, &accountants).map_err(|e| e.with_file(path))?;
    let detail = serde_json::to_vec_pretty(&SamplerOutput {
        schema_version: SCHEMA_VERSION,
        config: path.display().to_string(),
        calibration: &c,
    })?;
    let mut csv = String::from("solve_for,answer,value,epsilon,accountant,kind,past_value,past_epsilon\n");
    let row = |csv: &mut String, name: &str, s: &dpaudit::diffusion::calibrate::Search| {
        csv.push_str(&format!(
            "{},{name},{},{},{},{},{},{}\n",
            param.as_str(),
            s.meets.value,
            s.meets.epsilon,
            s.meets.line.accountant.as_str(),
            s.meets.line.kind.map(|k| k.as_str()).unwrap_or(""),
            s.past.as_ref().map(|p| p.value.to_string()).unwrap_or_default(),
            s.past.as_ref().map(|p| p.epsilon.to_string()).unwrap_or_default()
        ));
    };
    row(&mut csv, "sound", &c.sound);
    if let Some(e) = &c.clt {
        row(&mut csv, "clt_estimate", e);
    }
    let text = render_sampler_text(path, &cfg, &c);
    let rep = dpaudit::audit::calibrate::sampler_report(path, &cfg, &c)?;
    Ok(outs.emit(
        dpaudit::audit::Outcome::new(rep, text)
            .with_table("calibrate.csv", csv.into_bytes())
            .with_file("calibrate.json", detail),
    )?)
}

fn render_sampler_text(
    path: &std::path::Path,
    cfg: &dpaudit::config::sampler::SamplerConfig,
    c: &SamplerCalibration,
) -> String {
    use std::fmt::Write as _;
    let f = dpaudit::report::export::fmt_num;
    // ε in full (shortest round-trip): a rounded 8 next to "≤ 8" would hide which side it is on.
    let e = |x: f64| format!("{x}");
    let name = c.param.as_str();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Sampler {} ({}), step convention {}",
        path.display(),
        cfg.schedule.describe(),
        cfg.convention.describe()
    );
    let _ = writeln!(
        s,
        "Target ε = {} at δ = {} ({})",
        f(c.target_epsilon),
        f(c.delta),
        cfg.neighbouring
    );
    let m = &c.sound.meets;
    let _ = writeln!(
        s,
        "{name} = {}  gives ε = {} ≤ target ({}, {}; re-analysed)",
        f(m.value),
        e(m.epsilon),
        m.line.accountant.as_str(),
        m.line.kind.map(|k| k.as_str()).unwrap_or("?")
    );
    match &c.sound.past {
        Some(p) => {
            let _ = writeln!(
                s,
                "  one step past: {name} = {} gives ε = {} > target",
                f(p.value),
                f(p.epsilon)
            );
        }
        None => {
            let _ = writeln!(s, "  the whole range of {name} meets the target");
        }
    }
    match (&c.clt, &c.clt_note) {
        (Some(c_), _) => {
            let _ = writeln!(
                s,
                "CLT estimate (not a guarantee): {name} = {} gives ε ≈ {} ({})",
                f(c_.meets.value),
                e(c_.meets.epsilon),
                c_.meets.line.status
            );
        }
        (None, Some(n)) => {
            let _ = writeln!(s, "CLT estimate: {n}");
        }
        _ => {}
    }
    s
}
