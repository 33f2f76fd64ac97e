//! Privacy auditing with one training run (Steinke, Nasr & Jagielski 2023, "Privacy Auditing with
//! One (1) Training Run", NeurIPS 2023).
//!
//! Setting (their Algorithm 1): m canaries, each included in the private training data
//! independently with probability ½ (S_i ∈ {−1, +1}, secret to the model); one training run; an
//! attack looks only at the trained model and outputs, for each canary, a guess T_i ∈ {−1, 0, +1}
//! (0 = abstain). With r = Σ|T_i| guesses and W = #{i : T_i = S_i} correct ones:
//!
//! * ε-DP (their Theorem 3.1): P[W ≥ v] ≤ f(v) := P[Binomial(r, e^ε/(e^ε + 1)) ≥ v].
//! * (ε, δ)-DP (their Theorem 3.3; the p-value computation of their Appendix D, Algorithm 2):
//!   P[W ≥ v] ≤ f(v) + 2mδ · max_{i ∈ {1..v}} (f(v − i) − f(v))/i.
//!
//! The right-hand side is the p-value of the null hypothesis "the training run is (ε, δ)-DP"
//! given v correct guesses out of r. The ε lower bound at confidence 1 − β is the largest ε whose
//! p-value is still < β ([`epsilon_lower`]): unless an event of probability ≤ β happened, the run
//! is not (ε', δ)-DP for any ε' below it.
//!
//! dpaudit guesses "member" for the k₊ canaries with the highest attack score and "non-member"
//! for the k₋ with the lowest, abstaining on the rest. Choosing (attack, t, k) after seeing the
//! guesses' outcome would void the confidence, so every candidate is evaluated at β/N
//! (Bonferroni over the N candidates) and the largest bound is reported ([`audit`]): the
//! family-wise confidence stays 1 − β.

use serde::{Deserialize, Serialize};
use statrs::function::gamma::ln_gamma;

use crate::error::{Error, Result};

fn ln_choose(n: u64, k: u64) -> f64 {
    ln_gamma(n as f64 + 1.0) - ln_gamma(k as f64 + 1.0) - ln_gamma((n - k) as f64 + 1.0)
}

/// P[Binomial(n, q) = j].
fn binom_pmf(n: u64, q: f64, j: u64) -> f64 {
    if q <= 0.0 {
        return if j == 0 { 1.0 } else { 0.0 };
    }
    if q >= 1.0 {
        return if j == n { 1.0 } else { 0.0 };
    }
    (ln_choose(n, j) + j as f64 * q.ln() + (n - j) as f64 * (-q).ln_1p()).exp()
}

/// P[Binomial(n, q) ≥ v].
pub fn binom_sf(n: u64, q: f64, v: u64) -> f64 {
    if v == 0 {
        return 1.0;
    }
    (v..=n).map(|j| binom_pmf(n, q, j)).sum::<f64>().min(1.0)
}

/// The p-value of "the run is (ε, δ)-DP" after `v` correct guesses out of `r` on `m` canaries
/// (Steinke et al. 2023, Thm 3.1 for δ = 0 and Thm 3.3 otherwise; see the module docs).
pub fn p_value(m: u64, r: u64, v: u64, epsilon: f64, delta: f64) -> f64 {
    debug_assert!(v <= r && r <= m);
    let q = 1.0 / (1.0 + (-epsilon).exp());
    let tail = binom_sf(r, q, v);
    if delta <= 0.0 {
        return tail.min(1.0);
    }
    // α = max_i P[v − i ≤ Binomial(r, q) < v]/i.
    let (mut sum, mut alpha) = (0.0f64, 0.0f64);
    for i in 1..=v {
        sum += binom_pmf(r, q, v - i);
        alpha = alpha.max(sum / i as f64);
    }
    (tail + 2.0 * m as f64 * delta * alpha).min(1.0)
}

/// The largest ε whose p-value is < `beta` (0 when even ε = 0 is not rejected): a lower bound
/// on the run's ε at confidence 1 − β. Bisection keeps the end whose p-value is < β, so the
/// returned value is on the safe (low) side of the exact answer.
pub fn epsilon_lower(m: u64, r: u64, v: u64, delta: f64, beta: f64) -> f64 {
    if r == 0 || p_value(m, r, v, 0.0, delta) >= beta {
        return 0.0;
    }
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while p_value(m, r, v, hi, delta) < beta {
        lo = hi;
        hi *= 2.0;
        if hi > 1e3 {
            return lo;
        }
    }
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if p_value(m, r, v, mid, delta) < beta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Guesses from scores: "member" for the `k_pos` highest, "non-member" for the `k_neg` lowest,
/// abstain on the rest (ties broken by index, which does not depend on membership). Returns
/// (r, v): guesses made and correct ones.
pub fn guess(scores: &[f64], included: &[bool], k_pos: usize, k_neg: usize) -> (u64, u64) {
    let mut ix: Vec<usize> = (0..scores.len()).collect();
    ix.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let k_pos = k_pos.min(ix.len());
    let k_neg = k_neg.min(ix.len() - k_pos);
    let correct_pos = ix[..k_pos].iter().filter(|&&i| included[i]).count();
    let correct_neg = ix[ix.len() - k_neg..].iter().filter(|&&i| !included[i]).count();
    ((k_pos + k_neg) as u64, (correct_pos + correct_neg) as u64)
}

/// The guess counts tried for m canaries: k₊ = k₋ = k for k = ⌈f·m/2⌉, f ∈ {0.1, 0.25, 0.5, 1}.
pub fn default_ks(m: usize) -> Vec<usize> {
    let mut ks: Vec<usize> = [0.1, 0.25, 0.5, 1.0]
        .iter()
        .map(|f| ((f * m as f64 / 2.0).ceil() as usize).clamp(1, m / 2))
        .filter(|&k| k >= 1)
        .collect();
    ks.dedup();
    ks
}

/// One candidate of the one-run audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OneRunCandidate {
    /// Attack name.
    pub attack: String,
    /// Step attacked.
    pub t: usize,
    /// Guesses "member" / "non-member".
    pub k_pos: usize,
    /// Guesses "non-member".
    pub k_neg: usize,
    /// Guesses made (r) and correct (v).
    pub guesses: u64,
    /// Correct guesses.
    pub correct: u64,
    /// ε lower bound of this candidate at confidence 1 − β/N.
    pub epsilon_lower: f64,
}

/// The one-run audit's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OneRunAudit {
    /// `black-box` (the released model attacked) or `white-box` (every noisy update seen).
    #[serde(default = "black_box")]
    pub threat_model: String,
    /// Canaries (m).
    pub canaries: usize,
    /// Canaries included in training.
    pub included: usize,
    /// δ of the tested hypothesis.
    pub delta: f64,
    /// Family-wise confidence 1 − β.
    pub confidence: f64,
    /// Candidates N (Bonferroni: each is tested at β/N).
    pub candidates: usize,
    /// The largest candidate bound: ε lower bound at confidence 1 − β.
    pub epsilon_lower: f64,
    /// The audit's power: the largest ε lower bound any candidate could have given (every guess
    /// correct, at the same β/N). An accounted ε at or above it cannot be shown violated by this
    /// audit, whatever the training did.
    #[serde(default)]
    pub epsilon_max: f64,
    /// The candidate that gave it.
    pub best: Option<OneRunCandidate>,
    /// Every candidate.
    pub all: Vec<OneRunCandidate>,
}

/// The threat model of an audit that attacks only the released model.
pub fn black_box() -> String {
    "black-box".into()
}

/// Canary scores of one (attack, t) pair.
#[derive(Debug, Clone)]
pub struct CanaryScores {
    /// Attack name.
    pub attack: String,
    /// Step.
    pub t: usize,
    /// One score per canary (higher = member).
    pub scores: Vec<f64>,
    /// Whether each canary was included in training (the secret S_i = +1).
    pub included: Vec<bool>,
}

/// Runs the audit over every (attack, t) pair and every k in `ks`, Bonferroni-corrected.
pub fn audit(pairs: &[CanaryScores], ks: &[usize], delta: f64, confidence: f64) -> Result<OneRunAudit> {
    let m = pairs.first().map_or(0, |p| p.included.len());
    if m < 2 {
        return Err(Error::input("the one-run audit needs at least 2 canaries"));
    }
    if !(confidence > 0.0 && confidence < 1.0) {
        return Err(Error::field("--confidence", "must be in (0, 1)"));
    }
    if !(0.0..1.0).contains(&delta) {
        return Err(Error::field("--delta", "must be in [0, 1)"));
    }
    if pairs.is_empty() || ks.is_empty() {
        return Err(Error::input(
            "the one-run audit needs at least one attack and one guess count",
        ));
    }
    for p in pairs {
        if p.scores.len() != m || p.included.len() != m {
            return Err(Error::input(format!(
                "{} at t = {}: {} canary scores for {m} canaries",
                p.attack,
                p.t,
                p.scores.len()
            )));
        }
        if p.scores.iter().any(|s| s.is_nan()) {
            return Err(Error::numeric(format!(
                "{} at t = {}: a canary score is NaN",
                p.attack, p.t
            )));
        }
    }
    let n = pairs.len() * ks.len();
    let beta = (1.0 - confidence) / n as f64;
    let mut all = Vec::with_capacity(n);
    for p in pairs {
        for &k in ks {
            let (r, v) = guess(&p.scores, &p.included, k, k);
            all.push(OneRunCandidate {
                attack: p.attack.clone(),
                t: p.t,
                k_pos: k,
                k_neg: k,
                guesses: r,
                correct: v,
                epsilon_lower: epsilon_lower(m as u64, r, v, delta, beta),
            });
        }
    }
    let best = all
        .iter()
        .max_by(|a, b| a.epsilon_lower.total_cmp(&b.epsilon_lower))
        .cloned();
    let epsilon_max = ks
        .iter()
        .map(|&k| {
            let r = (k.min(m) + k.min(m - k.min(m))) as u64;
            epsilon_lower(m as u64, r, r, delta, beta)
        })
        .fold(0.0, f64::max);
    Ok(OneRunAudit {
        threat_model: black_box(),
        canaries: m,
        included: pairs[0].included.iter().filter(|&&b| b).count(),
        delta,
        confidence,
        candidates: n,
        epsilon_lower: best.as_ref().map_or(0.0, |b| b.epsilon_lower),
        epsilon_max,
        best,
        all,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// scipy 1.x: binom.sf(7, 10, 0.7) = P[Bin(10, 0.7) ≥ 8] = 0.38278278639999974.
    #[test]
    fn binomial_tail_matches_scipy() {
        assert!((binom_sf(10, 0.7, 8) - 0.382_782_786_399_999_74).abs() < 1e-12);
        assert_eq!(binom_sf(10, 0.7, 0), 1.0);
    }

    /// Pure DP (Thm 3.1): all r = 10 guesses right has p-value q^10 with q = e^ε/(1 + e^ε); at
    /// ε = 0 that is 2^−10. The ε lower bound at β solves q^10 = β: ε = ln(q/(1 − q)).
    #[test]
    fn pure_dp_bound_closed_form() {
        assert!((p_value(100, 10, 10, 0.0, 0.0) - 2f64.powi(-10)).abs() < 1e-15);
        let beta: f64 = 0.05;
        let q = beta.powf(0.1);
        let want = (q / (1.0 - q)).ln();
        let got = epsilon_lower(100, 10, 10, 0.0, beta);
        assert!(got <= want && want - got < 1e-9, "{got} vs {want}");
    }

    /// Approximate DP (Thm 3.3), by hand: m = 4, r = 2, v = 2, ε = 0, δ = 0.01: q = ½, f(2) = ¼,
    /// P[Bin = 1] = ½, P[Bin = 0] = ¼ → α = max(½/1, ¾/2) = ½; p = ¼ + 2·4·0.01·½ = 0.29.
    #[test]
    fn approximate_dp_p_value_by_hand() {
        assert!((p_value(4, 2, 2, 0.0, 0.01) - 0.29).abs() < 1e-12);
        // δ only raises the p-value, so it only lowers the bound.
        let a = epsilon_lower(1000, 200, 180, 0.0, 0.05);
        let b = epsilon_lower(1000, 200, 180, 1e-5, 0.05);
        assert!(b <= a && b > 0.0, "{a} {b}");
    }

    /// Chance-level guessing gives no evidence; more correct guesses give a larger bound.
    #[test]
    fn bound_is_zero_at_chance_and_grows() {
        assert_eq!(epsilon_lower(200, 100, 50, 1e-5, 0.05), 0.0);
        let lo = epsilon_lower(200, 100, 70, 1e-5, 0.05);
        let hi = epsilon_lower(200, 100, 90, 1e-5, 0.05);
        assert!(0.0 < lo && lo < hi, "{lo} {hi}");
    }

    #[test]
    fn guesses_abstain_in_the_middle() {
        // Scores: canary 0 highest … canary 5 lowest; included = {0, 1, 4}.
        let s = [6.0, 5.0, 4.0, 3.0, 2.0, 1.0];
        let inc = [true, true, false, false, true, false];
        // Top 2 guessed in (both right), bottom 2 guessed out (canary 4 wrong, 5 right).
        assert_eq!(guess(&s, &inc, 2, 2), (4, 3));
        assert_eq!(guess(&s, &inc, 3, 3), (6, 4));
        assert_eq!(default_ks(200), vec![10, 25, 50, 100]);
    }

    /// Bonferroni: with more candidates each is tested at a smaller β, so the same guesses give
    /// a smaller bound.
    #[test]
    fn more_candidates_cost_confidence() {
        let inc: Vec<bool> = (0..100).map(|i| i % 2 == 0).collect();
        let s: Vec<f64> = (0..100)
            .map(|i| if i % 2 == 0 { 1.0 + i as f64 } else { -(i as f64) })
            .collect();
        let one = audit(
            &[CanaryScores {
                attack: "loss".into(),
                t: 1,
                scores: s.clone(),
                included: inc.clone(),
            }],
            &[50],
            1e-5,
            0.95,
        )
        .unwrap();
        let many = audit(
            &[CanaryScores {
                attack: "loss".into(),
                t: 1,
                scores: s,
                included: inc,
            }],
            &[50, 40, 30, 20, 10],
            1e-5,
            0.95,
        )
        .unwrap();
        assert_eq!(one.all[0].correct, 100);
        assert!(one.epsilon_lower > 0.0);
        assert!(many.all[0].epsilon_lower < one.epsilon_lower);
    }
}
