//! Central-limit-theorem (CLT) *estimate* for compositions of Poisson-subsampled Gaussian steps
//! with different noise levels and sampling rates.
//!
//! Dong, Roth & Su (2022), "Gaussian differential privacy", Thm 3.5: for a triangular array of
//! symmetric trade-off functions with Σ kl(fᵢ) → K, max kl(fᵢ) → 0, Σ κ₂(fᵢ) → s² and
//! Σ κ₃(fᵢ) → 0, the composition f₁ ⊗ … ⊗ fₙ converges to G_{2K/s}. A p-subsampled μ-GDP step
//! has the symmetrised trade-off function C_p(G_μ) (DRS §4.2, eq. 14; for Poisson subsampling
//! under add/remove see Bu, Dong, Long & Su 2020 and Zhu, Dong & Wang 2022), whose functionals are
//! one-dimensional integrals (DRS Lemma 5.5, written out in diffusion-sampling-privacy App. A):
//!
//! ```text
//! Z(x)   = ln(p·e^{μx − μ²/2} + 1 − p)
//! kl     = p ∫_{μ/2}^∞ Z(x) (φ(x−μ) − φ(x)) dx
//! κ₂     =   ∫_{μ/2}^∞ Z(x)² (p φ(x−μ) + (2−p) φ(x)) dx
//! κ₃     =   ∫_{μ/2}^∞ Z(x)³ (p φ(x−μ) + (2−p) φ(x)) dx          (uncentred, Thm 3.5 cond. 4)
//! κ̄₃     =   ∫_{μ/2}^∞ |Z − kl|³ (p φ(x−μ) + (1−p) φ(x)) dx
//!          + ∫_{μ/2}^∞ (Z + kl)³ φ(x) dx                          (centred, Berry–Esseen Thm 3.4)
//! ```
//!
//! The result is **an estimate, never a bound** ([`BoundKind::Estimate`]): for finitely many steps
//! the true ε can be larger (fixtures/reference/clt_const.csv has rows where the exact PLD ε
//! exceeds the CLT ε). Every result carries validity diagnostics: one step dominating the sum,
//! the Lyapunov ratio Σκ₃/s³, the Berry–Esseen distance γ (DRS Thm 3.4), and a *rigorous* lower
//! bound on the true δ that flags "nearly blatant" steps (a step so sharp that, as μᵢ → ∞,
//! δ ≥ 1 − Π(1 − pᵢ) for every finite ε).
//!
//! ## Numerics
//! With u = x − μ/2 ≥ 0 and t = μu, every integrand is F(u)·φ(u − μ/2), because
//! φ(x) = φ(x−μ)·e^{−t}; kl uses φ(x−μ)(1 − e^{−t}) so there is no cancellation for tiny μ.
//! Z is evaluated as log1p(p·expm1(t)) for t < 30 and t + ln(p + (1−p)e^{−t}) above, so it never
//! overflows (μ = 10⁴ gives t ≈ 5·10⁷). The integrands change regime (i) at the Gaussian centre
//! u = μ/2 (width 1), (ii) near u = 0 where φ(x) decays at rate μ/2, and (iii) at the transition
//! u₀ = ln((1−p)/p)/μ where Z turns from p(eᵗ−1) to t + ln p, a feature of width ~π/μ (the
//! poles of Z sit at t₀ ± iπ). Fixed 20-point Gauss–Legendre panels are laid over the region
//! where the integrand lives, graded geometrically towards u = 0 and u₀ and at most 8 wide, so
//! μ in the hundreds is as accurate as μ = 1 (a single quadrature over [μ/2, ∞) misses the peak
//! at x = μ and returns 0 there; see the `naive_quad_*` columns of clt_edm.csv).

use std::sync::OnceLock;

use super::{check_delta, check_epsilon, gdp, Accountant, AccountantKind, BoundKind, Diagnostic, Evidence};
use crate::error::{Error, Result};
use crate::events::{DpEvent, Mechanism, Neighbouring, Sampling};
use crate::numeric::{log_ndtr, ndtr};

/// Nodes per Gauss–Legendre panel.
const GL_N: usize = 20;
/// Widest panel (in units of the Gaussian's standard deviation). Panel sizes and grading were
/// tuned against mpmath: worst relative error ~1e-13 for kl and κ₂ at ~84 nodes per step.
const MAX_PANEL: f64 = 8.0;
/// Half-width of the window kept around each Gaussian centre (φ(10) ≈ 8e-23).
const WINDOW: f64 = 10.0;
/// ln of the relative size below which a region is dropped.
const LN_NEGLIGIBLE: f64 = -50.0;

/// Thresholds of the validity diagnostics.
pub mod thresholds {
    /// max κ₂ᵢ/s² above which one step is said to dominate (fewer than 20 effective steps).
    pub(crate) const DOMINATES_WARN: f64 = 0.05;
    /// … and above which the CLT estimate is considered invalid (fewer than 4 effective steps).
    pub(crate) const DOMINATES_SEVERE: f64 = 0.25;
    /// Lyapunov ratio Σκ₃/s³ above which a warning is given …
    pub(crate) const LYAPUNOV_WARN: f64 = 0.1;
    /// … and above which the estimate is considered invalid.
    pub(crate) const LYAPUNOV_SEVERE: f64 = 0.5;
    /// DRS Thm 3.4 requires γ < 1/2; at or above it the Berry–Esseen bound says nothing.
    pub(crate) const BERRY_ESSEEN_SEVERE: f64 = 0.5;
}

fn gauss_legendre() -> &'static ([f64; GL_N], [f64; GL_N]) {
    static GL: OnceLock<([f64; GL_N], [f64; GL_N])> = OnceLock::new();
    GL.get_or_init(|| {
        // Newton iteration on P_n (Golub–Welsch would do as well); converges to machine precision.
        let n = GL_N;
        let mut x = [0.0; GL_N];
        let mut w = [0.0; GL_N];
        for i in 0..n {
            let mut z = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
            let mut dp = 0.0;
            for _ in 0..100 {
                let (mut p0, mut p1) = (1.0f64, z);
                for k in 2..=n {
                    let p2 = ((2 * k - 1) as f64 * z * p1 - (k - 1) as f64 * p0) / k as f64;
                    p0 = p1;
                    p1 = p2;
                }
                dp = n as f64 * (z * p1 - p0) / (z * z - 1.0);
                let dz = p1 / dp;
                z -= dz;
                if dz.abs() < 1e-16 {
                    break;
                }
            }
            x[i] = z;
            w[i] = 2.0 / ((1.0 - z * z) * dp * dp);
        }
        (x, w)
    })
}

/// The per-step functionals of C_p(G_μ) (DRS Lemma 5.5).
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct StepFunctionals {
    /// KL divergence term kl of the step (its contribution to K).
    pub kl: f64,
    /// Second moment κ₂ of the privacy loss (its contribution to s²).
    pub kappa2: f64,
    /// Uncentred κ₃ = ∫|log|f'||³ (DRS Thm 3.5, condition 4).
    pub kappa3: f64,
    /// Centred κ̄₃ = ∫|log|f'| + kl|³ (DRS Thm 3.4, Berry–Esseen).
    pub kappa3_bar: f64,
}

/// Quantities shared by all node evaluations of one (p, μ).
struct Step {
    mu: f64,
    p: f64,
    half_mu: f64,
}

/// Values of the integrand pieces at one node u.
#[derive(Clone, Copy)]
struct Node {
    /// Z(u).
    z: f64,
    /// φ(u − μ/2) = φ(x − μ).
    a: f64,
    /// e^{−t}: φ(x) = a·e^{−t}.
    emt: f64,
    /// 1 − e^{−t}.
    one_m_emt: f64,
}

impl Step {
    #[inline(always)]
    fn node(&self, u: f64) -> Node {
        const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
        let t = self.mu * u;
        let y = u - self.half_mu;
        let a = (-0.5 * y * y).exp() * INV_SQRT_2PI;
        if t < 30.0 {
            let em1 = t.exp_m1();
            let emt = 1.0 / (1.0 + em1);
            Node {
                z: (self.p * em1).ln_1p(),
                a,
                emt,
                one_m_emt: em1 * emt,
            }
        } else {
            let emt = (-t).exp();
            Node {
                z: t + (self.p + (1.0 - self.p) * emt).ln(),
                a,
                emt,
                one_m_emt: 1.0 - emt,
            }
        }
    }
}

/// Panel layout over [lo, hi]: widths at most MAX_PANEL, graded geometrically away from `origin`
/// (when given: the steep decay of φ(x) at x = μ/2) and towards/away from the transition `u0`.
struct Layout {
    lo: f64,
    hi: f64,
    origin: Option<(f64, f64)>,
    u0: Option<(f64, f64)>,
}

impl Layout {
    fn next(&self, a: f64) -> f64 {
        let mut w = MAX_PANEL;
        if let Some((o, h)) = self.origin {
            w = w.min((2.0 * (a - o)).max(h));
        }
        let mut end = a + w;
        if let Some((u0, h)) = self.u0 {
            let d = u0 - a;
            if d > 0.0 {
                let wt = (0.7 * d).max(h);
                end = end.min(a + wt);
                if end > u0 || u0 - end < 0.25 * h {
                    end = u0;
                }
            } else {
                end = end.min(a + (-2.0 * d).max(h));
            }
        }
        if end >= self.hi || self.hi - end < 0.05 * (end - a) {
            end = self.hi;
        }
        end
    }

    /// Calls `f(u, weight)` for every quadrature node.
    #[inline]
    fn for_each_node(&self, mut f: impl FnMut(f64, f64)) {
        let (xs, ws) = gauss_legendre();
        let mut a = self.lo;
        let mut guard = 0;
        while a < self.hi && guard < 10_000 {
            let b = self.next(a);
            let (c, h) = (0.5 * (a + b), 0.5 * (b - a));
            for k in 0..GL_N {
                f(c + h * xs[k], h * ws[k]);
            }
            a = b;
            guard += 1;
        }
    }
}

/// kl, κ₂, κ₃ and κ̄₃ of C_p(G_μ) (DRS 2022 Lemma 5.5) for a Poisson rate p ∈ (0, 1] and μ ≥ 0.
/// Accurate to ~1e-12 relative for μ from 1e-6 to 1e3 and p from 1e-9 to 1 (tested against
/// mpmath in `fixtures/reference/clt_moments_mpmath.csv`); κ̄₃ to ~1e-8 (it is only a
/// diagnostic). Costs a few µs.
pub fn step_functionals(p: f64, mu: f64) -> StepFunctionals {
    if !(p > 0.0 && mu > 0.0) {
        return StepFunctionals::default();
    }
    let p = p.min(1.0);
    let st = Step {
        mu,
        p,
        half_mu: 0.5 * mu,
    };
    // Transition of Z: p·e^{t} = 1 − p.
    let t0 = if p < 0.5 {
        ((1.0 - p) / p).ln()
    } else {
        f64::NEG_INFINITY
    };
    let u0 = t0 / mu;
    let h0 = std::f64::consts::PI / mu;
    // Where the mass lives: the Gaussian at u = μ/2, shifted right by up to 3μ while Z grows
    // exponentially (Z^j ≈ p^j e^{jt} below u₀).
    let centre = st.half_mu;
    let peak = centre.max(u0.min(centre + 3.0 * mu));
    let hi = peak + WINDOW;
    // The φ(x) part near u = 0 matters unless Φ(−μ/2)·2/p is negligible.
    let include_origin = centre - WINDOW <= 0.0 || (2.0f64.ln() + log_ndtr(-centre) - p.ln()) > LN_NEGLIGIBLE;
    let lo = if include_origin { 0.0 } else { centre - WINDOW };
    let layout = Layout {
        lo,
        hi,
        origin: if include_origin { Some((0.0, 12.0 / mu)) } else { None },
        u0: if u0 > lo && u0 < hi { Some((u0, h0)) } else { None },
    };
    let mut nodes: Vec<(f64, Node)> = Vec::with_capacity(12 * GL_N);
    let (mut kl, mut k2, mut k3) = (0.0, 0.0, 0.0);
    layout.for_each_node(|u, w| {
        let n = st.node(u);
        let wa = w * n.a;
        let z2 = n.z * n.z;
        let m = wa * (p + (2.0 - p) * n.emt);
        kl += n.z * wa * n.one_m_emt;
        k2 += z2 * m;
        k3 += z2 * n.z * m;
        nodes.push((wa, n));
    });
    kl *= p;
    let kappa2 = k2;
    let kappa3 = k3;

    // κ̄₃: |Z − kl|³ = (Z − kl)³ + 2(kl − Z)³·1{Z < kl}; Z < kl exactly on u < u_c. The smooth
    // part reuses the nodes (no expansion into moments: that would cancel badly for large μ).
    let mut k3b = 0.0;
    for (wa, n) in &nodes {
        let d = n.z - kl;
        let s = n.z + kl;
        k3b += wa * (d * d * d * (p + (1.0 - p) * n.emt) + s * s * s * n.emt);
    }
    // Z(u_c) = kl ⇔ t_c = ln(1 + (e^{kl} − 1)/p), without overflow for large kl.
    let tc = if kl < 30.0 {
        (kl.exp_m1() / p).ln_1p()
    } else {
        kl - p.ln() + (-(1.0 - p) * (-kl).exp()).ln_1p()
    };
    let uc = tc / mu;
    if uc > lo {
        let corr_layout = Layout {
            lo,
            hi: uc.min(hi),
            origin: layout.origin,
            u0: if u0 > lo && u0 < uc { Some((u0, h0)) } else { None },
        };
        let mut corr = 0.0;
        corr_layout.for_each_node(|u, w| {
            let n = st.node(u);
            let d = (kl - n.z).max(0.0);
            corr += d * d * d * w * n.a * (p + (1.0 - p) * n.emt);
        });
        k3b += 2.0 * corr;
    }
    StepFunctionals {
        kl,
        kappa2,
        kappa3,
        kappa3_bar: k3b.max(0.0),
    }
}

/// The CLT summary of a list of steps: sums of the functionals, the CLT μ = 2K/s, and the
/// δ-independent validity diagnostics.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CltSummary {
    /// Number of steps (counts included).
    pub steps: u64,
    /// K = Σ kl.
    pub k: f64,
    /// s² = Σ κ₂.
    pub s2: f64,
    /// Σ kl² (DRS Thm 3.4 denominator).
    pub kl_sq_sum: f64,
    /// Σ κ₃ (uncentred).
    pub kappa3_sum: f64,
    /// Σ κ̄₃ (centred).
    pub kappa3_bar_sum: f64,
    /// max over single steps of kl.
    pub max_kl: f64,
    /// max over single steps of κ₂ / s².
    pub max_kappa2_share: f64,
    /// Σκ₃ / s³ (must be small: DRS Thm 3.5 condition 4 normalised).
    pub lyapunov_ratio: f64,
    /// DRS Thm 3.4 γ = 0.56 Σκ̄₃ / (s² − Σkl²)^{3/2}.
    pub berry_esseen_gamma: f64,
    /// The CLT estimate μ = 2K/s (DRS Thm 3.5).
    pub mu: f64,
    /// Validity diagnostics that do not depend on δ (step dominance, Lyapunov ratio, Berry–Esseen).
    pub diagnostics: Vec<Diagnostic>,
}

impl CltSummary {
    /// ε at δ of the estimate G_μ (DRS Cor. 2.13); an **estimate**.
    pub fn epsilon(&self, delta: f64) -> Result<f64> {
        gdp::epsilon_for_delta(self.mu, delta)
    }
    /// δ at ε of the estimate G_μ; an **estimate**.
    pub fn delta(&self, epsilon: f64) -> f64 {
        gdp::delta_for_epsilon(self.mu, epsilon)
    }
}

fn diag(code: &str, message: String, severe: bool) -> Diagnostic {
    Diagnostic {
        code: code.to_string(),
        message,
        severe,
    }
}

/// CLT summary for steps given as (Poisson rate p, per-step μ, count). p = 1 means full batch
/// (its C_1(G_μ) = G_μ functionals are used as is; the accountant composes full-batch steps
/// exactly instead). Fast path for callers that already hold per-step lists (the diffusion
/// sweep): one [`step_functionals`] call per entry.
pub fn clt_summary(steps: &[(f64, f64, u64)]) -> Result<CltSummary> {
    let mut s = CltSummary {
        steps: 0,
        k: 0.0,
        s2: 0.0,
        kl_sq_sum: 0.0,
        kappa3_sum: 0.0,
        kappa3_bar_sum: 0.0,
        max_kl: 0.0,
        max_kappa2_share: 0.0,
        lyapunov_ratio: 0.0,
        berry_esseen_gamma: 0.0,
        mu: 0.0,
        diagnostics: Vec::new(),
    };
    let mut max_k2 = 0.0f64;
    let mut argmax = None;
    for (i, &(p, mu, count)) in steps.iter().enumerate() {
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::field(
                format!("steps[{i}].p"),
                format!("sampling rate must be in (0, 1], got {p}"),
            ));
        }
        if !(mu >= 0.0 && mu.is_finite()) {
            return Err(Error::field(
                format!("steps[{i}].mu"),
                format!("μ must be finite and ≥ 0, got {mu}"),
            ));
        }
        if count == 0 || mu == 0.0 {
            continue;
        }
        let f = step_functionals(p, mu);
        let c = count as f64;
        s.steps += count;
        s.k += c * f.kl;
        s.s2 += c * f.kappa2;
        s.kl_sq_sum += c * f.kl * f.kl;
        s.kappa3_sum += c * f.kappa3;
        s.kappa3_bar_sum += c * f.kappa3_bar;
        s.max_kl = s.max_kl.max(f.kl);
        if f.kappa2 > max_k2 {
            max_k2 = f.kappa2;
            argmax = Some((i, p, mu));
        }
    }
    if s.s2 > 0.0 {
        s.mu = 2.0 * s.k / s.s2.sqrt();
        s.max_kappa2_share = max_k2 / s.s2;
        s.lyapunov_ratio = s.kappa3_sum / (s.s2 * s.s2.sqrt());
        let var = s.s2 - s.kl_sq_sum;
        s.berry_esseen_gamma = if var > 0.0 {
            0.56 * s.kappa3_bar_sum / (var * var.sqrt())
        } else {
            f64::INFINITY
        };
    }
    if let Some((i, p, mu)) = argmax {
        let r = s.max_kappa2_share;
        if r > thresholds::DOMINATES_WARN {
            s.diagnostics.push(diag(
                "clt_step_dominates",
                format!(
                    "one step (entry {i}: p = {}, μ = {}) carries {:.1}% of s² = Σκ₂ (about {:.1} effective steps); \
                     the CLT (DRS Thm 3.5) needs many comparable steps",
                    crate::numeric::format::sig6(p),
                    crate::numeric::format::sig6(mu),
                    100.0 * r,
                    1.0 / r
                ),
                r > thresholds::DOMINATES_SEVERE,
            ));
        }
    }
    let l = s.lyapunov_ratio;
    if l > thresholds::LYAPUNOV_WARN {
        s.diagnostics.push(diag(
            "clt_lyapunov",
            format!("Σκ₃/s³ = {l:.3}: DRS Thm 3.5 condition 4 (Σκ₃ → 0 relative to s³) is far from holding"),
            l > thresholds::LYAPUNOV_SEVERE,
        ));
    }
    if s.s2 > 0.0 {
        let g = s.berry_esseen_gamma;
        s.diagnostics.push(diag(
            "clt_berry_esseen",
            format!(
                "Berry–Esseen (DRS Thm 3.4): the composed trade-off curve is within γ = {g:.3e} of a Gaussian one \
                 (additive, in type I/II error); this is far coarser than a small δ, so the CLT stays an estimate"
            ),
            g.is_nan() || g >= thresholds::BERRY_ESSEEN_SEVERE,
        ));
    }
    Ok(s)
}

/// A rigorous lower bound on the true δ(ε) of the composition of the given Poisson-subsampled
/// Gaussian steps under add/remove (any composition is at least as revealing as any of its parts
/// and as any event on them):
/// * one step alone: δᵢ(ε) = pᵢ·δ_{G_μᵢ}(ε'ᵢ), ε'ᵢ = ln(1 + (e^ε − 1)/pᵢ) (exact for the pair
///   (1−p)N(0,1) + pN(μ,1) vs N(0,1): H_{e^ε}((1−p)Q + pR ‖ Q) = p·H_{e^{ε'}}(R ‖ Q) directly from
///   the definition; cf. Balle, Barthe & Gaboardi 2018, advanced joint convexity);
/// * the "nearly blatant" steps B together: the event E = {some step i ∈ B has output > μᵢ/2}
///   gives δ(ε) ≥ P(E) − e^ε Q(E) ≥ [1 − Π(1 − pᵢΦ(μᵢ/2))] − e^ε [1 − Π(1 − Φ(−μᵢ/2))],
///   which tends to 1 − Π(1 − pᵢ) for every ε as the μᵢ grow.
///
/// Returns (lower bound, number of steps in the best blatant set).
pub fn delta_lower_bound(steps: &[(f64, f64, u64)], epsilon: f64) -> (f64, u64) {
    let mut best = 0.0f64;
    for &(p, mu, count) in steps {
        if count == 0 || mu <= 0.0 || p <= 0.0 {
            continue;
        }
        let p = p.min(1.0);
        let eps_i = ((epsilon.exp_m1()) / p).ln_1p();
        let d = p * gdp::delta_for_epsilon(mu, eps_i);
        best = best.max(d);
    }
    // Blatant set: steps sorted by μ, largest first; evaluate every prefix (counts expanded
    // through powers) and keep the best.
    let mut sorted: Vec<(f64, f64, u64)> = steps
        .iter()
        .copied()
        .filter(|&(p, mu, c)| c > 0 && mu > 0.0 && p > 0.0)
        .collect();
    sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut ln_keep_p = 0.0f64; // ln Π(1 − pᵢΦ(μᵢ/2))
    let mut ln_keep_q = 0.0f64; // ln Π(1 − Φ(−μᵢ/2))
    let mut n_best = 0u64;
    let mut n = 0u64;
    let e = epsilon.exp();
    for &(p, mu, count) in &sorted {
        let c = count as f64;
        ln_keep_p += c * (-(p.min(1.0)) * ndtr(mu / 2.0)).ln_1p();
        ln_keep_q += c * (-ndtr(-mu / 2.0)).ln_1p();
        n += count;
        let pe = -ln_keep_p.exp_m1();
        let qe = -ln_keep_q.exp_m1();
        let lb = pe - e * qe;
        if lb > best {
            best = lb;
            n_best = n;
        }
    }
    (best.clamp(0.0, 1.0), n_best)
}

/// The nearly-blatant check at (ε, δ): a severe diagnostic when the rigorous lower bound on the
/// true δ(ε) exceeds the δ the estimate claims.
pub(crate) fn blatant_diagnostic(steps: &[(f64, f64, u64)], epsilon: f64, delta: f64) -> Option<Diagnostic> {
    let (lb, n_blatant) = delta_lower_bound(steps, epsilon);
    if lb <= delta {
        return None;
    }
    let blatant_limit: f64 = {
        let mut ln_keep = 0.0;
        let mut sorted: Vec<_> = steps.to_vec();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1));
        let mut left = n_blatant;
        for &(p, _, c) in &sorted {
            if left == 0 {
                break;
            }
            let k = c.min(left);
            ln_keep += k as f64 * (-p.min(1.0)).ln_1p();
            left -= k;
        }
        -f64::exp_m1(ln_keep)
    };
    let detail = if n_blatant > 0 {
        format!(
            " {n_blatant} step(s) are nearly blatant: as their μ grows, δ → 1 − Π(1 − pᵢ) = {blatant_limit:.3e} for every finite ε."
        )
    } else {
        String::new()
    };
    Some(diag(
        "clt_nearly_blatant",
        format!(
            "the true δ at ε = {epsilon:.6} is at least {lb:.3e} (rigorous lower bound), above the δ = {delta:.3e} \
             of the CLT estimate: the estimate is provably below the true ε.{detail}"
        ),
        true,
    ))
}

/// CLT accountant (estimate). Supports compositions of full-batch and Poisson-subsampled
/// Gaussian mechanisms. Subsampled steps are summarised by the CLT; full-batch steps are
/// composed with them exactly in GDP (μ² adds, DRS Cor. 3.3), giving μ = √(μ_clt² + μ_full²).
/// Documented choice: when *every* component is full batch the answer is the exact GDP value
/// and is labelled [`BoundKind::Exact`]; as soon as one subsampled step is present the result is
/// [`BoundKind::Estimate`], however close it may be to the truth.
#[derive(Debug, Clone, Default)]
pub struct CltAccountant;

/// The parts of an event the CLT accountant uses.
struct Parts {
    /// (p, μ, count) of the subsampled Gaussian steps.
    steps: Vec<(f64, f64, u64)>,
    /// Σ μ² of the full-batch Gaussian steps.
    full_mu_sq: f64,
}

fn parts(event: &DpEvent, neighbouring: Neighbouring) -> Result<Parts> {
    let unsupported = |pred: &dyn Fn(&DpEvent) -> Option<String>| -> Error {
        match crate::events::find_path(event, "event", pred) {
            Some((path, why)) => Error::unsupported(format!("clt: {path}: {why}")),
            None => Error::unsupported("clt: unsupported event"),
        }
    };
    let mut out = Parts {
        steps: Vec::new(),
        full_mu_sq: 0.0,
    };
    for c in event.components()? {
        match (c.sampling, c.mechanism) {
            (_, Mechanism::EpsilonDelta { .. }) => {
                return Err(unsupported(&|e| match e {
                    DpEvent::EpsilonDelta { .. } => Some(
                        "an (ε, δ)-DP mechanism has no Gaussian trade-off curve; the CLT needs Gaussian steps".into(),
                    ),
                    _ => None,
                }));
            }
            (_, Mechanism::Laplace { .. }) => {
                return Err(unsupported(&|e| match e {
                    DpEvent::Laplace { .. } => Some(
                        "a Laplace mechanism has no Gaussian trade-off curve (it is only dominated by one); the CLT \
                         needs Gaussian steps: use the pld or rdp bound"
                            .into(),
                    ),
                    _ => None,
                }));
            }
            (Sampling::WithoutReplacement { .. }, _) => {
                return Err(unsupported(&|e| match e {
                    DpEvent::SampledWithoutReplacement { .. } => Some(
                        "sampling without replacement is not supported by the clt accountant (Poisson sampling only)"
                            .into(),
                    ),
                    _ => None,
                }));
            }
            (Sampling::Poisson { q }, Mechanism::Gaussian { noise_multiplier }) => {
                if neighbouring == Neighbouring::ReplaceOne {
                    return Err(unsupported(&|e| {
                        match e {
                        DpEvent::PoissonSampled { .. } => Some(
                            "C_p(G_μ) describes Poisson subsampling under add/remove only; use the pld or rdp bound for replace-one"
                                .into(),
                        ),
                        _ => None,
                    }
                    }));
                }
                out.steps.push((q, 1.0 / noise_multiplier, c.count));
            }
            (Sampling::Full, Mechanism::Gaussian { noise_multiplier }) => {
                out.full_mu_sq += c.count as f64 / (noise_multiplier * noise_multiplier);
            }
        }
    }
    Ok(out)
}

struct Estimate {
    mu: f64,
    kind: BoundKind,
    summary: Option<CltSummary>,
    full_mu: f64,
}

impl CltAccountant {
    fn estimate(&self, event: &DpEvent, neighbouring: Neighbouring) -> Result<(Parts, Estimate)> {
        event.validate()?;
        let parts = parts(event, neighbouring)?;
        let full_mu = parts.full_mu_sq.sqrt();
        if parts.steps.is_empty() {
            return Ok((
                parts,
                Estimate {
                    mu: full_mu,
                    kind: BoundKind::Exact,
                    summary: None,
                    full_mu,
                },
            ));
        }
        let summary = clt_summary(&parts.steps)?;
        let mu = (summary.mu * summary.mu + parts.full_mu_sq).sqrt();
        Ok((
            parts,
            Estimate {
                mu,
                kind: BoundKind::Estimate,
                summary: Some(summary),
                full_mu,
            },
        ))
    }

    fn result(&self, parts: &Parts, est: Estimate, epsilon: f64, delta: f64) -> Evidence {
        // All full batch: the number is the exact GDP composition, computed by the GDP formula —
        // labelled `gdp`, so no renderer shows a "clt exact" number.
        let who = if est.summary.is_none() {
            AccountantKind::Gdp
        } else {
            AccountantKind::Clt
        };
        let mut r = Evidence::of(who, epsilon, delta, est.kind).with_detail("mu", est.mu);
        match est.summary {
            None => {
                r = r.with_diagnostic(
                    "clt_exact_gdp",
                    "every step is full batch: exact GDP composition (DRS Cor. 3.3, labelled gdp), no CLT approximation",
                    false,
                );
            }
            Some(s) => {
                r = r
                    .with_detail("mu_clt", s.mu)
                    .with_detail("mu_full_batch", est.full_mu)
                    .with_detail("K", s.k)
                    .with_detail("s2", s.s2)
                    .with_detail("kappa3_sum", s.kappa3_sum)
                    .with_detail("kappa3_bar_sum", s.kappa3_bar_sum)
                    .with_detail("max_kappa2_share", s.max_kappa2_share)
                    .with_detail("lyapunov_ratio", s.lyapunov_ratio)
                    .with_detail("berry_esseen_gamma", s.berry_esseen_gamma)
                    .with_detail("steps", s.steps as f64);
                r.diagnostics.push(diag(
                    "clt_estimate",
                    "CLT (DRS Thm 3.5) is an asymptotic estimate, not a bound: the true ε can be larger; \
                     use pld or rdp for a guarantee"
                        .into(),
                    false,
                ));
                r.diagnostics.extend(s.diagnostics);
                let (lb, _) = delta_lower_bound(&parts.steps, epsilon);
                r = r.with_detail("delta_lower_bound", lb);
                if let Some(d) = blatant_diagnostic(&parts.steps, epsilon, delta) {
                    r.diagnostics.push(d);
                }
            }
        }
        r
    }
}

impl Accountant for CltAccountant {
    fn kind(&self) -> AccountantKind {
        AccountantKind::Clt
    }
    fn supports(&self, event: &DpEvent, neighbouring: Neighbouring) -> Result<()> {
        if event.non_private_path().is_some() {
            return Ok(());
        }
        parts(event, neighbouring).map(|_| ())
    }
    fn epsilon(&self, event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Result<Evidence> {
        check_delta(delta)?;
        event.validate()?;
        if let Some(r) = super::non_private_epsilon(AccountantKind::Clt, event, delta) {
            return Ok(r);
        }
        if let Some(r) = super::uncertified_epsilon(AccountantKind::Clt, event, delta) {
            return Ok(r);
        }
        let (parts, est) = self.estimate(event, neighbouring)?;
        let eps = gdp::epsilon_for_delta(est.mu, delta)?;
        Ok(self.result(&parts, est, eps, delta))
    }
    fn delta(&self, event: &DpEvent, neighbouring: Neighbouring, epsilon: f64) -> Result<Evidence> {
        check_epsilon(epsilon)?;
        event.validate()?;
        if let Some(r) = super::non_private_delta(AccountantKind::Clt, event, epsilon) {
            return Ok(r);
        }
        if let Some(r) = super::uncertified_delta(AccountantKind::Clt, event, epsilon) {
            return Ok(r);
        }
        let (parts, est) = self.estimate(event, neighbouring)?;
        // Below the f64 range δ is the next double above e^{ln δ}, never 0 (as the gdp accountant).
        let (delta, _) = crate::numeric::exp_upper(gdp::log_delta_for_epsilon(est.mu, epsilon));
        Ok(self.result(&parts, est, epsilon, delta))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        (a - b).abs() / b.abs().max(1e-300)
    }

    #[test]
    fn gauss_legendre_integrates_polynomials() {
        let (x, w) = gauss_legendre();
        let s: f64 = w.iter().sum();
        assert!((s - 2.0).abs() < 1e-14);
        // ∫_{-1}^{1} x^38 dx = 2/39, exact for 20 nodes.
        let s38: f64 = x.iter().zip(w).map(|(x, w)| w * x.powi(38)).sum();
        assert!(rel(s38, 2.0 / 39.0) < 1e-13, "{s38}");
    }

    /// Against mpmath (40 digits), fixtures/reference/clt_moments_mpmath.csv.
    #[test]
    fn functionals_match_mpmath() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/reference/clt_moments_mpmath.csv");
        let text = std::fs::read_to_string(path).unwrap();
        let mut worst = [0.0f64; 4];
        let mut n = 0;
        let mut failures = Vec::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.starts_with("mu")) {
            let v: Vec<f64> = line.split(',').map(|x| x.parse().unwrap()).collect();
            let (mu, p) = (v[0], v[1]);
            let f = step_functionals(p, mu);
            let got = [f.kl, f.kappa2, f.kappa3, f.kappa3_bar];
            for k in 0..4 {
                let e = rel(got[k], v[2 + k]);
                worst[k] = worst[k].max(e);
                let tol = if k == 3 { 1e-7 } else { 1e-10 };
                if e.is_nan() || e >= tol {
                    failures.push(format!(
                        "mu={mu} p={p} functional {k}: got {} want {} rel {e:e}",
                        got[k],
                        v[2 + k]
                    ));
                }
            }
            n += 1;
        }
        assert!(n >= 100);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        eprintln!("worst relative errors kl, κ2, κ3, κ̄3: {worst:?}");
    }

    #[test]
    fn full_batch_step_is_gaussian() {
        // C_1(G_μ) = G_μ: kl = μ²/2, κ₂ = μ² + μ⁴/4.
        for &mu in &[1e-3, 0.5, 3.0, 40.0, 700.0] {
            let f = step_functionals(1.0, mu);
            assert!(rel(f.kl, mu * mu / 2.0) < 1e-12, "{mu} {}", f.kl);
            assert!(rel(f.kappa2, mu * mu + mu.powi(4) / 4.0) < 1e-12);
        }
    }

    #[test]
    fn hostile_inputs_stay_finite() {
        for &(p, mu) in &[
            (1e-9, 1e4),
            (0.5, 1e4),
            (1e-9, 1e-9),
            (1.0, 1e4),
            (0.999999, 3.0),
            (1e-150, 5.0),
        ] {
            let f = step_functionals(p, mu);
            assert!(f.kl.is_finite() && f.kl > 0.0, "{p} {mu} {f:?}");
            assert!(f.kappa2.is_finite() && f.kappa2 > 0.0, "{p} {mu} {f:?}");
            assert!(f.kappa3.is_finite() && f.kappa3_bar.is_finite(), "{p} {mu} {f:?}");
        }
        // μ = 1e4, p = 0.5: kl = p·(μ²/2 + ln p) + O(e^{−μ²/8}) analytically close.
        let f = step_functionals(0.5, 1e4);
        assert!(rel(f.kl, 0.5 * (5e7 + 0.5f64.ln())) < 1e-9, "{}", f.kl);
    }

    #[test]
    fn blatant_lower_bound_tends_to_one_minus_product() {
        // Ten steps at p = 0.01 with μ = 200: δ ≥ 1 − 0.99¹⁰ at any ε.
        let steps = [(0.01, 200.0, 10u64)];
        let (lb, n) = delta_lower_bound(&steps, 5.0);
        assert_eq!(n, 10);
        assert!(rel(lb, 1.0 - 0.99f64.powi(10)) < 1e-9, "{lb}");
        // A mild step: the bound is small but positive and below the CLT's own δ at small ε.
        let (lb, _) = delta_lower_bound(&[(0.01, 1.0, 1000)], 0.5);
        assert!(lb > 0.0 && lb < 1e-3, "{lb}");
    }
}

#[cfg(test)]
mod timing {
    /// Rough timing (run with --ignored --nocapture; use the criterion bench for real numbers).
    #[test]
    #[ignore]
    fn time_summary() {
        let steps: Vec<(f64, f64, u64)> = (0..50)
            .map(|i| (0.01, 1e-3 * (5e5f64).powf(i as f64 / 49.0), 1))
            .collect();
        let t = std::time::Instant::now();
        let n = 200;
        let mut acc = 0.0;
        for _ in 0..n {
            acc += super::clt_summary(&steps).unwrap().mu;
        }
        let dt = t.elapsed().as_secs_f64() / n as f64;
        eprintln!(
            "clt_summary(50 steps): {:.1} µs ({:.2} µs/step) {acc}",
            dt * 1e6,
            dt * 1e6 / 50.0
        );
    }
}
