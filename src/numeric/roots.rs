//! Root finding on monotone functions with sides chosen for soundness.
//!
//! Hand-written rather than argmin's `BrentRoot`: a sound answer needs the whole final bracket
//! (the caller takes the end on the safe side, e.g. the larger ε or the larger σ), while argmin
//! returns one best point; argmin also errors instead of expanding a bracket without a sign
//! change. The method is the textbook one (Brent 1973, ch. 4) in ~100 lines, tested below.

use crate::error::{Error, Result};

/// Brent's method (Brent 1973, ch. 4) for f(a)·f(b) ≤ 0. Returns a bracket `(lo, hi)` with
/// f(lo) and f(hi) of opposite sign (or one of them exactly 0) and hi − lo ≤ tolerance, so the
/// caller can pick the side that is safe for its use.
pub fn brent<F: FnMut(f64) -> f64>(mut f: F, a: f64, b: f64, rel: f64, abs: f64) -> Result<(f64, f64)> {
    let (mut a, mut b) = (a, b);
    let (mut fa, mut fb) = (f(a), f(b));
    if fa.is_nan() || fb.is_nan() {
        return Err(Error::numeric(format!("root finder: NaN at bracket end ({a}, {b})")));
    }
    if fa == 0.0 {
        return Ok((a, a));
    }
    if fb == 0.0 {
        return Ok((b, b));
    }
    if fa.signum() == fb.signum() {
        return Err(Error::numeric(format!("root finder: no sign change on [{a}, {b}]")));
    }
    let (mut c, mut fc) = (a, fa);
    let mut d = b - a;
    let mut e = d;
    for _ in 0..500 {
        if fb.signum() == fc.signum() {
            c = a;
            fc = fa;
            d = b - a;
            e = d;
        }
        if fc.abs() < fb.abs() {
            a = b;
            b = c;
            c = a;
            fa = fb;
            fb = fc;
            fc = fa;
        }
        let tol = 2.0 * f64::EPSILON * b.abs() + 0.5 * (rel * b.abs()).max(abs);
        let m = 0.5 * (c - b);
        // An exact zero is the root: returned as both ends (the last bracket around it can be
        // as wide as the previous step, which callers taking one end would inherit).
        if fb == 0.0 {
            return Ok((b, b));
        }
        if m.abs() <= tol {
            let (lo, hi) = if b < c { (b, c) } else { (c, b) };
            return Ok((lo, hi));
        }
        if e.abs() >= tol && fa.abs() > fb.abs() {
            let s = fb / fa;
            let (mut p, mut q);
            if a == c {
                p = 2.0 * m * s;
                q = 1.0 - s;
            } else {
                let qq = fa / fc;
                let r = fb / fc;
                p = s * (2.0 * m * qq * (qq - r) - (b - a) * (r - 1.0));
                q = (qq - 1.0) * (r - 1.0) * (s - 1.0);
            }
            if p > 0.0 {
                q = -q;
            } else {
                p = -p;
            }
            if 2.0 * p < (3.0 * m * q - (tol * q).abs()).min((e * q).abs()) {
                e = d;
                d = p / q;
            } else {
                d = m;
                e = m;
            }
        } else {
            d = m;
            e = m;
        }
        a = b;
        fa = fb;
        b += if d.abs() > tol { d } else { tol.copysign(m) };
        fb = f(b);
        if fb.is_nan() {
            return Err(Error::numeric(format!("root finder: NaN at {b}")));
        }
    }
    Err(Error::numeric("root finder: no convergence in 500 iterations"))
}

/// Doubles `hi` (starting from `start` > 0) until `pred(hi)` holds; errors after `max_doublings`.
pub fn expand_upper<F: FnMut(f64) -> bool>(mut pred: F, start: f64, max_doublings: usize) -> Result<f64> {
    let mut hi = start;
    for _ in 0..max_doublings {
        if pred(hi) {
            return Ok(hi);
        }
        hi *= 2.0;
    }
    Err(Error::numeric(format!("no bracket found up to {hi}")))
}

/// For an increasing function g on [lo, ∞) with g(lo) ≤ target, finds x with g(x) = target,
/// expanding the upper end as needed, and returns the *upper* end of the final bracket (the
/// safe side when x is an ε). Use [`brent`] directly when the safe side is the lower end.
pub fn find_increasing_root<F: FnMut(f64) -> f64>(mut g: F, target: f64, lo: f64, start_hi: f64) -> Result<f64> {
    let hi = expand_upper(|x| g(x) >= target, start_hi.max(lo + 1e-12), 1100)?;
    let (_, up) = brent(|x| g(x) - target, lo, hi, super::tol::ROOT_REL, super::tol::ROOT_ABS)?;
    Ok(up)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brent_finds_sqrt2_with_bracket() {
        let (lo, hi) = brent(|x| x * x - 2.0, 0.0, 2.0, 1e-14, 1e-15).unwrap();
        assert!(lo <= std::f64::consts::SQRT_2 + 1e-15 && hi >= std::f64::consts::SQRT_2 - 1e-15);
        assert!(hi - lo < 1e-12);
    }

    /// A step that lands exactly on the root returns it, not the wide bracket before it.
    #[test]
    fn an_exact_zero_is_returned_as_the_root() {
        // f is exactly 0 on [0.5, 0.6]: the secant step from (0, −1), (1, 1) lands on 0.5.
        let f = |x: f64| {
            if x < 0.5 {
                -1.0
            } else if x <= 0.6 {
                0.0
            } else {
                1.0
            }
        };
        let (lo, hi) = brent(f, 0.0, 1.0, 1e-12, 1e-15).unwrap();
        assert_eq!(lo, hi);
        assert!((0.5..=0.6).contains(&lo), "{lo}");
    }

    #[test]
    fn no_sign_change_is_an_error() {
        assert!(brent(|x| x * x + 1.0, -1.0, 1.0, 1e-12, 1e-12).is_err());
    }

    #[test]
    fn increasing_root_expands() {
        let x = find_increasing_root(|x| x.ln(), 10.0, 1.0, 2.0).unwrap();
        assert!((x - 10f64.exp()).abs() / 10f64.exp() < 1e-12);
        assert!(x >= 10f64.exp() * (1.0 - 1e-15));
    }
}
