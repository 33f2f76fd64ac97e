//! Named tolerances. Say which one you use and why; do not sprinkle literals.

/// Relative tolerance of root finding for ε(δ) and similar inversions; the answer is then
/// moved to the safe side of the root (see [`super::roots::find_increasing_root`]).
pub(crate) const ROOT_REL: f64 = 1e-13;
/// Absolute floor for root finding.
pub(crate) const ROOT_ABS: f64 = 1e-15;
/// Largest RDP value treated as rounding noise: values in (−RDP_NEG_NOISE, 0) are clamped to 0;
/// anything more negative is a bug and reported as a numeric error.
pub const RDP_NEG_NOISE: f64 = 1e-9;
