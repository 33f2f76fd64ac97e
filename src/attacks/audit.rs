//! Empirical privacy auditing: Clopper–Pearson intervals and empirical ε **lower** bounds from
//! a distinguishing experiment.
//!
//! The experiment: run a mechanism many times on two neighbouring datasets D₀ (without a canary)
//! and D₁ (with it), score every output (higher = "looks like D₁"), pick a threshold on
//! *held-out* runs, then count false positives / false negatives on fresh runs. An (ε, δ)-DP
//! mechanism forces every test to satisfy FPR + e^ε·FNR ≥ 1 − δ and FNR + e^ε·FPR ≥ 1 − δ
//! (Kairouz, Oh & Viswanath 2015, Thm 2.1; used for auditing by Jagielski et al. 2020 and
//! Nasr et al. 2021), so
//!
//! ε ≥ max( ln((1 − δ − FPR)/FNR), ln((1 − δ − FNR)/FPR) ).
//!
//! With FPR and FNR replaced by one-sided Clopper–Pearson **upper** bounds (each at level α/2,
//! Bonferroni), the result is a lower bound on the true ε that holds with probability ≥ 1 − α.
//! An accounted (upper-bound) ε below this number proves the accounting or the implementation
//! wrong.
//!
//! API in one glance:
//! - [`clopper_pearson`]`(k, n, alpha)` → two-sided interval; [`cp_upper`] / [`cp_lower`] one-sided.
//! - [`epsilon_from_rates`]`(fpr, fnr, delta)` → the ε implied by one test's error rates.
//! - [`audit_scores`]`(&AuditScores, delta, alpha)` → [`AuditOutcome`] with the threshold chosen on
//!   the held-out half, counts on the test half, and `epsilon_lower` at confidence 1 − α.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Regularised incomplete beta I_x(a, b) (statrs; ~1e-14 relative here).
fn beta_cdf(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    statrs::function::beta::beta_reg(a, b, x)
}

/// Quantile of Beta(a, b) by bisection on the CDF (monotone; 200 halvings reach f64 resolution).
/// `upward` moves the answer to the upper end of the final bracket (for upper bounds).
fn beta_quantile(p: f64, a: f64, b: f64, upward: bool) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if beta_cdf(mid, a, b) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    if upward {
        hi
    } else {
        lo
    }
}

/// One-sided Clopper–Pearson upper bound: P(p ≤ bound) ≥ 1 − α for k successes in n trials.
pub fn cp_upper(k: u64, n: u64, alpha: f64) -> f64 {
    if n == 0 || k >= n {
        return 1.0;
    }
    beta_quantile(1.0 - alpha, k as f64 + 1.0, (n - k) as f64, true)
}

/// One-sided Clopper–Pearson lower bound: P(p ≥ bound) ≥ 1 − α.
pub fn cp_lower(k: u64, n: u64, alpha: f64) -> f64 {
    if n == 0 || k == 0 {
        return 0.0;
    }
    beta_quantile(alpha, k as f64, (n - k + 1) as f64, false)
}

/// Two-sided Clopper–Pearson interval at confidence 1 − α (α/2 in each tail).
pub fn clopper_pearson(k: u64, n: u64, alpha: f64) -> (f64, f64) {
    (cp_lower(k, n, alpha / 2.0), cp_upper(k, n, alpha / 2.0))
}

/// The ε an (ε, δ)-DP mechanism needs for a test with these error rates to exist (Kairouz et
/// al. 2015, Thm 2.1). Returns 0 when the rates imply nothing; +∞ when a rate is 0 and the other
/// is below 1 − δ.
pub fn epsilon_from_rates(fpr: f64, fnr: f64, delta: f64) -> f64 {
    let one = |a: f64, b: f64| -> f64 {
        let num = 1.0 - delta - a;
        if num <= 0.0 {
            return 0.0;
        }
        if b <= 0.0 {
            return f64::INFINITY;
        }
        (num / b).ln().max(0.0)
    };
    one(fpr, fnr).max(one(fnr, fpr))
}

/// Scores of a distinguishing experiment; higher score = "the canary was in".
/// `heldout_*` choose the threshold, `test_*` measure it. Runs must be independent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuditScores {
    /// Threshold-choosing runs without the canary.
    pub heldout_out: Vec<f64>,
    /// Threshold-choosing runs with the canary.
    pub heldout_in: Vec<f64>,
    /// Measuring runs without the canary.
    pub test_out: Vec<f64>,
    /// Measuring runs with the canary.
    pub test_in: Vec<f64>,
}

/// Result of [`audit_scores`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditOutcome {
    /// Decide "in" when score ≥ threshold (chosen on the held-out runs).
    pub threshold: f64,
    /// Number of measuring runs without the canary.
    pub test_out: u64,
    /// Number of measuring runs with the canary.
    pub test_in: u64,
    /// Measuring runs without the canary scored at or above the threshold.
    pub false_positives: u64,
    /// Measuring runs with the canary scored below the threshold.
    pub false_negatives: u64,
    /// Clopper–Pearson one-sided upper bounds (level α/2 each).
    pub fpr_upper: f64,
    /// One-sided Clopper–Pearson upper bound on the false-negative rate.
    pub fnr_upper: f64,
    /// ε implied by the raw test-set rates (no confidence; for display only).
    pub epsilon_point: f64,
    /// Empirical ε lower bound holding with probability ≥ `confidence`.
    pub epsilon_lower: f64,
    /// Confidence level of the bounds (e.g. 0.95).
    pub confidence: f64,
    /// δ at which the ε lower bound holds.
    pub delta: f64,
}

fn counts_at(out: &[f64], inn: &[f64], t: f64) -> (u64, u64) {
    let fp = out.iter().filter(|&&s| s >= t).count() as u64;
    let fneg = inn.iter().filter(|&&s| s < t).count() as u64;
    (fp, fneg)
}

/// [`counts_at`] on sorted scores (binary search).
fn counts_sorted(out: &[f64], inn: &[f64], t: f64) -> (u64, u64) {
    let fp = (out.len() - out.partition_point(|&s| s < t)) as u64;
    let fneg = inn.partition_point(|&s| s < t) as u64;
    (fp, fneg)
}

/// Most candidate thresholds tried on the held-out runs (evenly spaced quantiles beyond it):
/// the choice only has to be good, any threshold fixed before the test runs keeps the bound valid.
const MAX_THRESHOLDS: usize = 4096;

/// Runs the audit: threshold maximising the (Clopper–Pearson-bounded) ε on the held-out runs,
/// then the ε lower bound at confidence 1 − α on the test runs.
pub fn audit_scores(scores: &AuditScores, delta: f64, alpha: f64) -> Result<AuditOutcome> {
    if !(alpha > 0.0 && alpha < 1.0) {
        return Err(Error::field("alpha", format!("must be in (0, 1), got {alpha}")));
    }
    if !(0.0..1.0).contains(&delta) {
        return Err(Error::field("delta", format!("must be in [0, 1), got {delta}")));
    }
    for (name, v) in [
        ("heldout_out", &scores.heldout_out),
        ("heldout_in", &scores.heldout_in),
        ("test_out", &scores.test_out),
        ("test_in", &scores.test_in),
    ] {
        if v.is_empty() {
            return Err(Error::field(name, "no runs"));
        }
        if v.iter().any(|s| s.is_nan()) {
            return Err(Error::field(name, "a score is NaN"));
        }
    }
    // Candidate thresholds: every held-out score. Select with the same bounded estimate that is
    // reported, so a threshold with zero false positives by luck on few runs is not preferred.
    let mut cands: Vec<f64> = scores.heldout_out.iter().chain(&scores.heldout_in).copied().collect();
    cands.sort_by(|a, b| a.total_cmp(b));
    cands.dedup();
    if cands.len() > MAX_THRESHOLDS {
        let n = cands.len();
        cands = (0..MAX_THRESHOLDS)
            .map(|k| cands[k * (n - 1) / (MAX_THRESHOLDS - 1)])
            .collect();
        cands.dedup();
    }
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v
    };
    let (ho, hi) = (&sorted(&scores.heldout_out), &sorted(&scores.heldout_in));
    let mut best = (f64::NEG_INFINITY, cands[0]);
    for &t in &cands {
        let (fp, fneg) = counts_sorted(ho, hi, t);
        let e = epsilon_from_rates(
            cp_upper(fp, ho.len() as u64, alpha / 2.0),
            cp_upper(fneg, hi.len() as u64, alpha / 2.0),
            delta,
        );
        if e > best.0 {
            best = (e, t);
        }
    }
    audit_at(best.1, &scores.test_out, &scores.test_in, delta, alpha)
}

/// The bound of [`audit_scores`] at a threshold fixed in advance (every run measures).
pub fn audit_at(threshold: f64, test_out: &[f64], test_in: &[f64], delta: f64, alpha: f64) -> Result<AuditOutcome> {
    if test_out.is_empty() || test_in.is_empty() {
        return Err(Error::input("no runs to measure"));
    }
    let (fp, fneg) = counts_at(test_out, test_in, threshold);
    let (n0, n1) = (test_out.len() as u64, test_in.len() as u64);
    let fpr_upper = cp_upper(fp, n0, alpha / 2.0);
    let fnr_upper = cp_upper(fneg, n1, alpha / 2.0);
    Ok(AuditOutcome {
        threshold,
        test_out: n0,
        test_in: n1,
        false_positives: fp,
        false_negatives: fneg,
        fpr_upper,
        fnr_upper,
        epsilon_point: epsilon_from_rates(fp as f64 / n0 as f64, fneg as f64 / n1 as f64, delta),
        epsilon_lower: epsilon_from_rates(fpr_upper, fnr_upper, delta),
        confidence: 1.0 - alpha,
        delta,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clopper_pearson_matches_scipy() {
        // scipy 1.17.1: stats.beta.ppf(0.975, 4, 7) and stats.beta.ppf(0.025, 3, 8)
        // (k = 3 of n = 10, 95% two-sided): (0.06673951117773447, 0.6524528500599973).
        let (lo, hi) = clopper_pearson(3, 10, 0.05);
        assert!((lo - 0.06673951117773447).abs() < 1e-10, "{lo}");
        assert!((hi - 0.6524528500599973).abs() < 1e-10, "{hi}");
        // k = 0: lower 0, upper 1 − (α)^{1/n} in closed form.
        let u = cp_upper(0, 100, 0.05);
        assert!((u - (1.0 - 0.05f64.powf(0.01))).abs() < 1e-12, "{u}");
        assert_eq!(cp_lower(0, 100, 0.05), 0.0);
        assert_eq!(cp_upper(100, 100, 0.05), 1.0);
    }

    #[test]
    fn epsilon_from_rates_limits() {
        assert_eq!(epsilon_from_rates(0.5, 0.5, 0.0), 0.0);
        let e = epsilon_from_rates(0.1, 0.1, 0.0);
        assert!((e - (0.9f64 / 0.1).ln()).abs() < 1e-12);
        assert!(epsilon_from_rates(0.0, 0.5, 0.0).is_infinite());
    }

    #[test]
    fn perfect_separation_gives_finite_bound() {
        let s = AuditScores {
            heldout_out: vec![0.0; 200],
            heldout_in: vec![1.0; 200],
            test_out: vec![0.0; 1000],
            test_in: vec![1.0; 1000],
        };
        let o = audit_scores(&s, 0.0, 0.05).unwrap();
        assert_eq!(o.false_positives, 0);
        assert_eq!(o.false_negatives, 0);
        // ln((1 − u)/u) with u = 1 − 0.025^{1/1000}.
        let u = 1.0 - 0.025f64.powf(1.0 / 1000.0);
        assert!(
            (o.epsilon_lower - ((1.0 - u) / u).ln()).abs() < 1e-9,
            "{}",
            o.epsilon_lower
        );
    }
}
