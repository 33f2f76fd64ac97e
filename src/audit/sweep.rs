//! Sweeps (`sweep`): a sampler configuration over a grid of settings, as the shared [`Report`]
//! (one table row per grid point, ε against the swept axis with bounds solid, estimates dashed
//! and the budget line) and a terminal table.

use std::path::Path;

use crate::accountants::{AccountantKind, BoundKind};
use crate::diffusion::sweep::{self, SweepRow, SweepSpec};
use crate::diffusion::SamplerConfig;
use crate::error::Result;
use crate::report::plot::{self, LineStyle, Series};
use crate::report::progress::Progress;
use crate::report::{self, num, Cell, Column, Conclusion, Report, Table};

/// The points of one axis from a range `a..b` (`n` points, log-spaced with `log`): how a plan's
/// axis is built from `--sigma-min A..B --points N [--log]`.
pub use crate::diffusion::sweep::grid;

/// A validated `sweep` request.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sampler configuration (TOML).
    pub config: std::path::PathBuf,
    /// The grid and the accountants.
    pub spec: SweepSpec,
    /// An ε budget, drawn on the plot and counted in the conclusion.
    pub budget: Option<f64>,
}

/// `sweep`: loads the configuration (its defaulted settings noted on stderr), runs the grid and
/// returns the report, the terminal table, `sweep.csv` (the main table) and `sweep.json`.
pub fn execute(plan: &Plan, progress: &Progress) -> Result<super::Outcome> {
    let cfg = SamplerConfig::load(&plan.config)?;
    cfg.warn_defaults(&plan.config);
    let (rows, rep) = sweep(&cfg, &plan.config, &plan.spec, plan.budget, progress)?;
    let accountants = &plan.spec.accountants;
    let csv = sweep::to_csv(&rows, accountants)?;
    let detail = serde_json::to_vec_pretty(&rows).map_err(|e| crate::Error::input(e.to_string()))?;
    Ok(super::Outcome::new(rep, render_text(&rows, accountants))
        .with_table("sweep.csv", csv.into_bytes())
        .with_file("sweep.json", detail))
}

/// Runs the sweep (in parallel, deterministic row order) and builds its report.
pub fn sweep(
    cfg: &SamplerConfig,
    config_path: &Path,
    spec: &SweepSpec,
    budget: Option<f64>,
    progress: &Progress,
) -> Result<(Vec<SweepRow>, Report)> {
    let n = sweep::grid_configs(cfg, spec)
        .map_err(|e| e.with_file(config_path))?
        .len();
    progress.set_length(n as u64);
    let tick = || progress.inc(1);
    let rows = sweep::run(cfg, spec, &tick).map_err(|e| e.with_file(config_path))?;
    let (rows, repeated) = distinct_stops(rows);
    let csv = sweep::to_csv(&rows, &spec.accountants)?;
    let axes = grid_axes(spec, &rows);
    let mut rep = to_report(
        &rows,
        &spec.accountants,
        &axes,
        cfg,
        config_path,
        budget,
        csv.as_bytes(),
    )?;
    if let Some(note) = unselected_rdp_note(cfg, spec, &rows, &axes, budget)? {
        if let Some(c) = rep.conclusion.as_mut() {
            c.verdict.push(' ');
            c.verdict.push_str(&note);
        }
    }
    if !repeated.is_empty() {
        let shown: Vec<String> = repeated.iter().map(|&v| num::fmt_num(v)).collect();
        rep.warn(
            "repeated_stop_level",
            format!(
                "the schedule's noise levels are fixed, so σ_min sets where sampling stops (at the first level ≤ σ_min): \
                 σ_min = {} stop at a level that an earlier grid value already reaches; those points are shown once, \
                 with t_min the level reached",
                shown.join(", ")
            ),
            false,
        );
    }
    Ok((rows, rep))
}

/// On a schedule whose levels are fixed (DDPM), `--sigma-min` sets where sampling stops
/// (`stop_at`, the first level ≤ σ_min), and every σ_min between two levels stops at the same
/// one: such points are one configuration, evaluated twice. Keeps the first row of each (rows
/// equal in every setting but `stop_at`, the level reached included) and returns the `stop_at`
/// of the rows left out.
fn distinct_stops(rows: Vec<SweepRow>) -> (Vec<SweepRow>, Vec<f64>) {
    let mut seen = std::collections::HashSet::new();
    let mut kept = Vec::with_capacity(rows.len());
    let mut repeated: Vec<f64> = Vec::new();
    for r in rows {
        let key = (
            r.stop_at.is_some(),
            [
                r.t_min,
                r.switch_at,
                r.clip_norm,
                r.delta,
                r.subsample_rate,
                r.full_batch_mu,
            ]
            .map(f64::to_bits),
            [r.levels, r.private_steps],
            [r.stop_step, r.switch_step],
            [r.dataset_size, r.samples],
            r.sigma_min.map(f64::to_bits),
        );
        if r.stop_at.is_none() || seen.insert(key) {
            kept.push(r);
        } else if let Some(s) = r.stop_at {
            if !repeated.contains(&s) {
                repeated.push(s);
            }
        }
    }
    (kept, repeated)
}

/// Columns whose values come from what the user typed (printed without arithmetic noise).
const GIVEN: [&str; 9] = [
    "sigma_min",
    "t_min",
    "stop_at",
    "switch_at",
    "clip_norm",
    "delta",
    "subsample_rate",
    "samples",
    "dataset_size",
];

/// The sweep's CSV (one row per grid point) as a report table: numbers as numbers, empty
/// cells empty, given values without arithmetic noise.
fn table_from_csv(csv: &[u8]) -> Result<(Vec<Column>, Vec<Vec<Cell>>)> {
    let mut rdr = csv::Reader::from_reader(csv);
    let err = |e: csv::Error| crate::Error::input(format!("sweep CSV: {e}"));
    let headers: Vec<String> = rdr.headers().map_err(err)?.iter().map(str::to_string).collect();
    let mut rows = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(err)?;
        rows.push(
            rec.iter()
                .zip(&headers)
                .map(|(v, h)| {
                    if v.is_empty() {
                        Cell::Empty
                    } else if let Ok(i) = v.parse::<i64>() {
                        Cell::Int(i)
                    } else if let Ok(x) = v.parse::<f64>() {
                        Cell::Num(if GIVEN.contains(&h.as_str()) { num::clean(x) } else { x })
                    } else {
                        Cell::Text(v.to_string())
                    }
                })
                .collect(),
        );
    }
    Ok((headers.iter().map(|h| Column::new(h)).collect(), rows))
}

/// The axes a sweep can vary, in the order of the grid (σ_min outermost): CSV column, axis label,
/// short name (legends and conclusions).
const AXES: [(&str, &str, &str); 11] = [
    ("sigma_min", "σ_min", "σ_min"),
    ("t_min", "smallest noise level reached t_min", "t_min"),
    ("levels", "noise levels N", "N"),
    ("stop_step", "stop step", "stop step"),
    ("switch_step", "first private step", "switch step"),
    ("switch_at", "switch point (fraction of steps)", "switch point"),
    ("clip_norm", "clipping norm C", "C"),
    ("dataset_size", "dataset size |D|", "|D|"),
    ("delta", "δ", "δ"),
    ("subsample_rate", "subsampling rate p", "p"),
    ("samples", "generated samples S", "S"),
];

fn axis_info(id: &str) -> (&'static str, &'static str) {
    AXES.iter()
        .find(|a| a.0 == id)
        .map(|a| (a.1, a.2))
        .unwrap_or(("grid value", "value"))
}

fn axis_value(r: &SweepRow, axis: &str) -> f64 {
    match axis {
        "sigma_min" => r.sigma_min.unwrap_or(f64::NAN),
        "subsample_rate" => r.subsample_rate,
        "switch_at" => r.switch_at,
        "samples" => r.samples as f64,
        "t_min" => r.t_min,
        "stop_step" => r.stop_step.map_or(f64::NAN, |k| k as f64),
        "switch_step" => r.switch_step.map_or(f64::NAN, |k| k as f64),
        "clip_norm" => r.clip_norm,
        "dataset_size" => r.dataset_size as f64,
        "delta" => r.delta,
        _ => r.levels as f64,
    }
}

fn distinct_values(rows: &[SweepRow], axis: &str) -> usize {
    let mut v: Vec<u64> = rows.iter().map(|r| axis_value(r, axis).to_bits()).collect();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// The axes the user swept (given more than one value), in grid order: the first is the plot's
/// x axis (σ_min when given: the axis of `--points`), the others tell the lines apart. σ_min is
/// the `sigma_min` column on an EDM schedule and `t_min` (the level reached) on the others.
pub(crate) fn grid_axes(spec: &SweepSpec, rows: &[SweepRow]) -> Vec<&'static str> {
    let sigma = if rows.first().is_some_and(|r| r.sigma_min.is_some()) {
        "sigma_min"
    } else {
        "t_min"
    };
    [
        (sigma, spec.sigma_min.len()),
        ("levels", spec.levels.len()),
        ("stop_step", spec.stop_step.len()),
        ("switch_step", spec.switch_step.len()),
        ("switch_at", spec.switch_at.len()),
        ("clip_norm", spec.clip_norm.len()),
        ("dataset_size", spec.dataset_size.len()),
        ("delta", spec.delta.len()),
        ("subsample_rate", spec.subsample_rate.len()),
        ("samples", spec.samples.len()),
    ]
    .into_iter()
    .filter(|&(id, n)| n > 1 && distinct_values(rows, id) > 1)
    .map(|(id, _)| id)
    .collect()
}

/// The grid's points grouped by the values of every axis but the first (first-seen order):
/// each group's label (`p = 0.1, S = 4`, empty with one axis) and rows.
fn groups<'a>(rows: &'a [SweepRow], axes: &[&str]) -> Vec<(String, Vec<&'a SweepRow>)> {
    let others = axes.get(1..).unwrap_or(&[]);
    let mut groups: Vec<(String, Vec<&SweepRow>)> = Vec::new();
    let mut index: std::collections::HashMap<Vec<u64>, usize> = std::collections::HashMap::new();
    for row in rows {
        let bits: Vec<u64> = others.iter().map(|id| axis_value(row, id).to_bits()).collect();
        match index.get(&bits) {
            Some(&i) => groups[i].1.push(row),
            None => {
                let key = others
                    .iter()
                    .map(|id| {
                        format!(
                            "{} = {}",
                            axis_info(id).1,
                            num::fmt_num(num::clean(axis_value(row, id)))
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                index.insert(bits, groups.len());
                groups.push((key, vec![row]));
            }
        }
    }
    groups
}

/// Where RDP was not among the accountants run: RDP at every grid point (cheap), and a sentence
/// naming it where its sound bound is smaller than the best one run at some point (and, with a
/// budget, the region it alone would give when that differs), so that a sweep's answer never
/// silently rests on a looser bound than a sound accountant gives (issue 47, item 3). `None` where
/// RDP was run or changes nothing.
fn unselected_rdp_note(
    cfg: &SamplerConfig,
    spec: &SweepSpec,
    rows: &[SweepRow],
    axes: &[&str],
    budget: Option<f64>,
) -> Result<Option<String>> {
    if spec.accountants.contains(&AccountantKind::Rdp) || rows.is_empty() {
        return Ok(None);
    }
    let rdp_spec = SweepSpec {
        accountants: vec![AccountantKind::Rdp],
        ..spec.clone()
    };
    let (rdp_rows, _) = distinct_stops(sweep::run(cfg, &rdp_spec, &|| {})?);
    let same_point = |a: &SweepRow, b: &SweepRow| {
        a.t_min.to_bits() == b.t_min.to_bits()
            && a.subsample_rate.to_bits() == b.subsample_rate.to_bits()
            && a.samples == b.samples
            && a.clip_norm.to_bits() == b.clip_norm.to_bits()
            && a.private_steps == b.private_steps
    };
    if rdp_rows.len() != rows.len() || rows.iter().zip(&rdp_rows).any(|(a, b)| !same_point(a, b)) {
        return Ok(None);
    }
    let smaller = rows
        .iter()
        .zip(&rdp_rows)
        .filter(|(r, q)| match (best_sound(q), best_sound(r)) {
            (Some(x), Some(y)) => x.2 < y.2,
            (Some(_), None) => true,
            _ => false,
        })
        .count();
    if smaller == 0 {
        return Ok(None);
    }
    let run: Vec<&str> = spec.accountants.iter().map(|a| a.as_str()).collect();
    let mut note = format!(
        "The rdp accountant, not among those run ({}), gives a smaller sound ε at {smaller} of {} grid points",
        run.join(", "),
        rows.len()
    );
    if let Some(b) = budget {
        let mine = budget_region(rows, axes, b);
        let theirs = budget_region(&rdp_rows, axes, b);
        // The region without the count of grid points that follows it.
        let region = |v: &str| {
            let head = &v[..v.find(" grid points").unwrap_or(v.len())];
            head[..head.rfind(" (").unwrap_or(head.len())].to_string()
        };
        if region(&mine) != region(&theirs) {
            let t = region(&theirs);
            let t = t.strip_prefix("On the grid, ").unwrap_or(&t);
            note.push_str(&format!(", and by rdp alone {t}"));
        }
    }
    note.push_str(&format!(" (add it: --accountant {},rdp).", run.join(",")));
    Ok(Some(note))
}

/// The sound line of `row` with the smallest ε (an exact value or upper bound), if any.
fn best_sound(row: &SweepRow) -> Option<(AccountantKind, BoundKind, f64)> {
    crate::accountants::sound::tightest_by(row.accountants.iter(), |l| Some((l.epsilon()?, l.kind()?)))
        .and_then(|l| Some((l.accountant, l.kind()?, l.epsilon()?)))
}

/// Which x values of one line meet the budget, as words: `σ_min ≥ 0.0811`, `p ≤ 0.1`, every /
/// no value of the grid, or the values themselves. `pts` sorted by x, one per x.
fn region(short: &str, pts: &[(f64, bool)]) -> String {
    let n = pts.len();
    let k = pts.iter().filter(|p| p.1).count();
    let f = |x: f64| num::fmt_num(num::clean(x));
    let (lo, hi) = (pts[0].0, pts[n - 1].0);
    let first = pts.iter().position(|p| p.1);
    let last = pts.iter().rposition(|p| p.1);
    match (first, last) {
        _ if k == n && n == 1 => format!("{short} = {}", f(lo)),
        _ if k == n => format!("every {short} of the grid ({} to {})", f(lo), f(hi)),
        (None, _) | (_, None) => format!("no {short} of the grid ({} to {})", f(lo), f(hi)),
        (Some(a), Some(b)) if b == n - 1 && b + 1 - a == k => format!("{short} ≥ {}", f(pts[a].0)),
        (Some(a), Some(b)) if a == 0 && b + 1 == k => format!("{short} ≤ {}", f(pts[b].0)),
        _ => {
            let vals: Vec<String> = pts.iter().filter(|p| p.1).map(|p| f(p.0)).collect();
            format!("{short} = {}", vals.join(", "))
        }
    }
}

/// The conclusion's verdict on a budget: the region of the grid that meets it, per value of
/// the other axes when it differs, and which accountants' sound bounds show it. True of the
/// report's own table (its rows, numbers formatted as there).
fn budget_region(rows: &[SweepRow], axes: &[&str], b: f64) -> String {
    let Some(&x) = axes.first() else {
        let meets = rows.iter().filter(|r| best_sound(r).is_some_and(|s| s.2 <= b)).count();
        return format!(
            "{meets} of {} grid points have a sound bound within the budget ε ≤ {}.",
            rows.len(),
            num::fmt_num(b)
        );
    };
    let short = axis_info(x).1;
    let mut support: std::collections::BTreeMap<&'static str, std::collections::BTreeSet<&'static str>> =
        Default::default();
    let mut lines: Vec<(String, String)> = Vec::new();
    let mut met = 0usize;
    for (key, group) in groups(rows, axes) {
        // One point per x (all rows at an x must meet the budget).
        let mut pts: Vec<(f64, bool)> = Vec::new();
        let mut sorted: Vec<&SweepRow> = group.clone();
        sorted.sort_by(|a, c| axis_value(a, x).total_cmp(&axis_value(c, x)));
        for r in sorted {
            let v = axis_value(r, x);
            let ok = match best_sound(r) {
                Some((a, k, e)) if e <= b => {
                    support.entry(a.as_str()).or_default().insert(match k {
                        BoundKind::Exact => "exact value",
                        _ => "upper bound",
                    });
                    true
                }
                _ => false,
            };
            met += usize::from(ok);
            match pts.last_mut() {
                Some(last) if last.0.to_bits() == v.to_bits() => last.1 &= ok,
                _ => pts.push((v, ok)),
            }
        }
        lines.push((key, region(short, &pts)));
    }
    let budget = format!("ε ≤ {}", num::fmt_num(b));
    let others: Vec<&str> = axes[1..].iter().map(|id| axis_info(id).1).collect();
    let mut text = if lines.iter().all(|l| l.1 == lines[0].1) {
        let every = match (others.is_empty(), lines[0].1.starts_with("no ")) {
            (true, _) => String::new(),
            (false, false) => format!(" for every {}", others.join(" and ")),
            (false, true) => format!(" at any {}", others.join(" or ")),
        };
        format!("On the grid, {} meets {budget}{every}", lines[0].1)
    } else {
        // Lines with the same region together, in first-seen order.
        let mut merged: Vec<(Vec<String>, String)> = Vec::new();
        for (key, reg) in lines {
            match merged.iter_mut().find(|m| m.1 == reg) {
                Some(m) => m.0.push(key),
                None => merged.push((vec![key], reg)),
            }
        }
        let parts: Vec<String> = merged
            .into_iter()
            .map(|(keys, reg)| format!("at {}: {reg}", keys.join(" and ")))
            .collect();
        format!("On the grid, the settings that meet {budget}: {}", parts.join("; "))
    };
    if support.is_empty() {
        text.push_str(&format!(
            " (0 of {} grid points have a sound bound within it; estimates do not count).",
            rows.len()
        ));
    } else {
        text.push_str(&format!(" ({met} of {} grid points)", rows.len()));
        let by: Vec<String> = support
            .iter()
            .map(|(a, kinds)| format!("{a} ({})", kinds.iter().copied().collect::<Vec<_>>().join(" and ")))
            .collect();
        text.push_str(&format!(", shown by the sound bounds of {}.", by.join(", ")));
    }
    text
}

/// Builds the report of a sweep.
pub(crate) fn to_report(
    rows: &[SweepRow],
    accountants: &[AccountantKind],
    axes: &[&str],
    cfg: &SamplerConfig,
    config_path: &Path,
    budget: Option<f64>,
    csv: &[u8],
) -> Result<Report> {
    let mut r = Report::new(format!("Sweep: {}", config_path.display()), report::command_line()).for_command("sweep");
    r.add_input("sampler config", config_path)?;
    r.delta = Some(cfg.delta);
    r.assumptions.neighbouring = Some(cfg.neighbouring);
    if let Some(c) = rows.first() {
        r.assumptions.step_convention = Some(c.convention.clone());
    }
    // The config's own warnings, as `analyze` and `check` show them for the same file.
    for w in super::sampler_warnings(cfg) {
        r.warn(&w.code, w.message, w.severe);
    }
    let (columns, table_rows) = table_from_csv(csv)?;
    r.tables.push(Table {
        id: "sweep".into(),
        title: "ε at every grid point".into(),
        columns,
        rows: table_rows,
        note: Some(
            "gdp is exact at p = 1 and a full-batch upper bound at p < 1; clt is an estimate, never a guarantee; \
pld and rdp are upper bounds."
                .into(),
        ),
    });
    if !axes.is_empty() {
        r.plots.push(epsilon_plot(rows, accountants, axes, cfg.delta, budget));
    }
    if let Some(b) = budget {
        r.fact("budget ε", num::fmt(b));
    }
    r.fact("grid points", rows.len().to_string());
    let sound: Vec<f64> = rows
        .iter()
        .flat_map(|row| row.accountants.iter())
        .filter(|l| l.kind().is_some_and(|k| k.is_sound()) && l.status == crate::diffusion::account::LineStatus::Ok)
        .filter_map(|l| l.epsilon())
        .collect();
    let estimates = rows
        .iter()
        .flat_map(|row| row.accountants.iter())
        .any(|l| l.kind() == Some(BoundKind::Estimate));
    let range = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (lo, hi)
    };
    r.conclusion = Some(Conclusion {
        audited: format!(
            "How ε of the diffusion sampler `{}` changes over {} grid settings{}.",
            config_path.display(),
            rows.len(),
            if axes.is_empty() {
                String::new()
            } else {
                format!(
                    " of {}",
                    axes.iter().map(|id| axis_info(id).1).collect::<Vec<_>>().join(" × ")
                )
            }
        ),
        guarantee: if sound.is_empty() {
            "No sound bound was computed at any grid point (add --accountant pld or rdp).".into()
        } else {
            let (lo, hi) = range(&sound);
            format!(
                "Sound ε (exact values and upper bounds) at δ = {} ranges from {} to {} across the grid, under: {}. At the largest, {}",
                num::fmt(cfg.delta),
                report::export::fmt_num(lo),
                report::export::fmt_num(hi),
                report::conclusion::under(&r),
                report::conclusion::scale(hi, cfg.delta).replacen("What it allows", "what it allows", 1)
            )
        },
        verdict: match budget {
            Some(b) => budget_region(rows, axes, b),
            None => "No budget was given (--max-epsilon), so there is no verdict.".into(),
        },
        estimates: if estimates {
            "The clt numbers (dashed in the plot) are estimates, not guarantees.".into()
        } else {
            "No estimates: every number is an exact value or an upper bound.".into()
        },
    });
    Ok(r)
}

/// ε against the first swept axis (sorted by it): one series per accountant and value of the
/// other axes; an accountant's lines share its colour in shades, a value of the other axes its
/// marker shape; bounds solid, estimates dashed; the budget as a dotted horizontal line. Lines
/// that coincide are named in the caption.
fn epsilon_plot(
    rows: &[SweepRow],
    accountants: &[AccountantKind],
    axes: &[&str],
    delta: f64,
    budget: Option<f64>,
) -> plot::Plot {
    let axis = axes[0];
    let groups = groups(rows, axes);
    let n_groups = groups.len();
    let mut series = Vec::new();
    for (gi, (key, group)) in groups.iter().enumerate() {
        for (ai, a) in accountants.iter().enumerate() {
            let mut pts = Vec::new();
            let mut kind = None;
            for row in group {
                let Some(l) = row.accountants.iter().find(|l| l.accountant == *a) else {
                    continue;
                };
                if let (Some(e), Some(k)) = (l.epsilon(), l.kind()) {
                    if e.is_finite() {
                        pts.push((num::clean(axis_value(row, axis)), e));
                        kind = Some(k);
                    }
                }
            }
            let Some(kind) = kind else { continue };
            pts.sort_by(|p, q| p.0.total_cmp(&q.0));
            let (xs, ys) = pts.into_iter().unzip();
            let mut s = Series::for_accountant(*a, kind, xs, ys)
                .with_marker(plot::Marker::ALL[gi % plot::Marker::ALL.len()])
                .with_colour(shade(plot::palette(ai), gi));
            if !key.is_empty() {
                s.name = format!("{}, {key}", s.name);
            }
            series.push(s);
        }
    }
    let coinciding = coinciding(&series);
    if let Some(b) = budget {
        let xs: Vec<f64> = rows
            .iter()
            .map(|r| axis_value(r, axis))
            .filter(|x| x.is_finite())
            .collect();
        let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        series.push(
            Series::new(format!("budget ε = {}", num::fmt(b)), vec![lo, hi], vec![b, b]).with_style(LineStyle::Dotted),
        );
    }
    let (label, _) = axis_info(axis);
    let mut p = plot::epsilon_vs_axis(&format!("epsilon_vs_{axis}"), label, "", delta, series);
    // A grid over a decade or more of positive values (a `--log` grid, the levels a DDPM
    // schedule reaches) reads best on a log axis.
    let xv: Vec<f64> = rows
        .iter()
        .map(|r| axis_value(r, axis))
        .filter(|x| x.is_finite())
        .collect();
    let (lo, hi) = xv
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), &x| (l.min(x), h.max(x)));
    if lo > 0.0 && hi / lo >= 10.0 && distinct_values(rows, axis) >= 3 {
        p.x.scale = plot::Scale::Log;
    }
    if n_groups > 1 {
        let others: Vec<&str> = axes[1..].iter().map(|id| axis_info(id).1).collect();
        let c = p.caption.take().unwrap_or_default();
        p.caption = Some(format!(
            "{c} One line per accountant and value of {}: an accountant's lines share its colour (in shades), \
             a value of {} its marker.{coinciding}",
            others.join(" and "),
            others.join(" and ")
        ));
    } else if !coinciding.is_empty() {
        p.caption = Some(format!("{}{coinciding}", p.caption.take().unwrap_or_default()));
    }
    p
}

/// `rgb` for group `i`: the first as it is, the next lightened or darkened in turn (distinct for
/// up to six groups; beyond that the marker shapes, which also repeat, and the legend tell).
fn shade((r, g, b): (u8, u8, u8), i: usize) -> (u8, u8, u8) {
    const SHADES: [f64; 6] = [0.0, 0.5, -0.45, 0.75, -0.25, 0.25];
    let t = SHADES[i % SHADES.len()];
    let f = |c: u8| {
        let c = f64::from(c);
        (if t < 0.0 { c * (1.0 + t) } else { c + (255.0 - c) * t }).round() as u8
    };
    (f(r), f(g), f(b))
}

/// A caption sentence naming the lines drawn over one another (same points to 1e-9), or "".
fn coinciding(series: &[Series]) -> String {
    let same = |a: &Series, b: &Series| {
        a.x.len() == b.x.len()
            && a.x.iter().zip(&b.x).all(|(p, q)| p == q)
            && a.y
                .iter()
                .zip(&b.y)
                .all(|(p, q)| (p - q).abs() <= 1e-9 * p.abs().max(q.abs()))
    };
    let mut cluster: Vec<Option<usize>> = vec![None; series.len()];
    for i in 0..series.len() {
        if cluster[i].is_some() {
            continue;
        }
        for j in i + 1..series.len() {
            if cluster[j].is_none() && same(&series[i], &series[j]) {
                cluster[j] = Some(i);
                cluster[i] = Some(i);
            }
        }
    }
    let mut parts = Vec::new();
    for i in 0..series.len() {
        if cluster[i] == Some(i) {
            let names: Vec<String> = (0..series.len())
                .filter(|&j| cluster[j] == Some(i))
                .map(|j| format!("‘{}’", series[j].name))
                .collect();
            let (last, rest) = names.split_last().expect("a cluster has two lines");
            parts.push(format!("{} and {last}", rest.join(", ")));
        }
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(
            " Lines with the same values are drawn over one another, their markers one inside the other: {}.",
            parts.join("; ")
        )
    }
}

/// The terminal table: one row per grid point, one ε column per accountant.
fn render_text(rows: &[SweepRow], accountants: &[AccountantKind]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if let Some(r) = rows.first() {
        let _ = writeln!(s, "step convention {}", r.convention);
    }
    let _ = write!(
        s,
        "{:>12} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>13}",
        "t_min", "N", "stop", "switch", "C", "|D|", "δ", "p", "S", "private", "full μ"
    );
    for a in accountants {
        let _ = write!(s, " {:>14}", format!("{} ε", a.as_str()));
    }
    s.push('\n');
    for r in rows {
        let switch = match r.switch_step {
            Some(k) => format!("#{k}"),
            None => format!("{}", r.switch_at),
        };
        let stop = match (r.stop_step, r.stop_at) {
            (Some(k), _) => format!("#{k}"),
            (None, Some(t)) => format!("≤{t}"),
            (None, None) => "-".into(),
        };
        let _ = write!(
            s,
            "{:>12} {:>6} {:>6} {:>9} {:>8} {:>8} {:>8} {:>10} {:>8} {:>8} {:>13.6e}",
            format!("{:.6}", r.sigma_min.unwrap_or(r.t_min)),
            r.levels,
            stop,
            switch,
            r.clip_norm,
            r.dataset_size,
            r.delta,
            r.subsample_rate,
            r.samples,
            r.private_steps,
            r.full_batch_mu
        );
        for a in accountants {
            let l = r.accountants.iter().find(|l| l.accountant == *a);
            let cell = match l {
                Some(l) => match l.epsilon() {
                    Some(e) if l.status == crate::diffusion::account::LineStatus::Ok => format!("{e:.6}"),
                    Some(e) => format!("{e:.6}!"),
                    None => "n/a".into(),
                },
                None => "-".into(),
            };
            let _ = write!(s, " {cell:>14}");
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "kinds: gdp exact at p = 1, upper bound (no amplification) at p < 1; clt estimate (\"!\" = CLT conditions fail: not a guarantee); pld/rdp upper bounds; n/a = unavailable (see --format csv for reasons)"
    );
    s
}
