//! Calibration of a sampler configuration: the σ_min (t_min), subsampling rate, number of
//! samples, switch step or clipping norm that meets a target ε at the config's δ.
//!
//! The answer is decided by a *sound* accountant (the smallest ε among the sound lines of the
//! requested accountants: GDP exact at p = 1, its full-batch upper bound and PLD/RDP upper
//! bounds at p < 1) and lands on the safe side: the value returned was re-analysed and meets
//! the target, and the neighbouring value one resolution step further (integers: ±1;
//! continuous values: one unit in the 6th significant digit) was analysed and does not. The
//! CLT's answer (DRS Thm 3.5, an estimate) is computed the same way and reported beside it.
//!
//! Monotonicity used by the search (each follows from the per-step
//! μ_t = 2C/(β|D|)·√(2Δt/t³) of diffusion-sampling-privacy.md §3.1 and composition, §3.2):
//! ε increases with C (every μ_t ∝ C), with p (amplification by subsampling weakens as p
//! grows) and with S (S-fold composition); ε decreases as the switch step grows (the private
//! steps form a shrinking tail: a sub-composition) and, for the EDM and flow schedules, as t_min
//! grows (larger levels, Σ 2Δt/t³ ≈ 1/t_min² − 1/t_max²). Each answer is re-checked at both
//! ends, so a non-monotone stretch cannot pass unnoticed at the boundary that is returned.

use serde::{Deserialize, Serialize};

use super::account::{account_mus, constant_plan, AccountantLine};
use super::sampler::{DensityConfig, SamplerConfig};
use super::schedule::Schedule;
use super::sweep::set_t_min;
use crate::accountants::AccountantKind;
use crate::error::{Error, Result};
use crate::numeric::format::fmt_num;

/// The sampler setting being solved for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SamplerParam {
    /// Smallest noise level t_min (EDM σ_min; flow matching s_min via t = s/(1 − s)).
    SigmaMin,
    /// Poisson subsampling rate p of the empirical denoiser.
    SampleRate,
    /// Number of generated samples S.
    Samples,
    /// Index of the first private step.
    SwitchStep,
    /// Clipping norm C (`clip`; `clip-norm` is still read).
    #[serde(rename = "clip", alias = "clip-norm")]
    ClipNorm,
}

impl SamplerParam {
    /// The name as users write it (`--solve-for`).
    pub fn as_str(self) -> &'static str {
        match self {
            SamplerParam::SigmaMin => "sigma-min",
            SamplerParam::SampleRate => "sample-rate",
            SamplerParam::Samples => "samples",
            SamplerParam::SwitchStep => "switch-step",
            SamplerParam::ClipNorm => "clip",
        }
    }
    /// True when ε grows with the parameter.
    fn increasing(self) -> bool {
        matches!(
            self,
            SamplerParam::SampleRate | SamplerParam::Samples | SamplerParam::ClipNorm
        )
    }
    fn integer(self) -> bool {
        matches!(self, SamplerParam::Samples | SamplerParam::SwitchStep)
    }
}

/// One evaluated setting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// The parameter value.
    pub value: f64,
    /// ε at the config's δ: the smallest sound ε (sound search) or the CLT estimate.
    pub epsilon: f64,
    /// The accountant line behind `epsilon`.
    pub line: AccountantLine,
}

/// The answer of one search.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Search {
    /// The setting that meets the target (re-analysed).
    pub meets: Probe,
    /// One resolution step past it, which does not meet the target (none when the domain ends:
    /// e.g. p = 1 or t_min at its limit already meets it).
    pub past: Option<Probe>,
    /// Analyses made.
    pub evaluations: usize,
}

/// The calibration of a sampler configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplerCalibration {
    /// What was solved for.
    pub param: SamplerParam,
    /// Target ε.
    pub target_epsilon: f64,
    /// δ of the config.
    pub delta: f64,
    /// The sound answer.
    pub sound: Search,
    /// The CLT's answer (an estimate, never a guarantee); none when it failed or is not needed
    /// (full batch: the CLT equals the exact GDP).
    pub clt: Option<Search>,
    /// Why the CLT answer is missing, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clt_note: Option<String>,
}

/// The configuration with `param` set to `x` (x is rounded for integer parameters).
pub fn with_param(cfg: &SamplerConfig, param: SamplerParam, x: f64) -> Result<SamplerConfig> {
    let mut c = cfg.clone();
    match param {
        SamplerParam::SigmaMin => set_t_min(&mut c, x)?,
        SamplerParam::SampleRate => c.privacy.subsample_rate = x,
        SamplerParam::Samples => c.privacy.samples = x as u64,
        SamplerParam::SwitchStep => {
            c.privacy.switch_step = Some(x as usize);
            c.privacy.switch_at = 0.0;
        }
        SamplerParam::ClipNorm => c.privacy.clip_norm = x,
    }
    c.validate()?;
    Ok(c)
}

/// ε of `cfg` at its δ: the smallest sound ε among `accountants` (sound search), or the CLT
/// estimate (`clt = true`). Configs without private steps cost ε = 0.
pub fn epsilon_of(cfg: &SamplerConfig, accountants: &[AccountantKind], clt: bool) -> Result<(f64, AccountantLine)> {
    let beta = match cfg.density {
        DensityConfig::Constant { beta } => beta,
        DensityConfig::Trajectories(_) => {
            return Err(Error::field(
                "density.kind",
                "calibration needs a constant density (a trajectory density depends on every setting)",
            ))
        }
    };
    let plan = constant_plan(cfg, beta)?;
    let mus = plan.private_mus();
    let p = cfg.privacy.subsample_rate;
    let s = cfg.privacy.samples;
    if mus.is_empty() {
        let line = AccountantLine {
            accountant: if clt { AccountantKind::Clt } else { AccountantKind::Gdp },
            kind: Some(crate::accountants::BoundKind::Exact),
            epsilon: Some(0.0),
            delta: cfg.delta,
            mu: Some(0.0),
            status: "ok".into(),
            note: Some("no private steps".into()),
            diagnostics: Vec::new(),
        };
        return Ok((0.0, line));
    }
    if let Some(bad) = mus.iter().find(|m| !(m.is_finite() && **m > 0.0)) {
        return Err(Error::numeric(format!("a private step has μ_t = {bad}")));
    }
    if clt {
        let line = account_mus(&mus, p, s, cfg.neighbouring, cfg.delta, &[AccountantKind::Clt])
            .pop()
            .ok_or_else(|| Error::numeric("clt gave no line"))?;
        return match line.epsilon {
            Some(e) => Ok((e, line)),
            None => Err(Error::unsupported(line.status.clone())),
        };
    }
    // Full batch: GDP is exact and the others cannot beat it; skip them.
    let accs: Vec<AccountantKind> = if p >= 1.0 && accountants.contains(&AccountantKind::Gdp) {
        vec![AccountantKind::Gdp]
    } else {
        accountants
            .iter()
            .copied()
            .filter(|a| *a != AccountantKind::Clt)
            .collect()
    };
    let lines = account_mus(&mus, p, s, cfg.neighbouring, cfg.delta, &accs);
    let best = lines
        .iter()
        .filter(|l| l.is_guarantee())
        .min_by(|a, b| a.epsilon.unwrap().total_cmp(&b.epsilon.unwrap()))
        .cloned()
        .ok_or_else(|| {
            let why: Vec<String> = lines
                .iter()
                .map(|l| format!("{}: {}", l.accountant.as_str(), l.status))
                .collect();
            Error::unsupported(format!("no sound accountant gave a bound ({})", why.join("; ")))
        })?;
    Ok((best.epsilon.unwrap(), best))
}

/// Value as a decimal `m × 10^e` parsed back, so that it prints without binary noise.
fn decimal(m: i64, e: i32) -> f64 {
    format!("{m}e{e}").parse().unwrap_or(m as f64 * 10f64.powi(e))
}

/// Limit on analyses per search.
const MAX_EVALUATIONS: usize = 400;

/// Solves for `param` so that ε(δ) ≤ `target` (see the module documentation).
pub fn calibrate_sampler(
    cfg: &SamplerConfig,
    param: SamplerParam,
    target: f64,
    accountants: &[AccountantKind],
) -> Result<SamplerCalibration> {
    calibrate_sampler_with(cfg, param, target, accountants, &|_| {})
}

/// [`calibrate_sampler`], calling `tick` with each value of `param` it evaluates (progress).
pub fn calibrate_sampler_with(
    cfg: &SamplerConfig,
    param: SamplerParam,
    target: f64,
    accountants: &[AccountantKind],
    tick: &dyn Fn(f64),
) -> Result<SamplerCalibration> {
    if !(target.is_finite() && target > 0.0) {
        return Err(Error::field(
            "--target-epsilon",
            format!("must be finite and > 0, got {target}"),
        ));
    }
    if param == SamplerParam::SigmaMin
        && matches!(
            cfg.schedule,
            Schedule::DdpmLinear { .. } | Schedule::DdpmScaledLinear { .. } | Schedule::DdpmCosine { .. }
        )
    {
        return Err(Error::field(
            "--solve-for",
            "a DDPM schedule's smallest level is fixed by its β schedule: solve for switch-step (or samples, sample-rate, clip) instead",
        ));
    }
    if param == SamplerParam::SwitchStep && cfg.privacy.private_steps.is_some() {
        return Err(Error::field(
            "--solve-for",
            "switch-step with privacy.private_steps set moves a fixed-size window, whose ε need not be monotone; remove private_steps",
        ));
    }
    let sound = search(cfg, param, target, accountants, false, tick)?;
    let (clt, clt_note) = if cfg.privacy.subsample_rate >= 1.0 && param != SamplerParam::SampleRate {
        (
            None,
            Some("full batch: the CLT equals the exact GDP answer".to_string()),
        )
    } else {
        match search(cfg, param, target, accountants, true, tick) {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(format!("clt: {}", e.message))),
        }
    };
    Ok(SamplerCalibration {
        param,
        target_epsilon: target,
        delta: cfg.delta,
        sound,
        clt,
        clt_note,
    })
}

fn search(
    cfg: &SamplerConfig,
    param: SamplerParam,
    target: f64,
    accountants: &[AccountantKind],
    clt: bool,
    tick: &dyn Fn(f64),
) -> Result<Search> {
    let mut evals = 0usize;
    let mut probe = |x: f64| -> Result<Probe> {
        evals += 1;
        tick(x);
        if evals > MAX_EVALUATIONS {
            return Err(Error::numeric(format!(
                "calibration did not converge within {MAX_EVALUATIONS} analyses"
            )));
        }
        let c = with_param(cfg, param, x).map_err(|e| e.with_field(param.as_str()))?;
        let (epsilon, line) = epsilon_of(&c, accountants, clt)?;
        Ok(Probe {
            value: x,
            epsilon,
            line,
        })
    };
    let ok = |p: &Probe| p.epsilon <= target;
    let inc = param.increasing();
    if param.integer() {
        // Integer domain: samples in [1, 2^40]; switch step in [0, n_steps].
        let (lo_dom, hi_dom) = match param {
            SamplerParam::Samples => (1u64, 1u64 << 40),
            _ => {
                let n = super::schedule::steps(&cfg.schedule.levels()?, cfg.convention).len() as u64;
                (0, n)
            }
        };
        // Find `good` (meets) and `bad` (does not) adjacent integers.
        let (good, bad) = if inc {
            let first = probe(lo_dom as f64)?;
            if !ok(&first) {
                return Err(Error::unsupported(format!(
                    "the target ε = {} is unreachable: even {} = {lo_dom} gives ε = {}",
                    fmt_num(target),
                    param.as_str(),
                    fmt_num(first.epsilon)
                )));
            }
            let (mut g, mut gp) = (lo_dom, first);
            let mut b = None;
            let mut step = 1u64;
            while b.is_none() {
                let x = (g + step).min(hi_dom);
                let p = probe(x as f64)?;
                if ok(&p) {
                    if x == hi_dom {
                        return Ok(Search {
                            meets: p,
                            past: None,
                            evaluations: evals,
                        });
                    }
                    g = x;
                    gp = p;
                    step = step.saturating_mul(2);
                } else {
                    b = Some((x, p));
                }
            }
            let (mut bx, mut bp) = b.unwrap();
            while bx - g > 1 {
                let m = g + (bx - g) / 2;
                let p = probe(m as f64)?;
                if ok(&p) {
                    g = m;
                    gp = p;
                } else {
                    bx = m;
                    bp = p;
                }
            }
            (gp, bp)
        } else {
            // ε decreasing in the switch step: the smallest step that meets the target.
            let last = probe(hi_dom as f64)?;
            if !ok(&last) {
                return Err(Error::unsupported(format!(
                    "the target ε = {} is unreachable: even {} = {hi_dom} gives ε = {}",
                    fmt_num(target),
                    param.as_str(),
                    fmt_num(last.epsilon)
                )));
            }
            let first = probe(lo_dom as f64)?;
            if ok(&first) {
                return Ok(Search {
                    meets: first,
                    past: None,
                    evaluations: evals,
                });
            }
            let (mut bx, mut bp, mut gx, mut gp) = (lo_dom, first, hi_dom, last);
            while gx - bx > 1 {
                let m = bx + (gx - bx) / 2;
                let p = probe(m as f64)?;
                if ok(&p) {
                    gx = m;
                    gp = p;
                } else {
                    bx = m;
                    bp = p;
                }
            }
            (gp, bp)
        };
        return Ok(Search {
            meets: good,
            past: Some(bad),
            evaluations: evals,
        });
    }
    // Continuous parameters: bracket in log space, then bisect on a decimal grid with 6
    // significant digits so the answer prints cleanly and "one step past" is well defined.
    let (dom_lo, dom_hi) = match (param, &cfg.schedule) {
        (SamplerParam::SampleRate, _) => (1e-12, 1.0),
        (SamplerParam::ClipNorm, _) => (1e-300, 1e300),
        (SamplerParam::SigmaMin, Schedule::Edm { sigma_max, .. }) => (1e-12, *sigma_max),
        // t_min = s_min/(1 − s_min) below t_max = s_max/(1 − s_max).
        (SamplerParam::SigmaMin, Schedule::FlowMatching { s_max, .. }) => (1e-12, s_max / (1.0 - s_max)),
        _ => return Err(Error::field("--solve-for", "not available for this schedule")),
    };
    let start = match param {
        SamplerParam::SampleRate => cfg.privacy.subsample_rate,
        SamplerParam::ClipNorm => cfg.privacy.clip_norm,
        _ => match &cfg.schedule {
            Schedule::Edm { sigma_min, .. } => *sigma_min,
            Schedule::FlowMatching { s_min, .. } => s_min / (1.0 - s_min),
            _ => unreachable!("checked above"),
        },
    };
    // Points inside the open domain (σ_min must stay below σ_max).
    let inside = |x: f64| {
        x.clamp(
            dom_lo,
            if param == SamplerParam::SigmaMin {
                dom_hi * (1.0 - 1e-9)
            } else {
                dom_hi
            },
        )
    };
    let mut x = inside(start);
    let mut p = probe(x)?;
    // Walk toward the boundary by factors of 4 until the target is bracketed.
    let (mut good, mut bad);
    if ok(&p) {
        good = p;
        loop {
            let nx = inside(if inc { x * 4.0 } else { x / 4.0 });
            if nx == x {
                return Ok(Search {
                    meets: good,
                    past: None,
                    evaluations: evals,
                });
            }
            x = nx;
            p = probe(x)?;
            if ok(&p) {
                good = p;
            } else {
                bad = p;
                break;
            }
        }
    } else {
        bad = p;
        loop {
            let nx = inside(if inc { x / 4.0 } else { x * 4.0 });
            if nx == x {
                return Err(Error::unsupported(format!(
                    "the target ε = {} is unreachable: even {} = {} gives ε = {}",
                    fmt_num(target),
                    param.as_str(),
                    fmt_num(x),
                    fmt_num(bad.epsilon)
                )));
            }
            x = nx;
            p = probe(x)?;
            if ok(&p) {
                good = p;
                break;
            }
            bad = p;
        }
    }
    // Log-space bisection to a relative width of 1e-4.
    while (good.value / bad.value).ln().abs() > 1e-4 {
        let m = (good.value * bad.value).sqrt();
        let p = probe(m)?;
        if ok(&p) {
            good = p;
        } else {
            bad = p;
        }
    }
    // Decimal grid: unit u = 10^e with 6 significant digits at the smaller end.
    let e = good.value.min(bad.value).log10().floor() as i32 - 5;
    let u = 10f64.powi(e);
    // The largest grid point inside the domain (σ_min stays below σ_max; p ≤ 1).
    let top = (inside(dom_hi) / u).floor() as i64;
    let (mut gm, mut bm) = if inc {
        (
            (good.value / u).floor() as i64,
            ((bad.value / u).ceil() as i64).min(top),
        )
    } else {
        (
            ((good.value / u).ceil() as i64).min(top),
            (bad.value / u).floor() as i64,
        )
    };
    // The rounded ends must still be on their sides; re-probe them.
    let mut gp = probe(decimal(gm, e))?;
    while !ok(&gp) {
        gm += if inc { -1 } else { 1 };
        if gm <= 0 {
            return Err(Error::numeric("calibration lost its bracket"));
        }
        gp = probe(decimal(gm, e))?;
    }
    let mut bp = probe(decimal(bm, e))?;
    while ok(&bp) {
        gm = bm;
        gp = bp;
        bm += if inc { 1 } else { -1 };
        if bm <= 0 || bm > top {
            return Err(Error::numeric("calibration lost its bracket"));
        }
        bp = probe(decimal(bm, e))?;
    }
    while (bm - gm).abs() > 1 {
        let m = gm + (bm - gm) / 2;
        let p = probe(decimal(m, e))?;
        if ok(&p) {
            gm = m;
            gp = p;
        } else {
            bm = m;
            bp = p;
        }
    }
    Ok(Search {
        meets: gp,
        past: Some(bp),
        evaluations: evals,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const EDM: &str = r#"
schema_version = 1
sampler = "edm-heun"
delta = 1e-5
[schedule]
kind = "edm"
sigma_min = 0.002
sigma_max = 80.0
rho = 7.0
levels = 50
[privacy]
clip_norm = 1.0
dataset_size = 50000
samples = 1
[density]
kind = "constant"
beta = 1.0
"#;

    #[test]
    fn sigma_min_meets_the_target_and_one_step_below_does_not() {
        let cfg = SamplerConfig::from_toml_str(EDM).unwrap();
        let c = calibrate_sampler(&cfg, SamplerParam::SigmaMin, 1.0, &[AccountantKind::Gdp]).unwrap();
        let past = c.sound.past.clone().unwrap();
        assert!(c.sound.meets.epsilon <= 1.0 && past.epsilon > 1.0);
        assert!(past.value < c.sound.meets.value);
        // Re-analysed independently.
        let (e, _) = epsilon_of(
            &with_param(&cfg, SamplerParam::SigmaMin, c.sound.meets.value).unwrap(),
            &[AccountantKind::Gdp],
            false,
        )
        .unwrap();
        assert!(e <= 1.0);
        // The step is one unit in the 6th significant digit.
        assert!((c.sound.meets.value - past.value) / c.sound.meets.value < 2e-5);
    }

    #[test]
    fn samples_meet_and_one_more_does_not() {
        let src = EDM.replace("sigma_min = 0.002", "sigma_min = 5.0");
        let cfg = SamplerConfig::from_toml_str(&src).unwrap();
        let c = calibrate_sampler(&cfg, SamplerParam::Samples, 2.0, &[AccountantKind::Gdp]).unwrap();
        let past = c.sound.past.unwrap();
        assert_eq!(past.value, c.sound.meets.value + 1.0);
        assert!(c.sound.meets.epsilon <= 2.0 && past.epsilon > 2.0);
    }
}
