//! Serde helpers for `f64` that survive JSON: finite numbers are written as JSON numbers,
//! non-finite ones as the strings `"inf"`, `"-inf"` and `"nan"` (plain serde_json would write
//! `null` and then refuse to read it back). Reading accepts both forms. Used by the report model
//! and by any record that carries a possibly infinite ε (`accountants::sound`).

use serde::de::{self, Deserializer, Visitor};
use serde::ser::{SerializeSeq, Serializer};
use std::fmt;

/// The string used for a non-finite value.
pub fn non_finite_str(x: f64) -> Option<&'static str> {
    if x.is_nan() {
        Some("nan")
    } else if x == f64::INFINITY {
        Some("inf")
    } else if x == f64::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

/// Parses the strings written by [`non_finite_str`].
pub fn parse_non_finite(s: &str) -> Option<f64> {
    match s {
        "inf" | "+inf" | "Infinity" => Some(f64::INFINITY),
        "-inf" | "-Infinity" => Some(f64::NEG_INFINITY),
        "nan" | "NaN" => Some(f64::NAN),
        _ => None,
    }
}

/// Writes a finite float as a JSON number, a non-finite one as its string (`inf`, `-inf`, `nan`).
pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
    match non_finite_str(*x) {
        Some(t) => s.serialize_str(t),
        None => s.serialize_f64(*x),
    }
}

struct NumVisitor;

impl Visitor<'_> for NumVisitor {
    type Value = f64;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number or one of \"inf\", \"-inf\", \"nan\"")
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<f64, E> {
        Ok(v)
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<f64, E> {
        Ok(v as f64)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<f64, E> {
        parse_non_finite(v).ok_or_else(|| E::invalid_value(de::Unexpected::Str(v), &self))
    }
}

/// Reads a number, or one of the strings `inf`, `-inf`, `nan`.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    d.deserialize_any(NumVisitor)
}

/// `Option<f64>`: `None` is `null`.
pub mod opt {
    use super::*;

    /// Writes `Some(x)` like [`super::serialize`], `None` as `null`.
    pub fn serialize<S: Serializer>(x: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match x {
            Some(v) => super::serialize(v, s),
            None => s.serialize_none(),
        }
    }

    struct OptVisitor;
    impl<'de> Visitor<'de> for OptVisitor {
        type Value = Option<f64>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("null, a number or one of \"inf\", \"-inf\", \"nan\"")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            super::deserialize(d).map(Some)
        }
    }

    /// Reads what [`serialize`] writes.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        d.deserialize_option(OptVisitor)
    }
}

/// `Vec<f64>`.
pub mod vec {
    use super::*;

    #[derive(serde::Deserialize)]
    struct N(#[serde(with = "super")] f64);

    /// Writes each element like [`super::serialize`].
    pub fn serialize<S: Serializer>(xs: &[f64], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(xs.len()))?;
        for x in xs {
            match non_finite_str(*x) {
                Some(t) => seq.serialize_element(t)?,
                None => seq.serialize_element(x)?,
            }
        }
        seq.end()
    }

    /// Reads what [`serialize`] writes.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
        let v: Vec<N> = serde::Deserialize::deserialize(d)?;
        Ok(v.into_iter().map(|n| n.0).collect())
    }
}

/// `BTreeMap<String, f64>`.
pub mod map {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(serde::Deserialize)]
    struct N(#[serde(with = "super")] f64);

    /// Writes each value like [`super::serialize`].
    pub fn serialize<S: Serializer>(m: &BTreeMap<String, f64>, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut out = s.serialize_map(Some(m.len()))?;
        for (k, x) in m {
            match non_finite_str(*x) {
                Some(t) => out.serialize_entry(k, t)?,
                None => out.serialize_entry(k, x)?,
            }
        }
        out.end()
    }

    /// Reads what [`serialize`] writes.
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, f64>, D::Error> {
        let v: BTreeMap<String, N> = serde::Deserialize::deserialize(d)?;
        Ok(v.into_iter().map(|(k, n)| (k, n.0)).collect())
    }
}
