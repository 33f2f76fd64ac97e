//! Embedding matrices for the mechanisms: read from CSV (one vector per row, an optional header
//! of non-numeric names), checked, and normalised to unit ℓ₂ norm.

use std::path::Path;

use crate::error::{Error, Result};

/// Row-major embeddings: `rows[i]` is the i-th record's vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Embeddings {
    /// The rows.
    pub rows: Vec<Vec<f64>>,
}

impl Embeddings {
    /// Embeddings from rows; errors when empty, ragged or non-finite.
    pub fn new(rows: Vec<Vec<f64>>) -> Result<Self> {
        let Some(first) = rows.first() else {
            return Err(Error::input("no embedding rows"));
        };
        let d = first.len();
        if d == 0 {
            return Err(Error::input("embeddings have dimension 0"));
        }
        for (i, r) in rows.iter().enumerate() {
            if r.len() != d {
                return Err(Error::input(format!("row {i} has {} values, expected {d}", r.len())));
            }
            if r.iter().any(|v| !v.is_finite()) {
                return Err(Error::input(format!("row {i} has a non-finite value")));
            }
        }
        Ok(Embeddings { rows })
    }
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    /// Dimension of each row.
    pub fn dim(&self) -> usize {
        self.rows[0].len()
    }

    /// Reads a CSV file of numbers; a first line that does not parse as numbers is a header.
    /// Errors name the file and line.
    pub fn load_csv(path: &Path) -> Result<Self> {
        let src = crate::input::read_to_string(path)?;
        Self::parse_csv(&src).map_err(|e| e.with_file(path))
    }

    /// Parses CSV text as [`Embeddings::load_csv`] does (errors name the line, not the file).
    pub fn parse_csv(src: &str) -> Result<Self> {
        let mut rows = Vec::new();
        for (i, line) in src.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let parsed: std::result::Result<Vec<f64>, _> = t.split(',').map(|v| v.trim().parse::<f64>()).collect();
            match parsed {
                Ok(r) => rows.push(r),
                Err(_) if rows.is_empty() && i == 0 => continue, // header
                Err(e) => return Err(Error::input(format!("not a number: {e}")).with_line(i + 1)),
            }
        }
        Self::new(rows)
    }

    /// Every row scaled to unit ℓ₂ norm (the paper's normalisation). A zero row is an error:
    /// it has no direction and would break the sensitivity bound.
    pub fn normalised(&self) -> Result<Self> {
        let mut rows = self.rows.clone();
        for (i, r) in rows.iter_mut().enumerate() {
            // Scale by the largest |value| first, so rows of 1e308 (whose squared norm
            // overflows) or 1e-320 (whose squares underflow) keep their direction.
            let scale = r.iter().fold(0.0f64, |a, v| a.max(v.abs()));
            if scale == 0.0 {
                return Err(Error::input(format!(
                    "row {i} is the zero vector and cannot be normalised"
                )));
            }
            if !(1e-100..=1e100).contains(&scale) {
                r.iter_mut().for_each(|v| *v /= scale);
            }
            let n = norm(r);
            r.iter_mut().for_each(|v| *v /= n);
        }
        Ok(Embeddings { rows })
    }

    /// Largest row norm.
    pub(crate) fn max_norm(&self) -> f64 {
        self.rows.iter().map(|r| norm(r)).fold(0.0, f64::max)
    }
}

/// ‖v‖₂, computed with scaling so it is finite whenever the true norm is (values near
/// f64::MAX do not overflow through their squares).
pub fn norm(v: &[f64]) -> f64 {
    let scale = v.iter().fold(0.0f64, |a, x| a.max(x.abs()));
    if scale == 0.0 || !scale.is_finite() {
        return scale;
    }
    if (1e-100..=1e100).contains(&scale) {
        return v.iter().map(|x| x * x).sum::<f64>().sqrt();
    }
    scale * v.iter().map(|x| (x / scale) * (x / scale)).sum::<f64>().sqrt()
}

/// Dot product of `a` and `b`.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// ‖a − b‖₂.
pub(crate) fn dist(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_fixture_loads_and_normalises() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/embeddings/digits-proj16-label3.csv");
        let e = Embeddings::load_csv(&p).unwrap();
        assert_eq!((e.len(), e.dim()), (183, 16));
        assert!(e.max_norm() > 10.0);
        let u = e.normalised().unwrap();
        assert!(u.rows.iter().all(|r| (norm(r) - 1.0).abs() < 1e-12));
    }

    #[test]
    fn bad_rows_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("e.csv");
        std::fs::write(&p, "a,b\n1,2\n3,x\n").unwrap();
        let e = Embeddings::load_csv(&p).unwrap_err();
        assert_eq!(e.line, Some(3));
        std::fs::write(&p, "1,2\n3\n").unwrap();
        assert!(Embeddings::load_csv(&p).is_err());
    }
}
