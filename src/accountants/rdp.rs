//! Rényi differential privacy (RDP) accountant.
//!
//! An RDP curve r(α) is computed per homogeneous component of the event, composed by addition
//! (Mironov 2017, "Rényi differential privacy", Prop. 1) and converted to (ε, δ) with
//! [`super::convert`]. Every value returned by this module is an *upper bound* on the true RDP
//! at its order: truncated series carry a rigorous tail bound and every sum carries a rounding
//! allowance, so the minimum over any set of orders is a sound ε.
//!
//! Mechanisms (σ = noise multiplier, relative to the L2 sensitivity under the *stated*
//! neighbouring relation, see [`crate::events`]):
//!
//! | sampling | relation | RDP bound |
//! |---|---|---|
//! | full batch | both | α/(2σ²) (Mironov 2017, Prop. 7) |
//! | Poisson(q) | add/remove | exact: ln A_α/(α − 1), Mironov, Talwar & Zhang 2019 §3.2 (integer α) and §3.3 (fractional α) |
//! | Poisson(q) | replace-one | ln(1 + q(e^{(α−1)α/(2σ²)} − 1))/(α − 1) (joint convexity, see [`rdp_poisson_gaussian_replace_one`]) |
//! | without replacement (m of n) | replace-one | Wang, Balle & Kasiviswanathan 2019 Thm 9, fractional α by log-convex interpolation |
//! | without replacement | add/remove | unsupported (a fixed-size sample needs a fixed n) |
//!
//! (ε, δ)-DP leaves have no RDP curve and are reported as unsupported with their path.

use super::convert::{self, round_up, Conversion};
use super::{check_delta, check_epsilon, Accountant, AccountantKind, BoundKind, Evidence};
use crate::error::{Error, Result};
use crate::events::{Component, DpEvent, Mechanism, Neighbouring, Sampling};
use crate::numeric::{ln_gamma, log_add_exp, log_ndtr, log_sub_exp};
use std::f64::consts::LN_2;

/// Largest integer order summed term by term (O(α) work). Above it the (looser but sound)
/// closed-form bounds are used.
pub const MAX_SUMMED_ORDER: f64 = 1_048_576.0;

/// Largest fractional order computed with the two-series formula; above it (and up to
/// [`MAX_SUMMED_ORDER`]) fractional orders interpolate the integer values (sound, cheaper).
pub(crate) const FRACTIONAL_SERIES_MAX: f64 = 4096.0;

/// The continuous refinement of the best order runs only below this order (above it the default
/// grid is ≤ 3.2% apart, where ε(α) is flat to well under 0.1%, and each evaluation costs O(α)).
const REFINE_MAX_ORDER: f64 = 256.0;

/// Terms with log-magnitude this far below the running sum of magnitudes end a fractional
/// series (the remainder is still added as a rigorous tail bound).
const SERIES_STOP_LOG: f64 = 40.0;

/// Relative error allowed per libm transcendental call (erfc, lgamma, ln, exp); generous.
const LIBM_REL: f64 = 16.0 * f64::EPSILON;

/// The orders of dp_accounting 0.6.0's `DEFAULT_RDP_ORDERS`:
/// 1.1, 1.2, …, 10.9, 11, 12, …, 63, 128, 256, 512, 1024.
pub fn dp_accounting_orders() -> Vec<f64> {
    let mut v: Vec<f64> = (1..100).map(|x| 1.0 + x as f64 / 10.0).collect();
    v.extend((11..64).map(|x| x as f64));
    v.extend([128.0, 256.0, 512.0, 1024.0]);
    v
}

/// The default order grid: dp_accounting's grid, refined (1.01…1.09 near 1, every integer up to
/// 256, then steps of 8, 32, 128 up to 4096) and extended geometrically (×1.25) up to 2²⁰ for tiny
/// δ or very large σ. Orders that cannot beat the best ε found so far are skipped when the
/// accountant prunes ([`RdpAccountant::prune`]), so the long tail costs nothing in common cases.
pub(crate) fn default_orders() -> Vec<f64> {
    let mut v: Vec<f64> = [1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08, 1.09].to_vec();
    v.extend((1..100).map(|x| 1.0 + x as f64 / 10.0));
    v.extend((11..=256).map(|x| x as f64));
    v.extend((33..=128).map(|x| x as f64 * 8.0));
    v.extend((33..=128).map(|x| x as f64 * 32.0));
    let mut a = 4096.0f64;
    while a < MAX_SUMMED_ORDER {
        a = (a * 1.25).round();
        v.push(a.min(MAX_SUMMED_ORDER));
    }
    v.sort_by(f64::total_cmp);
    v.dedup();
    v
}

/// max(x, 0) for a log-moment, with NaN (an overflowed series: ln(∞ − ∞)) read as +∞, the only
/// sound value; `f64::max` would have returned 0 and certified ε = 0.
fn nonneg(x: f64) -> f64 {
    if x.is_nan() {
        f64::INFINITY
    } else {
        x.max(0.0)
    }
}

/// ln(eˣ − 1) for x > 0, accurate for tiny and huge x.
fn log_expm1(x: f64) -> f64 {
    if x > 36.0 {
        x + (-(-x).exp()).ln_1p()
    } else {
        x.exp_m1().ln()
    }
}

/// RDP of the Gaussian mechanism with noise multiplier σ at order α: α/(2σ²)
/// (Mironov 2017, Prop. 7). Holds under either neighbouring relation when σ is stated relative
/// to that relation's sensitivity.
pub(crate) fn rdp_gaussian(sigma: f64, alpha: f64) -> f64 {
    round_up(alpha / (2.0 * sigma * sigma))
}

/// RDP of the Laplace mechanism with scale b (relative to the L1 sensitivity) at order α > 1
/// (Mironov 2017, "Rényi differential privacy", Prop. 6, Table II):
/// D_α = (1/(α − 1))·ln((α/(2α − 1))·e^{(α−1)/b} + ((α − 1)/(2α − 1))·e^{−α/b}), computed in log
/// space (no overflow for small b) and rounded up; it never exceeds the pure-DP value 1/b.
pub(crate) fn rdp_laplace(b: f64, alpha: f64) -> f64 {
    if alpha.is_infinite() {
        return round_up(1.0 / b);
    }
    let a = (alpha / (2.0 * alpha - 1.0)).ln() + (alpha - 1.0) / b;
    let c = ((alpha - 1.0) / (2.0 * alpha - 1.0)).ln() - alpha / b;
    let v = round_up(log_add_exp(a, c) * (1.0 + 4.0 * LIBM_REL) / (alpha - 1.0));
    v.min(round_up(1.0 / b)).max(0.0)
}

/// Online ln Σ exp(tᵢ) over terms given as logs: a running maximum with a rescaled,
/// compensated (Neumaier) sum, so the rounding of the sum does not grow with the number of terms.
#[derive(Clone, Copy)]
struct LogSum {
    max: f64,
    scaled: f64,
    comp: f64,
    n: usize,
    rescales: usize,
}

impl LogSum {
    fn new() -> Self {
        LogSum {
            max: f64::NEG_INFINITY,
            scaled: 0.0,
            comp: 0.0,
            n: 0,
            rescales: 0,
        }
    }
    #[inline]
    fn add(&mut self, t: f64) {
        self.n += 1;
        if t == f64::NEG_INFINITY {
            return;
        }
        let x = if t <= self.max {
            (t - self.max).exp()
        } else {
            let r = (self.max - t).exp();
            self.scaled *= r;
            self.comp *= r;
            self.max = t;
            self.rescales += 1;
            1.0
        };
        let s = self.scaled + x;
        if self.scaled.abs() >= x.abs() {
            self.comp += (self.scaled - s) + x;
        } else {
            self.comp += (x - s) + self.scaled;
        }
        self.scaled = s;
    }
    fn value(&self) -> f64 {
        if self.max == f64::NEG_INFINITY {
            f64::NEG_INFINITY
        } else {
            self.max + (self.scaled + self.comp).ln()
        }
    }
    /// Bound on the relative rounding error of [`Self::value`]'s sum: each exp (1 ulp), each
    /// rescaling (2 ulp), the compensated sum (2 ulp + n²ulp²) and the final ln.
    fn rounding_rel(&self) -> f64 {
        let e = f64::EPSILON;
        (8.0 + 2.0 * self.rescales as f64 + (self.n as f64).powi(2) * e) * e
    }
    /// The log-sum moved up by its rounding allowance plus `term_rel`, the largest relative
    /// error of one term.
    fn upper(&self, term_rel: f64) -> f64 {
        self.value() + (term_rel + self.rounding_rel()) * 1.01
    }
    /// The log-sum moved down by the same allowance as [`Self::upper`]: a lower bound on the
    /// exact sum of the terms whose logs were added (each within `term_rel` of its value).
    fn lower(&self, term_rel: f64) -> f64 {
        self.value() - (term_rel + self.rounding_rel()) * 1.01
    }
}

/// ln(A_α − 1) for the Poisson-subsampled Gaussian at integer α ≥ 2 (add/remove), an upper
/// bound including rounding. MTZ 2019 §3.2 eq. for integer α:
/// A_α = Σ_{k=0}^{α} C(α,k) (1−q)^{α−k} q^k exp((k² − k)/(2σ²)). Because the binomial weights
/// sum to 1 and k² − k = 0 for k ∈ {0, 1}, A_α − 1 = Σ_{k≥2} C(α,k)(1−q)^{α−k} q^k
/// (e^{(k²−k)/(2σ²)} − 1): every term is positive, so the log-space sum has no cancellation and
/// stays accurate for q = 1e-9 (where A_α − 1 ≈ 1e-18).
fn log_am1_poisson_int(q: f64, sigma: f64, alpha: u64) -> f64 {
    if alpha >= WINDOWED_ORDER {
        if let Some(v) = log_am1_poisson_window(q, sigma, alpha) {
            return v;
        }
    }
    log_am1_poisson_full(q, sigma, alpha)
}

/// [`log_am1_poisson_int`] summing every term (O(α)).
fn log_am1_poisson_full(q: f64, sigma: f64, alpha: u64) -> f64 {
    let (sum, term_rel) = log_am1_poisson_full_sum(q, sigma, alpha);
    sum.upper(term_rel)
}

/// Lower and upper bounds on ln A_α for the Poisson-subsampled Gaussian at integer α ≥ 1 (the
/// exact sum of MTZ 2019 §3.2 in the form of [`log_am1_poisson_int`], every term summed, moved
/// down and up by its rounding allowance; ln A_1 = 0 exactly). The lower bound is what
/// [`RdpLower`] needs; the upper bound is the same sum as [`log_am1_poisson_full`].
fn ln_a_poisson_int_bounds(q: f64, sigma: f64, alpha: u64) -> (f64, f64) {
    if alpha <= 1 {
        return (0.0, 0.0);
    }
    let (sum, term_rel) = log_am1_poisson_full_sum(q, sigma, alpha);
    // ln A = ln(1 + e^{ln(A − 1)}): log_add_exp rounds by a few ulps; 8 ulps either way.
    let lo = log_add_exp(0.0, sum.lower(term_rel)) * (1.0 - 8.0 * f64::EPSILON);
    let hi = log_add_exp(0.0, sum.upper(term_rel)) * (1.0 + 8.0 * f64::EPSILON);
    (lo.max(0.0), hi)
}

/// The terms of [`log_am1_poisson_full`] summed, with the bound on each term's relative error.
fn log_am1_poisson_full_sum(q: f64, sigma: f64, alpha: u64) -> (LogSum, f64) {
    let a = alpha as f64;
    let lq = q.ln();
    let l1q = (-q).ln_1p();
    let c = 1.0 / (2.0 * sigma * sigma);
    let mut lc = LogBinom::new(a, 2);
    let mut sum = LogSum::new();
    for k in 2..=alpha {
        let kf = k as f64;
        // ln(eˣ − 1) ≤ x: above x = 36 the difference is below 1 ulp; using x rounds up.
        let x = c * kf * (kf - 1.0);
        let lx = if x > 36.0 { x } else { x.exp_m1().ln() };
        sum.add(lc.next() + (a - kf) * l1q + kf * lq + lx);
    }
    // Bound on the absolute error of a term's log from the magnitudes of its pieces.
    let mag = a * (l1q.abs() + lq.abs()) + c * a * a + 4.0;
    (sum, lc.err() + LIBM_REL * mag)
}

/// Integer orders from which [`log_am1_poisson_int`] sums only the terms around the largest one
/// ([`log_am1_poisson_window`]).
const WINDOWED_ORDER: u64 = 256;

/// A term this many nats below the largest one may end the window (e^{−50} ≈ 2e-22).
const WINDOW_STOP_LOG: f64 = 50.0;

/// [`log_am1_poisson_int`] for large α from the terms around the largest one, with rigorous
/// bounds on both remainders; `None` where they need not hold (2cα > 1, c = 1/(2σ²)).
///
/// With t_k = C(α,k)(1−q)^{α−k}q^k(e^{ck(k−1)} − 1) and Q = q/(1 − q):
/// t_{k+1}/t_k = (α−k)/(k+1)·Q·(e^{y'} − 1)/(e^{y} − 1), y = ck(k−1), y' = c(k+1)k. Since
/// g(y) = (e^y − 1)/y increases and g(y)e^{−y} decreases, the last factor lies between
/// (k+1)/(k−1) and (k+1)/(k−1)·e^{2ck}. Hence t_{k+1} ≤ R(k)·t_k with R(k) = (α−k)/(k−1)·Q·e^{2cα},
/// decreasing in k, and t_{k−1} ≤ λ(k−1)·t_k with λ(j) = (j−1)/((α−j)Q), increasing in j. So
/// everything above k is at most t_k·R(k)/(1 − R(k)) and everything below k at most
/// t_k·λ(k−1)/(1 − λ(k−1)), once those ratios are below 1: each remainder is added as one more
/// term. The walk starts at the root of ln(α−k) − ln(k+1) + ln Q + 2ck (the largest term, up to
/// the e^{2ck} bound; unique while 2cα ≤ 1) and stops on each side once a term is
/// [`WINDOW_STOP_LOG`] nats below the largest and the ratio is ≤ 0.999; it costs O(√(αq) · 50)
/// terms instead of O(α).
fn log_am1_poisson_window(q: f64, sigma: f64, alpha: u64) -> Option<f64> {
    let a = alpha as f64;
    let c = 1.0 / (2.0 * sigma * sigma);
    let two_c_a = 2.0 * c * a;
    if !(two_c_a <= 1.0 && q > 0.0 && q < 1.0 && alpha >= 4) {
        return None;
    }
    let lq = q.ln();
    let l1q = (-q).ln_1p();
    let ln_big_q = lq - l1q;
    // Start near the largest term: f(k) = ln(α−k) − ln(k+1) + ln Q + 2ck decreases on [0, α).
    let f = |k: f64| (a - k).ln() - (k + 1.0).ln() + ln_big_q + 2.0 * c * k;
    let (mut lo, mut hi) = (0.0f64, a - 0.5);
    for _ in 0..80 {
        let mid = 0.5 * (lo + hi);
        if f(mid) > 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let k0 = (lo.round() as u64).clamp(2, alpha);
    let term = |k: u64, lc: f64| -> f64 {
        let kf = k as f64;
        let x = c * kf * (kf - 1.0);
        let lx = if x > 36.0 { x } else { x.exp_m1().ln() };
        lc + (a - kf) * l1q + kf * lq + lx
    };
    // ln(r/(1 − r)) of a ratio r < 1 given ln r, rounded up by a margin.
    let geometric = |ln_r: f64| ln_r - (-ln_r.exp()).ln_1p() + 1e-9;
    let ln_stop_ratio = 0.999f64.ln();
    let mut sum = LogSum::new();
    let mut lmax = f64::NEG_INFINITY;
    let mut up = LogBinom::new(a, k0);
    let mut k = k0;
    loop {
        let l = term(k, up.next());
        sum.add(l);
        lmax = lmax.max(l);
        if k == alpha {
            break;
        }
        if l < lmax - WINDOW_STOP_LOG {
            let kf = k as f64;
            let ln_r = (a - kf).ln() - (kf - 1.0).ln() + ln_big_q + two_c_a;
            if ln_r <= ln_stop_ratio {
                sum.add(l + geometric(ln_r));
                break;
            }
        }
        k += 1;
    }
    let mut err = up.err();
    if k0 > 2 {
        let mut down = LogBinom::new(a, k0 - 1);
        let mut k = k0 - 1;
        loop {
            let l = term(k, down.prev());
            sum.add(l);
            lmax = lmax.max(l);
            if k == 2 {
                break;
            }
            if l < lmax - WINDOW_STOP_LOG {
                let kf = k as f64;
                // λ(k − 1) = (k − 2)/((α − k + 1)Q).
                let ln_lam = (kf - 2.0).ln() - (a - kf + 1.0).ln() - ln_big_q;
                if ln_lam <= ln_stop_ratio {
                    sum.add(l + geometric(ln_lam));
                    break;
                }
            }
            k -= 1;
        }
        err = err.max(down.err());
    }
    let mag = a * (l1q.abs() + lq.abs()) + c * a * a + 4.0;
    Some(sum.upper(err + LIBM_REL * mag))
}

/// ln C(a, k) for k = k₀, k₀ + 1, … ([`LogBinom::next`]) or k₀, k₀ − 1, … ([`LogBinom::prev`]): one ln per step (C(a, k + 1) = C(a, k)(a − k)/(k + 1)),
/// recomputed from ln Γ every [`LogBinom::RESYNC`] steps so the error cannot accumulate.
struct LogBinom {
    a: f64,
    k: u64,
    lg_a: f64,
    cur: f64,
    since: u32,
}

impl LogBinom {
    const RESYNC: u32 = 32;
    fn new(a: f64, k0: u64) -> Self {
        let lg_a = ln_gamma(a + 1.0);
        LogBinom {
            a,
            k: k0,
            lg_a,
            cur: f64::NAN,
            since: Self::RESYNC,
        }
    }
    /// ln C(a, k) for the current k, then advances k.
    #[inline]
    fn next(&mut self) -> f64 {
        let kf = self.k as f64;
        // C(a, k) = C(a, k − 1)·(a − k + 1)/k.
        let v = self.current(((self.a - kf + 1.0) / kf).ln());
        self.k += 1;
        v
    }
    /// ln C(a, k) for the current k, then moves k down by one (C(a, k) = C(a, k + 1)·(k + 1)/(a − k)).
    #[inline]
    fn prev(&mut self) -> f64 {
        let kf = self.k as f64;
        let v = self.current(((kf + 1.0) / (self.a - kf)).ln());
        self.k = self.k.saturating_sub(1);
        v
    }
    /// ln C(a, k) at the current k: from ln Γ every [`Self::RESYNC`] calls, else the previous
    /// value plus `ln_ratio` (ln of C(a, k) over the previous value).
    #[inline]
    fn current(&mut self, ln_ratio: f64) -> f64 {
        if self.since >= Self::RESYNC {
            let kf = self.k as f64;
            self.cur = self.lg_a - ln_gamma(kf + 1.0) - ln_gamma(self.a - kf + 1.0);
            self.since = 0;
        } else {
            self.cur += ln_ratio;
            self.since += 1;
        }
        self.cur
    }
    /// Absolute error bound of any value returned: three lgamma values (≤ LIBM_REL each, of
    /// magnitude ≤ ln Γ(a + 1) + 1) plus RESYNC incremental steps of ≤ 4 ulp of that magnitude.
    fn err(&self) -> f64 {
        (3.0 * LIBM_REL + 4.0 * Self::RESYNC as f64 * f64::EPSILON) * (self.lg_a.abs() + self.a.ln().abs() + 1.0)
    }
}

/// ln A_α (upper bound) for the Poisson-subsampled Gaussian at fractional α > 1 by the
/// two-series formula of MTZ 2019 §3.3: with z₀ = σ² ln(1/q − 1) + ½,
/// A_α = Σ_{i≥0} C(α,i) (1−q)^{α−i} q^i e^{(i²−i)/(2σ²)} Φ((z₀ − i)/σ)
///     + Σ_{i≥0} C(α,i) q^{α−i} (1−q)^i e^{(j²−j)/(2σ²)} Φ((j − z₀)/σ),  j = α − i
/// (½ erfc(x/√2) = Φ(−x)). Coefficients C(α,i) alternate in sign for i > α + 1, and the
/// magnitude of each series' terms shrinks by at least |α − i|/(i + 1) per step (this uses the
/// inverse Mills ratio φ(x)/Φ(−x) ≥ x, which gives Φ(−x − h)/Φ(−x) ≤ e^{−xh − h²/2}: the
/// Gaussian factor exactly cancels the growth of q^i e^{(i²−i)/(2σ²)}). So after stopping at
/// i > α + 1 the remainder of each series is at most its next term, bounded by
/// |last term|·|α − i|/(i + 1), and is added. The result also carries a rounding allowance
/// proportional to the sum of |terms|, so it is ≥ the true ln A_α.
/// Returns None when the computed positive part does not exceed the negative part.
fn ln_a_poisson_frac_upper(q: f64, sigma: f64, alpha: f64) -> Option<f64> {
    let lq = q.ln();
    let l1q = (-q).ln_1p();
    let c = 1.0 / (2.0 * sigma * sigma);
    let z0 = sigma * sigma * (l1q - lq) + 0.5;
    let max_terms = (alpha.ceil() as usize).saturating_mul(4).saturating_add(2000);
    let (mut pos, mut neg, mut abs) = (LogSum::new(), LogSum::new(), LogSum::new());
    // Σ |termᵢ|·(relative error bound of termᵢ), in log space.
    let mut err = LogSum::new();
    let mut log_coef = 0.0f64; // ln |C(α, i)|
    let mut sign = 1.0f64;
    let mut coef_err = 0.0f64; // absolute error bound of log_coef (incremental product)
    let mut tail = f64::NEG_INFINITY;
    let mut i = 0usize;
    loop {
        let fi = i as f64;
        if i > 0 {
            let factor = (alpha - fi + 1.0) / fi;
            if factor == 0.0 {
                // Integer α: the series is finite.
                break;
            }
            if factor < 0.0 {
                sign = -sign;
            }
            log_coef += factor.abs().ln();
            coef_err += 4.0 * f64::EPSILON * (1.0 + log_coef.abs());
        }
        let j = alpha - fi;
        let p0 = [fi * lq, j * l1q, c * (fi * fi - fi)];
        let p1 = [j * lq, fi * l1q, c * (j * j - j)];
        let e0 = log_ndtr((z0 - fi) / sigma);
        let e1 = log_ndtr((j - z0) / sigma);
        let ls0 = log_coef + p0[0] + p0[1] + p0[2] + e0;
        let ls1 = log_coef + p1[0] + p1[1] + p1[2] + e1;
        // Absolute error bound of each term's log (pieces of magnitude M carry ≤ LIBM_REL·M),
        // turned into a relative error of the term (e^x − 1).
        let mag0: f64 = p0.iter().map(|x| x.abs()).sum::<f64>() + e0.abs();
        let mag1: f64 = p1.iter().map(|x| x.abs()).sum::<f64>() + e1.abs();
        let base = coef_err + LIBM_REL * (log_coef.abs() + 4.0);
        err.add(ls0 + (base + LIBM_REL * mag0).exp_m1().ln());
        err.add(ls1 + (base + LIBM_REL * mag1).exp_m1().ln());
        if sign > 0.0 {
            pos.add(ls0);
            pos.add(ls1);
        } else {
            neg.add(ls0);
            neg.add(ls1);
        }
        abs.add(ls0);
        abs.add(ls1);
        if fi > alpha + 1.0 {
            let shrink = ((fi - alpha).abs() / (fi + 1.0)).ln();
            let next = log_add_exp(ls0, ls1) + shrink;
            if next < abs.value() - SERIES_STOP_LOG || i >= max_terms {
                tail = next;
                break;
            }
        }
        i += 1;
    }
    let p = pos.value();
    let n = neg.value();
    if n >= p {
        return None;
    }
    let a = log_sub_exp(p, n);
    // Rounding allowance: Σ|termᵢ|·(relative error of termᵢ) plus the summation error of
    // both sums and their difference (relative to Σ|terms|), plus the tail bound.
    let sum_err = abs.value() + (pos.rounding_rel() + neg.rounding_rel() + 4.0 * f64::EPSILON).ln();
    let slack = log_add_exp(log_add_exp(err.upper(0.0) + 0.01, sum_err), tail);
    Some(log_add_exp(a, slack))
}

/// Below this value of cα(α − 1) (c = 1/(2σ²), α rounded up to an integer) the closed form
/// [`ln_a_poisson_small_noise`] is used: it is then at most a factor e^{0.001} above the exact
/// A_α − 1, i.e. within 0.1 % of the exact RDP, at O(1) cost instead of O(α).
const SMALL_NOISE_CUTOFF: f64 = 1e-3;

/// Upper bound on ln A_α at an integer α for the Poisson-subsampled Gaussian with c = 1/(2σ²):
/// A_α = E[e^{c(K² − K)}] with K ~ Binomial(α, q) (the integer-α sum of MTZ 2019 §3.2), and
/// e^x − 1 ≤ x e^x for x ≥ 0 with 0 ≤ c(K² − K) ≤ cα(α − 1) gives
/// A_α − 1 ≤ c·E[K(K − 1)]·e^{cα(α−1)} = c α(α − 1) q² e^{cα(α−1)}. The true A_α − 1 is at least
/// c α(α − 1) q² (e^x − 1 ≥ x), so the bound is within the factor e^{cα(α−1)} of it.
fn ln_a_poisson_small_noise(q: f64, c: f64, alpha: f64) -> f64 {
    let x = c * alpha * (alpha - 1.0);
    (x * q * q * x.exp() * (1.0 + 16.0 * f64::EPSILON)).ln_1p() * (1.0 + 4.0 * f64::EPSILON)
}

/// RDP at order α > 1 of the Poisson-subsampled Gaussian (rate q, noise multiplier σ) under
/// add/remove: ln A_α/(α − 1) (Mironov, Talwar & Zhang 2019, "Rényi differential privacy of the
/// sampled Gaussian mechanism", §3; the (μ‖μ₀) direction computed here dominates the reverse
/// one, §3.1). Integer orders use the exact binomial sum (cancellation-free form, see
/// [`log_am1_poisson_int`]); fractional orders the two-series formula with a rigorous tail and
/// rounding bound, and where that bound is loose (tiny q, where A_α − 1 is below the rounding
/// of the series) the log-convex interpolation between the neighbouring integer orders
/// ([`interpolate_ln_a`]). Orders above [`MAX_SUMMED_ORDER`] use the Gaussian bound α/(2σ²)
/// (subsampling never hurts, by joint convexity). Returns NaN for invalid arguments.
pub fn rdp_poisson_gaussian(q: f64, sigma: f64, alpha: f64) -> f64 {
    if !((0.0..=1.0).contains(&q) && sigma > 0.0 && alpha > 1.0) {
        return f64::NAN;
    }
    if alpha.is_infinite() {
        return f64::INFINITY;
    }
    if q == 0.0 {
        return 0.0;
    }
    if q == 1.0 || alpha > MAX_SUMMED_ORDER {
        return rdp_gaussian(sigma, alpha);
    }
    let c = 1.0 / (2.0 * sigma * sigma);
    let top = alpha.ceil();
    if c * top * (top - 1.0) <= SMALL_NOISE_CUTOFF {
        // Very large σ (the early steps of a diffusion sampler): closed form, O(1).
        let ln_a = if alpha.fract() == 0.0 {
            ln_a_poisson_small_noise(q, c, alpha)
        } else {
            interpolate_ln_a(alpha, |k| ln_a_poisson_small_noise(q, c, k as f64))
        };
        return round_up(nonneg(ln_a) / (alpha - 1.0)).min(rdp_gaussian(sigma, alpha));
    }
    let ln_a_int = |k: u64| log_add_exp(0.0, log_am1_poisson_int(q, sigma, k));
    let ln_a = if alpha.fract() == 0.0 {
        ln_a_int(alpha as u64)
    } else if alpha > FRACTIONAL_SERIES_MAX {
        interpolate_ln_a(alpha, ln_a_int)
    } else {
        let series = ln_a_poisson_frac_upper(q, sigma, alpha).unwrap_or(f64::INFINITY);
        // The series' rounding allowance is ~1e-14 absolute; when ln A is not well above it
        // (tiny q), the interpolation of the exact integer values is the tighter bound.
        if series > 1e-6 && series.is_finite() {
            series
        } else {
            series.min(interpolate_ln_a(alpha, ln_a_int))
        }
    };
    round_up(nonneg(ln_a) / (alpha - 1.0)).min(rdp_gaussian(sigma, alpha))
}

/// Upper bound on ln A_α at a fractional α from upper bounds at the neighbouring integers:
/// α ↦ ln E_Q[(P/Q)^α] is convex (Hölder; van Erven & Harremoës 2014, "Rényi divergence and
/// Kullback-Leibler divergence", Thm 11/Cor. 2 for (α − 1)D_α), so on [k, k + 1]
/// ln A_α ≤ (k + 1 − α) ln A_k + (α − k) ln A_{k+1}, with ln A_1 = 0 exactly. This is the
/// interpolation of Wang, Balle & Kasiviswanathan 2019, Cor. 10.
pub fn interpolate_ln_a<F: FnMut(u64) -> f64>(alpha: f64, mut ln_a_int: F) -> f64 {
    let lo = alpha.floor();
    let t = alpha - lo;
    let k = lo as u64;
    let a_lo = if k <= 1 { 0.0 } else { ln_a_int(k) };
    if t == 0.0 {
        return a_lo;
    }
    let a_hi = ln_a_int(k + 1);
    round_up((1.0 - t) * a_lo + t * a_hi)
}

/// RDP at order α > 1 of the Poisson-subsampled Gaussian under *replace-one*, where σ is
/// relative to the replace-one sensitivity:
/// ln(1 + q(e^{(α−1)α/(2σ²)} − 1))/(α − 1).
///
/// Proof: couple the two Poisson samples by record position. With probability 1 − q the
/// replaced record is not sampled and the two samples are equal; otherwise they differ in that
/// one record (replace-one neighbours). H_α(P‖Q) = E_Q[(P/Q)^α] is an f-divergence with convex
/// f(t) = t^α, hence jointly convex (Csiszár; van Erven & Harremoës 2014, Thm 13), so
/// H_α ≤ (1 − q)·1 + q·e^{(α−1)α/(2σ²)}. A replace-one noise multiplier implies nothing about the
/// change caused by adding or removing a record, and this bound is tight when that change is
/// large; it is much weaker than the add/remove amplification (linear rather than quadratic in
/// q). Account under add/remove when the add/remove sensitivity is known.
pub fn rdp_poisson_gaussian_replace_one(q: f64, sigma: f64, alpha: f64) -> f64 {
    if !((0.0..=1.0).contains(&q) && sigma > 0.0 && alpha > 1.0) {
        return f64::NAN;
    }
    if q == 0.0 {
        return 0.0;
    }
    if alpha.is_infinite() {
        return f64::INFINITY;
    }
    let x = (alpha - 1.0) * alpha / (2.0 * sigma * sigma);
    let ln_h = log_add_exp((-q).ln_1p(), q.ln() + x);
    round_up(nonneg(ln_h) / (alpha - 1.0)).min(rdp_gaussian(sigma, alpha))
}

/// ln(B_α − 1), B_α the Wang, Balle & Kasiviswanathan 2019 ("Subsampled Rényi differential
/// privacy and analytical moments accountant") Thm 9 bound for sampling m of n without
/// replacement (γ = m/n) at integer α ≥ 2, for a base mechanism with RDP ε(·) under replace-one;
/// here the Gaussian, ε(j) = j/(2σ²), ε(∞) = ∞ (so the min{2, (e^{ε(∞)} − 1)^j} factors are 2):
/// B_α = 1 + γ² C(α,2) min{4(e^{ε(2)} − 1), 2e^{ε(2)}} + Σ_{j=3}^{α} 2 γ^j C(α,j) e^{(j−1)ε(j)}.
fn log_bm1_wor_int(gamma: f64, sigma: f64, alpha: u64) -> f64 {
    let a = alpha as f64;
    let lg = gamma.ln();
    let c = 1.0 / (2.0 * sigma * sigma);
    let eps2 = 2.0 * c;
    let mut sum = LogSum::new();
    let lc2 = (a * (a - 1.0) / 2.0).ln();
    sum.add(2.0 * lg + lc2 + (2.0 * LN_2 + log_expm1(eps2)).min(eps2 + LN_2));
    let mut lc = LogBinom::new(a, 3);
    for j in 3..=alpha {
        let jf = j as f64;
        sum.add(LN_2 + jf * lg + lc.next() + (jf - 1.0) * jf * c);
    }
    let mag = a * lg.abs() + c * a * a + 4.0;
    sum.upper(lc.err() + LIBM_REL * mag)
}

/// RDP at order α > 1 of the Gaussian (σ relative to the replace-one sensitivity) run on m of n
/// records sampled without replacement, under replace-one: the minimum of three sound bounds:
/// WBK 2019 Thm 9 (integer α; fractional α by log-convex interpolation between the neighbouring
/// integers, WBK Cor. 10, see [`interpolate_ln_a`]), the joint-convexity bound
/// ln(1 + γ(e^{(α−1)α/(2σ²)} − 1))/(α − 1) (as in [`rdp_poisson_gaussian_replace_one`]; the two
/// samples can be coupled to be equal or replace-one neighbours) and the Gaussian α/(2σ²).
pub fn rdp_wor_gaussian(n: u64, m: u64, sigma: f64, alpha: f64) -> f64 {
    if !(n >= 1 && m >= 1 && m <= n && sigma > 0.0 && alpha > 1.0) {
        return f64::NAN;
    }
    if m == n {
        return rdp_gaussian(sigma, alpha);
    }
    let gamma = m as f64 / n as f64;
    let convexity = rdp_poisson_gaussian_replace_one(gamma, sigma, alpha);
    if alpha > MAX_SUMMED_ORDER {
        return convexity;
    }
    let ln_b = interpolate_ln_a(alpha, |k| log_add_exp(0.0, log_bm1_wor_int(gamma, sigma, k)));
    round_up(nonneg(ln_b) / (alpha - 1.0)).min(convexity)
}

/// RDP at order α of one run of a component (before multiplying by its count).
pub(crate) fn component_rdp(c: &Component, neighbouring: Neighbouring, alpha: f64) -> Result<f64> {
    let s = match c.mechanism {
        Mechanism::Gaussian { noise_multiplier } => noise_multiplier,
        Mechanism::Laplace { noise_multiplier: b } => {
            if c.sampling != Sampling::Full {
                return Err(Error::unsupported(
                    "rdp: a subsampled Laplace mechanism has no closed-form RDP here (only the full-batch \
                     Laplace, Mironov 2017 Prop. 6); use the pld accountant",
                ));
            }
            return convert::clamp_rdp(alpha, rdp_laplace(b, alpha));
        }
        Mechanism::EpsilonDelta { .. } => {
            return Err(Error::unsupported(
                "rdp: an (ε, δ)-DP mechanism has no RDP curve (use the pld accountant)",
            ))
        }
    };
    let r = match (c.sampling, neighbouring) {
        (Sampling::Full, _) => rdp_gaussian(s, alpha),
        (Sampling::Poisson { q }, Neighbouring::AddRemove) => rdp_poisson_gaussian(q, s, alpha),
        (Sampling::Poisson { q }, Neighbouring::ReplaceOne) => rdp_poisson_gaussian_replace_one(q, s, alpha),
        (Sampling::WithoutReplacement { n, m }, Neighbouring::ReplaceOne) => rdp_wor_gaussian(n, m, s, alpha),
        (Sampling::WithoutReplacement { .. }, Neighbouring::AddRemove) => {
            return Err(Error::unsupported(
                "rdp: sampling without replacement needs neighbouring = replace_one",
            ))
        }
    };
    convert::clamp_rdp(alpha, r)
}

/// Composed RDP Σ count·r_c(α) of `components` at each order (Mironov 2017, Prop. 1), each
/// value rounded up.
pub fn rdp_curve(components: &[Component], neighbouring: Neighbouring, orders: &[f64]) -> Result<Vec<f64>> {
    orders
        .iter()
        .map(|&a| {
            check_order(a)?;
            total_rdp(components, neighbouring, a)
        })
        .collect()
}

/// The count as an f64 no smaller than the integer.
fn count_up(count: u64) -> f64 {
    let f = count as f64;
    if (f as u128) < count as u128 {
        f.next_up()
    } else {
        f
    }
}

/// Σ count·r_c(α) over the components, rounded up. Many distinct components (a diffusion
/// sampler's steps) are evaluated in parallel at each order; the sum is taken in component order
/// so the result does not depend on the number of threads.
fn total_rdp(components: &[Component], neighbouring: Neighbouring, alpha: f64) -> Result<f64> {
    use rayon::prelude::*;
    let per: Vec<f64> = if components.len() >= 8 {
        components
            .par_iter()
            .map(|c| component_rdp(c, neighbouring, alpha).map(|r| count_up(c.count) * r))
            .collect::<Result<Vec<f64>>>()?
    } else {
        components
            .iter()
            .map(|c| component_rdp(c, neighbouring, alpha).map(|r| count_up(c.count) * r))
            .collect::<Result<Vec<f64>>>()?
    };
    let total: f64 = per.iter().sum();
    // Summation of n terms: relative error ≤ n·u; the rounding allowance of round_up covers a
    // few ulps, so inflate by the count explicitly.
    Ok(round_up(total * (1.0 + per.len() as f64 * f64::EPSILON)))
}

/// The count as an f64 no larger than the integer.
fn count_down(count: u64) -> f64 {
    let f = count as f64;
    if (f as u128) > count as u128 {
        f.next_down()
    } else {
        f
    }
}

/// At most this many components get lower bounds (many distinct components are evaluated in
/// parallel, and their bounds would cost more than they save).
const LOWER_BOUND_MAX_COMPONENTS: usize = 16;

/// A lower bound on KL(μ‖μ₀) = lim_{α→1} D_α for the Poisson-subsampled Gaussian (add/remove),
/// μ₀ = N(0, σ²), μ = (1 − q)μ₀ + qN(1, σ²), hence on its RDP at every order α > 1 (D_α is
/// nondecreasing in α; van Erven & Harremoës 2014, Thm 3). μ − μ₀ = q(N(1, σ²) − μ₀), so the
/// total variation distance is exactly TV = q·erf(1/(2√2σ)), and Pinsker's inequality gives
/// KL ≥ 2·TV². This keeps the bound positive near α = 1, where the convexity bound of
/// [`RdpLower`] is 0 (and the Bretagnolle–Huber branch of the conversion would read 0 as ε = 0).
fn kl_lower_poisson_gaussian(q: f64, sigma: f64) -> f64 {
    // libm's erf is within an ulp or two; 1e-12 relative covers it and the products.
    let tv = q * libm::erf(1.0 / (2.0 * std::f64::consts::SQRT_2 * sigma)) * (1.0 - 1e-12);
    (2.0 * tv * tv * (1.0 - 1e-12)).max(0.0)
}

/// Lower bounds on the composed RDP at fractional orders, used only to skip orders that cannot
/// beat the best ε (or δ) found so far ([`RdpAccountant::prune`]); never reported.
///
/// For the Poisson-subsampled Gaussian (add/remove), α ↦ ln A_α = (α − 1)·D_α is convex on
/// [0, ∞) (Hölder; van Erven & Harremoës 2014, Thm 11/Cor. 2, as in [`interpolate_ln_a`]) with
/// ln A_0 ≤ 0 = ln A_1. So the slope of ln A anywhere at or beyond k is at least its chord slope
/// on [k − 1, k], and on [α, k + 1] at most the chord slope on [k + 1, k + 2]: for
/// k = ⌊α⌋, t = α − k (the same with anchors h apart, [`RdpLower::at`]),
/// ln A_α ≥ max(0, ln A_k + t·(ln A_k − ln A_{k−1}), ln A_{k+1} − (1 − t)·(ln A_{k+2} − ln A_{k+1})),
/// with lower bounds put in where the bound grows with a value and upper bounds where it shrinks
/// ([`ln_a_poisson_int_bounds`], the exact integer sums of MTZ 2019 §3.2 moved by their rounding
/// allowance). Every value this module returns at α is an upper bound on the true RDP, so it is
/// ≥ this lower bound: an order whose converted lower bound already exceeds the best value seen
/// cannot be the minimum, and skipping it leaves the minimum (and its order) unchanged. The
/// full-batch Gaussian's RDP α/(2σ²) is exact (rounded down here); other components count as 0.
pub(crate) struct RdpLower<'a> {
    comps: &'a [Component],
    nb: Neighbouring,
    /// (component index, k) → bounds on ln A_k.
    memo: std::collections::HashMap<(usize, u64), (f64, f64)>,
    /// Every component is a Gaussian, full-batch or Poisson-subsampled under add/remove (the
    /// ones bounded here): only then are integer orders set aside.
    all_bounded: bool,
}

impl<'a> RdpLower<'a> {
    pub(crate) fn new(comps: &'a [Component], nb: Neighbouring) -> Self {
        let all_bounded = comps.iter().all(|c| match (c.mechanism, c.sampling) {
            (Mechanism::Gaussian { .. }, Sampling::Full) => true,
            (Mechanism::Gaussian { .. }, Sampling::Poisson { .. }) => nb == Neighbouring::AddRemove,
            _ => false,
        });
        RdpLower {
            comps,
            nb,
            memo: std::collections::HashMap::new(),
            all_bounded,
        }
    }

    fn int_bounds(&mut self, i: usize, q: f64, sigma: f64, k: u64) -> (f64, f64) {
        *self
            .memo
            .entry((i, k))
            .or_insert_with(|| ln_a_poisson_int_bounds(q, sigma, k))
    }

    /// At an integer order α ≥ 2 below [`WINDOWED_ORDER`], a line under the composed
    /// (α′ − 1)·r(α′) for every real α′ ≥ α: returns (ℓ, s) with
    /// (α′ − 1)·r(α′) ≥ ℓ + (α′ − α)·s. Per component, ln A is convex (see the type's docs), so
    /// beyond α it lies above the line through ln A_α with the chord slope on [α − 1, α]; lower
    /// bounds are put in for ln A_α and upper bounds for ln A_{α−1}. Full-batch Gaussian:
    /// (α − 1)α/(2σ²) and its chord slope (α − 1)/σ²; other components: (0, 0) (RDP ≥ 0).
    pub(crate) fn line_at(&mut self, alpha: f64) -> Option<(f64, f64)> {
        if !(alpha >= 2.0 && alpha < WINDOWED_ORDER as f64 && alpha.fract() == 0.0)
            || self.comps.len() > LOWER_BOUND_MAX_COMPONENTS
        {
            return None;
        }
        let down = 1.0 - 8.0 * f64::EPSILON;
        let (mut l, mut s) = (0.0f64, 0.0f64);
        for (i, c) in self.comps.iter().enumerate() {
            let (lc, sc) = match (c.mechanism, c.sampling, self.nb) {
                (Mechanism::Gaussian { noise_multiplier: sg }, Sampling::Full, _) => {
                    let v = 1.0 / (2.0 * sg * sg);
                    ((alpha - 1.0) * alpha * v * down, 2.0 * (alpha - 1.0) * v * down)
                }
                (Mechanism::Gaussian { noise_multiplier: sg }, Sampling::Poisson { q }, Neighbouring::AddRemove)
                    if q > 0.0 && q < 1.0 && sg > 0.0 =>
                {
                    let k = alpha as u64;
                    let (lo_k, _) = self.int_bounds(i, q, sg, k);
                    let (_, hi_km1) = self.int_bounds(i, q, sg, k - 1);
                    let slope = lo_k - hi_km1;
                    (lo_k, slope - 4.0 * f64::EPSILON * (lo_k.abs() + hi_km1.abs()))
                }
                _ => (0.0, 0.0),
            };
            let n = count_down(c.count);
            l += n * lc * down;
            s += n * sc - 4.0 * f64::EPSILON * (n * sc).abs();
        }
        let slack = (self.comps.len() as f64 + 4.0) * f64::EPSILON;
        Some((l * (1.0 - slack), s - slack * s.abs()))
    }

    /// A lower bound on the composed RDP at order α (≤ every value [`total_rdp`] can return
    /// there), or None where none is computed: at the anchors (every integer below 16, the
    /// multiples of 8 above), from 240 up, for many components, and at integer orders when some
    /// component is not bounded here. The bound of the type's docs is used with anchors h apart
    /// (h = 1 below 16, 8 above): with k₁ = h⌊α/h⌋ and t = α − k₁,
    /// ln A_α ≥ max(ln A_{k₁} + t·(ln A_{k₁} − ln A_{k₁−h})/h,
    /// ln A_{k₁+h} − (h − t)·(ln A_{k₁+2h} − ln A_{k₁+h})/h), and at least the KL bound
    /// [`kl_lower_poisson_gaussian`] times α − 1.
    pub(crate) fn at(&mut self, alpha: f64) -> Option<f64> {
        // Anchor spacing: neighbouring integers below 16, multiples of 8 above.
        let h: u64 = if alpha < 16.0 { 1 } else { 8 };
        let hf = h as f64;
        let k1 = h * (alpha / hf).floor() as u64;
        if !(alpha > 1.0 && alpha != k1 as f64 && k1 + 2 * h < WINDOWED_ORDER)
            || self.comps.len() > LOWER_BOUND_MAX_COMPONENTS
            || (alpha.fract() == 0.0 && !self.all_bounded)
        {
            return None;
        }
        let down = 1.0 - 8.0 * f64::EPSILON;
        let mut total = 0.0;
        for (i, c) in self.comps.iter().enumerate() {
            let r = match (c.mechanism, c.sampling, self.nb) {
                (Mechanism::Gaussian { noise_multiplier: s }, Sampling::Full, _) => alpha / (2.0 * s * s) * down,
                (Mechanism::Gaussian { noise_multiplier: s }, Sampling::Poisson { q }, Neighbouring::AddRemove)
                    if q > 0.0 && q < 1.0 && s > 0.0 =>
                {
                    // Anchors k0 < k1 ≤ α < k2 < k3, h apart.
                    let (k0, k2, k3) = (k1.saturating_sub(h), k1 + h, k1 + 2 * h);
                    let t = alpha - k1 as f64;
                    let (lo_k, _) = self.int_bounds(i, q, s, k1);
                    let (lo_k1, _) = self.int_bounds(i, q, s, k2);
                    let (_, hi_k2) = self.int_bounds(i, q, s, k3);
                    // ln A_0 ≤ 0 = ln A_1: for k1 = 1 the chord slope on [0, 1] is ≥ 0.
                    let (_, hi_km1) = if k0 >= 1 {
                        self.int_bounds(i, q, s, k0)
                    } else {
                        (0.0, 0.0)
                    };
                    let left = lo_k + t * (lo_k - hi_km1) / hf;
                    let right = lo_k1 - (hf - t) * (hi_k2 - lo_k1) / hf;
                    // The few operations above round by a few ulps of the values involved.
                    let margin = 8.0 * f64::EPSILON * (lo_k.abs() + hi_km1.abs() + lo_k1.abs() + hi_k2.abs());
                    let ln_a = (left.max(right) - margin).max(0.0);
                    (ln_a / (alpha - 1.0) * down).max(kl_lower_poisson_gaussian(q, s))
                }
                _ => 0.0,
            };
            total += count_down(c.count) * r * down;
        }
        Some(total * (1.0 - (self.comps.len() as f64 + 4.0) * f64::EPSILON))
    }
}

fn check_order(a: f64) -> Result<()> {
    if a.is_nan() || a <= 1.0 {
        return Err(Error::field("orders", format!("RDP orders must be > 1, got {a}")));
    }
    Ok(())
}

/// Checks the event tree for shapes RDP cannot account, naming the path of the offending
/// sub-event, then flattens it into components.
pub(crate) fn rdp_components(event: &DpEvent, neighbouring: Neighbouring) -> Result<Vec<Component>> {
    check_tree(event, neighbouring, "event")?;
    let comps = event.components()?;
    if comps
        .iter()
        .any(|c| matches!(c.mechanism, Mechanism::Laplace { .. }) && c.sampling != Sampling::Full)
    {
        return Err(Error::unsupported(
            "rdp: a subsampled Laplace mechanism has no closed-form RDP here (only the full-batch Laplace, \
             Mironov 2017 Prop. 6); use the pld accountant",
        ));
    }
    Ok(comps)
}

fn check_tree(ev: &DpEvent, nb: Neighbouring, path: &str) -> Result<()> {
    match ev {
        DpEvent::NoOp | DpEvent::Gaussian { .. } | DpEvent::Laplace { .. } => Ok(()),
        // Answered ε = ∞ before the tree is checked (`accountants::non_private_epsilon`).
        DpEvent::NonPrivate => Err(Error::unsupported(format!(
            "rdp: {path} is non-private (no guarantee): no RDP curve, ε = ∞"
        ))),
        DpEvent::EpsilonDelta { epsilon, delta } => Err(Error::unsupported(format!(
            "rdp: {path} is an (ε = {epsilon}, δ = {delta})-DP event; an (ε, δ) guarantee has no RDP curve \
             (use the pld accountant, or describe the mechanism itself)"
        ))),
        DpEvent::PoissonSampled { event, .. } => check_tree(event, nb, &format!("{path}.event")),
        DpEvent::SampledWithoutReplacement { event, .. } => {
            if nb == Neighbouring::AddRemove {
                return Err(Error::unsupported(format!(
                    "rdp: {path}: sampling without replacement is only accounted under neighbouring = \
                     replace_one (a fixed-size sample of n records is not defined when n changes)"
                )));
            }
            check_tree(event, nb, &format!("{path}.event"))
        }
        DpEvent::Composed { events } => {
            for (i, e) in events.iter().enumerate() {
                check_tree(e, nb, &format!("{path}.events[{i}]"))?;
            }
            Ok(())
        }
        DpEvent::SelfComposed { event, .. } => check_tree(event, nb, &format!("{path}.event")),
    }
}

/// Per-step RDP of RAPID's Theorem 1, (α, 2α/σ²) (sensitivity 2C/B, noise (C/B)σ), composed over
/// `steps` with no amplification by subsampling, converted with `conversion` and minimised over
/// `orders`. Returns (ε, α). RAPID (seeds/rapid.md, Thm 1 and §A) states only the per-step RDP;
/// the composition is Mironov 2017 Prop. 1.
pub fn rapid_thm1_epsilon(
    sigma: f64,
    steps: u64,
    delta: f64,
    orders: &RapidOrders,
    conversion: Conversion,
) -> Result<(f64, f64)> {
    check_delta(delta)?;
    if !(sigma > 0.0 && sigma.is_finite()) {
        return Err(Error::field(
            "noise_multiplier",
            format!("must be finite and > 0, got {sigma}"),
        ));
    }
    if steps == 0 {
        return Ok((0.0, f64::NAN));
    }
    let t = count_up(steps);
    let r = |a: f64| round_up(t * 2.0 * a / (sigma * sigma));
    let eps = |a: f64| convert::epsilon_at_order(a, r(a), delta, conversion);
    // Classic: ε(α) = 2Tα/σ² + L/(α − 1), minimised at α* = 1 + √(Lσ²/(2T)); convex in α.
    let l = -delta.ln();
    let a_star = 1.0 + (l * sigma * sigma / (2.0 * t)).sqrt();
    match orders {
        RapidOrders::Continuous => {
            if conversion == Conversion::Classic {
                return Ok((eps(a_star), a_star));
            }
            Ok(golden_min(
                eps,
                1.0 + (a_star - 1.0) / 64.0,
                1.0 + (a_star - 1.0) * 64.0,
                200,
            ))
        }
        RapidOrders::Integers { lo, hi } => {
            if !(*lo >= 2 && lo <= hi) {
                return Err(Error::field("orders", format!("need 2 ≤ lo ≤ hi, got {lo}..{hi}")));
            }
            // ε is convex in α (both conversions): check the integers around α*, then walk.
            let mut a = (a_star.floor() as u64).clamp(*lo, *hi);
            while a > *lo && eps((a - 1) as f64) <= eps(a as f64) {
                a -= 1;
            }
            while a < *hi && eps((a + 1) as f64) < eps(a as f64) {
                a += 1;
            }
            Ok((eps(a as f64), a as f64))
        }
        RapidOrders::Grid(g) => {
            let rdp: Vec<f64> = g.iter().map(|&a| r(a)).collect();
            convert::epsilon_from_rdp(g, &rdp, delta, conversion)
        }
    }
}

/// Which orders [`rapid_thm1_epsilon`] minimises over.
#[derive(Debug, Clone, PartialEq)]
pub enum RapidOrders {
    /// Any real α > 1.
    Continuous,
    /// Integer orders lo..=hi.
    Integers {
        /// Smallest order (≥ 2).
        lo: u64,
        /// Largest order.
        hi: u64,
    },
    /// A given list (e.g. [`dp_accounting_orders`]).
    Grid(Vec<f64>),
}

/// Golden-section minimisation of f on [lo, hi]; returns (min f seen, argmin). Every point
/// evaluated is a valid order, so the returned value is as sound as f itself. Hand-written
/// rather than argmin's `GoldenSectionSearch`: we need the smallest value actually evaluated
/// (an ε at a real order), not the interpolated optimum, and a fixed iteration count.
fn golden_min<F: FnMut(f64) -> f64>(mut f: F, lo: f64, hi: f64, iters: usize) -> (f64, f64) {
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (lo, hi);
    let mut x1 = b - g * (b - a);
    let mut x2 = a + g * (b - a);
    let (mut f1, mut f2) = (f(x1), f(x2));
    let mut best = if f1 <= f2 { (f1, x1) } else { (f2, x2) };
    for _ in 0..iters {
        if f1 <= f2 {
            b = x2;
            x2 = x1;
            f2 = f1;
            x1 = b - g * (b - a);
            f1 = f(x1);
            if f1 < best.0 {
                best = (f1, x1);
            }
        } else {
            a = x1;
            x1 = x2;
            f1 = f2;
            x2 = a + g * (b - a);
            f2 = f(x2);
            if f2 < best.0 {
                best = (f2, x2);
            }
        }
        if (b - a) <= 1e-10 * b.abs() {
            break;
        }
    }
    best
}

/// The refinement of the best order stops once its bracket is this narrow relative to the
/// order (at the minimum ε(α) is flat: an order off by 1e-9·α changes ε by ~1e-18·α²·ε″).
const REFINE_REL_TOL: f64 = 1e-7;

/// At most this many evaluations refine the best order (Brent's method needs ~10 on these
/// smooth curves; the bound only matters for a pathological curve).
const REFINE_MAX_EVALS: usize = 60;

/// Brent's minimisation without derivatives (R. P. Brent 1973, "Algorithms for minimization
/// without derivatives", ch. 5: a parabola through the three best points so far where it
/// steps well inside the bracket, a golden-section step otherwise) of f on [lo, hi], starting
/// from the point `start` = (x₀, f(x₀)) already evaluated (the best grid order); `ends` are the
/// bracket ends with f there where known (grid orders evaluated before), used as the first
/// interpolation points. Stops when the bracket is within `rel_tol`·x of the best point x, or
/// after `max_evals` evaluations. Returns the smallest value seen (f₀ included) and its point.
/// Every point evaluated is a valid order, so the value is as sound as f itself; the caller
/// keeps whatever point gave it.
fn brent_min<F: FnMut(f64) -> f64>(
    mut f: F,
    (lo, hi): (f64, f64),
    start: (f64, f64),
    ends: [(f64, Option<f64>); 2],
    rel_tol: f64,
    max_evals: usize,
) -> (f64, f64) {
    const CGOLD: f64 = 0.381_966_011_250_105_1; // (3 − √5)/2
    let (mut a, mut b) = (lo, hi);
    let (mut x, mut fx) = start;
    let (mut w, mut fw, mut v, mut fv) = (x, fx, x, fx);
    let (mut d, mut e) = (0.0f64, 0.0f64);
    let known: Vec<(f64, f64)> = ends
        .iter()
        .filter_map(|&(p, fp)| fp.filter(|_| p != x).map(|fp| (p, fp)))
        .collect();
    if known.len() == 2 {
        // Both neighbours known: the first step may be the parabola through all three.
        let (p0, p1) = if known[0].1 <= known[1].1 {
            (known[0], known[1])
        } else {
            (known[1], known[0])
        };
        (w, fw, v, fv) = (p0.0, p0.1, p1.0, p1.1);
        d = b - a;
        e = b - a;
    }
    // The last step was a parabolic one of at most 2·tol1, or a probe that did not improve.
    let mut settled = false;
    for _ in 0..max_evals {
        let xm = 0.5 * (a + b);
        let tol1 = rel_tol * x.abs() + f64::MIN_POSITIVE;
        let tol2 = 2.0 * tol1;
        if (x - xm).abs() <= tol2 - 0.5 * (b - a) || b - a <= 2.0 * tol2 * (1.0 + 1e-9) {
            break;
        }
        let mut golden = true;
        let probe = settled && b - a > 2.0 * tol2;
        if probe {
            // The best point has stopped moving but one side of the bracket is still wide
            // (golden steps would shrink it by 0.618 per evaluation): try 2·tol1 past the best
            // point toward that side; unless it is better, it becomes that end of the bracket.
            e = d;
            d = if b - x > x - a { tol2 } else { -tol2 };
            golden = false;
        } else if e.abs() > tol1 {
            // Parabola through (v, fv), (w, fw), (x, fx): its vertex is x + p/q.
            let r = (x - w) * (fx - fv);
            let mut q = (x - v) * (fx - fw);
            let mut p = (x - v) * q - (x - w) * r;
            q = 2.0 * (q - r);
            if q > 0.0 {
                p = -p;
            } else {
                q = -q;
            }
            let e_prev = e;
            e = d;
            // Accept it if it moves less than half the step before last and stays inside.
            if p.abs() < (0.5 * q * e_prev).abs() && p > q * (a - x) && p < q * (b - x) {
                d = p / q;
                let u = x + d;
                if u - a < tol2 || b - u < tol2 {
                    d = tol1.copysign(xm - x);
                }
                golden = false;
            }
        }
        if golden {
            e = if x >= xm { a - x } else { b - x };
            d = CGOLD * e;
        }
        let u = if d.abs() >= tol1 { x + d } else { x + tol1.copysign(d) };
        let fu = f(u);
        settled = if probe {
            fu > fx
        } else {
            !golden && d.abs() <= 10.0 * tol2
        };
        if fu <= fx {
            if u >= x {
                a = x;
            } else {
                b = x;
            }
            (v, fv, w, fw, x, fx) = (w, fw, x, fx, u, fu);
        } else {
            if u < x {
                a = u;
            } else {
                b = u;
            }
            if fu <= fw || w == x {
                (v, fv, w, fw) = (w, fw, u, fu);
            } else if fu <= fv || v == x || v == w {
                (v, fv) = (u, fu);
            }
        }
    }
    (fx, x)
}

/// The RDP accountant. Result kind: [`BoundKind::UpperBound`]; details: `rdp_order` (the order
/// that gave the answer) and `rdp` (the composed RDP there).
#[derive(Debug, Clone)]
pub struct RdpAccountant {
    /// Orders α > 1 to evaluate (any order; sorted internally).
    pub orders: Vec<f64>,
    /// RDP → (ε, δ) conversion used.
    pub conversion: Conversion,
    /// Refine the best grid order by Brent's method between its neighbours ([`brent_min`], to
    /// [`REFINE_REL_TOL`]). Every order evaluated gives a valid bound, so this only tightens ε.
    pub optimize: bool,
    /// Skip orders that cannot win. Stop walking up the (sorted) grid once larger orders cannot
    /// win: for ε, once a lower bound on ε(α') for all α' ≥ α exceeds the best ε (classic: r(α);
    /// improved: r(α) + ln(1 − 1/α) − ln m/(m − 1), m = max(α, 1/δ); RDP grows with the order;
    /// or the same from the line under (α′ − 1)r(α′) of [`RdpLower::line_at`]); for δ, once
    /// (α − 1)(r − ε) − 1 − ln α exceeds the best ln δ while r − ε > 1/α. Fractional orders and
    /// integer orders between anchors are set aside behind the lower bounds of [`RdpLower::at`]
    /// and evaluated only while those bounds do not exceed the best value. Affects speed, not
    /// the answer (the grid minimum and its order are those of the exhaustive walk; every order
    /// evaluated is a valid bound).
    pub prune: bool,
}

impl Default for RdpAccountant {
    fn default() -> Self {
        RdpAccountant {
            orders: default_orders(),
            conversion: Conversion::Improved,
            optimize: true,
            prune: true,
        }
    }
}

impl RdpAccountant {
    /// Exactly dp_accounting's grid and conversion (no refinement): reproduces its numbers.
    pub fn dp_accounting_compatible() -> Self {
        RdpAccountant {
            orders: dp_accounting_orders(),
            conversion: Conversion::Improved,
            optimize: false,
            prune: false,
        }
    }
    /// The same accountant with another RDP → (ε, δ) conversion.
    pub fn with_conversion(mut self, conversion: Conversion) -> Self {
        self.conversion = conversion;
        self
    }
    /// The same accountant minimising over `orders` instead of its default grid.
    pub fn with_orders(mut self, orders: Vec<f64>) -> Self {
        self.orders = orders;
        self
    }

    fn sorted_orders(&self) -> Result<Vec<f64>> {
        if self.orders.is_empty() {
            return Err(Error::field("orders", "the RDP order list is empty"));
        }
        let mut o = self.orders.clone();
        for &a in &o {
            check_order(a)?;
        }
        o.sort_by(f64::total_cmp);
        o.dedup();
        Ok(o)
    }

    /// Minimises `score(α, r(α))` over the grid (optionally pruned and refined); returns
    /// (score, α, r(α)). `floor` is the smallest score possible (ε clamped at 0, ln δ = −∞):
    /// when pruning, the search stops as soon as it is reached.
    fn minimise<S: Fn(f64, f64) -> f64, P: Fn(f64, f64, f64) -> bool>(
        &self,
        comps: &[Component],
        nb: Neighbouring,
        score: S,
        hopeless: P,
        floor: f64,
    ) -> Result<(f64, f64, f64)> {
        let mut bounds = RdpLower::new(comps, nb);
        self.minimise_with(
            &mut |a| total_rdp(comps, nb, a),
            &mut bounds,
            score,
            hopeless,
            |_, _, _, _| false,
            floor,
        )
    }

    /// [`Self::minimise`] with the composed RDP given by `rdp` (e.g. memoised across δ) and lower
    /// bounds on it from `bounds`.
    ///
    /// Without pruning every grid order is evaluated. With pruning, the grid is walked upwards
    /// evaluating the orders that have no lower bound (the anchors of [`RdpLower::at`]) and
    /// setting aside those that have one (fractional orders, each a slower series, and integer
    /// orders between anchors), until
    /// `hopeless` says no larger order can win; then the set-aside orders are evaluated in
    /// increasing order of `score(α, lower(α))`, stopping at the first whose bound exceeds the
    /// best score. `score` is nondecreasing in r, so a skipped order's score is above the
    /// minimum: the minimum and its order (the smallest order among equal scores) are those of
    /// the exhaustive walk. The walk also stops at an integer order α once `line_hopeless(α, ℓ,
    /// s, best)` holds for the line ℓ + (α′ − α)·s under (α′ − 1)·r(α′) of
    /// [`RdpLower::line_at`] (checked first with the line through the computed values at α − 1
    /// and α, which costs nothing, and only then with the rigorous one).
    fn minimise_with<S: Fn(f64, f64) -> f64, P: Fn(f64, f64, f64) -> bool, L: Fn(f64, f64, f64, f64) -> bool>(
        &self,
        rdp: &mut dyn FnMut(f64) -> Result<f64>,
        bounds: &mut RdpLower<'_>,
        score: S,
        hopeless: P,
        line_hopeless: L,
        floor: f64,
    ) -> Result<(f64, f64, f64)> {
        let orders = self.sorted_orders()?;
        let mut best = (f64::INFINITY, orders[0], f64::INFINITY);
        let mut best_i = 0;
        let mut evaluated = 0;
        // Scores of the orders evaluated (index → score), for seeding the refinement.
        let mut seen: Vec<Option<f64>> = vec![None; orders.len()];
        // (lower bound on the score, index) of the orders set aside.
        let mut aside: Vec<(f64, usize)> = Vec::new();
        // The previous integer order evaluated and its composed RDP.
        let mut prev_int: Option<(f64, f64)> = None;
        for (i, &a) in orders.iter().enumerate() {
            evaluated = i + 1;
            if self.prune {
                if let Some(rl) = bounds.at(a) {
                    aside.push((score(a, rl), i));
                    continue;
                }
            }
            let r = rdp(a)?;
            let s = score(a, r);
            seen[i] = Some(s);
            if s < best.0 {
                best = (s, a, r);
                best_i = i;
            }
            if self.prune && (best.0 <= floor || (a >= 2.0 && hopeless(a, r, best.0))) {
                break;
            }
            if self.prune && a >= 2.0 && a.fract() == 0.0 {
                if let Some((pa, pr)) = prev_int {
                    let l_est = (a - 1.0) * r;
                    if line_hopeless(a, l_est, (l_est - (pa - 1.0) * pr) / (a - pa), best.0) {
                        if let Some((l, sl)) = bounds.line_at(a) {
                            if line_hopeless(a, l, sl, best.0) {
                                break;
                            }
                        }
                    }
                }
                prev_int = Some((a, r));
            }
        }
        aside.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        for &(bound, i) in &aside {
            if bound > best.0 {
                break;
            }
            if bound == best.0 && i > best_i {
                continue;
            }
            let a = orders[i];
            let r = rdp(a)?;
            let s = score(a, r);
            seen[i] = Some(s);
            if s < best.0 || (s == best.0 && i < best_i) {
                best = (s, a, r);
                best_i = i;
            }
        }
        if self.optimize && evaluated >= 2 && best.0.is_finite() && best.0 > floor && best.1 <= REFINE_MAX_ORDER {
            let lo = if best_i == 0 {
                1.0 + (orders[0] - 1.0) / 4.0
            } else {
                orders[best_i - 1]
            };
            let hi_i = (best_i + 1).min(evaluated - 1);
            let hi = orders[hi_i];
            if hi > lo {
                let mut err = None;
                let mut refined = best;
                let known = |j: usize| if j < orders.len() { seen[j] } else { None };
                let lo_s = if best_i == 0 { None } else { known(best_i - 1) };
                let mut eval = |a: f64| match rdp(a) {
                    Ok(r) => {
                        let s = score(a, r);
                        if s < refined.0 {
                            refined = (s, a, r);
                        }
                        s
                    }
                    Err(e) => {
                        err = Some(e);
                        f64::INFINITY
                    }
                };
                let (found, _) = brent_min(
                    &mut eval,
                    (lo, hi),
                    (best.1, best.0),
                    [(lo, lo_s), (hi, known(hi_i))],
                    REFINE_REL_TOL,
                    REFINE_MAX_EVALS,
                );
                // No order better than the grid's: the curve may be flat around it with a narrow
                // dip elsewhere (ln δ clamped at 0 on most of the bracket); the 40-step
                // golden-section search, which leans to the lower end on ties, is tried then.
                if found >= best.0 {
                    golden_min(&mut eval, lo, hi, 40);
                }
                if let Some(e) = err {
                    return Err(e);
                }
                if refined.0 < best.0 {
                    best = refined;
                }
            }
        }
        Ok(best)
    }

    /// ε(δ) of the flattened components, the composed RDP at order α given by `rdp`.
    fn epsilon_of(
        &self,
        comps: &[Component],
        neighbouring: Neighbouring,
        delta: f64,
        rdp: &mut dyn FnMut(f64) -> Result<f64>,
    ) -> Result<Evidence> {
        if comps.is_empty() {
            return Ok(Evidence::of(AccountantKind::Rdp, 0.0, delta, BoundKind::UpperBound));
        }
        let conv = self.conversion;
        let mut bounds = RdpLower::new(comps, neighbouring);
        let (eps, order, r) = self.minimise_with(
            rdp,
            &mut bounds,
            |a, r| convert::epsilon_at_order(a, r, delta, conv),
            // For α' ≥ α ≥ 2 and r nondecreasing in the order: classic ε(α') ≥ r(α); improved
            // ε(α') = r(α') + ln(1 − 1/α') + (ln(1/δ) − ln α')/(α' − 1) ≥ r(α) + ln(1 − 1/α) −
            // ln m/(m − 1) with m = max(α, 1/δ) (the last term is ≥ 0 while α' ≤ 1/δ, and
            // ln x/(x − 1) decreases). Stopping only skips orders, so ε stays sound either way.
            move |a, r, best| match conv {
                Conversion::Classic => r > best,
                Conversion::Improved => {
                    let m = a.max(1.0 / delta);
                    r + (-1.0 / a).ln_1p() - m.ln() / (m - 1.0) > best
                }
            },
            // With (α′ − 1)r(α′) ≥ ℓ + (α′ − α)s for α′ ≥ α and C = ℓ − (α − 1)s + ln(1/δ):
            // classic ε(α′) ≥ s + C/(α′ − 1) ≥ s + min(0, C/(α − 1)); improved
            // ε(α′) ≥ s + ln(1 − 1/α) + (C − ln α′)/(α′ − 1), whose last term is
            // ≥ −ln m/(m − 1), m = max(α, e^C), when C ≥ 0 (as above) and ≥ (C − ln α)/(α − 1)
            // when C < 0. The Bretagnolle–Huber branch (ε = 0 while r < −ln(1 − δ²)) cannot
            // apply when r(α) ≥ ℓ/(α − 1) is above that. Margins cover the rounding.
            move |a, l, s, best| {
                let tv_r = -(-delta * delta).ln_1p();
                // (NaN falls through to a NaN bound, which never stops the walk.)
                if l / (a - 1.0) <= tv_r * (1.0 + 1e-9) + f64::MIN_POSITIVE {
                    return false;
                }
                let c = l - (a - 1.0) * s - delta.ln();
                let lb = match conv {
                    Conversion::Classic => s + (c / (a - 1.0)).min(0.0),
                    Conversion::Improved => {
                        let tail = if c >= 0.0 {
                            let m = a.max(c.min(700.0).exp());
                            -(m.ln() / (m - 1.0))
                        } else {
                            (c - a.ln()) / (a - 1.0)
                        };
                        s + (-1.0 / a).ln_1p() + tail
                    }
                };
                lb - 1e-12 * (s.abs() + c.abs() / (a - 1.0) + 1.0) > best
            },
            // ε ≤ 0 is reported as round_up(0) = the smallest positive double; no order does better.
            f64::MIN_POSITIVE,
        )?;
        if eps.is_nan() {
            return Err(Error::numeric("rdp: ε is NaN"));
        }
        let res = Evidence::of(AccountantKind::Rdp, eps, delta, BoundKind::UpperBound)
            .with_detail("rdp_order", order)
            .with_detail("rdp", r);
        Ok(self.annotate(res, comps, neighbouring, order))
    }

    fn annotate(&self, mut res: Evidence, comps: &[Component], nb: Neighbouring, order: f64) -> Evidence {
        res = res.with_detail(
            "conversion_improved",
            if self.conversion == Conversion::Improved {
                1.0
            } else {
                0.0
            },
        );
        if nb == Neighbouring::ReplaceOne && comps.iter().any(|c| matches!(c.sampling, Sampling::Poisson { .. })) {
            res = res.with_diagnostic(
                "rdp_poisson_replace_one",
                "Poisson subsampling under replace-one: the joint-convexity bound \
                 ln(1 + q(e^{(α−1)α/(2σ²)} − 1))/(α − 1) was used (a replace-one noise multiplier says nothing \
                 about adding or removing a record); account under add_remove with the add/remove noise \
                 multiplier for the usual, much stronger amplification",
                false,
            );
        }
        if let Ok(o) = self.sorted_orders() {
            if order >= *o.last().unwrap() {
                res = res.with_diagnostic(
                    "rdp_order_at_grid_end",
                    format!("the best RDP order {order} is the largest order evaluated; more orders may lower ε"),
                    false,
                );
            }
        }
        res
    }
}

impl Accountant for RdpAccountant {
    fn kind(&self) -> AccountantKind {
        AccountantKind::Rdp
    }

    fn supports(&self, event: &DpEvent, neighbouring: Neighbouring) -> Result<()> {
        if event.non_private_path().is_some() {
            return Ok(());
        }
        rdp_components(event, neighbouring).map(|_| ())
    }

    fn epsilon(&self, event: &DpEvent, neighbouring: Neighbouring, delta: f64) -> Result<Evidence> {
        check_delta(delta)?;
        event.validate()?;
        if let Some(r) = super::non_private_epsilon(AccountantKind::Rdp, event, delta) {
            return Ok(r);
        }
        let comps = rdp_components(event, neighbouring)?;
        if let Some(r) = super::uncertified_epsilon(AccountantKind::Rdp, event, delta) {
            return Ok(r);
        }
        self.epsilon_of(&comps, neighbouring, delta, &mut |a| total_rdp(&comps, neighbouring, a))
    }

    /// One RDP curve, many conversions: the composed RDP at each order is computed once
    /// (memoised by order); ε at `delta` is exactly `epsilon`'s (grid orders and refinement),
    /// ε at each grid δ the best conversion over the grid orders (no refinement: a sound upper
    /// bound, equal to `epsilon` at that δ without refinement, never below it with).
    fn epsilon_profile(
        &self,
        event: &DpEvent,
        neighbouring: Neighbouring,
        delta: f64,
        grid: &[f64],
    ) -> (Result<Evidence>, Vec<Result<Evidence>>) {
        if let (Ok(()), Some(r)) = (
            check_delta(delta).and_then(|_| event.validate()),
            super::non_private_epsilon(AccountantKind::Rdp, event, delta),
        ) {
            let rest = super::guarded_at_each(grid.iter().copied(), |d| {
                super::non_private_epsilon(AccountantKind::Rdp, event, d)
            });
            return (Ok(r), rest);
        }
        let comps = match check_delta(delta)
            .and_then(|_| event.validate())
            .and_then(|_| rdp_components(event, neighbouring))
        {
            Ok(c) => c,
            Err(e) => return (Err(e.clone()), grid.iter().map(|_| Err(e.clone())).collect()),
        };
        // Degenerate-input guard: noise below the certified range is ε = ∞ at every δ.
        if let Some(r) = super::uncertified_epsilon(AccountantKind::Rdp, event, delta) {
            let rest = super::guarded_at_each(grid.iter().copied(), |d| {
                super::uncertified_epsilon(AccountantKind::Rdp, event, d)
            });
            return (Ok(r), rest);
        }
        let mut memo: std::collections::HashMap<u64, f64> = std::collections::HashMap::new();
        let mut rdp = |a: f64| -> Result<f64> {
            if let Some(&r) = memo.get(&a.to_bits()) {
                return Ok(r);
            }
            let r = total_rdp(&comps, neighbouring, a)?;
            memo.insert(a.to_bits(), r);
            Ok(r)
        };
        let head = self.epsilon_of(&comps, neighbouring, delta, &mut rdp);
        let unrefined = RdpAccountant {
            optimize: false,
            ..self.clone()
        };
        let rest = grid
            .iter()
            .map(|&d| {
                check_delta(d)?;
                unrefined.epsilon_of(&comps, neighbouring, d, &mut rdp)
            })
            .collect();
        (head, rest)
    }

    fn delta(&self, event: &DpEvent, neighbouring: Neighbouring, epsilon: f64) -> Result<Evidence> {
        check_epsilon(epsilon)?;
        event.validate()?;
        if let Some(r) = super::non_private_delta(AccountantKind::Rdp, event, epsilon) {
            return Ok(r);
        }
        let comps = rdp_components(event, neighbouring)?;
        if let Some(r) = super::uncertified_delta(AccountantKind::Rdp, event, epsilon) {
            return Ok(r);
        }
        if comps.is_empty() {
            return Ok(Evidence::of(AccountantKind::Rdp, epsilon, 0.0, BoundKind::UpperBound));
        }
        let conv = self.conversion;
        let (ld, order, r) = self.minimise(
            &comps,
            neighbouring,
            |a, r| convert::log_delta_at_order(a, r, epsilon, conv),
            // ln δ(α') ≥ (α' − 1)(r(α') − ε) − 1 − ln α' (both conversions, using
            // (α'−1)ln(1 − 1/α') ≥ −1); once r > ε + 1/α this grows with α'.
            |a, r, best| r - epsilon > 1.0 / a && (a - 1.0) * (r - epsilon) - 1.0 - a.ln() > best,
            f64::NEG_INFINITY,
        )?;
        if ld.is_nan() {
            return Err(Error::numeric("rdp: δ is NaN"));
        }
        // δ below the f64 range is reported as the smallest positive double above it (a
        // provable bound), never as 0; ln δ is kept in the details.
        let (delta, underflow) = crate::numeric::exp_upper(ld);
        let mut res = Evidence::of(AccountantKind::Rdp, epsilon, delta.min(1.0), BoundKind::UpperBound)
            .with_detail("rdp_order", order)
            .with_detail("rdp", r)
            .with_detail("log_delta", ld);
        if underflow {
            res = res.with_diagnostic(
                "delta_below_f64_range",
                format!("δ = e^{ld} is below the f64 range; reported as {delta:e}, an upper bound (ln δ = {ld})"),
                false,
            );
        }
        Ok(self.annotate(res, &comps, neighbouring, order))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The windowed sum of large orders equals the full O(α) sum to within their rounding
    /// allowances (≈ 1e-9 to 4e-7 in ln here): no term that matters is left out, and the remainders'
    /// bounds are ≤ e^{−50} of the sum.
    #[test]
    fn windowed_large_orders_equal_the_full_sum() {
        let mut checked = 0;
        for &alpha in &[256u64, 1000, 4096, 10_007, 100_000, 1_048_576] {
            for &q in &[1e-6, 1e-3, 0.05, 0.5, 0.9] {
                for &two_c_a in &[1e-6, 1e-3, 0.1, 1.0] {
                    let sigma = (alpha as f64 / two_c_a).sqrt();
                    let w = log_am1_poisson_window(q, sigma, alpha).expect("windowed");
                    let f = log_am1_poisson_full(q, sigma, alpha);
                    assert!(
                        (w - f).abs() <= 1e-8 * f.abs().max(1.0),
                        "α={alpha} q={q} 2cα={two_c_a}: window {w} vs full {f}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 120);
        // Outside its range it declines.
        assert!(log_am1_poisson_window(0.5, 10.0, 4096).is_none());
    }

    /// A_α by the textbook integer formula summed directly in f64 (with the k = 0, 1 terms),
    /// for moderate q where the cancellation-free form and the direct sum must agree.
    fn direct_int(q: f64, sigma: f64, alpha: u64) -> f64 {
        let a = alpha as f64;
        let terms: Vec<f64> = (0..=alpha)
            .map(|k| {
                let kf = k as f64;
                let lc = ln_gamma(a + 1.0) - ln_gamma(kf + 1.0) - ln_gamma(a - kf + 1.0);
                lc + (a - kf) * (1.0 - q).ln() + kf * q.ln() + (kf * kf - kf) / (2.0 * sigma * sigma)
            })
            .collect();
        crate::numeric::log_sum_exp(&terms) / (a - 1.0)
    }

    #[test]
    fn integer_formula_matches_direct_sum() {
        for &(q, s) in &[(0.01, 1.0), (0.1, 0.8), (0.5, 2.0), (0.001, 5.0)] {
            for &a in &[2u64, 3, 7, 32, 100] {
                let ours = rdp_poisson_gaussian(q, s, a as f64);
                let want = direct_int(q, s, a);
                // The direct sum of terms near 1 has ~1e-16 absolute error in ln A.
                assert!(
                    (ours - want).abs() <= 1e-9 * want + 1e-14,
                    "q={q} s={s} a={a} {ours} {want}"
                );
            }
        }
    }

    #[test]
    fn alpha_two_closed_form_tiny_q() {
        // A_2 − 1 = q²(e^{1/σ²} − 1) exactly; the direct sum loses it entirely for q = 1e-9.
        for &q in &[1e-9, 1e-6, 0.3] {
            let s: f64 = 1.3;
            let want = (q * q * (1.0 / (s * s)).exp_m1()).ln_1p();
            let ours = rdp_poisson_gaussian(q, s, 2.0);
            assert!(ours >= want && (ours - want) <= 1e-12 * want, "{q}: {ours} {want}");
        }
    }

    #[test]
    fn fractional_orders_bracketed_by_integers_and_continuous() {
        // True RDP is nondecreasing in α; the fractional formula must sit between its integer
        // neighbours (up to its tiny rounding allowance) and be continuous at integers.
        for &(q, s) in &[(0.01, 1.0), (0.2, 0.7), (1e-4, 3.0)] {
            for k in 2u64..12 {
                let lo = rdp_poisson_gaussian(q, s, k as f64);
                let hi = rdp_poisson_gaussian(q, s, (k + 1) as f64);
                let mid = rdp_poisson_gaussian(q, s, k as f64 + 0.5);
                assert!(
                    mid >= lo * (1.0 - 1e-9) && mid <= hi * (1.0 + 1e-9),
                    "{q} {s} {k}: {lo} {mid} {hi}"
                );
                let near = rdp_poisson_gaussian(q, s, k as f64 + 1e-7);
                assert!((near - lo).abs() <= 1e-4 * lo, "{q} {s} {k}: {near} {lo}");
            }
        }
    }

    #[test]
    fn replace_one_and_wor_bounds() {
        let (q, s) = (0.01, 1.0);
        for &a in &[1.5, 2.0, 8.0, 64.0] {
            let ar = rdp_poisson_gaussian(q, s, a);
            let ro = rdp_poisson_gaussian_replace_one(q, s, a);
            assert!(ro >= ar, "replace-one bound must be weaker: {a} {ro} {ar}");
            assert!(ro <= rdp_gaussian(s, a));
            let wor = rdp_wor_gaussian(1000, 10, s, a);
            assert!(wor <= rdp_gaussian(s, a) && wor > 0.0);
        }
        // Interpolated fractional WOR orders lie between the integer ones.
        let lo = rdp_wor_gaussian(1000, 10, 2.0, 5.0);
        let hi = rdp_wor_gaussian(1000, 10, 2.0, 6.0);
        let mid = rdp_wor_gaussian(1000, 10, 2.0, 5.5);
        assert!(lo <= mid * (1.0 + 1e-12) && mid <= hi * (1.0 + 1e-12));
        assert_eq!(rdp_wor_gaussian(10, 10, 2.0, 3.0), rdp_gaussian(2.0, 3.0));
    }

    #[test]
    fn laplace_rdp_matches_mironov_prop6() {
        // b = 1, α = 2: ln(2/3·e + 1/3·e^{−2}) = 0.619134…; α → ∞ tends to 1/b; α → 1 to the KL
        // 1/b + e^{−1/b} − 1.
        let v = rdp_laplace(1.0, 2.0);
        let want = ((2.0 / 3.0) * 1f64.exp() + (1.0 / 3.0) * (-2f64).exp()).ln();
        assert!(v >= want && v <= want * (1.0 + 1e-12), "{v} {want}");
        assert!(rdp_laplace(1.0, 1e6) <= 1.0 + 1e-12 && rdp_laplace(1.0, 1e6) > 0.999);
        let kl = 1.0 + (-1f64).exp() - 1.0;
        assert!((rdp_laplace(1.0, 1.000001) - kl).abs() < 1e-5);
        // Tiny b: no overflow, capped at the pure-DP value.
        assert!(rdp_laplace(1e-3, 50.0) <= 1e3 * (1.0 + 1e-12));
    }

    /// Events for the pruning tests: DP-SGD over (σ, q, T) with best orders near 1, fractional
    /// below 11 (e.g. σ 0.8: 8.1 on the grid; σ 1.1, δ 1e-8: 2.3), integer up to ~100 and large
    /// (σ 20), plus a composition of two subsampled Gaussians and one with a full-batch step.
    fn prune_events() -> Vec<DpEvent> {
        let mut v = Vec::new();
        for &(s, q, t) in &[
            (1.0, 0.001, 1_000_000u64),
            (0.8, 64.0 / 60000.0, 9375),
            (2.0, 0.01, 100_000),
            (5.0, 0.00128, 39_062),
            (1.1, 0.004, 1_000_000),
            (0.6, 0.02, 1000),
            (0.5, 0.1, 10),
            (3.0, 0.05, 1),
            (20.0, 0.001, 100),
            (1.5, 1e-6, 1_000_000),
            (0.9, 0.3, 50),
        ] {
            v.push(DpEvent::dpsgd(s, q, t));
        }
        v.push(DpEvent::Composed {
            events: vec![DpEvent::dpsgd(1.0, 0.01, 1000), DpEvent::dpsgd(3.0, 0.002, 20_000)],
        });
        v.push(DpEvent::Composed {
            events: vec![
                DpEvent::dpsgd(1.2, 0.005, 5000),
                DpEvent::Gaussian { noise_multiplier: 30.0 },
            ],
        });
        v
    }

    /// Pruning (setting aside fractional and non-anchor integer orders behind lower bounds, the
    /// line stop) returns exactly, bit for bit, the ε and order of evaluating every grid order,
    /// and likewise for δ.
    #[test]
    fn pruned_grid_search_equals_exhaustive() {
        let nb = Neighbouring::AddRemove;
        for ev in prune_events() {
            for conv in [Conversion::Improved, Conversion::Classic] {
                // Orders up to 4096 (the exhaustive walk over the long tail is slow in a test).
                let orders: Vec<f64> = default_orders().into_iter().filter(|&a| a <= 4096.0).collect();
                let pruned = RdpAccountant {
                    optimize: false,
                    ..RdpAccountant::default().with_conversion(conv).with_orders(orders)
                };
                let full = RdpAccountant {
                    prune: false,
                    ..pruned.clone()
                };
                for &d in &[1e-3, 1e-5, 1e-8, 1e-12] {
                    let a = pruned.epsilon(&ev, nb, d).unwrap();
                    let b = full.epsilon(&ev, nb, d).unwrap();
                    assert_eq!(
                        a.epsilon.to_bits(),
                        b.epsilon.to_bits(),
                        "{ev:?} {conv:?} δ={d}: {a:?} {b:?}"
                    );
                    assert_eq!(a.details["rdp_order"], b.details["rdp_order"], "{ev:?} {conv:?} δ={d}");
                }
                for &e in &[0.5, 2.0, 8.0] {
                    let a = pruned.delta(&ev, nb, e).unwrap();
                    let b = full.delta(&ev, nb, e).unwrap();
                    assert_eq!(a.delta.to_bits(), b.delta.to_bits(), "{ev:?} {conv:?} ε={e}");
                }
            }
        }
    }

    /// The lower bounds used for pruning are below the RDP the module computes, at set-aside
    /// orders ([`RdpLower::at`]) and along the stop lines ([`RdpLower::line_at`]).
    #[test]
    fn pruning_bounds_are_below_computed_rdp() {
        let nb = Neighbouring::AddRemove;
        for ev in prune_events() {
            let comps = rdp_components(&ev, nb).unwrap();
            let mut lb = RdpLower::new(&comps, nb);
            let mut bounded = 0;
            for x in 101..2600u32 {
                let a = x as f64 / 10.0;
                if let Some(l) = lb.at(a) {
                    let r = total_rdp(&comps, nb, a).unwrap();
                    assert!(l <= r, "{ev:?} α={a}: bound {l} > rdp {r}");
                    bounded += 1;
                }
            }
            assert!(bounded > 1000, "{ev:?}: {bounded}");
            for k in 2..255u32 {
                let k = k as f64;
                let (l, s) = lb.line_at(k).unwrap();
                for a in [k, k + 0.37, k + 1.0, k + 7.5, 2.0 * k, 4.0 * k + 3.0] {
                    let r = total_rdp(&comps, nb, a).unwrap();
                    assert!(l + (a - k) * s <= (a - 1.0) * r, "{ev:?} k={k} α={a}: {l} {s} {r}");
                }
            }
        }
    }

    /// The refinement by Brent's method finds the same ε as the 40-step golden-section search
    /// over the same bracket that it replaced, to 1e-10 relative (measured: within 3e-11).
    #[test]
    fn brent_refinement_matches_golden_section() {
        let nb = Neighbouring::AddRemove;
        let orders = default_orders();
        let (mut above, mut below) = (0.0f64, 0.0f64);
        for ev in prune_events() {
            let comps = rdp_components(&ev, nb).unwrap();
            for conv in [Conversion::Improved, Conversion::Classic] {
                let acc = RdpAccountant::default().with_conversion(conv);
                let grid = RdpAccountant {
                    optimize: false,
                    prune: false,
                    ..acc.clone()
                };
                for &d in &[1e-5, 1e-8] {
                    let got = acc.epsilon(&ev, nb, d).unwrap().epsilon;
                    let g = grid.epsilon(&ev, nb, d).unwrap();
                    let a0 = g.details["rdp_order"];
                    if a0 > REFINE_MAX_ORDER || g.epsilon <= f64::MIN_POSITIVE {
                        continue;
                    }
                    let i = orders.iter().position(|&o| o == a0).unwrap();
                    let lo = if i == 0 {
                        1.0 + (orders[0] - 1.0) / 4.0
                    } else {
                        orders[i - 1]
                    };
                    let hi = orders[i + 1];
                    let f = |a: f64| convert::epsilon_at_order(a, total_rdp(&comps, nb, a).unwrap(), d, conv);
                    let want = golden_min(f, lo, hi, 40).0.min(g.epsilon);
                    let rel = (got - want) / want;
                    above = above.max(rel);
                    below = below.min(rel);
                    assert!(rel.abs() <= 1e-10, "{ev:?} {conv:?} δ={d}: brent {got} golden {want}");
                }
            }
        }
        eprintln!("Brent vs golden section, relative: from {below:e} to {above:e}");
    }

    #[test]
    fn default_grid_contains_dp_accounting_grid() {
        let d = default_orders();
        for a in dp_accounting_orders() {
            assert!(d.contains(&a), "{a}");
        }
        assert!(*d.last().unwrap() >= 1e6);
        assert!(d.windows(2).all(|w| w[0] < w[1]));
    }
}
