//! The one CSV writer of every CSV dpaudit writes (report tables, `mia.csv`, `--roc-out`,
//! `--scores-out`, `verify.csv`, `sweep.csv`, `analyze.csv`, `calibrate.csv`, `account.csv`,
//! `run`'s `outputs.csv`): RFC 4180 quoting (a field with a comma, quote or line break is
//! quoted) and one rule for cells a spreadsheet would run as a formula ([`field`]).

use std::borrow::Cow;

use crate::error::{Error, Result};

/// A field as written: a number (anything Rust reads as an `f64`, `-1.5`, `inf`, `-inf`, `nan`
/// included) is written as it is; text that a spreadsheet would run as a formula (starting with
/// `=`, `+`, `-`, `@`, a tab or a carriage return), or that starts with `'`, is prefixed with `'`,
/// which spreadsheets show as text. [`unfield`] reads it back.
pub fn field(t: &str) -> Cow<'_, str> {
    if t.starts_with(['=', '+', '-', '@', '\t', '\r', '\'']) && t.parse::<f64>().is_err() {
        Cow::Owned(format!("'{t}"))
    } else {
        Cow::Borrowed(t)
    }
}

/// A text field read back from a CSV dpaudit wrote: the `'` that [`field`] added is removed.
pub fn unfield(t: &str) -> &str {
    match t.strip_prefix('\'') {
        Some(rest) if rest.starts_with(['=', '+', '-', '@', '\t', '\r', '\'']) && rest.parse::<f64>().is_err() => rest,
        _ => t,
    }
}

/// A CSV being written into memory.
pub struct Csv {
    w: csv::Writer<Vec<u8>>,
}

impl Default for Csv {
    fn default() -> Self {
        Self::new()
    }
}

impl Csv {
    /// An empty CSV.
    pub fn new() -> Self {
        Csv {
            w: csv::Writer::from_writer(Vec::new()),
        }
    }

    /// One row; every field through [`field`].
    pub fn row<I, S>(&mut self, fields: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let cells: Vec<String> = fields.into_iter().map(|f| field(f.as_ref()).into_owned()).collect();
        self.w
            .write_record(&cells)
            .map_err(|e| Error::input(format!("CSV: {e}")))
    }

    /// The bytes written.
    pub fn into_bytes(self) -> Result<Vec<u8>> {
        self.w.into_inner().map_err(|e| Error::input(format!("CSV: {e}")))
    }

    /// The text written.
    pub fn into_string(self) -> Result<String> {
        String::from_utf8(self.into_bytes()?).map_err(|e| Error::input(format!("CSV: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_are_text_numbers_stay_numbers_and_read_back() {
        for (t, want) in [
            ("=HYPERLINK(\"x\")", "'=HYPERLINK(\"x\")"),
            ("+1+cmd", "'+1+cmd"),
            ("-2+3", "'-2+3"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("'=a", "''=a"),
            ("-1.5", "-1.5"),
            ("-inf", "-inf"),
            ("1e-5", "1e-5"),
            ("plain", "plain"),
        ] {
            assert_eq!(field(t), want, "{t}");
            assert_eq!(unfield(&field(t)), t, "{t}");
        }
        let mut c = Csv::new();
        c.row(["a,b", "=1", "2"]).unwrap();
        assert_eq!(c.into_string().unwrap(), "\"a,b\",'=1,2\n");
    }
}
