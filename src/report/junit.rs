//! JUnit XML for CI systems: one `<testcase>` per verdict; a failed verdict carries a
//! `<failure>`, an inconclusive one (or an input error) an `<error>`. The structure follows the
//! common JUnit schema (`testsuites` > `testsuite` > `testcase` > `failure`/`error`,
//! `system-out`), which Jenkins, GitLab, GitHub Actions reporters and Azure all read.

use std::fmt::Write as _;

use super::export::{esc, fmt_num};
use super::Report;
use crate::accountants::sound;

/// A JUnit document for the verdicts of `report`. `elapsed_s` is the wall time of the run.
pub fn to_junit(report: &Report, suite: &str, elapsed_s: f64) -> String {
    let cases: Vec<Case> = report
        .verdicts
        .iter()
        .map(|v| {
            let outcome = match v.status {
                sound::Verdict::Holds => Outcome::Pass,
                sound::Verdict::Violated => Outcome::Failure {
                    kind: "BudgetExceeded".into(),
                    message: v.message.clone(),
                },
                sound::Verdict::NotDemonstrated | sound::Verdict::Unanswered => Outcome::Error {
                    kind: "Inconclusive".into(),
                    message: v.message.clone(),
                },
            };
            Case {
                name: v.subject.clone(),
                outcome,
            }
        })
        .collect();
    let mut props = vec![("command".to_string(), report.command.clone())];
    for i in &report.inputs {
        props.push((
            format!("input.{}", i.role.replace(' ', "_")),
            format!("{} sha256:{}", i.path, i.sha256),
        ));
    }
    if let Some(v) = report.verdicts.first() {
        if let Some(b) = v.budget {
            props.push(("max_epsilon".into(), b.to_string()));
        }
        if let Some(e) = v.epsilon() {
            props.push(("sound_epsilon".into(), e.to_string()));
        }
        if let Some(d) = v.delta() {
            props.push(("delta".into(), d.to_string()));
        }
        if let Some(m) = v.margin {
            props.push(("margin".into(), m.to_string()));
        }
    }
    let mut out_lines = String::new();
    for r in &report.results {
        let _ = writeln!(
            out_lines,
            "{}: ε = {} at δ = {} ({})",
            r.source(),
            fmt_num(r.epsilon),
            fmt_num(r.delta),
            r.kind.as_str()
        );
    }
    for s in &report.skipped {
        let _ = writeln!(out_lines, "{}: not used: {}", s.accountant.as_str(), s.reason);
    }
    render(suite, &cases, &props, &out_lines, elapsed_s)
}

/// A JUnit document recording that the run could not be done (bad input).
pub fn error_junit(suite: &str, case: &str, message: &str, elapsed_s: f64) -> String {
    let cases = [Case {
        name: case.to_string(),
        outcome: Outcome::Error {
            kind: "InputError".into(),
            message: message.to_string(),
        },
    }];
    render(suite, &cases, &[], "", elapsed_s)
}

/// One checked input of a multi-input run: its reports' verdicts, or the error that stopped it.
pub enum Checked<'a> {
    /// The input was accounted; its verdicts become test cases.
    Report(&'a Report),
    /// The input could not be accounted (bad input): one error test case.
    Error(String),
}

/// A JUnit document with one `<testcase>` per input (named after the input) for a run over
/// several inputs: verdicts as in [`to_junit`], input errors as `<error type="InputError">`.
pub(crate) fn to_junit_many(items: &[(String, Checked<'_>)], suite: &str, elapsed_s: f64) -> String {
    let mut cases = Vec::new();
    let mut out_lines = String::new();
    for (name, item) in items {
        match item {
            Checked::Report(r) => {
                for v in &r.verdicts {
                    let outcome = match v.status {
                        sound::Verdict::Holds => Outcome::Pass,
                        sound::Verdict::Violated => Outcome::Failure {
                            kind: "BudgetExceeded".into(),
                            message: v.message.clone(),
                        },
                        sound::Verdict::NotDemonstrated | sound::Verdict::Unanswered => Outcome::Error {
                            kind: "Inconclusive".into(),
                            message: v.message.clone(),
                        },
                    };
                    cases.push(Case {
                        name: name.clone(),
                        outcome,
                    });
                }
                for res in &r.results {
                    let _ = writeln!(
                        out_lines,
                        "{name}: {}: ε = {} at δ = {} ({})",
                        res.source(),
                        fmt_num(res.epsilon),
                        fmt_num(res.delta),
                        res.kind.as_str()
                    );
                }
            }
            Checked::Error(message) => cases.push(Case {
                name: name.clone(),
                outcome: Outcome::Error {
                    kind: "InputError".into(),
                    message: message.clone(),
                },
            }),
        }
    }
    render(suite, &cases, &[], &out_lines, elapsed_s)
}

struct Case {
    name: String,
    outcome: Outcome,
}

enum Outcome {
    Pass,
    Failure { kind: String, message: String },
    Error { kind: String, message: String },
}

fn render(suite: &str, cases: &[Case], props: &[(String, String)], system_out: &str, elapsed_s: f64) -> String {
    let failures = cases
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Failure { .. }))
        .count();
    let errors = cases
        .iter()
        .filter(|c| matches!(c.outcome, Outcome::Error { .. }))
        .count();
    let time = format!("{elapsed_s:.3}");
    let mut s = String::new();
    let _ = writeln!(s, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>");
    let _ = writeln!(
        s,
        "<testsuites name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"0\" time=\"{time}\">",
        esc(suite),
        cases.len()
    );
    let _ = writeln!(
        s,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"0\" time=\"{time}\">",
        esc(suite),
        cases.len()
    );
    if !props.is_empty() {
        let _ = writeln!(s, "    <properties>");
        for (k, v) in props {
            let _ = writeln!(s, "      <property name=\"{}\" value=\"{}\"/>", esc(k), esc(v));
        }
        let _ = writeln!(s, "    </properties>");
    }
    let classname = esc(&suite.replace(' ', "."));
    for c in cases {
        let _ = write!(
            s,
            "    <testcase name=\"{}\" classname=\"{classname}\" time=\"{time}\"",
            esc(&c.name)
        );
        match &c.outcome {
            Outcome::Pass => {
                let _ = writeln!(s, "/>");
            }
            Outcome::Failure { kind, message } => {
                let _ = writeln!(
                    s,
                    ">\n      <failure message=\"{}\" type=\"{}\">{}</failure>\n    </testcase>",
                    esc(message),
                    esc(kind),
                    esc(message)
                );
            }
            Outcome::Error { kind, message } => {
                let _ = writeln!(
                    s,
                    ">\n      <error message=\"{}\" type=\"{}\">{}</error>\n    </testcase>",
                    esc(message),
                    esc(kind),
                    esc(message)
                );
            }
        }
    }
    if !system_out.is_empty() {
        let _ = writeln!(s, "    <system-out>{}</system-out>", esc(system_out));
    }
    let _ = writeln!(s, "  </testsuite>\n</testsuites>");
    s
}
