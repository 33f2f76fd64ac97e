//! One serialisable [`Report`] that every command fills, and exporters that turn it into bytes:
//! Markdown, self-contained HTML (plots inline as SVG), CSV (tables) and JSON (the model itself).
//!
//! A command builds a `Report` (inputs with SHA-256 hashes, the accounted [`DpEvent`], the
//! assumptions, each accountant's [`Evidence`], verdicts, warnings, tables and plot specs),
//! then hands it to [`export`] (one format, bytes) or [`write_all`] (every format into an
//! [`output::OutputDir`]). Exporters read only the model, never a command's internals, so a JSON
//! report read back with [`from_json`] renders to the same Markdown and HTML.
//!
//! See `docs/reports.md` for how a command fills the model.

pub mod conclusion;
pub mod csv_out;
pub mod export;
pub mod junit;
pub mod num;
pub mod output;
pub mod plot;
pub mod progress;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use crate::accountants::sound::{self, Evidence};
use crate::accountants::{AccountantKind, BoundKind, Diagnostic};
use crate::error::{Error, Result};
use crate::events::{DpEvent, Neighbouring};

pub use export::{
    export, from_json, to_csv_files, to_html, to_json, to_markdown, write_all, write_all_with, ExportFormat,
};
pub use output::OutputDir;
pub use plot::{Axis, LegendPosition, LineStyle, Plot, Scale, Series};

/// Version of the JSON report format written by this dpaudit (described by
/// `docs/schema/report.v2.json`). Version 1 files are read and upgraded.
pub const SCHEMA_VERSION: u32 = 2;

pub use conclusion::Conclusion;

/// Everything a reviewer needs to judge one dpaudit result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Always [`SCHEMA_VERSION`] when written by this dpaudit.
    pub schema_version: u32,
    /// The dpaudit command that produced the report: `account`, `analyze`, `calibrate`,
    /// `check`, `mia`, `run`, `sweep`, `train` or `verify` (empty in upgraded version 1 files).
    #[serde(default)]
    pub audit: String,
    /// Report title.
    pub title: String,
    /// The plain-language conclusion shown first (what was audited, the guarantee, the
    /// verdict, what is an estimate). Filled by [`Report::conclude`] before export.
    #[serde(default)]
    pub conclusion: Option<Conclusion>,
    /// The command line that produced the report (for reproduction), e.g.
    /// `dpaudit check fixtures/events/dpsgd.toml --max-epsilon 8`.
    pub command: String,
    /// The tool and version that wrote it.
    pub tool: Tool,
    /// RNG seed, when the command used randomness.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Files read, with their SHA-256 hashes.
    #[serde(default)]
    pub inputs: Vec<Input>,
    #[serde(default)]
    /// What the accounting assumed.
    pub assumptions: Assumptions,
    /// The accounted event tree (rendered as a ledger).
    #[serde(default)]
    pub event: Option<DpEvent>,
    /// The δ at which ε was computed (when one δ applies to the whole report).
    #[serde(default, with = "num::opt")]
    pub delta: Option<f64>,
    /// Each accountant's answer, with its [`BoundKind`].
    #[serde(default)]
    pub results: Vec<Evidence>,
    /// Accountants that could not account the event, and why.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// The command's answer as typed numbers (calibrate's σ, q, steps or samples, the ε it
    /// gives), keyed by name: what a program reads instead of parsing `summary`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub answers: BTreeMap<String, f64>,
    #[serde(default)]
    /// Budget or claim verdicts.
    pub verdicts: Vec<Verdict>,
    #[serde(default)]
    /// Warnings (validity conditions, fallbacks).
    pub warnings: Vec<Diagnostic>,
    /// Headline facts (name → formatted value), shown near the top.
    #[serde(default)]
    pub summary: Vec<Fact>,
    #[serde(default)]
    /// Tables (per-step values, sweep points).
    pub tables: Vec<Table>,
    #[serde(default)]
    /// Plots.
    pub plots: Vec<Plot>,
}

/// The tool that wrote the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Tool name.
    pub name: String,
    /// Tool version.
    pub version: String,
}

impl Tool {
    /// This dpaudit build.
    pub fn current() -> Self {
        Tool {
            name: env!("CARGO_PKG_NAME").to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// An input file and its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// What the file is, e.g. `event file`, `sampler config`, `dataset`.
    pub role: String,
    /// The path as given on the command line.
    pub path: String,
    /// Lower-case hex SHA-256 of the file's bytes.
    pub sha256: String,
    /// Size in bytes.
    pub bytes: u64,
}

impl Input {
    /// Hashes the file at `path`.
    pub(crate) fn from_file(role: &str, path: &Path) -> Result<Self> {
        output::note_input(path);
        let (sha256, bytes) = crate::limits::hash_file_capped(path, "file size")?;
        Ok(Input {
            role: role.to_string(),
            path: path.display().to_string(),
            sha256,
            bytes,
        })
    }
}

/// Lower-case hex SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(data);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// What the accounting assumed. Every report states these explicitly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Assumptions {
    /// Neighbouring relation.
    pub neighbouring: Option<Neighbouring>,
    /// e.g. `Poisson, q = 0.01`, `full batch`, `without replacement, 64 of 50000`.
    #[serde(default)]
    pub sampling: Option<String>,
    /// e.g. `A: t = t_i, Δt = t_i − t_{i+1}` for diffusion step conventions.
    #[serde(default)]
    pub step_convention: Option<String>,
    /// Anything else the numbers depend on.
    #[serde(default)]
    pub other: Vec<Fact>,
}

/// A named, already formatted value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fact {
    /// Name of the value.
    pub name: String,
    /// The formatted value.
    pub value: String,
}

impl Fact {
    /// A fact `name` = `value`.
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Fact {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// An accountant that did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skipped {
    /// The accountant.
    pub accountant: AccountantKind,
    /// Why it produced nothing.
    pub reason: String,
}

/// One verdict row: a budget or claim compared with a **sound** ε (never an estimate) — a view
/// over the one ε record ([`Evidence`]: ε, δ, accountant or method, kind) with what was checked,
/// against what, and the verdict.
///
/// Its `status` is the one verdict ([`crate::accountants::sound::Verdict`]), written with the
/// reports' own words (`pass`, `fail`, `inconclusive`; [`sound::Verdict::status_word`]). A claim's
/// row carries its verdict; a budget is the one-sided question "is the sound upper bound within
/// it": holds when it is, violated when it is not, not demonstrated when no sound accountant
/// applies (`audit::budget_verdict`).
///
/// JSON keeps the flat row (`epsilon`, `delta`, `accountant`, `bound`, `source` beside the
/// verdict; docs/schema/report.v2.json): the evidence's fields, `source` only when no accountant
/// computed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "VerdictRow", into = "VerdictRow")]
pub struct Verdict {
    /// What was checked, e.g. `ε budget` or a claim's name.
    pub subject: String,
    /// The verdict (`pass`, `fail` or `inconclusive` in JSON).
    pub status: sound::Verdict,
    /// The ε the subject allows (budget or claimed ε).
    pub budget: Option<f64>,
    /// The number it was compared with: a sound upper bound (a budget, a claim that holds), a
    /// sound lower bound (a violation, an audit), or none.
    pub evidence: Option<Evidence>,
    /// `budget − epsilon` (negative when over budget).
    pub margin: Option<f64>,
    /// The verdict in words.
    pub message: String,
}

impl Verdict {
    /// ε of the evidence.
    pub fn epsilon(&self) -> Option<f64> {
        self.evidence.as_ref().map(|e| e.epsilon)
    }
    /// δ at which the evidence's ε holds.
    pub fn delta(&self) -> Option<f64> {
        self.evidence.as_ref().map(|e| e.delta).filter(|d| !d.is_nan())
    }
    /// The accountant that computed the evidence.
    pub fn accountant(&self) -> Option<AccountantKind> {
        self.evidence.as_ref().and_then(|e| e.accountant)
    }
    /// The kind of the evidence's ε (exact, upper bound, lower bound).
    pub fn bound(&self) -> Option<BoundKind> {
        self.evidence.as_ref().map(|e| e.kind)
    }
    /// Where the evidence comes from when no accountant computed it (a δ floor, a
    /// Clopper–Pearson audit).
    pub fn source(&self) -> Option<&str> {
        self.evidence
            .as_ref()
            .filter(|e| e.accountant.is_none())
            .map(|e| e.method.as_str())
    }
}

/// The JSON shape of a [`Verdict`] row (flat, as reports have always written it).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VerdictRow {
    subject: String,
    #[serde(with = "sound::status_word")]
    status: sound::Verdict,
    #[serde(default, with = "num::opt")]
    budget: Option<f64>,
    #[serde(default, with = "num::opt")]
    epsilon: Option<f64>,
    #[serde(default, with = "num::opt")]
    delta: Option<f64>,
    #[serde(default)]
    accountant: Option<AccountantKind>,
    #[serde(default)]
    bound: Option<BoundKind>,
    #[serde(default, with = "num::opt")]
    margin: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    message: String,
}

impl From<Verdict> for VerdictRow {
    fn from(v: Verdict) -> Self {
        let (epsilon, delta, accountant, bound, source) = (
            v.epsilon(),
            v.delta(),
            v.accountant(),
            v.bound(),
            v.source().map(String::from),
        );
        VerdictRow {
            subject: v.subject,
            status: v.status,
            budget: v.budget,
            epsilon,
            delta,
            accountant,
            bound,
            margin: v.margin,
            source,
            message: v.message,
        }
    }
}

impl From<VerdictRow> for Verdict {
    /// A row read back: an ε with its kind is the evidence (named by its accountant, else its
    /// source); an ε without a kind is read as an estimate, which decides nothing.
    fn from(r: VerdictRow) -> Self {
        let evidence = r.epsilon.map(|eps| {
            let method = r
                .accountant
                .map(|a| a.as_str().to_string())
                .or(r.source)
                .unwrap_or_default();
            let mut e = Evidence::new(
                &method,
                eps,
                r.delta.unwrap_or(f64::NAN),
                r.bound.unwrap_or(BoundKind::Estimate),
            );
            e.accountant = r.accountant;
            e
        });
        Verdict {
            subject: r.subject,
            status: r.status,
            budget: r.budget,
            evidence,
            margin: r.margin,
            message: r.message,
        }
    }
}

/// A table of rows (per-step values, sweep points, …). Exported as one CSV file each.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    /// Stable identifier, used in file names (`report-<id>.csv`): `[a-z0-9_-]+`.
    pub id: String,
    /// Title of the table.
    pub title: String,
    /// Columns.
    pub columns: Vec<Column>,
    /// Rows, one cell per column.
    pub rows: Vec<Vec<Cell>>,
    #[serde(default)]
    /// Note shown under the table.
    pub note: Option<String>,
}

/// A table column with an optional unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column {
    /// Column name.
    pub name: String,
    #[serde(default)]
    /// Unit, if any.
    pub unit: Option<String>,
}

impl Column {
    /// A column without a unit.
    pub fn new(name: &str) -> Self {
        Column {
            name: name.to_string(),
            unit: None,
        }
    }
    /// A column with a unit.
    pub fn with_unit(name: &str, unit: &str) -> Self {
        Column {
            name: name.to_string(),
            unit: Some(unit.to_string()),
        }
    }
    /// `name [unit]` or `name`.
    pub fn header(&self) -> String {
        match &self.unit {
            Some(u) if !u.is_empty() => format!("{} [{}]", self.name, u),
            _ => self.name.clone(),
        }
    }
}

/// A table cell. In JSON: integers as integers, floats as floats (non-finite as `"inf"`,
/// `"-inf"`, `"nan"`), text as strings, empty as `null`.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// An integer.
    Int(i64),
    /// A float.
    Num(f64),
    /// Text.
    Text(String),
    /// No value.
    Empty,
}

impl From<f64> for Cell {
    fn from(x: f64) -> Self {
        Cell::Num(x)
    }
}
impl From<i64> for Cell {
    fn from(x: i64) -> Self {
        Cell::Int(x)
    }
}
impl From<u64> for Cell {
    fn from(x: u64) -> Self {
        Cell::Int(x.min(i64::MAX as u64) as i64)
    }
}
impl From<usize> for Cell {
    fn from(x: usize) -> Self {
        Cell::Int(x as i64)
    }
}
impl From<&str> for Cell {
    fn from(x: &str) -> Self {
        Cell::Text(x.to_string())
    }
}
impl From<String> for Cell {
    fn from(x: String) -> Self {
        Cell::Text(x)
    }
}
impl<T: Into<Cell>> From<Option<T>> for Cell {
    fn from(x: Option<T>) -> Self {
        x.map(Into::into).unwrap_or(Cell::Empty)
    }
}

impl Serialize for Cell {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Cell::Int(i) => s.serialize_i64(*i),
            Cell::Num(x) => num::serialize(x, s),
            Cell::Text(t) => s.serialize_str(t),
            Cell::Empty => s.serialize_none(),
        }
    }
}

impl<'de> Deserialize<'de> for Cell {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Cell;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number, a string or null")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<Cell, E> {
                Ok(Cell::Int(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<Cell, E> {
                Ok(Cell::from(v))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> std::result::Result<Cell, E> {
                Ok(Cell::Num(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Cell, E> {
                Ok(match num::parse_non_finite(v) {
                    Some(x) => Cell::Num(x),
                    None => Cell::Text(v.to_string()),
                })
            }
            fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Cell, E> {
                Ok(Cell::Empty)
            }
            fn visit_none<E: serde::de::Error>(self) -> std::result::Result<Cell, E> {
                Ok(Cell::Empty)
            }
        }
        d.deserialize_any(V)
    }
}

impl Report {
    /// An empty report for `command` (the command line, for reproduction).
    pub fn new(title: impl Into<String>, command: impl Into<String>) -> Self {
        Report {
            schema_version: SCHEMA_VERSION,
            audit: String::new(),
            title: title.into(),
            conclusion: None,
            command: command.into(),
            tool: Tool::current(),
            seed: None,
            inputs: Vec::new(),
            assumptions: Assumptions::default(),
            event: None,
            delta: None,
            results: Vec::new(),
            skipped: Vec::new(),
            answers: BTreeMap::new(),
            verdicts: Vec::new(),
            warnings: Vec::new(),
            summary: Vec::new(),
            tables: Vec::new(),
            plots: Vec::new(),
        }
    }

    /// Sets the command name ([`Report::audit`]).
    pub(crate) fn for_command(mut self, audit: &str) -> Self {
        self.audit = audit.to_string();
        self
    }

    /// Fills [`Report::conclusion`] from the report's content when a command has not set it.
    pub fn conclude(&mut self) -> &mut Self {
        if self.conclusion.is_none() {
            self.conclusion = Some(conclusion::derive(self));
        }
        self
    }

    /// Records an input file with its hash.
    pub fn add_input(&mut self, role: &str, path: &Path) -> Result<&mut Self> {
        self.inputs.push(Input::from_file(role, path)?);
        Ok(self)
    }

    /// Adds a warning (deduplicated by code and message).
    pub fn warn(&mut self, code: &str, message: impl Into<String>, severe: bool) -> &mut Self {
        let d = Diagnostic {
            code: code.to_string(),
            message: message.into(),
            severe,
        };
        if !self.warnings.contains(&d) {
            self.warnings.push(d);
        }
        self
    }

    /// Adds an assumption `name` = `value`.
    pub fn fact(&mut self, name: impl Into<String>, value: impl Into<String>) -> &mut Self {
        self.summary.push(Fact::new(name, value));
        self
    }

    /// The smallest ε among results whose kind is sound (exact or upper bound): the number a
    /// budget may be checked against. `None` when no sound accountant produced a result.
    pub fn sound_epsilon(&self) -> Option<&Evidence> {
        crate::accountants::sound::tightest_upper(&self.results)
    }

    /// Checks the model before export: identifiers usable as file names, rectangular tables,
    /// series with matching x/y lengths.
    pub fn validate(&self) -> Result<()> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(Error::field(
                "schema_version",
                format!(
                    "unsupported report schema_version {} (this dpaudit reads {SCHEMA_VERSION})",
                    self.schema_version
                ),
            ));
        }
        let mut ids = std::collections::BTreeSet::new();
        for (i, t) in self.tables.iter().enumerate() {
            check_id(&t.id).map_err(|e| e.with_field(format!("tables[{i}].id")))?;
            if !ids.insert(format!("t:{}", t.id)) {
                return Err(Error::field(
                    format!("tables[{i}].id"),
                    format!("duplicate table id `{}`", t.id),
                ));
            }
            for (r, row) in t.rows.iter().enumerate() {
                if row.len() != t.columns.len() {
                    return Err(Error::field(
                        format!("tables[{i}].rows[{r}]"),
                        format!(
                            "row has {} cells but the table has {} columns",
                            row.len(),
                            t.columns.len()
                        ),
                    ));
                }
            }
        }
        for (i, p) in self.plots.iter().enumerate() {
            check_id(&p.id).map_err(|e| e.with_field(format!("plots[{i}].id")))?;
            if !ids.insert(format!("p:{}", p.id)) {
                return Err(Error::field(
                    format!("plots[{i}].id"),
                    format!("duplicate plot id `{}`", p.id),
                ));
            }
            for (s, series) in p.series.iter().enumerate() {
                if series.x.len() != series.y.len() {
                    return Err(Error::field(
                        format!("plots[{i}].series[{s}]"),
                        format!("x has {} values but y has {}", series.x.len(), series.y.len()),
                    ));
                }
            }
        }
        Ok(())
    }
}

thread_local! {
    /// The command an embedding names for the call running on this thread ([`with_command`]).
    static EMBEDDED_COMMAND: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with `command` as what [`command_line`] answers on this thread: an embedding (the
/// Python package) names its call, e.g. `python: dpaudit.account`, instead of its process's
/// arguments (a `python -c` program would otherwise be recorded whole as the report's command).
pub fn with_command<R>(command: &str, f: impl FnOnce() -> R) -> R {
    let previous = EMBEDDED_COMMAND.with(|c| c.replace(Some(command.to_string())));
    let r = f();
    EMBEDDED_COMMAND.with(|c| *c.borrow_mut() = previous);
    r
}

/// The current command line, shell-quoted, with the program name shown as `dpaudit` (for
/// [`Report::command`]); inside [`with_command`], the command the embedding named.
pub fn command_line() -> String {
    if let Some(c) = EMBEDDED_COMMAND.with(|c| c.borrow().clone()) {
        return c;
    }
    let mut parts = vec!["dpaudit".to_string()];
    parts.extend(std::env::args_os().skip(1).map(|a| shell_quote(&a.to_string_lossy())));
    parts.join(" ")
}

fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Error::input(format!(
            "identifier `{id}` must be 1–64 characters of a-z, 0-9, `_` or `-` (it names files)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verdict_rows_status_keeps_the_reports_words() {
        for (v, word, back) in [
            (sound::Verdict::Holds, "pass", sound::Verdict::Holds),
            (sound::Verdict::Violated, "fail", sound::Verdict::Violated),
            (
                sound::Verdict::NotDemonstrated,
                "inconclusive",
                sound::Verdict::NotDemonstrated,
            ),
            (
                sound::Verdict::Unanswered,
                "inconclusive",
                sound::Verdict::NotDemonstrated,
            ),
        ] {
            let row = Verdict {
                subject: "budget".into(),
                status: v,
                budget: Some(1.0),
                evidence: None,
                margin: None,
                message: String::new(),
            };
            let json = serde_json::to_value(&row).unwrap();
            assert_eq!(json["status"], word);
            let read: Verdict = serde_json::from_value(json).unwrap();
            assert_eq!(read.status, back);
        }
    }

    #[test]
    fn cells_and_non_finite_numbers_round_trip() {
        let mut r = Report::new("t", "dpaudit test");
        r.delta = Some(1e-5);
        r.results.push(
            Evidence::of(AccountantKind::Pld, f64::INFINITY, 1e-5, BoundKind::UpperBound)
                .with_detail("mu", f64::INFINITY),
        );
        r.tables.push(Table {
            id: "steps".into(),
            title: "Steps".into(),
            columns: vec![Column::new("a"), Column::new("b"), Column::new("c"), Column::new("d")],
            rows: vec![vec![
                Cell::Int(3),
                Cell::Num(3.0),
                Cell::Num(f64::NEG_INFINITY),
                Cell::Text("x".into()),
            ]],
            note: None,
        });
        let js = serde_json::to_string(&r).unwrap();
        assert!(js.contains("\"inf\""), "{js}");
        let back: Report = serde_json::from_str(&js).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn sound_epsilon_ignores_estimates() {
        let mut r = Report::new("t", "x");
        r.results
            .push(Evidence::of(AccountantKind::Clt, 0.5, 1e-5, BoundKind::Estimate));
        r.results
            .push(Evidence::of(AccountantKind::Rdp, 1.4, 1e-5, BoundKind::UpperBound));
        r.results
            .push(Evidence::of(AccountantKind::Pld, 0.8, 1e-5, BoundKind::UpperBound));
        let s = r.sound_epsilon().unwrap();
        assert_eq!(s.accountant, Some(AccountantKind::Pld));
        r.results.retain(|x| x.kind == BoundKind::Estimate);
        assert!(r.sound_epsilon().is_none());
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let r = Report::new("t", "x");
        let mut v = serde_json::to_value(&r).unwrap();
        v["surprise"] = serde_json::json!(1);
        let e = serde_json::from_value::<Report>(v).unwrap_err();
        assert!(e.to_string().contains("unknown field `surprise`"), "{e}");
    }

    #[test]
    fn validate_names_bad_ids_and_ragged_rows() {
        let mut r = Report::new("t", "x");
        r.tables.push(Table {
            id: "Bad Id".into(),
            title: "t".into(),
            columns: vec![Column::new("a")],
            rows: vec![],
            note: None,
        });
        let e = r.validate().unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tables[0].id"));
        r.tables[0].id = "ok".into();
        r.tables[0].rows.push(vec![]);
        let e = r.validate().unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tables[0].rows[0]"));
    }
}
