//! Grid sweeps of a sampler configuration (constant density): σ_min, N, p, switch point, S.
//! Grid points run in parallel (rayon) and come back in grid order, so the output is identical
//! run to run.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::account::{account_mus_with, constant_plan, full_batch_mu, AccountantLine};
use super::schedule::Schedule;
use crate::accountants::AccountantKind;
use crate::config::sampler::{DensityConfig, SamplerConfig};
use crate::error::{Error, Result};

/// The axes of a sweep. An empty axis means "the config's value".
#[derive(Debug, Clone, Default)]
pub struct SweepSpec {
    /// σ_min values (EDM only).
    pub sigma_min: Vec<f64>,
    /// Numbers of levels N.
    pub levels: Vec<usize>,
    /// Subsampling rates p.
    pub subsample_rate: Vec<f64>,
    /// Switch points to the public denoiser.
    pub switch_at: Vec<f64>,
    /// Numbers of samples.
    pub samples: Vec<u64>,
    /// Accountants to run at each point.
    pub accountants: Vec<AccountantKind>,
}

/// One grid point's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepRow {
    /// σ_min of the point (EDM only).
    pub sigma_min: Option<f64>,
    /// Number of levels N.
    pub levels: usize,
    /// Subsampling rate p.
    pub subsample_rate: f64,
    /// Switch point.
    pub switch_at: f64,
    /// Number of samples.
    pub samples: u64,
    /// Step convention.
    pub convention: String,
    /// Number of private steps per sample.
    pub private_steps: usize,
    /// Largest per-step μ.
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
            if log {
                (a.ln() + f * (b.ln() - a.ln())).exp()
            } else {
                a + f * (b - a)
            }
        })
        .collect())
}

/// The configurations of the grid, in order (σ_min outermost, then N, p, switch, S).
pub fn grid_configs(cfg: &SamplerConfig, spec: &SweepSpec) -> Result<Vec<SamplerConfig>> {
    let beta =
        match cfg.density {
            DensityConfig::Constant { beta } => beta,
            DensityConfig::Trajectories(_) => return Err(Error::field(
                "density.kind",
                "sweep needs a constant density (trajectories depend on every grid setting); use `analyze` per setting",
            )),
        };
    let _ = beta;
    let is_edm = matches!(cfg.schedule, Schedule::Edm { .. });
    if !spec.sigma_min.is_empty() && !is_edm {
        return Err(Error::field("--sigma-min", "the σ_min axis needs an EDM schedule"));
    }
    let one = |v: &[f64], d: f64| if v.is_empty() { vec![d] } else { v.to_vec() };
    let sig: Vec<Option<f64>> = if spec.sigma_min.is_empty() {
        vec![None]
    } else {
        spec.sigma_min.iter().map(|s| Some(*s)).collect()
    };
    let lv: Vec<Option<usize>> = if spec.levels.is_empty() {
        vec![None]
    } else {
        spec.levels.iter().map(|s| Some(*s)).collect()
    };
    let ps = one(&spec.subsample_rate, cfg.privacy.subsample_rate);
    let sw = one(&spec.switch_at, cfg.privacy.switch_at);
    let ss: Vec<u64> = if spec.samples.is_empty() {
        vec![cfg.privacy.samples]
    } else {
        spec.samples.clone()
    };
    let mut out = Vec::with_capacity(sig.len() * lv.len() * ps.len() * sw.len() * ss.len());
    for s in &sig {
        for l in &lv {
            for p in &ps {
                for w in &sw {
                    for n in &ss {
                        let mut c = cfg.clone();
                        set_schedule(&mut c.schedule, *s, *l);
                        c.privacy.subsample_rate = *p;
                        c.privacy.switch_at = *w;
                        c.privacy.samples = *n;
                        c.validate().map_err(|e| {
                            let f = e.field.clone().unwrap_or_default();
                            Error::input(format!("grid point invalid: {}", e.message)).with_field(f)
                        })?;
                        out.push(c);
                    }
                }
            }
        }
    }
    Ok(out)
}

fn set_schedule(s: &mut Schedule, sigma_min: Option<f64>, n: Option<usize>) {
    match s {
        Schedule::Edm {
            sigma_min: sm, levels, ..
        } => {
            if let Some(v) = sigma_min {
                *sm = v;
            }
            if let Some(v) = n {
                *levels = v;
            }
        }
        Schedule::DdpmLinear { levels, .. } | Schedule::DdpmCosine { levels, .. } => {
            if let Some(v) = n {
                *levels = Some(v);
            }
        }
        Schedule::FlowMatching { levels, .. } => {
            if let Some(v) = n {
                *levels = v;
            }
        }
    }
}

/// Evaluates one grid configuration.
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
        levels: cfg.schedule.n_levels(),
        subsample_rate: p,
        switch_at: cfg.privacy.switch_at,
        samples: s,
        convention: cfg.convention.as_str().into(),
        private_steps: mus.len(),
        max_step_mu: mus.iter().cloned().fold(0.0, f64::max),
        full_batch_mu: full_batch_mu(&mus, s),
        accountants,
    })
}

/// Runs the sweep in parallel; `tick` is called once per finished point (progress bars).
pub fn run(cfg: &SamplerConfig, spec: &SweepSpec, tick: &(dyn Fn() + Sync)) -> Result<Vec<SweepRow>> {
    let configs = grid_configs(cfg, spec)?;
    configs
        .par_iter()
        .map(|c| {
            let r = evaluate(c, &spec.accountants);
            tick();
            r
        })
        .collect()
}

/// CSV of sweep rows: one row per grid point, per accountant `<a>_epsilon`, `<a>_kind`,
/// `<a>_status` (and `<a>_mu` for gdp and clt).
pub fn to_csv(rows: &[SweepRow], accountants: &[AccountantKind]) -> Result<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = [
        "sigma_min",
        "levels",
        "subsample_rate",
        "switch_at",
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
    let csv_err = |e: csv::Error| Error::input(format!("csv: {e}"));
    w.write_record(&header).map_err(csv_err)?;
    for r in rows {
        let mut rec = vec![
            r.sigma_min.map(fmt).unwrap_or_default(),
            r.levels.to_string(),
            fmt(r.subsample_rate),
            fmt(r.switch_at),
            r.samples.to_string(),
            r.convention.clone(),
            r.private_steps.to_string(),
            fmt(r.max_step_mu),
            fmt(r.full_batch_mu),
        ];
        for a in accountants {
            let line = r.accountants.iter().find(|l| l.accountant == *a);
            if matches!(a, AccountantKind::Gdp | AccountantKind::Clt) {
                rec.push(line.and_then(|l| l.mu).map(fmt).unwrap_or_default());
            }
            rec.push(line.and_then(|l| l.epsilon).map(fmt).unwrap_or_default());
            rec.push(
                line.and_then(|l| l.kind)
                    .map(|k| k.as_str().to_string())
                    .unwrap_or_default(),
            );
            rec.push(
                line.map(|l| l.status.clone())
                    .unwrap_or_else(|| "no private steps".into()),
            );
        }
        w.write_record(&rec).map_err(csv_err)?;
    }
    let bytes = w.into_inner().map_err(|e| Error::input(format!("csv: {e}")))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Shortest round-trip representation of a float (deterministic).
pub fn fmt(x: f64) -> String {
    format!("{x:?}")
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
