//! The number formatters of every report, and (re-exported from [`crate::numeric::json`]) the
//! serde helpers for `f64` that survive JSON.

pub use crate::numeric::json::{deserialize, map, non_finite_str, opt, parse_non_finite, serialize, vec};

/// Shortest round-trip text of `x` (Rust's `{}`: the fewest digits that read back to the same
/// `f64`), `inf`, `-inf` or `nan` for non-finite values. For numbers shown to users and in CSV.
pub fn fmt(x: f64) -> String {
    match non_finite_str(x) {
        Some(t) => t.to_string(),
        None if x == 0.0 => "0".to_string(),
        None => format!("{x}"),
    }
}

/// `x` without floating-point arithmetic noise: rounded to 15 significant digits, so a grid
/// point computed as 0.47500000000000003 reads 0.475. For values derived from what the user
/// typed (grid points, parameters); never for bounds, whose last digit matters for soundness.
pub fn clean(x: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    format!("{x:.14e}").parse().unwrap_or(x)
}

/// [`fmt`] of [`clean`]: the text of a parameter or grid value.
pub(crate) fn fmt_clean(x: f64) -> String {
    fmt(clean(x))
}

pub use crate::numeric::format::{fmt_num, sig6};

/// Rust's `{:?}` of a float (shortest round-trip with a `.0` on integers): `sweep`'s CSV cells.
pub fn debug(x: f64) -> String {
    format!("{x:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_significant_digits() {
        assert_eq!(sig6(0.8825307808952866), "0.882531");
        assert_eq!(sig6(0.47500000000000003), "0.475");
        assert_eq!(sig6(313530.478142), "313530");
        assert_eq!(sig6(0.004266666666666667), "0.00426667");
        assert_eq!(sig6(2.3047453757601376e-7), "2.30475e-7");
        assert_eq!(sig6(4338874.092198518), "4.33887e6");
        assert_eq!(sig6(1e-5), "1e-5");
        assert_eq!(sig6(f64::INFINITY), "∞");
        assert_eq!(sig6(0.0), "0");
    }

    #[test]
    fn shortest_round_trip_and_clean() {
        assert_eq!(fmt(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(fmt_clean(0.1 + 0.2), "0.3");
        assert_eq!(fmt_clean(0.1 + 0.375), "0.475");
        assert_eq!(fmt(1e-5), "0.00001");
        assert_eq!(fmt(f64::INFINITY), "inf");
        assert_eq!(fmt(-0.0), "0");
        // 1/3 has no shorter form: clean keeps 15 significant digits and reads back close.
        assert!((clean(1.0 / 3.0) - 1.0 / 3.0).abs() < 1e-15);
        for x in [0.475, 3.238181234567891, 1e-300, 787.6] {
            assert_eq!(fmt(x).parse::<f64>().unwrap(), x);
        }
    }
}
