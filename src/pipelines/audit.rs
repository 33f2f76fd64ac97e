//! Empirical audits of the mechanism implementations in [`super::mechanisms`]:
//!
//! (a) **sensitivity check** — replace one record at many random positions (by adversarial and
//!     real candidates) with the mechanism's randomness (subsample) held fixed, measure the
//!     largest change of the noiseless output, and compare with the claimed ℓ₂ bound (2/m for
//!     DPAgg-TI, 2/k for DP-RDM). Catches e.g. embeddings that were never normalised.
//! (b) **distinguishing audit** — run the full mechanism many times on D and on D with one record
//!     replaced by a canary, score each output by its projection on the canary's direction, and
//!     turn the error rates into an empirical ε lower bound with Clopper–Pearson intervals
//!     ([`crate::attacks::audit`]; threshold chosen on held-out runs). It must sit below the
//!     accounted upper bound; when it does not, the implementation (or its accounting) is wrong.

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::attacks::audit::{audit_scores, AuditOutcome, AuditScores};
use crate::error::Result;
use crate::pipelines::embeddings::{dist, dot, norm};
use crate::pipelines::mechanisms::{rng, DpRdm, DpaggTi};

/// Result of a sensitivity check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SensitivityReport {
    /// Number of neighbouring pairs tried.
    pub trials: usize,
    /// The sensitivity the mechanism claims.
    pub claimed_bound: f64,
    /// Largest output change observed.
    pub max_change: f64,
    /// max_change / claimed_bound.
    pub ratio: f64,
    /// True when no trial exceeded the claimed bound (up to 1e-9 relative rounding).
    pub ok: bool,
}

impl SensitivityReport {
    fn new(trials: usize, claimed: f64, max_change: f64) -> Self {
        SensitivityReport {
            trials,
            claimed_bound: claimed,
            max_change,
            ratio: max_change / claimed,
            ok: max_change <= claimed * (1.0 + 1e-9),
        }
    }
}

/// Replacement candidates for record `x`: its negation scaled to the largest norm in the data
/// (the worst case for a mean), plus a random real record.
fn candidates(rows: &[Vec<f64>], x: &[f64], rng: &mut impl Rng) -> Vec<Vec<f64>> {
    let max_norm = rows.iter().map(|r| norm(r)).fold(0.0, f64::max);
    let nx = norm(x).max(1e-300);
    let neg: Vec<f64> = x.iter().map(|v| -v / nx * max_norm).collect();
    let other = rows[rng.random_range(0..rows.len())].clone();
    vec![neg, other]
}

/// (a) for DPAgg-TI: positions inside the fixed subsample (the only ones that matter).
pub fn dpagg_ti_sensitivity(mech: &DpaggTi, trials: usize, seed: u64) -> SensitivityReport {
    let mut r = rng(seed);
    let rows = &mech.data.rows;
    let mut worst = 0.0f64;
    for _ in 0..trials {
        let idx = mech.subsample(&mut r);
        let pos = idx[r.random_range(0..idx.len())];
        let base = mech.centroid(rows, &idx);
        for c in candidates(rows, &rows[pos], &mut r) {
            let mut nb = rows.clone();
            nb[pos] = c;
            worst = worst.max(dist(&base, &mech.centroid(&nb, &idx)));
        }
    }
    SensitivityReport::new(trials, 2.0 / mech.m as f64, worst)
}

/// (a) for DP-RDM: with the Poisson subset fixed, replace a sampled record by one pointing at
/// the query (so it enters the k-NN) or by a random real record.
pub fn dp_rdm_sensitivity(mech: &DpRdm, queries: &[Vec<f64>], trials: usize, seed: u64) -> SensitivityReport {
    let mut r = rng(seed);
    let rows = &mech.private.rows;
    let mut worst = 0.0f64;
    for t in 0..trials {
        let y = &queries[t % queries.len()];
        let subset = mech.poisson_subset(rows.len(), &mut r);
        if subset.is_empty() {
            continue;
        }
        let pos = subset[r.random_range(0..subset.len())];
        let base = mech.aggregate(rows, &subset, y);
        let ny = norm(y).max(1e-300);
        let towards: Vec<f64> = y.iter().map(|v| v / ny).collect();
        let mut cands = candidates(rows, &rows[pos], &mut r);
        cands.push(towards);
        for c in cands {
            let mut nb = rows.clone();
            nb[pos] = c;
            worst = worst.max(dist(&base, &mech.aggregate(&nb, &subset, y)));
        }
    }
    SensitivityReport::new(trials, 2.0 / mech.k as f64, worst)
}

/// Result of a distinguishing audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DistinguishingReport {
    /// Runs of the mechanism on each dataset.
    pub runs_per_side: usize,
    /// The distinguishing audit's outcome.
    pub outcome: AuditOutcome,
    /// The accounted (sound) ε upper bound the lower bound is compared with.
    pub epsilon_upper: f64,
    /// True when epsilon_lower > epsilon_upper: the implementation leaks more than accounted.
    pub violation: bool,
}

/// (b) for DPAgg-TI. DP must hold for every dataset, so the audit picks the one where the canary
/// is easiest to see: D = the first m records of the mechanism's data (every record is then in
/// every subsample, and the centroid of the others never varies), D' = D with record 0 replaced
/// by a canary pointing the opposite way at the largest norm in the data. Noise scale and claimed
/// noise multiplier are the mechanism's own. Score = ⟨output, canary − x₀⟩. `runs` per side,
/// half held-out (threshold), half test; confidence 1 − `alpha`. `epsilon_upper` must be the
/// accounted ε for this D (no amplification, as m of m are sampled).
pub fn dpagg_ti_distinguishing(
    mech: &DpaggTi,
    runs: usize,
    epsilon_upper: f64,
    alpha: f64,
    seed: u64,
) -> Result<DistinguishingReport> {
    let max_norm = mech.data.max_norm();
    let mut audit_mech = mech.clone();
    audit_mech.data.rows.truncate(mech.m);
    let mech = &audit_mech;
    let d0 = mech.data.rows.clone();
    let x0 = d0[0].clone();
    let nx = norm(&x0).max(1e-300);
    let canary: Vec<f64> = x0.iter().map(|v| -v / nx * max_norm).collect();
    let mut d1 = d0.clone();
    d1[0] = canary.clone();
    let dir: Vec<f64> = canary.iter().zip(&x0).map(|(c, x)| c - x).collect();
    let mut r = rng(seed);
    let mut side = |rows: &Vec<Vec<f64>>| -> Vec<f64> {
        (0..runs)
            .map(|_| {
                let (_, out) = mech.release_on(rows, &mut r);
                dot(&out, &dir)
            })
            .collect()
    };
    let out0 = side(&d0);
    let out1 = side(&d1);
    let h = runs / 2;
    let scores = AuditScores {
        heldout_out: out0[..h].to_vec(),
        heldout_in: out1[..h].to_vec(),
        test_out: out0[h..].to_vec(),
        test_in: out1[h..].to_vec(),
    };
    let outcome = audit_scores(&scores, mech.delta, alpha)?;
    Ok(DistinguishingReport {
        runs_per_side: runs,
        violation: outcome.epsilon_lower > epsilon_upper,
        epsilon_upper,
        outcome,
    })
}
