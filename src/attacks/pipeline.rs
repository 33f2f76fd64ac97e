//! The whole attack chain in one place: checkpoint + split → scores → metrics, beside the
//! limits implied by the checkpoint's DP ledger (when it has one) — and the Table-2-style
//! comparison of diffusion-sampling-privacy §6.4 (neural vs empirical denoiser across t).

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::empirical::{cosine_profile, CosinePoint};
use super::mia::{self, AttackKind, AttackResult, MetricOpts, ScoreOpts};
use super::theory::{self, Guarantee};
use crate::error::{Error, Result};
use crate::events::{DpEvent, EventFile};
use crate::models::checkpoint::DpInfo;
use crate::models::{Checkpoint, Dataset, SplitManifest};

/// Settings of the Table-2-style comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table2Opts {
    /// Stopping steps, as written ("T", "3T/4", …).
    pub steps: Vec<String>,
    /// Subsampling rates p of the empirical-denoiser sampler.
    pub rates: Vec<f64>,
    /// Sampler stride (DDPM steps per sampler step).
    pub stride: usize,
    /// Clipping norm C and constant density p_t of the sampler mechanism.
    pub clip: f64,
    /// Constant density p_t of the sampler mechanism.
    pub density: f64,
}

impl Default for Table2Opts {
    fn default() -> Self {
        Table2Opts {
            steps: vec!["T".into(), "3T/4".into(), "T/2".into(), "T/4".into()],
            rates: vec![1.0, 0.5, 0.01, 0.005],
            stride: 10,
            clip: 1.0,
            density: 1.0,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct MiaPlan {
    /// Attacks to run.
    pub attacks: Vec<AttackKind>,
    /// Diffusion steps to attack at.
    pub timesteps: Vec<usize>,
    /// Attack settings.
    pub score: ScoreOpts,
    /// Metric settings.
    pub metric: MetricOpts,
    /// Also run every attack with labels shuffled at random (expects ε_lower = 0).
    pub null_test: bool,
    /// The Table-2-style comparison, when requested.
    pub table2: Option<Table2Opts>,
    /// Steps of the Figure-1 cosine profile (empty: none).
    pub cosine_steps: Vec<usize>,
}

/// One row of the Table-2-style comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table2Row {
    /// Row label (`T`, `3T/4`, …).
    pub label: String,
    /// Diffusion step of the row.
    pub t: usize,
    /// Mean cosine between empirical and neural denoising directions.
    pub cosine: f64,
    /// Theoretical ASR of the empirical-denoiser sampler stopped at t, one per rate (None: no
    /// sound accountant supports the subsampled event yet).
    pub theoretical_asr: Vec<Option<f64>>,
    /// Full-batch GDP μ of the empirical-denoiser sampler run down to t.
    pub sampler_mu_full_batch: f64,
    /// Held-out ASR of SecMI on the neural denoiser (Duan et al. 2023, as in the paper).
    pub asr_secmi: f64,
    /// Held-out ASR of the loss attack on the neural denoiser.
    pub asr_loss: f64,
    /// Held-out ASR of the loss attack on the empirical denoiser itself.
    pub asr_empirical: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
/// The Table-2-style comparison.
pub struct Table2 {
    /// Sampling rates p of the theoretical ASR columns.
    pub rates: Vec<f64>,
    /// One row per step.
    pub rows: Vec<Table2Row>,
    /// How the table was computed.
    pub note: String,
}

/// Summary of the attacked checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetInfo {
    /// Path of the checkpoint card.
    pub checkpoint: String,
    /// Architecture name.
    pub arch: String,
    /// Number of trainable parameters.
    pub parameters: usize,
    /// The split part trained on.
    pub trained_on: String,
    /// Number of rows trained on.
    pub train_rows: usize,
    /// Training steps.
    pub steps: usize,
    /// The command that trained it.
    pub command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// DP-SGD settings, for DP checkpoints.
    pub dp: Option<DpInfo>,
}

/// Everything `dpaudit mia` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MiaReport {
    /// Schema name of the report.
    pub schema: String,
    /// The attacked checkpoint.
    pub target: TargetInfo,
    /// Path of the split manifest.
    pub split: String,
    /// Path of the data file.
    pub data: String,
    /// Device the attacks ran on.
    pub device: String,
    /// Seed of the run.
    pub seed: u64,
    /// δ of the ε lower bounds and guarantees.
    pub delta: f64,
    /// Confidence level of the intervals and lower bounds.
    pub confidence: f64,
    /// The accounted event (ledger), when the model was trained with DP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<DpEvent>,
    /// Sound guarantees of the checkpoint's ledger, tightest first.
    pub guarantees: Vec<Guarantee>,
    /// Accountants that could not account the ledger, with reasons.
    pub accountants_skipped: Vec<String>,
    /// One result per (attack, step).
    pub results: Vec<AttackResult>,
    /// Results with shuffled labels (the null test).
    pub null_results: Vec<AttackResult>,
    /// Cosine profile between empirical and neural denoisers.
    pub cosine: Vec<CosinePoint>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The Table-2-style comparison, when requested.
    pub table2: Option<Table2>,
    /// Wall time of the run in seconds.
    pub elapsed_s: f64,
}

/// The event a DP checkpoint ran: its ledger file (relative to the card) — the record of what
/// ran, not a recomputation.
pub fn checkpoint_event(ck: &Checkpoint) -> Result<Option<DpEvent>> {
    let Some(dp) = &ck.card.dp else { return Ok(None) };
    let p = ck.dir().join(&dp.ledger);
    let f = EventFile::load(&p)?;
    Ok(Some(f.event))
}

/// Runs the plan. `bar` counts (attack, step) pairs plus Table-2 rows.
pub fn run(
    ck: &Checkpoint,
    data: &Dataset,
    split: &SplitManifest,
    plan: &MiaPlan,
    device: &str,
    bar: Option<&ProgressBar>,
) -> Result<MiaReport> {
    let start = std::time::Instant::now();
    split.check_data(data)?;
    let trained_on = ck.card.data.trained_on;
    let member_ix = split.part(trained_on);
    if crate::models::data::indices_sha256(member_ix) != ck.card.data.rows_sha256 {
        return Err(Error::input(format!(
            "the split's `{:?}` list does not hash to the card's data.rows_sha256: this is not the split the model was trained on",
            trained_on
        ))
        .with_file(&ck.card_path));
    }
    let nonmember_ix = &split.nonmembers;
    if trained_on == crate::models::data::Part::Nonmembers {
        return Err(Error::input(
            "the model was trained on the non-members; nothing to attack",
        ));
    }
    let members = data.rows(member_ix);
    let nonmembers = data.rows(nonmember_ix);
    let event = checkpoint_event(ck)?;
    let (guarantees, skipped) = match &event {
        Some(ev) => theory::guarantees(ev, plan.metric.delta),
        None => (Vec::new(), Vec::new()),
    };
    let net = &ck.net;
    let sched = &ck.schedule;
    let mut results = Vec::new();
    let mut null_results = Vec::new();
    let mut scored = |kind: AttackKind, t: usize| -> Result<AttackResult> {
        let pos = mia::scores(kind, net, sched, &members, &members, t, &plan.score)?;
        let neg = mia::scores(kind, net, sched, &members, &nonmembers, t, &plan.score)?;
        if plan.null_test {
            let (p2, n2) = mia::shuffled(&pos, &neg, plan.metric.seed ^ t as u64);
            let mut r = mia::evaluate(kind, t, &p2, &n2, &plan.metric, &guarantees)?;
            r.shuffled_labels = true;
            null_results.push(r);
        }
        mia::evaluate(kind, t, &pos, &neg, &plan.metric, &guarantees)
    };
    for &kind in &plan.attacks {
        for &t in &plan.timesteps {
            if let Some(b) = bar {
                b.set_message(format!("{} at t = {t}", kind.as_str()));
            }
            results.push(scored(kind, t)?);
            if let Some(b) = bar {
                b.inc(1);
            }
        }
    }
    let cosine = if plan.cosine_steps.is_empty() {
        Vec::new()
    } else {
        cosine_profile(net, sched, &members, &nonmembers, &plan.cosine_steps, plan.score.seed)?
    };
    let table2 = match &plan.table2 {
        None => None,
        Some(o) => {
            let mut rows = Vec::new();
            for label in &o.steps {
                let t = sched.parse_timestep(label)?;
                if let Some(b) = bar {
                    b.set_message(format!("table 2 at {label}"));
                }
                let cos = cosine_profile(net, sched, &members, &nonmembers, &[t], plan.score.seed)?[0].cosine_mean;
                let mus = theory::sampler_step_mus(
                    sched,
                    t,
                    o.stride,
                    members.len() / crate::models::PIXELS,
                    o.clip,
                    o.density,
                );
                let mut th = Vec::new();
                for &p in &o.rates {
                    th.push(theory::sampler_asr(&mus, p, plan.metric.delta)?.map(|x| x.0));
                }
                let asr = |kind: AttackKind| -> Result<f64> {
                    let pos = mia::scores(kind, net, sched, &members, &members, t, &plan.score)?;
                    let neg = mia::scores(kind, net, sched, &members, &nonmembers, t, &plan.score)?;
                    let h = super::metrics::HeldOut::split(&pos, &neg, plan.metric.seed)?;
                    Ok(super::metrics::heldout_asr(&h)?.0)
                };
                let secmi_t = t.max(plan.score.secmi_k);
                rows.push(Table2Row {
                    label: label.clone(),
                    t,
                    cosine: cos,
                    theoretical_asr: th,
                    sampler_mu_full_batch: mus.iter().map(|m| m * m).sum::<f64>().sqrt(),
                    asr_secmi: {
                        let pos = mia::scores(AttackKind::Secmi, net, sched, &members, &members, secmi_t, &plan.score)?;
                        let neg = mia::scores(
                            AttackKind::Secmi,
                            net,
                            sched,
                            &members,
                            &nonmembers,
                            secmi_t,
                            &plan.score,
                        )?;
                        let h = super::metrics::HeldOut::split(&pos, &neg, plan.metric.seed)?;
                        super::metrics::heldout_asr(&h)?.0
                    },
                    asr_loss: asr(AttackKind::Loss)?,
                    asr_empirical: asr(AttackKind::Empirical)?,
                });
                if let Some(b) = bar {
                    b.inc(1);
                }
            }
            Some(Table2 {
                rates: o.rates.clone(),
                rows,
                note: format!(
                    "theoretical ASR: empirical-denoiser sampler from T down to t every {} DDPM steps, μ_i = 2C/(p_t|D|)·√(2Δt/t³) on the VE time t = σ_t, C = {}, p_t = {}, |D| = {}; p = 1 is exact GDP (Φ(μ/2)), p < 1 uses the tightest sound accountant at δ = {}",
                    o.stride,
                    o.clip,
                    o.density,
                    members.len() / crate::models::PIXELS,
                    plan.metric.delta
                ),
            })
        }
    };
    let c = &ck.card;
    Ok(MiaReport {
        schema: "dpaudit.mia/1".into(),
        target: TargetInfo {
            checkpoint: ck.card_path.display().to_string(),
            arch: format!("{:?}", c.model.arch).to_lowercase(),
            parameters: c.parameters,
            trained_on: format!("{:?}", c.data.trained_on).to_lowercase(),
            train_rows: c.data.rows,
            steps: c.training.steps,
            command: c.training.command.clone(),
            dp: c.dp.clone(),
        },
        split: c.data.split.clone(),
        data: c.data.file.clone(),
        device: device.to_string(),
        seed: plan.score.seed,
        delta: plan.metric.delta,
        confidence: 1.0 - plan.metric.alpha,
        event,
        guarantees,
        accountants_skipped: skipped,
        results,
        null_results,
        cosine,
        table2,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}

impl MiaReport {
    /// The shared report model (for `--format md|html`): facts, the attack table, the null
    /// test, the cosine profile, the Table-2 comparison, and the ROC of each attack (at its
    /// best step) against the theoretical TPR limit.
    pub fn to_report(&self, command: &str) -> crate::report::Report {
        use crate::report::{plot, Axis, Cell, Column, LegendPosition, LineStyle, Plot, Report, Scale, Series, Table};
        let f = crate::report::export::fmt_num;
        let mut r = Report::new(format!("Membership inference on {}", self.target.checkpoint), command);
        r.seed = Some(self.seed);
        r.event = self.event.clone();
        r.delta = Some(self.delta);
        for (role, p) in [
            ("checkpoint", &self.target.checkpoint),
            ("data", &self.data),
            ("split", &self.split),
        ] {
            let _ = r.add_input(role, std::path::Path::new(p));
        }
        r.assumptions.neighbouring = self.event.as_ref().map(|_| crate::events::Neighbouring::AddRemove);
        let t = &self.target;
        r.fact("model", format!("{} ({} parameters)", t.arch, t.parameters));
        r.fact(
            "trained on",
            format!("{} ({} rows), {} steps", t.trained_on, t.train_rows, t.steps),
        );
        r.fact("training command", t.command.clone());
        r.fact("device", self.device.clone());
        match &t.dp {
            None => {
                r.fact("DP", "none: no theoretical limit applies");
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
        for g in &self.guarantees {
            r.fact(
                format!("accounted ε ({}, {})", g.source, g.kind.as_str()),
                format!("{} at δ = {}", f(g.epsilon), f(g.delta)),
            );
        }
        for s in &self.accountants_skipped {
            r.warn("accountant_skipped", s.clone(), false);
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
            "ε lower",
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
                a.eps_lower.epsilon_lower.into(),
                a.limits.as_ref().map(|l| l.asr).into(),
                a.limits.as_ref().map(|l| l.tpr_at_1pct).into(),
            ]
        };
        let note = format!(
            "{:.0}% stratified bootstrap intervals; ε lower: Clopper–Pearson at confidence {:.2}, δ = {}, threshold from a held-out half. Limits from the tightest sound guarantee.",
            self.confidence * 100.0,
            self.confidence,
            f(self.delta)
        );
        r.tables.push(Table {
            id: "attacks".into(),
            title: "Attacks".into(),
            columns: cols.iter().map(|c| Column::new(c)).collect(),
            rows: self.results.iter().map(row).collect(),
            note: Some(note.clone()),
        });
        if !self.null_results.is_empty() {
            r.tables.push(Table {
                id: "null-test".into(),
                title: "Null test (labels shuffled at random; ε lower should be 0)".into(),
                columns: cols.iter().map(|c| Column::new(c)).collect(),
                rows: self.null_results.iter().map(row).collect(),
                note: Some(note),
            });
        }
        if !self.cosine.is_empty() {
            r.tables.push(Table {
                id: "cosine".into(),
                title: "Cosine between empirical and neural denoising directions (Figure 1)".into(),
                columns: vec![
                    Column::new("t"),
                    Column::new("log SNR"),
                    Column::new("mean"),
                    Column::new("min"),
                ],
                rows: self
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
                    self.cosine.iter().map(|c| c.log_snr).collect(),
                    self.cosine.iter().map(|c| c.cosine_mean).collect(),
                )
                .with_markers()],
                legend: LegendPosition::LowerLeft,
                caption: None,
            });
        }
        if let Some(tb) = &self.table2 {
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
        // ROC of each attack at its best step, against the theoretical limit.
        let mut series = Vec::new();
        for kind in [
            AttackKind::Loss,
            AttackKind::Secmi,
            AttackKind::Pia,
            AttackKind::Empirical,
        ] {
            let best = self
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
        if !series.is_empty() {
            let grid = plot::alpha_grid(200);
            if let Some((_, src)) = theory::tightest(&self.guarantees, |g| g.asr_limit()) {
                let lim: Vec<f64> = grid
                    .iter()
                    .map(|&x| theory::tightest(&self.guarantees, |g| g.tpr_limit(x)).map_or(1.0, |v| v.0))
                    .collect();
                series.push(
                    Series::new(format!("theoretical TPR limit ({src})"), grid.clone(), lim)
                        .with_style(LineStyle::Dashed),
                );
            }
            series.push(Series::new("chance", vec![0.0, 1.0], vec![0.0, 1.0]).with_style(LineStyle::Dotted));
            r.plots.push(Plot {
                id: "roc".into(),
                title: "ROC of each attack (best step) against the theoretical limit".into(),
                x: Axis::new("false positive rate", "probability", Scale::Linear),
                y: Axis::new("true positive rate", "probability", Scale::Linear),
                series,
                legend: LegendPosition::LowerRight,
                caption: Some("An attack's ROC must stay below a sound limit; the dashed curve is TPR ≤ Φ(Φ⁻¹(FPR) + μ) or the (ε, δ) region.".into()),
            });
        }
        r
    }
}
