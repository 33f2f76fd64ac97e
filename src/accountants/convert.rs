//! RDP → (ε, δ) conversions.
//!
//! A mechanism that is (α, r)-RDP for every order α of a list is (ε, δ)-DP with ε the minimum
//! over the orders of a conversion formula. Two formulas are offered:
//!
//! * [`Conversion::Improved`] (default): ε = r + ln(1 − 1/α) − (ln δ + ln α)/(α − 1)
//!   (Balle, Barthe, Gaboardi, Hsu & Sato 2020, "Hypothesis testing interpretations and Rényi
//!   differential privacy", Thm 21; Canonne, Kamath & Steinke 2020, "The discrete Gaussian for
//!   differential privacy", Prop. 12). This is what dp_accounting (≥ 0.1) and recent papers use.
//! * [`Conversion::Classic`]: ε = r + ln(1/δ)/(α − 1) (Mironov 2017, "Rényi differential
//!   privacy", Prop. 3). Always larger than the improved one (their difference is
//!   ln(1 − 1/α) − ln α/(α − 1) < 0); kept because published numbers (RAPID, Opacus) use it.
//!
//! Both are also used the other way round (δ at a given ε). With either formula, the total
//! variation bound δ ≤ √(1 − e^{−r}) (Bretagnolle–Huber, with KL ≤ D_α for α ≥ 1) gives ε = 0
//! when it already meets δ.
//!
//! Soundness: each formula is evaluated with a few floating point operations; the result is
//! moved up by a relative [`ROUNDING_ALLOWANCE`] so rounding can only raise ε (or δ).

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::numeric::tol::RDP_NEG_NOISE;

/// Relative allowance added to each converted ε or ln δ so that the rounding of the handful of
/// floating point operations in a conversion formula cannot make the answer too small.
pub const ROUNDING_ALLOWANCE: f64 = 64.0 * f64::EPSILON;

/// Which RDP → (ε, δ) formula to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Conversion {
    /// Balle et al. 2020 Thm 21 / Canonne–Kamath–Steinke 2020 Prop. 12.
    #[default]
    Improved,
    /// Mironov 2017 Prop. 3: ε = r + ln(1/δ)/(α − 1).
    Classic,
}

impl Conversion {
    /// The name used in output (`improved` or `classic`).
    pub fn as_str(self) -> &'static str {
        match self {
            Conversion::Improved => "improved",
            Conversion::Classic => "classic",
        }
    }
}

impl std::str::FromStr for Conversion {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "improved" => Ok(Conversion::Improved),
            "classic" => Ok(Conversion::Classic),
            other => Err(Error::field(
                "conversion",
                format!("unknown RDP conversion `{other}` (expected improved or classic)"),
            )),
        }
    }
}

/// Moves `x` up by a relative rounding allowance (x ≥ 0 assumed; +∞ stays +∞).
pub(crate) fn round_up(x: f64) -> f64 {
    if x.is_finite() {
        x + x.abs() * ROUNDING_ALLOWANCE + f64::MIN_POSITIVE
    } else {
        x
    }
}

/// Checks an RDP value: values in (−[`RDP_NEG_NOISE`], 0) are rounding noise and become 0; more
/// negative values or NaN are a numeric error (never silently turned into ε = 0).
pub fn clamp_rdp(order: f64, rdp: f64) -> Result<f64> {
    if rdp.is_nan() {
        return Err(Error::numeric(format!("rdp: RDP at order {order} is NaN")));
    }
    if rdp >= 0.0 {
        return Ok(rdp);
    }
    if rdp > -RDP_NEG_NOISE {
        return Ok(0.0);
    }
    Err(Error::numeric(format!(
        "rdp: RDP at order {order} is {rdp} < 0 (beyond the rounding tolerance {RDP_NEG_NOISE}); refusing to convert"
    )))
}

fn check_order(order: f64) -> Result<()> {
    if order.is_nan() || order <= 1.0 {
        return Err(Error::field("orders", format!("RDP orders must be > 1, got {order}")));
    }
    Ok(())
}

/// ε at one order for an (α, r)-RDP guarantee and the given δ ∈ (0, 1) (formulas in the module
/// docs), rounded up; 0 when the total-variation bound already meets δ. `rdp` must be ≥ 0.
pub(crate) fn epsilon_at_order(order: f64, rdp: f64, delta: f64, conversion: Conversion) -> f64 {
    if rdp.is_infinite() {
        return f64::INFINITY;
    }
    // Bretagnolle–Huber: TV ≤ √(1 − e^{−KL}) ≤ √(1 − e^{−r}); (0, δ)-DP iff TV ≤ δ.
    if delta * delta + (-rdp).exp_m1() > 0.0 {
        return 0.0;
    }
    let ln_delta = delta.ln();
    let a1 = order - 1.0;
    let eps = match conversion {
        Conversion::Improved => rdp + (-1.0 / order).ln_1p() - (ln_delta + order.ln()) / a1,
        Conversion::Classic => rdp - ln_delta / a1,
    };
    round_up(eps.max(0.0))
}

/// ln δ at one order for an (α, r)-RDP guarantee and the given ε ≥ 0, rounded up; the
/// total-variation bound ln √(1 − e^{−r}) is used when it is smaller.
pub(crate) fn log_delta_at_order(order: f64, rdp: f64, epsilon: f64, conversion: Conversion) -> f64 {
    if rdp.is_infinite() {
        return 0.0;
    }
    // ln √(1 − e^{−r}) with 1 − e^{−r} as −expm1(−r): computed as ln(1 − e^{−r}) it cancels to
    // ln 0 = −∞ (δ = 0, below the truth) for every r below 2⁻⁵³.
    let tv = if rdp == 0.0 {
        f64::NEG_INFINITY
    } else {
        0.5 * (-(-rdp).exp_m1()).ln()
    };
    let a1 = order - 1.0;
    let ld = match conversion {
        Conversion::Improved => a1 * (rdp - epsilon + (-1.0 / order).ln_1p()) - order.ln(),
        Conversion::Classic => a1 * (rdp - epsilon),
    };
    // Round toward larger δ: ln δ moves up by a relative allowance of its magnitude.
    let up = |x: f64| {
        if x.is_finite() {
            x + x.abs() * ROUNDING_ALLOWANCE + f64::MIN_POSITIVE
        } else {
            x
        }
    };
    up(ld).min(up(tv)).min(0.0)
}

/// The smallest ε over `orders` for RDP values `rdp` (same length) at δ; returns (ε, order).
/// Orders must be > 1; RDP values go through [`clamp_rdp`].
pub fn epsilon_from_rdp(orders: &[f64], rdp: &[f64], delta: f64, conversion: Conversion) -> Result<(f64, f64)> {
    super::check_delta(delta)?;
    if orders.len() != rdp.len() || orders.is_empty() {
        return Err(Error::input(format!(
            "rdp: {} orders but {} RDP values (need the same non-zero number)",
            orders.len(),
            rdp.len()
        )));
    }
    let mut best = (f64::INFINITY, orders[0]);
    for (&a, &raw) in orders.iter().zip(rdp) {
        check_order(a)?;
        // A clamped (slightly negative) value stands for a true value near 0 of unknown
        // sign: convert it as RDP_NEG_NOISE so that rounding noise can never yield ε = 0.
        let r = if raw < 0.0 {
            clamp_rdp(a, raw).map(|_| RDP_NEG_NOISE)?
        } else {
            clamp_rdp(a, raw)?
        };
        let e = epsilon_at_order(a, r, delta, conversion);
        if e < best.0 {
            best = (e, a);
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaussian_conversion_matches_closed_forms() {
        // Full-batch Gaussian σ = 1 at α = 10: r = 5. Classic: 5 + ln(1e5)/9.
        let classic = epsilon_at_order(10.0, 5.0, 1e-5, Conversion::Classic);
        assert!((classic - (5.0 + 1e5f64.ln() / 9.0)).abs() < 1e-12);
        let improved = epsilon_at_order(10.0, 5.0, 1e-5, Conversion::Improved);
        let want = 5.0 + (0.9f64).ln() - ((1e-5f64).ln() + 10f64.ln()) / 9.0;
        assert!((improved - want).abs() < 1e-12);
        assert!(improved < classic);
        // Round trip: δ at that ε is δ (up to the rounding allowance, never below... above).
        let ld = log_delta_at_order(10.0, 5.0, want, Conversion::Improved);
        assert!((ld - (1e-5f64).ln()).abs() < 1e-10, "{ld}");
        let ld = log_delta_at_order(10.0, 5.0, classic, Conversion::Classic);
        assert!((ld - (1e-5f64).ln()).abs() < 1e-9, "{ld}");
    }

    /// The total-variation bound at RDP values below 2⁻⁵³ (where 1 − e^{−r} rounds to 0): δ stays
    /// positive and at least √r/… of the exact √(1 − e^{−r}) ≈ √r, never 0.
    #[test]
    fn tv_bound_keeps_tiny_rdp_positive() {
        for r in [1e-17, 5.36e-19, 5.36e-199, 2.3e-306] {
            let ld = log_delta_at_order(1.01, r, 3.0, Conversion::Improved);
            let want = 0.5 * r.ln();
            assert!(
                ld.is_finite() && ld >= want - 1e-9 * want.abs(),
                "r = {r}: ln δ = {ld}, √r gives {want}"
            );
        }
    }

    #[test]
    fn negative_rdp_is_clamped_or_rejected() {
        assert_eq!(clamp_rdp(2.0, -1e-12).unwrap(), 0.0);
        assert!(clamp_rdp(2.0, -1e-3).is_err());
        assert!(clamp_rdp(2.0, f64::NAN).is_err());
        // A clamped 0 does not give ε = 0 unless the TV bound really meets δ.
        let (e, _) = epsilon_from_rdp(&[2.0, 4.0], &[-1e-12, 1e-3], 1e-5, Conversion::Improved).unwrap();
        assert!(e > 0.0);
        // rdp = 0 exactly: the mechanism is perfectly private: ε = 0.
        let (e, _) = epsilon_from_rdp(&[2.0], &[0.0], 1e-5, Conversion::Improved).unwrap();
        assert_eq!(e, 0.0);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert!(epsilon_from_rdp(&[1.0], &[0.1], 1e-5, Conversion::Improved).is_err());
        assert!(epsilon_from_rdp(&[2.0], &[0.1, 0.2], 1e-5, Conversion::Improved).is_err());
        assert!(epsilon_from_rdp(&[2.0], &[0.1], 0.0, Conversion::Improved).is_err());
        assert!("nope".parse::<Conversion>().is_err());
    }
}
