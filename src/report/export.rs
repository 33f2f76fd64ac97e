//! Exporters: a [`Report`] to bytes. They read only the model, so a JSON report read back with
//! [`from_json`] renders to exactly the same Markdown, HTML and CSV.
//!
//! File names written by [`write_all`] (stable, for `--out DIR`):
//! `report.json`, `report.md`, `report.html`, `report-results.csv`, `report-verdicts.csv`,
//! `report-<table id>.csv`, `plot-<plot id>.svg`, `plot-<plot id>.png`.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::output::OutputDir;
use super::plot;
use super::{num, Cell, Report, Table, SCHEMA_VERSION};
use crate::accountants::BoundKind;
use crate::error::{Error, Result};

/// An export format (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// Markdown.
    Md,
    /// Self-contained HTML with inline SVG plots.
    Html,
    /// CSV (results and verdicts).
    Csv,
    /// JSON (the report model).
    Json,
}

/// One format as bytes. CSV gives every table one after the other, each preceded by a
/// `# <id>: <title>` comment line and separated by an empty line (`--out` writes one file each).
pub fn export(report: &Report, format: ExportFormat) -> Result<Vec<u8>> {
    report.validate()?;
    let report = &with_conclusion(report);
    Ok(match format {
        ExportFormat::Md => markdown(report, Images::Inline)?.into_bytes(),
        ExportFormat::Html => to_html(report)?.into_bytes(),
        ExportFormat::Json => to_json(report)?.into_bytes(),
        ExportFormat::Csv => {
            let mut out = Vec::new();
            for (i, (name, title, bytes)) in csv_tables(report)?.into_iter().enumerate() {
                if i > 0 {
                    out.push(b'\n');
                }
                out.extend_from_slice(format!("# {name}: {title}\n").as_bytes());
                out.extend_from_slice(&bytes);
            }
            out
        }
    })
}

/// Writes every format (and each plot as SVG and PNG) into `dir` with stable names.
pub fn write_all(report: &Report, dir: &OutputDir) -> Result<Vec<PathBuf>> {
    write_all_with(report, dir, Vec::new())
}

/// [`write_all`] plus a command's own files (`extra`: name and bytes), all targets checked
/// before the first is written, each written atomically. The Markdown links the plot files
/// written beside it.
pub fn write_all_with(report: &Report, dir: &OutputDir, extra: Vec<(String, Vec<u8>)>) -> Result<Vec<PathBuf>> {
    report.validate()?;
    let report = &with_conclusion(report);
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("report.json".into(), to_json(report)?.into_bytes()),
        ("report.md".into(), to_markdown(report).into_bytes()),
        ("report.html".into(), to_html(report)?.into_bytes()),
    ];
    files.extend(to_csv_files(report)?);
    for p in &report.plots {
        files.push((format!("plot-{}.svg", p.id), plot::render_svg(p)?.into_bytes()));
        files.push((format!("plot-{}.png", p.id), plot::render_png(p)?));
    }
    files.extend(extra);
    dir.write_files(&files)
}

/// The report with its conclusion filled in (see [`Report::conclude`]).
fn with_conclusion(r: &Report) -> std::borrow::Cow<'_, Report> {
    if r.conclusion.is_some() {
        std::borrow::Cow::Borrowed(r)
    } else {
        let mut r = r.clone();
        r.conclude();
        std::borrow::Cow::Owned(r)
    }
}

/// The conclusion of `r` (derived when the report has none).
fn conclusion_of(r: &Report) -> super::Conclusion {
    r.conclusion.clone().unwrap_or_else(|| super::conclusion::derive(r))
}

/// The JSON report (pretty-printed, trailing newline).
pub fn to_json(report: &Report) -> Result<String> {
    let mut s = serde_json::to_string_pretty(report)
        .map_err(|e| Error::input(format!("report could not be serialised: {e}")))?;
    s.push('\n');
    Ok(s)
}

/// Reads a JSON report strictly (unknown fields are errors) and checks its schema version.
/// Version 1 reports (dpaudit before the one-report contract) are upgraded: they lack only the
/// `audit` name and the conclusion, which is derived from their content.
pub fn from_json(bytes: &[u8]) -> Result<Report> {
    // Check the version first so an old/new report gets a clear message, not a field error.
    let mut upgrade = false;
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
        match v.get("schema_version").and_then(|s| s.as_u64()) {
            Some(1) => upgrade = true,
            Some(n) if n != SCHEMA_VERSION as u64 => {
                return Err(Error::field(
                    "schema_version",
                    format!(
                        "unsupported report schema_version {n} (this dpaudit reads 1 and {SCHEMA_VERSION}; \
a newer dpaudit wrote this file)"
                    ),
                ))
            }
            None if v.is_object() => {
                return Err(Error::field(
                    "schema_version",
                    "missing; this is not a dpaudit report (dpaudit reports start with \"schema_version\")",
                ))
            }
            _ => {}
        }
    }
    let mut r: Report = serde_json::from_slice(bytes).map_err(|e| {
        let mut err = Error::input(format!("not a valid dpaudit report: {e}"));
        if e.line() > 0 {
            err = err.with_line(e.line());
        }
        err
    })?;
    if upgrade {
        r.schema_version = SCHEMA_VERSION;
        r.conclude();
    }
    r.validate()?;
    Ok(r)
}

/// Each CSV file `--out` writes: `(file name, bytes)`.
pub fn to_csv_files(report: &Report) -> Result<Vec<(String, Vec<u8>)>> {
    Ok(csv_tables(report)?
        .into_iter()
        .map(|(name, _, bytes)| (format!("report-{name}.csv"), bytes))
        .collect())
}

/// One table as a plain CSV (header row, then one row per table row; numbers in shortest
/// round-trip form, non-finite as `inf`/`-inf`/`nan`).
pub(crate) fn table_csv(t: &Table) -> Result<Vec<u8>> {
    let mut w = super::csv_out::Csv::new();
    let err = |e: Error| Error::input(format!("CSV for table `{}`: {}", t.id, e.message));
    w.row(t.columns.iter().map(|c| c.header())).map_err(err)?;
    for row in &t.rows {
        w.row(row.iter().map(csv_cell)).map_err(err)?;
    }
    w.into_bytes().map_err(err)
}

fn csv_tables(report: &Report) -> Result<Vec<(String, String, Vec<u8>)>> {
    let mut out = Vec::new();
    for t in std::iter::once(results_table(report))
        .chain(verdicts_table(report))
        .chain(report.tables.iter().cloned())
    {
        let bytes = table_csv(&t)?;
        out.push((t.id.clone(), t.title.clone(), bytes));
    }
    Ok(out)
}

fn csv_cell(c: &Cell) -> String {
    match c {
        Cell::Int(i) => i.to_string(),
        Cell::Num(x) => num::non_finite_str(*x)
            .map(str::to_string)
            .unwrap_or_else(|| x.to_string()),
        Cell::Text(t) => t.clone(),
        Cell::Empty => String::new(),
    }
}

/// The accountant results as a table (`report-results.csv`).
pub(crate) fn results_table(report: &Report) -> Table {
    use super::Column;
    let detail_keys: std::collections::BTreeSet<&String> =
        report.results.iter().flat_map(|r| r.details.keys()).collect();
    let mut columns = vec![
        Column::new("accountant"),
        Column::new("kind"),
        Column::with_unit("epsilon", "nats"),
        Column::new("delta"),
    ];
    columns.extend(detail_keys.iter().map(|k| Column::new(k)));
    columns.push(Column::new("diagnostics"));
    let rows = report
        .results
        .iter()
        .map(|r| {
            let mut row = vec![
                Cell::from(r.source()),
                Cell::from(r.kind.as_str()),
                Cell::Num(r.epsilon),
                Cell::Num(r.delta),
            ];
            row.extend(detail_keys.iter().map(|k| Cell::from(r.details.get(*k).copied())));
            row.push(Cell::Text(
                r.diagnostics
                    .iter()
                    .map(|d| d.code.as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
            ));
            row
        })
        .collect();
    Table {
        id: "results".into(),
        title: "Accountant results".into(),
        columns,
        rows,
        note: None,
    }
}

fn verdicts_table(report: &Report) -> Option<Table> {
    use super::Column;
    if report.verdicts.is_empty() {
        return None;
    }
    Some(Table {
        id: "verdicts".into(),
        title: "Verdicts".into(),
        columns: vec![
            Column::new("subject"),
            Column::new("status"),
            Column::with_unit("budget", "nats"),
            Column::with_unit("sound_epsilon", "nats"),
            Column::new("delta"),
            Column::new("accountant"),
            Column::new("bound"),
            Column::with_unit("margin", "nats"),
            Column::new("message"),
        ],
        rows: report
            .verdicts
            .iter()
            .map(|v| {
                vec![
                    Cell::from(v.subject.as_str()),
                    Cell::from(v.status.shouted()),
                    Cell::from(v.budget),
                    Cell::from(v.epsilon()),
                    Cell::from(v.delta()),
                    Cell::from(v.accountant().map(|a| a.as_str())),
                    Cell::from(v.bound().map(|b| b.as_str())),
                    Cell::from(v.margin),
                    Cell::from(v.message.as_str()),
                ]
            })
            .collect(),
        note: None,
    })
}

/// The heading of the verdicts' ε column: "sound ε" while every compared number is an exact
/// value or an upper bound; "evidence ε" once one is a lower bound (which is never shown under an
/// upper-bound heading).
fn verdict_epsilon_heading(r: &Report) -> &'static str {
    if r.verdicts.iter().all(|v| v.bound().is_none_or(|b| b.is_sound())) {
        "sound ε"
    } else {
        "evidence ε"
    }
}

/// Where a verdict's ε comes from: the accountant or named source, and its kind.
fn verdict_from(v: &super::Verdict) -> String {
    let who = v
        .accountant()
        .map(|a| a.as_str().to_string())
        .or_else(|| v.source().map(String::from));
    match (who, v.bound()) {
        (Some(w), Some(b)) => format!("{w} ({})", kind_label(b)),
        (Some(w), None) => w,
        (None, Some(b)) => kind_label(b).to_string(),
        (None, None) => "–".into(),
    }
}

pub use super::num::fmt_num;

fn fmt_opt(x: Option<f64>) -> String {
    x.map(fmt_num).unwrap_or_else(|| "–".into())
}

fn cell_text(c: &Cell) -> String {
    match c {
        Cell::Int(i) => i.to_string(),
        Cell::Num(x) => fmt_num(*x),
        Cell::Text(t) => t.clone(),
        Cell::Empty => "".into(),
    }
}

fn kind_label(k: BoundKind) -> &'static str {
    k.with_caveat()
}

/// Markdown-escapes a table cell (input-derived text as in [`md_text`], and `|`).
fn md_cell(s: &str) -> String {
    md_text(s).replace('|', "\\|").replace('\n', " ")
}

/// Makes text that may come from an input file (a title, a claim's id or source, a path)
/// inert in Markdown: a `<` that could open an HTML tag, comment or declaration (`<script>`,
/// `</`, `<!--`, `<?`) becomes `&lt;`, and an `&` that could start an entity becomes `&amp;`.
/// Other text (`ε < 1`, `a & b`) is unchanged, so reports read the same.
pub fn md_text(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        let next = it.peek().copied();
        match c {
            '<' if next.is_some_and(|n| n.is_ascii_alphabetic() || matches!(n, '/' | '!' | '?')) => o.push_str("&lt;"),
            '&' if next.is_some_and(|n| n.is_ascii_alphanumeric() || n == '#') => o.push_str("&amp;"),
            c => o.push(c),
        }
    }
    o
}

/// A Markdown code fence (or code span delimiter) longer than any run of backticks in `s`, so
/// input-derived text cannot close it early (at least `min` backticks).
fn md_fence(s: &str, min: usize) -> String {
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    "`".repeat(min.max(longest + 1))
}

/// `s` as an inline code span that input-derived text cannot break out of.
fn md_code(s: &str) -> String {
    let f = md_fence(s, 1);
    if f.len() == 1 {
        format!("`{s}`")
    } else {
        format!("{f} {s} {f}")
    }
}

/// A short terminal summary of any report: title, conclusion, verdicts, headline results.
pub fn to_text(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{}", r.title);
    let c = conclusion_of(r);
    for (name, text) in [
        ("audited", &c.audited),
        ("guarantee", &c.guarantee),
        ("verdict", &c.verdict),
        ("estimates", &c.estimates),
    ] {
        let _ = writeln!(s, "  {name:<9}  {text}");
    }
    for v in &r.verdicts {
        let _ = writeln!(s, "{} {}: {}", v.status.shouted(), v.subject, v.message);
    }
    for a in &r.results {
        let _ = writeln!(
            s,
            "  {:<4} ε = {} at δ = {} ({})",
            a.source(),
            fmt_num(a.epsilon),
            fmt_num(a.delta),
            kind_label(a.kind)
        );
    }
    for f in &r.summary {
        let _ = writeln!(s, "  {}: {}", f.name, f.value);
    }
    s
}

/// How Markdown shows plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Images {
    /// `![title](plot-<id>.svg)`: the files are written beside the Markdown (`--out DIR`).
    Linked,
    /// `![title](data:image/svg+xml;base64,…)`: the Markdown stands alone (stdout).
    Inline,
}

/// The report as Markdown. Plots are referenced as `plot-<id>.svg`, which [`write_all`]
/// writes beside it; [`export`] inlines them instead.
pub fn to_markdown(r: &Report) -> String {
    // Linked images need no rendering, so this cannot fail.
    markdown(r, Images::Linked).unwrap_or_default()
}

/// Standard base64 (RFC 4648, with padding).
pub fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// The report as Markdown with plots shown as `images`.
pub(crate) fn markdown(r: &Report, images: Images) -> Result<String> {
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", md_text(&r.title));
    let c = conclusion_of(r);
    let _ = writeln!(s, "## Conclusion\n");
    for (name, text) in [
        ("Audited", &c.audited),
        ("Guarantee", &c.guarantee),
        ("Verdict", &c.verdict),
        ("Estimates", &c.estimates),
    ] {
        let _ = writeln!(s, "- **{name}**: {}", md_text(text));
    }
    s.push('\n');
    let _ = writeln!(s, "Generated by {} {} with:\n", r.tool.name, r.tool.version);
    let fence = md_fence(&r.command, 3);
    let _ = writeln!(s, "{fence}text\n{}\n{fence}\n", r.command);
    if let Some(seed) = r.seed {
        let _ = writeln!(s, "Seed: `{seed}`\n");
    }

    if !r.verdicts.is_empty() {
        let _ = writeln!(s, "## Verdicts\n");
        let _ = writeln!(
            s,
            "| status | subject | budget ε | {} | δ | from | margin | message |\n|---|---|---|---|---|---|---|---|",
            verdict_epsilon_heading(r)
        );
        for v in &r.verdicts {
            let from = md_cell(&verdict_from(v));
            let _ = writeln!(
                s,
                "| **{}** | {} | {} | {} | {} | {} | {} | {} |",
                v.status.shouted(),
                md_cell(&v.subject),
                fmt_opt(v.budget),
                fmt_opt(v.epsilon()),
                fmt_opt(v.delta()),
                from,
                fmt_opt(v.margin),
                md_cell(&v.message)
            );
        }
        let _ = writeln!(
            s,
            "\nBudgets are checked against the smallest **sound** ε (exact or upper bound), never an estimate.\n"
        );
    }

    if !r.summary.is_empty() {
        let _ = writeln!(s, "## Summary\n");
        for f in &r.summary {
            let _ = writeln!(s, "- **{}**: {}", md_text(&f.name), md_text(&f.value));
        }
        s.push('\n');
    }

    if !r.results.is_empty() || !r.skipped.is_empty() {
        match r.delta {
            Some(d) => {
                let _ = writeln!(s, "## Accountant results at δ = {}\n", fmt_num(d));
            }
            None => {
                let _ = writeln!(s, "## Accountant results\n");
            }
        }
        if !r.results.is_empty() {
            let _ = writeln!(s, "| accountant | ε | δ | kind | details |\n|---|---|---|---|---|");
            for a in &r.results {
                let details: Vec<String> = a
                    .details
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", fmt_num(*v)))
                    .collect();
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    a.source(),
                    fmt_num(a.epsilon),
                    fmt_num(a.delta),
                    kind_label(a.kind),
                    md_cell(&details.join(", "))
                );
            }
            s.push('\n');
        }
        for k in &r.skipped {
            let _ = writeln!(s, "- `{}` not used: {}", k.accountant.as_str(), md_text(&k.reason));
        }
        if !r.skipped.is_empty() {
            s.push('\n');
        }
    }

    let diags: Vec<_> = r
        .warnings
        .iter()
        .map(|d| (None, d))
        .chain(
            r.results
                .iter()
                .flat_map(|a| a.diagnostics.iter().map(move |d| (Some(a.source()), d))),
        )
        .collect();
    if !diags.is_empty() {
        let _ = writeln!(s, "## Warnings\n");
        for (acc, d) in diags {
            let sev = if d.severe { "**severe** " } else { "" };
            let who = acc.map(|a| format!("{a}: ")).unwrap_or_default();
            let _ = writeln!(s, "- {sev}{who}{}: {}", md_code(&d.code), md_text(&d.message));
        }
        s.push('\n');
    }

    if !r.plots.is_empty() {
        let _ = writeln!(s, "## Plots\n");
        for p in &r.plots {
            match images {
                Images::Linked => {
                    let _ = writeln!(s, "![{}](plot-{}.svg)\n", md_text(&p.title), p.id);
                }
                Images::Inline => {
                    let svg = plot::render_svg(p)?;
                    let _ = writeln!(
                        s,
                        "![{}](data:image/svg+xml;base64,{})\n",
                        md_text(&p.title),
                        base64(svg.as_bytes())
                    );
                }
            }
            if let Some(c) = &p.caption {
                let _ = writeln!(s, "*{}*\n", md_text(c));
            }
        }
    }

    let _ = writeln!(s, "## Assumptions\n");
    for (name, value) in assumption_lines(r) {
        let _ = writeln!(s, "- **{name}**: {}", md_text(&value));
    }
    s.push('\n');

    if let Some(ev) = &r.event {
        let ledger = ev.ledger();
        let fence = md_fence(&ledger, 3);
        let _ = writeln!(s, "## Accounted event\n\n{fence}text\n{ledger}{fence}\n");
    }

    for t in &r.tables {
        let _ = writeln!(s, "## {}\n", md_text(&t.title));
        let headers: Vec<String> = t.columns.iter().map(|c| md_cell(&c.header())).collect();
        let _ = writeln!(s, "| {} |", headers.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(t.columns.len()));
        for row in &t.rows {
            let cells: Vec<String> = row.iter().map(|c| md_cell(&cell_text(c))).collect();
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
        if let Some(n) = &t.note {
            let _ = writeln!(s, "\n{}", md_text(n));
        }
        s.push('\n');
    }

    if !r.inputs.is_empty() {
        let _ = writeln!(s, "## Inputs\n");
        let _ = writeln!(s, "| role | path | bytes | SHA-256 |\n|---|---|---|---|");
        for i in &r.inputs {
            let _ = writeln!(
                s,
                "| {} | {} | {} | `{}` |",
                md_cell(&i.role),
                md_code(&i.path).replace('|', "\\|"),
                i.bytes,
                i.sha256
            );
        }
        s.push('\n');
    }
    while s.ends_with("\n\n") {
        s.pop();
    }
    Ok(s)
}

fn assumption_lines(r: &Report) -> Vec<(String, String)> {
    let a = &r.assumptions;
    let mut v = vec![(
        "Neighbouring relation".to_string(),
        a.neighbouring
            .map(|n| n.to_string())
            .unwrap_or_else(|| "not stated".into()),
    )];
    if let Some(x) = &a.sampling {
        v.push(("Sampling".into(), x.clone()));
    }
    if let Some(x) = &a.step_convention {
        v.push(("Step convention".into(), x.clone()));
    }
    if let Some(d) = r.delta {
        v.push(("δ".into(), fmt_num(d)));
    }
    for f in &a.other {
        v.push((f.name.clone(), f.value.clone()));
    }
    v
}

/// Text for an HTML page: escaped, its Markdown (`code`, **strong**) rendered as tags rather
/// than shown raw, and numbers in scientific notation (`1e-5`) kept on one line.
pub(crate) fn text_html(s: &str) -> String {
    let e = nowrap_numbers(&esc(s));
    let e = pairs(&e, "`", "<code>", "</code>");
    pairs(&e, "**", "<strong>", "</strong>")
}

/// Replaces matched pairs of `mark` by `open`/`close` (an unmatched last mark stays as it is).
fn pairs(s: &str, mark: &str, open: &str, close: &str) -> String {
    let parts: Vec<&str> = s.split(mark).collect();
    if parts.len() < 3 {
        return s.to_string();
    }
    let mut o = String::with_capacity(s.len() + 16);
    let paired = if parts.len() % 2 == 1 {
        parts.len()
    } else {
        parts.len() - 1
    };
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            if i < paired {
                o.push_str(if i % 2 == 1 { open } else { close });
            } else {
                o.push_str(mark);
            }
        }
        o.push_str(p);
    }
    o
}

/// Wraps every number in scientific notation (`1e-5`, `2.5e+7`) in a span that does not break,
/// so a narrow cell never shows `1e-` above `5`.
fn nowrap_numbers(s: &str) -> String {
    let b = s.as_bytes();
    let mut o = String::with_capacity(s.len());
    let mut last = 0;
    let mut i = 0;
    while i < b.len() {
        let starts = b[i].is_ascii_digit() && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.') {
            j += 1;
        }
        let mut k = j;
        if k < b.len() && b[k] == b'e' {
            k += 1;
            if k < b.len() && (b[k] == b'-' || b[k] == b'+') {
                k += 1;
            }
            let d = k;
            while k < b.len() && b[k].is_ascii_digit() {
                k += 1;
            }
            if k > d && (k == b.len() || !b[k].is_ascii_alphanumeric()) {
                o.push_str(&s[last..i]);
                o.push_str("<span class=\"nw\">");
                o.push_str(&s[i..k]);
                o.push_str("</span>");
                last = k;
                i = k;
                continue;
            }
        }
        i = j.max(i + 1);
    }
    o.push_str(&s[last..]);
    o
}

/// HTML-escapes text (also for attribute values).
pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;\
max-width:1240px;margin:2em auto;padding:0 1em;color:#1b1b1b;line-height:1.45}\
h1{font-size:1.7em;margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}\
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left}\
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}\
.wide{overflow-x:auto;max-width:100%}.nw{white-space:nowrap}td.long{min-width:16em;overflow-wrap:anywhere}\
p.shared{font-size:.92em;color:#333}\
.pass{color:#fff;background:#1a7f37;font-weight:bold}.fail{color:#fff;background:#cf222e;font-weight:bold}\
.inconclusive{color:#000;background:#f0c000;font-weight:bold}.estimate{font-style:italic;color:#8a4b00}\
.severe{color:#cf222e;font-weight:bold}pre{background:#f6f8fa;padding:.8em;overflow:auto}\
figure{margin:1em 0}.conclusion{background:#f6f8fa;border-left:4px solid #0969da;padding:.2em 1em}\
.conclusion dt{font-weight:bold;margin-top:.4em}.conclusion dd{margin-left:1em}figcaption{color:#555;font-size:.9em}code{font-size:.9em}.meta{color:#555}";

/// Columns of `t` that hold the same long text (over 40 characters) in every one of two or
/// more rows: the HTML page states such a text once, under the table, instead of repeating it
/// in every row (and widening the table past the page). JSON, CSV and Markdown keep the column.
fn shared_columns(t: &Table) -> Vec<usize> {
    if t.rows.len() < 2 {
        return Vec::new();
    }
    (0..t.columns.len())
        .filter(|&i| {
            let first = match t.rows[0].get(i) {
                Some(Cell::Text(x)) if x.chars().count() > 40 => x,
                _ => return false,
            };
            t.rows
                .iter()
                .all(|r| matches!(r.get(i), Some(Cell::Text(x)) if x == first))
        })
        .collect()
}

/// Columns of `t` (other than the `shared` ones) whose long text (over 40 characters) takes two
/// to six values, each in two or more rows: a table of groups of rows with one text per group
/// (a MIA comparison's checkpoint and sampler rows, each with its basis). The HTML page states
/// each text once under the table, lettered, and the cells give the letter. Returns the column
/// and its texts in order of first appearance.
fn grouped_columns(t: &Table, shared: &[usize]) -> Vec<(usize, Vec<String>)> {
    if t.rows.len() < 4 {
        return Vec::new();
    }
    (0..t.columns.len())
        .filter(|i| !shared.contains(i))
        .filter_map(|i| {
            let mut texts: Vec<(String, usize)> = Vec::new();
            for r in &t.rows {
                let Some(Cell::Text(x)) = r.get(i) else { return None };
                if x.chars().count() <= 40 {
                    return None;
                }
                match texts.iter_mut().find(|(t, _)| t == x) {
                    Some((_, n)) => *n += 1,
                    None => texts.push((x.clone(), 1)),
                }
            }
            ((2..=6).contains(&texts.len()) && texts.iter().all(|(_, n)| *n >= 2))
                .then(|| (i, texts.into_iter().map(|(t, _)| t).collect()))
        })
        .collect()
}

/// The letter of the `k`-th text of a grouped column: `a`, `b`, ….
fn group_letter(k: usize) -> char {
    (b'a' + k as u8) as char
}

/// Makes an SVG from plotters safe to inline: drops the XML prolog and the namespace attribute
/// (an HTML5 parser does not need it, and the page must contain no URLs at all).
fn inline_svg(svg: &str) -> String {
    let s = svg.trim();
    let s = match s.strip_prefix("<?xml") {
        Some(rest) => rest.split_once("?>").map(|(_, r)| r.trim_start()).unwrap_or(rest),
        None => s,
    };
    s.replace(" xmlns=\"http://www.w3.org/2000/svg\"", "")
}

/// The report as one self-contained HTML page: inline CSS, plots inline as SVG, no scripts,
/// no network, no references to other files.
pub fn to_html(r: &Report) -> Result<String> {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{CSS}</style>\n</head>\n<body>",
        esc(&r.title)
    );
    let _ = writeln!(s, "<h1>{}</h1>", esc(&r.title));
    let c = conclusion_of(r);
    let _ = writeln!(s, "<section class=\"conclusion\">\n<h2>Conclusion</h2>\n<dl>");
    for (name, text) in [
        ("Audited", &c.audited),
        ("Guarantee", &c.guarantee),
        ("Verdict", &c.verdict),
        ("Estimates", &c.estimates),
    ] {
        let _ = writeln!(s, "<dt>{name}</dt><dd>{}</dd>", text_html(text));
    }
    let _ = writeln!(s, "</dl>\n</section>");
    let _ = writeln!(
        s,
        "<p class=\"meta\">Generated by {} {} with <code>{}</code>{}</p>",
        esc(&r.tool.name),
        esc(&r.tool.version),
        esc(&r.command),
        r.seed.map(|x| format!(" · seed <code>{x}</code>")).unwrap_or_default()
    );

    if !r.verdicts.is_empty() {
        let _ = writeln!(s, "<h2>Verdicts</h2>\n<div class=\"wide\">\n<table>\n<tr><th>status</th><th>subject</th><th>budget ε</th><th>{}</th><th>δ</th><th>from</th><th>margin</th><th>message</th></tr>", verdict_epsilon_heading(r));
        for v in &r.verdicts {
            let class = v.status.status_word();
            let from = verdict_from(v);
            let _ = writeln!(
                s,
                "<tr><td class=\"{class}\">{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td class=\"num\">{}</td><td>{}</td></tr>",
                v.status.shouted(),
                text_html(&v.subject),
                fmt_opt(v.budget),
                fmt_opt(v.epsilon()),
                fmt_opt(v.delta()),
                text_html(&from),
                fmt_opt(v.margin),
                text_html(&v.message)
            );
        }
        let _ = writeln!(s, "</table>\n</div>\n<p>Budgets are checked against the smallest <strong>sound</strong> ε (exact or upper bound), never an estimate.</p>");
    }

    if !r.summary.is_empty() {
        let _ = writeln!(s, "<h2>Summary</h2>\n<ul>");
        for f in &r.summary {
            let _ = writeln!(s, "<li><strong>{}</strong>: {}</li>", esc(&f.name), text_html(&f.value));
        }
        let _ = writeln!(s, "</ul>");
    }

    if !r.results.is_empty() || !r.skipped.is_empty() {
        let head = match r.delta {
            Some(d) => format!("Accountant results at δ = {}", fmt_num(d)),
            None => "Accountant results".into(),
        };
        let _ = writeln!(s, "<h2>{}</h2>", text_html(&head));
        if !r.results.is_empty() {
            let _ = writeln!(
                s,
                "<table>\n<tr><th>accountant</th><th>ε</th><th>δ</th><th>kind</th><th>details</th></tr>"
            );
            for a in &r.results {
                let details: Vec<String> = a
                    .details
                    .iter()
                    .map(|(k, v)| format!("{k} = {}", fmt_num(*v)))
                    .collect();
                let cls = if a.kind.is_sound() { "" } else { " class=\"estimate\"" };
                let _ = writeln!(
                    s,
                    "<tr{cls}><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td></tr>",
                    a.source(),
                    fmt_num(a.epsilon),
                    fmt_num(a.delta),
                    kind_label(a.kind),
                    text_html(&details.join(", "))
                );
            }
            let _ = writeln!(s, "</table>");
        }
        if !r.skipped.is_empty() {
            let _ = writeln!(s, "<ul>");
            for k in &r.skipped {
                let _ = writeln!(
                    s,
                    "<li><code>{}</code> not used: {}</li>",
                    k.accountant.as_str(),
                    text_html(&k.reason)
                );
            }
            let _ = writeln!(s, "</ul>");
        }
    }

    let diags: Vec<_> = r
        .warnings
        .iter()
        .map(|d| (None, d))
        .chain(
            r.results
                .iter()
                .flat_map(|a| a.diagnostics.iter().map(move |d| (Some(a.source()), d))),
        )
        .collect();
    if !diags.is_empty() {
        let _ = writeln!(s, "<h2>Warnings</h2>\n<ul>");
        for (acc, d) in diags {
            let sev = if d.severe {
                "<span class=\"severe\">severe</span> "
            } else {
                ""
            };
            let who = acc.map(|a| format!("{a}: ")).unwrap_or_default();
            let _ = writeln!(
                s,
                "<li>{sev}{}<code>{}</code>: {}</li>",
                esc(&who),
                esc(&d.code),
                text_html(&d.message)
            );
        }
        let _ = writeln!(s, "</ul>");
    }

    if !r.plots.is_empty() {
        let _ = writeln!(s, "<h2>Plots</h2>");
        for p in &r.plots {
            let svg = plot::render_svg(p)?;
            let _ = writeln!(s, "<figure id=\"plot-{}\">\n{}", esc(&p.id), inline_svg(&svg));
            if let Some(c) = &p.caption {
                let _ = writeln!(s, "<figcaption>{}</figcaption>", text_html(c));
            }
            let _ = writeln!(s, "</figure>");
        }
    }

    let _ = writeln!(s, "<h2>Assumptions</h2>\n<ul>");
    for (name, value) in assumption_lines(r) {
        let _ = writeln!(s, "<li><strong>{}</strong>: {}</li>", esc(&name), text_html(&value));
    }
    let _ = writeln!(s, "</ul>");

    if let Some(ev) = &r.event {
        let _ = writeln!(s, "<h2>Accounted event</h2>\n<pre>{}</pre>", esc(&ev.ledger()));
    }

    for t in &r.tables {
        let _ = writeln!(
            s,
            "<h2>{}</h2>\n<div class=\"wide\">\n<table>\n<tr>",
            text_html(&t.title)
        );
        let shared = shared_columns(t);
        for (i, c) in t.columns.iter().enumerate() {
            if !shared.contains(&i) {
                let _ = write!(s, "<th>{}</th>", esc(&c.header()));
            }
        }
        let _ = writeln!(s, "</tr>");
        let grouped = grouped_columns(t, &shared);
        for row in &t.rows {
            let _ = write!(s, "<tr>");
            for (i, c) in row.iter().enumerate().filter(|(i, _)| !shared.contains(i)) {
                if let Some((_, texts)) = grouped.iter().find(|(g, _)| *g == i) {
                    let k = texts.iter().position(|x| *x == cell_text(c)).unwrap_or(0);
                    let _ = write!(s, "<td>({})</td>", group_letter(k));
                    continue;
                }
                let cls = match c {
                    Cell::Int(_) | Cell::Num(_) => " class=\"num\"",
                    // A long text in a wide table keeps a readable width (the table scrolls).
                    Cell::Text(t) if t.chars().count() > 40 => " class=\"long\"",
                    _ => "",
                };
                let _ = write!(s, "<td{cls}>{}</td>", text_html(&cell_text(c)));
            }
            let _ = writeln!(s, "</tr>");
        }
        let _ = writeln!(s, "</table>\n</div>");
        for &i in &shared {
            let _ = writeln!(
                s,
                "<p class=\"shared\"><strong>{}</strong> (the same for every row): {}</p>",
                esc(&t.columns[i].header()),
                text_html(&cell_text(&t.rows[0][i]))
            );
        }
        for (i, texts) in &grouped {
            for (k, x) in texts.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "<p class=\"shared\"><strong>{} ({})</strong>: {}</p>",
                    esc(&t.columns[*i].header()),
                    group_letter(k),
                    text_html(x)
                );
            }
        }
        if let Some(n) = &t.note {
            let _ = writeln!(s, "<p>{}</p>", text_html(n));
        }
    }

    if !r.inputs.is_empty() {
        let _ = writeln!(
            s,
            "<h2>Inputs</h2>\n<table>\n<tr><th>role</th><th>path</th><th>bytes</th><th>SHA-256</th></tr>"
        );
        for i in &r.inputs {
            let _ = writeln!(
                s,
                "<tr><td>{}</td><td><code>{}</code></td><td class=\"num\">{}</td><td><code>{}</code></td></tr>",
                esc(&i.role),
                esc(&i.path),
                i.bytes,
                esc(&i.sha256)
            );
        }
        let _ = writeln!(s, "</table>");
    }
    let _ = writeln!(s, "</body>\n</html>");
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formatting() {
        assert_eq!(fmt_num(0.0), "0");
        assert_eq!(fmt_num(1e-5), "1e-5");
        assert_eq!(fmt_num(0.8137508), "0.813751");
        assert_eq!(fmt_num(8.0), "8");
        assert_eq!(fmt_num(787.6123456), "787.612");
        assert_eq!(fmt_num(-0.05), "-0.05");
        assert_eq!(fmt_num(1.25e7), "1.25e7");
        assert_eq!(fmt_num(f64::INFINITY), "∞");
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        // RFC 4648 §10 test vectors.
        for (i, o) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(i.as_bytes()), o);
        }
    }

    #[test]
    fn html_text_renders_markdown_and_keeps_numbers_whole() {
        assert_eq!(
            text_html("use `pld` or **rdp** <here>: δ = 1e-5, 2.5e+7 and 3"),
            "use <code>pld</code> or <strong>rdp</strong> &lt;here&gt;: δ = <span class=\"nw\">1e-5</span>, \
<span class=\"nw\">2.5e+7</span> and 3"
        );
        // An unmatched mark stays; identifiers with digits are not numbers.
        assert_eq!(text_html("a `b and c"), "a `b and c");
        assert_eq!(text_html("x1e-5 e5 1e"), "x1e-5 e5 1e");
    }

    #[test]
    fn html_shows_no_raw_markdown() {
        let mut r = Report::new("t", "dpaudit x");
        r.conclusion = Some(super::super::Conclusion {
            audited: "the sampler `a.toml` at δ = 1e-5".into(),
            guarantee: "**none**".into(),
            verdict: "v".into(),
            estimates: "e".into(),
        });
        r.warn("w", "see `--accountant pld`", false);
        let h = to_html(&r).unwrap();
        assert!(!h.contains('`') && !h.contains("**"), "{h}");
        assert!(h.contains("<code>a.toml</code>") && h.contains("<span class=\"nw\">1e-5</span>"));
    }

    #[test]
    fn html_states_a_long_text_shared_by_every_row_once() {
        let basis = "GDP of the ledger's event, no amplification credit, at the ledger's δ".to_string();
        let mut r = Report::new("t", "dpaudit x");
        r.tables.push(Table {
            id: "cmp".into(),
            title: "Comparisons".into(),
            columns: vec![
                super::super::Column::new("what"),
                super::super::Column::new("basis"),
                super::super::Column::new("outcome"),
            ],
            rows: (0..3)
                .map(|i| {
                    vec![
                        Cell::from(format!("row {i}")),
                        Cell::from(basis.as_str()),
                        Cell::from("below the limit"),
                    ]
                })
                .collect(),
            note: None,
        });
        let h = to_html(&r).unwrap();
        assert_eq!(h.matches("no amplification credit").count(), 1, "{h}");
        assert!(h.contains("<strong>basis</strong> (the same for every row)"), "{h}");
        assert!(!h.contains("<th>basis</th>") && h.contains("<th>outcome</th>"), "{h}");
        // One row, or rows that differ: the column stays.
        r.tables[0].rows[1][1] = Cell::from("RDP of the ledger's event at the ledger's δ, with amplification");
        let h = to_html(&r).unwrap();
        assert!(h.contains("<th>basis</th>"), "{h}");
        // Two groups of rows, one text each (checkpoint and sampler rows): each text once,
        // lettered, and the cells give the letter.
        let other = "RDP of the sampler's steps at the ledger's δ, with amplification by subsampling";
        r.tables[0].rows = (0..5)
            .map(|i| {
                let b = if i < 3 { basis.as_str() } else { other };
                vec![
                    Cell::from(format!("row {i}")),
                    Cell::from(b),
                    Cell::from("below the limit"),
                ]
            })
            .collect();
        let h = to_html(&r).unwrap();
        assert_eq!(h.matches("no amplification credit").count(), 1, "{h}");
        assert_eq!(h.matches("amplification by subsampling").count(), 1, "{h}");
        assert!(
            h.contains("<th>basis</th>") && h.matches("<td>(a)</td>").count() == 3,
            "{h}"
        );
        assert!(
            h.contains("<strong>basis (b)</strong>") && h.matches("<td>(b)</td>").count() == 2,
            "{h}"
        );
    }

    #[test]
    fn html_escapes_and_has_no_urls() {
        let mut r = Report::new("<script>alert(1)</script>", "dpaudit x");
        r.plots.push(plot::tradeoff(vec![plot::gdp_tradeoff_series(
            "gdp",
            1.0,
            BoundKind::Exact,
        )]));
        let h = to_html(&r).unwrap();
        assert!(!h.contains("<script>"));
        assert!(!h.contains("http://") && !h.contains("https://"), "URL in HTML");
        assert!(h.contains("<svg"));
    }
}
