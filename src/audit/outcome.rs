//! What every command's application layer returns: its [`Report`], its terminal text, its own
//! files and one [`Verdict`] (the one verdict enum, re-exported here for the binary). The binary
//! turns it into the process exit code through its one mapping, [`Verdict::exit_code`]; nothing
//! below it decides an exit code.

pub use crate::accountants::sound::Verdict;
use crate::report::Report;

/// What a command produced, before anything is printed or written.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The one report (every `--format` and `--out DIR` renders it).
    pub report: Report,
    /// The terminal summary (`--format text`).
    pub text: String,
    /// The command's main table as CSV with its file name in `--out DIR`: `--format csv`
    /// prints it instead of the report's tables. None: `--format csv` prints the report's.
    pub table: Option<(String, Vec<u8>)>,
    /// The command's own files for `--out DIR` (detail JSON, ledgers), name and bytes.
    pub files: Vec<(String, Vec<u8>)>,
    /// The answer (a batch answers its worst item).
    pub status: Verdict,
}

impl Outcome {
    /// An outcome that holds (nothing contradicted), with no main table and no files.
    pub fn new(report: Report, text: String) -> Outcome {
        Outcome {
            report,
            text,
            table: None,
            files: Vec::new(),
            status: Verdict::Holds,
        }
    }

    /// Sets the main table (`--format csv`, and `name` in `--out DIR`).
    pub(crate) fn with_table(mut self, name: &str, csv: Vec<u8>) -> Outcome {
        self.table = Some((name.to_string(), csv));
        self
    }

    /// Adds one of the command's own files.
    pub fn with_file(mut self, name: &str, bytes: Vec<u8>) -> Outcome {
        self.files.push((name.to_string(), bytes));
        self
    }

    /// Sets the status.
    pub(crate) fn with_status(mut self, status: Verdict) -> Outcome {
        self.status = status;
        self
    }
}
