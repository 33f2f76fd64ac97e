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
    let csv = sweep::to_csv(&rows, &spec.accountants)?;
    let rep = to_report(&rows, &spec.accountants, cfg, config_path, budget, csv.as_bytes())?;
    Ok((rows, rep))
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

/// The axes a sweep can vary, in the order they are tried as the plot's x axis.
const AXES: [(&str, &str); 9] = [
    ("sigma_min", "σ_min"),
    ("t_min", "t_min"),
    ("subsample_rate", "subsampling rate p"),
    ("switch_at", "switch point (fraction of steps)"),
    ("samples", "generated samples S"),
    ("levels", "noise levels N"),
    ("clip_norm", "clipping norm C"),
    ("dataset_size", "dataset size |D|"),
    ("delta", "δ"),
];

fn axis_value(r: &SweepRow, axis: &str) -> f64 {
    match axis {
        "sigma_min" => r.sigma_min.unwrap_or(f64::NAN),
        "subsample_rate" => r.subsample_rate,
        "switch_at" => r.switch_at,
        "samples" => r.samples as f64,
        "t_min" => r.t_min,
        "clip_norm" => r.clip_norm,
        "dataset_size" => r.dataset_size as f64,
        "delta" => r.delta,
        _ => r.levels as f64,
    }
}

/// The swept axis: the first one with more than one value.
pub fn swept_axis(rows: &[SweepRow]) -> Option<(&'static str, &'static str)> {
    AXES.into_iter().find(|(id, _)| {
        let mut v: Vec<u64> = rows.iter().map(|r| axis_value(r, id).to_bits()).collect();
        v.sort_unstable();
        v.dedup();
        v.len() > 1
    })
}

/// Builds the report of a sweep.
pub fn to_report(
    rows: &[SweepRow],
    accountants: &[AccountantKind],
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
    if let Some((axis, label)) = swept_axis(rows) {
        r.plots
            .push(epsilon_plot(rows, accountants, axis, label, cfg.delta, budget));
    }
    if let Some(b) = budget {
        r.fact("budget ε", num::fmt(b));
    }
    r.fact("grid points", rows.len().to_string());
    let sound: Vec<f64> = rows
        .iter()
        .flat_map(|row| row.accountants.iter())
        .filter(|l| l.kind.is_some_and(|k| k.is_sound()) && l.status == "ok")
        .filter_map(|l| l.epsilon)
        .collect();
    let estimates = rows
        .iter()
        .flat_map(|row| row.accountants.iter())
        .any(|l| l.kind == Some(BoundKind::Estimate));
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
            swept_axis(rows).map(|(_, l)| format!(" of {l}")).unwrap_or_default()
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
            Some(b) => {
                let over = rows
                    .iter()
                    .filter(|row| {
                        row.accountants
                            .iter()
                            .filter(|l| l.kind.is_some_and(|k| k.is_sound()))
                            .filter_map(|l| l.epsilon)
                            .fold(f64::INFINITY, f64::min)
                            > b
                    })
                    .count();
                format!(
                    "{over} of {} grid points have no sound bound within the budget ε = {}.",
                    rows.len(),
                    num::fmt(b)
                )
            }
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

/// ε against the swept axis: one series per accountant and setting of the other axes; bounds
/// solid, estimates dashed; the budget as a dotted horizontal line.
fn epsilon_plot(
    rows: &[SweepRow],
    accountants: &[AccountantKind],
    axis: &str,
    label: &str,
    delta: f64,
    budget: Option<f64>,
) -> plot::Plot {
    // The axes that tell series apart: every other axis with more than one value, except an axis
    // that follows the swept one (t_min = σ_min when only σ_min is swept), which would leave one
    // point per line. Decided once for the whole sweep (O(rows log rows)).
    let distinct = |f: &dyn Fn(&SweepRow) -> (u64, u64)| {
        let mut v: Vec<(u64, u64)> = rows.iter().map(f).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    let swept_values = distinct(&|x| (axis_value(x, axis).to_bits(), 0));
    let series_axes: Vec<&str> = AXES
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != axis)
        .filter(|id| distinct(&|x| (axis_value(x, id).to_bits(), 0)) > 1)
        .filter(|id| distinct(&|x| (axis_value(x, axis).to_bits(), axis_value(x, id).to_bits())) != swept_values)
        .collect();
    // Group rows by those axes' values (in first-seen order).
    let mut groups: Vec<(String, Vec<&SweepRow>)> = Vec::new();
    let mut index: std::collections::HashMap<Vec<u64>, usize> = std::collections::HashMap::new();
    for row in rows {
        let bits: Vec<u64> = series_axes.iter().map(|id| axis_value(row, id).to_bits()).collect();
        match index.get(&bits) {
            Some(&i) => groups[i].1.push(row),
            None => {
                let key = series_axes
                    .iter()
                    .map(|id| format!("{id} = {}", num::fmt_clean(axis_value(row, id))))
                    .collect::<Vec<_>>()
                    .join(", ");
                index.insert(bits, groups.len());
                groups.push((key, vec![row]));
            }
        }
    }
    let mut series = Vec::new();
    for (key, group) in &groups {
        for a in accountants {
            let mut xs = Vec::new();
            let mut ys = Vec::new();
            let mut kind = None;
            for row in group {
                let Some(l) = row.accountants.iter().find(|l| l.accountant == *a) else {
                    continue;
                };
                if let (Some(e), Some(k)) = (l.epsilon, l.kind) {
                    if e.is_finite() {
                        xs.push(num::clean(axis_value(row, axis)));
                        ys.push(e);
                        kind = Some(k);
                    }
                }
            }
            let Some(kind) = kind else { continue };
            let mut s = Series::for_accountant(*a, kind, xs, ys).with_markers();
            if !key.is_empty() {
                s.name = format!("{}, {key}", s.name);
            }
            series.push(s);
        }
    }
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
    plot::epsilon_vs_axis(&format!("epsilon_vs_{axis}"), label, "", delta, series)
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
                Some(l) => match l.epsilon {
                    Some(e) if l.status == "ok" => format!("{e:.6}"),
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
