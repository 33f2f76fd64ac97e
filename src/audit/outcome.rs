//! What every command's application layer returns: its [`Report`], its terminal text, its own
//! files and one [`Status`]. The binary turns the status into the process exit code in one
//! place (`cli::exit_code`); nothing below it decides an exit code.

use crate::report::{self, Report};

/// How a command's question was answered (ordered: a batch reports its worst).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// Everything as claimed, within budget, or nothing was judged.
    Ok,
    /// A claim is not demonstrated: nothing sound supports or refutes it (`verify`). A CI guard
    /// treats it like a violation.
    NotDemonstrated,
    /// A claim, budget or implementation audit is violated.
    Violated,
    /// The question could not be answered from the input (bad input, or no sound accountant
    /// applies), reported on stderr.
    Unanswered,
}

impl Status {
    /// The status of one budget or claim verdict: pass is ok, fail is violated, inconclusive is
    /// not demonstrated.
    pub(crate) fn of_verdict(s: report::Status) -> Status {
        match s {
            report::Status::Pass => Status::Ok,
            report::Status::Fail => Status::Violated,
            report::Status::Inconclusive => Status::NotDemonstrated,
        }
    }

    /// The worse of two statuses (a batch is as bad as its worst item).
    pub fn worst(self, other: Status) -> Status {
        self.max(other)
    }
}

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
    /// The answer.
    pub status: Status,
}

impl Outcome {
    /// An outcome with status ok, no main table and no files.
    pub fn new(report: Report, text: String) -> Outcome {
        Outcome {
            report,
            text,
            table: None,
            files: Vec::new(),
            status: Status::Ok,
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
    pub(crate) fn with_status(mut self, status: Status) -> Outcome {
        self.status = status;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_orders_ok_not_demonstrated_violated_unanswered() {
        assert_eq!(Status::Ok.worst(Status::Violated), Status::Violated);
        assert_eq!(Status::Violated.worst(Status::NotDemonstrated), Status::Violated);
        assert_eq!(Status::Violated.worst(Status::Unanswered), Status::Unanswered);
        assert_eq!(
            Status::of_verdict(report::Status::Inconclusive),
            Status::NotDemonstrated
        );
        assert_eq!(Status::of_verdict(report::Status::Fail), Status::Violated);
        assert_eq!(Status::of_verdict(report::Status::Pass), Status::Ok);
    }
}
