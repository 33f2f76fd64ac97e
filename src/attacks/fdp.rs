//! One-run auditing against a hypothesised trade-off curve (Mahloujifar, Melis & Chaudhuri 2025,
//! "Auditing f-Differential Privacy in One Run", ICML 2025, §4 and their Algorithm for the
//! guessing game with abstentions).
//!
//! The game is Steinke et al.'s ([`super::one_run`]): m canaries, each included independently
//! with probability ½; one run; the auditor makes c′ guesses ("member" / "non-member",
//! abstaining on the rest) and c of them are right. Where Steinke et al. test "the run is
//! (ε, δ)-DP", this tests "the run is f-DP" for a whole trade-off curve f, which uses what the
//! curve says about every operating point at once and so needs far fewer canaries for the same
//! bound: if the run is f-DP, P[c correct of c′] ≥ β only when the numerical recursion of
//! [`rejects`] (their bound, with the inverse blow-up function f̄⁻¹(y) = f(1 − y) of a symmetric
//! f) stays within c′/m. A run that is f-DP is rejected with probability ≤ β.
//!
//! Reading a rejection as a number: within a family of curves ordered by privacy (f_θ ≥ f_θ′
//! for θ ≤ θ′), every curve at or above the smallest rejected θ̂ is rejected too, so "the run is
//! not f_θ-DP for θ ≥ θ̂" holds at confidence 1 − β. The families used here are the ledger's
//! own mechanism with its noise multiplier free (full batch: μ-GDP exactly, Dong, Roth & Su 2022
//! Cor. 3.3; Poisson-subsampled: the curve of [`Curve::from_profile`], built from a sound δ(ε)
//! profile). The ε reported is the *lower* bound of ε(δ) of the family member at θ̂: a lower
//! bound on the run's ε at confidence 1 − β **if** the run's mechanism is in the family (the
//! threat-model assumption every white-box DP-SGD audit states); and the ledger's own curve
//! being rejected is, without that assumption, the finding that the run does not deliver the
//! guarantee its ledger states.
//!
//! Soundness: every curve is evaluated on its low side (a lower curve claims less privacy, so it
//! is rejected less often): the profile curve takes the maximum of finitely many (ε, δ_up(ε))
//! lines, the Gaussian curve is moved down by a relative 1e-12.

use serde::{Deserialize, Serialize};

use crate::numeric::{ndtr, ndtri};

/// A symmetric trade-off function f(α) (type II error of the best test at type I error α),
/// evaluated never above the true curve.
#[derive(Debug, Clone, PartialEq)]
pub enum Curve {
    /// G_μ(α) = Φ(Φ⁻¹(1 − α) − μ) (Dong, Roth & Su 2022, Def. 2.7).
    Gaussian {
        /// μ.
        mu: f64,
    },
    /// f(α) = max_k max(0, 1 − δ_k − e^{ε_k} α, e^{−ε_k}(1 − δ_k − α)) over (ε_k, δ_k) with
    /// δ_k ≥ δ(ε_k) (Dong, Roth & Su 2022, Prop. 2.12: a mechanism (ε, δ(ε))-DP for every ε is
    /// f-DP for the supremum of these lines; a finite subset and larger δ_k give a lower curve).
    Profile {
        /// (ε_k, δ_k), δ_k an upper bound on δ(ε_k).
        points: Vec<(f64, f64)>,
    },
    /// A curve read off a table: f(α) ≥ f(α_k) for the first grid point α_k ≥ α (f decreases),
    /// so the table's step function lies below the curve it was made from.
    Table {
        /// Increasing grid of α.
        alphas: Vec<f64>,
        /// f at each grid point.
        values: Vec<f64>,
    },
}

impl Curve {
    /// The curve of a δ(ε) profile: `delta_up(ε)` must never be below the true δ(ε).
    pub fn from_profile(eps_max: f64, points: usize, delta_up: impl Fn(f64) -> f64) -> Curve {
        let n = points.max(2);
        let pts = (0..n)
            .map(|k| {
                let e = eps_max * k as f64 / (n - 1) as f64;
                (e, delta_up(e).clamp(0.0, 1.0))
            })
            .collect();
        Curve::Profile { points: pts }
    }

    /// The curve tabulated on a grid fine enough for the guessing game (log-spaced from 1e-16
    /// to 1e-3, then linear to 1; 8,192 points), for fast repeated evaluation.
    pub fn tabulate(&self) -> Curve {
        const N: usize = 4096;
        let mut alphas = Vec::with_capacity(2 * N + 1);
        for k in 0..N {
            alphas.push(10f64.powf(-16.0 + 13.0 * k as f64 / N as f64));
        }
        for k in 0..=N {
            alphas.push(1e-3 + (1.0 - 1e-3) * k as f64 / N as f64);
        }
        let values = alphas.iter().map(|&a| self.f(a)).collect();
        Curve::Table { alphas, values }
    }

    /// f(α) on its low side.
    pub fn f(&self, alpha: f64) -> f64 {
        let a = alpha.clamp(0.0, 1.0);
        match self {
            Curve::Gaussian { mu } => {
                if a >= 1.0 {
                    return 0.0;
                }
                if a <= 0.0 {
                    return 1.0;
                }
                (ndtr(-ndtri(a) - mu) * (1.0 - 1e-12)).max(0.0)
            }
            Curve::Profile { points } => points
                .iter()
                .map(|&(e, d)| (1.0 - d - e.exp() * a).max((-e).exp() * (1.0 - d - a)))
                .fold(0.0f64, f64::max)
                .clamp(0.0, 1.0 - a),
            Curve::Table { alphas, values } => {
                let k = alphas.partition_point(|&x| x < a);
                values.get(k).copied().unwrap_or(0.0)
            }
        }
    }

    /// The inverse blow-up f̄⁻¹(y) = f(1 − y) of a symmetric curve: the smallest type I error of
    /// a test with power y.
    fn inverse_blow_up(&self, y: f64) -> f64 {
        self.f(1.0 - y.clamp(0.0, 1.0))
    }
}

/// True when `correct` right guesses out of `guesses` on `m` canaries are inconsistent with
/// f-DP at level β: the recursion of Mahloujifar et al. 2025 (their Algorithm 3, binary
/// alphabet, abstentions allowed) started from r_c = τ·c/c′, h_c = τ·(c′ − c)/c′ with
/// τ = β·c′/m, run down to i = 0 by h_i = max(h_{i+1}, f̄⁻¹(r_{i+1})) and
/// r_i = r_{i+1} + i/(c′ − i)·(h_i − h_{i+1}); the hypothesis survives when r_0 + h_0 ≤ c′/m.
pub fn rejects(curve: &Curve, m: u64, guesses: u64, correct: u64, beta: f64) -> bool {
    if guesses == 0 || correct == 0 || m == 0 {
        return false;
    }
    debug_assert!(correct <= guesses && guesses <= m);
    let (cg, cc) = (guesses as f64, correct as f64);
    let tau = beta * cg / m as f64;
    let mut r = tau * cc / cg;
    let mut h = tau * (cg - cc) / cg;
    for i in (0..correct).rev() {
        let h_new = h.max(curve.inverse_blow_up(r));
        r += (i as f64) / (cg - i as f64) * (h_new - h);
        h = h_new;
        if r + h > cg / m as f64 {
            // Both only grow as i falls: the end is already decided.
            return true;
        }
    }
    r + h > cg / m as f64
}

/// One guess candidate: the `k_pos` highest scores guessed "member", the `k_neg` lowest
/// "non-member".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Guesses {
    /// Guessed "member".
    pub k_pos: usize,
    /// Guessed "non-member".
    pub k_neg: usize,
    /// Guesses made (c′).
    pub guesses: u64,
    /// Right ones (c).
    pub correct: u64,
}

/// The guess candidates for m canaries: k₊ ∈ {0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50} % of m, each with
/// k₋ = k₊ and k₋ = 0 (a subsampled mechanism's evidence sits in the members' upper tail).
pub fn candidate_ks(m: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for f in [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5] {
        let k = ((f * m as f64).round() as usize).clamp(1, m / 2);
        for pair in [(k, k), (k, 0)] {
            if !out.contains(&pair) {
                out.push(pair);
            }
        }
    }
    out
}

/// Evaluates every candidate on `scores` (higher = member).
pub fn guesses(scores: &[f64], included: &[bool], ks: &[(usize, usize)]) -> Vec<Guesses> {
    ks.iter()
        .map(|&(kp, kn)| {
            let (r, v) = super::one_run::guess(scores, included, kp, kn);
            Guesses {
                k_pos: kp,
                k_neg: kn,
                guesses: r,
                correct: v,
            }
        })
        .collect()
}

/// Largest θ in a family (privacy weakening with θ) whose curve is still rejected by some
/// candidate at β/N (Bonferroni over the N candidates): every f_θ′ with θ′ ≤ θ̂ is rejected at
/// family-wise confidence 1 − β. `None` when even the most private end `theta_min` survives.
/// Bisection keeps the rejected end, so the answer is on the safe (small) side.
pub fn family_bound(
    m: u64,
    cands: &[Guesses],
    beta: f64,
    theta_min: f64,
    theta_max: f64,
    curve_of: impl Fn(f64) -> Curve,
) -> Option<f64> {
    let n = cands.len().max(1) as f64;
    let b = beta / n;
    let rejected = |theta: f64| {
        let c = curve_of(theta).tabulate();
        cands.iter().any(|g| rejects(&c, m, g.guesses, g.correct, b))
    };
    if !rejected(theta_min) {
        return None;
    }
    if rejected(theta_max) {
        return Some(theta_max);
    }
    let (mut lo, mut hi) = (theta_min, theta_max);
    for _ in 0..60 {
        let mid = if lo > 0.0 && hi / lo > 4.0 {
            (lo * hi).sqrt()
        } else {
            0.5 * (lo + hi)
        };
        if mid <= lo || mid >= hi {
            break;
        }
        if rejected(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
        if (hi - lo) <= 1e-4 * hi {
            break;
        }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn binom_tail(n: u64, p: f64, v: u64) -> f64 {
        super::super::one_run::binom_sf(n, p, v)
    }

    /// The pure-DP curve f_{ε,0} (randomised response): each guess is right with probability
    /// at most p = e^ε/(1 + e^ε). Where the exact binomial tail gives an outcome a probability
    /// above 2β, the recursion must not reject it at β (validity), and it rejects outcomes that
    /// the tail puts far below β (power).
    #[test]
    fn pure_dp_curve_agrees_with_the_binomial_tail() {
        for eps in [0.0, 0.5, 1.0, 2.0] {
            let curve = Curve::Profile {
                points: vec![(eps, 0.0)],
            };
            let p: f64 = 1.0 / (1.0 + (-eps).exp());
            for cg in [10u64, 50, 200] {
                for c in 0..=cg {
                    let tail = binom_tail(cg, p, c);
                    let rej = rejects(&curve, 1000, cg, c, 0.05);
                    if tail > 0.1 {
                        assert!(!rej, "ε {eps}: {c}/{cg} (tail {tail}) rejected");
                    }
                    if tail < 1e-4 {
                        assert!(rej, "ε {eps}: {c}/{cg} (tail {tail}) not rejected");
                    }
                }
            }
        }
    }

    /// Validity by simulation: a μ-GDP game (member scores N(μ, 1), non-members N(0, 1)) audited
    /// against G_μ itself is rejected in at most β of 400 runs (with slack for the simulation's
    /// own error: at most 2β).
    #[test]
    fn gaussian_hypothesis_rejected_at_most_beta() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (m, mu, beta) = (1000usize, 2.0, 0.05);
        let curve = Curve::Gaussian { mu };
        let ks = candidate_ks(m);
        let mut rejections = 0;
        for _ in 0..400 {
            let inc: Vec<bool> = (0..m).map(|_| rng.random::<bool>()).collect();
            let s: Vec<f64> = inc
                .iter()
                .map(|&b| crate::numeric::normals(&mut rng, 1)[0] as f64 + if b { mu } else { 0.0 })
                .collect();
            let g = guesses(&s, &inc, &ks);
            if g.iter()
                .any(|g| rejects(&curve, m as u64, g.guesses, g.correct, beta / ks.len() as f64))
            {
                rejections += 1;
            }
        }
        assert!(rejections <= 20, "{rejections} of 400 rejected");
    }

    /// Power: the same game at μ = 2 rejects every curve at least twice as private as G_2 (the
    /// test allows arbitrary dependence between canaries, so with abstentions it stays well
    /// below the truth; the white-box audit adds estimators that use more structure).
    #[test]
    fn gaussian_family_bound_is_near_the_truth() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let (m, mu) = (20_000usize, 2.0);
        let inc: Vec<bool> = (0..m).map(|_| rng.random::<bool>()).collect();
        let s: Vec<f64> = inc
            .iter()
            .map(|&b| crate::numeric::normals(&mut rng, 1)[0] as f64 + if b { mu } else { 0.0 })
            .collect();
        let g = guesses(&s, &inc, &candidate_ks(m));
        let hat = family_bound(m as u64, &g, 0.05, 1e-3, 50.0, |mu| Curve::Gaussian { mu }).unwrap();
        assert!(hat > 1.0 && hat <= mu, "μ̂ = {hat}");
    }

    #[test]
    fn profile_curve_is_below_the_gaussian_it_bounds() {
        let mu = 1.5;
        let c = Curve::from_profile(12.0, 200, |e| crate::accountants::gdp::delta_for_epsilon(mu, e));
        let g = Curve::Gaussian { mu };
        for k in 1..100 {
            let a = k as f64 / 100.0;
            assert!(c.f(a) <= g.f(a) + 1e-12, "{a}: {} > {}", c.f(a), g.f(a));
            assert!(g.f(a) - c.f(a) < 0.02, "{a}: {} vs {}", c.f(a), g.f(a));
            let t = g.tabulate();
            assert!(
                t.f(a) <= g.f(a) && g.f(a) - t.f(a) < 1e-3,
                "{a}: {} vs {}",
                t.f(a),
                g.f(a)
            );
        }
    }
}
