//! From a sampler configuration to per-step μ_t, a [`DpEvent`], and (ε, δ) from each
//! accountant, with the CLT's validity checks and the critical-window view.
//!
//! Full batch: the private steps are μ_t-GDP (§3.1) and compose exactly (§3.2, DRS Cor. 3.3),
//! S samples compose S times. Subsampled at rate p (§4): each private step is the Poisson
//! subsampled Gaussian C_p(G_{μ_t}); the paper uses the GDP CLT (DRS Thm 3.5, App. A), which is an
//! **estimate**; dpaudit prints it next to the PLD and RDP upper bounds.

use serde::{Deserialize, Serialize};

#[cfg(feature = "models")]
use super::denoiser::{sample, ClipSpec, Dataset, EmpiricalDenoiser, SamplerOptions};
#[cfg(feature = "models")]
use super::sampler::ClipScale;
use super::sampler::{DensityConfig, SamplerConfig, TrajectoryConfig};
use super::schedule::{steps as make_steps, Convention, Step};
#[cfg(feature = "models")]
use super::sensitivity::log_mu;
use super::sensitivity::{mu_constant, roles, StepRole};
use crate::accountants::sound::Evidence;
use crate::accountants::{gdp, AccountantKind, BoundKind, Diagnostic};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventBuilder, Neighbouring};
#[cfg(feature = "models")]
use crate::limits;
use crate::numeric;

/// One step of the analysis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRow {
    /// Step number, from 0.
    pub index: usize,
    /// Noise level the step starts at.
    pub t_from: f64,
    /// Noise level the step ends at.
    pub t_to: f64,
    /// t in the formula (per the convention).
    pub t: f64,
    /// Δt of the step (per the convention).
    pub dt: f64,
    /// Whether the step is private, public or skipped.
    pub role: StepRole,
    /// μ_t of this step if run privately (trajectory density: the maximum over trajectories).
    pub mu: f64,
    /// Trajectory density only: min / median / max of μ_t across trajectories.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mu_min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Median μ_t across trajectories (trajectory density only).
    pub mu_median: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Largest μ_t across trajectories (trajectory density only).
    pub mu_max: Option<f64>,
    /// Full-batch GDP μ of the private steps up to and including this one, for one sample.
    pub cumulative_mu: f64,
}

/// Per-step μ_t for a configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Step convention used.
    pub convention: Convention,
    /// The steps, first to last.
    pub steps: Vec<StepRow>,
    /// |D|, the number of records.
    pub dataset_size: u64,
    /// How p_t(x_t) was obtained.
    pub density: String,
}

impl Plan {
    /// μ_t of the private steps, in generation order.
    pub fn private_mus(&self) -> Vec<f64> {
        self.steps
            .iter()
            .filter(|s| s.role == StepRole::Private)
            .map(|s| s.mu)
            .collect()
    }
}

/// |D|, the steps, their roles and μ_t of every step.
type ConstantSteps = (u64, Vec<Step>, Vec<StepRole>, Vec<f64>);

/// |D|, the steps, their roles and μ_t = 2C/(β|D|)·√(2Δt/t³) of every step for a constant
/// density β (§3.1, [`mu_constant`]).
fn constant_steps(cfg: &SamplerConfig, beta: f64) -> Result<ConstantSteps> {
    let n = cfg
        .privacy
        .dataset_size
        .ok_or_else(|| Error::field("privacy.dataset_size", "|D| is required with a constant density"))?;
    let levels = cfg.schedule.levels().map_err(|e| e.with_field("schedule"))?;
    let steps = make_steps(&levels, cfg.convention);
    let roles = roles(&steps, &cfg.privacy);
    let mus: Vec<f64> = steps
        .iter()
        .map(|s| mu_constant(cfg.privacy.clip_norm, beta, n as f64, s.t, s.dt))
        .collect();
    Ok((n, steps, roles, mus))
}

/// What a sweep point needs of [`constant_plan`], without its step rows or description: |D|,
/// μ_t = 2C/(β|D|)·√(2Δt/t³) of the private steps in generation order (§3.1, the same numbers
/// as [`Plan::private_mus`]), and the smallest level > 0 a step that runs reaches (after an early
/// stop; ∞ if none).
pub(crate) fn constant_private_mus(cfg: &SamplerConfig, beta: f64) -> Result<(u64, Vec<f64>, f64)> {
    let (n, steps, roles, mus) = constant_steps(cfg, beta)?;
    let t_min = steps
        .iter()
        .zip(&roles)
        .filter(|(_, r)| **r != StepRole::Skipped)
        .map(|(s, _)| s.t_to)
        .filter(|t| *t > 0.0)
        .fold(f64::INFINITY, f64::min);
    let private = mus
        .iter()
        .zip(&roles)
        .filter(|(_, r)| **r == StepRole::Private)
        .map(|(m, _)| *m)
        .collect();
    Ok((n, private, t_min))
}

/// Per-step μ_t with a constant density β (no allocation beyond the step list).
pub fn constant_plan(cfg: &SamplerConfig, beta: f64) -> Result<Plan> {
    let (n, steps, roles, mus) = constant_steps(cfg, beta)?;
    Ok(Plan {
        convention: cfg.convention,
        steps: rows(&steps, &roles, &mus, None),
        dataset_size: n,
        density: format!(
            "constant β = {}; 2C/(β|D|) = {}",
            crate::report::num::sig6(beta),
            crate::report::num::sig6(2.0 * cfg.privacy.clip_norm / (beta * n as f64))
        ),
    })
}

fn rows(steps: &[Step], roles: &[StepRole], mus: &[f64], spread: Option<&[(f64, f64, f64)]>) -> Vec<StepRow> {
    let mut acc = 0.0f64;
    steps
        .iter()
        .zip(roles)
        .zip(mus)
        .enumerate()
        .map(|(i, ((s, r), mu))| {
            if *r == StepRole::Private {
                acc += mu * mu;
            }
            StepRow {
                index: s.index,
                t_from: s.t_from,
                t_to: s.t_to,
                t: s.t,
                dt: s.dt,
                role: *r,
                mu: *mu,
                mu_min: spread.map(|v| v[i].0),
                mu_median: spread.map(|v| v[i].1),
                mu_max: spread.map(|v| v[i].2),
                cumulative_mu: acc.sqrt(),
            }
        })
        .collect()
}

/// Per-step μ_t for the configuration: constant β, or p_t(x_t) along `trajectories` real
/// trajectories of the (clipped) empirical denoiser on the data file, in log space. The μ_t used
/// for accounting is the maximum over trajectories.
pub fn plan(cfg: &SamplerConfig) -> Result<Plan> {
    match &cfg.density {
        DensityConfig::Constant { beta } => constant_plan(cfg, *beta),
        DensityConfig::Trajectories(tc) => trajectory_plan(cfg, tc),
    }
}

/// [`plan`] for `density = trajectories`: p_t(x_t) along real trajectories of the (clipped)
/// empirical denoiser, which runs in candle (the `models` feature).
#[cfg(feature = "models")]
fn trajectory_plan(cfg: &SamplerConfig, tc: &TrajectoryConfig) -> Result<Plan> {
    let path = cfg.resolve(&tc.data);
    let data = Dataset::load_csv(&path, tc.columns, tc.value_range, tc.max_rows).map_err(|e| {
        if e.kind == crate::error::ErrorKind::Io {
            Error::field("density.data", format!("cannot read {}: {}", path.display(), e.message))
        } else {
            e
        }
    })?;
    if let Some(n) = cfg.privacy.dataset_size {
        if n as usize != data.n {
            return Err(Error::field(
                "privacy.dataset_size",
                format!("|D| = {n} but {} has {} rows", path.display(), data.n),
            ));
        }
    }
    let levels = cfg.schedule.levels().map_err(|e| e.with_field("schedule"))?;
    let steps = make_steps(&levels, cfg.convention);
    let roles = roles(&steps, &cfg.privacy);
    let clip = match cfg.privacy.clip_scale {
        ClipScale::Absolute => ClipSpec::Absolute {
            c: cfg.privacy.clip_norm,
        },
        ClipScale::TypicalDensity => ClipSpec::TypicalDensity {
            c: cfg.privacy.clip_norm,
        },
    };
    // Before any trajectory is allocated: the B × N distance/weight matrices must fit
    // the memory cap, and B × N × d × steps the work cap.
    let traj = tc.trajectories as u64;
    limits::check_product("density.trajectories", &[traj, data.n as u64], limits::DENOISER_CELL)
        .and_then(|_| {
            limits::check_product(
                "density.trajectories",
                &[traj, data.n as u64, data.d as u64, steps.len() as u64],
                limits::DENOISER_STEP,
            )
        })
        .map_err(|e| {
            let mut e = e;
            e.message = format!(
                "{} trajectories over {} records of dimension {} and {} steps: {}",
                tc.trajectories,
                data.n,
                data.d,
                steps.len(),
                e.message
            );
            e
        })?;
    let den = EmpiricalDenoiser::new(&data, candle_core::DType::F64, &candle_core::Device::Cpu)?;
    // Trajectories of the full-batch, clipped empirical denoiser; public steps are run
    // by the empirical denoiser too (no public model here), their μ is not accounted.
    let run = sample(
        &den,
        &steps,
        SamplerOptions {
            trajectories: tc.trajectories,
            seed: tc.seed,
            subsample_rate: 1.0,
            clip: Some(clip),
        },
    )?;
    let n = data.n as f64;
    let mut mus = Vec::with_capacity(steps.len());
    let mut spread = Vec::with_capacity(steps.len());
    for (s, lp) in steps.iter().zip(&run.log_density) {
        let lc = clip.log_c(s.t, data.d);
        let mut v: Vec<f64> = lp.iter().map(|l| log_mu(lc, *l, n, s.t, s.dt).exp()).collect();
        v.sort_by(|a, b| a.total_cmp(b));
        let med = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            0.5 * (v[v.len() / 2 - 1] + v[v.len() / 2])
        };
        let (lo, hi) = (v[0], v[v.len() - 1]);
        mus.push(hi);
        spread.push((lo, med, hi));
    }
    Ok(Plan {
        convention: cfg.convention,
        steps: rows(&steps, &roles, &mus, Some(&spread)),
        dataset_size: data.n as u64,
        density: format!(
            "p_t(x_t) along {} trajectories of the empirical denoiser on {} ({} × {}, seed {}); μ_t accounted = max over trajectories",
            tc.trajectories,
            tc.data.display(),
            data.n,
            data.d,
            tc.seed
        ),
    })
}

/// [`plan`] for `density = trajectories` in a build without the `models` feature (the Python
/// extension): the empirical denoiser runs in candle, which this build does not hold.
#[cfg(not(feature = "models"))]
fn trajectory_plan(_cfg: &SamplerConfig, _tc: &TrajectoryConfig) -> Result<Plan> {
    Err(Error::field(
        "density",
        "trajectories of the empirical denoiser need dpaudit built with its `models` feature (the `dpaudit` command has it; the Python extension is built without candle): run `dpaudit analyze` on this config, or give `[density] kind = \"constant\"`",
    ))
}

/// The event of one sampler run: private steps in order (Poisson-subsampled at rate p < 1),
/// all composed `samples` times.
pub(crate) fn event_from_mus(private_mus: &[f64], subsample_rate: f64, samples: u64) -> DpEvent {
    let mut b = EventBuilder::new();
    for &mu in private_mus {
        let g = DpEvent::gdp(mu);
        b.push(if subsample_rate < 1.0 {
            DpEvent::poisson(subsample_rate, g)
        } else {
            g
        });
    }
    let one = b.build();
    if samples == 1 || one == DpEvent::NoOp {
        one
    } else {
        DpEvent::repeat(one, samples)
    }
}

/// What `dpaudit check` (and anyone else) needs to account a sampler configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplerAccounting {
    /// The event to account.
    pub event: DpEvent,
    /// The neighbouring relation.
    pub neighbouring: Neighbouring,
    /// δ of the configuration.
    pub delta: f64,
    /// Step convention used.
    pub convention: Convention,
}

/// Accounts a sampler configuration: the [`DpEvent`] of all private steps over all samples, the
/// neighbouring relation and δ of the config. Library entry point for `dpaudit check`.
pub fn sampler_accounting(cfg: &SamplerConfig) -> Result<SamplerAccounting> {
    let p = plan(cfg)?;
    let mus = p.private_mus();
    if let Some(bad) = mus.iter().find(|m| !(m.is_finite() && **m > 0.0)) {
        return Err(Error::numeric(format!(
            "a private step has μ_t = {bad}: the density/clip setting gives no finite per-step privacy"
        )));
    }
    Ok(SamplerAccounting {
        event: event_from_mus(&mus, cfg.privacy.subsample_rate, cfg.privacy.samples),
        neighbouring: cfg.neighbouring,
        delta: cfg.delta,
        convention: cfg.convention,
    })
}

/// Whether an accountant's line gives a usable number: the state of the line, never a verdict
/// (verdicts are [`crate::accountants::sound::Verdict`]). Written as the strings `ok`,
/// `not a guarantee: <codes>`, `data-dependent: not a DP guarantee`, `unavailable: <reason>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineStatus {
    /// The number stands (of the line's kind).
    Ok,
    /// A CLT estimate whose validity conditions fail: the severe diagnostics' codes.
    NotAGuarantee(Vec<String>),
    /// Computed from μ_t measured on the private data: describes this dataset only.
    DataDependent,
    /// The accountant gave no number, with the reason.
    Unavailable(String),
}

impl std::fmt::Display for LineStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LineStatus::Ok => f.write_str("ok"),
            LineStatus::NotAGuarantee(codes) => write!(f, "not a guarantee: {}", codes.join(", ")),
            LineStatus::DataDependent => f.write_str("data-dependent: not a DP guarantee"),
            LineStatus::Unavailable(reason) => write!(f, "unavailable: {reason}"),
        }
    }
}

impl Serialize for LineStatus {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LineStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "ok" => LineStatus::Ok,
            "data-dependent: not a DP guarantee" => LineStatus::DataDependent,
            _ => match (s.strip_prefix("not a guarantee: "), s.strip_prefix("unavailable: ")) {
                (Some(codes), _) => LineStatus::NotAGuarantee(codes.split(", ").map(String::from).collect()),
                (_, Some(reason)) => LineStatus::Unavailable(reason.to_string()),
                _ => {
                    return Err(serde::de::Error::custom(format!(
                        "unknown accountant line status `{s}`"
                    )))
                }
            },
        })
    }
}

/// One accountant's line in an output: a view over the one ε record ([`Evidence`]: ε, δ, kind,
/// the μ behind it, a note) with whether it stands ([`LineStatus`]) and the accountant's
/// diagnostics. No record when the accountant is unavailable.
///
/// JSON keeps the flat line (`accountant`, `kind`, `epsilon`, `delta`, `mu`, `status`, `note`,
/// `diagnostics`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "LineRow", into = "LineRow")]
pub struct AccountantLine {
    /// Which accountant.
    pub accountant: AccountantKind,
    /// δ of the line.
    pub delta: f64,
    /// The number (ε at `delta`, its kind, μ, note); None when the accountant is unavailable.
    pub evidence: Option<Evidence>,
    /// Whether the line's number stands (`ok`, `not a guarantee: …`, `data-dependent: …`,
    /// `unavailable: <reason>` in output).
    pub status: LineStatus,
    /// Diagnostics of the accountant's answer.
    pub diagnostics: Vec<Diagnostic>,
}

/// The JSON shape of an [`AccountantLine`] (flat, as outputs have always written it).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LineRow {
    accountant: AccountantKind,
    kind: Option<BoundKind>,
    epsilon: Option<f64>,
    delta: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mu: Option<f64>,
    status: LineStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    diagnostics: Vec<Diagnostic>,
}

impl From<AccountantLine> for LineRow {
    fn from(l: AccountantLine) -> Self {
        LineRow {
            accountant: l.accountant,
            kind: l.kind(),
            epsilon: l.epsilon(),
            delta: l.delta,
            mu: l.mu(),
            note: l.note().map(String::from),
            status: l.status,
            diagnostics: l.diagnostics,
        }
    }
}

impl From<LineRow> for AccountantLine {
    /// A line read back: an ε is the record (an ε without a kind reads as an estimate).
    fn from(r: LineRow) -> Self {
        let evidence = r.epsilon.map(|eps| {
            let mut e = Evidence::of(r.accountant, eps, r.delta, r.kind.unwrap_or(BoundKind::Estimate));
            e.set_mu(r.mu);
            e.note = r.note.unwrap_or_default();
            e
        });
        AccountantLine {
            accountant: r.accountant,
            delta: r.delta,
            evidence,
            status: r.status,
            diagnostics: r.diagnostics,
        }
    }
}

impl AccountantLine {
    fn unavailable(a: AccountantKind, delta: f64, reason: impl std::fmt::Display) -> Self {
        AccountantLine {
            accountant: a,
            delta,
            evidence: None,
            status: LineStatus::Unavailable(reason.to_string()),
            diagnostics: Vec::new(),
        }
    }
    /// A standing line with ε of `kind` at `delta` and the μ behind it.
    pub(crate) fn number(
        a: AccountantKind,
        epsilon: f64,
        delta: f64,
        kind: BoundKind,
        mu: Option<f64>,
        diagnostics: Vec<Diagnostic>,
    ) -> Self {
        let mut e = Evidence::of(a, epsilon, delta, kind);
        e.set_mu(mu);
        AccountantLine {
            accountant: a,
            delta,
            evidence: Some(e),
            status: LineStatus::Ok,
            diagnostics,
        }
    }
    /// The line of accountant `a`'s answer, labelled with the accountant that computed it (a PLD
    /// that fell back names RDP); the answer's diagnostics become the line's.
    fn from_result(a: AccountantKind, mut r: Evidence) -> Self {
        let diagnostics = std::mem::take(&mut r.diagnostics);
        AccountantLine {
            accountant: r.accountant.unwrap_or(a),
            delta: r.delta,
            evidence: Some(r),
            status: LineStatus::Ok,
            diagnostics,
        }
    }
    /// ε at `delta`; None when unavailable.
    pub fn epsilon(&self) -> Option<f64> {
        self.evidence.as_ref().map(|e| e.epsilon)
    }
    /// The kind of the number; None when unavailable.
    pub fn kind(&self) -> Option<BoundKind> {
        self.evidence.as_ref().map(|e| e.kind)
    }
    /// The μ behind the number (GDP μ, CLT μ) when there is one.
    pub fn mu(&self) -> Option<f64> {
        self.evidence.as_ref().and_then(Evidence::mu)
    }
    /// Extra explanation shown with the line.
    pub fn note(&self) -> Option<&str> {
        self.evidence
            .as_ref()
            .map(|e| e.note.as_str())
            .filter(|n| !n.is_empty())
    }
    /// Relabels the number (no effect on a line without one).
    fn relabel(&mut self, kind: BoundKind, note: Option<&str>) {
        if let Some(e) = self.evidence.as_mut() {
            e.kind = kind;
            if let Some(n) = note {
                e.note = n.to_string();
            }
        }
    }
    /// True when the line can be used as a guarantee.
    pub(crate) fn is_guarantee(&self) -> bool {
        self.status == LineStatus::Ok && self.kind().is_some_and(|k| k.is_sound())
    }
}

/// The note of a full-batch GDP line labelled for subsampling.
const NO_AMPLIFICATION_NOTE: &str = "full-batch μ: ignores the amplification by subsampling";

/// Composed full-batch μ of `mus` repeated `samples` times (DRS Cor. 3.3).
pub fn full_batch_mu(mus: &[f64], samples: u64) -> f64 {
    (samples as f64 * mus.iter().map(|m| m * m).sum::<f64>()).sqrt()
}

/// The GDP line: exact at p = 1; at p < 1 the full-batch μ is still a sound upper bound
/// (subsampling only adds privacy: C_p(G_μ) ≥ G_μ), labelled as such.
pub fn gdp_line(mus: &[f64], p: f64, samples: u64, nb: Neighbouring, delta: f64) -> AccountantLine {
    let ev = event_from_mus(mus, 1.0, samples);
    match AccountantKind::Gdp.build().epsilon(&ev, nb, delta) {
        Ok(r) => {
            let mut l = AccountantLine::from_result(AccountantKind::Gdp, r);
            if let Some(e) = l.evidence.as_mut().filter(|e| e.mu().is_none()) {
                e.set_mu(Some(full_batch_mu(mus, samples)));
            }
            if p < 1.0 {
                l.relabel(BoundKind::UpperBound, Some(NO_AMPLIFICATION_NOTE));
            }
            l
        }
        Err(e) => AccountantLine::unavailable(AccountantKind::Gdp, delta, e),
    }
}

/// The same GDP line as [`gdp_line`] without building an event tree (sweeps): μ² summed as the
/// GDP accountant sums it (count / noise_multiplier², DRS Cor. 3.3), ε from the exact μ-GDP curve.
/// The number does not depend on p (the full-batch μ, DRS Cor. 3.3): it is
/// [`gdp_full_batch_line_fast`] labelled for p by [`gdp_line_at_rate`], which sweeps call apart to
/// compute ε once for every rate.
pub fn gdp_line_fast(mus: &[f64], p: f64, samples: u64, delta: f64) -> AccountantLine {
    gdp_line_at_rate(gdp_full_batch_line_fast(mus, samples, delta), p)
}

/// A full-batch GDP line (p = 1) labelled for subsampling rate p: at p < 1 the full-batch μ is
/// still a sound upper bound (subsampling only adds privacy: C_p(G_μ) ≥ G_μ), labelled as such,
/// exactly as [`gdp_line`] labels it. Lines without a number are unchanged.
pub fn gdp_line_at_rate(mut l: AccountantLine, p: f64) -> AccountantLine {
    if p < 1.0 {
        l.relabel(BoundKind::UpperBound, Some(NO_AMPLIFICATION_NOTE));
    }
    l
}

/// [`gdp_line_fast`] at p = 1: μ = √(S·Σμ_t²) summed as the GDP accountant sums it
/// (count / noise_multiplier², DRS Cor. 3.3), ε from the exact μ-GDP curve (DRS Cor. 2.13);
/// invalid μ_t or δ go through the accountant ([`gdp_line`]) for its error.
pub fn gdp_full_batch_line_fast(mus: &[f64], samples: u64, delta: f64) -> AccountantLine {
    if mus.iter().any(|m| !(m.is_finite() && *m > 0.0)) || crate::accountants::check_delta(delta).is_err() {
        return gdp_line(mus, 1.0, samples, Neighbouring::AddRemove, delta);
    }
    let count = samples as f64;
    let mu = mus
        .iter()
        .map(|&m| {
            let nm = 1.0 / m;
            count / (nm * nm)
        })
        .sum::<f64>()
        .sqrt();
    match crate::accountants::gdp::epsilon_for_delta(mu, delta) {
        Ok(eps) => AccountantLine::number(AccountantKind::Gdp, eps, delta, BoundKind::Exact, Some(mu), Vec::new()),
        Err(e) => AccountantLine::unavailable(AccountantKind::Gdp, delta, e),
    }
}

/// ε from the CLT (DRS Thm 3.5 on C_p(G_{μ_t}), App. A) through the accountant trait: an
/// estimate whenever a step is subsampled (all full batch: the exact GDP value).
pub fn clt_line(mus: &[f64], p: f64, samples: u64, nb: Neighbouring, delta: f64) -> AccountantLine {
    if p >= 1.0 {
        // Nothing is subsampled: the CLT has nothing to approximate, and its number would be the
        // exact GDP value of the gdp row (never shown as a "clt exact" number).
        return AccountantLine::unavailable(
            AccountantKind::Clt,
            delta,
            "full batch: nothing is subsampled; the exact value is the gdp row",
        );
    }
    let ev = event_from_mus(mus, p, samples);
    let line = match AccountantKind::Clt.build().epsilon(&ev, nb, delta) {
        Ok(r) => AccountantLine::from_result(AccountantKind::Clt, r),
        Err(e) => AccountantLine::unavailable(AccountantKind::Clt, delta, e),
    };
    finish_clt(line, mus, p, samples, delta)
}

/// The same CLT number through the accountant's fast path (`clt::clt_summary` on the per-step
/// list, no event tree), for sweeps. Agrees with [`clt_line`] (tested).
pub(crate) fn clt_line_fast(mus: &[f64], p: f64, samples: u64, nb: Neighbouring, delta: f64) -> AccountantLine {
    use crate::accountants::clt;
    if p >= 1.0 || nb == Neighbouring::ReplaceOne {
        return clt_line(mus, p, samples, nb, delta);
    }
    let steps: Vec<(f64, f64, u64)> = mus.iter().map(|&m| (p, m, samples)).collect();
    let line = match clt::clt_summary(&steps).and_then(|s| s.epsilon(delta).map(|e| (s, e))) {
        Ok((s, eps)) => {
            let mut diagnostics = s.diagnostics.clone();
            if let Some(d) = clt::blatant_diagnostic(&steps, eps, delta) {
                diagnostics.push(d);
            }
            AccountantLine::number(
                AccountantKind::Clt,
                eps,
                delta,
                BoundKind::Estimate,
                Some(s.mu),
                diagnostics,
            )
        }
        Err(e) => AccountantLine::unavailable(AccountantKind::Clt, delta, e),
    };
    finish_clt(line, mus, p, samples, delta)
}

/// Labels a CLT line: an estimate when subsampled; dpaudit's own validity checks are added for
/// the conditions the accountant did not already report; any severe diagnostic turns the status
/// into "not a guarantee: <codes>".
fn finish_clt(mut line: AccountantLine, mus: &[f64], p: f64, samples: u64, delta: f64) -> AccountantLine {
    if p < 1.0 {
        line.relabel(BoundKind::Estimate, None);
    }
    for d in clt_validity(mus, p, samples, delta, line.epsilon()) {
        if !line.diagnostics.iter().any(|x| x.code == d.code) {
            line.diagnostics.push(d);
        }
    }
    if line.status == LineStatus::Ok {
        let mut codes: Vec<String> = Vec::new();
        for d in line.diagnostics.iter().filter(|d| d.severe) {
            if !codes.contains(&d.code) {
                codes.push(d.code.clone());
            }
        }
        if !codes.is_empty() {
            line.status = LineStatus::NotAGuarantee(codes);
        }
    }
    line
}

/// A bound-giving accountant (PLD, RDP) through the trait.
pub fn bound_line(
    a: AccountantKind,
    mus: &[f64],
    p: f64,
    samples: u64,
    nb: Neighbouring,
    delta: f64,
) -> AccountantLine {
    let ev = event_from_mus(mus, p, samples);
    match a.build().epsilon(&ev, nb, delta) {
        Ok(r) => AccountantLine::from_result(a, r),
        Err(e) => AccountantLine::unavailable(a, delta, e),
    }
}

/// Lines for the requested accountants.
pub fn account_mus(
    mus: &[f64],
    p: f64,
    samples: u64,
    nb: Neighbouring,
    delta: f64,
    accountants: &[AccountantKind],
) -> Vec<AccountantLine> {
    account_mus_with(mus, p, samples, nb, delta, accountants, false)
}

/// As [`account_mus`]; `fast` takes the CLT's per-step fast path (sweeps).
pub fn account_mus_with(
    mus: &[f64],
    p: f64,
    samples: u64,
    nb: Neighbouring,
    delta: f64,
    accountants: &[AccountantKind],
    fast: bool,
) -> Vec<AccountantLine> {
    accountants
        .iter()
        .map(|&a| account_one(a, mus, p, samples, nb, delta, accountants, fast))
        .collect()
}

/// The line of accountant `a`, one of the requested `accountants` (as [`account_mus_with`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn account_one(
    a: AccountantKind,
    mus: &[f64],
    p: f64,
    samples: u64,
    nb: Neighbouring,
    delta: f64,
    accountants: &[AccountantKind],
    fast: bool,
) -> AccountantLine {
    match a {
        AccountantKind::Gdp if fast => gdp_line_fast(mus, p, samples, delta),
        AccountantKind::Gdp => gdp_line(mus, p, samples, nb, delta),
        AccountantKind::Clt if fast => clt_line_fast(mus, p, samples, nb, delta),
        AccountantKind::Clt => clt_line(mus, p, samples, nb, delta),
        other => {
            let l = bound_line(other, mus, p, samples, nb, delta);
            // A PLD that certified nothing answers with the RDP bound, labelled `rdp`: when an
            // rdp row is shown anyway, the pld row says why it has no number instead.
            if other == AccountantKind::Pld && l.accountant != other && accountants.contains(&l.accountant) {
                let why = l
                    .diagnostics
                    .iter()
                    .find(|d| d.code == "pld_fallback_rdp")
                    .map_or_else(|| "no finite ε certified".to_string(), |d| d.message.clone());
                AccountantLine::unavailable(other, delta, why)
            } else {
                l
            }
        }
    }
}

/// μ at which one μ-GDP step is "nearly blatant": G_μ(δ) ≤ δ, i.e. μ ≥ 2Φ⁻¹(1 − δ): a test
/// with both error rates ≤ δ exists (DRS Def. 2.5).
pub(crate) fn blatant_mu(delta: f64) -> f64 {
    2.0 * numeric::ndtri_sf(delta)
}

/// A rigorous lower bound on δ(ε) of the composition of `m` Poisson(p)-subsampled μ-GDP steps
/// (each with μ ≥ `mu`): for the event A = {some step's output > τ},
/// δ(ε) ≥ P₁(A) − e^ε P₀(A) ≥ 1 − (1 − pΦ(μ − τ))^m − e^ε(1 − Φ(τ)^m), maximised over τ
/// (the dominating pair of C_p(G_μ), DRS §4.1; independent steps, as every accountant assumes).
pub(crate) fn blatant_delta_lower_bound(p: f64, mu: f64, m: f64, epsilon: f64) -> f64 {
    let f = |tau: f64| {
        let a = p * numeric::ndtr(mu - tau);
        let p1 = -(m * (-a).ln_1p()).exp_m1();
        let p0 = -(m * numeric::log_ndtr(tau)).exp_m1();
        p1 - (epsilon + p0.ln()).exp()
    };
    // Golden-section search on [0, μ + 10] (the bound is unimodal in τ for these shapes),
    // plus a coarse grid so a bad bracket cannot hide the maximum.
    let (mut lo, mut hi) = (0.0f64, mu + 10.0);
    let mut best = f64::NEG_INFINITY;
    for i in 0..=40 {
        best = best.max(f(hi * i as f64 / 40.0));
    }
    let g = 0.5 * (5f64.sqrt() - 1.0);
    for _ in 0..80 {
        let a = hi - g * (hi - lo);
        let b = lo + g * (hi - lo);
        if f(a) > f(b) {
            hi = b;
        } else {
            lo = a;
        }
    }
    best.max(f(0.5 * (lo + hi))).max(0.0)
}

/// The CLT's validity conditions (DRS Thm 3.5 / App. A): no step may dominate the sum, and no
/// step may be so sharp that the subsampled mechanism is nearly blatant (then δ ≥ 1−(1−p)^{S·k}
/// for every finite ε).
pub fn clt_validity(mus: &[f64], p: f64, samples: u64, delta: f64, clt_eps: Option<f64>) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    if p >= 1.0 || mus.is_empty() {
        return out;
    }
    // Condition 2 (max kl → 0): kl(C_p(G_μ)) ≈ p²(e^{μ²} − 1)/2 for small p·μ; compare the
    // largest step's share of Σ over all S·n steps, in log space.
    let lw: Vec<f64> = mus.iter().map(|m| log_expm1(m * m)).collect();
    let lmax = lw.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let ltot = numeric::log_sum_exp(&lw) + (samples as f64).ln();
    let share = (lmax - ltot).exp();
    if share >= 0.2 {
        out.push(Diagnostic {
            code: "clt_step_dominates".into(),
            message: format!(
                "one step carries {:.0}% of Σ(e^{{μ_t²}} − 1) over all {} private steps: the CLT's condition max kl → 0 fails{}",
                100.0 * share,
                samples as usize * mus.len(),
                if share >= 0.5 { "; the CLT number is not a guarantee" } else { "" }
            ),
            severe: share >= 0.5,
        });
    }
    let mu_b = blatant_mu(delta);
    let k = mus.iter().filter(|m| **m >= mu_b).count();
    if k > 0 {
        let m = (samples as f64) * k as f64;
        let limit = -(m * (-p).ln_1p()).exp_m1();
        let mu_k = mus.iter().cloned().filter(|m| *m >= mu_b).fold(f64::INFINITY, f64::min);
        let lb = clt_eps.map(|e| blatant_delta_lower_bound(p, mu_k, m, e));
        let severe = limit > delta || lb.is_some_and(|l| l > delta);
        let mut msg = format!(
            "{k} private step(s) per sample have μ_t ≥ 2Φ⁻¹(1−δ) = {mu_b:.3} (nearly blatant when sampled): \
             δ ≥ 1−(1−p)^{{S·k}} = {limit:.4e} for every finite ε in the limit"
        );
        if let (Some(l), Some(e)) = (lb, clt_eps) {
            msg.push_str(&format!(
                "; at the CLT's ε = {} the true δ is at least {l:.4e}",
                crate::numeric::format::fmt_num(e)
            ));
        }
        if severe {
            msg.push_str(&format!(
                " > δ = {delta:e}: no finite ε of this size holds; the CLT number is NOT a guarantee"
            ));
        }
        out.push(Diagnostic {
            code: "clt_nearly_blatant".into(),
            message: msg,
            severe,
        });
    }
    out
}

/// ln(e^x − 1) for x > 0, stable at both ends.
fn log_expm1(x: f64) -> f64 {
    if x > 30.0 {
        x + (-(-x).exp()).ln_1p()
    } else if x <= 0.0 {
        f64::NEG_INFINITY
    } else {
        x.exp_m1().ln()
    }
}

/// One row of the critical-window view: ε if sampling stops after this step, and ε if the
/// empirical denoiser takes over at this step (§6.3, Figure 10; App. D).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowRow {
    /// Step number.
    pub index: usize,
    /// Stop after this step: the level reached.
    pub stop_level: f64,
    /// Full-batch GDP μ when sampling stops after this step.
    pub stop_mu: f64,
    /// ε(δ) of that μ.
    pub stop_epsilon: f64,
    /// Trade-off: smallest type II error at type I error 0.05 (G_μ(0.05)).
    pub stop_type2_at_0_05: f64,
    /// Switch to the empirical denoiser at this step's start level.
    pub switch_level: f64,
    /// Full-batch GDP μ when the empirical denoiser takes over at this step.
    pub switch_mu: f64,
    /// ε(δ) of that μ.
    pub switch_epsilon: f64,
    /// Trade-off: smallest type II error at type I error 0.05 for the switch.
    pub switch_type2_at_0_05: f64,
}

/// Range sums of non-negative terms (a bottom-up segment tree): a range is the sum of at most
/// 2·log₂ n disjoint node sums, each a sum of non-negative terms, so no difference of large
/// partial sums (no cancellation, unlike prefix-sum differences when μ_t spans 10⁻⁶ to 10²⁴).
struct WindowSums {
    n: usize,
    tree: Vec<f64>,
}

impl WindowSums {
    fn new(terms: Vec<f64>) -> Self {
        let n = terms.len();
        let mut tree = vec![0.0; 2 * n];
        tree[n..].copy_from_slice(&terms);
        for i in (1..n).rev() {
            tree[i] = tree[2 * i] + tree[2 * i + 1];
        }
        WindowSums { n, tree }
    }

    /// Σ terms[lo..hi].
    fn sum(&self, lo: usize, hi: usize) -> f64 {
        let (mut l, mut h) = (lo + self.n, hi + self.n);
        let mut s = 0.0;
        while l < h {
            if l & 1 == 1 {
                s += self.tree[l];
                l += 1;
            }
            if h & 1 == 1 {
                h -= 1;
                s += self.tree[h];
            }
            l >>= 1;
            h >>= 1;
        }
        s
    }
}

/// Critical-window view on the full-batch GDP composition over all samples (exact at p = 1; a
/// sound upper bound at p < 1). Stop: the configured private steps up to step j. Switch: the
/// steps from j on (as many as `private_steps`, else all that run) taken as private.
pub(crate) fn critical_window(cfg: &SamplerConfig, plan: &Plan) -> Result<Vec<WindowRow>> {
    let s = cfg.privacy.samples as f64;
    let run: Vec<&StepRow> = plan.steps.iter().filter(|r| r.role != StepRole::Skipped).collect();
    let mut out = Vec::with_capacity(run.len());
    let mut stop_acc = 0.0f64;
    let take = cfg.privacy.private_steps.unwrap_or(usize::MAX);
    let window = WindowSums::new(run.iter().map(|x| x.mu * x.mu).collect());
    for (j, r) in run.iter().enumerate() {
        if r.role == StepRole::Private {
            stop_acc += r.mu * r.mu;
        }
        // Σ μ² over the `take` steps from j: a range sum of non-negative terms (O(log n) per
        // step; summed naively it was O(n²): 10⁵ levels took seconds).
        let sw = window.sum(j, j.saturating_add(take).min(run.len()));
        let stop_mu = (s * stop_acc).sqrt();
        let switch_mu = (s * sw).sqrt();
        out.push(WindowRow {
            index: r.index,
            stop_level: r.t_to,
            stop_mu,
            stop_epsilon: gdp::epsilon_for_delta(stop_mu, cfg.delta)?,
            stop_type2_at_0_05: gdp::tradeoff(stop_mu, 0.05),
            switch_level: r.t_from,
            switch_mu,
            switch_epsilon: gdp::epsilon_for_delta(switch_mu, cfg.delta)?,
            switch_type2_at_0_05: gdp::tradeoff(switch_mu, 0.05),
        });
    }
    Ok(out)
}

/// The whole analysis of a configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    /// Configuration name.
    pub name: String,
    /// Schedule description.
    pub schedule: String,
    /// Step convention used.
    pub convention: Convention,
    /// The convention spelled out.
    pub convention_text: String,
    /// Neighbouring relation.
    pub neighbouring: Neighbouring,
    /// δ of the ε values.
    pub delta: f64,
    /// Clipping norm C.
    pub clip_norm: f64,
    /// |D|, the number of records.
    pub dataset_size: u64,
    /// Density description.
    pub density: String,
    /// Poisson subsampling rate p.
    pub subsample_rate: f64,
    /// Number of samples drawn.
    pub samples: u64,
    /// Number of private steps per sample.
    pub private_steps: usize,
    /// Per-step rows.
    pub steps: Vec<StepRow>,
    /// Full-batch GDP μ over all private steps and samples.
    pub full_batch_mu: f64,
    /// One line per requested accountant.
    pub accountants: Vec<AccountantLine>,
    /// The smallest ε among sound lines (exact or upper bound), if any.
    pub guarantee: Option<AccountantLine>,
    /// Validity warnings (CLT conditions, blatant steps).
    pub warnings: Vec<Diagnostic>,
    /// Critical-window view.
    pub window: Vec<WindowRow>,
    /// The accounted event.
    pub event: DpEvent,
    /// The event as an event file (TOML).
    pub ledger: String,
}

/// Runs the analysis of `cfg` with the given accountants.
pub fn analyze(cfg: &SamplerConfig, accountants: &[AccountantKind]) -> Result<Analysis> {
    let plan = plan(cfg)?;
    let mus = plan.private_mus();
    let p = cfg.privacy.subsample_rate;
    let s = cfg.privacy.samples;
    let mut warnings = Vec::new();
    for (d, text) in cfg.defaulted.iter().zip(cfg.default_warnings()) {
        warnings.push(Diagnostic {
            code: format!("defaulted_{}", d.field.replace('.', "_")),
            message: text,
            severe: false,
        });
    }
    if cfg.sampler == Some(super::sampler::SamplerKind::Ddim) {
        warnings.push(Diagnostic {
            code: "ddim_eta".into(),
            message: "DDIM's η is an argument of each sampling call, not part of the config: these numbers describe η = 1 \
                      (the ancestral step); with η < 1 less noise is added and μ grows like 1/η, and with η = 0 (the default \
                      of diffusers' DDIMPipeline and StableDiffusionPipeline) every step is deterministic and has no finite \
                      per-step μ, so no guarantee here applies"
                .into(),
            severe: true,
        });
    }
    if mus.is_empty() {
        warnings.push(Diagnostic {
            code: "no_private_steps".into(),
            message: "no step runs the empirical denoiser (switch/stop settings): nothing is spent".into(),
            severe: false,
        });
    }
    if let Some(bad) = mus.iter().find(|m| !m.is_finite()) {
        return Err(Error::numeric(format!(
            "a private step has μ_t = {bad} (density far below the clip norm): lower clip_norm or use clip_scale = \"typical_density\""
        )));
    }
    let mut lines = if mus.is_empty() {
        Vec::new()
    } else {
        account_mus(&mus, p, s, cfg.neighbouring, cfg.delta, accountants)
    };
    for l in &lines {
        for d in &l.diagnostics {
            if !warnings
                .iter()
                .any(|w: &Diagnostic| w.code == d.code && w.message == d.message)
            {
                warnings.push(d.clone());
            }
        }
    }
    if p < 1.0 && !mus.is_empty() {
        warnings.push(Diagnostic {
            code: "subsampled_normalisation".into(),
            message: format!(
                "μ_t uses |D| = {} as in the paper's §4 accounting and its reference tables: that is the sensitivity of a step \
                 that divides the subsampled sum by |D|. A step that divides by the random subsample size |S| ≈ p|D| (the paper's \
                 M_SubGauss, and dpaudit's own sampler) has sensitivity ≈ 2C/(p|D|): every μ_t would be ≈ 1/p = {} times larger",
                plan.dataset_size,
                crate::numeric::format::fmt_num(1.0 / p)
            ),
            severe: false,
        });
    }
    let data_dependent = matches!(cfg.density, DensityConfig::Trajectories(_));
    if data_dependent {
        // Every number below is computed from μ_t measured on the private data: it describes
        // this dataset and is not a DP guarantee. Label it so at the source.
        for l in lines.iter_mut() {
            if l.kind().is_some_and(|k| k.is_sound()) {
                l.relabel(BoundKind::DataDependent, None);
                l.status = LineStatus::DataDependent;
            }
        }
        warnings.push(Diagnostic {
            code: "data_dependent_density".into(),
            message:
                "p_t(x_t) was computed from the private data itself: the μ_t it gives describe these trajectories, \
                      they are not a data-independent DP guarantee"
                    .into(),
            severe: false,
        });
    }
    let guarantee = crate::accountants::sound::tightest_by(lines.iter().filter(|l| l.status == LineStatus::Ok), |l| {
        l.epsilon().zip(l.kind())
    })
    .cloned();
    let event = event_from_mus(&mus, p, s);
    let window = critical_window(cfg, &plan)?;
    Ok(Analysis {
        name: cfg.display_name(),
        schedule: cfg.schedule.describe(),
        convention: cfg.convention,
        convention_text: cfg.convention.describe().to_string(),
        neighbouring: cfg.neighbouring,
        delta: cfg.delta,
        clip_norm: cfg.privacy.clip_norm,
        dataset_size: plan.dataset_size,
        density: plan.density.clone(),
        subsample_rate: p,
        samples: s,
        private_steps: mus.len(),
        full_batch_mu: full_batch_mu(&mus, s),
        accountants: lines,
        guarantee,
        warnings,
        window,
        ledger: event.ledger(),
        event,
        steps: plan.steps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blatant_bound_approaches_limit() {
        // μ = 40 is far past blatant: the bound is ≈ 1 − (1−p)^m at moderate ε.
        let lb = blatant_delta_lower_bound(0.01, 40.0, 50.0, 5.0);
        let limit = 1.0 - 0.99f64.powi(50);
        assert!(lb <= limit && lb > 0.99 * limit, "{lb} {limit}");
        // Small μ gives a tiny or zero bound.
        assert!(blatant_delta_lower_bound(0.01, 0.1, 50.0, 1.0) < 1e-6);
    }

    #[test]
    fn validity_flags_sharp_steps() {
        let mus = [0.01, 0.02, 30.0];
        let d = clt_validity(&mus, 0.01, 1, 1e-5, Some(0.5));
        assert!(d.iter().any(|x| x.code == "clt_nearly_blatant" && x.severe));
        assert!(d.iter().any(|x| x.code == "clt_step_dominates" && x.severe));
        let d = clt_validity(&[0.01; 50], 0.01, 1, 1e-5, Some(0.5));
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn event_shape() {
        let ev = event_from_mus(&[1.0, 1.0, 2.0], 0.5, 10);
        let c = ev.components().unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].count, 20);
        assert_eq!(c[1].count, 10);
    }

    #[test]
    fn clt_fast_path_agrees_with_accountant() {
        let mus: Vec<f64> = (1..50).map(|i| 1e-3 * (i as f64).powf(1.5)).collect();
        for &p in &[0.5, 0.01, 2e-5] {
            for &s in &[1u64, 100] {
                let a = clt_line(&mus, p, s, Neighbouring::AddRemove, 1e-5);
                let b = clt_line_fast(&mus, p, s, Neighbouring::AddRemove, 1e-5);
                assert_eq!(a.kind(), Some(BoundKind::Estimate));
                assert_eq!(a.kind(), b.kind());
                assert_eq!(a.status, b.status, "p={p} S={s}");
                let (x, y) = (a.epsilon().unwrap(), b.epsilon().unwrap());
                assert!((x - y).abs() <= 1e-12 * x.max(1e-300), "p={p} S={s}: {x} {y}");
            }
        }
    }
}
