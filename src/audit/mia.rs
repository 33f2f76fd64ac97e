//! `mia`: the report of a membership-inference run — facts, the attack table, the null test, the
//! cosine profile, the Table-2 comparison, the comparisons of each measured number with the
//! guarantee of the mechanism it attacks, and one ROC plot per attacked mechanism.

pub mod plan;
pub use plan::{execute, finish, MiaRun, Request};

use crate::accountants::{sound, AccountantKind, BoundKind, Evidence};
use crate::attacks::mia::{AttackKind, AttackResult, Target};
use crate::attacks::pipeline::{MiaReport, Table2Row};
use crate::attacks::theory;
use crate::report::export::fmt_num;
use crate::report::{plot, Axis, Cell, Column, LegendPosition, LineStyle, Plot, Report, Scale, Series, Table};

/// `mia` and `merge`: the report (with its conclusion), the terminal text, `mia.csv` (the attack
/// table: the main table), `mia.json`, and the status: violated when a measured number exceeds
/// the guarantee of the mechanism it attacks.
pub fn outcome(m: &MiaReport, command: &str) -> crate::Result<super::Outcome> {
    let mut rep = to_report(m, command);
    rep.audit = "mia".into();
    rep.conclude();
    let detail = serde_json::to_vec_pretty(m).map_err(|e| crate::Error::input(e.to_string()))?;
    let status = if m.violations().is_empty() {
        sound::Verdict::Holds
    } else {
        sound::Verdict::Violated
    };
    let mut text = crate::attacks::render::text(m);
    if let Some(c) = &rep.conclusion {
        // The terminal summary ends with the report's own conclusion: the measured result, the
        // guarantee with what it allows an attacker, the verdict.
        text.push_str(&format!(
            "\n  conclusion:\n    guarantee: {}\n    verdict: {}\n",
            c.guarantee, c.verdict
        ));
    }
    Ok(super::Outcome::new(rep, text)
        .with_table("mia.csv", crate::attacks::render::csv(m)?.into_bytes())
        .with_file("mia.json", detail)
        .with_status(status))
}

/// The shared report model of a `mia` run (for `--format md|html|json` and `--out`).
pub(crate) fn to_report(m: &MiaReport, command: &str) -> Report {
    let f = fmt_num;
    let title = match (&m.target, &m.scores_file) {
        (Some(t), _) => format!("Membership inference on {}", t.checkpoint),
        (None, Some(s)) => format!("Membership inference from scores {s}"),
        (None, None) => "Membership inference".to_string(),
    };
    let mut r = Report::new(title, command);
    r.seed = Some(m.seed);
    r.event = m.checkpoint_basis.as_ref().and_then(|b| b.event.clone());
    r.delta = Some(m.delta);
    add_inputs(&mut r, m);
    r.assumptions.neighbouring = m
        .checkpoint_basis
        .as_ref()
        .filter(|b| b.event.is_some())
        .map(|b| b.neighbouring.unwrap_or(crate::events::Neighbouring::AddRemove));
    if let Some(t) = &m.target {
        r.fact("model", format!("{} ({} parameters)", t.arch, t.parameters));
        r.fact(
            "trained on",
            format!("{} ({} rows), {} steps", t.trained_on, t.train_rows, t.steps),
        );
        r.fact("training command", t.command.clone());
        r.fact("training randomness", t.randomness.clone());
        match &t.dp {
            None if m.checkpoint_basis.is_some() => {
                let b = m.checkpoint_basis.as_ref().expect("checked");
                r.fact("DP", format!("as stated: {}", b.source));
            }
            None => {
                r.fact("DP", "none: no theoretical limit applies to the checkpoint");
            }
            Some(dp) => {
                r.fact(
                    "DP",
                    format!(
                        "σ = {}, C = {}, q = {}, {} steps",
                        dp.noise_multiplier, dp.clip, dp.sample_rate, dp.steps
                    ),
                );
            }
        }
    }
    r.fact("device", m.device.clone());
    if let Some(b) = &m.backend {
        r.fact("backend", b.clone());
    }
    if let Some(p) = &m.precision {
        r.fact("precision", p.describe());
    }
    // The checkpoint's accounted guarantees are the report's results (the guarantee the
    // conclusion states); the sampler's stay facts, they are about another mechanism.
    if let Some(basis) = &m.checkpoint_basis {
        for g in &basis.guarantees {
            let Some(acc) = g
                .source()
                .split_whitespace()
                .next()
                .and_then(|a| a.parse::<AccountantKind>().ok())
            else {
                continue;
            };
            let mut res = Evidence::of(acc, g.epsilon, g.delta, g.kind).for_mechanism("checkpoint");
            if let Some(mu) = g.mu() {
                res = res.with_detail("mu", mu);
            }
            if g.source() == theory::NO_AMPLIFICATION {
                res = res.with_detail("no_amplification", 1.0);
            }
            r.results.push(res);
        }
    }
    for (name, b) in [("checkpoint", &m.checkpoint_basis), ("sampler", &m.sampler_basis)] {
        if let Some(b) = b {
            for g in &b.guarantees {
                r.fact(
                    format!("accounted ε of the {name} ({}, {})", g.source(), g.kind.as_str()),
                    format!("{} at δ = {}", f(g.epsilon), f(g.delta)),
                );
            }
        }
    }
    for w in &m.warnings {
        r.warn("mia_warning", w.clone(), w.contains("seeded"));
    }
    // Each audit compared with an accounted ε is a verdict on that ε, decided by the audit's
    // lower bound (Clopper–Pearson / Steinke et al.): `fail` when it exceeds the accounted ε
    // (a violation), `pass` when the accounted ε survives the audit.
    for c in &m.comparisons {
        let (Some(limit), Some(lower)) = (c.limit, c.epsilon_lower) else {
            continue;
        };
        r.verdicts.push(crate::report::Verdict {
            subject: format!("accounted ε of the {} against the {}", c.mechanism, c.what),
            status: if c.violation {
                sound::Verdict::Violated
            } else if c.outcome.starts_with("not demonstrated") {
                sound::Verdict::NotDemonstrated
            } else {
                sound::Verdict::Holds
            },
            budget: Some(limit),
            evidence: Some(sound::Evidence::new(
                &c.what,
                lower,
                c.delta.unwrap_or(f64::NAN),
                BoundKind::LowerBound,
            )),
            margin: Some(limit - lower),
            message: c.outcome.clone(),
        });
    }
    for c in m.violations() {
        r.warn(
            "violation",
            format!("{}: {} — {} (basis: {})", c.what, c.outcome, c.measured, c.basis),
            true,
        );
    }
    r.tables.push(Table {
        id: "comparisons".into(),
        title: "Each measured number against the guarantee of the mechanism it attacks".into(),
        columns: ["what", "mechanism", "basis", "measured", "limit", "outcome"]
            .iter()
            .map(|c| Column::new(c))
            .collect(),
        rows: m
            .comparisons
            .iter()
            .map(|c| {
                vec![
                    c.what.clone().into(),
                    c.mechanism.clone().into(),
                    c.basis.clone().into(),
                    c.measured.clone().into(),
                    c.limit.into(),
                    c.outcome.clone().into(),
                ]
            })
            .collect(),
        note: Some("Only an audit's ε lower bound (one-run canaries, or independent runs) can show a violation; a single model's ASR at the held-out threshold is a measurement, not a bound.".into()),
    });
    if let Some(a) = &m.one_run {
        r.tables.push(Table {
            id: "one-run".into(),
            title: format!(
                "One-run audit: {} canaries, {} included; ε lower bound {} at confidence {}",
                a.canaries,
                a.included,
                f(a.epsilon_lower),
                f(a.confidence)
            ),
            columns: ["attack", "t", "k+", "k-", "guesses", "correct", "ε lower (at 1 − β/N)"]
                .iter()
                .map(|c| Column::new(c))
                .collect(),
            rows: a
                .all
                .iter()
                .map(|c| {
                    vec![
                        c.attack.clone().into(),
                        c.t.into(),
                        c.k_pos.into(),
                        c.k_neg.into(),
                        (c.guesses as usize).into(),
                        (c.correct as usize).into(),
                        c.epsilon_lower.into(),
                    ]
                })
                .collect(),
            note: Some(format!(
                "Threat model: {}. Steinke, Nasr & Jagielski 2023, Thm 3.3 at δ = {}; Bonferroni over N = {} candidates.",
                a.threat_model,
                f(a.delta),
                a.candidates
            )),
        });
    }
    if let Some(w) = &m.white_box {
        r.tables.push(Table {
            id: "white-box".into(),
            title: format!(
                "White-box f-DP audit: {} gradient canaries, {} included, {} noisy updates; ε lower bound {} at confidence {}",
                w.canaries,
                w.included,
                w.steps,
                f(w.fdp.epsilon_lower),
                f(w.fdp.confidence)
            ),
            columns: ["k+", "k-", "guesses", "correct"]
                .iter()
                .map(|c| Column::new(c))
                .collect(),
            rows: w
                .fdp
                .candidates
                .iter()
                .map(|c| {
                    vec![
                        c.k_pos.into(),
                        c.k_neg.into(),
                        (c.guesses as usize).into(),
                        (c.correct as usize).into(),
                    ]
                })
                .collect(),
            note: Some(format!(
                "Threat model: white-box (every noisy update seen). Mahloujifar, Melis & Chaudhuri 2025 against {}: the run is shown not to satisfy the member with noise multiplier {} (Bonferroni over the {} rows, confidence {}); ε of that member by its sound lower bound is {} at δ = {}, a lower bound on the run's ε if the run is a DP-SGD of the ledger's sampling rate and steps. The ledger's own curve (noise multiplier {}) is {}. Scores: the log-likelihood ratio of the ledger's mechanism over the observed updates.",
                w.fdp.family,
                w.fdp.sigma_rejected.map_or("none".to_string(), f),
                w.fdp.candidates.len(),
                f(w.fdp.confidence),
                f(w.fdp.epsilon_lower),
                f(w.delta),
                f(w.mechanism.noise_multiplier),
                if w.fdp.ledger_rejected { "rejected" } else { "not rejected" }
            )),
        });
    }
    let cols = [
        "attack",
        "t",
        "labels",
        "AUC",
        "AUC lo",
        "AUC hi",
        "TPR@1%FPR",
        "TPR@0.1%FPR",
        "ASR held-out",
        "lo",
        "hi",
        "ASR oracle",
        "lo",
        "hi",
        "threshold",
        "ASR limit",
        "TPR@1% limit",
    ];
    let row = |a: &AttackResult| -> Vec<Cell> {
        vec![
            a.attack.as_str().into(),
            a.t.into(),
            (if a.shuffled_labels { "shuffled" } else { "true" }).into(),
            a.auc.into(),
            a.auc_ci.lo.into(),
            a.auc_ci.hi.into(),
            a.tpr_at_1pct_fpr.into(),
            a.tpr_at_01pct_fpr.into(),
            a.asr_heldout.into(),
            a.asr_heldout_ci.lo.into(),
            a.asr_heldout_ci.hi.into(),
            a.asr_oracle.into(),
            a.asr_oracle_ci.lo.into(),
            a.asr_oracle_ci.hi.into(),
            a.threshold.into(),
            a.limits.as_ref().map(|l| l.asr).into(),
            a.limits.as_ref().map(|l| l.tpr_at_1pct).into(),
        ]
    };
    let note = format!(
        "{:.0}% stratified bootstrap intervals. ASR held-out: empirical ASR at the threshold chosen on a held-out half (one model: a measurement, not a bound). Limits from the tightest sound guarantee of the attacked mechanism (checkpoint: training ledger; empirical: sampler accounting).",
        m.confidence * 100.0
    );
    r.tables.push(Table {
        id: "attacks".into(),
        title: "Attacks".into(),
        columns: cols.iter().map(|c| Column::new(c)).collect(),
        rows: m.results.iter().map(row).collect(),
        note: Some(note.clone()),
    });
    if !m.null_results.is_empty() {
        r.tables.push(Table {
            id: "null-test".into(),
            title: "Null test (labels shuffled at random; AUC and ASR should be near 0.5)".into(),
            columns: cols.iter().map(|c| Column::new(c)).collect(),
            rows: m.null_results.iter().map(row).collect(),
            note: Some(note),
        });
    }
    if !m.cosine.is_empty() {
        r.tables.push(Table {
            id: "cosine".into(),
            title: "Cosine between empirical and neural denoising directions (Figure 1)".into(),
            columns: vec![
                Column::new("t"),
                Column::new("log SNR"),
                Column::new("mean"),
                Column::new("min"),
            ],
            rows: m
                .cosine
                .iter()
                .map(|c| vec![c.t.into(), c.log_snr.into(), c.cosine_mean.into(), c.cosine_min.into()])
                .collect(),
            note: None,
        });
        r.plots.push(Plot {
            id: "cosine".into(),
            title: "Empirical vs neural denoiser: cosine of denoising directions".into(),
            x: Axis::new("log SNR", "nats", Scale::Linear),
            y: Axis::new("cosine similarity", "", Scale::Linear),
            series: vec![Series::new(
                "mean over held-out queries",
                m.cosine.iter().map(|c| c.log_snr).collect(),
                m.cosine.iter().map(|c| c.cosine_mean).collect(),
            )
            .with_markers()],
            legend: LegendPosition::LowerLeft,
            caption: None,
        });
    }
    if let Some(tb) = &m.table2 {
        let mut columns = vec![Column::new("quantity")];
        columns.extend(tb.rows.iter().map(|x| Column::new(&format!("{} ({})", x.label, x.t))));
        let mut rows = vec![{
            let mut v: Vec<Cell> = vec!["cosine similarity".into()];
            v.extend(tb.rows.iter().map(|x| Cell::from(x.cosine)));
            v
        }];
        for (i, p) in tb.rates.iter().enumerate() {
            let mut v: Vec<Cell> = vec![format!("theoretical ASR at p = {p}").into()];
            v.extend(tb.rows.iter().map(|x| Cell::from(x.theoretical_asr[i])));
            rows.push(v);
        }
        for (name, g) in [
            (
                "numerical ASR (SecMI)",
                (|x: &Table2Row| x.asr_secmi) as fn(&Table2Row) -> f64,
            ),
            ("numerical ASR (loss)", |x| x.asr_loss),
            ("numerical ASR (empirical)", |x| x.asr_empirical),
        ] {
            let mut v: Vec<Cell> = vec![name.into()];
            v.extend(tb.rows.iter().map(|x| Cell::from(g(x))));
            rows.push(v);
        }
        r.tables.push(Table {
            id: "table2".into(),
            title: "Table-2-style comparison (diffusion-sampling-privacy §6.4)".into(),
            columns,
            rows,
            note: Some(tb.note.clone()),
        });
    }
    // ROC of each attack at its best step, against the limit of the mechanism it attacks: the
    // checkpoint's attacks against the training ledger's limit, the sampler's (empirical) attack
    // against the sampler's accounting, never one against the other's.
    for (target, id, name, basis) in [
        (Target::Checkpoint, "roc", "checkpoint", &m.checkpoint_basis),
        (Target::Sampler, "roc-sampler", "sampler", &m.sampler_basis),
    ] {
        let mut series = Vec::new();
        for kind in [
            AttackKind::Loss,
            AttackKind::Secmi,
            AttackKind::Pia,
            AttackKind::Empirical,
        ] {
            if kind.target() != target {
                continue;
            }
            let best = m
                .results
                .iter()
                .filter(|a| a.attack == kind)
                .max_by(|a, b| a.auc.total_cmp(&b.auc));
            if let Some(a) = best {
                if let Some(roc) = &a.roc {
                    series.push(Series::new(
                        format!("{} at t = {}", kind.as_str(), a.t),
                        roc.fpr.clone(),
                        roc.tpr.clone(),
                    ));
                }
            }
        }
        if series.is_empty() {
            continue;
        }
        let attacks = series.clone();
        let grid = plot::alpha_grid(200);
        let gs: &[Evidence] = basis.as_ref().map_or(&[][..], |b| &b.guarantees[..]);
        let limited = theory::tightest(gs, |g| g.asr_limit()).is_some();
        if let Some((_, src)) = theory::tightest(gs, |g| g.asr_limit()) {
            let lim: Vec<f64> = grid
                .iter()
                .map(|&x| theory::tightest(gs, |g| g.tpr_limit(x)).map_or(1.0, |v| v.0))
                .collect();
            series.push(
                Series::new(format!("{name}'s TPR limit ({src})"), grid.clone(), lim).with_style(LineStyle::Dashed),
            );
        }
        series.push(Series::new("chance", vec![0.0, 1.0], vec![0.0, 1.0]).with_style(LineStyle::Dotted));
        r.plots.push(Plot {
            id: id.into(),
            title: if target == Target::Checkpoint {
                "ROC of each attack on the checkpoint (best step) against the theoretical limit".into()
            } else {
                "ROC of the attack on the empirical-denoiser sampler (best step) against its limit".into()
            },
            x: Axis::new("false positive rate", "probability", Scale::Linear),
            y: Axis::new("true positive rate", "probability", Scale::Linear),
            series,
            legend: LegendPosition::LowerRight,
            caption: Some(if limited {
                format!("An attack's ROC must stay below a sound limit; the dashed curve is the {name}'s TPR ≤ Φ(Φ⁻¹(FPR) + μ) or the (ε, δ) region.")
            } else {
                format!("No sound guarantee applies to the {name}: no limit is drawn.")
            }),
        });
        r.plots.push(roc_loglog(id, name, target, attacks, gs, limited));
    }
    r
}

/// What the report audited, by content hash: a diffusers folder's files as `model info` lists
/// them (config, weights, scheduler, card, ledger), or the checkpoint card; the data, split and
/// scores files. A card's data and split paths are relative to the card (or the folder): they
/// resolve from there when they do not from the working directory. A file that cannot be read
/// is a warning naming it, never silently left out.
fn add_inputs(r: &mut Report, m: &MiaReport) {
    use std::path::PathBuf;
    let ck = m.target.as_ref().map(|t| PathBuf::from(&t.checkpoint));
    // A card's paths are relative to the card's folder (older cards: to the working directory),
    // read as the checkpoint loader reads them; a diffusers folder's data and split are the
    // paths the run was given.
    let card = ck.as_ref().filter(|c| c.is_file());
    let resolve = |field: &str, p: &str| -> PathBuf {
        match card {
            Some(c) => crate::models::card::resolve_card_path(c, field, p).unwrap_or_else(|_| PathBuf::from(p)),
            None => PathBuf::from(p),
        }
    };
    let mut files: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(c) = &ck {
        if c.is_dir() {
            files.extend(crate::models::folder::folder_files(c));
        } else {
            files.push(("checkpoint", c.clone()));
        }
    }
    for (role, field, p) in [
        ("data", "data.file", m.data.as_str()),
        ("split", "data.split", m.split.as_str()),
        ("scores", "", m.scores_file.as_deref().unwrap_or("")),
    ] {
        if !p.is_empty() {
            files.push((
                role,
                if field.is_empty() {
                    PathBuf::from(p)
                } else {
                    resolve(field, p)
                },
            ));
        }
    }
    for (role, p) in files {
        if let Err(e) = r.add_input(role, &p) {
            r.warn(
                "input_not_hashed",
                format!("the {role} file {} could not be hashed ({e})", p.display()),
                true,
            );
        }
    }
}

/// The ROC on log-log axes (TPR against FPR), how membership inference papers read an attack at
/// low FPR, with the same theoretical limit on a log-spaced FPR grid from half the smallest
/// positive FPR of the attacks to 1.
fn roc_loglog(id: &str, name: &str, target: Target, mut series: Vec<Series>, gs: &[Evidence], limited: bool) -> Plot {
    let fmin = series
        .iter()
        .flat_map(|s| s.x.iter().copied())
        .filter(|&x| x > 0.0)
        .fold(1.0f64, f64::min)
        / 2.0;
    let n = 200;
    let grid: Vec<f64> = (0..=n)
        .map(|i| (fmin.ln() * (1.0 - i as f64 / n as f64)).exp())
        .collect();
    if limited {
        if let Some((_, src)) = theory::tightest(gs, |g| g.asr_limit()) {
            let lim: Vec<f64> = grid
                .iter()
                .map(|&x| theory::tightest(gs, |g| g.tpr_limit(x)).map_or(1.0, |v| v.0))
                .collect();
            series.push(
                Series::new(format!("{name}'s TPR limit ({src})"), grid.clone(), lim).with_style(LineStyle::Dashed),
            );
        }
    }
    series.push(Series::new("chance", vec![fmin, 1.0], vec![fmin, 1.0]).with_style(LineStyle::Dotted));
    Plot {
        id: format!("{id}-loglog"),
        title: if target == Target::Checkpoint {
            "ROC at low false positive rates (log-log), checkpoint attacks".into()
        } else {
            "ROC at low false positive rates (log-log), sampler attack".into()
        },
        x: Axis::new("false positive rate", "probability", Scale::Log),
        y: Axis::new("true positive rate", "probability", Scale::Log),
        series,
        legend: LegendPosition::LowerRight,
        caption: Some(if limited {
            format!(
                "The same ROC on log-log axes, where a membership attack's power at low FPR shows; it must stay \
                 below the dashed limit of the {name}. Points with FPR = 0 cannot be drawn on a log axis."
            )
        } else {
            format!(
                "The same ROC on log-log axes (no sound guarantee applies to the {name}: no limit is drawn). Points \
                 with FPR = 0 cannot be drawn on a log axis."
            )
        }),
    }
    .note_zeros()
}
