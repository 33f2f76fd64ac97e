//! Grid sweeps of a sampler configuration (constant density) over any combination of axes:
//! t_min (σ_min), N, stop step, switch step or fraction, C, |D|, δ, p, S (a cartesian grid).
//! Grid points run in parallel (rayon) and come back in grid order, so the output is identical
//! run to run.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::account::{
    account_mus_with, account_one, constant_plan, constant_private_mus, full_batch_mu, gdp_full_batch_line_fast,
    gdp_line_at_rate, AccountantLine,
};
use super::sampler::{DensityConfig, SamplerConfig};
use super::schedule::Schedule;
use crate::accountants::AccountantKind;
use crate::error::{Error, Result};
use crate::report::num;

/// The axes of a sweep. An empty axis means "the config's value"; every non-empty axis is
/// crossed with every other (a cartesian grid, in the order of the fields: σ_min outermost,
/// the subsampling rate and S innermost).
#[derive(Debug, Clone, Default)]
pub struct SweepSpec {
    /// Smallest noise level t_min: EDM `sigma_min`; flow matching `s_min` = t_min/(1 + t_min);
    /// DDPM schedules (whose smallest level is fixed by β) stop at the first level ≤ t_min.
    pub sigma_min: Vec<f64>,
    /// Number of noise levels N.
    pub levels: Vec<usize>,
    /// Stop after this many steps (`privacy.stop_step`).
    pub stop_step: Vec<usize>,
    /// Index of the first private step (`privacy.switch_step`).
    pub switch_step: Vec<usize>,
    /// Fraction of the steps run by the public denoiser first (`privacy.switch_at`).
    pub switch_at: Vec<f64>,
    /// Clipping norm C.
    pub clip_norm: Vec<f64>,
    /// Dataset size |D|.
    pub dataset_size: Vec<u64>,
    /// δ.
    pub delta: Vec<f64>,
    /// Poisson subsampling rate p.
    pub subsample_rate: Vec<f64>,
    /// Number of generated samples S.
    pub samples: Vec<u64>,
    /// Accountants evaluated at every grid point.
    pub accountants: Vec<AccountantKind>,
}

impl SweepSpec {
    /// Number of grid points (product of the non-empty axes' lengths).
    pub fn size(&self) -> usize {
        [
            self.sigma_min.len(),
            self.levels.len(),
            self.stop_step.len(),
            self.switch_step.len(),
            self.switch_at.len(),
            self.clip_norm.len(),
            self.dataset_size.len(),
            self.delta.len(),
            self.subsample_rate.len(),
            self.samples.len(),
        ]
        .iter()
        .map(|&n| n.max(1))
        .fold(1usize, |a, n| a.saturating_mul(n))
    }
}

/// One grid point's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRow {
    /// EDM σ_min (other schedules: none).
    pub sigma_min: Option<f64>,
    /// Smallest noise level reached: EDM σ_min as given; other schedules the smallest level > 0
    /// a step that runs reaches (after an early stop: on a DDPM schedule, where `--sigma-min`
    /// sets `stop_at`, the level the sampler stops at).
    pub t_min: f64,
    /// Number of noise levels N.
    pub levels: usize,
    /// Stop after this many steps (none: all steps run).
    #[serde(default)]
    pub stop_step: Option<usize>,
    /// Stop at the first level ≤ this noise level (none: no stop by level).
    #[serde(default)]
    pub stop_at: Option<f64>,
    /// First private step (none: from `switch_at`).
    #[serde(default)]
    pub switch_step: Option<usize>,
    /// Fraction of the steps run by the public denoiser first.
    pub switch_at: f64,
    /// Clipping norm C.
    pub clip_norm: f64,
    /// Dataset size |D|.
    pub dataset_size: u64,
    /// δ of the ε columns.
    pub delta: f64,
    /// Poisson subsampling rate p.
    pub subsample_rate: f64,
    /// Number of generated samples S.
    pub samples: u64,
    /// Step convention (A, B or C).
    pub convention: String,
    /// Private steps per sample.
    pub private_steps: usize,
    /// Largest per-step μ_t.
    pub max_step_mu: f64,
    /// Full-batch GDP μ over all private steps and samples.
    pub full_batch_mu: f64,
    /// One line per accountant.
    pub accountants: Vec<AccountantLine>,
}

/// `n` points from a to b inclusive, linearly or log-spaced.
pub fn grid(a: f64, b: f64, n: usize, log: bool) -> Result<Vec<f64>> {
    if n == 0 {
        return Err(Error::field("--points", "need at least 1 point"));
    }
    crate::limits::check_count("--points", n as u64, crate::limits::SWEEP_POINT)?;
    if !(a.is_finite() && b.is_finite()) || (log && (a <= 0.0 || b <= 0.0)) {
        return Err(Error::field(
            "--sigma-min",
            format!("bad range {a}..{b} (log spacing needs > 0)"),
        ));
    }
    if n == 1 {
        return Ok(vec![a]);
    }
    Ok((0..n)
        .map(|i| {
            let f = i as f64 / (n - 1) as f64;
            // A grid point is a parameter the user could have typed: 15 significant digits, so
            // 0.1..1 gives 0.9, not 0.8999999999999999 (the endpoints are exact either way).
            crate::report::num::clean(if log {
                (a.ln() + f * (b.ln() - a.ln())).exp()
            } else {
                a + f * (b - a)
            })
        })
        .collect())
}

/// A setter for one axis value.
type Setter = Box<dyn Fn(&mut SamplerConfig) -> Result<()>>;

/// Sets the smallest noise level t_min of any schedule kind (see [`SweepSpec::sigma_min`]).
pub(crate) fn set_t_min(cfg: &mut SamplerConfig, t_min: f64) -> Result<()> {
    if !(t_min.is_finite() && t_min > 0.0) {
        return Err(Error::field(
            "--sigma-min",
            format!("must be a finite number > 0, got {t_min}"),
        ));
    }
    match &mut cfg.schedule {
        Schedule::Edm { sigma_min, .. } => *sigma_min = t_min,
        // t = s/(1 − s) ⇔ s = t/(1 + t).
        Schedule::FlowMatching { s_min, .. } => *s_min = t_min / (1.0 + t_min),
        Schedule::DdpmLinear { .. } | Schedule::DdpmScaledLinear { .. } | Schedule::DdpmCosine { .. } => {
            cfg.privacy.stop_at = Some(t_min)
        }
    }
    Ok(())
}

/// The configurations of the grid, in order (the first axis of [`SweepSpec`] outermost).
pub fn grid_configs(cfg: &SamplerConfig, spec: &SweepSpec) -> Result<Vec<SamplerConfig>> {
    check_spec(cfg, spec)?;
    let out = build_configs(cfg, spec, true)?;
    for c in &out {
        c.validate().map_err(invalid_point)?;
    }
    Ok(out)
}

/// A grid point's validation error, as the sweep reports it.
fn invalid_point(e: Error) -> Error {
    let f = e.field.clone().unwrap_or_default();
    Error::input(format!("grid point invalid: {}", e.message)).with_field(f)
}

/// What the grid must satisfy before any point is built: a constant density, not both switch
/// axes, and a size within the limits.
fn check_spec(cfg: &SamplerConfig, spec: &SweepSpec) -> Result<()> {
    if let DensityConfig::Trajectories(_) = cfg.density {
        return Err(Error::field(
            "density.kind",
            "sweep needs a constant density (trajectories depend on every grid setting); use `analyze` per setting",
        ));
    }
    if !spec.switch_step.is_empty() && !spec.switch_at.is_empty() {
        return Err(Error::field(
            "--switch-step",
            "sweep either --switch-step (step indices) or --switch-at (fractions), not both",
        ));
    }
    let n = spec.size();
    if n > MAX_GRID_POINTS {
        return Err(Error::field(
            "--points",
            format!(
                "the grid has {n} points (more than {}): use fewer values per axis",
                MAX_GRID_POINTS
            ),
        ));
    }
    // Each grid point is a configuration, an accounting and a row: the whole grid must fit
    // the resource limits before any point is built (the level count is checked per point).
    // A PLD composition per point costs far more than the closed forms (see limits.rs).
    let per_point = if spec.accountants.contains(&AccountantKind::Pld) {
        crate::limits::SWEEP_POINT_PLD
    } else {
        crate::limits::SWEEP_POINT
    };
    crate::limits::check_count("--points", n as u64, per_point).map_err(|mut e| {
        e.message = format!("the grid has {n} points: {}", e.message);
        e
    })?;
    Ok(())
}

/// The configurations of the grid, in order, not validated; without the two innermost axes (p
/// and S) unless `inner`.
fn build_configs(cfg: &SamplerConfig, spec: &SweepSpec, inner: bool) -> Result<Vec<SamplerConfig>> {
    let mut axes: Vec<(&'static str, Vec<Setter>)> = Vec::new();
    fn axis<T: Copy + 'static>(
        axes: &mut Vec<(&'static str, Vec<Setter>)>,
        flag: &'static str,
        values: &[T],
        set: fn(&mut SamplerConfig, T) -> Result<()>,
    ) {
        if !values.is_empty() {
            axes.push((
                flag,
                values
                    .iter()
                    .map(|&v| Box::new(move |c: &mut SamplerConfig| set(c, v)) as Setter)
                    .collect(),
            ));
        }
    }
    axis(&mut axes, "--sigma-min", &spec.sigma_min, set_t_min);
    axis(&mut axes, "--levels", &spec.levels, |c, v| {
        set_levels(&mut c.schedule, v);
        Ok(())
    });
    axis(&mut axes, "--stop-step", &spec.stop_step, |c, v| {
        c.privacy.stop_step = Some(v);
        Ok(())
    });
    axis(&mut axes, "--switch-step", &spec.switch_step, |c, v| {
        c.privacy.switch_step = Some(v);
        c.privacy.switch_at = 0.0;
        Ok(())
    });
    axis(&mut axes, "--switch-at", &spec.switch_at, |c, v| {
        c.privacy.switch_at = v;
        c.privacy.switch_step = None;
        Ok(())
    });
    axis(&mut axes, "--clip", &spec.clip_norm, |c, v| {
        c.privacy.clip_norm = v;
        Ok(())
    });
    axis(&mut axes, "--dataset-size", &spec.dataset_size, |c, v| {
        c.privacy.dataset_size = Some(v);
        Ok(())
    });
    axis(&mut axes, "--delta", &spec.delta, |c, v| {
        c.delta = v;
        Ok(())
    });
    if inner {
        axis(&mut axes, "--sample-rate", &spec.subsample_rate, |c, v| {
            c.privacy.subsample_rate = v;
            Ok(())
        });
        axis(&mut axes, "--samples", &spec.samples, |c, v| {
            c.privacy.samples = v;
            Ok(())
        });
    }
    let mut out = vec![cfg.clone()];
    for (flag, setters) in &axes {
        let mut next = Vec::with_capacity(out.len() * setters.len());
        for c in &out {
            for set in setters {
                let mut c = c.clone();
                set(&mut c).map_err(|e| e.with_field(*flag))?;
                next.push(c);
            }
        }
        out = next;
    }
    Ok(out)
}

/// Largest grid a sweep builds.
pub(crate) const MAX_GRID_POINTS: usize = 1_000_000;

fn set_levels(s: &mut Schedule, n: usize) {
    match s {
        Schedule::Edm { levels, .. } | Schedule::FlowMatching { levels, .. } => *levels = n,
        Schedule::DdpmLinear { levels, .. }
        | Schedule::DdpmScaledLinear { levels, .. }
        | Schedule::DdpmCosine { levels, .. } => *levels = Some(n),
    }
}

/// Evaluates one grid configuration (the reference for [`run`], which shares work between points).
pub fn evaluate(cfg: &SamplerConfig, accountants: &[AccountantKind]) -> Result<SweepRow> {
    let beta = match cfg.density {
        DensityConfig::Constant { beta } => beta,
        DensityConfig::Trajectories(_) => return Err(Error::field("density.kind", "sweep needs a constant density")),
    };
    let plan = constant_plan(cfg, beta)?;
    let mus = plan.private_mus();
    let p = cfg.privacy.subsample_rate;
    let s = cfg.privacy.samples;
    let accountants = if mus.is_empty() {
        Vec::new()
    } else {
        account_mus_with(&mus, p, s, cfg.neighbouring, cfg.delta, accountants, true)
    };
    Ok(SweepRow {
        sigma_min: match cfg.schedule {
            Schedule::Edm { sigma_min, .. } => Some(sigma_min),
            _ => None,
        },
        t_min: match cfg.schedule {
            // The value as given (the computed last level carries rounding noise).
            Schedule::Edm { sigma_min, .. } => sigma_min,
            _ => plan
                .steps
                .iter()
                .filter(|r| r.role != super::sensitivity::StepRole::Skipped)
                .map(|r| r.t_to)
                .filter(|t| *t > 0.0)
                .fold(f64::INFINITY, f64::min),
        },
        levels: cfg.schedule.n_levels(),
        stop_step: cfg.privacy.stop_step,
        stop_at: cfg.privacy.stop_at,
        switch_step: cfg.privacy.switch_step,
        switch_at: cfg.privacy.switch_at,
        clip_norm: cfg.privacy.clip_norm,
        dataset_size: plan.dataset_size,
        delta: cfg.delta,
        subsample_rate: p,
        samples: s,
        convention: cfg.convention.as_str().into(),
        private_steps: mus.len(),
        max_step_mu: mus.iter().cloned().fold(0.0, f64::max),
        full_batch_mu: full_batch_mu(&mus, s),
        accountants,
    })
}

/// Runs the sweep in parallel; `tick` is called once per finished point (progress bars).
///
/// The rows are those of [`evaluate`] on every configuration of [`grid_configs`], in grid order,
/// with the same errors (an invalid point first, in grid order). The points of a block (one
/// setting of every axis but the two innermost, p and S) share their schedule and μ_t, built
/// once per block, and their GDP line, which does not depend on p (the full-batch μ, DRS
/// Cor. 3.3): ε(δ) once per block and S. The other accountants run at every point.
pub fn run(cfg: &SamplerConfig, spec: &SweepSpec, tick: &(dyn Fn() + Sync)) -> Result<Vec<SweepRow>> {
    check_spec(cfg, spec)?;
    let outer = build_configs(cfg, spec, false)?;
    let rates = if spec.subsample_rate.is_empty() {
        vec![cfg.privacy.subsample_rate]
    } else {
        spec.subsample_rate.clone()
    };
    let samples = if spec.samples.is_empty() {
        vec![cfg.privacy.samples]
    } else {
        spec.samples.clone()
    };
    let inner: Vec<(f64, u64)> = rates
        .iter()
        .flat_map(|&p| samples.iter().map(move |&s| (p, s)))
        .collect();
    let blocks: Vec<Result<Result<Block>>> = outer
        .into_par_iter()
        .map(|c| Block::new(c, &inner, &samples, &spec.accountants))
        .collect();
    // In grid order: an invalid point first, then a block that cannot be evaluated.
    let blocks: Vec<Result<Block>> = blocks.into_iter().collect::<Result<_>>()?;
    let blocks: Vec<Block> = blocks.into_iter().collect::<Result<_>>()?;
    let per = inner.len();
    Ok((0..blocks.len() * per)
        .into_par_iter()
        .map(|k| {
            let (p, s) = inner[k % per];
            let r = blocks[k / per].row(p, s, &spec.accountants);
            tick();
            r
        })
        .collect())
}

/// What the points of one block (one setting of every axis but p and S) share.
struct Block {
    /// The block's configuration (p and S are the points').
    cfg: SamplerConfig,
    /// |D|.
    dataset_size: u64,
    /// t_min of the rows.
    t_min: f64,
    /// μ_t of the private steps, in generation order.
    mus: Vec<f64>,
    /// Largest μ_t.
    max_step_mu: f64,
    /// Per distinct S: the full-batch μ (DRS Cor. 3.3) and, when gdp is requested, the GDP line
    /// at p = 1.
    per_samples: Vec<(u64, f64, Option<AccountantLine>)>,
}

impl Block {
    /// Validates the block's points in grid order (outer error, as [`grid_configs`]), then
    /// computes what they share (inner error, as [`evaluate`]).
    fn new(
        cfg: SamplerConfig,
        inner: &[(f64, u64)],
        samples: &[u64],
        accountants: &[AccountantKind],
    ) -> Result<Result<Self>> {
        // `validate` point by point in grid order, without repeating the checks that read
        // neither p nor S: those before them fail at the first point, those after them at the
        // first point whose p and S pass.
        cfg.validate_before_rate().map_err(invalid_point)?;
        for (i, &(p, s)) in inner.iter().enumerate() {
            SamplerConfig::validate_rate(p)
                .and_then(|()| SamplerConfig::validate_samples(s))
                .map_err(invalid_point)?;
            if i == 0 {
                cfg.validate_after_samples().map_err(invalid_point)?;
            }
        }
        Ok(Self::shared(cfg, samples, accountants))
    }

    fn shared(cfg: SamplerConfig, samples: &[u64], accountants: &[AccountantKind]) -> Result<Self> {
        let beta = match cfg.density {
            DensityConfig::Constant { beta } => beta,
            DensityConfig::Trajectories(_) => {
                return Err(Error::field("density.kind", "sweep needs a constant density"))
            }
        };
        let (dataset_size, mus, step_t_min) = constant_private_mus(&cfg, beta)?;
        let t_min = match cfg.schedule {
            // The value as given (the computed last level carries rounding noise).
            Schedule::Edm { sigma_min, .. } => sigma_min,
            _ => step_t_min,
        };
        let gdp = !mus.is_empty() && accountants.contains(&AccountantKind::Gdp);
        let mut per_samples: Vec<(u64, f64, Option<AccountantLine>)> = Vec::with_capacity(samples.len());
        for &s in samples {
            if per_samples.iter().all(|x| x.0 != s) {
                let line = gdp.then(|| gdp_full_batch_line_fast(&mus, s, cfg.delta));
                per_samples.push((s, full_batch_mu(&mus, s), line));
            }
        }
        Ok(Block {
            dataset_size,
            t_min,
            max_step_mu: mus.iter().cloned().fold(0.0, f64::max),
            mus,
            per_samples,
            cfg,
        })
    }

    /// The row of point (p, S): what [`evaluate`] gives for the block's configuration at p and S.
    fn row(&self, p: f64, s: u64, accountants: &[AccountantKind]) -> SweepRow {
        let cfg = &self.cfg;
        let memo = self.per_samples.iter().find(|x| x.0 == s);
        let lines = if self.mus.is_empty() {
            Vec::new()
        } else {
            accountants
                .iter()
                .map(|&a| match (a, memo.and_then(|m| m.2.as_ref())) {
                    (AccountantKind::Gdp, Some(l)) => gdp_line_at_rate(l.clone(), p),
                    _ => account_one(a, &self.mus, p, s, cfg.neighbouring, cfg.delta, accountants, true),
                })
                .collect()
        };
        SweepRow {
            sigma_min: match cfg.schedule {
                Schedule::Edm { sigma_min, .. } => Some(sigma_min),
                _ => None,
            },
            t_min: self.t_min,
            levels: cfg.schedule.n_levels(),
            stop_step: cfg.privacy.stop_step,
            stop_at: cfg.privacy.stop_at,
            switch_step: cfg.privacy.switch_step,
            switch_at: cfg.privacy.switch_at,
            clip_norm: cfg.privacy.clip_norm,
            dataset_size: self.dataset_size,
            delta: cfg.delta,
            subsample_rate: p,
            samples: s,
            convention: cfg.convention.as_str().into(),
            private_steps: self.mus.len(),
            max_step_mu: self.max_step_mu,
            full_batch_mu: memo.map_or_else(|| full_batch_mu(&self.mus, s), |m| m.1),
            accountants: lines,
        }
    }
}

/// CSV of sweep rows: one row per grid point, per accountant `<a>_epsilon`, `<a>_kind`,
/// `<a>_status` (and `<a>_mu` for gdp and clt).
pub(crate) fn to_csv(rows: &[SweepRow], accountants: &[AccountantKind]) -> Result<String> {
    let mut w = crate::report::csv_out::Csv::new();
    let mut header: Vec<String> = [
        "sigma_min",
        "t_min",
        "levels",
        "stop_step",
        "stop_at",
        "switch_step",
        "switch_at",
        "clip_norm",
        "dataset_size",
        "delta",
        "subsample_rate",
        "samples",
        "convention",
        "private_steps",
        "max_step_mu",
        "full_batch_mu",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for a in accountants {
        let n = a.as_str();
        if matches!(a, AccountantKind::Gdp | AccountantKind::Clt) {
            header.push(format!("{n}_mu"));
        }
        header.extend([format!("{n}_epsilon"), format!("{n}_kind"), format!("{n}_status")]);
    }
    w.row(&header)?;
    for r in rows {
        let mut rec = vec![
            r.sigma_min.map(num::debug).unwrap_or_default(),
            num::debug(r.t_min),
            r.levels.to_string(),
            r.stop_step.map(|v| v.to_string()).unwrap_or_default(),
            r.stop_at.map(num::debug).unwrap_or_default(),
            r.switch_step.map(|v| v.to_string()).unwrap_or_default(),
            num::debug(r.switch_at),
            num::debug(r.clip_norm),
            r.dataset_size.to_string(),
            num::debug(r.delta),
            num::debug(r.subsample_rate),
            r.samples.to_string(),
            r.convention.clone(),
            r.private_steps.to_string(),
            num::debug(r.max_step_mu),
            num::debug(r.full_batch_mu),
        ];
        for a in accountants {
            let line = r.accountants.iter().find(|l| l.accountant == *a);
            if matches!(a, AccountantKind::Gdp | AccountantKind::Clt) {
                rec.push(line.and_then(|l| l.mu()).map(num::debug).unwrap_or_default());
            }
            rec.push(line.and_then(|l| l.epsilon()).map(num::debug).unwrap_or_default());
            rec.push(
                line.and_then(|l| l.kind())
                    .map(|k| k.as_str().to_string())
                    .unwrap_or_default(),
            );
            rec.push(
                line.map(|l| l.status.to_string())
                    .unwrap_or_else(|| "no private steps".into()),
            );
        }
        w.row(&rec)?;
    }
    w.into_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids() {
        assert_eq!(grid(1.0, 3.0, 3, false).unwrap(), vec![1.0, 2.0, 3.0]);
        let g = grid(0.01, 1.0, 3, true).unwrap();
        assert!((g[1] - 0.1).abs() < 1e-15);
        assert!(grid(0.0, 1.0, 3, true).is_err());
    }
}
