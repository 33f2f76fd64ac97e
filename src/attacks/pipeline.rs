//! The whole attack chain in one place: checkpoint + split → scores → metrics, each attack
//! judged against the guarantee of the mechanism it attacks, plus the audits whose ε lower bounds
//! are valid (the one-run canary audit; the many-runs audit over independent trials).
//!
//! ```text
//!  checkpoint + split ─► mia::scores ─► metrics (ROC, AUC, TPR@FPR, held-out/oracle ASR, CIs)
//!        │                                   │
//!        │   card's ledger ─► theory ─► limits for loss / SecMI / PIA (target: checkpoint)
//!        │   sampler config ─► theory ─► limits for the empirical attack (target: sampler)
//!        └─► canaries ─► one_run::audit ─► ε lower bound at 1 − β ─► vs the training ledger
//!  scores CSV (any tool) ─► the same metrics, limits and audits
//! ```
//!
//! Only a valid lower bound (one-run or many-runs audit) above the accounted upper bound of the
//! *same* mechanism is a violation ([`MiaReport::violations`]); a single model's held-out ASR
//! above a limit is reported, never called a bound.

use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};

use super::audit::{audit_scores, AuditOutcome, AuditScores};
use super::denoiser::Denoiser;
use super::empirical::{cosine_profile, CosinePoint};
use super::metrics::HeldOut;
use super::mia::{self, AttackKind, AttackResult, Target};
use super::one_run::{self, CanaryScores, OneRunAudit};
use super::plan::CANARY_KEY_BASE;
pub use super::plan::{
    basis_of_event, checkpoint_basis, sampler_basis, split_rows, AuditKind, Basis, MiaPlan, Table2Opts, TargetInfo,
};
use super::scores::{self, PairScores, ScoreRecord, ScoreSet};
use super::subject::Subject;
use super::theory::{self, Evidence};
use crate::error::{Error, Result};
use crate::models::toy::Checkpoint;

/// One row of the Table-2-style comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table2Row {
    /// As written ("T/4").
    pub label: String,
    /// The step.
    pub t: usize,
    /// Mean cosine of the denoising directions.
    pub cosine: f64,
    /// Theoretical ASR of the empirical-denoiser sampler stopped at t, one per rate (None: no
    /// sound accountant supports the subsampled event yet).
    pub theoretical_asr: Vec<Option<f64>>,
    /// μ of the sampler at p = 1.
    pub sampler_mu_full_batch: f64,
    /// Held-out ASR of SecMI on the neural denoiser (Duan et al. 2023, as in the paper).
    pub asr_secmi: f64,
    /// Held-out ASR of the loss attack on the neural denoiser.
    pub asr_loss: f64,
    /// Held-out ASR of the loss attack on the empirical denoiser itself.
    pub asr_empirical: f64,
}

/// The Table-2-style comparison.
#[derive(Debug, Clone, Serialize, Deserialize)]
/// The Table-2-style comparison.
pub struct Table2 {
    /// Rates p.
    pub rates: Vec<f64>,
    /// One row per step.
    pub rows: Vec<Table2Row>,
    /// How the theoretical column was computed.
    pub note: String,
}

/// One comparison of a measured number with the guarantee of the mechanism it measures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    /// What was measured ("loss at t = 10", "one-run audit").
    pub what: String,
    /// The attacked mechanism.
    pub mechanism: String,
    /// The guarantee compared with (or why there is none).
    pub basis: String,
    /// The measured number, named for what it is.
    pub measured: String,
    /// The limit it is compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// `below the limit`, `above the limit (one model: not a bound)`, `no guarantee`,
    /// `consistent`, or `VIOLATION`.
    pub outcome: String,
    /// True only when a valid ε lower bound exceeds the accounted ε of the same mechanism.
    pub violation: bool,
    /// An audit's ε lower bound (None for a single model's measurements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon_lower: Option<f64>,
    /// The δ of that lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
}

/// A many-runs audit of one (attack, t) pair.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManyRunsPair {
    /// Attack.
    pub attack: AttackKind,
    /// Step.
    pub t: usize,
    /// Held-out threshold and Clopper–Pearson outcome on the test trials.
    pub outcome: AuditOutcome,
}

/// The many-runs audit: independent trials, Bonferroni over the (attack, t) pairs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManyRunsAudit {
    /// Always `black-box`: each trial attacks a released model.
    #[serde(default = "super::one_run::black_box")]
    pub threat_model: String,
    /// Family-wise confidence.
    pub confidence: f64,
    /// δ.
    pub delta: f64,
    /// Each pair (tested at confidence 1 − β/N).
    pub pairs: Vec<ManyRunsPair>,
    /// The largest pair bound: ε lower bound at the family-wise confidence.
    pub epsilon_lower: f64,
}

/// Everything `dpaudit mia` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MiaReport {
    /// `dpaudit.mia/2`.
    pub schema: String,
    /// The attacked checkpoint (None when the scores came from a file without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetInfo>,
    /// Scores file read (for `--scores`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scores_file: Option<String>,
    /// Split manifest.
    pub split: String,
    /// Data file.
    pub data: String,
    /// Device.
    pub device: String,
    /// The executor that computed the model's outputs on `device` (the plan's backend; None for
    /// scores read from a file or merged from shards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Attack seed.
    pub seed: u64,
    /// δ.
    pub delta: f64,
    /// Confidence of intervals and audits.
    pub confidence: f64,
    /// Guarantee of the checkpoint (its training ledger).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_basis: Option<Basis>,
    /// Guarantee of the empirical-denoiser sampler (its sampler config).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampler_basis: Option<Basis>,
    /// Attack results.
    pub results: Vec<AttackResult>,
    /// Null-test results.
    pub null_results: Vec<AttackResult>,
    /// The one-run audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_run: Option<OneRunAudit>,
    /// The many-runs audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub many_runs: Option<ManyRunsAudit>,
    /// The white-box audit of a run trained with gradient canaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub white_box: Option<super::white_box::WhiteBoxAudit>,
    /// Every comparison and its basis.
    pub comparisons: Vec<Comparison>,
    /// Warnings (e.g. a seeded training run).
    pub warnings: Vec<String>,
    /// Figure-1 profile.
    pub cosine: Vec<CosinePoint>,
    /// Table-2-style comparison.
    #[serde(skip_serializing_if = "Option::is_none")]
    /// The Table-2-style comparison, when requested.
    pub table2: Option<Table2>,
    /// Seconds.
    pub elapsed_s: f64,
    /// The arithmetic of a model run on a GPU (`--precision`) and, below fp32, how far a sample
    /// of scores moved from fp32 (absent on the CPU, which computes in fp32 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionNote>,
}

/// `--precision` of a GPU run, with the largest score change against fp32 on a sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrecisionNote {
    /// fp32, tf32 or bf16.
    pub precision: crate::models::precision::Precision,
    /// Images per forward pass, and whether it was chosen to fit the GPU's free memory.
    pub batch: usize,
    /// True when the batch was chosen from the GPU's free memory (no --batch-size).
    pub batch_fitted: bool,
    /// Records scored again in fp32 (every attack and step), 0 at fp32.
    pub sample: usize,
    /// Largest |score − fp32 score| over the sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_abs_score_change: Option<f64>,
    /// Largest |score − fp32 score| / |fp32 score| over the sample.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rel_score_change: Option<f64>,
}

impl PrecisionNote {
    /// One line for the text report.
    pub fn describe(&self) -> String {
        let batch = if self.batch_fitted {
            format!("batch {} (fitted to the GPU's free memory)", self.batch)
        } else {
            format!("batch {}", self.batch)
        };
        match (self.max_abs_score_change, self.max_rel_score_change) {
            (Some(a), Some(r)) => format!(
                "{}, {batch}; largest score change against fp32 on {} records: {a:.3e} absolute, {r:.3e} relative",
                self.precision.as_str(),
                self.sample
            ),
            _ => format!("{}, {batch}", self.precision.as_str()),
        }
    }
}

/// Scores of `subject`'s records at positions p with p mod n = i (`shard` i/n; all without one),
/// each with its position in the unsharded run's record list (members, non-members, then input
/// canaries), so [`super::shard::merge`] can restore the unsharded order. Every record's noise
/// is keyed as [`super::subject::Keying`] says and the model treats the rows of a batch
/// independently, so a record's score is the same whichever shard computes it. Progress counts
/// images (each (attack, step) unit of the bar becomes the images it scores). One function for
/// every checkpoint kind.
pub fn score(
    subject: &Subject,
    den: &dyn Denoiser,
    plan: &MiaPlan,
    bar: Option<&ProgressBar>,
    shard: Option<super::shard_spec::ShardSpec>,
) -> Result<Vec<(usize, ScoreRecord)>> {
    let rows = &subject.rows;
    let mine = |p: usize| shard.is_none_or(|s| s.owns(p));
    let all = rows.split_rows();
    let split_pos: Vec<usize> = (0..all.len()).filter(|&p| mine(p)).collect();
    let q_ix: Vec<usize> = split_pos.iter().map(|&p| all[p]).collect();
    let q_rows = subject.data.rows(&q_ix);
    let q_keys: Vec<u64> = split_pos.iter().map(|&p| rows.key(p)).collect();
    let ids: Vec<String> = q_ix.iter().map(|i| i.to_string()).collect();
    let labels: Vec<bool> = split_pos.iter().map(|&p| p < rows.members.len()).collect();
    // The empirical attack's denoiser is the sampler's: the empirical denoiser over the rows
    // the model was trained on (the members), whichever shard scores.
    let train_rows = if plan.attacks.contains(&AttackKind::Empirical) {
        subject.data.rows(&rows.members)
    } else {
        Vec::new()
    };
    let base = all.len();
    let canary_pos: Vec<usize> = rows
        .canaries
        .as_ref()
        .map_or(Vec::new(), |c| (0..c.len()).filter(|&j| mine(base + j)).collect());
    let per_unit = |kind: AttackKind| {
        (split_pos.len()
            + if kind.target() == Target::Checkpoint {
                canary_pos.len()
            } else {
                0
            }) as u64
    };
    if let Some(b) = bar {
        let extra: u64 =
            plan.attacks.iter().map(|&k| per_unit(k).saturating_sub(1)).sum::<u64>() * plan.timesteps.len() as u64;
        b.inc_length(extra);
    }
    let mut out = Vec::new();
    for &kind in &plan.attacks {
        for &t in &plan.timesteps {
            if let Some(b) = bar {
                b.set_message(format!("{} at t = {t}", kind.as_str()));
            }
            let t0 = std::time::Instant::now();
            let s = mia::scores_keyed(kind, den, &train_rows, &q_rows, &q_keys, t, &plan.score)?;
            crate::timing::note(
                format_args!("{} at t = {t}, {} records", kind.as_str(), q_keys.len()),
                t0,
            );
            crate::timing::kernel_summary();
            crate::timing::within_summary();
            out.extend(
                split_pos
                    .iter()
                    .copied()
                    .zip(scores::records(kind, t, ScoreSet::Split, &ids, &labels, &s)),
            );
            if let (Some(c), Target::Checkpoint) = (&rows.canaries, kind.target()) {
                let crow: Vec<f32> = canary_pos
                    .iter()
                    .flat_map(|&j| c.rows[j * c.dim..(j + 1) * c.dim].iter().copied())
                    .collect();
                let keys: Vec<u64> = canary_pos.iter().map(|&j| CANARY_KEY_BASE + j as u64).collect();
                let cids: Vec<String> = canary_pos.iter().map(|&j| c.ids[j].clone()).collect();
                let inc: Vec<bool> = canary_pos.iter().map(|&j| c.included[j]).collect();
                let s = mia::scores_keyed(kind, den, &[], &crow, &keys, t, &plan.score)?;
                out.extend(canary_pos.iter().map(|&j| base + j).zip(scores::records(
                    kind,
                    t,
                    ScoreSet::Canary,
                    &cids,
                    &inc,
                    &s,
                )));
            }
            if let Some(b) = bar {
                b.inc(per_unit(kind).max(1));
            }
        }
    }
    Ok(out)
}

/// The guarantee an attack on `target` is judged against.
fn basis_for<'a>(target: Target, ck: Option<&'a Basis>, sampler: Option<&'a Basis>) -> Option<&'a Basis> {
    match target {
        Target::Checkpoint => ck,
        Target::Sampler => sampler,
    }
}

fn mechanism_name(target: Target, checkpoint: Option<&str>) -> String {
    match target {
        Target::Checkpoint => format!("trained checkpoint {}", checkpoint.unwrap_or("(from the scores file)")),
        Target::Sampler => "empirical-denoiser sampler over the trained-on rows".into(),
    }
}

/// The many-runs audit over pairs whose rows are independent trials (one model each).
pub fn many_runs(pairs: &[PairScores], delta: f64, confidence: f64, seed: u64) -> Result<ManyRunsAudit> {
    if pairs.is_empty() {
        return Err(Error::input("the many-runs audit needs scores"));
    }
    let alpha = (1.0 - confidence) / pairs.len() as f64;
    let mut out = Vec::new();
    for p in pairs {
        let h = HeldOut::split(&p.pos(), &p.neg(), seed)?;
        let o = audit_scores(
            &AuditScores {
                heldout_out: h.cal_neg.clone(),
                heldout_in: h.cal_pos.clone(),
                test_out: h.test_neg.clone(),
                test_in: h.test_pos.clone(),
            },
            delta,
            alpha,
        )?;
        out.push(ManyRunsPair {
            attack: p.attack,
            t: p.t,
            outcome: o,
        });
    }
    let epsilon_lower = out.iter().map(|p| p.outcome.epsilon_lower).fold(0.0, f64::max);
    Ok(ManyRunsAudit {
        threat_model: super::one_run::black_box(),
        confidence,
        delta,
        pairs: out,
        epsilon_lower,
    })
}

/// What [`evaluate_scores`] computes.
pub struct Evaluated {
    /// Attack results.
    pub results: Vec<AttackResult>,
    /// Null-test results.
    pub null_results: Vec<AttackResult>,
    /// The one-run audit.
    pub one_run: Option<OneRunAudit>,
    /// The many-runs audit.
    pub many_runs: Option<ManyRunsAudit>,
    /// Every comparison.
    pub comparisons: Vec<Comparison>,
}

/// Metrics, audits and comparisons from score records (from a checkpoint or a file).
pub fn evaluate_scores(
    records: &[ScoreRecord],
    plan: &MiaPlan,
    checkpoint_basis: Option<&Basis>,
    checkpoint: Option<&str>,
) -> Result<Evaluated> {
    let f = crate::report::export::fmt_num;
    let mut results = Vec::new();
    let mut null_results = Vec::new();
    let mut comparisons = Vec::new();
    let split_pairs = scores::group(records, ScoreSet::Split);
    for p in &split_pairs {
        let basis = basis_for(p.attack.target(), checkpoint_basis, plan.sampler.as_ref());
        let gs: &[Evidence] = basis.map_or(&[][..], |b| &b.guarantees[..]);
        let (pos, neg) = (p.pos(), p.neg());
        let r = mia::evaluate(p.attack, p.t, &pos, &neg, &plan.metric, gs)?;
        if plan.null_test {
            let (p2, n2) = mia::shuffled(&pos, &neg, plan.metric.seed ^ p.t as u64);
            let mut nr = mia::evaluate(p.attack, p.t, &p2, &n2, &plan.metric, gs)?;
            nr.shuffled_labels = true;
            null_results.push(nr);
        }
        let measured = format!(
            "empirical ASR at the held-out threshold {} [{}, {}] (oracle {}, AUC {})",
            f(round4(r.asr_heldout)),
            f(round4(r.asr_heldout_ci.lo)),
            f(round4(r.asr_heldout_ci.hi)),
            f(round4(r.asr_oracle)),
            f(round4(r.auc))
        );
        let (basis_text, limit, outcome) = match (basis, &r.limits) {
            (Some(b), Some(l)) => (
                format!("{}; ASR limit from {}", b.describe(), l.asr_source),
                Some(l.asr),
                if r.asr_heldout_ci.lo > l.asr {
                    "above the limit (one model, one split: not a bound; run an audit)".to_string()
                } else {
                    "below the limit".to_string()
                },
            ),
            (Some(b), None) => (b.describe(), None, "no guarantee".to_string()),
            (None, _) => (
                match p.attack.target() {
                    Target::Checkpoint => "none: the checkpoint has no DP ledger".to_string(),
                    Target::Sampler => "none: the empirical denoiser queried directly is not a DP mechanism; give --sampler CONFIG to compare with that sampler's accounting".to_string(),
                },
                None,
                "no guarantee".to_string(),
            ),
        };
        comparisons.push(Comparison {
            what: format!("{} at t = {}", p.attack.as_str(), p.t),
            mechanism: mechanism_name(p.attack.target(), checkpoint),
            basis: basis_text,
            measured,
            limit,
            outcome,
            violation: false,
            epsilon_lower: None,
            delta: None,
        });
        results.push(r);
    }
    let mut one = None;
    let mut many = None;
    match plan.audit {
        Some(AuditKind::OneRun) => {
            let pairs: Vec<CanaryScores> = scores::group(records, ScoreSet::Canary)
                .into_iter()
                .filter(|p| p.attack.target() == Target::Checkpoint)
                .map(|p| CanaryScores {
                    attack: p.attack.as_str().to_string(),
                    t: p.t,
                    scores: p.scores,
                    included: p.members,
                })
                .collect();
            if pairs.is_empty() {
                return Err(Error::input(
                    "--audit one-run needs canary scores (train with --canaries m, or a scores file with set = canary rows)",
                ));
            }
            let m = pairs[0].included.len();
            let a = one_run::audit(&pairs, &one_run::default_ks(m), plan.metric.delta, 1.0 - plan.beta)?;
            let mut c = audit_comparison(
                "one-run audit (black-box; Steinke, Nasr & Jagielski 2023, Thm 3.3)",
                format!("training run with {m} canaries ({} included)", a.included),
                a.epsilon_lower,
                a.confidence,
                a.delta,
                checkpoint_basis,
                format!("{} candidates (attack, t, k), Bonferroni", a.candidates),
            );
            c.outcome = ledger_sentence(&c);
            without_power(&mut c, a.epsilon_max, m);
            comparisons.push(c);
            one = Some(a);
        }
        Some(AuditKind::ManyRuns) => {
            let pairs: Vec<PairScores> = split_pairs
                .iter()
                .filter(|p| p.attack.target() == Target::Checkpoint)
                .cloned()
                .collect();
            let a = many_runs(&pairs, plan.metric.delta, 1.0 - plan.beta, plan.metric.seed)?;
            comparisons.push(audit_comparison(
                "many-runs audit (black-box; independent trials, Clopper–Pearson)",
                "independently trained models, one trial per row".to_string(),
                a.epsilon_lower,
                a.confidence,
                a.delta,
                checkpoint_basis,
                format!(
                    "{} (attack, t) pairs, Bonferroni; threshold from held-out trials",
                    a.pairs.len()
                ),
            ));
            many = Some(a);
        }
        None => {}
    }
    Ok(Evaluated {
        results,
        null_results,
        one_run: one,
        many_runs: many,
        comparisons,
    })
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

fn audit_comparison(
    what: &str,
    mechanism: String,
    eps_lower: f64,
    confidence: f64,
    delta: f64,
    basis: Option<&Basis>,
    how: String,
) -> Comparison {
    let f = crate::report::export::fmt_num;
    let measured = format!(
        "ε lower bound {} at confidence {} (δ = {}; {how})",
        f(round4_down(eps_lower)),
        f(confidence),
        f(delta)
    );
    match basis.and_then(|b| b.epsilon().map(|e| (b, e))) {
        Some((b, (eps, _))) => {
            let violation = eps_lower > eps;
            Comparison {
                what: what.into(),
                mechanism,
                basis: b.describe(),
                measured,
                limit: Some(eps),
                outcome: if violation {
                    format!(
                        "VIOLATION: ε lower bound {} > accounted ε {}",
                        f(round4_down(eps_lower)),
                        f(eps)
                    )
                } else {
                    "consistent: lower bound ≤ accounted ε".into()
                },
                violation,
                epsilon_lower: Some(eps_lower),
                delta: Some(delta),
            }
        }
        None => Comparison {
            what: what.into(),
            mechanism,
            basis: "none: no DP ledger to compare with".into(),
            measured,
            limit: None,
            outcome: "no guarantee".into(),
            violation: false,
            epsilon_lower: Some(eps_lower),
            delta: Some(delta),
        },
    }
}

/// The outcome of an audit row with the ledger's verdict in words: whether the training is
/// consistent with its ledger (the audit's lower bound at or below the accounted ε) or not.
fn ledger_sentence(c: &Comparison) -> String {
    match (c.violation, c.limit) {
        (true, _) => format!("{}: the training does not deliver its ledger", c.outcome),
        (false, Some(_)) => format!("{}: the training is consistent with its ledger", c.outcome),
        (false, None) => c.outcome.clone(),
    }
}

/// An audit that could not have shown ε above `power` (every guess correct) says nothing about
/// an accounted ε at or above it: its outcome is `not demonstrated`, not `consistent`.
fn without_power(c: &mut Comparison, power: f64, canaries: usize) {
    let f = crate::report::export::fmt_num;
    if let (false, Some(limit)) = (c.violation, c.limit) {
        if power <= limit {
            c.outcome = format!(
                "not demonstrated: this audit could not have shown ε above {} ({canaries} canaries, every guess correct), below the accounted ε {}; its lower bound {} neither confirms nor contradicts the ledger",
                f(round4_down(power)),
                f(limit),
                f(round4_down(c.epsilon_lower.unwrap_or(0.0)))
            );
        }
    }
}

/// Rounds down to 4 decimals (a lower bound stays a lower bound when shown).
fn round4_down(x: f64) -> f64 {
    (x * 1e4).floor() / 1e4
}

/// Runs `plan` on `subject` (a checkpoint of any kind): refuses a bootstrap the limits cannot
/// afford before any attack runs, scores every record ([`score`]), assembles the report
/// ([`assemble`]) and adds the Figure-1 cosine profile and the Table-2 comparison ([`extras`]).
/// `bar` counts images per (attack, step) plus Table-2 rows. Returns the report and every score
/// record (for `--scores-out`; record ids are the data rows, canaries their ids).
pub fn run(
    subject: &Subject,
    plan: &MiaPlan,
    device: &str,
    bar: Option<&ProgressBar>,
) -> Result<(MiaReport, Vec<ScoreRecord>)> {
    let start = std::time::Instant::now();
    let scored = subject.rows.split_rows().len() as f64;
    crate::limits::check(
        "--bootstrap",
        plan.metric.bootstrap as f64,
        crate::limits::Cost::new(8.0, crate::limits::BOOTSTRAP_SCORE.work * scored.max(1.0)),
    )?;
    let eps = subject.eps()?;
    let records: Vec<ScoreRecord> = score(subject, eps.denoiser(), plan, bar, None)?
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    let t0 = std::time::Instant::now();
    let mut report = assemble(subject, plan, device, &records, start)?;
    report.backend = Some(subject.model.executor().to_string());
    crate::timing::note("metrics and report", t0);
    let members = subject.data.rows(&subject.rows.members);
    let nonmembers = subject.data.rows(&subject.rows.nonmembers);
    let (cosine, table2) = extras(eps.denoiser(), eps.schedule(), &members, &nonmembers, plan, bar)?;
    report.cosine = cosine;
    report.table2 = table2;
    report.elapsed_s = start.elapsed().as_secs_f64();
    Ok((report, records))
}

/// (β of the black-box one-run audit, β of the white-box audit) when `both` run on the canaries
/// of one training (`--canary-kind both`): β/2 each, so by the union bound (Bonferroni) the
/// family of every audit verdict of the report holds at confidence 1 − β; with one audit, β.
pub fn audit_betas(beta: f64, both: bool) -> (f64, f64) {
    if both {
        (beta / 2.0, beta / 2.0)
    } else {
        (beta, beta)
    }
}

/// The report of `subject`'s scored `records` (from [`score`] without a shard, or merged
/// shards): metrics, the black-box audits, the white-box audit of gradient canaries, and the
/// comparisons with the checkpoint's guarantee. The same for every checkpoint kind.
pub fn assemble(
    subject: &Subject,
    plan: &MiaPlan,
    device: &str,
    records: &[ScoreRecord],
    start: std::time::Instant,
) -> Result<MiaReport> {
    let basis = subject.basis.as_ref();
    let name = subject.target.checkpoint.clone();
    let gradient = subject
        .white_box
        .as_ref()
        .filter(|w| w.canaries.kind() == crate::models::canary::CanaryKind::Gradient);
    let one_run = plan.audit == Some(AuditKind::OneRun);
    // With input canaries of the same run (`--canary-kind both`) the black-box one-run audit
    // runs too, and the two share the family's β; with gradient canaries alone the one-run
    // audit is the white-box one.
    let both = one_run && gradient.is_some() && subject.rows.canaries.is_some();
    let (bb_beta, wb_beta) = audit_betas(plan.beta, both);
    let white_box = match gradient {
        Some(w) if one_run => Some(white_box_audit_of(w, plan.metric.delta, wb_beta)?),
        _ => None,
    };
    let eval_plan = MiaPlan {
        audit: if white_box.is_some() && subject.rows.canaries.is_none() {
            None
        } else {
            plan.audit
        },
        beta: bb_beta,
        ..plan.clone()
    };
    let Evaluated {
        results,
        null_results,
        mut one_run,
        many_runs,
        mut comparisons,
    } = evaluate_scores(records, &eval_plan, basis, Some(&name))?;
    if let Some(wb) = &white_box {
        // The white-box bound is the report's one-run audit unless input canaries of the same
        // run were audited black-box (then both are compared with the ledger, and the white-box
        // record stays in `white_box`).
        let s = white_box_comparisons(wb, basis, &mut comparisons);
        if one_run.is_none() {
            one_run = Some(s);
        }
    }
    let mut warnings = subject.warnings.clone();
    if both {
        warnings.push(format!(
            "two one-run audits of one training (input and gradient canaries): each at confidence 1 − β/2 = {}, so every audit verdict holds together at {}",
            crate::report::export::fmt_num(1.0 - plan.beta / 2.0),
            crate::report::export::fmt_num(1.0 - plan.beta)
        ));
    }
    Ok(MiaReport {
        schema: "dpaudit.mia/2".into(),
        target: Some(subject.target.clone()),
        scores_file: None,
        split: subject.split_label.clone(),
        data: subject.data_label.clone(),
        device: device.to_string(),
        backend: None,
        seed: plan.score.seed,
        delta: plan.metric.delta,
        confidence: 1.0 - plan.beta,
        checkpoint_basis: subject.basis.clone(),
        sampler_basis: plan.sampler.clone(),
        results,
        null_results,
        one_run,
        many_runs,
        comparisons,
        warnings,
        cosine: Vec::new(),
        table2: None,
        elapsed_s: start.elapsed().as_secs_f64(),
        precision: None,
        white_box,
    })
}

/// The comparisons of a white-box audit's four estimators with the ledger (`basis`), appended
/// to `comparisons`; returns the Steinke et al. bound as the report's one-run audit, labelled
/// with its threat model. Shared by every checkpoint kind.
pub fn white_box_comparisons(
    wb: &super::white_box::WhiteBoxAudit,
    basis: Option<&Basis>,
    comparisons: &mut Vec<Comparison>,
) -> super::one_run::OneRunAudit {
    let mech = format!(
        "training run with {} gradient canaries ({} included), every noisy update observed",
        wb.canaries, wb.included
    );
    let mut c = audit_comparison(
        "one-run audit (white-box; Steinke, Nasr & Jagielski 2023, Thm 3.3)",
        mech.clone(),
        wb.steinke.epsilon_lower,
        wb.steinke.confidence,
        wb.delta,
        basis,
        format!(
            "likelihood-ratio scores of the ledger's mechanism over {} noisy updates; {} candidates, Bonferroni",
            wb.steps, wb.steinke.candidates
        ),
    );
    c.outcome = ledger_sentence(&c);
    comparisons.push(c);
    let mut c = audit_comparison(
        "f-DP one-run audit (white-box; Mahloujifar, Melis & Chaudhuri 2025)",
        mech,
        wb.fdp.epsilon_lower,
        wb.fdp.confidence,
        wb.delta,
        basis,
        format!(
            "the same scores against the family {}; ε of the rejected member by its sound lower bound; {}",
            wb.fdp.family,
            if wb.fdp.ledger_rejected {
                "the ledger's own trade-off curve is rejected"
            } else {
                "the ledger's own trade-off curve is not rejected"
            }
        ),
    );
    c.outcome = ledger_sentence(&c);
    comparisons.push(c);
    let t = &wb.trials;
    let mut c = audit_comparison(
        "independent-trials audit (white-box; canaries as trials, Clopper–Pearson)",
        format!(
            "training run with {} gradient canaries ({} included), every noisy update observed",
            wb.canaries, wb.included
        ),
        t.epsilon_lower,
        t.confidence,
        wb.delta,
        basis,
        format!(
            "threshold {} chosen on half the canaries; on the other {} + {}: {} false positives, {} false negatives; assumes the canaries' observations are independent trials (distinct coordinates, independent noise)",
            crate::numeric::format::sig6(t.threshold),
            t.test_in,
            t.test_out,
            t.false_positives,
            t.false_negatives
        ),
    );
    c.outcome = ledger_sentence(&c);
    comparisons.push(c);
    let g = &wb.gaussian;
    if g.kind == crate::accountants::BoundKind::LowerBound {
        let mut c = audit_comparison(
            "Gaussian-shift audit (white-box; GDP reading of the canary sums)",
            format!(
                "training run with {} gradient canaries ({} included), every noisy update observed",
                wb.canaries, wb.included
            ),
            g.epsilon_lower,
            g.confidence,
            wb.delta,
            basis,
            format!(
                "μ̂ = {}, lower confidence bound {}; exact for the full-batch Gaussian mechanism the ledger states (each canary's summed observation is N(μ, 1) in, N(0, 1) out)",
                crate::numeric::format::sig6(g.mu_hat),
                crate::numeric::format::sig6(g.mu_lower)
            ),
        );
        c.outcome = ledger_sentence(&c);
        comparisons.push(c);
    }
    let mut s = wb.steinke.clone();
    s.threat_model = wb.threat_model.clone();
    s
}

/// The white-box audit of a checkpoint whose card names gradient canaries (`w`) and the DP-SGD
/// settings of its ledger: the canaries file and the observations are checked against the
/// card's SHA-256, count and shape, then audited ([`super::white_box::audit`]) at family-wise
/// confidence 1 − `beta`.
pub fn white_box_audit_of(
    w: &super::plan::WhiteBoxSource,
    delta: f64,
    beta: f64,
) -> Result<super::white_box::WhiteBoxAudit> {
    use crate::models::canary::GradientCanaries;
    let (info, dp, dir, card_path) = (&w.canaries, w.dp.as_ref(), &w.dir, &w.card_path);
    let bad = |field: &str, m: String| Err(Error::field(field, m).with_file(card_path));
    let Some(dp) = dp else {
        return bad(
            "canaries.kind",
            "gradient canaries without a DP section: nothing to audit".into(),
        );
    };
    let p = dir.join(&info.file);
    let sha = crate::data::digits::sha256_file(&p)?;
    if sha != info.sha256 {
        return bad(
            "canaries.sha256",
            format!("{} has SHA-256 {sha}, the card says {}", p.display(), info.sha256),
        );
    }
    let c = GradientCanaries::load(&p)?;
    if c.len() != info.count {
        return bad(
            "canaries.count",
            format!("the card says {}, {} has {}", info.count, p.display(), c.len()),
        );
    }
    let (Some(obs_name), Some(obs_sha)) = (&info.observations, &info.observations_sha256) else {
        return bad(
            "canaries.observations",
            "gradient canaries without their observations file".into(),
        );
    };
    let op = dir.join(obs_name);
    let sha = crate::data::digits::sha256_file(&op)?;
    if &sha != obs_sha {
        return bad(
            "canaries.observations_sha256",
            format!("{} has SHA-256 {sha}, the card says {obs_sha}", op.display()),
        );
    }
    let arr = crate::data::npy::read(&op)?;
    let values = arr
        .to_f32()
        .ok_or_else(|| Error::input("expected float32 observations").with_file(&op))?;
    if arr.shape.len() != 2 || arr.shape[1] != c.len() || arr.shape[0] as u64 != dp.steps {
        return Err(Error::input(format!(
            "observations of shape {:?}; the card says {} steps × {} canaries",
            arr.shape,
            dp.steps,
            c.len()
        ))
        .with_file(&op));
    }
    let mech = super::white_box::LedgerMechanism {
        noise_multiplier: dp.noise_multiplier,
        sample_rate: dp.sample_rate,
        steps: dp.steps,
    };
    super::white_box::audit(&values, arr.shape[0], &c.included, &mech, delta, 1.0 - beta)
}

/// The report from a scores file; the checkpoint (optional) supplies the training ledger.
pub fn from_scores(records: &[ScoreRecord], file: &str, ck: Option<&Checkpoint>, plan: &MiaPlan) -> Result<MiaReport> {
    let ck_basis = match ck {
        Some(c) => checkpoint_basis(c, plan.metric.delta)?,
        None => None,
    };
    let name = ck.map(|c| c.card_path.display().to_string());
    let mut r = from_scores_basis(records, file, ck_basis, name, plan)?;
    r.target = ck.map(super::plan::card_target);
    r.split = ck.map(|c| c.card.data.split.clone()).unwrap_or_default();
    r.data = ck.map(|c| c.card.data.file.clone()).unwrap_or_default();
    Ok(r)
}

/// The report from a scores file compared with `ck_basis` (e.g. a diffusers folder's ledger or
/// a stated mechanism) of the checkpoint `name`.
pub fn from_scores_basis(
    records: &[ScoreRecord],
    file: &str,
    ck_basis: Option<Basis>,
    name: Option<String>,
    plan: &MiaPlan,
) -> Result<MiaReport> {
    let start = std::time::Instant::now();
    let Evaluated {
        results,
        null_results,
        one_run,
        many_runs,
        comparisons,
    } = evaluate_scores(records, plan, ck_basis.as_ref(), name.as_deref())?;
    Ok(MiaReport {
        schema: "dpaudit.mia/2".into(),
        target: None,
        scores_file: Some(file.to_string()),
        split: String::new(),
        data: String::new(),
        device: "none (scores from a file)".into(),
        backend: None,
        seed: plan.score.seed,
        delta: plan.metric.delta,
        confidence: 1.0 - plan.beta,
        checkpoint_basis: ck_basis,
        sampler_basis: plan.sampler.clone(),
        results,
        null_results,
        one_run,
        many_runs,
        comparisons,
        warnings: Vec::new(),
        cosine: Vec::new(),
        table2: None,
        elapsed_s: start.elapsed().as_secs_f64(),
        precision: None,
        white_box: None,
    })
}

/// The Figure-1 cosine profile and the Table-2 comparison that `plan` asks for (none: empty, None),
/// for any ε-prediction model `den` on the DDPM schedule `sched`, against the empirical denoiser
/// over `members` (the trained-on rows, [n, dim]) with `nonmembers` as the held-out rows. One
/// function for every checkpoint kind (dpaudit's 8×8 nets and diffusers UNets).
pub fn extras(
    den: &dyn Denoiser,
    sched: &crate::diffusion::schedule::table::TrainingSchedule,
    members: &[f32],
    nonmembers: &[f32],
    plan: &MiaPlan,
    bar: Option<&ProgressBar>,
) -> Result<(Vec<CosinePoint>, Option<Table2>)> {
    let cosine = if plan.cosine_steps.is_empty() {
        Vec::new()
    } else {
        cosine_profile(den, members, nonmembers, &plan.cosine_steps, plan.score.seed)?
    };
    let table2 = match &plan.table2 {
        None => None,
        Some(o) => Some(table2(den, sched, members, nonmembers, o, plan, bar)?),
    };
    Ok((cosine, table2))
}

fn table2(
    den: &dyn Denoiser,
    sched: &crate::diffusion::schedule::table::TrainingSchedule,
    members: &[f32],
    nonmembers: &[f32],
    o: &Table2Opts,
    plan: &MiaPlan,
    bar: Option<&ProgressBar>,
) -> Result<Table2> {
    let dim = den.dim();
    let mut rows = Vec::new();
    let heldout = |kind: AttackKind, t: usize| -> Result<f64> {
        let pos = mia::scores(kind, den, members, members, t, &plan.score)?;
        let neg = mia::scores(kind, den, members, nonmembers, t, &plan.score)?;
        let h = HeldOut::split(&pos, &neg, plan.metric.seed)?;
        Ok(super::metrics::heldout_asr(&h)?.0)
    };
    for label in &o.steps {
        let t = sched.parse_timestep(label)?;
        if let Some(b) = bar {
            b.set_message(format!("table 2 at {label}"));
        }
        let cos = cosine_profile(den, members, nonmembers, &[t], plan.score.seed)?[0].cosine_mean;
        let mus = theory::sampler_step_mus(sched, t, o.stride, members.len() / dim, o.clip, o.density);
        let mut th = Vec::new();
        for &p in &o.rates {
            th.push(theory::sampler_asr(&mus, p, plan.metric.delta)?.map(|x| x.0));
        }
        rows.push(Table2Row {
            label: label.clone(),
            t,
            cosine: cos,
            theoretical_asr: th,
            sampler_mu_full_batch: mus.iter().map(|m| m * m).sum::<f64>().sqrt(),
            asr_secmi: heldout(AttackKind::Secmi, t.max(plan.score.secmi_k))?,
            asr_loss: heldout(AttackKind::Loss, t)?,
            asr_empirical: heldout(AttackKind::Empirical, t)?,
        });
        if let Some(b) = bar {
            b.inc(1);
        }
    }
    Ok(Table2 {
        rates: o.rates.clone(),
        rows,
        note: format!(
            "theoretical ASR: empirical-denoiser sampler from T down to t every {} DDPM steps, μ_i = 2C/(p_t|D|)·√(2Δt/t³) on the VE time t = σ_t, C = {}, p_t = {}, |D| = {}; p = 1 is exact GDP (Φ(μ/2)), p < 1 uses the tightest sound accountant at δ = {}",
            o.stride,
            o.clip,
            o.density,
            members.len() / dim,
            plan.metric.delta
        ),
    })
}

/// The largest change of the scores in `records` (computed at the current precision) when the
/// first `sample` members and the first `sample` non-members are scored again in fp32 with the
/// same attacks, steps and noise (a record's noise depends only on its position, so the sample's
/// records get the same draws). Returns (records compared, largest absolute change, largest
/// relative change). Restores the current precision.
pub fn fp32_score_change(
    subject: &Subject,
    den: &dyn Denoiser,
    plan: &MiaPlan,
    records: &[ScoreRecord],
    sample: usize,
) -> Result<(usize, f64, f64)> {
    let (split, images) = (&subject.split, &subject.data);
    let member_ix: Vec<usize> = split.members.iter().take(sample).copied().collect();
    let nonmember_ix: Vec<usize> = split.nonmembers.iter().take(sample).copied().collect();
    let (members, nonmembers) = (images.rows(&member_ix), images.rows(&nonmember_ix));
    let ids: Vec<String> = member_ix.iter().chain(&nonmember_ix).map(|i| i.to_string()).collect();
    let mut have = std::collections::HashMap::new();
    for r in records.iter().filter(|r| r.set == ScoreSet::Split) {
        have.insert((r.attack, r.t, r.record_id.clone()), r.score);
    }
    // The same weights in fp32 (a value of the denoiser, no process state to restore).
    let fp32 = den.fp32();
    let den: &dyn Denoiser = fp32.as_deref().unwrap_or(den);
    let rescored = (|| -> Result<Vec<(AttackKind, usize, Vec<f64>)>> {
        let mut out = Vec::new();
        for &kind in &plan.attacks {
            for &t in &plan.timesteps {
                let mut s = mia::scores(kind, den, &[], &members, t, &plan.score)?;
                s.extend(mia::scores(kind, den, &[], &nonmembers, t, &plan.score)?);
                out.push((kind, t, s));
            }
        }
        Ok(out)
    })();
    let (mut n, mut abs, mut rel) = (0usize, 0f64, 0f64);
    for (kind, t, s) in rescored? {
        for (id, fp32) in ids.iter().zip(s) {
            if let Some(&got) = have.get(&(kind, t, id.clone())) {
                let d = (got - fp32).abs();
                abs = abs.max(d);
                rel = rel.max(d / fp32.abs().max(f64::MIN_POSITIVE));
                n += 1;
            }
        }
    }
    Ok((n, abs, rel))
}

impl MiaReport {
    /// The comparisons that are violations: a valid ε lower bound (one-run or many-runs audit)
    /// above the accounted ε of the same mechanism. Decides exit code 1.
    pub fn violations(&self) -> Vec<&Comparison> {
        self.comparisons.iter().filter(|c| c.violation).collect()
    }
}
