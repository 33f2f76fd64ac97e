//! Diffusion sampling analysis (`analyze`): per-step μ_t, totals for each accountant (with the
//! kind of number each gives), CLT validity warnings and the critical-window view, as a
//! terminal table, a CSV and the shared [`Report`].

use std::fmt::Write as _;

use crate::accountants::{AccountantKind, BoundKind};
use crate::diffusion::account::{AccountantLine, Analysis};
use crate::diffusion::sensitivity::StepRole;
use crate::diffusion::SamplerConfig;
use crate::error::Result;
use crate::report::num::sig6;
use crate::report::{plot, Cell, Column, Fact, Report, Skipped, Table};

/// A validated `analyze` request.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The sampler configuration (TOML).
    pub config: std::path::PathBuf,
    /// Accountants to run.
    pub accountants: Vec<AccountantKind>,
    /// Overrides the configuration's δ (checked to lie in (0, 1)).
    pub delta: Option<f64>,
    /// With a diffusers `scheduler_config.json` as `config`: what the file cannot say
    /// (`--dataset-size`, `--clip`, `--samples`, `--sampler`, `--inference-steps`).
    pub scheduler: crate::diffusion::sampler::SchedulerFlags,
    /// `-v`: every step, the t and Δt columns and the event tree in the terminal text.
    pub verbose: bool,
}

/// `analyze`: loads the sampler configuration (its defaulted settings noted on stderr), analyses
/// it and returns the report, the terminal table, `analyze.csv` (the main table) and
/// `analyze.json` (every step, window row and accountant line).
pub fn execute(plan: &Plan) -> Result<super::Outcome> {
    let folder;
    let plan = if plan.config.is_dir() {
        folder = Plan {
            config: scheduler_in_folder(&plan.config)?,
            ..plan.clone()
        };
        &folder
    } else {
        plan
    };
    let mut cfg = if SamplerConfig::is_scheduler_json(&plan.config) {
        let mut flags = plan.scheduler.clone();
        flags.delta = plan.delta;
        SamplerConfig::from_scheduler_json(&plan.config, &flags)?
    } else {
        let f = &plan.scheduler;
        for (given, flag) in [
            (f.dataset_size.is_some(), "--dataset-size"),
            (f.clip_norm.is_some(), "--clip"),
            (f.samples.is_some(), "--samples"),
            (f.sampler.is_some(), "--sampler"),
            (f.inference_steps.is_some(), "--inference-steps"),
        ] {
            if given {
                return Err(crate::Error::field(
                    flag,
                    "only with a diffusers scheduler_config.json; a sampler TOML states it itself ([privacy], sampler, inference_steps)",
                )
                .with_file(&plan.config));
            }
        }
        SamplerConfig::load(&plan.config)?
    };
    cfg.warn_defaults(&plan.config);
    if let Some(d) = plan.delta {
        cfg.delta = d;
    }
    let (a, rep) = analyze(&cfg, &plan.config, &plan.accountants)?;
    let csv = render_csv(&a)?.into_bytes();
    let detail = serde_json::to_vec_pretty(&a).map_err(|e| crate::Error::input(e.to_string()))?;
    Ok(super::Outcome::new(rep, render_text(&a, plan.verbose))
        .with_table("analyze.csv", csv)
        .with_file("analyze.json", detail))
}

/// Analyses `cfg` with `accountants`: the stage result and its report.
pub fn analyze(
    cfg: &SamplerConfig,
    config_path: &std::path::Path,
    accountants: &[AccountantKind],
) -> Result<(Analysis, Report)> {
    let a = crate::diffusion::analyze(cfg, accountants).map_err(|e| e.with_file(config_path))?;
    let mut rep = build_report(&a, cfg, config_path, &crate::report::command_line())?;
    rep.conclude();
    Ok((a, rep))
}

fn line_text(l: &AccountantLine) -> String {
    let kind = l.kind().map(|k| k.as_str()).unwrap_or("-");
    let eps = l.epsilon().map(sig6).unwrap_or_else(|| "-".into());
    let mu = l.mu().map(|m| format!("μ = {}", sig6(m))).unwrap_or_default();
    let mut s = format!(
        "  {:<4} {:<12} ε = {:<12} {:<14} {}",
        l.accountant.as_str(),
        kind,
        eps,
        mu,
        l.status
    );
    if let Some(n) = l.note() {
        let _ = write!(s, " ({n})");
    }
    if l.accountant == AccountantKind::Clt && l.epsilon().is_some() {
        s.push_str(" [estimate: never the guarantee]");
    }
    s.trim_end().to_string()
}

/// Why there is no guarantee: the numbers are data-dependent, or no sound accountant answered.
fn no_guarantee(a: &Analysis) -> String {
    if a.accountants
        .iter()
        .any(|l| l.kind() == Some(crate::accountants::BoundKind::DataDependent))
    {
        "none: μ_t were computed from the private data (data-dependent: not a DP guarantee)".into()
    } else {
        "none available (no sound accountant answered)".into()
    }
}

/// Widest line of the terminal text.
pub const TEXT_WIDTH: usize = 100;
/// Step rows shown without `-v` when the sampler has more: the first [`HEAD_ROWS`] and the last
/// [`TAIL_ROWS`] (where μ_t is largest and the critical window lies).
const HEAD_ROWS: usize = 4;
const TAIL_ROWS: usize = 12;

/// Plain-text rendering (stable: golden files compare it byte for byte). Numbers have six
/// significant digits (JSON and CSV keep full precision). Without `verbose` it fits in
/// [`TEXT_WIDTH`] columns and 80 lines: long lines are wrapped, a long step table shows its
/// first and last steps; `verbose` (`-v`) adds every step, the t and Δt columns and the event
/// tree.
pub(crate) fn render_text(a: &Analysis, verbose: bool) -> String {
    let mut s = String::new();
    let line = |s: &mut String, text: String| {
        for l in super::text::wrap(&text, TEXT_WIDTH) {
            s.push_str(&l);
            s.push('\n');
        }
    };
    line(&mut s, format!("sampler: {}", a.name));
    line(&mut s, format!("schedule: {}", a.schedule));
    line(&mut s, format!("step convention {}", a.convention_text));
    line(
        &mut s,
        format!(
            "neighbouring: {}; δ = {}; C = {}; |D| = {}; p = {}; S = {} sample(s)",
            a.neighbouring,
            sig6(a.delta),
            sig6(a.clip_norm),
            a.dataset_size,
            sig6(a.subsample_rate),
            a.samples
        ),
    );
    line(&mut s, format!("density: {}", a.density));
    line(
        &mut s,
        format!(
            "per-step μ_t = 2C/(p_t(x_t)|D|)·√(2Δt/t³) (diffusion-sampling-privacy.md §3.1, eq. 5); {} private \
             step(s) per sample",
            a.private_steps
        ),
    );
    s.push('\n');
    let traj = a.steps.iter().any(|r| r.mu_min.is_some());
    let w = 11;
    // With the trajectory columns the terminal text drops t_from (the previous row's t_to).
    let from = verbose || !traj;
    let _ = write!(s, "{:>4}", "step");
    if from {
        let _ = write!(s, " {:>w$}", "t_from");
    }
    let _ = write!(s, " {:>w$}", "t_to");
    if verbose {
        let _ = write!(s, " {:>w$} {:>w$}", "t", "Δt");
    }
    let _ = write!(s, " {:>7} {:>w$} {:>w$}", "role", "μ_t", "cum. μ");
    if traj {
        let _ = write!(s, " {:>w$} {:>w$}", "μ_t min", "μ_t median");
    }
    let _ = writeln!(s, " {:>w$} {:>13}", "ε stop here", "ε switch here");
    let n = a.steps.len();
    let hidden = !verbose && n > HEAD_ROWS + TAIL_ROWS + 1;
    let windows = window_rows(a);
    for (i, r) in a.steps.iter().enumerate() {
        if hidden && i == HEAD_ROWS {
            let _ = writeln!(
                s,
                "   … {} more steps (-v shows every step and the event tree)",
                n - HEAD_ROWS - TAIL_ROWS
            );
        }
        if hidden && (HEAD_ROWS..n - TAIL_ROWS).contains(&i) {
            continue;
        }
        let role = match r.role {
            StepRole::Public => "public",
            StepRole::Private => "private",
            StepRole::Skipped => "skipped",
        };
        let _ = write!(s, "{:>4}", r.index);
        if from {
            let _ = write!(s, " {:>w$}", sig6(r.t_from));
        }
        let _ = write!(s, " {:>w$}", sig6(r.t_to));
        if verbose {
            let _ = write!(s, " {:>w$} {:>w$}", sig6(r.t), sig6(r.dt));
        }
        let _ = write!(s, " {:>7} {:>w$} {:>w$}", role, sig6(r.mu), sig6(r.cumulative_mu));
        if traj {
            let _ = write!(
                s,
                " {:>w$} {:>w$}",
                sig6(r.mu_min.unwrap_or(0.0)),
                sig6(r.mu_median.unwrap_or(0.0))
            );
        }
        match windows.get(&r.index) {
            Some(x) => {
                let _ = writeln!(s, " {:>w$} {:>13}", sig6(x.stop_epsilon), sig6(x.switch_epsilon));
            }
            None => {
                let _ = writeln!(s, " {:>w$} {:>13}", "-", "-");
            }
        }
    }
    s.push('\n');
    line(
        &mut s,
        format!(
            "full-batch GDP μ over all private steps and samples: {} ({})",
            sig6(a.full_batch_mu),
            if a.subsample_rate < 1.0 {
                "ignores subsampling"
            } else {
                "exact"
            }
        ),
    );
    line(
        &mut s,
        format!(
            "totals at δ = {} (kind: exact | upper_bound | estimate):",
            sig6(a.delta)
        ),
    );
    for l in &a.accountants {
        line(&mut s, line_text(l));
    }
    match &a.guarantee {
        Some(g) => line(
            &mut s,
            format!(
                "guarantee: ε = {} at δ = {} ({}, {})",
                sig6(g.epsilon().unwrap_or(f64::NAN)),
                sig6(a.delta),
                g.accountant.as_str(),
                g.kind().map(|k| k.as_str()).unwrap_or("-")
            ),
        ),
        None if a.private_steps > 0 => line(&mut s, format!("guarantee: {}", no_guarantee(a))),
        None => {}
    }
    if !a.warnings.is_empty() {
        line(&mut s, "warnings:".to_string());
        for w in &a.warnings {
            let text = format!(
                "  - [{}]{} {}",
                w.code,
                if w.severe { " SEVERE" } else { "" },
                w.message
            );
            if verbose {
                line(&mut s, text);
            } else {
                // One line each without -v: the first sentence, cut to the width.
                line(&mut s, super::text::first_line(&text, TEXT_WIDTH));
            }
        }
    }
    line(
        &mut s,
        format!(
            "critical window: \"ε stop here\" = GDP ε if sampling stops after the step; \"ε switch here\" = GDP ε \
             if the empirical denoiser takes over at the step (full-batch μ, {})",
            if a.subsample_rate < 1.0 {
                "an upper bound that ignores subsampling"
            } else {
                "exact"
            }
        ),
    );
    if verbose {
        let _ = writeln!(s, "event:");
        for l in a.ledger.lines() {
            let _ = writeln!(s, "  {l}");
        }
    }
    s
}

/// The critical-window rows by step index (a search per step was O(n²): seconds at 10⁵ levels).
fn window_rows(a: &Analysis) -> std::collections::HashMap<usize, &crate::diffusion::account::WindowRow> {
    a.window.iter().map(|w| (w.index, w)).collect()
}

/// CSV: one row per step, with the convention on every row.
pub(crate) fn render_csv(a: &Analysis) -> Result<String> {
    use crate::report::num::debug as fmt;
    let mut w = crate::report::csv_out::Csv::new();
    w.row([
        "convention",
        "step",
        "t_from",
        "t_to",
        "t",
        "dt",
        "role",
        "mu",
        "mu_min",
        "mu_median",
        "mu_max",
        "cumulative_mu",
        "stop_epsilon",
        "switch_epsilon",
    ])?;
    let windows = window_rows(a);
    for r in &a.steps {
        let win = windows.get(&r.index);
        let role = match r.role {
            StepRole::Public => "public",
            StepRole::Private => "private",
            StepRole::Skipped => "skipped",
        };
        w.row([
            a.convention.as_str().to_string(),
            r.index.to_string(),
            fmt(r.t_from),
            fmt(r.t_to),
            fmt(r.t),
            fmt(r.dt),
            role.to_string(),
            fmt(r.mu),
            r.mu_min.map(fmt).unwrap_or_default(),
            r.mu_median.map(fmt).unwrap_or_default(),
            r.mu_max.map(fmt).unwrap_or_default(),
            fmt(r.cumulative_mu),
            win.map(|w| fmt(w.stop_epsilon)).unwrap_or_default(),
            win.map(|w| fmt(w.switch_epsilon)).unwrap_or_default(),
        ])?;
    }
    w.into_string()
}

/// Fills the shared [`Report`] model (Markdown/HTML exporters) from an analysis.
pub(crate) fn build_report(
    a: &Analysis,
    cfg: &SamplerConfig,
    config_path: &std::path::Path,
    command: &str,
) -> Result<Report> {
    use crate::accountants::Evidence;
    use crate::config::sampler::DensityConfig;
    let mut r = Report::new(format!("Diffusion sampling analysis: {}", a.name), command).for_command("analyze");
    r.add_input("sampler config", config_path)?;
    if let DensityConfig::Trajectories(t) = &cfg.density {
        r.add_input("dataset", &cfg.resolve(&t.data))?;
        r.seed = Some(t.seed);
    }
    r.event = Some(a.event.clone());
    r.delta = Some(a.delta);
    r.assumptions.neighbouring = Some(a.neighbouring);
    r.assumptions.sampling = Some(if a.subsample_rate < 1.0 {
        format!("Poisson, p = {} at every private step", a.subsample_rate)
    } else {
        "full batch".into()
    });
    r.assumptions.step_convention = Some(a.convention_text.clone());
    r.assumptions.other = vec![
        Fact::new("schedule", a.schedule.clone()),
        Fact::new(
            "per-step μ_t",
            "2C/(p_t(x_t)|D|)·√(2Δt/t³) (diffusion-sampling-privacy.md §3.1, eq. 5)",
        ),
        Fact::new("clip norm C", a.clip_norm.to_string()),
        Fact::new("|D|", a.dataset_size.to_string()),
        Fact::new("density", a.density.clone()),
        Fact::new("generated samples S", a.samples.to_string()),
    ];
    for l in &a.accountants {
        match (l.epsilon(), l.kind()) {
            (Some(eps), Some(kind)) => {
                let mut res = Evidence::of(l.accountant, eps, l.delta, kind);
                if let Some(mu) = l.mu() {
                    res = res.with_detail("mu", mu);
                }
                if l.accountant == AccountantKind::Gdp && kind == BoundKind::UpperBound {
                    // GDP is an upper bound here only as the full-batch μ that ignores
                    // subsampling (crate::diffusion::account::gdp_line), derived again as such.
                    res = res.with_detail("no_amplification", 1.0);
                }
                res.diagnostics = l.diagnostics.clone();
                r.results.push(res);
            }
            _ => r.skipped.push(Skipped {
                accountant: l.accountant,
                reason: match &l.status {
                    crate::diffusion::account::LineStatus::Unavailable(reason) => reason.clone(),
                    other => other.to_string(),
                },
            }),
        }
    }
    // Diagnostics already attached to a result are shown with it; the rest are warnings.
    for w in &a.warnings {
        if !r.results.iter().any(|x| x.diagnostics.contains(w)) {
            r.warn(&w.code, w.message.clone(), w.severe);
        }
    }
    r.summary.push(Fact::new("step convention", a.convention.as_str()));
    r.summary
        .push(Fact::new("private steps per sample", a.private_steps.to_string()));
    r.summary.push(Fact::new("full-batch GDP μ", sig6(a.full_batch_mu)));
    r.summary.push(Fact::new(
        "guarantee",
        match &a.guarantee {
            Some(g) => format!(
                "ε = {} at δ = {:e} ({}, {})",
                sig6(g.epsilon().unwrap_or(f64::NAN)),
                a.delta,
                g.accountant.as_str(),
                g.kind().map(|k| k.as_str()).unwrap_or("-")
            ),
            None => no_guarantee(a),
        },
    ));
    let role = |x: StepRole| match x {
        StepRole::Public => "public",
        StepRole::Private => "private",
        StepRole::Skipped => "skipped",
    };
    r.tables.push(Table {
        id: "steps".into(),
        title: format!("Per-step μ_t (convention {})", a.convention.as_str()),
        columns: [
            "step",
            "t_from",
            "t_to",
            "t",
            "dt",
            "role",
            "mu",
            "mu_min",
            "mu_median",
            "mu_max",
            "cumulative_mu",
        ]
        .iter()
        .map(|c| Column::new(c))
        .collect(),
        rows: a
            .steps
            .iter()
            .map(|s| {
                vec![
                    Cell::from(s.index),
                    s.t_from.into(),
                    s.t_to.into(),
                    s.t.into(),
                    s.dt.into(),
                    role(s.role).into(),
                    s.mu.into(),
                    s.mu_min.into(),
                    s.mu_median.into(),
                    s.mu_max.into(),
                    s.cumulative_mu.into(),
                ]
            })
            .collect(),
        note: Some(a.convention_text.clone()),
    });
    r.tables.push(Table {
        id: "window".into(),
        title: "Critical window: ε if sampling stops after / switches to the empirical denoiser at each step".into(),
        columns: vec![
            Column::new("step"),
            Column::new("stop_level"),
            Column::with_unit("stop_mu", "GDP μ"),
            Column::with_unit("stop_epsilon", "nats"),
            Column::new("stop_type2_at_0.05"),
            Column::new("switch_level"),
            Column::with_unit("switch_mu", "GDP μ"),
            Column::with_unit("switch_epsilon", "nats"),
            Column::new("switch_type2_at_0.05"),
        ],
        rows: a
            .window
            .iter()
            .map(|w| {
                vec![
                    Cell::from(w.index),
                    w.stop_level.into(),
                    w.stop_mu.into(),
                    w.stop_epsilon.into(),
                    w.stop_type2_at_0_05.into(),
                    w.switch_level.into(),
                    w.switch_mu.into(),
                    w.switch_epsilon.into(),
                    w.switch_type2_at_0_05.into(),
                ]
            })
            .collect(),
        note: Some(if a.subsample_rate < 1.0 {
            "full-batch GDP μ over all samples: a sound upper bound that ignores subsampling".into()
        } else {
            "full-batch GDP μ over all samples (exact)".into()
        }),
    });
    let priv_steps: Vec<&crate::diffusion::account::StepRow> =
        a.steps.iter().filter(|s| s.role == StepRole::Private).collect();
    if !priv_steps.is_empty() && priv_steps.iter().all(|s| s.mu.is_finite() && s.mu > 0.0) {
        let x: Vec<f64> = priv_steps.iter().map(|s| s.index as f64).collect();
        let y: Vec<f64> = priv_steps.iter().map(|s| s.mu).collect();
        r.plots.push(plot::per_step_mu(&x, &y, "step (generation order)", ""));
    }
    Ok(r)
}

/// The scheduler config of a diffusers folder given to `analyze`: a UNet folder's
/// `scheduler_config.json`, or a pipeline folder's `scheduler/scheduler_config.json`.
fn scheduler_in_folder(dir: &std::path::Path) -> Result<std::path::PathBuf> {
    [
        dir.join("scheduler_config.json"),
        dir.join("scheduler").join("scheduler_config.json"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .ok_or_else(|| {
        crate::Error::input(
            "a folder without scheduler_config.json or scheduler/scheduler_config.json: give a diffusers UNet or pipeline folder, a scheduler_config.json or a sampler TOML",
        )
        .with_file(dir)
    })
}
