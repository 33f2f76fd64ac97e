//! Numeric helpers shared by every accountant: normal tails in log space, log-space sums,
//! root finding and the project's named tolerances (one place, as statrs' `prec.rs`).
//!
//! No linear algebra crate (nalgebra) is needed: the accountants work on 1-D grids and sums,
//! and the models' matrix work goes through candle tensors.

pub mod dd;
pub mod format;
pub mod json;
pub mod normal_tail;
pub(crate) mod pool;
pub mod roots;
pub mod tol;

pub use roots::{brent, expand_upper, find_increasing_root};

use std::f64::consts::{LN_2, SQRT_2};

/// ln(sqrt(2π)).
pub(crate) const LN_SQRT_2PI: f64 = 0.918_938_533_204_672_8;

/// x^e by repeated squaring (e ≥ 1), for any multiplication. When each product of two computed
/// powers rounds with relative error ≤ ε, the result carries (1 + ε)^{e−1} (by induction: a^i(1+θ_i)
/// times a^j(1+θ_j) with one rounding gives (1+ε)^{i+j−1}; the first product, by `one`, is exact).
#[inline(always)]
pub(crate) fn pow_by_squaring<T: Copy + std::ops::Mul<Output = T>>(mut base: T, mut e: u64, one: T) -> T {
    let mut acc = one;
    loop {
        if e & 1 == 1 {
            acc = acc * base;
        }
        e >>= 1;
        if e == 0 {
            return acc;
        }
        base = base * base;
    }
}

/// Standard normal CDF Φ(x), through libm's `erfc` (≈1e-16 relative; statrs' `cdf` is only
/// ≈1e-10 relative, see ../shared/STACK.md).
pub(crate) fn ndtr(x: f64) -> f64 {
    0.5 * libm::erfc(-x / SQRT_2)
}

/// Standard normal survival function 1 − Φ(x) = Φ(−x), accurate in the upper tail.
pub(crate) fn ndtr_sf(x: f64) -> f64 {
    ndtr(-x)
}

/// ln Φ(x), finite for every finite x. Uses `erfc` down to x = −20 and the asymptotic
/// series ln Φ(x) = −x²/2 − ln(−x) − ln√(2π) + ln(1 − 1/x² + 3/x⁴ − 15/x⁶ + …) below
/// (Abramowitz & Stegun 26.2.12); at x ≤ −20 ten terms give full double precision.
pub(crate) fn log_ndtr(x: f64) -> f64 {
    if x.is_nan() {
        return f64::NAN;
    }
    if x > 6.0 {
        // Φ(x) = 1 − Φ(−x): use log1p for accuracy near 1.
        return (-ndtr(-x)).ln_1p();
    }
    if x > -20.0 {
        return ndtr(x).ln();
    }
    if x == f64::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let x2 = x * x;
    let mut term = 1.0;
    let mut sum = 1.0;
    for k in 1..12 {
        term *= -((2 * k - 1) as f64) / x2;
        sum += term;
    }
    -0.5 * x2 - (-x).ln() - LN_SQRT_2PI + sum.ln()
}

/// ln(1 − Φ(x)) = ln Φ(−x).
pub(crate) fn log_ndtr_sf(x: f64) -> f64 {
    log_ndtr(-x)
}

/// Inverse standard normal CDF Φ⁻¹(p) for p in (0, 1); accurate to ≈2e-16 down to 5e-324
/// (statrs). Returns ∓∞ at p = 0 / 1.
pub(crate) fn ndtri(p: f64) -> f64 {
    use statrs::distribution::{ContinuousCDF, Normal};
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    if p >= 1.0 {
        return f64::INFINITY;
    }
    let n = Normal::standard();
    if p > 0.5 {
        -n.inverse_cdf(1.0 - p)
    } else {
        n.inverse_cdf(p)
    }
}

/// Φ⁻¹(1 − p) accurate for tiny p (upper-tail quantile).
pub(crate) fn ndtri_sf(p: f64) -> f64 {
    -ndtri(p)
}

/// e^{ln_x} as an upper bound that never underflows to 0: when e^{ln_x} is below the
/// smallest normal f64 (where `exp` loses its relative accuracy, and below 5e-324 returns 0),
/// the result is moved up by one representable step, so it stays ≥ the true value and > 0.
/// Returns the value and whether it was moved (the caller then reports ln_x beside it and
/// labels the value an upper bound). Exactly 0 only for ln_x = −∞.
pub(crate) fn exp_upper(ln_x: f64) -> (f64, bool) {
    let v = ln_x.exp();
    if ln_x > f64::NEG_INFINITY && v < f64::MIN_POSITIVE {
        (v.next_up(), true)
    } else {
        (v, false)
    }
}

/// ln(eᵃ + eᵇ) without overflow.
pub(crate) fn log_add_exp(a: f64, b: f64) -> f64 {
    if a == f64::NEG_INFINITY {
        return b;
    }
    if b == f64::NEG_INFINITY {
        return a;
    }
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    hi + (lo - hi).exp().ln_1p()
}

/// ln(eᵃ − eᵇ) for a ≥ b; −∞ when a == b. Returns NaN when b > a (caller's bug).
pub(crate) fn log_sub_exp(a: f64, b: f64) -> f64 {
    if b == f64::NEG_INFINITY {
        return a;
    }
    if b > a {
        return f64::NAN;
    }
    if a == b {
        return f64::NEG_INFINITY;
    }
    let d = b - a;
    // ln(1 − eᵈ): use ln(−expm1(d)) near 0, ln1p(−eᵈ) far from 0 (Mächler 2012).
    if d > -LN_2 {
        a + (-d.exp_m1()).ln()
    } else {
        a + (-d.exp()).ln_1p()
    }
}

/// ln Σ exp(xᵢ), stable; −∞ for an empty slice.
pub(crate) fn log_sum_exp(xs: &[f64]) -> f64 {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m == f64::NEG_INFINITY || m.is_infinite() {
        return m;
    }
    m + xs.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// ln Γ(x) for x > 0.
pub(crate) fn ln_gamma(x: f64) -> f64 {
    libm::lgamma(x)
}

/// Standard normal draws from `rng` (f32), for the noise the mechanisms and attacks draw.
pub fn normals<R: rand::Rng + ?Sized>(rng: &mut R, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| rng.sample::<f32, _>(rand_distr::StandardNormal))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_ndtr_matches_direct_and_is_continuous() {
        for &x in &[-5.0, -1.0, 0.0, 1.0, 3.0] {
            assert!((log_ndtr(x) - ndtr(x).ln()).abs() < 1e-14 * (1.0 + ndtr(x).ln().abs()));
        }
        // Continuity at the switch point x = -20 (relative 1e-13).
        let a = log_ndtr(-20.0 + 1e-9);
        let b = log_ndtr(-20.0 - 1e-9);
        assert!(((a - b) / a).abs() < 1e-9, "{a} {b}");
        // Reference: scipy.special.log_ndtr(-40) = -804.6084420137538
        assert!((log_ndtr(-40.0) + 804.608_442_013_753_8).abs() < 1e-10);
        // scipy 1.17 special.log_ndtr(-1000) = -500007.8266948122, (-20.5) = -214.06672896326387
        assert!((log_ndtr(-1000.0) + 500_007.826_694_812_2).abs() / 500_007.8 < 1e-14);
        assert!((log_ndtr(-20.5) + 214.066_728_963_263_87).abs() / 214.0 < 1e-14);
        assert!(log_ndtr(40.0) <= 0.0);
    }

    #[test]
    fn log_sub_exp_is_accurate() {
        assert!((log_sub_exp(0.0, -1e-20) - (1e-20f64).ln()).abs() < 1e-12);
        assert!((log_sub_exp(2.0f64.ln(), 0.0)).abs() < 1e-15);
        assert_eq!(log_sub_exp(1.0, 1.0), f64::NEG_INFINITY);
        assert!((log_add_exp(1000.0, 1000.0) - (1000.0 + LN_2)).abs() < 1e-12);
    }

    #[test]
    fn ndtri_inverts_ndtr() {
        for &p in &[1e-300, 1e-10, 0.01, 0.5, 0.99, 1.0 - 1e-12] {
            let x = ndtri(p);
            let back = ndtr(x);
            assert!(((back - p) / p).abs() < 1e-9, "{p} {x} {back}");
        }
    }
}
