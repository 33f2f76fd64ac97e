//! Sweeps (`sweep`): a sampler configuration over a grid of settings, as the shared [`Report`]
//! (one table row per grid point, ε against the swept axis with bounds solid, estimates dashed
//! and the budget line) and a terminal table.

use std::fmt::Write as _;
use std::path::Path;

use crate::accountants::{AccountantKind, BoundKind};
use crate::diffusion::sweep::{self, SweepRow, SweepSpec};
use crate::diffusion::SamplerConfig;
use crate::error::Result;
use crate::report::plot::{self, LineStyle, Series};
use crate::report::progress::Progress;
use crate::report::{self, num, Cell, Column, Conclusion, Report, Table};

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
    let rep = to_report(&rows, &spec.accountants, cfg, config_path, budget)?;
    Ok((rows, rep))
}

/// The axes a sweep can vary, in the order they are tried as the plot's x axis.
const AXES: [(&str, &str); 5] = [
    ("sigma_min", "σ_min"),
    ("subsample_rate", "subsampling rate p"),
    ("switch_at", "switch point (fraction of steps)"),
    ("samples", "generated samples S"),
    ("levels", "noise levels N"),
];

fn axis_value(r: &SweepRow, axis: &str) -> f64 {
    match axis {
        "sigma_min" => r.sigma_min.unwrap_or(f64::NAN),
        "subsample_rate" => r.subsample_rate,
        "switch_at" => r.switch_at,
        "samples" => r.samples as f64,
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
) -> Result<Report> {
    let mut r = Report::new(format!("Sweep: {}", config_path.display()), report::command_line()).for_command("sweep");
    r.add_input("sampler config", config_path)?;
    r.delta = Some(cfg.delta);
    r.assumptions.neighbouring = Some(cfg.neighbouring);
    if let Some(c) = rows.first() {
        r.assumptions.step_convention = Some(c.convention.clone());
    }
    let mut columns: Vec<Column> = [
        "sigma_min",
        "levels",
        "subsample_rate",
        "switch_at",
        "samples",
        "convention",
        "private_steps",
        "max_step_mu",
        "full_batch_mu",
    ]
    .iter()
    .map(|c| Column::new(c))
    .collect();
    for a in accountants {
        let n = a.as_str();
        if matches!(a, AccountantKind::Gdp | AccountantKind::Clt) {
            columns.push(Column::new(&format!("{n}_mu")));
        }
        columns.push(Column::new(&format!("{n}_epsilon")));
        columns.push(Column::new(&format!("{n}_kind")));
        columns.push(Column::new(&format!("{n}_status")));
    }
    let table_rows = rows
        .iter()
        .map(|row| {
            let mut v = vec![
                Cell::from(row.sigma_min.map(num::clean)),
                Cell::from(row.levels),
                Cell::Num(num::clean(row.subsample_rate)),
                Cell::Num(num::clean(row.switch_at)),
                Cell::from(row.samples),
                Cell::from(row.convention.as_str()),
                Cell::from(row.private_steps),
                Cell::Num(row.max_step_mu),
                Cell::Num(row.full_batch_mu),
            ];
            for a in accountants {
                let l = row.accountants.iter().find(|l| l.accountant == *a);
                if matches!(a, AccountantKind::Gdp | AccountantKind::Clt) {
                    v.push(Cell::from(l.and_then(|l| l.mu)));
                }
                v.push(Cell::from(l.and_then(|l| l.epsilon)));
                v.push(Cell::from(l.and_then(|l| l.kind).map(|k| k.as_str())));
                v.push(Cell::from(
                    l.map(|l| l.status.clone()).unwrap_or_else(|| "no private steps".into()),
                ));
            }
            v
        })
        .collect();
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
                "Sound ε (exact values and upper bounds) at δ = {} ranges from {} to {} across the grid.",
                num::fmt(cfg.delta),
                report::export::fmt_num(lo),
                report::export::fmt_num(hi)
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
    // Group rows by the other axes' values (in first-seen order).
    let mut groups: Vec<(String, Vec<&SweepRow>)> = Vec::new();
    for row in rows {
        let key: Vec<String> = AXES
            .iter()
            .filter(|(id, _)| *id != axis)
            .filter(|(id, _)| {
                let first = axis_value(&rows[0], id).to_bits();
                rows.iter().any(|x| axis_value(x, id).to_bits() != first)
            })
            .map(|(id, _)| format!("{id} = {}", num::fmt_clean(axis_value(row, id))))
            .collect();
        let key = key.join(", ");
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, v)) => v.push(row),
            None => groups.push((key, vec![row])),
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

/// Terminal table: one row per grid point.
pub fn text(rows: &[SweepRow], accountants: &[AccountantKind]) -> String {
    let mut s = String::new();
    if let Some(r) = rows.first() {
        let _ = writeln!(s, "step convention {}", r.convention);
    }
    let _ = write!(
        s,
        "{:>12} {:>6} {:>10} {:>9} {:>8} {:>8} {:>13}",
        "sigma_min", "N", "p", "switch", "S", "private", "full μ"
    );
    for a in accountants {
        let _ = write!(s, " {:>14}", format!("{} ε", a.as_str()));
    }
    s.push('\n');
    for r in rows {
        let _ = write!(
            s,
            "{:>12} {:>6} {:>10} {:>9} {:>8} {:>8} {:>13}",
            r.sigma_min.map(num::fmt_clean).unwrap_or_else(|| "-".into()),
            r.levels,
            num::fmt_clean(r.subsample_rate),
            num::fmt_clean(r.switch_at),
            r.samples,
            r.private_steps,
            report::export::fmt_num(r.full_batch_mu)
        );
        for a in accountants {
            let l = r.accountants.iter().find(|l| l.accountant == *a);
            let cell = match l {
                Some(l) => match l.epsilon {
                    Some(e) if l.status == "ok" => report::export::fmt_num(e),
                    Some(e) => format!("{}!", report::export::fmt_num(e)),
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
