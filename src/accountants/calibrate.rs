//! Calibration of σ, q or steps to a target ε (placeholder).
