//! One library error type. Every error carries a kind and,
//! where known, the file, line and field that caused it.

use std::fmt;
use std::path::{Path, PathBuf};

/// What went wrong, coarsely. Every error is a usage or input error (exit 2 in the binary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The user's input (a flag, a config file, a data file) is invalid. Exit code 2.
    Input,
    /// An accountant cannot handle (part of) an event tree. Exit code 2.
    Unsupported,
    /// A numeric routine could not produce a sound answer (e.g. no bracket for a root). Exit 2.
    Numeric,
    /// Reading or writing a file failed. Exit code 2.
    Io,
    /// A model / tensor operation failed (candle). Exit code 2.
    Model,
}

/// The library error: a kind, a message, and optional location context.
#[derive(Debug, Clone)]
pub struct Error {
    /// What went wrong, for exit codes and matching.
    pub kind: ErrorKind,
    /// Human-readable message.
    pub message: String,
    /// The file the error is about.
    pub file: Option<PathBuf>,
    /// Line in that file (1-based).
    pub line: Option<usize>,
    /// The field or flag, as users write it.
    pub field: Option<String>,
}

/// Result with the library [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `kind` with `message` and no location.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            file: None,
            line: None,
            field: None,
        }
    }
    /// Invalid user input.
    pub fn input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Input, message)
    }
    /// Invalid value of a named field or flag.
    pub fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::input(message).with_field(field)
    }
    /// The accountant cannot handle the event (names the sub-event).
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
    /// A numerical failure (no convergence, overflow).
    pub fn numeric(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Numeric, message)
    }
    /// A model, checkpoint or tensor error.
    pub fn model(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Model, message)
    }
    /// An I/O error on `path`.
    pub fn io(path: &Path, err: &std::io::Error) -> Self {
        Self::new(ErrorKind::Io, err.to_string()).with_file(path)
    }
    /// Attaches the file the error is about.
    pub fn with_file(mut self, file: impl AsRef<Path>) -> Self {
        if self.file.is_none() {
            self.file = Some(file.as_ref().to_path_buf());
        }
        self
    }
    /// Attaches the line in that file.
    pub(crate) fn with_line(mut self, line: usize) -> Self {
        if self.line.is_none() {
            self.line = Some(line);
        }
        self
    }
    /// Attaches the field or flag.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(match self.field.take() {
            // Nested fields read outer.inner.
            Some(inner) => format!("{}.{}", field.into(), inner),
            None => field.into(),
        });
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
            write!(f, ": ")?;
        } else if let Some(line) = self.line {
            write!(f, "line {line}: ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "field `{field}`: ")?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(feature = "models")]
impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::model(e.to_string())
    }
}

/// Turns a TOML parse/deserialise error into an [`Error`] with file, line and field.
pub(crate) fn from_toml(path: &Path, src: &str, err: toml::de::Error) -> Error {
    let mut e = Error::input(err.message().to_string()).with_file(path);
    if let Some(span) = err.span() {
        let line = src[..span.start.min(src.len())].matches('\n').count() + 1;
        e = e.with_line(line);
    }
    e
}

/// How an error message may show a cell or token read from a data file: quoted when it is a
/// short run of characters that can appear in a number (`1.5e3`, `-0.2`, `1.2.3`), otherwise
/// described by its length only. A file referenced from another file (a sampler config's
/// `density.data`, a card's data) may be any file the user can read (`/etc/passwd`,
/// `/proc/self/environ`); its text must not end up in a message (docs/reliability.md, threat
/// model).
pub fn token(cell: &str) -> String {
    let t = cell.trim();
    let numeric = |c: char| c.is_ascii_digit() || matches!(c, '+' | '-' | '.' | 'e' | 'E' | '_');
    if t.is_empty() {
        "an empty cell".to_string()
    } else if t.len() <= 24 && t.chars().all(numeric) {
        format!("`{t}`")
    } else {
        format!("a cell of {} characters", t.chars().count())
    }
}

/// True when `message` describes a write to a closed pipe (the reader, e.g. `| head`, exited).
pub fn is_broken_pipe_message(message: &str) -> bool {
    message.contains("Broken pipe") || message.contains("os error 32")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Cfg {
        a: f64,
    }

    #[test]
    fn toml_errors_name_file_and_line() {
        let src = "\n\nb = 1\n";
        let err = toml::from_str::<Cfg>(src).unwrap_err();
        let e = from_toml(Path::new("x.toml"), src, err);
        let s = e.to_string();
        assert!(s.starts_with("x.toml:3: "), "{s}");
        assert!(s.contains("unknown field `b`"), "{s}");
    }

    #[test]
    fn nested_fields_join() {
        let e = Error::field("sigma", "must be > 0").with_field("event");
        assert_eq!(e.to_string(), "field `event.sigma`: must be > 0");
    }
}
